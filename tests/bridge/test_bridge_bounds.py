"""The bounds of a worker's queue and of its primary's inbox (docs/bridge.md, "Limits"): refused with an error that
names the setting, before anything is written; a turn's own outcome is never refused."""

import pytest

from bridge.failures import BridgeFailure
from bridge.models import InboxItem, Member, Message, Turn
from bridge.turns import ack, prepare_ask, prepare_send, reply
from tests.bridge import test_bridge_lifecycle as lifecycle
from tests.bridge.test_bridge_lifecycle import as_worker, worker_of
from tests.bridge.test_bridge_poller import poller
from yuzu.models import AuditEvent

fake, alice = lifecycle.fake, lifecycle.alice  # the fixtures: an in-memory terminal, a primary


@pytest.mark.django_db
def test_a_full_queue_refuses_the_next_message_and_writes_nothing(fake, alice, monkeypatch):
    monkeypatch.setenv("YUZU_BRIDGE_MAX_QUEUE", "2")
    m = worker_of(fake, alice)
    prepare_send(alice, "stall", session=m.session_id, wait=False)
    prepare_send(alice, "second", session=m.session_id, wait=False)
    before = (Turn.objects.count(), Message.objects.count(), AuditEvent.objects.filter(action="bridge.send").count())
    with pytest.raises(BridgeFailure) as refused:
        prepare_send(alice, "third", session=m.session_id, wait=False)
    assert refused.value.code == "queue_full" and refused.value.status == 429 and refused.value.retryable
    assert "YUZU_BRIDGE_MAX_QUEUE=2" in refused.value.message
    assert (Turn.objects.count(), Message.objects.count(),
            AuditEvent.objects.filter(action="bridge.send").count()) == before
    p = poller()
    p.tick()  # "stall" delivered
    fake.working("%1")
    p.tick()  # picked up: no longer in the queue
    prepare_send(alice, "third", session=m.session_id, wait=False)
    assert Message.objects.filter(member=m, state__in=Message.IN_FLIGHT).count() == 2


@pytest.mark.django_db
def test_a_full_inbox_refuses_new_items_but_never_a_turn_s_own_outcome(fake, alice, monkeypatch):
    monkeypatch.setenv("YUZU_BRIDGE_MAX_INBOX", "2")
    m = worker_of(fake, alice)
    t = prepare_send(alice, "work", session=m.session_id, wait=False)
    Member.objects.filter(pk=m.pk).update(current_turn=Turn.objects.get(pk=t.turn_pk))
    w = as_worker(m)
    assert reply(w, "note 1", final=False)["mode"] == "queued"
    assert reply(w, "note 2", final=False)["mode"] == "queued"
    for refused_call in (lambda: reply(w, "note 3", final=False), lambda: prepare_ask(w, "which?"),
                         lambda: prepare_send(alice, "more work", session=m.session_id, wait=False)):
        with pytest.raises(BridgeFailure) as refused:
            refused_call()
        assert refused.value.code == "inbox_full" and refused.value.status == 429, refused.value.message
        assert "YUZU_BRIDGE_MAX_INBOX=2" in refused.value.message
    assert InboxItem.objects.count() == 2 and Turn.objects.count() == 1
    assert Turn.objects.get(pk=t.turn_pk).state == Turn.State.OPEN  # the refused ask changed nothing
    # the turn's own outcome is never refused (at most one per turn): a reply is not lost to the bound
    assert reply(w, "the result")["mode"] == "queued"
    assert InboxItem.objects.count() == 3
    ack(alice, list(InboxItem.objects.values_list("item_id", flat=True)))
    prepare_send(alice, "more work", session=m.session_id, wait=False)
