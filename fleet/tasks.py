"""Celery tasks of the fleet. Both are idempotent, so ``acks_late`` redelivery after a worker dies is safe:
dispatch claims the agents it sends to (``pending`` → ``dispatched``, or a re-send's attempt) before
sending, so a re-run never sends to an agent twice within its window; answers are stored as the agent
consumers receive them (fleet.responses), not here, so a worker restart loses none.

Delivery is at-least-once (docs/fleet.md, "Delivery guarantees"): an agent acknowledges a command with
its first frame about it; one that has not within the window of the send is sent it again if there is
evidence the command may be lost, the window doubling with each send, up to MAX_SENDS sends; the agent
runs a command_id once, so a re-send never runs it twice. The evidence (``_lost``): the agent has a new
connection opened since the send (the command went to one that closed), or its server process found
its connection caught up well after the send (every frame the agent sent read and handled, every
command for it relayed — fleet.liveness) with still no acknowledgement. Without it the command is held:
an agent whose acknowledgement is not yet read because its *server* is behind is not sent it again (each
re-send was a send plus a duplicate answer added to that backlog), and the expiry sweep's TIMEOUT is the
bound. Re-sends must not add to the load of a server that is merely slow either: the window grows with
the number of agents targeted, re-sends wait until the execution has gone quiet (no send, and no
acknowledgement or answer stored, for a while), and go out at most BATCH at a time, one round per quiet
period.

Every send is put to the dispatch gates (fleet.gates: the kill switches) first — each claimed batch of first
sends and each round of re-sends, in the transaction that claims it — so a switch engaged after the launch stops
the sends from its next batch on (docs/fleet.md, "Kill switches and the dispatch")."""

import asyncio
import contextvars
import logging
from datetime import timedelta

from asgiref.sync import async_to_sync
from celery import shared_task
from channels.db import database_sync_to_async
from django.db import connection, transaction
from django.db.models import F, Max, Min, Q
from django.utils import timezone

from yuzu.audit import audit
from yuzu.errors import YuzuError

from . import events
from .gates import held_back
from .models import Agent, AgentExecStatus, AgentState, Execution, touch_interval
from .push import send_to_agents
from .responses import expire_overdue, hold

BATCH = 500  # re-sends per round
CLAIM_BATCH = 5000  # first sends claimed (one statement) and sent (one batched send) at a time
ACK_WINDOW_S = 5.0  # a send not acknowledged within this is due again; doubled after each further send
ACK_QUIET_S = 2.0  # re-sends wait until the execution had no send, acknowledgement or answer for this long
PER_AGENT_S = 0.01  # both grow with the fan-out: the window by this per agent, the quiet period by a fifth
MAX_SENDS = 5  # sends per agent in all (then the expiry sweep's TIMEOUT)
SYSTEM = "system:dispatch"  # who the audit row names when the dispatch gates stop an execution
#: a sent agent's row the dispatch gates held back from a re-send: never sent again (fleet.tasks._lost skips it)
NOT_RESENT = "kill_switched: not sent again, {switch} is switched off by a kill switch that reaches this agent"
log = logging.getLogger("yuzu.fleet")


def ack_window(attempts, targeted):
    """Seconds after its ``attempts``-th send that a command still unacknowledged is sent again, for an
    execution targeting ``targeted`` agents: 5, 10, 20, 40 s up to 500 agents; 50, 100, … s for 5,000."""
    return max(ACK_WINDOW_S, targeted * PER_AGENT_S) * 2 ** (attempts - 1)


def quiet_period(targeted):
    """Seconds without activity on the execution (a send, or an acknowledgement or answer stored) before
    re-sends go out: while answers are still arriving, the server is delivering, not losing; and each
    round of at most BATCH re-sends waits this long after the one before. 2 s up to 1,000 agents."""
    return max(ACK_QUIET_S, targeted * PER_AGENT_S / 5)


@shared_task(acks_late=True)
def dispatch_execution(execution_id, sensitive=None):
    """Send the execution's command to the agents that should get it now: its pending agents, a batch
    at a time, until none are left or the execution stops running (cancelled); then the agents whose
    acknowledgement is overdue (re-sends). The dispatch gates (kill switches) are asked about each batch and
    each round of re-sends before it is sent, as the server's own dispatch: the agents they hold back are not
    sent it, and a refusal of the whole dispatch stops the execution (``_stop``). While any agent may still need
    a re-send, schedule this task again for when that is due. ``sensitive`` carries the parameter values that are
    stored redacted (so only this task's messages hold them). Returns how many sends this run made."""
    ex = Execution.objects.filter(pk=execution_id).first()
    if ex is None:
        return 0
    frame = {"type": "command", "command_id": ex.command_id, "plugin": ex.plugin, "action": ex.action,
             "parameters": {**ex.parameter_values, **(sensitive or {})}, "expires_at": ex.expires_at.timestamp()}
    sent = 0
    try:
        while Execution.objects.filter(pk=execution_id, status=Execution.Status.RUNNING).exists():
            claimed, agent_ids = _claim_gated(ex)
            if not claimed:
                break
            if agent_ids:
                async_to_sync(send_to_agents)(agent_ids, {"type": "agent.command", "payload": frame})
                sent += len(agent_ids)
        overdue = _claim_unacknowledged(ex)
    except YuzuError as refusal:
        if refusal.retry_after_ms is None:
            _stop(ex, refusal.message)
            return sent
        # The gates could not tell (their store failed): nothing more is sent now (fail closed), and the
        # dispatch is asked again once the store may be back.
        log.warning("dispatch of execution %s deferred: %s", execution_id, refusal.message)
        _schedule(execution_id, sensitive, refusal.retry_after_ms / 1000)
        return sent
    if overdue:
        async_to_sync(send_to_agents)(overdue, {"type": "agent.command", "payload": frame, "resend": True})
        sent += len(overdue)
    delay = _next_check(execution_id)
    if delay is not None:
        _schedule(execution_id, sensitive, delay)
    return sent


def _claim(execution_id):
    """Mark the next CLAIM_BATCH pending agents dispatched (first send) and return their ids: one
    conditional UPDATE … RETURNING, so a claim is one statement however many agents it takes. The picked
    ids are a materialized CTE (PostgreSQL may otherwise re-run an ``IN (SELECT … LIMIT)`` subquery and
    take more than the limit); it skips rows another worker has locked (PostgreSQL; SQLite has one writer
    at a time), and the ``status = pending`` re-check means a row is claimed by exactly one worker. The same
    statement requires the execution to be running: a cancel committed after the caller's own check withheld
    the pending agents, and must not see them sent. Claiming before sending means a crash between the two
    leaves the agent unacknowledged, which the next check re-sends."""
    q = connection.ops.quote_name
    table, executions = q(AgentExecStatus._meta.db_table), q(Execution._meta.db_table)
    lock = " FOR UPDATE SKIP LOCKED" if connection.features.has_select_for_update_skip_locked else ""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH picked AS MATERIALIZED (SELECT {q('id')} FROM {table} WHERE {q('execution_id')} = %s AND "
            f"{q('status')} = %s AND EXISTS (SELECT 1 FROM {executions} WHERE {q('id')} = %s AND {q('status')} = %s) "
            f"ORDER BY {q('id')} LIMIT %s{lock}) "
            f"UPDATE {table} SET {q('status')} = %s, {q('attempts')} = 1, {q('last_sent_at')} = %s "
            f"WHERE {q('id')} IN (SELECT {q('id')} FROM picked) AND {q('status')} = %s RETURNING {q('agent_id')}",
            [execution_id, AgentState.PENDING, execution_id, Execution.Status.RUNNING, CLAIM_BATCH,
             AgentState.DISPATCHED, now, AgentState.PENDING])
        return [agent_id for (agent_id,) in cursor.fetchall()]


def _claim_gated(ex):
    """Claim the next batch of first sends (``_claim``) and ask the dispatch gates about it, in one transaction,
    before anything is sent: the claimed rows stay locked until the gates have answered for them (so no other
    worker takes them meanwhile), a refusal rolls the claim back (the agents stay pending: ``_stop`` withholds
    them) and the agents held back are answered REJECTED ``kill_switched`` (responses.hold), never sent. One gate
    call per batch, however many agents it holds. Returns (how many were claimed, the agents to send to)."""
    with transaction.atomic():
        claimed = _claim(ex.id)
        held = held_back(ex.plugin, ex.action, claimed) if claimed else {}
        changed = hold(ex, sorted(held)) if held else []
    if held:
        log.info("execution %s: %d agents held back by a kill switch after the launch", ex.id, len(held))
    events.publish(*changed)
    return len(claimed), [agent_id for agent_id in claimed if agent_id not in held]


def _stop(ex, why):
    """The dispatch gates refused the execution's dispatch as a whole (its plugin switched off fleet-wide): it is
    cancelled with their refusal as its reason (``status_reason``) — its pending agents are never sent the
    command, none is sent it again, answers from agents already sent it still count — audited and published.
    Releasing the switch resumes nothing: a stopped execution stays stopped."""
    cancelled, withheld = ex.cancel(why)
    if cancelled:
        log.warning("execution %s stopped: %s", ex.id, why)
        audit(SYSTEM, "execution.cancel", "success", target_type="Execution", target_id=ex.id,
              detail=f"command_id={ex.command_id} status={ex.status} withheld={withheld} reason={why}")
        events.publish(ex)


def _lost(statuses, now, targeted):
    """The rows of ``statuses`` due a re-send: still ``dispatched`` (sent, not acknowledged) past the window
    of their last send, with sends left, not held back from a re-send by a kill switch (NOT_RESENT), their agent
    connected, and evidence the command may be lost — the agent's connection was opened after the send, or its
    server process found that connection caught up (AgentQuerySet.touch) a window or more after the send."""
    due = Q()
    for attempts in range(1, MAX_SENDS):
        window = timedelta(seconds=ack_window(attempts, targeted))
        due |= Q(attempts=attempts, last_sent_at__lte=now - window) & (
            Q(agent__connected_since__gt=F("last_sent_at")) | Q(agent__caught_up_at__gte=F("last_sent_at") + window))
    return statuses.filter(due, status=AgentState.DISPATCHED, error_detail="", agent__connected=True)


def _claim_unacknowledged(ex):
    """Claim a re-send of up to BATCH agents due one (``_lost``) while the execution runs, has not expired
    and its agents have gone quiet. Counts them in the execution's ``resent``. The dispatch gates are asked
    about them while their rows are locked: a refusal raises (nothing is claimed); an agent held back is not
    sent it again, ever (NOT_RESENT marks its row, which stays ``dispatched``: it was sent the command once,
    so its answer, if it ran it, still counts)."""
    execution_id, now = ex.id, timezone.now()
    statuses = AgentExecStatus.objects.filter(execution_id=execution_id)
    with transaction.atomic():
        targeted = _running(execution_id, now)
        if targeted is None:
            return []
        active = _last_activity(statuses)
        if active is not None and now - active < timedelta(seconds=quiet_period(targeted)):
            return []
        rows = list(_lost(statuses, now, targeted).select_for_update(skip_locked=True, of=("self",))
                    .order_by("id").values_list("id", "agent_id")[:BATCH])
        held = held_back(ex.plugin, ex.action, [agent_id for _, agent_id in rows]) if rows else {}
        if held:
            AgentExecStatus.objects.filter(pk__in=[pk for pk, agent_id in rows if agent_id in held]).update(
                error_detail=NOT_RESENT.format(switch=f"{ex.plugin}.{ex.action}"))
            rows = [(pk, agent_id) for pk, agent_id in rows if agent_id not in held]
        if rows:
            AgentExecStatus.objects.filter(pk__in=[pk for pk, _ in rows], status=AgentState.DISPATCHED).update(
                attempts=F("attempts") + 1, last_sent_at=now)
            Execution.objects.filter(pk=execution_id).update(resent=F("resent") + len(rows))
    return [agent_id for _, agent_id in rows]


def _next_check(execution_id):
    """Seconds until a re-send may next be due, or None if none can be: every agent sent the command has
    acknowledged it or used up its sends, or the execution is over or expired. Agents past their window
    without evidence of loss are looked at again a touch interval later: evidence comes with a reconnect
    or with their server process's touch."""
    now = timezone.now()
    targeted = _running(execution_id, now)
    if targeted is None:
        return None
    statuses = AgentExecStatus.objects.filter(execution_id=execution_id)
    due = [row["oldest"] + timedelta(seconds=ack_window(row["attempts"], targeted)) for row in
           statuses.filter(status=AgentState.DISPATCHED, error_detail="", attempts__lt=MAX_SENDS).order_by()
           .values("attempts")
           .annotate(oldest=Min("last_sent_at")) if row["oldest"] is not None]
    if not due:
        return None
    at, active = min(due), _last_activity(statuses)
    if at <= now and not _lost(statuses, now, targeted).exists():
        at = now + timedelta(seconds=touch_interval())
    if active is not None:
        at = max(at, active + timedelta(seconds=quiet_period(targeted)))
    return max((at - now).total_seconds(), 0.2)


def _last_activity(statuses):
    """When these agents were last sent the command, or last had an acknowledgement or answer stored.
    Counting sends paces the re-sends: a round waits for the quiet period after the one before."""
    times = statuses.aggregate(sent=Max("last_sent_at"), ack=Max("acknowledged_at"),
                               answer=Max("completed_at")).values()
    return max((t for t in times if t is not None), default=None)


def _running(execution_id, now):
    """How many agents the execution targets, if it is still running and not expired; else None."""
    return Execution.objects.filter(pk=execution_id, status=Execution.Status.RUNNING, expires_at__gt=now).values_list(
        "agents_targeted", flat=True).first()


def _schedule(execution_id, sensitive, delay):
    """Run dispatch_execution again in ``delay`` seconds: a countdown task on the broker, or in embedded
    mode (Celery eager, inside the server process) a timer on the event loop the agents' sockets and
    the in-memory channel layer live on. (An eager dispatch outside a server, e.g. from a shell, has no
    such loop: the timer goes with the temporary one, and there are no agents to re-send to anyway.)"""
    if not dispatch_execution.app.conf.task_always_eager:
        dispatch_execution.apply_async((execution_id, sensitive), countdown=delay)
    else:
        async_to_sync(_call_later)(delay, execution_id, sensitive)


async def _call_later(delay, execution_id, sensitive):
    # In a fresh context: the caller's (a request's) carries asgiref's executor for that request's
    # thread, which is gone by the time the timer fires.
    loop = asyncio.get_running_loop()
    loop.call_later(delay, lambda: loop.create_task(_dispatch_again(execution_id, sensitive)),
                    context=contextvars.Context())


async def _dispatch_again(execution_id, sensitive):
    try:
        await database_sync_to_async(dispatch_execution)(execution_id, sensitive)
    except Exception:
        log.exception("re-sending execution %s failed", execution_id)


@shared_task(acks_late=True)
def sweep_overdue():
    """Beat, every 5 s: agents silent past their command's expiry end in TIMEOUT, not a hang; agents
    whose heartbeats stopped are marked disconnected. Returns how many agents timed out."""
    Agent.objects.mark_silent_disconnected()
    return expire_overdue()
