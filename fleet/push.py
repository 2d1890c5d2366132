"""Messages to connected agents through the channel layer: each agent's connection listens on the group
``agent_group(agent_id)``, so any server process (or a Celery worker) can address any agent.

A fan-out to N agents is one ``group_send_many`` (yuzu.channel_layer): on Redis a pipelined read of the N
groups and one stored message per receiving server process; in embedded mode N puts. On a layer without it,
N group sends."""

import asyncio
import logging

from channels.layers import get_channel_layer

from .layer import agent_group, send_to_agent
from .models import Tag

__all__ = ["agent_group", "push_tags", "send_to_agent", "send_to_agents"]

SEND_CONCURRENCY = 50
log = logging.getLogger("yuzu.fleet")


def push_tags(agent_id):
    tags = dict(Tag.objects.filter(agent_id=agent_id).values_list("key", "value"))
    send_to_agent(agent_id, {"type": "agent.push", "payload": {"type": "tags", "tags": tags}})


async def send_to_agents(agent_ids, message):
    """Send ``message`` (a command) to each agent's group. A send that fails is logged, not raised: the
    agents concerned stay unacknowledged and the dispatcher sends again (fleet.tasks)."""
    layer = get_channel_layer()
    if hasattr(layer, "group_send_many"):
        try:
            await layer.group_send_many([agent_group(a) for a in agent_ids], message)
        except Exception as exc:
            log.warning("the send of command %s to %d agents failed: %r", message["payload"].get("command_id"),
                        len(agent_ids), exc)
        return
    # At most SEND_CONCURRENCY at once: on Redis each concurrent group_send takes a connection of its own,
    # and hundreds opened at once per batch only queue up in Redis's accept backlog.
    limit = asyncio.Semaphore(SEND_CONCURRENCY)

    async def send(agent_id):
        async with limit:
            await layer.group_send(agent_group(agent_id), message)

    failed = [r for r in await asyncio.gather(*map(send, agent_ids), return_exceptions=True) if isinstance(r, Exception)]
    if failed:
        log.warning("%d of %d sends of command %s failed, e.g. %r", len(failed), len(agent_ids),
                    message["payload"].get("command_id"), failed[0])
