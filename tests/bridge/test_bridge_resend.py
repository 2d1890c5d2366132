"""Re-sends on the bridge (issue 14): a 2026-07-28 client re-sends a call whose response stream broke, with a new
request id and the same arguments. Through the services the tools call (bridge/turns.py), with the waits' own
drop hooks (what bridge/rendezvous.py runs when the client goes away): nothing reaches a pane or the primary
twice. The live counterparts (a real dropped socket, daphne, tmux) are in tests/e2e/test_mcp_modern_clients.py."""

import threading
from contextlib import contextmanager

import pytest

from bridge import turns, waiters
from bridge.identity import PRIMARY, WORKER, Caller
from bridge.models import Member, Message, Turn
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_leases(monkeypatch):
    monkeypatch.setattr(waiters, "LEASE_SECONDS", 0.5)  # a wait that nobody renews is dead within half a second
    waiters.leases().clear()  # turn ids come round again with each rolled-back test
    yield
    waiters.leases().clear()


@contextmanager
def waiting(prepared):
    """The prepared call's wait is alive: it renews its lease, as rendezvous.wait_turn does."""
    stop = threading.Event()

    def beat():
        while not stop.is_set():
            waiters.leases().hold(prepared.turn_pk, prepared.lease)
            stop.wait(0.1)

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


@pytest.fixture
def world(principal):
    primary = Caller(principal("alice"), PRIMARY)
    worker_principal = principal("alice-worker")
    member = Member.objects.create(name="w", profile_name="standin", socket_name="s", owner=primary.principal.user,
                                   owner_key=primary.world_key, token=worker_principal.token)
    return primary, Caller(worker_principal, WORKER, member), member


def send(caller, content, member, **kw):
    return turns.prepare_send(caller, content, session=member.session_id, timeout_ms=1000, **kw)


def test_a_new_turn_resent_after_its_wait_dropped_is_the_same_turn(world):
    primary, _, member = world
    first = send(primary, "run the tests", member)
    turns.release_waiter(first.turn_pk)  # the client went away mid-wait (rendezvous.wait_turn)
    again = send(primary, "run the tests", member)
    assert again.turn_pk == first.turn_pk and again.outcome is None  # waits again on the same turn
    assert Message.objects.filter(member=member).count() == 1  # pasted once
    assert Turn.objects.get(pk=first.turn_pk).waiter_until is not None
    assert AuditEvent.objects.filter(action="bridge.send", detail__startswith=f"resend turn={first.turn_id}").exists()
    # the re-send was answered: the same text again is a new turn, on purpose
    t = Turn.objects.get(pk=first.turn_pk)
    t.end(Turn.State.REPLIED, {"outcome": "reply", "text": "ok", "turnId": t.turn_id})
    assert turns.take_outcome(first.turn_pk)["text"] == "ok"
    third = send(primary, "run the tests", member)
    assert third.turn_pk != first.turn_pk and Message.objects.filter(member=member).count() == 2


def test_a_resent_message_whose_turn_ended_gets_the_outcome(world):
    primary, _, member = world
    first = send(primary, "summarise", member)
    turns.release_waiter(first.turn_pk)
    t = Turn.objects.get(pk=first.turn_pk)
    t.end(Turn.State.REPLIED, {"outcome": "reply", "text": "done", "turnId": t.turn_id})
    again = send(primary, "summarise", member)
    assert again.turn_pk == first.turn_pk and again.outcome["text"] == "done"
    assert Message.objects.filter(member=member).count() == 1


def test_a_new_turn_whose_waiter_died_with_its_process_is_found_by_its_resend(world):
    """A SIGKILLed server process records no drop (release_waiter never runs): the turn keeps a registered waiter.
    Its lease is what tells: while it lives the same text is a deliberate second message; once it has run out
    (here: given back, as an expired one reads) the re-send is the same turn, pasted once (issue 22)."""
    primary, _, member = world
    first = send(primary, "deploy", member)
    assert first.lease and waiters.leases().alive(first.turn_pk)
    waiters.leases().release(first.turn_pk, first.lease)  # the process died: nobody renews the lease
    t = Turn.objects.get(pk=first.turn_pk)
    assert t.waiter_until is not None and t.dropped_at is None  # no drop was recorded
    again = send(primary, "deploy", member)
    assert again.turn_pk == first.turn_pk and again.outcome is None
    assert Message.objects.filter(member=member).count() == 1
    # the worker's reply, kept for the dead waiter, is the re-send's answer — and not swept into the inbox too
    waiters.leases().release(again.turn_pk, again.lease)
    t = Turn.objects.get(pk=first.turn_pk)
    t.end(Turn.State.REPLIED, {"outcome": "reply", "text": "deployed", "turnId": t.turn_id})
    assert Turn.objects.get(pk=first.turn_pk).pending is not None
    last = send(primary, "deploy", member)
    assert last.turn_pk == first.turn_pk and last.outcome["text"] == "deployed"
    assert Turn.objects.get(pk=first.turn_pk).pending is None and turns.sweep(grace=0) == 0


def test_a_new_turn_whose_waiter_lives_is_not_taken_by_the_same_text(world):
    primary, _, member = world
    first = send(primary, "deploy", member)
    with waiting(first):  # the re-send watches the lease for a lease's length: renewed, so the wait is alive
        other = send(primary, "deploy", member)
    assert other.turn_pk != first.turn_pk and Message.objects.filter(member=member).count() == 2


def test_a_resend_right_after_its_waiters_process_died_waits_for_the_lease_to_run_out(world):
    """The lease was renewed just before the process died: the re-send watches it run out, then finds the turn."""
    primary, _, member = world
    first = send(primary, "deploy", member)  # nobody renews it: it runs out within half a second
    again = send(primary, "deploy", member)
    assert again.turn_pk == first.turn_pk and Message.objects.filter(member=member).count() == 1


def test_only_the_same_text_after_a_drop_counts_as_a_resend(world):
    primary, _, member = world
    first = send(primary, "one", member)
    with waiting(first):
        other = send(primary, "one", member)  # no drop, its wait alive: a deliberate second message
    assert other.turn_pk != first.turn_pk
    turns.release_waiter(other.turn_pk)
    different = send(primary, "two", member)
    assert different.turn_pk not in (first.turn_pk, other.turn_pk)
    assert Message.objects.filter(member=member).count() == 3


def test_an_ask_resent_after_it_was_answered_gets_the_answer_once(world):
    primary, worker, member = world
    first = send(primary, "fix it", member)
    Member.objects.filter(pk=member.pk).update(current_turn=first.turn_pk)  # delivered: the worker's turn
    pk, turn_id, seq = turns.prepare_ask(worker, "which branch?")
    assert pk == first.turn_pk and seq == 1
    turns.ask_dropped(pk, seq)  # the worker's client went away mid-wait (rendezvous.wait_answer)
    answered = turns.prepare_send(primary, "main", turn_id=turn_id, timeout_ms=1000)
    assert answered.turn_pk == pk
    again = turns.prepare_ask(worker, "which branch?")
    assert again == (pk, turn_id, 1)  # not asked a second time
    assert turns.check_answer(pk, 1) == {"answer": "main", "turnId": turn_id}
    t = Turn.objects.get(pk=pk)
    assert t.ask_seq == 1 and t.answer_seq == 1
    assert AuditEvent.objects.filter(action="bridge.ask", detail=f"turn={turn_id} resend answered").exists()
    # that answer was collected: asking the same again now is a new question, on purpose
    _, _, seq2 = turns.prepare_ask(worker, "which branch?")
    assert seq2 == 2


def test_an_answered_ask_without_a_drop_is_a_new_question(world):
    primary, worker, member = world
    first = send(primary, "fix it", member)
    Member.objects.filter(pk=member.pk).update(current_turn=first.turn_pk)
    pk, turn_id, seq = turns.prepare_ask(worker, "continue?")
    turns.prepare_send(primary, "yes", turn_id=turn_id, timeout_ms=1000)
    assert turns.prepare_ask(worker, "continue?")[2] == 2
