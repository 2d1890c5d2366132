"""A worker's lifecycle against its tokens (docs/bridge.md, "Who owns a worker, and for how long") — the services
one at a time against the in-memory terminal of tests/bridge/test_bridge_poller.py (the real-tmux
twins are in tests/e2e/test_bridge_lifecycle.py)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from bridge import workers
from bridge.identity import PRIMARY, WORKER, Caller, identify
from bridge.models import InboxItem, Member, Turn
from bridge.profiles import seed_profiles
from bridge.turns import prepare_send
from tests.bridge.test_bridge_poller import SOCKET, FakeBackend, poller
from tests.support.races import at_once
from yuzu.models import ApiToken, AuditEvent
from yuzu.rbac import Principal


@pytest.fixture
def fake(monkeypatch):
    b = FakeBackend()
    monkeypatch.setitem(workers._backends, SOCKET, b)
    return b


@pytest.fixture
def alice(make_user):
    seed_profiles()
    user = make_user("alice", "Operator")
    token, _ = ApiToken.mint(user, "primary")
    return Caller(Principal(user=user, token=token), PRIMARY)


def worker_of(fake, caller, pane="%1"):
    user = caller.principal.user
    m = Member(owner=user, owner_key=caller.world_key, profile_name="standin", socket_name=SOCKET, pane_id=pane,
               terminal_id=f"bridge-{pane[1:]}", name="w")
    m.token = ApiToken.mint(user, f"bridge worker {m.session_id}", audience=ApiToken.AUDIENCE_BRIDGE,
                            expires_at=timezone.now() + timedelta(hours=24))[0]
    m.save()
    fake.add(pane, session=m.terminal_id)
    return m


def as_worker(m):
    m = Member.objects.get(pk=m.pk)
    return Caller(Principal(user=m.owner, token=m.token), WORKER, m)


def rotate(token):
    successor, _ = ApiToken.mint(token.owner, token.name)
    successor.rotated_from = token
    successor.save(update_fields=["rotated_from"])
    return successor


def key_of(token):
    return Principal.key_for(token.owner_id, token.pk)


# -- rotation ------------------------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_successor_s_first_call_takes_the_world_over(fake, alice):
    m = worker_of(fake, alice)
    t = prepare_send(alice, "reply:x", session=m.session_id, wait=False)
    InboxItem.deliver(alice.world_key, {"outcome": "note", "text": "unread"})
    InboxItem.objects.create(recipient_key=alice.world_key, kind="note", payload={}, acked_at=timezone.now())
    successor = rotate(alice.principal.token)
    caller = identify(Principal(user=alice.principal.user, token=successor))
    assert caller.world_key == key_of(successor)
    assert Member.objects.get(pk=m.pk).owner_key == key_of(successor)
    assert Turn.objects.get(pk=t.turn_pk).owner_key == key_of(successor)
    assert InboxItem.objects.get(payload__text="unread").recipient_key == key_of(successor)
    assert InboxItem.objects.filter(recipient_key=alice.world_key).count() == 1  # the acknowledged one stays
    assert AuditEvent.objects.filter(action="bridge.handover", target_id=m.session_id,
                                     detail__contains=f"from={alice.principal.token.pk} to={successor.pk}").exists()
    # the predecessor (live for its overlap) sees nothing; a worker it spawns meanwhile is its own until the
    # successor's next call (the poller leaves a live primary's workers alone)
    assert not Member.objects.filter(owner_key=alice.world_key).exists()
    late = worker_of(fake, alice, "%2")
    poller().tick()
    assert Member.objects.get(pk=late.pk).owner_key == alice.world_key and Member.objects.get(pk=late.pk).live
    identify(Principal(user=alice.principal.user, token=successor))
    assert Member.objects.get(pk=late.pk).owner_key == key_of(successor) and Member.objects.get(pk=late.pk).live


@pytest.mark.django_db
def test_a_retired_predecessor_s_workers_go_to_the_newest_live_successor(fake, alice):
    m = worker_of(fake, alice)
    second = rotate(alice.principal.token)
    third = rotate(second)
    ApiToken.objects.filter(pk__in=[alice.principal.token.pk, second.pk]).update(revoked_at=timezone.now())
    poller().tick()
    m.refresh_from_db()
    assert m.live and m.owner_key == key_of(third), m.stop_reason
    assert "%1" in fake.panes


@pytest.mark.django_db
def test_with_no_live_successor_the_workers_are_stopped(fake, alice):
    m = worker_of(fake, alice)
    second = rotate(alice.principal.token)
    ApiToken.objects.filter(pk__in=[alice.principal.token.pk, second.pk]).update(revoked_at=timezone.now())
    poller().tick()
    m.refresh_from_db()
    assert not m.live and m.owner_key == alice.world_key and "%1" not in fake.panes
    assert AuditEvent.objects.filter(action="bridge.stop", target_id=m.session_id,
                                     detail__contains="reason=primary_revoked").count() == 1


# -- a worker's own token ------------------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("end", ["expired", "revoked", "deleted"])
def test_a_worker_whose_token_ended_is_stopped(fake, alice, end):
    m = worker_of(fake, alice)
    t = prepare_send(alice, "stall", session=m.session_id, wait=False)
    if end == "expired":
        ApiToken.objects.filter(pk=m.token_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    elif end == "revoked":
        ApiToken.objects.filter(pk=m.token_id).update(revoked_at=timezone.now())
    else:
        ApiToken.objects.filter(pk=m.token_id).delete()
    poller().tick()
    m.refresh_from_db()
    assert not m.live and "%1" not in fake.panes
    reason = {"expired": "worker_token_expired", "revoked": "worker_token_revoked", "deleted": "worker_token_revoked"}
    assert ("expired" if end == "expired" else "revoked") in m.stop_reason
    assert Turn.objects.get(pk=t.turn_pk).state == Turn.State.GONE
    assert InboxItem.objects.get().payload["error"]["code"] == "worker_gone"
    assert AuditEvent.objects.filter(principal="system", action="bridge.stop", target_id=m.session_id,
                                     detail__contains=f"reason={reason[end]}").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("sweep", ["expiry", "revoked_primary"])
def test_a_stop_racing_the_sweep_is_reported_once(fake, alice, sweep):
    """Whoever stops the worker says so; the other finds it stopped (wasRunning false, no second audit row)."""
    for n in range(4):
        m = worker_of(fake, alice, f"%{n + 1}")
        if sweep == "expiry":
            ApiToken.objects.filter(pk=m.token_id).update(expires_at=timezone.now() - timedelta(seconds=1))
            run = lambda: workers.stop_expired(SOCKET)  # noqa: E731
        else:
            ApiToken.objects.filter(pk=alice.principal.token.pk).update(revoked_at=timezone.now())
            run = lambda: workers.stop_orphans(SOCKET)  # noqa: E731
        by_primary, by_sweep = at_once(lambda sid=m.session_id: workers.stop(alice, sid), run)
        assert by_primary[0] == "ok" and by_sweep[0] == "ok", (by_primary, by_sweep)
        swept = AuditEvent.objects.filter(principal="system", action="bridge.stop", target_id=m.session_id).count()
        assert by_primary[1]["wasRunning"] + swept == 1, (by_primary, swept)
        assert AuditEvent.objects.get(action="bridge.stop", target_id=m.session_id, principal="alice").detail \
            .endswith(f"was_running={by_primary[1]['wasRunning']}")
        ApiToken.objects.filter(pk=alice.principal.token.pk).update(revoked_at=None)


# -- history -------------------------------------------------------------------------------------------------------

def _history(fake, alice):
    """Three workers with a turn and a message each: one stopped 31 days ago, one 29 days ago, one live; inbox items
    acknowledged 31 and 29 days ago, and one unread for 90 days."""
    now = timezone.now()
    old, recent, live = (worker_of(fake, alice, pane) for pane in ("%1", "%2", "%3"))
    for m in (old, recent, live):
        prepare_send(alice, "reply:x", session=m.session_id, wait=False)
    Member.objects.filter(pk=old.pk).update(stopped_at=now - timedelta(days=31))
    Member.objects.filter(pk=recent.pk).update(stopped_at=now - timedelta(days=29))
    for text, acked in (("old acked", now - timedelta(days=31)), ("recent acked", now - timedelta(days=29)),
                        ("old unread", None)):
        InboxItem.objects.create(recipient_key=alice.world_key, kind="note", payload={"text": text}, acked_at=acked)
    InboxItem.objects.filter(payload__text="old unread").update(created_at=now - timedelta(days=90))
    return old, recent, live


@pytest.mark.django_db
def test_history_past_its_days_goes_and_nothing_live_or_unread_does(fake, alice, monkeypatch):
    monkeypatch.setattr(workers, "_REAP_BATCH", 1)  # a backlog goes in batches, each its own transaction
    old, recent, live = _history(fake, alice)
    assert workers.reap_history() == {"Member": 1, "Turn": 1, "Message": 1, "InboxItem": 1}
    assert set(Member.objects.values_list("pk", flat=True)) == {recent.pk, live.pk}
    assert not Turn.objects.filter(member_id=old.pk).exists()
    assert Turn.objects.filter(member__in=[recent, live]).count() == 2
    assert sorted(InboxItem.objects.values_list("payload__text", flat=True)) == ["old unread", "recent acked"]
    assert workers.reap_history() == {}


@pytest.mark.django_db
def test_the_poller_reaps_the_history_at_start_and_zero_days_keeps_it(fake, alice, monkeypatch):
    monkeypatch.setenv("YUZU_BRIDGE_HISTORY_DAYS", "0")
    old, _, _ = _history(fake, alice)
    poller().tick()
    assert Member.objects.filter(pk=old.pk).exists() and InboxItem.objects.count() == 3
    monkeypatch.setenv("YUZU_BRIDGE_HISTORY_DAYS", "30")
    p = poller()
    p.tick()
    assert not Member.objects.filter(pk=old.pk).exists() and InboxItem.objects.count() == 2
    InboxItem.objects.filter(payload__text="recent acked").update(acked_at=timezone.now() - timedelta(days=40))
    p.tick()  # then hourly, not on every tick
    assert InboxItem.objects.count() == 2
