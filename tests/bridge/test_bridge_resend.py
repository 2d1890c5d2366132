"""Re-sends on the bridge (issue 14): a 2026-07-28 client re-sends a call whose response stream broke, with a new
request id and the same arguments. Through the services the tools call (bridge/turns.py), with the waits' own
drop hooks (what bridge/rendezvous.py runs when the client goes away): nothing reaches a pane or the primary
twice. The live counterparts (a real dropped socket, daphne, tmux) are in tests/e2e/test_mcp_modern_clients.py."""

import pytest

from bridge import turns
from bridge.identity import PRIMARY, WORKER, Caller
from bridge.models import Member, Message, Turn
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db


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


def test_only_the_same_text_after_a_drop_counts_as_a_resend(world):
    primary, _, member = world
    first = send(primary, "one", member)
    other = send(primary, "one", member)  # no drop: a deliberate second message
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
