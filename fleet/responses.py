"""What agents answer, stored: response frames, acknowledgements (``received`` frames) and the sweep's
timeouts move each target's AgentExecStatus along its AgentState, keep the one Response row of each
(execution, agent) and the execution's counters, and publish one event per execution that changed
(fleet.events). The agent consumers of a server process hand their frames to ``responses`` (a
fleet.batching.Batcher), which stores them in batches; ``expire_overdue`` is the sweep's (fleet.tasks).

Invariants: a target reaches a terminal state once, ever, so a duplicate answer (an agent answering a
re-sent command with its kept result) is never counted twice; the per-agent rows are locked in id order
and the counters updated in execution-id order, so concurrent writers (other server processes, the
sweep) cannot deadlock; the rows are the truth and events are hints."""

import logging
from datetime import timedelta

from channels.db import database_sync_to_async
from django.db import connection, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from yuzu.dbfuncs import executemany, insert_many
from yuzu.metrics import FLEET_COMMAND_ACK_SECONDS

from . import events
from .batching import Batcher
from .models import AgentExecStatus, AgentState, Execution, Response

log = logging.getLogger("yuzu.fleet")

SWEEP_GRACE = timedelta(seconds=5)  # lets a terminal frame already in flight land before TIMEOUT
RECEIVED = "RECEIVED"  # a frame's status for a `received` frame: an acknowledgement, not an answer
#: the answer the server stores for an agent the dispatch gates held back before it was sent the command (fleet.tasks):
#: what the agent answers for a switched-off plugin, naming no switch (a group's is named only to who may read it)
HELD = ("kill_switched: {switch} is switched off by a kill switch that reaches this agent (held back after the "
        "launch); the command was not sent to it")
FORGOTTEN = ("the agent no longer knew the command when asked after it reconnected (it restarted or forgot it); "
             "it was not run again")


def record_response(agent_id, frame):
    """Store one validated response frame from ``agent_id`` (see fleet.consumers) and publish the change."""
    record_responses([(agent_id, frame)])


def record_responses(frames, publish=True):
    """Store a batch of validated frames ``[(agent_id, frame), …]`` in one transaction, in order, and
    publish one event per execution that changed (or, with ``publish=False``, leave that to the caller).
    A frame is an answer (``status`` the name of one of Response.STATES) or an acknowledgement
    (``status`` RECEIVED, from a ``received`` frame). Returns the changed executions."""
    _, changed = _apply([(agent_id, f["command_id"], None if f["status"] == RECEIVED else AgentState[f["status"]],
                          f.get("output") or "", f.get("exit_code"), f.get("error") or "") for agent_id, f in frames])
    if publish:
        events.publish(*changed)
    return changed


def _apply(items, acknowledge=True):
    """Apply ``[(agent_id, command_id, state, output, exit_code, error), …]`` in one transaction, as if one
    by one in order: the per-agent row moves first (a terminal state is reached once, ever), then the
    Response row, then the counters with F() expressions. ``output=None`` keeps the stored output. A
    frame for an unknown command, from an agent that was not targeted, or after the agent's terminal
    one changes nothing — so a duplicate (an agent answering a re-sent command with its stored result)
    is never counted twice. Returns (frames that changed something, the changed executions).

    Frames from agents (``acknowledge``) are acknowledgements: the first one for a command sets the
    row's ``acknowledged_at``. ``state`` None is an acknowledgement and nothing else (a ``received``
    frame): a ``pending`` or ``dispatched`` row becomes ``running``; no Response row, no counter, no
    event. The sweep's TIMEOUTs (``acknowledge=False``) acknowledge nothing.

    The per-agent rows are read FOR UPDATE, in id order (SQLite's IMMEDIATE transactions serialise
    writers anyway), so another writer of the same rows (the sweep, another server process) waits and
    then sees the state this batch left. The writes are one prepared UPDATE per table run over all
    rows, a bulk INSERT of new Response rows, and two UPDATEs per execution for the counters."""
    now = timezone.now()
    with transaction.atomic():
        exs = {row["command_id"]: row for row in Execution.objects.filter(
            command_id__in={i[1] for i in items}).values("id", "plugin", "command_id")}
        for agent_id, command_id, *_ in items:
            if command_id not in exs:
                log.info("response for unknown command %s from %s ignored", command_id, agent_id)
        items = [i for i in items if i[1] in exs]
        if not items:
            return 0, []
        pairs = {(exs[command_id]["id"], agent_id) for agent_id, command_id, *_ in items}
        rows = {(r[1], r[2]): r for r in AgentExecStatus.objects.select_for_update().filter(
            execution_id__in={e for e, _ in pairs}, agent_id__in={a for _, a in pairs}).order_by("id").values_list(
            "id", "execution_id", "agent_id", "status", "acknowledged_at", "last_sent_at") if (r[1], r[2]) in pairs}
        final, moved = {}, 0  # (execution id, agent id) → the state this batch leaves
        for agent_id, command_id, state, output, exit_code, error in items:
            pair = (exs[command_id]["id"], agent_id)
            row, before = rows.get(pair), final.get(pair)
            if row is None or row[3] in Response.TERMINAL or (before and before["state"] in Response.TERMINAL):
                continue
            if state is None and (before is not None or row[3] not in (AgentState.PENDING, AgentState.DISPATCHED)):
                continue  # acknowledged already
            if output is None and before is not None:
                output = before["output"]
            final[pair] = {"id": row[0], "command_id": command_id, "state": state, "output": output,
                           "exit_code": exit_code, "error": error}
            moved += 1
        if not final:
            return 0, []
        at = connection.ops.adapt_datetimefield_value(now)
        answered = {pair: st for pair, st in final.items() if st["state"] is not None}
        ack = [at] if acknowledge else []
        _executemany(AgentExecStatus, ["status", "exit_code", "error_detail", "completed_at", "first_response_at"]
                     + ["acknowledged_at"] * len(ack),
                     [(st["state"].value, st["exit_code"], st["error"], at if st["state"] in Response.TERMINAL
                       else None, at, *ack, st["id"]) for st in answered.values()])
        _executemany(AgentExecStatus, ["status", "acknowledged_at"],
                     [(AgentState.RUNNING.value, at, st["id"]) for st in final.values() if st["state"] is None])
        _store_responses(answered, exs, at)
        counts = {}  # execution id → [terminal, success]
        for (ex_id, _), st in answered.items():
            if st["state"] in Response.TERMINAL:
                c = counts.setdefault(ex_id, [0, 0])
                c[0], c[1] = c[0] + 1, c[1] + int(st["state"] == AgentState.SUCCESS)
        for ex_id, (responded, success) in sorted(counts.items()):  # one lock order: no deadlocks
            Execution.objects.filter(pk=ex_id).update(
                agents_responded=F("agents_responded") + responded, agents_success=F("agents_success") + success,
                agents_failure=F("agents_failure") + (responded - success))
            Execution.objects.filter(pk=ex_id, status=Execution.Status.RUNNING,
                                     agents_responded__gte=F("agents_targeted")).update(
                status=Case(When(agents_failure=0, then=Value(Execution.Status.SUCCEEDED)),
                            default=Value(Execution.Status.COMPLETED)), completed_at=now)
    if acknowledge:
        for pair in final:
            acknowledged_at, last_sent_at = rows[pair][4:]
            if acknowledged_at is None and last_sent_at is not None:
                FLEET_COMMAND_ACK_SECONDS.observe(max((now - last_sent_at).total_seconds(), 0.0))
    return moved, list(Execution.objects.filter(pk__in={ex_id for ex_id, _ in answered}))


def _store_responses(final, exs, at):
    """The one Response row of each (execution, agent): created, or updated in place."""
    plugin = {row["id"]: row["plugin"] for row in exs.values()}
    existing = {(e, a): pk for pk, e, a in Response.objects.filter(
        execution_id__in={e for e, _ in final}, agent_id__in={a for _, a in final}).values_list(
        "id", "execution_id", "agent_id") if (e, a) in final}
    new, update, update_output = [], [], []
    for (ex_id, agent_id), st in final.items():
        pk = existing.get((ex_id, agent_id))
        if pk is None:
            new.append((ex_id, agent_id, st["command_id"], st["state"].value, st["output"] or "", st["exit_code"],
                        st["error"], at, plugin[ex_id]))
            continue
        fields = (st["command_id"], st["state"].value, st["exit_code"], st["error"], at, plugin[ex_id])
        if st["output"] is None:
            update.append((*fields, pk))
        else:
            update_output.append((*fields, st["output"], pk))
    insert_many(Response, ["execution_id", "agent_id", "instruction_id", "status", "output", "exit_code",
                           "error_detail", "timestamp", "plugin"], new)
    columns = ["instruction_id", "status", "exit_code", "error_detail", "timestamp", "plugin"]
    _executemany(Response, columns, update)
    _executemany(Response, columns + ["output"], update_output)


def _executemany(model, columns, rows):
    """``UPDATE <table> SET <column> = %s, … WHERE id = %s`` once per row of parameters, as one prepared
    statement (yuzu.dbfuncs.executemany; per-row ORM UPDATEs, or bulk_update's CASE expressions, cost far more).
    ``first_response_at`` and ``acknowledged_at`` keep their value once set."""
    if not rows:
        return
    q = connection.ops.quote_name
    sets = ", ".join(f"{q(c)} = COALESCE({q(c)}, %s)" if c in ("first_response_at", "acknowledged_at") else f"{q(c)} = %s"
                     for c in columns)
    executemany(f"UPDATE {q(model._meta.db_table)} SET {sets} WHERE {q('id')} = %s", rows)


def expire_overdue(now=None, limit=5000):
    """Mark agents that gave no terminal response before their command expired as TIMEOUT (a stored
    TIMEOUT Response that keeps any partial output, counted like any other). Returns how many."""
    cutoff = (now or timezone.now()) - SWEEP_GRACE
    rows = list(AgentExecStatus.objects.filter(execution__expires_at__lt=cutoff)
                .exclude(status__in=Response.TERMINAL)
                .exclude(execution__status=Execution.Status.CANCELLED, status=AgentState.PENDING)
                .values_list("agent_id", "execution__command_id")[:limit])
    if not rows:
        return 0
    timed_out, changed = _apply([(agent_id, command_id, AgentState.TIMEOUT, None, None,
                                  "no terminal response before the command expired") for agent_id, command_id in rows],
                                acknowledge=False)
    events.publish(*changed)
    return timed_out


def hold(execution, agent_ids):
    """The agents of ``execution`` the dispatch gates held back from the batch just claimed for its first send
    (fleet.tasks, in the claim's transaction): never sent the command, they end as an agent ends one for a switched-off
    plugin — REJECTED ``kill_switched`` (HELD) — counted like any answer, so the execution still completes; their
    rows keep no send (``attempts`` 0). Returns the changed executions, without publishing."""
    AgentExecStatus.objects.filter(execution_id=execution.id, agent_id__in=agent_ids,
                                   status=AgentState.DISPATCHED).update(attempts=0, last_sent_at=None)
    reason = HELD.format(switch=f"{execution.plugin}.{execution.action}")
    return _apply([(agent_id, execution.command_id, AgentState.REJECTED, None, None, reason) for agent_id in agent_ids],
                  acknowledge=False)[1]


def running_commands(agent_id, limit):
    """The command ids of the agent's rows in ``running`` (acknowledged, no terminal answer stored), newest
    first, at most ``limit``: what the server asks a (re-)registering agent about (``result.query``,
    fleet.consumers), since a terminal answer sent into a connection that died is lost on the way."""
    return list(AgentExecStatus.objects.filter(agent_id=agent_id, status=AgentState.RUNNING).order_by("-id")
                .values_list("execution__command_id", flat=True)[:limit])


def record_forgotten(agent_id, command_ids):
    """The agent answered ``unknown`` about these commands (it restarted, or its memory of command ids moved
    on): the ones still ``running`` for it end in TIMEOUT with the reason FORGOTTEN, keeping any partial output
    (as the sweep's TIMEOUT does: the agent is lost for that command). Never re-sent, so never run twice.
    Rows in another state are left alone (a ``dispatched`` one is the re-send's, a terminal one is final).
    Returns (how many moved, the changed executions) without publishing; the caller publishes."""
    with transaction.atomic():
        known = list(AgentExecStatus.objects.filter(agent_id=agent_id, status=AgentState.RUNNING,
                                                    execution__command_id__in=command_ids)
                     .values_list("execution__command_id", flat=True))
        if not known:
            return 0, []
        return _apply([(agent_id, cid, AgentState.TIMEOUT, None, None, FORGOTTEN) for cid in known],
                      acknowledge=False)


# --- frames batched across the agent connections of this process ---------------------------------

async def _store(frames):
    """A batch of the process's frames in one database hop (``record_responses``: one transaction, a handful of
    queries and one event per execution, whatever the batch size); the events are published from the event
    loop, so the database thread never waits on the channel layer."""
    changed = await database_sync_to_async(record_responses)(frames, publish=False)
    await events.apublish(*changed)
    return [None] * len(frames)


responses = Batcher(_store, "response frames")
"""What the agent consumers of this process hand their frames to: ``await responses.submit((agent_id, frame))``
returns once the frame is stored, so each connection keeps its order (its next message is handled after its
previous frame is in the database)."""
