"""Turns: the synchronous half of the rendezvous — what bridge_send, bridge_reply, bridge_ask, bridge_cancel
and bridge_ack write, and what a blocked call reads (the waits themselves are in bridge/rendezvous.py).

Invariants:

* **Checked before anything is stored.** Content is plain text of at most 64 KiB (``check_content``),
  the caller has the tool's role, the worker and the turn are the caller's own; only then is a turn,
  a message or an answer written.
* **Every outcome is written to its Turn row first** (reply, question, turn_done, worker_gone,
  delivery_failed, cancelled): as the turn's ``pending`` outcome if a waiter is live, else as an
  InboxItem for the primary (``Turn.hand_over``). Waiters are woken only after the commit, and the
  audit row of a send, reply or ask commits with the change it records, so a woken caller finds both.
* **A timeout never loses a reply.** A waiter gives up atomically (``take_outcome(final=True)``); an
  outcome after that goes to the inbox; an outcome stranded on a waiter whose process died is swept
  there (``sweep``). The inbox returns an item on every bridge_poll until bridge_ack.
* **Re-sends are idempotent** (a 2026-07-28 client re-sends a call whose response stream broke, with a new
  request id and the same arguments). A question is answered once: ``answer_seq`` catches up with
  ``ask_seq``; answering a turn with no open question is ``no_question`` — except a re-send of the very answer
  it got (same turnId, same text): that waits again on the turn, or returns its outcome if it has ended. A new
  turn's message re-sent after its wait dropped with the client (same caller, same worker, same text, the
  caller's last turn there, within RESEND_WINDOW) finds that turn again — it is never pasted twice. A worker
  re-sending the question still open waits for the same answer instead of asking twice, and one re-sending a
  question answered after its wait dropped gets that answer at once.
* **Bounded.** A worker's FIFO holds at most YUZU_BRIDGE_MAX_QUEUE messages queued or awaiting pickup
  (``queue_full``); a primary's inbox at most YUZU_BRIDGE_MAX_INBOX unacknowledged items it did not ask for — a
  worker's notes, late replies and questions nobody waits for are refused beyond it (``inbox_full``), and so is the
  primary's next new turn, until it acknowledges some. The one outcome a turn ends with is never refused (no reply is
  lost to the bound): so the inbox holds at most the limit plus the turns then open. Refused before anything is
  written.
* **Lock order: Member, then Turn** (bridge/models.py).
"""

import logging
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from yuzu.audit import audit
from yuzu.errors import YuzuError

from . import conf, waiters
from .failures import BridgeFailure
from .identity import PRIMARY, WORKER, require
from .models import MAX_CONTENT_BYTES, InboxItem, Member, Message, Turn
from .terminal import TerminalError, unpasteable
from .workers import backend, resolve_worker

log = logging.getLogger("yuzu.bridge")


def check_inbox_room(key, *, worker):
    """Refuse (``inbox_full``) an item the primary ``key`` did not ask for while its inbox is full: before anything
    is written. ``worker``: who is told, a worker adding to its primary's inbox, or the primary about to open a turn."""
    limit = conf.max_inbox()
    held = InboxItem.objects.pending(key).count()
    if held < limit:
        return
    if worker:
        msg = (f"your primary's inbox holds {held} unacknowledged items, the most it may (YUZU_BRIDGE_MAX_INBOX="
               f"{limit}); nothing was sent — retry once the primary has collected them, or end the task with "
               "bridge_reply(content): a turn's final reply always reaches the primary")
    else:
        msg = (f"your inbox holds {held} unacknowledged items, the most it may (YUZU_BRIDGE_MAX_INBOX={limit}); "
               "nothing was sent — collect them with bridge_poll and confirm them with bridge_ack first")
    raise BridgeFailure("inbox_full", msg, retryable=True)


def check_content(content):
    """The one gate for bridge_send / bridge_reply / bridge_ask text, before anything is stored or sent.
    Control characters are refused, not stripped: text that reaches a worker's terminal must be exactly
    what its sender wrote, and an ESC could break out of the bracketed paste (docs/bridge.md)."""
    if len(content.encode("utf-8")) > MAX_CONTENT_BYTES:
        raise YuzuError("content exceeds 64 KiB (65536 bytes of UTF-8)", status=413, rpc_code=-32602,
                        remediation="send less text, or point the worker at a file")
    bad = unpasteable(content)
    if bad is not None:
        raise YuzuError(f"content holds a {bad}; only tab, newline and carriage return are allowed", status=400,
                        rpc_code=-32602, remediation="remove terminal escape sequences and other control characters")


@dataclass
class Prepared:
    turn_pk: int
    turn_id: str
    session_id: str
    wait: bool
    deadline: object = None  # aware datetime
    outcome: dict | None = None  # a re-sent answer on a turn that has already ended: its outcome, no wait
    lease: str = ""  # the owner of the wait's lease (bridge/waiters.py), renewed by rendezvous.wait_turn


def prepare_send(caller, content, *, session=None, timeout_ms=600000, wait=True, auto_spawn=True, turn_id=None,
                 cid="", watched=None, block=True):
    """bridge_send before the wait: queue the message on a new turn (or answer a question). A call that will wait
    takes its wait's lease at once (bridge/waiters.py): from here on its turn's waiter is known alive.

    When it must first watch an earlier wait's lease (``Undecided``), it does so here, sleeping (``block``), or
    raises ``Undecided`` for its caller to watch and call again with ``watched`` — what the tool does
    (rendezvous.prepare_send), so that the watch holds none of the threads every server call shares."""
    while True:
        try:
            prepared = _prepare_send(caller, content, session=session, timeout_ms=timeout_ms, wait=wait,
                                     auto_spawn=auto_spawn, turn_id=turn_id, cid=cid, watched=watched)
            break
        except Undecided as undecided:  # nothing was written: watch the lease outside any transaction, then again
            if not block:
                raise
            watched = (undecided.turn_pk, _outlives_a_lease(undecided.turn_pk))
    if wait and prepared.outcome is None:
        prepared.lease = secrets.token_hex(8)
        waiters.leases().hold(prepared.turn_pk, prepared.lease)
    return prepared


class Undecided(Exception):
    """The same text as the caller's last turn to this worker, whose waiter holds a lease: a live wait (this is a
    deliberate second message) or one whose process died a moment ago (this is its re-send)."""

    def __init__(self, turn_pk):
        super().__init__(turn_pk)
        self.turn_pk = turn_pk


#: how often a watch re-reads a lease, and how far past its length it watches
LEASE_WATCH_STEP, LEASE_WATCH_SLACK = 0.25, 0.5


def _outlives_a_lease(turn_pk):
    """Whether the turn's wait lease stays alive for a whole lease's length (a live waiter renews it every
    RENEW_SECONDS; one that died lets it run out within LEASE_SECONDS). Sleeps: for callers off the event loop
    (rendezvous.outlives_a_lease is the tool's)."""
    until = time.monotonic() + waiters.LEASE_SECONDS + LEASE_WATCH_SLACK
    while time.monotonic() < until:
        if not waiters.leases().alive(turn_pk):
            return False
        time.sleep(LEASE_WATCH_STEP)
    return True


def _prepare_send(caller, content, *, session, timeout_ms, wait, auto_spawn, turn_id, cid, watched=None):
    require(caller, PRIMARY, "bridge_send")
    check_content(content)
    now = timezone.now()
    deadline = now + timedelta(milliseconds=timeout_ms)
    if turn_id:
        with transaction.atomic():
            t = (Turn.objects.select_for_update().select_related("member")
                 .filter(turn_id=turn_id, owner_key=caller.world_key).first())
            if t is None:
                raise BridgeFailure("unknown_turn", f"no turn '{turn_id}' of yours")
            if session and session not in (t.member.session_id, t.member.pane_id, t.member.terminal_id,
                                           t.member.profile_name):
                raise BridgeFailure("unknown_turn", f"turn '{turn_id}' is not with worker '{session}'")
            if t.state == Turn.State.GONE or not t.member.live:
                raise BridgeFailure("worker_gone", f"worker {t.member.session_id} is gone")
            if not t.open_question and t.answer_seq and t.answer_seq == t.ask_seq and t.answer == content:
                # A re-send of the answer already given (idempotent on turnId): wait again, or get the outcome.
                outcome = t.resume(deadline if wait else None, now)
                audit(caller.principal, "bridge.send", "success", target_type="BridgeMember",
                      target_id=t.member.session_id, detail=f"resend turn={t.turn_id} wait={wait}",
                      correlation_id=cid)
                return Prepared(t.pk, t.turn_id, t.member.session_id, wait, deadline, outcome)
            if not t.open_question:
                raise BridgeFailure("no_question", f"turn '{turn_id}' has no open question (state {t.state}); "
                                                   "send without turnId to start a new turn")
            t.answer_question(content, deadline if wait else None, now)
            audit(caller.principal, "bridge.send", "success", target_type="BridgeMember",
                  target_id=t.member.session_id, detail=f"answer turn={t.turn_id} wait={wait}", correlation_id=cid)
        return Prepared(t.pk, t.turn_id, t.member.session_id, wait, deadline)
    check_inbox_room(caller.world_key, worker=False)  # before an auto-spawn, too
    member = resolve_worker(caller, session, auto_spawn=auto_spawn, cid=cid)
    with transaction.atomic():
        m = Member.objects.select_for_update().get(pk=member.pk)
        if not m.live:
            raise BridgeFailure("worker_gone", f"worker {m.session_id} is gone ({m.stop_reason})")
        if m.owner_key != caller.world_key:  # handed to this token's rotation successor since it was looked up
            raise BridgeFailure("unknown_worker", f"worker {m.session_id} belongs to this token's rotation successor "
                                                  "now; call with the successor token")
        queued, limit = m.messages.filter(state__in=Message.IN_FLIGHT).count(), conf.max_queue()
        last = (Turn.objects.select_for_update().filter(member=m, owner_key=caller.world_key)
                .order_by("-id").first())
        if last is not None and (last.resent(content, now) or (last.orphaned(content, now) and
                                                                not _waiter_alive(last.pk, watched))):
            # The caller's last message to this worker, re-sent after its wait dropped with the client (a
            # 2026-07-28 client re-sends a call whose stream broke), or died with its server process (a waiter
            # registered on the turn holds no lease: bridge/waiters.py): the same turn, never a second paste.
            last.dropped_at = None
            last.save(update_fields=["dropped_at"])
            outcome = last.resume(deadline if wait else None, now)
            audit(caller.principal, "bridge.send", "success", target_type="BridgeMember", target_id=m.session_id,
                  detail=f"resend turn={last.turn_id} wait={wait}", correlation_id=cid)
            return Prepared(last.pk, last.turn_id, m.session_id, wait, deadline, outcome)
        if queued >= limit:
            raise BridgeFailure("queue_full", f"worker {m.session_id} already has {queued} messages queued or awaiting "
                                f"pickup, the most one worker may (YUZU_BRIDGE_MAX_QUEUE={limit}); nothing was "
                                "queued — wait for its outcomes (bridge_status shows queueDepth), send to another "
                                "worker, or bridge_cancel a turn", retryable=True)
        t = m.queue(content, owner_key=caller.world_key, deadline=deadline if wait else None)
        audit(caller.principal, "bridge.send", "success", target_type="BridgeMember", target_id=m.session_id,
              detail=f"turn={t.turn_id} wait={wait} bytes={len(content.encode('utf-8'))}", correlation_id=cid)
    return Prepared(t.pk, t.turn_id, m.session_id, wait, deadline)


def _waiter_alive(turn_pk, watched):
    if watched is not None and watched[0] == turn_pk:
        return watched[1]
    if waiters.leases().alive(turn_pk):
        raise Undecided(turn_pk)
    return False


def take_outcome(turn_pk, final=False):
    """The primary's waiter: take the pending outcome; at the deadline (``final``), give up → timeout."""
    if not final and not Turn.objects.filter(pk=turn_pk, pending__isnull=False).exists():
        return None  # the common re-read: no write lock taken
    with transaction.atomic():
        t = Turn.objects.select_for_update().select_related("member").get(pk=turn_pk)
        if t.pending is not None:
            return t.take_pending()
        if final:
            return t.stop_waiting()
        return None


def release_waiter(turn_pk):
    """The waiter went away early (client disconnected): later outcomes go to the inbox."""
    with transaction.atomic():
        t = Turn.objects.select_for_update().filter(pk=turn_pk).first()
        if t is not None:
            t.release_waiter()


def reply(caller, content, *, final=True, cid=""):
    require(caller, WORKER, "bridge_reply")
    check_content(content)
    with transaction.atomic():
        m = Member.objects.select_for_update().get(pk=caller.member.pk)
        t = m.locked_current_turn()
        base = {"text": content, "sessionId": m.session_id, "turnId": t.turn_id if t else None}
        if not final or t is None or not t.active:  # an item besides the one outcome the turn ends with
            check_inbox_room(m.owner_key, worker=True)
        if not final:
            InboxItem.deliver(m.owner_key, {"outcome": "note", **base})
            mode = "queued"
        elif t is not None and t.active:
            mode = t.end(Turn.State.REPLIED, {"outcome": "reply", **base})
        else:  # no open turn (spontaneous, or its turn already ended): detached
            InboxItem.deliver(m.owner_key, {"outcome": "reply", **base, "late": True})
            mode = "queued"
        audit(caller.principal, "bridge.reply", "success", target_type="BridgeMember", target_id=m.session_id,
              detail=f"turn={t.turn_id if t else '-'} final={final} mode={mode}", correlation_id=cid)
    return {"delivered": True, "mode": mode, "turnId": t.turn_id if t else None}


def prepare_ask(caller, content, *, cid=""):
    """bridge_ask before the wait: surface the question on the worker's turn. Returns (turn pk, turn id, seq)."""
    require(caller, WORKER, "bridge_ask")
    check_content(content)
    with transaction.atomic():
        m = Member.objects.select_for_update().get(pk=caller.member.pk)
        t = m.locked_current_turn()
        if t is not None and t.open_question and t.question == content:
            # A re-send of the question still open (the worker's response was lost): wait for the same answer.
            audit(caller.principal, "bridge.ask", "success", target_type="BridgeMember", target_id=m.session_id,
                  detail=f"turn={t.turn_id} resend", correlation_id=cid)
            return t.pk, t.turn_id, t.ask_seq
        if t is not None and t.active and t.question == content and t.ask_seq and t.ask_dropped_seq == t.ask_seq \
                and t.answer_seq >= t.ask_seq:
            # A re-send of a question answered after its wait dropped with the client: the answer it missed, at
            # once — the question does not reach the primary twice.
            t.ask_dropped_seq = 0
            t.save(update_fields=["ask_dropped_seq"])
            audit(caller.principal, "bridge.ask", "success", target_type="BridgeMember", target_id=m.session_id,
                  detail=f"turn={t.turn_id} resend answered", correlation_id=cid)
            return t.pk, t.turn_id, t.ask_seq
        if t is None or not t.active or not t.waiter_live(timezone.now()):  # the question goes to the inbox
            check_inbox_room(m.owner_key, worker=True)
        if t is None or not t.active:
            t = m.open_own_turn()
        mode = t.ask(content)
        audit(caller.principal, "bridge.ask", "success", target_type="BridgeMember", target_id=m.session_id,
              detail=f"turn={t.turn_id} mode={mode}", correlation_id=cid)
    return t.pk, t.turn_id, t.ask_seq


def ask_dropped(turn_pk, seq):
    """The worker's bridge_ask wait went away with its client: remember which ask, so that its re-send gets the
    answer (prepare_ask) rather than asking the primary again."""
    Turn.objects.filter(pk=turn_pk, ask_seq=seq).update(ask_dropped_seq=seq)


def check_answer(turn_pk, seq, final=False):
    """The worker's ask waiter: the answer, or an ending; None to keep waiting."""
    if not final and Turn.objects.filter(pk=turn_pk, answer_seq__lt=seq, state=Turn.State.QUESTION).exists():
        return None  # still unanswered: no write lock taken
    with transaction.atomic():
        return Turn.objects.select_for_update().get(pk=turn_pk).ask_result(seq, final)


def cancel(caller, ident=None, *, cid=""):
    require(caller, PRIMARY, "bridge_cancel")
    m = resolve_worker(caller, ident)
    with transaction.atomic():
        cur = Turn.objects.select_for_update().filter(pk=m.current_turn_id, state__in=Turn.ACTIVE).first() \
            if m.current_turn_id else None
        t = cur or Turn.objects.select_for_update().filter(member=m, state__in=Turn.ACTIVE).order_by("id").first()
        if t is None:
            return {"cancelled": False, "sessionId": m.session_id, "turnId": None, "interrupted": False}
        t.member = m
        delivered = t.cancel()
    interrupted = False
    if delivered and m.pane_id:
        keys = (m.profile.interrupt_keys if m.profile else None) or ["Escape"]
        try:
            backend(m.socket_name).send_keys(m.pane, *keys)
            interrupted = True
        except TerminalError as exc:
            log.warning("interrupting %s: %s", m.session_id, exc)
    audit(caller.principal, "bridge.cancel", "success", target_type="BridgeMember", target_id=m.session_id,
          detail=f"turn={t.turn_id} interrupted={interrupted}", correlation_id=cid)
    return {"cancelled": True, "sessionId": m.session_id, "turnId": t.turn_id, "interrupted": interrupted}


def ack(caller, ids):
    acked, unknown = InboxItem.objects.ack(caller.inbox_key, ids)
    return {"acked": acked, "unknown": unknown}


def sweep(now=None, grace=10):
    """Never lose an outcome: a pending outcome whose waiter is long past its deadline (its process
    died) moves to the inbox."""
    before = (now or timezone.now()) - timedelta(seconds=grace)
    if not Turn.objects.stranded(before).exists():
        return 0  # the common case: no write lock taken
    moved = 0
    with transaction.atomic():
        for t in Turn.objects.select_for_update().stranded(before):
            if t.pending is None:  # JSON null
                continue
            t.release_waiter()
            moved += 1
    return moved
