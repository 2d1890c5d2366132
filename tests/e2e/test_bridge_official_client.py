"""The delegation and clarification flows driven by the official MCP Python SDK (run in .venv-mcp,
tests/mcp_client/bridge_drive.py) against a real daphne, real tmux panes and the poller."""

import json
import subprocess
from pathlib import Path

import pytest

from bridge.testing.fixtures import needs_tmux

ROOT = Path(__file__).resolve().parents[2]
SDK_PY = ROOT / ".venv-mcp" / "bin" / "python"
DRIVER = ROOT / "tests" / "mcp_client" / "bridge_drive.py"

pytestmark = [
    pytest.mark.live, needs_tmux,
    pytest.mark.skipif(not SDK_PY.exists(), reason="the official MCP SDK env is missing: make .venv-mcp/.installed"),
]


def test_official_client_delegation_and_clarification(bridge, mint):
    token = mint("alice", role="Operator")
    proc = subprocess.run([str(SDK_PY), str(DRIVER), "--url", bridge.bridge_url, "--token", token, "--flow", "both"],
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:], bridge.logs())
    obs = json.loads(proc.stdout)
    assert obs["server_info"]["name"] == "yuzu-bridge" and obs["closed"]
    assert len(obs["tools"]) == 13 and "bridge_send" in obs["tools"]
    assert obs["params"]["bridge_send"] == ["autoSpawn", "content", "sessionId", "timeoutMs", "turnId", "wait"]
    calls = {c["as"]: c for c in obs["calls"]}
    for rec in calls.values():
        assert not rec.get("error") and not rec["is_error"], rec
        assert rec.get("schema_valid", True), rec
    assert calls["bridge_whoami"]["structured"]["role"] == "primary"
    assert calls["delegation"]["structured"]["outcome"] == "reply"
    assert calls["delegation"]["structured"]["text"] == "from the official client"
    q = calls["question"]["structured"]
    assert q["outcome"] == "question" and q["text"] == "which branch?"
    assert calls["answer"]["structured"] == {"outcome": "reply", "text": "answered:main", "turnId": q["turnId"],
                                             "sessionId": q["sessionId"]}
    assert calls["bridge_stop"]["structured"]["wasRunning"] is True
