"""Opt-in: the bridge with a REAL Claude Code worker (docs/bridge.md, "Verify with a real agent").

What the stand-in cannot prove — Claude Code's real UI strings (title spinner, ✳, screen rules), its
hook payloads, its CLI flags (--mcp-config with ${VAR} expansion, --settings hooks,
--append-system-prompt) and that the model actually calls bridge_reply — is exercised here. It runs
only when asked to, because it bills the configured API:

    YUZU_BRIDGE_REAL_AGENT=1 YUZU_BRIDGE_SAME_USER_WORKERS=1 \\
    YUZU_BRIDGE_REAL_AGENT_BASE_URL=https://your-gateway/... \\
    YUZU_BRIDGE_REAL_AGENT_AUTH_TOKEN=...      (or YUZU_BRIDGE_REAL_AGENT_API_KEY=...) \\
    .venv/bin/python -m pytest tests/e2e/test_bridge_real_agent.py -q -s

The worker's cwd (YUZU_BRIDGE_REAL_AGENT_CWD, default a fresh temporary directory) must already be
trusted by Claude Code, or its trust dialog holds the worker in BLOCKED (the test says so).
"""

import os
import shutil
import time

import pytest

from bridge.models import Member, Profile
from bridge.testing.fixtures import status_of

REASON = None
if os.environ.get("YUZU_BRIDGE_REAL_AGENT") != "1":
    REASON = "opt-in: set YUZU_BRIDGE_REAL_AGENT=1 (bills the configured API; see the module docstring)"
elif shutil.which("claude") is None:
    REASON = "no real `claude` CLI on PATH"
elif shutil.which("tmux") is None:
    REASON = "tmux is not installed"
elif os.environ.get("YUZU_BRIDGE_SAME_USER_WORKERS") != "1":
    REASON = ("set YUZU_BRIDGE_SAME_USER_WORKERS=1: the worker runs as this user, which the IsolationGuard refuses "
              "otherwise (docs/bridge.md, Isolating workers)")
elif not os.environ.get("YUZU_BRIDGE_REAL_AGENT_BASE_URL"):
    REASON = "set YUZU_BRIDGE_REAL_AGENT_BASE_URL (the worker's ANTHROPIC_BASE_URL; never the primary's subscription)"

pytestmark = [pytest.mark.live, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_real_claude_worker_delegation(bridge, primary, tmp_path):
    env = {"ANTHROPIC_BASE_URL": os.environ["YUZU_BRIDGE_REAL_AGENT_BASE_URL"]}
    for src, dst in (("YUZU_BRIDGE_REAL_AGENT_AUTH_TOKEN", "ANTHROPIC_AUTH_TOKEN"),
                     ("YUZU_BRIDGE_REAL_AGENT_API_KEY", "ANTHROPIC_API_KEY")):
        if os.environ.get(src):
            env[dst] = os.environ[src]
    cwd = os.environ.get("YUZU_BRIDGE_REAL_AGENT_CWD") or str(tmp_path)
    Profile.objects.filter(name="claude-worker").update(env=env, cwd=cwd)
    p = primary()
    w = p.call("bridge_spawn", {"profile": "claude-worker"})
    assert not w.is_error, w.structured
    sid = w["sessionId"]
    deadline = time.monotonic() + 90
    while status_of(p, sid)["agent_status"] not in ("IDLE",) and time.monotonic() < deadline:
        time.sleep(0.5)
    st = status_of(p, sid)
    screen = p.call("bridge_read", {"sessionId": sid, "source": "detection"}).structured
    assert st["agent_status"] == "IDLE", ("the worker never became IDLE (trust dialog? login?)", st, screen,
                                          p.call("bridge_read", {"sessionId": sid, "source": "visible"})["text"])
    r = p.call("bridge_send", {"content": "Call the bridge_reply tool with the single word PONG as content, "
                                          "then stop.", "sessionId": sid, "timeoutMs": 180000})
    print("outcome:", r.structured)
    assert not r.is_error, r.structured
    assert r["outcome"] in ("reply", "turn_done"), r.structured
    assert r["outcome"] == "reply" and "PONG" in r["text"], ("the model did not call bridge_reply", r.structured)
    m = Member.objects.get(session_id=sid)
    assert m.hook_at is not None, "no lifecycle hook reached the hook sink (--settings hooks / curl?)"
    p.call("bridge_stop", {"paneId": sid})
