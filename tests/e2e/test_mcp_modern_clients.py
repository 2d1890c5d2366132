"""Both eras end to end with the official clients (issue 14): the MCP Python SDK (`mcp` 2.3.0, .venv-mcp) in
``mode="auto"`` (which now lands on 2026-07-28), pinned ``"2026-07-28"`` and ``"legacy"`` run one script —
lists, a resource, a read tool, an execution with progress from real agents, the approval flow — against a real
daphne; the bridge's delegation flow runs in each mode too."""

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from approvals.models import Approval
from bridge.models import Turn as BridgeTurn
from bridge.testing.fixtures import bridge, needs_tmux, stack  # noqa: F401  (fixtures)
from fleet.models import Agent, Execution, ManagementGroup, Tag
from tests.support.official_client import DRIVE, MCP_PY
from yuzu.models import ApiToken, AuditEvent, hash_secret
from yuzu.testing import ROOT, wait_until

from .test_mcp_official_clients import client_log
from .test_streaming_e2e import (  # noqa: F401  (fleet: the fixture)
    Http,
    client_env,
    fleet,
    progress_of,
    progress_stack,
    sleep_args,
)

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

MODERN = "2026-07-28"
MODES = {"auto": MODERN, MODERN: MODERN, "legacy": "2025-11-25"}


def run_eras(server, token, mode, tmp_path, agent_id):
    asked, approved = tmp_path / f"asked-{mode}", tmp_path / f"approved-{mode}"
    cmd = [str(MCP_PY), str(DRIVE), "--url", server.mcp, "--token", token, "--mode", mode, "--scenario", "eras",
           "--param", f"agent_id={agent_id}", "--param", f"argv={sleep_args()['params']['argv']}",
           "--param", f"asked={asked}", "--param", f"approved={approved}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=client_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 120
    while not asked.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    approved_ids = []
    if asked.exists():  # a human approves the pending ticket (another person than the caller)
        for ticket in Approval.objects.filter(status=Approval.PENDING):
            Approval.objects.filter(pk=ticket.pk).update(status=Approval.APPROVED, reviewed_by="rita",
                                                         reviewed_at=timezone.now())
            approved_ids.append(ticket.pk)
        approved.touch()
    stdout, stderr = proc.communicate(timeout=180)
    try:
        obs = json.loads(stdout)
    except ValueError:
        pytest.fail(f"drive.py printed no JSON (exit {proc.returncode}):\n{stdout[-2000:]}\n{stderr[-4000:]}")
    assert "fatal" not in obs, f"{mode}: {obs['fatal']}\n{server.log.name}"
    return obs, approved_ids


def test_python_sdk_in_every_mode(fleet, mint, tmp_path):  # noqa: F811
    if not MCP_PY.exists():
        pytest.fail(f"{MCP_PY} is missing: run `make test` (it builds .venv-mcp)")
    server = progress_stack(fleet)  # 7 targets: a swarm of 5, two real agents sleeping 1 s and 2 s
    token = mint("eras", role="Operator", tier="operator")  # delete_tag is approval-gated for MCP tokens
    target = Agent.objects.filter(connected=True).order_by("agent_id").first().agent_id
    for mode, era in MODES.items():
        Tag.objects.update_or_create(agent_id=target, key="role", defaults={"value": "web"})
        obs, approved = run_eras(server, token, mode, tmp_path, target)
        where = f"mode={mode}"

        assert obs["protocol_version"] == era, where
        http = obs["http"]
        assert all(e["authorized"] for e in http), where
        if era == MODERN:
            assert not any(e["rpc"] == "initialize" for e in http), where
            assert not any(e["session"] or e.get("session_header") for e in http), where
            posts = [e for e in http if e["method"] == "POST"]
            assert all(e["protocol_version"] == MODERN and e["mcp_method"] == e["rpc"] for e in posts), where
            assert not any(e["method"] in ("GET", "DELETE") for e in http), where
            if mode == "auto":
                assert http[0]["rpc"] == "server/discover" and http[0]["status"] == 200, where
                assert obs["server_info"]["name"] == "yuzu-server", where
                assert "classify_operational_question" in obs["instructions"], where
            else:
                assert not any(e["rpc"] == "server/discover" for e in http), where  # a pin sends no probe
        else:
            assert [e["rpc"] for e in http[:2]] == ["initialize", "notifications/initialized"], where

        lists = obs["lists"]
        assert "list_agents" in lists["tools"]["names"] and lists["tools"]["pages"] == 1, where
        assert "yuzu://about" in lists["resources"]["uris"], where
        assert lists["resource_templates"]["uri_templates"] == [], where
        assert {"investigate_agent", "fleet_overview"} <= set(lists["prompts"]["names"]), where
        assert obs["resources_read"]["yuzu://about"]["contents"][0]["mimeType"] == "text/markdown", where
        missing = obs["resources_read"]["missing_resource"]["error"]
        assert missing["code"] == (-32602 if era == MODERN else -32002), where
        assert missing["data"]["uri"] == "yuzu://no-such-resource", where
        assert obs["prompts_got"]["investigate_agent"]["messages"][0]["role"] == "user", where

        calls = obs["calls"]
        assert calls["list_agents"]["schema_valid"] and calls["list_agents"]["structured"]["count"] == 7, where
        assert calls["unknown_tool"]["error"]["code"] == -32602, where

        execution = calls["execution"]
        assert "error" not in execution and execution["is_error"] is False, (where, execution)
        values = [p["progress"] for p in execution["progress"]]
        assert values[0] == 0 and values[-1] == 7 and all(a < b for a, b in zip(values, values[1:], strict=False)), (where, values)
        assert execution["structured"]["status"] == "succeeded", (where, execution["structured"])
        assert execution["structured"]["agents_responded"] == 7, where
        streamed = [e for e in http if e["rpc"] == "tools/call" and e.get("content_type") == "text/event-stream"]
        assert len(streamed) == 1, (where, http)

        gated = calls["gated"]
        assert "error" not in gated and gated["structured"]["deleted"] is True, (where, gated)
        assert len(approved) == 1, where
        ticket = Approval.objects.get(pk=approved[0])
        assert ticket.consumed_at is not None and ticket.requester["token_name"], where
        if era == MODERN:
            assert gated["via"] == "elicitation", where
            elicitation = obs["elicitations"][0]
            assert elicitation["mode"] == "url" and ticket.pk in elicitation["url"], (where, elicitation)
        else:
            assert gated["via"] == "ticket" and gated["first"]["error"]["data"]["approval_id"] == ticket.pk, where
        assert not Tag.objects.filter(agent_id=target, key="role").exists(), where
        assert client_log(obs) == [], (where, obs["log"])

    rows = AuditEvent.objects.filter(principal="eras")
    assert rows.filter(action="mcp.delete_tag", result="approved").count() == 3
    assert rows.filter(action="mcp.execute_instruction", result="success").count() == 3
    assert rows.filter(action="mcp.session.open").count() == 1  # only the legacy run opened a session


BRIDGE_DRIVE = DRIVE.parent / "bridge_drive.py"


@needs_tmux
@pytest.mark.parametrize("mode", list(MODES))
def test_bridge_delegation_in_every_mode(bridge, mint, mode):  # noqa: F811
    """The bridge's blocking rendezvous tools (bridge_send waits for the worker's reply) for a modern client too."""
    token = mint("alice", role="Operator")
    proc = subprocess.run([str(MCP_PY), str(BRIDGE_DRIVE), "--url", bridge.bridge_url, "--token", token,
                           "--flow", "both", "--mode", mode], capture_output=True, text=True, timeout=150, cwd="/")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:], bridge.logs())
    obs = json.loads(proc.stdout)
    assert obs["protocol_version"] == MODES[mode]
    if mode != MODERN:  # a pinned client sends no probe, so it learns no server name
        assert obs["server_info"]["name"] == "yuzu-bridge"
    calls = {c["as"]: c for c in obs["calls"]}
    for rec in calls.values():
        assert not rec.get("error") and not rec["is_error"], rec
        assert rec.get("schema_valid", True), rec
    assert calls["delegation"]["structured"]["outcome"] == "reply"
    assert calls["delegation"]["structured"]["text"] == "from the official client"
    q = calls["question"]["structured"]
    assert q["outcome"] == "question" and q["text"] == "which branch?"
    assert calls["answer"]["structured"]["text"] == "answered:main"
    assert calls["bridge_stop"]["structured"]["wasRunning"] is True


# --- raw modern HTTP against a live daphne: closing the response cancels the request, not the fleet work ------

def modern_body(rid, method, params=None):
    params = dict(params or {})
    params["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                       "io.modelcontextprotocol/clientCapabilities": {}, **params.get("_meta", {})}
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def modern_post(port, token, rid, method, params=None, accept="application/json, text/event-stream",
                path="/mcp/v1/"):
    params = dict(params or {})
    params["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                       "io.modelcontextprotocol/clientCapabilities": {}, **params.get("_meta", {})}
    headers = {"authorization": f"Bearer {token}", "mcp-protocol-version": MODERN, "mcp-method": method,
               "accept": accept}
    if method == "tools/call":
        headers["mcp-name"] = params["name"]
    elif method.startswith("tasks/"):
        headers["mcp-name"] = params["taskId"]
    return Http(port, "POST", path, headers=headers, body={"jsonrpc": "2.0", "id": rid, "method": method,
                                                           "params": params})


def test_dropping_a_modern_stream_cancels_the_request_not_the_work(fleet, mint):  # noqa: F811
    server = fleet.server()
    fleet.worker()
    fleet.agents(server, [1, 3])
    fleet.wait_connected()
    token = mint("modern-drop", role="Operator", tier="operator")
    r = modern_post(server.port, token, 5, "tools/call", {"name": "execute_instruction",
                                                          "arguments": sleep_args(), "_meta": {"progressToken": "d"}})
    assert r.is_sse and "mcp-session-id" not in r.headers
    r.until(lambda f: progress_of(f) == [0])
    eid = r.frames()[0]["params"]["_meta"]["yuzu.execution_id"]
    r.drop()
    row = wait_until(lambda: AuditEvent.objects.filter(principal="modern-drop", action="mcp.execute_instruction",
                                                       result="cancelled").first(), 10, what="the cancel audit row")
    assert f"execution_id={eid}" in row.detail and "client_disconnect" in row.detail
    done = wait_until(lambda: Execution.objects.filter(pk=eid, status="succeeded").first(), 20,
                      what="the execution to finish anyway")
    assert done.agents_responded == 2


def test_modern_stream_reports_progress_then_the_result(fleet, mint):  # noqa: F811
    server = fleet.server()
    fleet.worker()
    fleet.agents(server, [1, 2])
    fleet.wait_connected()
    token = mint("modern-progress", role="Operator", tier="operator")
    r = modern_post(server.port, token, "p", "tools/call", {"name": "execute_instruction",
                                                            "arguments": sleep_args(), "_meta": {"progressToken": 7}})
    r.to_eof(30)
    frames = r.frames()
    assert progress_of(frames) == [0, 1, 2]
    assert all(f["params"]["progressToken"] == 7 for f in frames[:-1])
    final = frames[-1]
    assert final["id"] == "p" and final["result"]["resultType"] == "complete"
    assert final["result"]["structuredContent"]["status"] == "succeeded"
    assert not any(e.get("id") for e in r.events())  # no SSE event ids in 2026-07-28


def test_listen_stream_acknowledges_beats_and_ends_on_revocation(fleet, mint):  # noqa: F811
    server = fleet.server()
    token = mint("modern-listen", role="Operator", tier="operator")
    r = modern_post(server.port, token, "L", "subscriptions/listen", {"notifications": {"toolsListChanged": True}})
    assert r.is_sse
    ack = r.until(lambda f: len(f) >= 1)[0]
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"] == {"toolsListChanged": True}
    assert ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L"
    deadline = time.monotonic() + 10
    while b": heartbeat" not in r.body and time.monotonic() < deadline:
        r.pump(0.5)
    assert b": heartbeat" in r.body
    # the per-principal cap: 4 listen streams (the GET budget), the fifth is refused before it opens
    more = [modern_post(server.port, token, f"L{i}", "subscriptions/listen") for i in range(3)]
    refused = modern_post(server.port, token, "L9", "subscriptions/listen")
    assert refused.status == 429 and refused.json()["error"]["code"] == -32012
    ApiToken.objects.filter(token_hash=hash_secret(token)).update(revoked_at=timezone.now())
    r.to_eof(10)
    assert r.frames()[-1] == {"jsonrpc": "2.0", "id": "L", "result": {
        "resultType": "complete", "_meta": {"io.modelcontextprotocol/subscriptionId": "L"}}}
    for m in more:
        m.drop()


TASKS = {"io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}


def test_listen_stream_reports_a_tasks_status_until_it_ends(fleet, mint):  # noqa: F811
    """Tasks on subscriptions/listen: the stream follows the caller's own task ids (another token's, or a forged
    one, is left out of the acknowledgement), reports each as notifications/tasks when its execution moves, and
    the last report of an ended task carries its result — no polling."""
    server = fleet.server()
    fleet.worker()
    fleet.agents(server, [1, 2])
    fleet.wait_connected()
    token = mint("modern-tasks", role="Operator", tier="operator")
    other = mint("modern-other", role="Operator", tier="operator")
    created = modern_post(server.port, token, 1, "tools/call", {"name": "execute_instruction", "arguments": sleep_args(
        'sleep "$YUZU_E2E_DELAY"; sleep 1'), "_meta": TASKS}).json()["result"]
    assert created["resultType"] == "task" and created["status"] == "working", created
    foreign = modern_post(server.port, other, 2, "tools/call", {"name": "execute_instruction",
                                                                "arguments": sleep_args(), "_meta": TASKS})
    foreign_id = foreign.json()["result"]["taskId"]
    r = modern_post(server.port, token, "L", "subscriptions/listen", {
        "notifications": {"taskIds": [created["taskId"], foreign_id, "forged"]}, "_meta": TASKS})
    assert r.is_sse
    ack = r.until(lambda f: len(f) >= 1)[0]
    assert ack["params"]["notifications"] == {"taskIds": [created["taskId"]]}
    frames = r.until(lambda f: any(x.get("method") == "notifications/tasks" and x["params"]["status"] != "working"
                                   for x in f), 40)
    reports = [x["params"] for x in frames if x.get("method") == "notifications/tasks"]
    assert all(t["taskId"] == created["taskId"] for t in reports), reports
    assert all(t["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L" for t in reports)
    assert reports[0]["status"] == "working" and reports[0]["statusMessage"].endswith("/2 agents responded")
    assert reports[-1]["status"] == "completed" and reports[-1]["statusMessage"] == "2/2 agents responded"
    assert reports[-1]["result"]["structuredContent"]["status"] == "succeeded"
    assert len({t["statusMessage"] for t in reports}) == len(reports)  # a report only when something moved
    # the ended task is no longer followed: the stream goes on with heartbeats only
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        r.pump(0.5)
    assert len([x for x in r.frames() if x.get("method") == "notifications/tasks"]) == len(reports)
    r.drop()


@needs_tmux
def test_bridge_resend_with_the_same_turn_id_is_idempotent(bridge, mint):  # noqa: F811
    """A 2026-07-28 client whose bridge_send response dropped re-sends it (the spec's rule): the answer reaches
    the worker once, and the re-send gets the turn's outcome."""
    token = mint("alice", role="Operator")
    port = urlsplit(bridge.bridge_url).port

    def call(rid, name, args):
        r = modern_post(port, token, rid, "tools/call", {"name": name, "arguments": args}, path="/mcp/bridge/")
        body = r.json()
        assert "result" in body, body
        return body["result"]["structuredContent"]

    sid = call(1, "bridge_spawn", {"profile": "standin"})["sessionId"]
    question = call(2, "bridge_send", {"content": "ask:which branch?", "sessionId": sid, "timeoutMs": 30000})
    assert question["outcome"] == "question"
    turn = question["turnId"]
    answer = {"name": "bridge_send", "arguments": {"content": "main", "sessionId": sid, "turnId": turn,
                                                   "timeoutMs": 30000}}
    body = json.dumps(modern_body(3, "tools/call", answer)).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall((f"POST /mcp/bridge/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nMCP-Protocol-Version: {MODERN}"
                  f"\r\nMcp-Method: tools/call\r\nMcp-Name: bridge_send\r\n\r\n").encode() + body)
    wait_until(lambda: BridgeTurn.objects.filter(turn_id=turn, answer_seq=1).exists(), 10, what="the answer")
    sock.close()  # the response is lost (the worker may have replied before the server saw the drop, or after)
    wait_until(lambda: BridgeTurn.objects.filter(turn_id=turn, state=BridgeTurn.State.REPLIED).exists(), 15,
               what="the worker's reply")
    again = call(4, "bridge_send", answer["arguments"])
    assert again["outcome"] == "reply" and again["text"] == "answered:main" and again["turnId"] == turn, again
    t = BridgeTurn.objects.get(turn_id=turn)
    assert t.ask_seq == 1 and t.answer_seq == 1  # answered once
    assert AuditEvent.objects.filter(action="bridge.send", detail__startswith=f"resend turn={turn}").exists()
    other = modern_post(port, token, 5, "tools/call", {"name": "bridge_send", "arguments": {
        "content": "something else", "sessionId": sid, "turnId": turn, "timeoutMs": 1000}}, path="/mcp/bridge/")
    assert other.json()["result"]["isError"] is True  # another answer to an answered question: no_question
    call(6, "bridge_stop", {"paneId": sid})


def raw_send(port, token, path, msg, name):
    """Send one modern tools/call on a socket of its own and return the socket (to drop it)."""
    body = json.dumps(msg).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nMCP-Protocol-Version: {MODERN}"
                  f"\r\nMcp-Method: tools/call\r\nMcp-Name: {name}\r\n\r\n").encode() + body)
    return sock


@needs_tmux
def test_closing_a_blocked_bridge_send_cancels_the_wait(bridge, mint):  # noqa: F811
    """On 2026-07-28 closing the response cancels the request: the blocked bridge_send stops waiting (audited),
    the turn's waiter is released so a later outcome goes to bridge_poll, and the worker keeps its turn."""
    token = mint("alice", role="Operator")
    port = urlsplit(bridge.bridge_url).port
    spawned = modern_post(port, token, 1, "tools/call", {"name": "bridge_spawn", "arguments": {"profile": "standin"}},
                          path="/mcp/bridge/").json()["result"]["structuredContent"]
    sock = raw_send(port, token, "/mcp/bridge/", modern_body(2, "tools/call", {"name": "bridge_send", "arguments": {
        "content": "stall", "sessionId": spawned["sessionId"], "timeoutMs": 60000}}), "bridge_send")
    turn = wait_until(lambda: BridgeTurn.objects.filter(waiter_until__isnull=False).first(), 10, what="the wait")
    sock.close()
    row = wait_until(lambda: AuditEvent.objects.filter(principal="alice", action="mcp.bridge_send",
                                                       result="cancelled").first(), 10, what="the cancel audit row")
    assert "client_disconnect" in row.detail and turn.turn_id in row.detail
    turn.refresh_from_db()
    assert turn.waiter_until is None and turn.active  # released; the worker's turn goes on


@needs_tmux
def test_a_new_turn_resent_after_a_dropped_stream_is_pasted_once(bridge, mint):  # noqa: F811
    """A 2026-07-28 client re-sends a bridge_send (no turnId: a new turn) whose response dropped: the re-send waits
    on the same turn; the worker's pane gets the message once."""
    token = mint("alice", role="Operator")
    port = urlsplit(bridge.bridge_url).port
    sid = modern_post(port, token, 1, "tools/call", {"name": "bridge_spawn", "arguments": {"profile": "standin"}},
                      path="/mcp/bridge/").json()["result"]["structuredContent"]["sessionId"]
    args = {"content": "stall", "sessionId": sid, "timeoutMs": 60000}
    sock = raw_send(port, token, "/mcp/bridge/", modern_body(2, "tools/call", {"name": "bridge_send",
                                                                               "arguments": args}), "bridge_send")
    turn = wait_until(lambda: BridgeTurn.objects.filter(waiter_until__isnull=False).first(), 10, what="the wait")
    sock.close()
    wait_until(lambda: BridgeTurn.objects.filter(pk=turn.pk, dropped_at__isnull=False).exists(), 10,
               what="the drop")
    again = modern_post(port, token, 3, "tools/call", {"name": "bridge_send", "arguments": {**args, "timeoutMs": 1500}},
                        path="/mcp/bridge/").json()["result"]["structuredContent"]
    assert again["outcome"] == "timeout" and again["turnId"] == turn.turn_id, again
    assert BridgeTurn.objects.count() == 1 and turn.messages.count() == 1
    assert AuditEvent.objects.filter(action="bridge.send", detail__startswith=f"resend turn={turn.turn_id}").exists()


# --- the TypeScript client v2 (@modelcontextprotocol/client) in both eras ----------------------------------

TS_ERAS = ROOT / "tests" / "ts-client" / "eras.mjs"
TS_MODES = {"auto": "modern", "pin": "modern", "legacy": "legacy"}


def approve_when_asked(proc, asked, approved, timeout=120):
    deadline = time.time() + timeout
    while not asked.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    ids = []
    if asked.exists():
        for ticket in Approval.objects.filter(status=Approval.PENDING):
            Approval.objects.filter(pk=ticket.pk).update(status=Approval.APPROVED, reviewed_by="rita",
                                                         reviewed_at=timezone.now())
            ids.append(ticket.pk)
        approved.touch()
    return ids


def test_typescript_client_in_both_eras(fleet, mint, tmp_path):  # noqa: F811
    node = shutil.which("node")
    if node is None or not (ROOT / "tests" / "ts-client" / "node_modules" / "@modelcontextprotocol" / "client").exists():
        pytest.fail("node and tests/ts-client/node_modules are needed: run `make test` (npm ci in tests/ts-client)")
    server = progress_stack(fleet)
    token = mint("ts-eras", role="Operator", tier="operator")
    target = Agent.objects.filter(connected=True).order_by("agent_id").first().agent_id
    for mode, era in TS_MODES.items():
        Tag.objects.update_or_create(agent_id=target, key="role", defaults={"value": "web"})
        asked, approved = tmp_path / f"ts-asked-{mode}", tmp_path / f"ts-approved-{mode}"
        env = client_env(MCP_URL=server.mcp, MCP_TOKEN=token, MCP_MODE=mode, AGENT_ID=target, ASKED=str(asked),
                         APPROVED=str(approved), EXEC_ARGS=json.dumps(sleep_args()))
        proc = subprocess.Popen([node, str(TS_ERAS)], cwd=TS_ERAS.parent, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        approved_ids = approve_when_asked(proc, asked, approved)
        stdout, stderr = proc.communicate(timeout=180)
        try:
            obs = json.loads(stdout)
        except ValueError:
            pytest.fail(f"eras.mjs printed no JSON (exit {proc.returncode}):\n{stdout[-2000:]}\n{stderr[-3000:]}")
        where = f"mode={mode}"
        assert "fatal" not in obs, (where, obs["fatal"], stderr[-2000:])
        assert obs["era"] == era, (where, obs["era"])
        if era == "modern":
            assert not any(e["rpc"] == "initialize" or e["session"] for e in obs["http"]), where
            assert all(e["protocol_version"] == MODERN for e in obs["http"] if e["method"] == "POST"), where
        assert "list_agents" in obs["tools"] and "yuzu://about" in obs["resources"], where
        assert "investigate_agent" in obs["prompts"] and obs["about_mime"] == "text/markdown", where
        # the v2 client reads a handshake-era -32002 as its ResourceNotFoundError, which carries -32602
        assert obs["missing_resource"]["code"] == -32602, where
        assert obs["calls"]["list_agents"]["structured"]["count"] == 7, where
        execution = obs["calls"]["execution"]
        assert "error" not in execution and execution["structured"]["status"] == "succeeded", (where, execution)
        values = execution["progress"]
        assert values and values[-1] == 7 and all(a < b for a, b in zip(values, values[1:], strict=False)), (where, values)
        gated = obs["calls"]["gated"]
        assert "error" not in gated and gated["structured"]["deleted"] is True, (where, gated)
        assert gated["via"] == ("elicitation" if era == "modern" else "ticket"), where
        assert len(approved_ids) == 1 and Approval.objects.get(pk=approved_ids[0]).consumed_at is not None, where


def test_listen_stream_hears_tools_list_changed_after_a_role_change(fleet, mint):  # noqa: F811
    """The 2026-07-28 counterpart of the GET channel's notification: a role assigned while the stream is open
    alters what the token is listed, and the stream that asked for toolsListChanged is told."""
    server = fleet.server()
    token = mint("modern-roles", role="Viewer", tier="operator")
    r = modern_post(server.port, token, "L", "subscriptions/listen", {"notifications": {"toolsListChanged": True,
                                                                                        "promptsListChanged": True}})
    ack = r.until(lambda f: len(f) >= 1)[0]
    assert ack["params"]["notifications"] == {"toolsListChanged": True}  # prompts never change: left out
    group = ManagementGroup.objects.create(name="web")
    admin = mint("modern-admin", role="Administrator")
    req = urllib.request.Request(f"{server.base}/api/v1/management-groups/{group.id}/roles", method="POST",
                                 data=json.dumps({"username": "modern-roles", "role": "ITServiceOwner"}).encode(),
                                 headers={"Authorization": f"Bearer {admin}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:  # in the server's process, like an admin would
        assert resp.status == 201
    frames = r.until(lambda f: any(x.get("method") == "notifications/tools/list_changed" for x in f), 15)
    changed = next(x for x in frames if x.get("method") == "notifications/tools/list_changed")
    assert changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L"
    r.drop()
