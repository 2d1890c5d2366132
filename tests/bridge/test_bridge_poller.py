"""The Injector + StatusPoller state machine (spec §5) against an in-memory terminal backend: every
rule of the table, the pickup grace, the turn-done fallback, hook precedence, delivery failures and
GONE — one poller tick at a time."""

from datetime import timedelta

import pytest
from django.utils import timezone

from bridge import workers
from bridge.identity import WORKER, Caller
from bridge.mcp_tools import _result
from bridge.models import InboxItem, Member, Message, Profile, Turn
from bridge.poller import StatusPoller
from bridge.profiles import seed_profiles
from bridge.terminal import PaneInfo, PaneNotFound, TerminalBackend, TerminalError
from bridge.turns import reply, sweep, take_outcome
from mcp.registry import ToolFailure
from yuzu.models import ApiToken, AuditEvent, RoleAssignment
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db
SOCKET = "fake-socket"
IDLE_SCREEN = "standin agent\n> "
WORKING_TITLE = "⠋ standin"


class FakeBackend(TerminalBackend):
    """Panes by id, each in a session; addressed as tmux addresses them (``%N``, or ``=session:.%N``, which names
    the pane only while it is in that session)."""

    def __init__(self):
        self.panes = {}
        self.fail_next_paste = None

    def add(self, pane_id, session="bridge-x"):
        self.panes[pane_id] = {"alive": True, "title": "✳ standin", "screen": IDLE_SCREEN, "pasted": [], "keys": [],
                               "session": session}

    def pane(self, target):
        session, _, pane_id = target.rpartition(":.")
        pane = self.panes.get(pane_id)
        if pane is None or (session and session != "=" + pane["session"]):
            raise PaneNotFound(target)
        return pane

    def start(self, name, argv, env, cwd=None, *, user=None):
        raise NotImplementedError

    def paste(self, pane_id, text, *, submit=True):
        pane = self.pane(pane_id)
        if self.fail_next_paste is not None:
            exc, self.fail_next_paste = self.fail_next_paste, None
            raise exc
        pane["pasted"].append(text)

    def send_keys(self, pane_id, *keys, literal=False):
        self.pane(pane_id)["keys"].extend(keys)

    def read_screen(self, pane_id):
        return self.pane(pane_id)["screen"]

    def read_tail(self, pane_id, lines=40, **kw):
        return self.pane(pane_id)["screen"] + "\n(tail)"

    def title(self, pane_id):
        return self.pane(pane_id)["title"]

    def alive(self, pane_id):
        try:
            return self.pane(pane_id)["alive"]
        except PaneNotFound:
            return False

    def close(self, pane_id):
        try:
            self.pane(pane_id)
        except PaneNotFound:
            return
        self.panes.pop(pane_id.rpartition(":.")[2])

    def list_panes(self):
        return [PaneInfo(p, v["session"], 1) for p, v in self.panes.items()]

    def shutdown(self):
        self.panes.clear()

    # pane states
    def idle(self, pane):
        self.panes[pane].update(title="✳ standin", screen=IDLE_SCREEN)

    def working(self, pane):
        self.panes[pane].update(title=WORKING_TITLE, screen="⠋ Working… (esc to interrupt)")

    def unknown(self, pane):
        self.panes[pane].update(title="host", screen="")

    def blocked(self, pane):
        self.panes[pane].update(title="✳ standin", screen="Do you want to make this edit?\n❯ 1. Yes\n  2. No")


@pytest.fixture
def fake(monkeypatch):
    b = FakeBackend()
    monkeypatch.setitem(workers._backends, SOCKET, b)
    return b


@pytest.fixture
def world(fake, make_user):
    seed_profiles()
    user = make_user("alice", "Operator")
    token, _ = ApiToken.mint(user, "primary")
    profile = Profile.objects.get(name="standin")

    def worker(pane="%1", **kw):
        fake.add(pane)
        return Member.objects.create(owner=user, owner_key=Principal(user=user, token=token).key, profile=profile,
                                     profile_name="standin", token=worker_token(user),
                                     socket_name=SOCKET, pane_id=pane, terminal_id="bridge-x", name="w", **kw)

    return worker


def worker_token(user):
    """Every worker has its own token (the poller stops one whose token ended: bridge.workers.stop_expired)."""
    return ApiToken.mint(user, "bridge worker", audience=ApiToken.AUDIENCE_BRIDGE,
                         expires_at=timezone.now() + timedelta(hours=24))[0]


def poller():
    return StatusPoller(socket_name=SOCKET, interval=0, grace_polls=3)


def send(member, content, wait=True):
    until = timezone.now() + timedelta(seconds=60) if wait else None
    t = Turn.objects.create(member=member, owner_key=member.owner_key, waiter_until=until, detached=not wait)
    Message.objects.create(member=member, turn=t, content=content)
    return t


def state(obj):
    obj.refresh_from_db()
    return obj.state


def test_idle_delivers_working_picks_up_idle_ends_turn(fake, world):
    m = world()
    t1, _ = send(m, "first"), send(m, "second")
    p = poller()
    p.tick()
    assert fake.panes["%1"]["pasted"] == ["first"]
    assert Member.objects.get(pk=m.pk).current_turn_id == t1.pk
    fake.working("%1")
    p.tick()  # WORKING: pickup, nothing new
    assert Message.objects.get(turn=t1).state == "picked_up" and fake.panes["%1"]["pasted"] == ["first"]
    p.tick()
    assert fake.panes["%1"]["pasted"] == ["first"]  # never while WORKING
    fake.idle("%1")
    p.tick()  # turn-done fallback with the tail; the next message waits for a fresh tick
    assert state(t1) == "turn_done"
    out = take_outcome(t1.pk)
    assert out["outcome"] == "turn_done" and "(tail)" in out["text"]
    assert fake.panes["%1"]["pasted"] == ["first"]
    p.tick()
    assert fake.panes["%1"]["pasted"] == ["first", "second"]
    assert Member.objects.get(pk=m.pk).status == "IDLE"


def test_pickup_grace_for_a_turn_faster_than_the_interval(fake, world):
    m = world()
    t1, _ = send(m, "fast"), send(m, "next")
    p = poller()
    p.tick()  # delivered; the worker worked and finished between two samples: IDLE throughout
    p.tick()
    p.tick()
    assert fake.panes["%1"]["pasted"] == ["fast"], "at most one message per turn until the pickup"
    assert Message.objects.get(turn=t1).state == "delivered"
    p.tick()  # grace reached → picked up, and IDLE → turn_done
    assert Message.objects.get(turn=t1).state == "picked_up" and state(t1) == "turn_done"
    p.tick()
    assert fake.panes["%1"]["pasted"] == ["fast", "next"]


def test_reply_before_pickup_counts_as_pickup(fake, world):
    m = world()
    t1, _ = send(m, "quick"), send(m, "then")
    p = poller()
    p.tick()
    caller = Caller(principal=None, role=WORKER, member=Member.objects.get(pk=m.pk))
    assert reply(caller, "done already")["mode"] == "resolved"
    p.tick()
    assert Message.objects.get(turn=t1).state == "picked_up"
    p.tick()
    assert fake.panes["%1"]["pasted"] == ["quick", "then"]


def test_unknown_never_delivers(fake, world):
    m = world()
    fake.unknown("%1")
    t = send(m, "hello")
    p = poller()
    for _ in range(6):
        p.tick()
    assert fake.panes["%1"]["pasted"] == [] and Message.objects.get(turn=t).state == "queued"
    assert Member.objects.get(pk=m.pk).status == "UNKNOWN"


def test_blocked_respects_the_profile(fake, world):
    m = world()
    fake.blocked("%1")
    send(m, "1")
    Profile.objects.filter(name="standin").update(blocked_injectable=False)
    p = poller()
    p.tick()
    assert Member.objects.get(pk=m.pk).status == "BLOCKED" and fake.panes["%1"]["pasted"] == []
    Profile.objects.filter(name="standin").update(blocked_injectable=True)
    p.tick()
    assert fake.panes["%1"]["pasted"] == ["1"]


def test_hook_status_is_trusted_first_but_not_across_a_delivery(fake, world):
    m = world()
    fake.unknown("%1")
    t = send(m, "via hooks")
    Member.objects.filter(pk=m.pk).update(hook_status="IDLE", hook_event="SessionStart", hook_at=timezone.now())
    p = poller()
    p.tick()
    assert fake.panes["%1"]["pasted"] == ["via hooks"]
    assert Member.objects.get(pk=m.pk).status_source == "hook"
    p.tick()  # the IDLE hook predates the delivery: ignored → UNKNOWN, no pickup, no fallback
    assert Member.objects.get(pk=m.pk).status == "UNKNOWN" and state(t) == "open"
    Member.objects.filter(pk=m.pk).update(hook_status="WORKING", hook_at=timezone.now())
    p.tick()
    assert Message.objects.get(turn=t).state == "picked_up"
    Member.objects.filter(pk=m.pk).update(hook_status="IDLE", hook_at=timezone.now() + timedelta(seconds=1))
    p.tick()
    assert state(t) == "turn_done"


def test_delivery_failure_drops_the_message_with_an_error(fake, world):
    m = world()
    t1, _ = send(m, "poison"), send(m, "fine")
    fake.fail_next_paste = TerminalError("tmux load-buffer failed")
    p = poller()
    p.tick()
    assert Message.objects.get(turn=t1).state == "failed" and state(t1) == "error"
    out = take_outcome(t1.pk)
    assert out["error"]["code"] == "delivery_failed" and out["error"]["retryable"] is True
    with pytest.raises(ToolFailure) as exc:
        _result(out)
    assert exc.value.data["code"] == "delivery_failed"
    p.tick()  # the FIFO is not blocked
    assert fake.panes["%1"]["pasted"] == ["fine"]


def test_gone_fails_the_queue_and_the_waiters(fake, world):
    m = world()
    t1 = send(m, "a")
    t2 = send(m, "b", wait=False)
    fake.panes["%1"]["alive"] = False
    poller().tick()
    m.refresh_from_db()
    assert m.status == "GONE" and m.stopped_at is not None
    assert set(Message.objects.filter(member=m).values_list("state", flat=True)) == {"failed"}
    assert state(t1) == "gone" and state(t2) == "gone"
    assert take_outcome(t1.pk)["error"]["code"] == "worker_gone"  # the live waiter
    item = InboxItem.objects.get()  # the detached turn's failure is not lost
    assert item.kind == "error" and item.payload["turnId"] == t2.turn_id


def test_late_outcome_and_stranded_pending_reach_the_inbox(fake, world):
    m = world()
    t = send(m, "x")
    assert take_outcome(t.pk, final=True)["outcome"] == "timeout"
    assert state(t) == "timeout"
    caller = Caller(principal=None, role=WORKER, member=m)
    Member.objects.filter(pk=m.pk).update(current_turn=t)
    caller.member.refresh_from_db()
    assert reply(caller, "late")["mode"] == "queued"
    assert InboxItem.objects.get().payload["text"] == "late"
    # A pending outcome whose waiter died (its deadline long past) is swept into the inbox.
    t2 = send(m, "y")
    Turn.objects.filter(pk=t2.pk).update(pending={"outcome": "reply", "text": "orphan", "turnId": t2.turn_id},
                                         waiter_until=timezone.now() - timedelta(seconds=60))
    assert sweep() == 1
    assert InboxItem.objects.filter(payload__text="orphan").exists()
    assert sweep() == 0


def test_a_pane_id_another_session_holds_now_is_not_this_worker(fake, world):
    """tmux numbers panes afresh when its server restarts: %1 may now be a newcomer's pane (another session)."""
    m = world()
    t = send(m, "for the old worker")
    fake.panes.clear()
    fake.add("%1", session="bridge-newcomer")
    poller().tick()
    m.refresh_from_db()
    assert not m.live and m.status == "GONE" and state(t.messages.get()) == "failed"
    assert fake.panes["%1"]["pasted"] == [], "the old worker's message was typed into the newcomer's pane"


def test_a_revoked_primary_s_workers_are_stopped(fake, world):
    """A primary's world is its token: once it is revoked nobody can read, answer or stop its workers, and they
    would hold their user's worker allowance for good."""
    m = world()
    t = send(m, "queued for a primary about to go")
    p = poller()
    p.tick()
    assert Member.objects.get(pk=m.pk).live
    ApiToken.objects.filter(pk=Principal.from_key(m.owner_key).token.pk).update(revoked_at=timezone.now())
    p._last_sweep = 0.0  # the sweep runs every 2 s
    p.tick()
    m.refresh_from_db()
    assert not m.live and "no longer valid" in m.stop_reason and "%1" not in fake.panes
    assert state(t.messages.get()) == "failed"
    assert AuditEvent.objects.filter(principal="system", action="bridge.stop", target_id=m.session_id,
                                     detail__contains="reason=primary_revoked owner=alice").exists()


def test_workers_of_a_primary_whose_user_lost_the_bridge_are_stopped(fake, world, make_user):
    """The same when the token stays live but its user may no longer manage workers (an administrator took the role
    away): nobody may stop those workers any more — they ran on, agents in panes, until their tokens expired."""
    m = world()
    keep = world(pane="%2")
    bob = make_user("bob", "Operator")
    bobs = Member.objects.create(owner=bob, owner_key=Principal(user=bob, token=ApiToken.mint(bob, "p")[0]).key,
                                 profile_name="standin", socket_name=SOCKET, pane_id="%3", terminal_id="bridge-y",
                                 name="b", token=worker_token(bob))
    fake.add("%3", session="bridge-y")
    p = poller()
    p.tick()
    assert Member.objects.filter(stopped_at__isnull=True).count() == 3
    RoleAssignment.objects.filter(user=m.owner).delete()
    p._last_sweep = 0.0
    p.tick()
    m.refresh_from_db()
    keep.refresh_from_db()
    assert not m.live and not keep.live and "Bridge:Execute" in m.stop_reason
    assert "%1" not in fake.panes and "%2" not in fake.panes
    assert Member.objects.get(pk=bobs.pk).live and "%3" in fake.panes  # another user's workers stay
    assert AuditEvent.objects.filter(principal="system", action="bridge.stop", target_id=m.session_id,
                                     detail__contains="reason=primary_unauthorized owner=alice").exists()
