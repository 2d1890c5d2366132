"""MCP 2026-07-28 ("modern") beside the handshake era on /mcp/v1/ and /mcp/bridge/ (issue 14; docs/mcp.md "Eras"),
over raw HTTP in-process: the era routing rule, the modern ladder and every new error code, server/discover,
the modern result shape, the same guards as the handshake era, and approvals through input_required."""

import base64
import json

import pytest
from django.core import signing
from django.test import override_settings
from django.utils import timezone

from approvals.models import Approval
from fleet.models import Agent, Execution, Tag
from mcp import mrtr
from tests.support.mcp_http import McpClient, request
from yuzu.models import AuditEvent
from yuzu.rbac import seed_builtin_roles

pytestmark = pytest.mark.django_db(transaction=True)

V = "2026-07-28"
SERVER_INFO = "io.modelcontextprotocol/serverInfo"
NAME_FIELDS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri", "tasks/get": "taskId",
               "tasks/update": "taskId", "tasks/cancel": "taskId"}


def meta(capabilities=None, version=V, **extra):
    m = {"io.modelcontextprotocol/protocolVersion": version,
         "io.modelcontextprotocol/clientCapabilities": {} if capabilities is None else capabilities,
         "io.modelcontextprotocol/clientInfo": {"name": "modern-test", "version": "1"}}
    m.update(extra)
    return m


def modern(token, method, params=None, *, headers=None, capabilities=None, path="/mcp/v1/", rid=1, drop=(),
           body_version=V):
    """A well-formed modern request (headers agreeing with the body), with ``headers`` overriding and ``drop``
    removing some."""
    params = dict(params or {})
    params["_meta"] = {**meta(capabilities, body_version), **params.get("_meta", {})}
    msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    h = {"mcp-protocol-version": V, "mcp-method": method}
    if method in NAME_FIELDS and NAME_FIELDS[method] in params:
        h["mcp-name"] = params[NAME_FIELDS[method]]
    if token:
        h["authorization"] = f"Bearer {token}"
    h.update(headers or {})
    for name in drop:
        h[name] = None
    return request(body=msg, headers=h, path=path)


@pytest.fixture
def token(mint):
    seed_builtin_roles()
    return mint("alice", role="Operator", tier="operator")


def assert_stamped(result, name="yuzu-server"):
    assert result["resultType"] == "complete"
    assert result["_meta"][SERVER_INFO]["name"] == name and result["_meta"][SERVER_INFO]["version"]


# --- server/discover and the result shape ---------------------------------------------------------------

def test_discover(token):
    r = modern(token, "server/discover")
    assert r.status == 200 and "mcp-session-id" not in r.headers
    body = r.json()
    assert body["id"] == 1
    result = body["result"]
    assert_stamped(result)
    assert result["supportedVersions"] == [V]
    assert {"tools", "resources", "prompts", "completions"} <= set(result["capabilities"])
    assert "subscribe" not in result["capabilities"]["resources"]
    assert "classify_operational_question" in result["instructions"]
    assert result["ttlMs"] == 3600000 and result["cacheScope"] == "public"
    assert "serverInfo" not in result  # in _meta only


def test_discover_needs_auth():
    r = modern(None, "server/discover")
    assert r.status == 401 and r.error["code"] == -32001 and "www-authenticate" in r.headers


def test_bridge_endpoint_speaks_modern_with_its_own_catalogue(token):
    r = modern(token, "server/discover", path="/mcp/bridge/")
    assert r.status == 200, r.body
    assert_stamped(r.json()["result"], name="yuzu-bridge")
    names = {t["name"] for t in modern(token, "tools/list", path="/mcp/bridge/").json()["result"]["tools"]}
    assert "bridge_status" in names and "list_agents" not in names
    assert modern(token, "ping", path="/mcp/bridge/").status == 404
    r = modern(token, "tools/list", path="/mcp/bridge/", headers={"mcp-protocol-version": "2030-01-01"},
               body_version="2030-01-01")
    assert r.error["code"] == -32022


@pytest.mark.parametrize("method,params,hint", [
    ("tools/list", {}, (300000, "private")),
    ("prompts/list", {}, (300000, "public")),
    ("resources/list", {}, (0, "private")),
    ("resources/templates/list", {}, (0, "private")),
    ("resources/read", {"uri": "yuzu://about"}, (0, "private")),
])
def test_cacheable_results_carry_hints(token, method, params, hint):
    r = modern(token, method, params)
    assert r.status == 200, r.body
    result = r.json()["result"]
    assert_stamped(result)
    assert (result["ttlMs"], result["cacheScope"]) == hint


def test_tools_call_result_shape_and_audit(token):
    r = modern(token, "tools/call", {"name": "check_permission",
                                     "arguments": {"securable_type": "Infrastructure", "operation": "Read"}})
    assert r.status == 200, r.body
    result = r.json()["result"]
    assert_stamped(result)
    assert "ttlMs" not in result and result["structuredContent"]["allowed"] is True
    assert AuditEvent.objects.filter(principal="alice", action="mcp.check_permission", result="success").exists()


def test_prompts_get_and_completion(token):
    r = modern(token, "prompts/get", {"name": "fleet_overview", "arguments": {}})
    assert r.status == 200, r.body
    assert_stamped(r.json()["result"])
    r = modern(token, "completion/complete", {"ref": {"type": "ref/prompt", "name": "fleet_overview"},
                                              "argument": {"name": "x", "value": ""}})
    assert r.status == 200 and r.json()["result"]["resultType"] == "complete"


# --- the 2026 error codes and statuses ----------------------------------------------------------------

def test_resource_not_found_is_invalid_params(token):
    r = modern(token, "resources/read", {"uri": "yuzu://nope"})
    assert r.status == 400 and r.error["code"] == -32602 and r.error["data"]["uri"] == "yuzu://nope"


@pytest.mark.parametrize("method", ["initialize", "ping", "logging/setLevel", "resources/subscribe",
                                    "resources/unsubscribe", "no/such/method"])
def test_removed_and_unknown_methods_are_404(token, method):
    r = modern(token, method, {"level": "info"} if method == "logging/setLevel" else {})
    assert r.status == 404 and r.error["code"] == -32601 and r.json()["id"] == 1
    assert "mcp-session-id" not in r.headers


def test_unknown_tool_and_bad_arguments(token):
    r = modern(token, "tools/call", {"name": "no_such_tool", "arguments": {}})
    assert r.status == 400 and r.error["code"] == -32602 and r.error["message"] == "Unknown tool: no_such_tool"
    r = modern(token, "tools/call", {"name": "list_agents", "arguments": {"limit": "many"}})
    assert r.status == 400 and r.error["code"] == -32602 and "/limit" in r.error["message"]


@pytest.mark.parametrize("version", ["2027-01-01", "1999-01-01", "2025-03-26", "garbage"])
def test_unknown_version_header_is_32022(token, version):
    r = modern(token, "tools/list", headers={"mcp-protocol-version": version}, body_version=version)
    assert r.status == 400 and r.error["code"] == -32022
    assert r.error["data"]["supported"] == [V]  # what server/discover lists
    assert r.json()["id"] == 1
    assert r.error["data"]["requested"] == version


def test_modern_header_with_unsupported_body_version_is_32022(token):
    r = modern(token, "tools/list", body_version="2099-01-01", headers={"mcp-protocol-version": V})
    # the body and the header disagree: the header rung comes first
    assert r.status == 400 and r.error["code"] == -32020


@pytest.mark.parametrize("drop_key", ["io.modelcontextprotocol/protocolVersion",
                                      "io.modelcontextprotocol/clientCapabilities"])
def test_missing_meta_key_is_32602(token, drop_key):
    m = meta()
    del m[drop_key]
    msg = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"_meta": m}}
    r = request(body=msg, headers={"authorization": f"Bearer {token}", "mcp-protocol-version": V,
                                   "mcp-method": "tools/list"})
    assert r.status == 400 and r.error["code"] == -32602 and r.json()["id"] == 7


def test_no_meta_at_all_is_32602(token):
    r = request(body={"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
                headers={"authorization": f"Bearer {token}", "mcp-protocol-version": V, "mcp-method": "tools/list"})
    assert r.status == 400 and r.error["code"] == -32602


def test_client_info_is_optional(token):
    m = meta()
    del m["io.modelcontextprotocol/clientInfo"]
    r = request(body={"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": m}},
                headers={"authorization": f"Bearer {token}", "mcp-protocol-version": V, "mcp-method": "tools/list"})
    assert r.status == 200


@pytest.mark.parametrize("headers,drop", [
    ({}, ("mcp-method",)),                                   # missing Mcp-Method
    ({"mcp-method": "tools/list"}, ()),                      # lying Mcp-Method
    ({}, ("mcp-name",)),                                     # missing Mcp-Name
    ({"mcp-name": "list_agents"}, ()),                       # lying Mcp-Name
    ({"mcp-name": "=?base64?bm90IGJhc2U2NA?="}, ()),         # malformed base64 (non-canonical)
    ({"mcp-name": "Check_Permission"}, ()),                  # values are case-sensitive
])
def test_header_mismatch_is_32020(token, headers, drop):
    r = modern(token, "tools/call", {"name": "check_permission", "arguments": {}}, headers=headers, drop=drop)
    assert r.status == 400 and r.error["code"] == -32020 and r.json()["id"] == 1
    assert not AuditEvent.objects.filter(action="mcp.check_permission").exists()  # nothing ran


def test_header_values_trimmed_names_case_insensitive_base64_decoded(token):
    args = {"securable_type": "Infrastructure", "operation": "Read"}
    r = modern(token, "tools/call", {"name": "check_permission", "arguments": args},
               headers={"mcp-name": "  check_permission ", "mcp-method": " tools/call"})
    assert r.status == 200, r.body
    b64 = base64.b64encode(b"check_permission").decode()
    r = modern(token, "tools/call", {"name": "check_permission", "arguments": args},
               headers={"mcp-name": f"=?base64?{b64}?="})
    assert r.status == 200, r.body


def test_duplicated_routing_header_is_32020(token):
    msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta()}}
    from asgiref.sync import async_to_sync  # deferred: the raw communicator, for a repeated header
    from channels.testing import HttpCommunicator

    from yuzu.asgi import application
    body = json.dumps(msg).encode()
    headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), (b"authorization", f"Bearer {token}".encode()),
               (b"mcp-protocol-version", V.encode()), (b"mcp-method", b"tools/list"), (b"mcp-method", b"tools/list")]
    raw = async_to_sync(HttpCommunicator(application, "POST", "/mcp/v1/", body=body, headers=headers).get_response)()
    assert raw["status"] == 400 and json.loads(raw["body"])["error"]["code"] == -32020


def test_legacy_request_claiming_modern_in_body_is_32020(token):
    client = McpClient(token)
    client.initialize()
    r = client.rpc("tools/list", {"_meta": meta()})
    assert r.status == 400 and r.error["code"] == -32020
    r = request(body={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta()}},
                headers={"authorization": f"Bearer {token}"})
    assert r.status == 400 and r.error["code"] == -32020


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_modern_get_and_delete_are_405(token, method):
    r = request(method, headers={"authorization": f"Bearer {token}", "mcp-protocol-version": V,
                                 "accept": "text/event-stream"})
    assert r.status == 405 and r.headers["allow"] == "POST"


def test_stray_session_header_is_ignored(token):
    r = modern(token, "tools/list", headers={"mcp-session-id": "f" * 32, "last-event-id": "4"})
    assert r.status == 200 and "mcp-session-id" not in r.headers


def test_notifications_are_accepted_and_dropped(token):
    msg = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
    r = request(body=msg, headers={"authorization": f"Bearer {token}", "mcp-protocol-version": V,
                                   "mcp-method": "notifications/cancelled"})
    assert r.status == 202 and r.body == b""


# --- the same guards as the handshake era -----------------------------------------------------------------

def test_origin_checked_before_the_era(token):
    r = modern(token, "server/discover", headers={"origin": "https://evil.example"})
    assert r.status == 403 and r.error["code"] == -32008


def test_content_type_and_host(token):
    assert modern(token, "server/discover", headers={"content-type": "text/plain"}).status == 415
    assert modern(token, "server/discover", headers={"host": "evil.example"}).status == 421


def test_kill_switch(token):
    with override_settings(YUZU_MCP_DISABLE=True):
        r = modern(token, "server/discover")
    assert r.error["code"] == -32005


def test_auth_on_every_request(token, mint):
    assert modern("yuzu_" + "x" * 40, "tools/list").status == 401
    assert modern(token, "tools/list").status == 200


def test_tier_before_rbac_and_read_only(mint):
    seed_builtin_roles()
    ro = mint("viewer", role="Viewer", tier="readonly")
    Agent.objects.create(agent_id="a1", hostname="h", os="linux", arch="x86_64", agent_version="1", connected=True)
    r = modern(ro, "tools/call", {"name": "set_tag", "arguments": {"agent_id": "a1", "key": "k", "value": "v"}})
    assert r.status == 200 and r.error["code"] == -32004 and r.error["data"]["required_tier"]
    nobody = mint("nobody", role=None, tier="operator")
    r = modern(nobody, "tools/call", {"name": "set_tag", "arguments": {"agent_id": "a1", "key": "k", "value": "v"}})
    assert r.error["code"] == -32003
    with override_settings(YUZU_MCP_READ_ONLY=True):
        op = mint("op2", role="Operator", tier="operator")
        r = modern(op, "tools/call", {"name": "set_tag", "arguments": {"agent_id": "a1", "key": "k", "value": "v"}})
        assert r.error["code"] == -32004


def test_tools_list_fitted_like_the_handshake_era(token):
    modern_names = [t["name"] for t in modern(token, "tools/list").json()["result"]["tools"]]
    client = McpClient(token)
    client.initialize()
    legacy_names = [t["name"] for t in client.rpc("tools/list").json()["result"]["tools"]]
    assert modern_names == legacy_names


def test_no_streaming_mode_serves_modern_too(token):
    with override_settings(YUZU_MCP_NO_STREAMING=True):
        r = modern(token, "tools/list")
        assert r.status == 200 and r.json()["result"]["resultType"] == "complete"
        r = modern(token, "ping")
        assert r.status == 404


def test_subscriptions_listen_needs_sse_accept(token):
    r = modern(token, "subscriptions/listen", {"notifications": {"toolsListChanged": True}},
               headers={"accept": "application/json"})
    assert r.status == 406


def test_subscriptions_listen_without_streaming_acks_and_ends(token):
    with override_settings(YUZU_MCP_NO_STREAMING=True):
        r = modern(token, "subscriptions/listen", {"notifications": {"toolsListChanged": True}}, rid="L1")
    assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
    frames = [json.loads(line[len("data: "):]) for line in r.body.decode().splitlines() if line.startswith("data: ")]
    assert frames[0]["method"] == "notifications/subscriptions/acknowledged"
    assert frames[0]["params"]["notifications"] == {}
    assert frames[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L1"
    assert frames[-1] == {"jsonrpc": "2.0", "id": "L1", "result": {
        "resultType": "complete", "_meta": {"io.modelcontextprotocol/subscriptionId": "L1"}}}


# --- approvals through input_required ---------------------------------------------------------------------

URL_ELICITATION = {"elicitation": {"url": {}}}


@pytest.fixture
def supervised(mint):
    seed_builtin_roles()
    agent = Agent.objects.create(agent_id="a1", hostname="h1", os="linux", arch="x86_64", agent_version="1",
                                 connected=True)
    Tag.objects.create(agent=agent, key="role", value="web")
    return mint("sam", role="Operator", tier="supervised")


SET_TAG = {"name": "delete_tag", "arguments": {"agent_id": "a1", "key": "role"}}  # gated for MCP tokens


def test_gated_call_without_url_elicitation_keeps_32006(supervised):
    r = modern(supervised, "tools/call", SET_TAG)
    assert r.status == 200 and r.error["code"] == -32006 and r.error["data"]["approval_id"]
    r = modern(supervised, "tools/call", SET_TAG, capabilities={"elicitation": {"form": {}}})
    assert r.error["code"] == -32006  # form elicitation is not enough; never -32021 either


def input_required(token, params=SET_TAG, **kw):
    r = modern(token, "tools/call", params, capabilities=URL_ELICITATION, **kw)
    assert r.status == 200, r.body
    return r.json()["result"]


def test_gated_call_with_url_elicitation_answers_input_required(supervised):
    result = input_required(supervised)
    assert result["resultType"] == "input_required" and "ttlMs" not in result
    request_ = result["inputRequests"]["approval"]
    assert request_["method"] == "elicitation/create" and request_["params"]["mode"] == "url"
    ticket = Approval.objects.get()
    assert request_["params"]["url"].startswith("http://127.0.0.1:8000/") and ticket.id in request_["params"]["url"]
    assert ticket.status == Approval.PENDING and ticket.requester["client_name"] == "modern-test"
    # pending: the retry asks again (the same ticket), nothing ran
    again = input_required(supervised, {**SET_TAG, "requestState": result["requestState"],
                                        "inputResponses": {"approval": {"action": "accept"}}})
    assert again["resultType"] == "input_required" and Approval.objects.count() == 1
    assert not AuditEvent.objects.filter(action="mcp.delete_tag", result__in=("success", "approved")).exists()


def approve(ticket_id):
    Approval.objects.filter(pk=ticket_id).update(status=Approval.APPROVED, reviewed_by="rita", reviewed_at=timezone.now())


def test_approved_retry_runs_exactly_once(supervised):
    state = input_required(supervised)["requestState"]
    approve(Approval.objects.get().id)
    done = modern(supervised, "tools/call", {**SET_TAG, "requestState": state,
                                             "inputResponses": {"approval": {"action": "accept"}}},
                  capabilities=URL_ELICITATION)
    assert done.status == 200, done.body
    result = done.json()["result"]
    assert result["resultType"] == "complete" and not result.get("isError"), result
    assert result["structuredContent"]["deleted"] is True and not Tag.objects.filter(key="role").exists()
    assert Approval.objects.get().consumed_at is not None
    assert AuditEvent.objects.filter(action="mcp.delete_tag", result="approved").count() == 1
    replay = modern(supervised, "tools/call", {**SET_TAG, "requestState": state}, capabilities=URL_ELICITATION, rid=9)
    assert replay.error["code"] == -32003 and "already used" in replay.error["message"]
    assert AuditEvent.objects.filter(action="mcp.delete_tag", result="approved").count() == 1


def test_forged_and_foreign_request_state_refused(supervised, mint):
    state = input_required(supervised)["requestState"]
    ticket = Approval.objects.get()
    approve(ticket.id)
    forged = signing.dumps({"a": ticket.id, "p": "u1.t1", "c": "v1", "t": "delete_tag", "d": "0"}, salt="other")
    tampered = state[:-3] + ("AAA" if not state.endswith("AAA") else "BBB")
    other_args = {"name": "delete_tag", "arguments": {"agent_id": "a1", "key": "env"}}
    cases = [({**SET_TAG, "requestState": forged}, supervised),
             ({**SET_TAG, "requestState": tampered}, supervised),
             ({**SET_TAG, "requestState": "not a state"}, supervised),
             ({**other_args, "requestState": state}, supervised),
             ({**SET_TAG, "requestState": state}, mint("eve", role="Operator", tier="supervised"))]
    for params, tok in cases:
        r = modern(tok, "tools/call", params, capabilities=URL_ELICITATION)
        assert r.status == 200 and r.error["code"] == -32003 and r.error["message"] == mrtr.INVALID_STATE, params
    assert Approval.objects.get().consumed_at is None  # nothing was consumed by any of them
    assert AuditEvent.objects.filter(action="mcp.delete_tag", detail__startswith="request_state_invalid").count() == 5


def test_expired_request_state_refused(supervised, monkeypatch):
    state = input_required(supervised)["requestState"]
    monkeypatch.setattr(mrtr, "STATE_MAX_AGE", -1)
    r = modern(supervised, "tools/call", {**SET_TAG, "requestState": state}, capabilities=URL_ELICITATION)
    assert r.error["code"] == -32003 and r.error["message"] == mrtr.INVALID_STATE


def test_declined_elicitation_keeps_ticket(supervised):
    state = input_required(supervised)["requestState"]
    r = modern(supervised, "tools/call", {**SET_TAG, "requestState": state,
                                          "inputResponses": {"approval": {"action": "decline"}}},
               capabilities=URL_ELICITATION)
    assert r.error["code"] == -32003 and Approval.objects.get().status == Approval.PENDING


# --- long-running work: the streamed response always ends with a response ---------------------------------

def sse_frames(body):
    return [json.loads(line[len("data: "):]) for line in body.decode().splitlines() if line.startswith("data: ")]


def test_streamed_call_at_the_cap_ends_with_a_result_carrying_execution_id(token, monkeypatch):
    """No agent ever answers (the agent row exists, no process behind it): at the response cap the client gets
    a success-shaped result naming the execution, never a silent close that would make it re-send the call."""
    from mcp.streaming import follower  # deferred: patched for this test only

    monkeypatch.setattr(follower, "RESPONSE_CAP_SECONDS", 1)
    Agent.objects.create(agent_id="a1", hostname="h1", os="linux", arch="x86_64", agent_version="1", connected=True)
    r = modern(token, "tools/call", {"name": "execute_instruction", "_meta": {"progressToken": "p1"},
                                     "arguments": {"plugin": "os", "action": "info", "agent_ids": ["a1"]}},
               rid="x1")
    assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
    assert "id:" not in r.body.decode()  # no event ids, no resumption in 2026-07-28
    frames = sse_frames(r.body)
    progress = [f for f in frames if f.get("method") == "notifications/progress"]
    assert progress and progress[0]["params"]["progress"] == 0 and progress[0]["params"]["progressToken"] == "p1"
    last = frames[-1]
    assert last["id"] == "x1" and last["result"]["resultType"] == "complete"
    structured = last["result"]["structuredContent"]
    assert structured["execution_id"] and structured["still_running"] is True and "get_execution_status" in \
        structured["note"]
    assert last["result"]["_meta"][SERVER_INFO]["name"] == "yuzu-server"


def test_streamed_call_with_nothing_to_follow_answers_json(token):
    r = modern(token, "tools/call", {"name": "execute_instruction", "_meta": {"progressToken": "p1"},
                                     "arguments": {"plugin": "os", "action": "info", "agent_ids": ["nobody"]}})
    assert r.headers["content-type"] == "application/json"


def test_progress_token_without_sse_accept_is_plain_json(token):
    Agent.objects.create(agent_id="a1", hostname="h1", os="linux", arch="x86_64", agent_version="1", connected=True)
    r = modern(token, "tools/call", {"name": "execute_instruction", "_meta": {"progressToken": "p1"},
                                     "arguments": {"plugin": "os", "action": "info", "agent_ids": ["a1"]}},
               headers={"accept": "application/json"})
    assert r.status == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["result"]["structuredContent"]["execution_id"]


# --- the Tasks extension for fleet executions ---------------------------------------------------------------

TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
EXECUTE = {"name": "execute_instruction", "arguments": {"plugin": "os", "action": "info", "agent_ids": ["a1"]}}


@pytest.fixture
def task(token):
    Agent.objects.create(agent_id="a1", hostname="h1", os="linux", arch="x86_64", agent_version="1", connected=True)
    r = modern(token, "tools/call", EXECUTE, capabilities=TASKS)
    assert r.status == 200, r.body
    return r.json()["result"]


def test_execution_as_a_task(token, task):
    assert task["resultType"] == "task" and task["status"] == "working"
    assert task["pollIntervalMs"] == 2000 and task["ttlMs"] > 0 and task["createdAt"].endswith("Z")
    assert task["statusMessage"] == "0/1 agents responded"
    assert task["_meta"][SERVER_INFO]["name"] == "yuzu-server"
    assert AuditEvent.objects.filter(principal="alice", action="mcp.execute_instruction", result="success").exists()
    got = modern(token, "tasks/get", {"taskId": task["taskId"]}, capabilities=TASKS).json()["result"]
    assert got["resultType"] == "complete" and got["status"] == "working" and "result" not in got
    execution = Execution.objects.get()
    Execution.objects.filter(pk=execution.pk).update(status="succeeded", agents_responded=1, agents_success=1)
    got = modern(token, "tasks/get", {"taskId": task["taskId"]}, capabilities=TASKS).json()["result"]
    assert got["status"] == "completed" and got["result"]["structuredContent"]["id"] == execution.pk
    assert got["result"]["structuredContent"]["status"] == "succeeded"


def test_task_cancel_stops_the_execution(token, task):
    r = modern(token, "tasks/cancel", {"taskId": task["taskId"]}, capabilities=TASKS)
    assert r.status == 200 and r.json()["result"]["resultType"] == "complete"
    assert Execution.objects.get().status == "cancelled"
    got = modern(token, "tasks/get", {"taskId": task["taskId"]}, capabilities=TASKS).json()["result"]
    assert got["status"] == "cancelled"
    assert modern(token, "tasks/update", {"taskId": task["taskId"], "inputResponses": {}},
                  capabilities=TASKS).json()["result"] == {
        "resultType": "complete", "_meta": {SERVER_INFO: {"name": "yuzu-server", "version": "0.1.0"}}}


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_tasks_without_the_extension_is_32021(token, task, method):
    r = modern(token, method, {"taskId": task["taskId"]})
    assert r.status == 400 and r.error["code"] == -32021
    assert r.error["data"]["requiredCapabilities"] == {"extensions": {"io.modelcontextprotocol/tasks": {}}}


def test_another_principals_task_reads_like_an_unknown_one(token, task, mint):
    other = mint("mallory", role="Operator", tier="operator")
    forged = task["taskId"][:-4] + ("AAAA" if not task["taskId"].endswith("AAAA") else "BBBB")
    answers = [modern(other, "tasks/get", {"taskId": task["taskId"]}, capabilities=TASKS),
               modern(token, "tasks/get", {"taskId": forged}, capabilities=TASKS),
               modern(token, "tasks/get", {"taskId": "nope"}, capabilities=TASKS),
               modern(other, "tasks/cancel", {"taskId": task["taskId"]}, capabilities=TASKS)]
    assert {(a.status, a.error["code"], a.error["message"]) for a in answers} == {(400, -32602, "Unknown task")}
    assert Execution.objects.get().status == "running"  # mallory's cancel did nothing


def test_task_headers_are_checked(token, task):
    r = modern(token, "tasks/get", {"taskId": task["taskId"]}, capabilities=TASKS, headers={"mcp-name": "other"})
    assert r.error["code"] == -32020


def test_without_the_extension_the_call_answers_its_receipt(token):
    Agent.objects.create(agent_id="a1", hostname="h1", os="linux", arch="x86_64", agent_version="1", connected=True)
    result = modern(token, "tools/call", EXECUTE).json()["result"]
    assert result["resultType"] == "complete" and result["structuredContent"]["execution_id"]


def test_discover_advertises_tasks(token):
    caps = modern(token, "server/discover").json()["result"]["capabilities"]
    assert caps["extensions"] == {"io.modelcontextprotocol/tasks": {}}


def test_body_bounds_apply_to_modern_requests(token):
    big = {"name": "classify_operational_question", "arguments": {"question": "q" * (4 * 1024 * 1024)}}
    r = modern(token, "tools/call", big)
    assert r.status == 413
    r = modern(token, "server/discover", headers={"content-length": None})
    assert r.status == 411
    r = modern(token, "server/discover", headers={"content-encoding": "gzip"})
    assert r.status == 415


def test_batches_and_framing_errors_echo_nothing(token):
    r = request(body=[{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta()}}],
                headers={"authorization": f"Bearer {token}", "mcp-protocol-version": V, "mcp-method": "tools/list"})
    assert r.status == 400 and r.error["code"] == -32600
    r = request(body=b"{not json", headers={"authorization": f"Bearer {token}", "mcp-protocol-version": V})
    assert r.status == 400 and r.error["code"] == -32700


# --- the Tasks extension for bundles -------------------------------------------------------------------------

BUNDLE = {"name": "execute_bundle", "arguments": {"agent_id": "a1", "steps": [
    {"plugin": "os", "action": "info"}, {"plugin": "os", "action": "info"}]}}


@pytest.fixture
def bundle_task(token):
    Agent.objects.create(agent_id="a1", hostname="h1", os="linux", arch="x86_64", agent_version="1", connected=True)
    r = modern(token, "tools/call", BUNDLE, capabilities=TASKS)
    assert r.status == 200, r.body
    return r.json()["result"]


def test_bundle_as_a_task(token, bundle_task):
    assert bundle_task["resultType"] == "task" and bundle_task["status"] == "working"
    assert bundle_task["statusMessage"] == "0/2 steps finished"
    assert Execution.objects.filter(bundle_id__startswith="bundle-").count() == 2
    got = modern(token, "tasks/get", {"taskId": bundle_task["taskId"]}, capabilities=TASKS).json()["result"]
    assert got["status"] == "working" and got["statusMessage"] == "0/2 steps finished" and "result" not in got
    Execution.objects.update(status="succeeded", agents_responded=1, agents_success=1)
    got = modern(token, "tasks/get", {"taskId": bundle_task["taskId"]}, capabilities=TASKS).json()["result"]
    assert got["status"] == "completed"
    structured = got["result"]["structuredContent"]
    assert structured["complete"] is True and structured["expected"] == 2 and len(structured["steps"]) == 2


def test_bundle_task_cancel_stops_dispatch_of_steps_not_started(token, bundle_task):
    from fleet.models import AgentExecStatus  # deferred: only this test reads the per-agent rows
    first, second = Execution.objects.order_by("bundle_step")
    Execution.objects.filter(pk=first.pk).update(status="succeeded", agents_responded=1, agents_success=1)
    AgentExecStatus.objects.filter(execution=first).update(status="success")
    # the second step's dispatch still queued (the eager test dispatch already sent it: put it back)
    AgentExecStatus.objects.filter(execution=second).update(status="pending", attempts=0, last_sent_at=None)
    r = modern(token, "tasks/cancel", {"taskId": bundle_task["taskId"]}, capabilities=TASKS)
    assert r.status == 200 and r.json()["result"]["resultType"] == "complete"
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == "succeeded" and second.status == "cancelled"  # the finished step is left alone
    assert AgentExecStatus.objects.get(execution=second).error_detail == "cancelled before dispatch"
    got = modern(token, "tasks/get", {"taskId": bundle_task["taskId"]}, capabilities=TASKS).json()["result"]
    assert got["status"] == "cancelled"
    assert AuditEvent.objects.filter(principal="alice", action="bundle.cancel", result="success").exists()


def test_another_principals_bundle_task_reads_like_an_unknown_one(token, bundle_task, mint):
    other = mint("mallory", role="Operator", tier="operator")
    for method in ("tasks/get", "tasks/cancel"):
        r = modern(other, method, {"taskId": bundle_task["taskId"]}, capabilities=TASKS)
        assert (r.status, r.error["code"], r.error["message"]) == (400, -32602, "Unknown task")
    assert set(Execution.objects.values_list("status", flat=True)) == {"running"}


def test_bundle_without_the_extension_answers_its_receipt(token):
    Agent.objects.create(agent_id="a1", hostname="h1", os="linux", arch="x86_64", agent_version="1", connected=True)
    result = modern(token, "tools/call", BUNDLE).json()["result"]
    assert result["resultType"] == "complete" and result["structuredContent"]["bundle_id"].startswith("bundle-")


# --- per-token caps: concurrent tasks, modern requests in flight ---------------------------------------------

@pytest.fixture(autouse=True)
def empty_task_ledger():
    from mcp.task_ledger import ledger  # deferred: the process-wide store, emptied around each test
    ledger().clear()
    yield
    ledger().clear()


def test_task_cap_refuses_before_the_work_exists(token, mint):
    Agent.objects.create(agent_id="a1", hostname="h1", os="linux", arch="x86_64", agent_version="1", connected=True)
    with override_settings(YUZU_MCP_MAX_TASKS=2):
        first = modern(token, "tools/call", EXECUTE, capabilities=TASKS).json()["result"]
        assert modern(token, "tools/call", BUNDLE, capabilities=TASKS).json()["result"]["resultType"] == "task"
        before = Execution.objects.count()
        r = modern(token, "tools/call", EXECUTE, capabilities=TASKS)
        assert r.status == 429 and r.error["code"] == -32010 and r.headers["retry-after"] == "5"
        assert r.error["data"]["reason"] == "task_cap" and r.error["data"]["limit"] == 2
        assert r.error["data"]["retry_after_ms"] == 5000 and "tasks/cancel" in r.error["data"]["remediation"]
        assert Execution.objects.count() == before  # nothing dispatched
        assert AuditEvent.objects.filter(action="mcp.execute_instruction", result="denied",
                                         detail__startswith="task_cap").count() == 1
        # another token has its own cap; a client without the extension is not counted
        other = mint("bob", role="Operator", tier="operator")
        assert modern(other, "tools/call", EXECUTE, capabilities=TASKS).json()["result"]["resultType"] == "task"
        assert modern(token, "tools/call", EXECUTE).json()["result"]["resultType"] == "complete"
        # a task that ends frees its slot (seen at the cap, without a tasks/get)
        assert first["status"] == "working"
        Execution.objects.filter(bundle_id="").update(status="succeeded")  # the first task's execution ends
        again = modern(token, "tools/call", EXECUTE, capabilities=TASKS)
        assert again.status == 200 and again.json()["result"]["resultType"] == "task", again.body


def test_task_cap_slot_given_back_when_the_call_is_not_a_task(token):
    with override_settings(YUZU_MCP_MAX_TASKS=1):
        for _ in range(3):  # no agent reached: answered at once, never a task, never counted
            r = modern(token, "tools/call", {**EXECUTE, "arguments": {**EXECUTE["arguments"], "agent_ids": ["none"]}},
                       capabilities=TASKS)
            assert r.json()["result"]["resultType"] == "complete"
        r = modern(token, "tools/call", {"name": "execute_instruction", "arguments": {"plugin": 5}},
                   capabilities=TASKS)
        assert r.error["code"] == -32602
        Agent.objects.create(agent_id="a1", hostname="h1", os="linux", arch="x86_64", agent_version="1",
                             connected=True)
        assert modern(token, "tools/call", EXECUTE, capabilities=TASKS).json()["result"]["resultType"] == "task"


def test_inflight_cap_per_token(token, mint):
    from mcp import modern_transport  # deferred: its in-process budget is held here as a concurrent call would

    key = modern_transport.credential_key({"authorization": f"Bearer {token}"})
    with override_settings(YUZU_MCP_MODERN_INFLIGHT=1):
        assert modern_transport.inflight.acquire(key, 1, modern_transport.INFLIGHT_GLOBAL) is None
        try:
            r = modern(token, "tools/list", rid="busy")
            assert r.status == 429 and r.error["code"] == -32010 and r.json()["id"] == "busy"
            assert r.error["data"]["reason"] == "inflight_cap" and r.headers["retry-after"] == "1"
            other = mint("bob", role="Operator", tier="operator")
            assert modern(other, "tools/list").status == 200  # per token
        finally:
            modern_transport.inflight.release(key)
        assert modern(token, "tools/list").status == 200
        assert modern(token, "tools/list").status == 200  # each answered request gave its slot back
    assert key not in modern_transport.inflight.per_principal


def test_inflight_cap_per_user(mint):
    """A user's tokens together hold at most INFLIGHT_USER_FACTOR tokens' worth of modern requests in flight: minting
    more tokens gives no more. Another user is unaffected; the slots come back."""
    from django.contrib.auth import get_user_model

    from mcp import modern_transport  # deferred: its in-process budget is held here as concurrent calls would
    from yuzu.rbac import Principal

    first = mint("carol", role="Operator", tier="operator")
    second = mint("carol", role=None, tier="operator")
    assert modern(second, "tools/list").status == 200  # this process has seen the token authenticate
    user = Principal.key_prefix(get_user_model().objects.get(username="carol").pk)
    with override_settings(YUZU_MCP_MODERN_INFLIGHT=1):
        limit = modern_transport.INFLIGHT_USER_FACTOR
        for _ in range(limit):  # carol's other tokens' requests, in flight
            assert modern_transport.inflight_users.acquire(user, limit, modern_transport.INFLIGHT_GLOBAL) is None
        try:
            r = modern(second, "tools/list", rid="busy")
            assert r.status == 429 and r.error["code"] == -32010 and r.json()["id"] == "busy"
            assert r.error["data"]["reason"] == "inflight_user_cap" and r.error["data"]["limit"] == limit
            assert r.headers["retry-after"] == "1"
            assert modern(mint("bob", role="Operator", tier="operator"), "tools/list").status == 200
        finally:
            for _ in range(limit):
                modern_transport.inflight_users.release(user)
        assert modern(second, "tools/list").status == 200 and modern(first, "tools/list").status == 200
    assert not modern_transport.inflight_users.per_principal and not modern_transport.inflight.per_principal


@pytest.mark.parametrize("variant", [
    {"authorization": None, "x-yuzu-token": "{token}"},  # the other header the token may travel in
    {"authorization": "bearer   {token}  "},  # the scheme's case and blanks, which authentication ignores
    {"cookie": "sessionid=anything"},  # a cookie authentication never reads beside a token
])
def test_inflight_cap_is_per_token_however_it_is_presented(token, variant):
    """The cap counts the token, not the bytes of its headers: presenting the same token another way (as
    authentication accepts it) is no fresh budget."""
    from mcp import modern_transport  # deferred: its in-process budget is held here as a concurrent call would

    key = modern_transport.credential_key({"authorization": f"Bearer {token}"})
    headers = {k: v.format(token=token) if v else v for k, v in variant.items()}
    with override_settings(YUZU_MCP_MODERN_INFLIGHT=1):
        assert modern_transport.inflight.acquire(key, 1, modern_transport.INFLIGHT_GLOBAL) is None
        try:
            r = modern(token, "tools/list", headers=headers)
            assert r.status == 429 and r.error["data"]["reason"] == "inflight_cap", r.body
        finally:
            modern_transport.inflight.release(key)
        assert modern(token, "tools/list", headers=headers).status == 200


# --- the decision: an unknown version inside a handshake-era session keeps -32009 (docs/mcp.md "Eras") --------

def test_unknown_version_in_a_legacy_session_is_32009_and_outside_one_32022(token):
    client = McpClient(token)
    client.initialize()
    inside = client.rpc("tools/list", headers={"mcp-protocol-version": "2099-01-01"})
    assert inside.status == 400 and inside.error["code"] == -32009
    assert inside.error["data"]["supported"] == ["2025-11-25", "2025-06-18"]  # what the session may use
    outside = request(body={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                      headers={"authorization": f"Bearer {token}", "mcp-protocol-version": "2099-01-01"})
    assert outside.status == 400 and outside.error["code"] == -32022 and outside.error["data"]["supported"] == [V]
    # a stray (unknown) session id does not make a modern request a legacy one, nor change its answer
    stray = modern(token, "tools/list", headers={"mcp-session-id": "f" * 32})
    assert stray.status == 200
    with override_settings(YUZU_MCP_NO_STREAMING=True):  # no sessions at all: every unknown version is -32022
        r = request(body={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                    headers={"authorization": f"Bearer {token}", "mcp-protocol-version": "2099-01-01",
                             "mcp-session-id": "f" * 32})
        assert r.status == 400 and r.error["code"] == -32022
