"""A worker's pane is its own, whatever tmux numbers it (a probe: one primary stopped, read and typed into
another primary's worker), and a primary cannot start workers without end. Real tmux on a private socket.

tmux numbers panes afresh whenever its server starts again (a crash, `kill-server` — docs/bridge.md's own
advice —, the last session closing), so a pane id (`%0`) a gone worker had may name a newcomer's pane. The
bridge addresses each pane inside its worker's own session (bridge.terminal.pane_target)."""

import os
import subprocess
import tempfile
import uuid

import pytest

from bridge import workers
from bridge.failures import BridgeFailure
from bridge.identity import PRIMARY, Caller
from bridge.models import Member, Profile
from bridge.poller import StatusPoller
from bridge.terminal import PaneNotFound
from bridge.testing.fixtures import needs_tmux
from yuzu.models import AuditEvent
from yuzu.testing import wait_until

pytestmark = [pytest.mark.django_db, needs_tmux]


@pytest.fixture
def sock(monkeypatch):
    name = f"yuzu-test-ids-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("YUZU_BRIDGE_TMUX_SOCKET", name)
    Profile.objects.create(name="sleeper", argv=["sleep", "600"], requires_api_base_url=False,
                           agent_kind=Profile.Kind.STANDIN)
    yield name
    workers.backend(name).shutdown()
    workers._backends.pop(name, None)


def server_gone(name):
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
    return subprocess.run(["tmux", "-L", name, "ls"], capture_output=True, env=env, timeout=10).returncode != 0


def test_stopping_a_stopped_worker_again_leaves_the_pane_that_took_its_id(sock, principal):
    alice, bob = Caller(principal("alice"), PRIMARY), Caller(principal("bob"), PRIMARY)
    old = workers.spawn(alice, "sleeper")
    workers.stop(alice, old.session_id)
    wait_until(lambda: server_gone(sock), what="tmux's server to exit with its last session")
    new = workers.spawn(bob, "sleeper")
    assert new.pane_id == old.pane_id, "the premise: a new server hands the same pane id out again"

    again = workers.stop(alice, old.session_id)  # idempotent: wasRunning false, and nothing else
    assert again["wasRunning"] is False
    assert workers.backend(sock).alive(new.pane), "alice's stop of her stopped worker closed bob's pane"
    assert Member.objects.get(pk=new.pk).live


def test_a_live_worker_whose_server_died_is_gone_not_the_newcomer(sock, principal):
    alice, bob = Caller(principal("alice"), PRIMARY), Caller(principal("bob"), PRIMARY)
    old = workers.spawn(alice, "sleeper")
    workers.backend(sock).shutdown()  # what `tmux -L <socket> kill-server` does
    new = workers.spawn(bob, "sleeper")
    assert new.pane_id == old.pane_id

    b = workers.backend(sock)
    for read in (b.read_screen, b.title, lambda target: b.paste(target, "typed into the wrong worker"),
                 lambda target: b.send_keys(target, "Enter")):
        with pytest.raises(PaneNotFound):
            read(old.pane)
    assert workers.observe(old)[0].value == "GONE"

    StatusPoller(socket_name=sock, interval=0).tick()  # the poller's own view
    old.refresh_from_db()
    assert not old.live and old.stop_reason == "its pane exited"
    assert Member.objects.get(pk=new.pk).live and b.alive(new.pane)


def test_a_primary_has_at_most_max_workers_live(sock, principal, monkeypatch):
    monkeypatch.setenv("YUZU_BRIDGE_MAX_WORKERS", "2")
    alice, bob = Caller(principal("alice"), PRIMARY), Caller(principal("bob"), PRIMARY)
    first, _ = workers.spawn(alice, "sleeper"), workers.spawn(alice, "sleeper")
    panes = len(workers.backend(sock).list_panes())
    with pytest.raises(BridgeFailure) as refused:
        workers.spawn(alice, "sleeper", cid="c-limit")
    assert refused.value.code == "worker_limit" and refused.value.status == 429
    assert "YUZU_BRIDGE_MAX_WORKERS=2" in refused.value.message and "bridge_stop" in refused.value.message
    assert Member.objects.filter(owner_key=alice.world_key).count() == 2  # no row, no token, no pane
    assert len(workers.backend(sock).list_panes()) == panes
    assert AuditEvent.objects.filter(action="bridge.spawn", result="denied", correlation_id="c-limit",
                                     detail__contains="reason=worker_limit").exists()

    with pytest.raises(BridgeFailure, match="worker_limit|the most one user may have"):
        workers.spawn(Caller(principal("alice"), PRIMARY), "sleeper")  # another of alice's tokens: the same user
    workers.spawn(bob, "sleeper")  # per user
    workers.stop(alice, first.session_id)
    workers.spawn(alice, "sleeper")  # room again


def test_a_worker_stopped_while_its_pane_starts_leaves_no_pane_behind(sock, principal, monkeypatch):
    """The worker's row exists (bridge_list shows it) before its pane does. Stopped in that moment — by its primary,
    or by the poller's sweep of a spawn that never completed — it used to get its pane all the same: a pane nobody
    polled or could stop, outside the user's YUZU_BRIDGE_MAX_WORKERS (stopped rows do not count), so a primary
    stopping each worker as it started could run any number of them."""
    alice = Caller(principal("alice"), PRIMARY)
    b = workers.backend(sock)
    real_start = b.start
    started = []

    def start_while_stopped(name, argv, env, cwd=None, **kw):
        (m,) = Member.objects.live().filter(owner_key=alice.world_key)
        assert workers.stop(alice, m.session_id)["wasRunning"] is True  # the stop lands first …
        info = real_start(name, argv, env, cwd, **kw)  # … then tmux answers
        started.append(info)
        return info

    monkeypatch.setattr(b, "start", start_while_stopped)
    with pytest.raises(BridgeFailure) as refused:
        workers.spawn(alice, "sleeper")
    assert refused.value.code == "worker_gone"
    (info,) = started
    assert not b.alive(info.target), "the stopped worker's pane runs on"
    m = Member.objects.get(owner_key=alice.world_key)
    assert not m.live and m.pane_id == info.pane_id  # the row says which pane it had
    assert AuditEvent.objects.filter(action="bridge.spawn", result="failure", target_id=m.session_id).exists()


def test_a_spawn_whose_env_file_cannot_be_written_fails_cleanly(sock, principal, monkeypatch):
    """A full or read-only temporary directory: the spawn is spawn_failed (retryable), its row stopped and its token
    revoked at once — not an internal error leaving a live row without a pane for the poller to find a minute later."""
    alice = Caller(principal("alice"), PRIMARY)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", full)
    with pytest.raises(BridgeFailure) as refused:
        workers.spawn(alice, "sleeper")
    assert refused.value.code == "spawn_failed" and "No space left" in refused.value.message
    m = Member.objects.get(owner_key=alice.world_key)
    assert not m.live and m.token.revoked_at is not None


def test_a_pane_recorded_while_the_stop_runs_is_closed_by_that_stop(sock, principal, monkeypatch):
    """The other order of the same race: the stop read the worker before its pane was recorded, and the spawn recorded
    it (the worker still live) before the stop marked it gone. The stop closes that pane too."""
    alice = Caller(principal("alice"), PRIMARY)
    real_pane_started = Member.pane_started

    def stopped_meanwhile(self, pane_id, terminal_id):
        read_by_the_stop = Member.objects.get(pk=self.pk)  # bridge_stop's lookup: no pane yet
        live = real_pane_started(self, pane_id, terminal_id)
        workers.terminate(read_by_the_stop, "stopped by the primary")  # … and that stop goes on
        return live

    monkeypatch.setattr(Member, "pane_started", stopped_meanwhile)
    m = workers.spawn(alice, "sleeper")
    assert not Member.objects.get(pk=m.pk).live
    assert not workers.backend(sock).alive(m.pane), "the stopped worker's pane runs on"
