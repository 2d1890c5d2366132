"""Errors that decide the next step: every refusal names what the caller holds and what is needed, its
remediation names a surface that exists, every error carries a correlation id (in error.data and the
X-Correlation-Id header, MCP 401s included), and docs/mcp.md's table lists every code the server sends."""

import json
import re
from pathlib import Path

import pytest
from django.core.management import get_commands
from django.test import Client, override_settings
from django.urls import resolve
from django.utils import timezone

from fleet.models import Agent, ManagementGroup
from mcp import jsonrpc
from tests.support.mcp_http import McpClient, request
from yuzu.models import ApiToken
from yuzu.rbac import APPROVALS_PAGE, ROLE_ASSIGNMENT_PAGE

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
CID = re.compile(r"^req-[0-9a-f]+-[0-9a-f]+$")
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}


def assert_correlated(r):
    """error.data.correlation_id is present, well formed, and the X-Correlation-Id header repeats it."""
    cid = r.error["data"]["correlation_id"]
    assert CID.match(cid) and r.headers["x-correlation-id"] == cid, (r.error, r.headers)
    return r.error


# --- 401 --------------------------------------------------------------------------------------------

def test_mcp_401s_are_32001_with_a_correlation_id_and_a_way_to_a_working_token(mint, make_user):
    live = mint("alice", role="Viewer", tier="readonly")
    revoked = mint("bob", role="Viewer", tier="readonly")
    ApiToken.objects.filter(owner__username="bob").update(revoked_at=timezone.now())
    _, worker = ApiToken.mint(make_user("alice"), "worker", audience="bridge")
    inactive = mint("carol", role="Viewer", tier="readonly")
    type(make_user("carol")).objects.filter(username="carol").update(is_active=False)
    cases = {
        "no credentials": ({}, "mint_token"),
        "malformed Authorization header; use 'Bearer yuzu_…'": ({"authorization": "Basic abc"}, "mint_token"),
        "malformed token": ({"authorization": "Bearer nope"}, "mint_token"),
        "unknown token": ({"authorization": "Bearer yuzu_" + "0" * 64}, "mint_token"),
        "token expired or revoked": ({"authorization": f"Bearer {revoked}"}, "GET /api/v1/tokens"),
        "token not valid for this endpoint": ({"authorization": f"Bearer {worker}"}, "/mcp/bridge/"),
        "token owner is inactive": ({"authorization": f"Bearer {inactive}"}, "/admin/auth/user/"),
    }
    for reason, (headers, surface) in cases.items():
        r = request(body=INIT, headers=headers)
        error = ', error="invalid_token"' if headers else ""  # RFC 6750: only when a credential was presented
        assert r.status == 401 and r.headers["www-authenticate"] == (
            'Bearer realm="yuzu", resource_metadata="http://127.0.0.1:8000/.well-known/oauth-protected-resource/mcp/v1"'
            + error), reason
        err = assert_correlated(r)
        assert err["code"] == -32001 and err["message"] == f"Unauthorized: {reason}"
        assert surface in err["data"]["remediation"], (reason, err["data"]["remediation"])
    assert request(body=INIT, headers={"authorization": f"Bearer {live}"}).status == 200


# --- a correlation id on every error ----------------------------------------------------------------

@pytest.fixture
def client(mint):
    c = McpClient(mint("op", role="Operator", tier="operator"))
    c.initialize()
    return c


def test_every_error_carries_its_correlation_id(client):
    h = client.headers()
    seen = {}

    def check(r, code):
        err = assert_correlated(r)
        assert err["code"] == code, err
        seen[code] = True

    check(request(body="{nope", headers=h), -32700)
    check(request(body=[{"jsonrpc": "2.0", "id": 1, "method": "ping"}], headers=h), -32600)
    check(request(body={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={**h, "content-length": None}), -32600)
    check(request(body={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={**h, "host": "evil.example"}), -32600)
    check(request(body={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                  headers={"authorization": h["authorization"]}), -32600)  # no session id
    check(client.rpc("no/such/method"), -32601)
    check(client.rpc("tools/list", {"cursor": "!!"}), -32602)
    check(client.call("no_such_tool"), -32602)
    check(client.rpc("resources/read", {"uri": "yuzu://nope"}), -32002)
    check(client.call("query_audit_log", {"limit": 0}), -32602)
    check(client.call("create_management_group", {"name": "g"}), -32004)
    check(request(body={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                  headers={**h, "mcp-session-id": "0" * 32}), -32007)
    check(request(body={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                  headers={**h, "origin": "https://evil.example"}), -32008)
    check(request(body={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                  headers={**h, "mcp-protocol-version": "1999-01-01"}), -32009)
    check(request("GET", headers={**h, "accept": "application/json"}), -32011)
    with override_settings(YUZU_MCP_DISABLE=True):
        check(request(body=INIT, headers=h), -32005)
    assert client.rpc("no/such/method").error["data"]["remediation"].startswith("this server answers initialize")
    assert len(seen) == 11


# --- refusals name what is held and what is needed ----------------------------------------------------

def test_resource_refusals_name_tier_and_permission(mint, make_user):
    make_user("nobody")
    c = McpClient(mint("nobody", role=None, tier="readonly"))
    c.initialize()
    err = assert_correlated(c.rpc("resources/read", {"uri": "yuzu://audit/recent"}))
    assert err["code"] == -32003 and err["data"]["permission"] == "AuditLog:Read"
    assert err["message"].startswith("permission denied: AuditLog:Read (none of your roles grants it; built-in roles")


def test_service_scope_refusal_names_the_scope(mint):
    c = McpClient(mint("svc", role="Operator", tier="operator", scope_service="payments"))
    c.initialize()
    err = c.call("list_agents").error
    assert err["code"] == -32003 and err["data"]["scope_service"] == "payments"
    assert "'payments'" in err["message"] and "mint_token --user svc" in err["data"]["remediation"]


def test_read_only_mode_says_who_can_lift_it(client):
    with override_settings(YUZU_MCP_READ_ONLY=True):
        err = client.call("set_tag", {"agent_id": "a", "key": "k", "value": "v"}).error
    assert err["code"] == -32004 and err["data"]["permission"] == "Tag:Write"
    assert "YUZU_MCP_READ_ONLY" in err["data"]["remediation"]


def test_the_rest_face_says_the_same(mint, make_user):
    """REST goes through yuzu.rbac.check: the same tier and group-confinement wording, as a 403."""
    Agent.objects.create(agent_id="in"), Agent.objects.create(agent_id="out")
    group = ManagementGroup.objects.create(name="svc")
    group.members.add(Agent.objects.get(agent_id="in"))
    tiered = Client(HTTP_AUTHORIZATION=f"Bearer {mint('ro', role='Operator', tier='readonly')}")
    r = tiered.put("/api/v1/tags", json.dumps({"agent_id": "in", "key": "k", "value": "v"}),
                    content_type="application/json")
    body = r.json()["error"]
    assert r.status_code == 403 and body["message"] == "tier 'readonly' does not allow Tag:Write (needs operator or higher)"
    assert (body["tier"], body["required_tier"]) == ("readonly", "operator") and "mint_token" in body["remediation"]
    make_user("owner", "Viewer")  # sees every agent (Tag:Read everywhere); may write tags only on 'svc'
    owner = Client(HTTP_AUTHORIZATION=f"Bearer {mint('owner', role='ITServiceOwner', group=group)}")
    r = owner.put("/api/v1/tags", json.dumps({"agent_id": "out", "key": "k", "value": "v"}),
                   content_type="application/json")
    body = r.json()["error"]
    assert r.status_code == 403 and body["permission"] == "Tag:Write" and body["granted_on"] == ["svc"]
    assert "on agent 'out': your grant is confined to management group(s) 'svc'" in body["message"]
    r = owner.put("/api/v1/tags", json.dumps({"agent_id": "in", "key": "k", "value": "v"}),
                   content_type="application/json")
    assert r.status_code == 200


def test_remediations_name_surfaces_that_exist():
    """No refusal sends a caller to "the dashboard" (there is none); the pages and the command they do name
    exist."""
    offenders = [str(p.relative_to(ROOT)) for app in ("yuzu", "fleet", "approvals", "mcp", "bridge")
                 for p in (ROOT / app).rglob("*.py") if "dashboard" in p.read_text().lower()]
    assert offenders == []
    for path in (APPROVALS_PAGE, ROLE_ASSIGNMENT_PAGE, "/admin/auth/user/"):
        resolve(path)
    assert "mint_token" in get_commands()


# --- docs/mcp.md lists every code ---------------------------------------------------------------------

def codes_sent():
    """Every JSON-RPC error code the code base can send: the jsonrpc constants referenced outside their
    definitions, and literal -32xxx codes."""
    names = {n: v for n, v in vars(jsonrpc).items() if n.isupper() and isinstance(v, int) and v < -32000}
    sent = set()
    for app in ("yuzu", "fleet", "approvals", "mcp", "bridge"):
        for path in (ROOT / app).rglob("*.py"):
            text = path.read_text()
            if path.name == "jsonrpc.py":
                text = "\n".join(line for line in text.splitlines() if not re.match(r"^[A-Z_, ]+ = ", line))
                sent |= {v for n, v in names.items() if re.search(rf"\b{n}\b", text)}
            else:
                sent |= {names[n] for n in re.findall(r"\brpc\.([A-Z_]+)\b", text) if n in names}
            sent |= {int(c) for c in re.findall(r"(?<![\w.])(-32\d{3})\b", text)}
    return sent


def test_the_error_table_lists_every_code_the_server_sends():
    doc = (ROOT / "docs" / "mcp.md").read_text()
    table = {int(c) for c in re.findall(r"^\| (-32\d{3}) \|", doc, re.M)}
    sent = codes_sent()
    assert {-32001, -32602, -32003, -32004, -32006, -32014} <= sent  # the scan sees literals and constants
    assert table == sent, f"undocumented: {sorted(sent - table)}; documented but never sent: {sorted(table - sent)}"
