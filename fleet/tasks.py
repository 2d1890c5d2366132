"""Celery tasks of the fleet. Both are idempotent, so ``acks_late`` redelivery after a worker dies is safe:
dispatch claims ``pending`` agents (marking them ``dispatched``) before sending, so a re-run never sends
to an agent twice; responses are stored by the agent consumer, not here, so a worker restart loses none."""

import asyncio
import logging

from asgiref.sync import async_to_sync
from celery import shared_task
from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction

from .models import AgentExecStatus, Execution
from .push import agent_group

BATCH = 500
log = logging.getLogger("yuzu.fleet")


@shared_task(acks_late=True)
def dispatch_execution(execution_id, sensitive=None):
    """Send the execution's command to its pending agents, a batch at a time, until none are left or
    the execution stops running (cancelled). ``sensitive`` carries the parameter values that are stored
    redacted. Returns how many agents this run sent to."""
    ex = Execution.objects.filter(pk=execution_id).first()
    if ex is None:
        return 0
    frame = {"type": "command", "command_id": ex.command_id, "plugin": ex.plugin, "action": ex.action,
             "parameters": {**ex.parameter_values, **(sensitive or {})}, "expires_at": ex.expires_at.timestamp()}
    sent = 0
    while Execution.objects.filter(pk=execution_id, status=Execution.RUNNING).exists():
        agent_ids = _claim(execution_id)
        if not agent_ids:
            break
        async_to_sync(_send)(agent_ids, {"type": "agent.command", "payload": frame})
        sent += len(agent_ids)
    return sent


def _claim(execution_id):
    """Mark the next batch of pending agents dispatched. Claiming before sending makes delivery
    at-most-once: an agent whose send was lost to a crash ends in TIMEOUT, never runs a command twice."""
    with transaction.atomic():
        rows = list(AgentExecStatus.objects.select_for_update(skip_locked=True)
                    .filter(execution_id=execution_id, status="pending").order_by("id")
                    .values_list("id", "agent_id")[:BATCH])
        AgentExecStatus.objects.filter(pk__in=[pk for pk, _ in rows], status="pending").update(status="dispatched")
    return [agent_id for _, agent_id in rows]


async def _send(agent_ids, message):
    layer = get_channel_layer()
    if isinstance(layer, InMemoryChannelLayer):
        # Its group_send sweeps the whole layer for expired messages on every call, which makes a
        # fan-out quadratic in the number of connected agents: sweep once per batch, then deliver to
        # each group's channels as group_send would.
        layer._clean_expired()
        for channel in [c for a in agent_ids for c in layer.groups.get(agent_group(a), {})]:
            try:
                await layer.send(channel, message)
            except ChannelFull:
                log.warning("channel %s is full; command %s not delivered", channel,
                            message["payload"].get("command_id"))
        return
    await asyncio.gather(*(layer.group_send(agent_group(a), message) for a in agent_ids))


@shared_task(acks_late=True)
def sweep_overdue():
    """Beat, every 5 s: agents silent past their command's expiry end in TIMEOUT, not a hang; agents
    whose heartbeats stopped are marked disconnected. Returns how many agents timed out."""
    from .consumers import mark_silent_disconnected
    from .executions import expire_overdue

    mark_silent_disconnected()
    return expire_overdue()
