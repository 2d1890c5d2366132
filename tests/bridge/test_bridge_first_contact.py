"""The bridge's first contact (issue 13): a fresh installation without Claude Code's CLI delegates to the
stand-in by default, the recipe at the top of docs/bridge.md works, and each installation has its own
private tmux server, named after its data directory — so `tmux -L <name> kill-server` touches no other
installation's workers."""

import os
import subprocess
import sys
import time

import pytest

from bridge import conf
from bridge.models import Member, Profile
from bridge.profiles import seed_profiles
from bridge.terminal import TmuxBackend
from bridge.testing.fixtures import needs_tmux
from yuzu.testing import ROOT, wait_until

DOC = ROOT / "docs" / "bridge.md"


def fake_claude_on_path(directory):
    exe = directory / "claude"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return str(directory)


@pytest.mark.django_db
def test_default_profile_follows_the_claude_cli(tmp_path, monkeypatch):
    Profile.objects.all().delete()
    monkeypatch.setenv("PATH", str(tmp_path))  # no `claude` here
    assert seed_profiles() == ["claude-worker", "standin"]
    assert list(Profile.objects.filter(is_default=True).values_list("name", flat=True)) == ["standin"]
    assert Profile.objects.default().name == "standin"

    Profile.objects.all().delete()
    monkeypatch.setenv("PATH", fake_claude_on_path(tmp_path))
    seed_profiles()
    assert list(Profile.objects.filter(is_default=True).values_list("name", flat=True)) == ["claude-worker"]

    # Re-seeding never adds a second default nor moves the existing one (an administrator's choice stays).
    Profile.objects.filter(name="standin").delete()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert seed_profiles() == ["standin"]
    assert list(Profile.objects.filter(is_default=True).values_list("name", flat=True)) == ["claude-worker"]


def test_socket_name_is_derived_from_the_data_directory(settings, tmp_path, monkeypatch):
    monkeypatch.delenv("YUZU_BRIDGE_TMUX_SOCKET", raising=False)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    names = {}
    for d in ("a", "b", "link"):
        settings.VAR_DIR = tmp_path / d
        names[d] = conf.socket_name()
    assert names["a"] != names["b"]
    assert names["a"] == names["link"]  # the same installation, however its path is spelled
    assert names["a"].startswith("yuzu-bridge-") and "/" not in names["a"] and names["a"] != "yuzu-bridge"
    monkeypatch.setenv("YUZU_BRIDGE_TMUX_SOCKET", "chosen")
    assert conf.socket_name() == "chosen"


def installation_socket(var_dir):
    """The socket name a real `make run` process (here the poller command) derives for a data directory."""
    env = {k: v for k, v in os.environ.items() if k not in ("YUZU_BRIDGE_TMUX_SOCKET", "YUZU_SQLITE_PATH")}
    env["YUZU_VAR_DIR"] = str(var_dir)
    out = subprocess.run([sys.executable, str(ROOT / "manage.py"), "bridge_poller", "--print-socket"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout
    return out.strip()


@needs_tmux
def test_two_installations_never_share_a_tmux_server(tmp_path):
    one, two = installation_socket(tmp_path / "one"), installation_socket(tmp_path / "two")
    assert one != two and one == installation_socket(tmp_path / "one")
    a, b = TmuxBackend(one), TmuxBackend(two)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    try:
        pane_a = a.start("bridge-a", ["sleep", "600"], env)
        pane_b = b.start("bridge-b", ["sleep", "600"], env)
        assert [p.pane_id for p in a.list_panes()] == [pane_a.pane_id]  # each server holds its own only
        assert [p.pane_id for p in b.list_panes()] == [pane_b.pane_id]
        # The docs' advice, as a person types it, for installation one:
        subprocess.run(["tmux", "-L", one, "kill-server"], check=True, timeout=30,
                       env={k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")})
        wait_until(lambda: not a.alive(pane_a.pane_id), what="installation one's worker to die")
        time.sleep(0.3)
        assert b.alive(pane_b.pane_id), "kill-server of one installation killed another's worker"
    finally:
        a.shutdown()
        b.shutdown()


def recipe():
    """The opening recipe of docs/bridge.md: its first code block."""
    text = DOC.read_text()
    head = text[:text.index("\n## ")]
    block = head.split("```", 2)[1]
    return [line for line in block.splitlines()[1:] if line.strip()]


def test_the_docs_open_with_a_three_line_recipe():
    lines = recipe()
    assert len(lines) == 3, lines
    assert lines[0].startswith("make run")
    assert "claude mcp add --transport http bridged http://127.0.0.1:8000/mcp/bridge/" in lines[1]
    assert "bridge_send" in lines[2] and "reply:hello" in lines[2] and "standin" in lines[2]


@pytest.mark.live
@needs_tmux
def test_first_contact_recipe_on_a_fresh_installation(primary, bridge, tmp_path, monkeypatch):
    # A fresh installation seeded on a host without Claude Code's CLI.
    Profile.objects.all().delete()
    monkeypatch.setenv("PATH", str(tmp_path))
    seed_profiles()
    monkeypatch.undo()
    # The token `make run` prints: the `claude` identity, Operator role, supervised tier.
    p = primary("claude", role="Operator", tier="supervised")
    # No worker yet, no profile named: bridge_send auto-spawns the default profile's worker — the stand-in.
    r = p.call("bridge_send", {"content": "reply:hello", "timeoutMs": 30000})
    assert not r.is_error and r.rpc_error is None, (r.structured, r.rpc_error, bridge.logs())
    assert r["outcome"] == "reply" and r["text"] == "hello", r.structured
    # Line 3 of the recipe, as written, reaches that stand-in worker (and would spawn one on any host).
    r = p.call("bridge_send", {"content": "reply:hello", "sessionId": "standin", "timeoutMs": 30000})
    assert r["outcome"] == "reply" and r["text"] == "hello", r.structured
    assert list(Member.objects.values_list("profile_name", flat=True)) == ["standin"]
    # On a host with Claude Code's CLI (claude-worker the default), the recipe's line 3 still works.
    Profile.objects.update(is_default=False)
    Profile.objects.filter(name="claude-worker").update(is_default=True)
    other = primary("dana", role="Operator", tier="supervised")
    r = other.call("bridge_send", {"content": "reply:hello", "sessionId": "standin", "timeoutMs": 30000})
    assert r["outcome"] == "reply" and r["text"] == "hello", r.structured

