"""The tools/call pipeline: check order, schema validation, the A4 error envelope and the audit row every
call writes. The tier × RBAC × group policy of every tool is tests/yuzu/test_authorization_matrix.py."""

import json

import pytest
from django.test import override_settings

from tests.support.mcp_http import McpClient
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)


def client_for(mint, username, role, tier):
    c = McpClient(mint(username, role=role, tier=tier))
    c.initialize()
    return c


def test_tier_denial_precedes_schema_validation_and_rbac(mint):
    c = client_for(mint, "ro", "Viewer", "readonly")
    r = c.call("set_tag", {"bogus": 1})  # invalid arguments AND a write tool
    # The refusal names the tier held and the tier needed, and a way to get such a token that exists.
    assert r.error["code"] == -32004
    assert r.error["message"] == "tier 'readonly' does not allow Tag:Write (needs operator or higher)"
    data = r.error["data"]
    assert data["retry_after_ms"] is None and data["correlation_id"].startswith("req-")
    assert (data["tier"], data["required_tier"], data["permission"]) == ("readonly", "operator", "Tag:Write")
    assert "manage.py mint_token --user ro " in data["remediation"] and "--tier operator" in data["remediation"]
    assert "dashboard" not in data["remediation"]
    # A supervised-only operation says so.
    r = c.call("create_management_group", {"name": "g"})
    assert r.error["message"] == "tier 'readonly' does not allow ManagementGroup:Write (needs supervised)"
    assert r.error["data"]["required_tier"] == "supervised"
    row = AuditEvent.objects.get(action="mcp.set_tag")
    assert row.result == "denied" and "tier=readonly" in row.detail and row.target_type == "mcp_tool"


def test_schema_violation_is_32602_with_path_and_cid_in_audit(mint):
    c = client_for(mint, "op", "Operator", "operator")
    r = c.call("get_agent_details", {"agent_id": 5})
    err = r.error
    assert err["code"] == -32602
    assert err["message"].startswith("arguments do not match the tool input schema at '/agent_id'")
    row = AuditEvent.objects.get(action="mcp.get_agent_details")
    assert row.result == "failure" and err["data"]["correlation_id"] in row.detail
    assert c.call("list_agents", {"unexpected": True}).error["code"] == -32602
    assert c.call("list_agents", {"limit": 1.0}).error["code"] == -32602  # integer is strict


def test_unknown_tool_is_32602_and_audited(mint):
    c = client_for(mint, "op", "Operator", "operator")
    r = c.call("no_such_tool")
    assert r.error["code"] == -32602 and r.error["message"] == "Unknown tool: no_such_tool"
    assert AuditEvent.objects.filter(action="mcp.no_such_tool", result="denied").exists()


def test_an_invented_tool_name_makes_no_metric_series(mint):
    """The tool name is the client's text: every invented one would add a series to each process's tool-call
    counter (and the public /metrics) for good. Unknown names count as ``unknown``; the audit row keeps the name."""
    from prometheus_client import REGISTRY

    def series(tool):
        return REGISTRY.get_sample_value("yuzu_mcp_tool_calls_total", {"tool": tool, "result": "denied"}) or 0

    c = client_for(mint, "op", "Operator", "operator")
    before = series("unknown")
    for name in ("invented_a", "invented_b"):
        assert c.call(name).error["code"] == -32602
        assert series(name) == 0
    assert series("unknown") == before + 2
    assert AuditEvent.objects.filter(action="mcp.invented_b", result="denied").exists()


def test_rbac_denial_carries_permission(mint, make_user):
    make_user("nobody")
    c = client_for(mint, "nobody", None, "readonly")
    r = c.call("query_audit_log", {})
    assert r.error["code"] == -32003
    data = r.error["data"]
    assert data["permission"] == "AuditLog:Read" and data["granted_on"] == []
    assert r.error["message"].startswith("permission denied: AuditLog:Read (none of your roles grants it; built-in "
                                         "roles that do: ")
    assert {"Administrator", "Approver", "Viewer"} <= set(data["roles_granting"])
    assert "/admin/yuzu/roleassignment/add/" in data["remediation"]


def test_success_result_has_text_and_structured_content_and_audit(mint):
    from fleet.models import Agent

    Agent.objects.create(agent_id="a1", hostname="h1", os="linux", connected=True)
    c = client_for(mint, "op", "Operator", "operator")
    result = c.call("list_agents").json()["result"]
    assert result["structuredContent"]["count"] == 1
    assert result["content"][0]["type"] == "text" and '"a1"' in result["content"][0]["text"]
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]  # one encoding on the wire
    row = AuditEvent.objects.get(action="mcp.list_agents")
    assert (row.result, row.target_type, row.target_id, row.principal) == ("success", "mcp_tool", "list_agents", "op")


def test_a_tool_results_structured_content_is_written_from_its_one_encoding():
    """tool_result encodes structuredContent once, for the text block; the reply writes those same bytes rather than
    encode it again — unless the value was replaced since, when the new value is what goes out."""
    from mcp import jsonrpc as rpc
    from mcp.pipeline import tool_result

    result = tool_result({"count": 1, "agents": [{"id": "a1"}]})
    assert result == {"content": [{"type": "text", "text": '{"count":1,"agents":[{"id":"a1"}]}'}],
                      "structuredContent": {"count": 1, "agents": [{"id": "a1"}]}}
    stale = rpc.Result({"structuredContent": {"n": 1}}, "structuredContent", b'{"n":2}')  # bytes ≠ value: shows which
    assert json.loads(rpc.dumps(rpc.result_response(7, stale))) == {"jsonrpc": "2.0", "id": 7,
                                                                   "result": {"structuredContent": {"n": 2}}}
    stale["structuredContent"] = {"n": 3}
    assert json.loads(rpc.dumps(rpc.result_response(7, stale)))["result"] == {"structuredContent": {"n": 3}}


def test_handler_not_found_is_32602_envelope(mint):
    c = client_for(mint, "op", "Operator", "operator")
    r = c.call("get_agent_details", {"agent_id": "ghost"})
    assert r.error["code"] == -32602 and "Agent not found" in r.error["message"]
    assert set(r.error["data"]) >= {"correlation_id", "retry_after_ms", "remediation"}


def test_group_scoped_owner_sees_only_group_devices(mint, make_user):
    from fleet.models import Agent, ManagementGroup

    a, b = Agent.objects.create(agent_id="in"), Agent.objects.create(agent_id="out")
    g = ManagementGroup.objects.create(name="svc")
    g.members.add(a)
    c = McpClient(mint("owner", role="ITServiceOwner", group=g, tier="operator"))
    c.initialize()
    ids = [x["agent_id"] for x in c.call("list_agents").json()["result"]["structuredContent"]["agents"]]
    assert ids == ["in"]
    assert "result" in c.call("set_tag", {"agent_id": "in", "key": "role", "value": "Web"}).json()
    # Another group's device reads exactly like one that does not exist (no existence oracle).
    denied = c.call("set_tag", {"agent_id": "out", "key": "role", "value": "web"})
    ghost = c.call("set_tag", {"agent_id": "nowhere", "key": "role", "value": "web"})
    assert denied.error["code"] == ghost.error["code"] == -32602
    assert (denied.error["message"], ghost.error["message"]) == ("Agent not found: out", "Agent not found: nowhere")
    _ = b


def test_service_scoped_token_denied_on_denied_class(mint):
    c = McpClient(mint("svc", role="Operator", tier="operator", scope_service="payments"))
    c.initialize()
    denied = c.call("list_agents")
    assert denied.error["code"] == -32003 and "service-scoped" in denied.error["message"]
    # A "confined" tool proceeds to its handler's own confinement (here: the device does not exist).
    assert c.call("set_tag", {"agent_id": "zz", "key": "k", "value": "v"}).error["code"] == -32602


def test_approve_request_refuses_with_assurance_reason(mint):
    c = client_for(mint, "sup", "Administrator", "supervised")
    r = c.call("approve_request", {"approval_id": "a" * 32})
    assert r.error["code"] == -32003
    assert r.error["message"] == "approver_assurance_required:non_interactive_session"
    assert r.error["data"]["retry_after_ms"] is None
    row = AuditEvent.objects.get(action="mcp.approve_request")
    assert row.result == "denied" and f"approval_id={'a' * 32} approver_assurance:non_interactive_session" in row.detail
    ro = client_for(mint, "viewer", "Viewer", "readonly")
    assert ro.call("approve_request", {"approval_id": "a" * 32}).error["code"] == -32004  # tier refuses first
    with override_settings(YUZU_MCP_READ_ONLY=True):
        assert c.call("reject_request", {"approval_id": "a" * 32}).error["code"] == -32004


def test_tool_catalogue_doc_is_current():
    from pathlib import Path

    from mcp.management.commands.mcp_catalogue import render

    doc = Path(__file__).resolve().parents[2] / "docs" / "mcp-tools.md"
    assert doc.read_text() == render(), "regenerate: python manage.py mcp_catalogue > docs/mcp-tools.md"


def test_hops_run_on_one_pool_of_threads_whatever_event_loop_awaits_them():
    """A call's hop (mcp.pipeline.hop) runs on the process's pool, not on its event loop's default executor:
    an event loop per call (async_to_sync in Celery tasks, the in-process tests) otherwise left one thread
    per loop dying with its database connection open until the cyclic GC found it — 70 PostgreSQL
    connections at once, and "too many clients" for the next call."""
    import threading

    from asgiref.sync import async_to_sync

    from mcp.pipeline import _HOPS, hop

    threads = {async_to_sync(hop(threading.current_thread))() for _ in range(3 * _HOPS._max_workers)}
    assert len(threads) <= _HOPS._max_workers
    assert all(t.is_alive() and t.name.startswith("yuzu-hop") for t in threads)
