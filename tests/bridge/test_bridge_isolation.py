"""The IsolationGuard (bridge/guard.py) and ``Profile.run_as``: a worker that runs a real agent (Claude Code runs
shell commands unattended) must not run as the server's own OS user — that user reads var/ (the database, the KEK
directory), /proc/<server pid>/environ and can run manage.py, so any Operator could make themselves everything.

A spawn the guard refuses creates nothing (no worker row, no token, no pane). With ``run_as`` the launcher drops
to that user before it exec's the worker: a real spawn (when this process is root, as on the dev machine and in CI)
shows the pane's process running with that user's uid and unable to read the server's files. Real tmux panes."""

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError

from bridge import guard, workers
from bridge.failures import BridgeFailure
from bridge.identity import PRIMARY, Caller
from bridge.models import Member, Profile
from bridge.terminal import TmuxBackend
from bridge.testing.fixtures import needs_tmux
from yuzu.models import ApiToken, AuditEvent
from yuzu.testing import wait_until

pytestmark = [pytest.mark.django_db, needs_tmux]

REPO = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another OS user needs this process to be "
                                                          "root (useradd, setuid)")


@pytest.fixture
def sock(monkeypatch):
    name = f"yuzu-test-iso-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("YUZU_BRIDGE_TMUX_SOCKET", name)
    monkeypatch.delenv("YUZU_BRIDGE_SAME_USER_WORKERS", raising=False)
    yield name
    TmuxBackend(name).shutdown()
    workers._backends.pop(name, None)


def real_agent(name="agent", **kw):
    """A profile of a real agent kind (here it runs ``sleep``; the guard judges the kind, not the program)."""
    return Profile.objects.create(name=name, agent_kind=Profile.Kind.CLAUDE, argv=["sleep", "600"],
                                  env={"ANTHROPIC_BASE_URL": "https://gateway.invalid"}, **kw)


def assert_nothing_created(sock):
    assert not Member.objects.exists()
    assert not ApiToken.objects.filter(audience=ApiToken.AUDIENCE_BRIDGE).exists()
    assert TmuxBackend(sock).list_panes() == []


def test_a_real_agent_as_the_servers_own_user_is_refused_before_anything_exists(sock, principal):
    real_agent()
    alice = Caller(principal("alice"), PRIMARY)
    with pytest.raises(BridgeFailure) as refused:
        workers.spawn(alice, "agent")
    assert refused.value.code == "isolation_boundary" and refused.value.status == 403
    assert "run_as" in refused.value.message and "YUZU_BRIDGE_SAME_USER_WORKERS" in refused.value.message
    assert_nothing_created(sock)
    assert AuditEvent.objects.filter(action="bridge.spawn", result="denied",
                                     detail="reason=isolation_boundary").exists()


def test_a_run_as_naming_the_servers_own_user_is_the_same_user(sock, principal):
    real_agent(run_as=pwd.getpwuid(os.getuid()).pw_name)
    with pytest.raises(BridgeFailure) as refused:
        workers.spawn(Caller(principal("alice"), PRIMARY), "agent")
    assert refused.value.code == "isolation_boundary"
    assert_nothing_created(sock)


def test_the_standin_is_exempt_and_an_installation_may_opt_in(sock, principal, monkeypatch):
    alice = Caller(principal("alice"), PRIMARY)
    Profile.objects.create(name="sleeper", agent_kind=Profile.Kind.STANDIN, requires_api_base_url=False,
                           argv=["sleep", "600"])
    assert workers.spawn(alice, "sleeper").live  # calls no model, runs no commands: as the server's user

    real_agent()
    monkeypatch.setenv("YUZU_BRIDGE_SAME_USER_WORKERS", "0")
    with pytest.raises(BridgeFailure):
        workers.spawn(alice, "agent")
    monkeypatch.setenv("YUZU_BRIDGE_SAME_USER_WORKERS", "1")  # a single-person workstation, said explicitly
    assert workers.spawn(alice, "agent").live


def test_run_as_naming_no_user_is_refused_before_anything_exists(sock, principal):
    real_agent(run_as=f"nobody-{uuid.uuid4().hex[:8]}")
    with pytest.raises(BridgeFailure) as refused:
        workers.spawn(Caller(principal("alice"), PRIMARY), "agent")
    assert refused.value.code == "isolation_boundary" and "no OS user" in refused.value.message
    assert "useradd" in refused.value.message
    assert_nothing_created(sock)


def test_run_as_needs_a_server_running_as_root(sock, principal, monkeypatch):
    real_agent(run_as="nobody")
    if os.geteuid() == 0:  # the only fake: this process's uid, as a server started by an ordinary user has it
        monkeypatch.setattr(guard, "server_euid", lambda: 1000)
    with pytest.raises(BridgeFailure) as refused:
        workers.spawn(Caller(principal("alice"), PRIMARY), "agent")
    assert refused.value.code == "isolation_boundary" and "root" in refused.value.message
    assert_nothing_created(sock)


def test_run_as_is_a_user_name(db):
    p = Profile(name="x", argv=["true"], run_as="bad name;rm")
    with pytest.raises(ValidationError):
        p.full_clean()


# -- a real drop to another user ------------------------------------------------------------------------------------


@pytest.fixture
def os_user(sock):
    """A fresh OS user with a workspace it owns (its home); removed afterwards, once the panes that ran as it are
    closed (the tmux server shut down)."""
    name = f"yzw{uuid.uuid4().hex[:9]}"
    home = Path(tempfile.mkdtemp(prefix="yuzu-iso-"))
    subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh", name],
                   check=True, capture_output=True, timeout=30)
    pw = pwd.getpwnam(name)
    os.chown(home, pw.pw_uid, pw.pw_gid)
    yield pw
    TmuxBackend(sock).shutdown()
    wait_until(lambda: subprocess.run(["userdel", name], capture_output=True, timeout=30).returncode in (0, 6),
               what=f"userdel {name} (its processes gone)")
    shutil.rmtree(home, ignore_errors=True)


def python_for(pw):
    """An interpreter that user may run (this one may live under root's private home)."""
    for exe in (sys.executable, "/usr/bin/python3"):
        try:
            ok = subprocess.run([exe, "-c", "import termios"], user=pw.pw_uid, group=pw.pw_gid,
                                capture_output=True, cwd="/", timeout=30)
        except PermissionError:
            continue
        if ok.returncode == 0:
            return exe
    pytest.skip(f"no Python interpreter user {pw.pw_name} may run")


def pane_pid(sock, member):
    return next(p.pid for p in TmuxBackend(sock).list_panes() if p.pane_id == member.pane_id)


@needs_root
def test_a_worker_run_as_another_user_runs_as_it_and_cannot_read_the_servers_files(sock, principal, os_user):
    pw, alice = os_user, Caller(principal("alice"), PRIMARY)
    Profile.objects.create(name="standin-iso", agent_kind=Profile.Kind.STANDIN, requires_api_base_url=False,
                           argv=[python_for(pw), "-m", "bridge.testing.standin"], env={"PYTHONPATH": str(REPO)},
                           run_as=pw.pw_name, cwd=pw.pw_dir)
    member = workers.spawn(alice, "standin-iso")
    b = workers.backend(sock)
    wait_until(lambda: "standin" in b.title(member.pane), what="the stand-in to draw its prompt as that user")
    pid = pane_pid(sock, member)
    status = Path(f"/proc/{pid}/status").read_text()
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    assert uids == [str(pw.pw_uid)] * 4, status  # real, effective, saved, filesystem
    assert os.readlink(f"/proc/{pid}/cwd") == pw.pw_dir

    # What that worker could run: a shell as the same user, in the same way, trying the server's secrets.
    out = Path(pw.pw_dir) / "probe.out"
    var = Path(settings.VAR_DIR)
    (var / "isolation-probe").write_text("server-only")
    os.chmod(var / "isolation-probe", 0o600)
    try:
        probe = ('id -u; cat "$1" 2>/dev/null && echo READ-VAR; cat "$2" 2>/dev/null | tr "\\0" "\\n" | '
                 'grep -q . && echo READ-ENVIRON; echo "HOME=$HOME"')
        Profile.objects.create(name="probe", agent_kind=Profile.Kind.STANDIN, requires_api_base_url=False,
                               argv=["sh", "-c", f"({probe}) > {out}.tmp; mv {out}.tmp {out}; exec sleep 600", "sh",
                                     str(var / "isolation-probe"), f"/proc/{os.getpid()}/environ"],
                               run_as=pw.pw_name, cwd=pw.pw_dir)
        workers.spawn(alice, "probe")
        wait_until(out.exists, what="the probe to write what it could read")
        said = out.read_text().split()
        assert said == [str(pw.pw_uid), f"HOME={pw.pw_dir}"], said
    finally:
        (var / "isolation-probe").unlink()


@needs_root
def test_a_cwd_the_user_may_not_enter_is_refused_before_anything_exists(sock, principal, os_user):
    private = Path(tempfile.mkdtemp(prefix="yuzu-iso-private-"))  # 0700, root's
    try:
        Profile.objects.create(name="sleeper", agent_kind=Profile.Kind.STANDIN, requires_api_base_url=False,
                               argv=["sleep", "600"], run_as=os_user.pw_name, cwd=str(private))
        with pytest.raises(BridgeFailure) as refused:
            workers.spawn(Caller(principal("alice"), PRIMARY), "sleeper")
        assert refused.value.code == "isolation_boundary" and str(private) in refused.value.message
        assert_nothing_created(sock)
    finally:
        private.rmdir()
