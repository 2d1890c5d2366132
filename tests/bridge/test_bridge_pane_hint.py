"""The SubscriptionGuard reads ``X-Bridge-Pane`` as a real tmux pane writes it: ``$TMUX:$TMUX_PANE``, where tmux
sets ``$TMUX`` to ``<socket path>,<server pid>,<session index>`` (``/tmp/tmux-0/default,1234,0``) and ``$TMUX_PANE``
to the pane id (``%3``). A primary whose pane is on the bridge's private server is refused whichever way it names
that server: by its ``-L`` name, or by the socket path its own pane's ``$TMUX`` holds. Real tmux servers."""

import os
import subprocess
import uuid

import pytest

from bridge import workers
from bridge.failures import BridgeFailure
from bridge.guard import SubscriptionGuard
from bridge.identity import PRIMARY, Caller
from bridge.models import Member, Profile
from bridge.terminal import TmuxBackend
from bridge.testing.fixtures import needs_tmux
from yuzu.testing import wait_until

pytestmark = [pytest.mark.django_db, needs_tmux]

NOT_IN_TMUX = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}


def tmux(sock, *args):
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30, env=NOT_IN_TMUX)


@pytest.fixture
def servers(monkeypatch):
    """The bridge's private server (``sock``) and another one, a person's own (``own``)."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    sock, own = f"yuzu-test-hint-{tag}", f"yuzu-test-own-{tag}"
    monkeypatch.setenv("YUZU_BRIDGE_TMUX_SOCKET", sock)
    Profile.objects.create(name="sleeper", argv=["sleep", "600"], requires_api_base_url=False,
                           agent_kind=Profile.Kind.STANDIN)
    yield sock, own
    for name in (sock, own):
        TmuxBackend(name).shutdown()  # the server, and the socket file tmux leaves behind
    workers._backends.pop(sock, None)


def primary_pane(sock, tmp_path):
    """Start a shell pane on tmux server ``sock`` (as a person starts the primary there) and return what it says
    its pane is — ``$TMUX:$TMUX_PANE``, read from its own environment — with its session's name."""
    out = tmp_path / f"hint-{uuid.uuid4().hex[:6]}"
    session = f"primary-{uuid.uuid4().hex[:6]}"
    started = tmux(sock, "new-session", "-d", "-s", session,
                   f"printf '%s' \"$TMUX:$TMUX_PANE\" > {out}.tmp && mv {out}.tmp {out}; exec sleep 600")
    assert started.returncode == 0, started.stderr
    wait_until(out.exists, what="the pane to write its $TMUX")
    return out.read_text(), session


def test_a_real_panes_tmux_variables_name_its_server(servers, principal, tmp_path):
    sock, own = servers
    hint, _ = primary_pane(sock, tmp_path)
    path, pid, index_and_pane = hint.split(",")
    assert path.endswith(f"/{sock}") and pid.isdigit() and index_and_pane.split(":")[1].startswith("%"), hint
    alice = Caller(principal("alice"), PRIMARY)

    with pytest.raises(BridgeFailure) as refused:
        workers.spawn(alice, "sleeper", primary_pane=hint)
    assert refused.value.code == "subscription_boundary" and sock in refused.value.message
    assert not Member.objects.exists()

    elsewhere, _ = primary_pane(own, tmp_path)  # the primary in a person's own tmux server: nothing to refuse
    assert workers.spawn(alice, "sleeper", primary_pane=elsewhere).live


def test_stop_never_closes_the_primarys_own_pane(servers, principal, tmp_path):
    sock, _ = servers
    hint, session = primary_pane(sock, tmp_path)
    pane = hint.rpartition(":")[2]
    alice = Caller(principal("alice"), PRIMARY)
    member = Member.objects.create(name="w", profile_name="sleeper", socket_name=sock, terminal_id=session,
                                   pane_id=pane, owner=alice.principal.user, owner_key=alice.world_key)
    with pytest.raises(BridgeFailure) as refused:
        workers.stop(alice, member.session_id, primary_pane=hint)
    assert refused.value.code == "subscription_boundary"
    assert workers.backend(sock).alive(member.pane), "the bridge closed the primary's own pane"
    SubscriptionGuard.check_primary_pane(f"{sock}:%99", sock, member)  # another pane of that server: stoppable
