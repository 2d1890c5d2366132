"""The approval flow through the official MCP Python client: -32006 with approval_id and status_url,
a human approves, the same client re-calls with the approval_id and the tool runs — once."""

import json
import subprocess
import time

import pytest

from approvals.models import Approval
from approvals.services import review
from fleet.models import Agent, Tag
from tests.support.official_client import DRIVE, MCP_PY, client_env
from yuzu.models import AuditEvent
from yuzu.rbac import Principal

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def test_official_client_sees_32006_then_the_recall_runs(daphne, mint, make_user, tmp_path):
    from yuzu.models import TOTPDevice

    if not MCP_PY.exists():
        pytest.fail(f"{MCP_PY} is missing: run `make test`")
    agent = Agent.objects.create(agent_id="ap-01", hostname="ap-01", connected=True)
    Tag.objects.create(agent=agent, key="owner", value="payments")
    token = mint("sam", role="Operator", tier="supervised")
    approver = make_user("ann", "Approver")
    TOTPDevice.objects.create(user=approver, name="phone", confirmed=True)
    server = daphne()
    flag = tmp_path / "approved"
    args = {"agent_id": "ap-01", "key": "owner"}
    steps = [
        {"op": "call", "tool": "delete_tag", "args": args},
        {"op": "wait_for_file", "path": str(flag), "timeout": 60},
        {"op": "call", "tool": "delete_tag", "as": "recall",
         "args": {**args, "approval_id": "@calls.delete_tag.error.data.approval_id"}},
        {"op": "call", "tool": "delete_tag", "as": "replay",
         "args": {**args, "approval_id": "@calls.delete_tag.error.data.approval_id"}},
    ]
    proc = subprocess.Popen([str(MCP_PY), str(DRIVE), "--url", server.mcp, "--token", token, "--mode", "legacy",
                             "--steps", json.dumps(steps)], cwd=tmp_path, env=client_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not Approval.objects.filter(definition_id="mcp.delete_tag").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "no ticket was minted"
            time.sleep(0.1)
        ticket = Approval.objects.get(definition_id="mcp.delete_tag")
        assert Tag.objects.filter(agent=agent, key="owner").exists()  # nothing ran before approval
        review(Principal(user=approver, via="session", mfa_verified_at=time.time()), ticket.id, "approved")
        flag.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    obs = json.loads(out)
    first = obs["calls"]["delete_tag"]["error"]
    assert first["code"] == -32006
    assert first["data"]["approval_id"] == ticket.id and first["data"]["status_url"] == f"/api/v1/approvals/{ticket.id}"
    assert first["data"]["retry_after_ms"] == 30000 and first["data"]["correlation_id"].startswith("req-")
    recall = obs["calls"]["recall"]
    assert recall.get("error") is None and recall["structured"]["deleted"] is True
    assert not Tag.objects.filter(agent=agent, key="owner").exists()
    replay = obs["calls"]["replay"]["error"]
    assert replay["code"] == -32003 and replay["message"] == "approval already used (one-time ticket)"
    results = list(AuditEvent.objects.filter(action="mcp.delete_tag").order_by("id").values_list("result", flat=True))
    assert results == ["pending", "approved", "denied"]
