"""yuzu's /mcp/v1/ driven by the official MCP clients against a real daphne process.

- Python: `mcp` 2.3.0 in its own environment (.venv-mcp; its import name clashes with our `mcp` app, so
  it never meets this interpreter). tests/mcp_client/drive.py runs there and prints observations.
- TypeScript: `@modelcontextprotocol/sdk` 1.x (tests/ts-client), run with node.

`make test` builds both (the test-deps target); a missing one is a failure, not a skip.
"""

import json
import shutil
import subprocess
import time
import urllib.request

import pytest

from fleet.models import Agent, ManagementGroup, Tag
from tests.support.official_client import DRIVE, MCP_PY, client_env
from yuzu.models import AuditEvent
from yuzu.rbac import seed_builtin_roles
from yuzu.testing import ROOT

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

TS_DIR = ROOT / "tests" / "ts-client"
PROTOCOL = "2025-11-25"

WRITES = {"set_tag", "delete_tag"}
EXPECTED_TOOLS = {"list_agents", "get_agent_details", "get_tags", "set_tag", "delete_tag", "get_fleet_posture_fast",
                  "classify_operational_question", "query_audit_log", "check_permission", "discover_permissions",
                  "list_management_groups", "list_pending_approvals", "list_api_tokens"}
AGENTS = [("oc-web-01", "web-01.example.test", "linux", True), ("oc-web-02", "web-02.example.test", "linux", True),
          ("oc-db-01", "db-01.example.test", "linux", False), ("oc-win-01", "desk-01.example.test", "windows", True),
          ("oc-mac-01", "mac-01.example.test", "darwin", False)]
CORE_CALLS = ["list_agents", "list_agents_connected", "get_fleet_posture_fast", "query_audit_log", "check_permission",
              "check_permission_tag_write", "classify_operational_question"]


@pytest.fixture
def fleet(transactional_db):
    seed_builtin_roles()
    for agent_id, hostname, os_name, connected in AGENTS:
        Agent.objects.create(agent_id=agent_id, hostname=hostname, os=os_name, arch="x86_64", agent_version="1.0.0",
                             connected=connected)
    return [a[0] for a in AGENTS]


def start_drive(server, token, mode, scenario, tmp_path, **params):
    if not MCP_PY.exists():
        pytest.fail(f"{MCP_PY} is missing: run `make test` (its test-deps target builds .venv-mcp from "
                    "tests/mcp_client/requirements.txt, mcp==2.3.0)")
    cmd = [str(MCP_PY), str(DRIVE), "--url", server.mcp, "--token", token, "--mode", mode, "--scenario", scenario]
    for k, v in params.items():
        cmd += ["--param", f"{k}={v}"]
    return subprocess.Popen(cmd, cwd=tmp_path, env=client_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish_drive(server, proc):
    try:
        stdout, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    try:
        obs = json.loads(stdout)
    except ValueError:
        pytest.fail(f"drive.py printed no JSON (exit {proc.returncode}):\n{stdout[-2000:]}\n{stderr[-4000:]}")
    assert "fatal" not in obs, f"the official client failed: {obs['fatal']}\n{server.log.name}"
    return obs


def run_drive(server, token, mode, scenario, tmp_path, **params):
    return finish_drive(server, start_drive(server, token, mode, scenario, tmp_path, **params))


# Issue 13 also removes the server's close frame after the client's own DELETE, which the SDK logs as
# "Error parsing SSE message" (ClosedResourceError); that fix is another branch's. Until it is merged this
# one record is set aside here — delete KNOWN_ELSEWHERE then, and every session must log nothing at all.
KNOWN_ELSEWHERE = [{"logger": "mcp.client.streamable_http", "level": "ERROR", "message": "Error parsing SSE message"}]


def client_log(obs):
    """What the official client logged at WARNING or worse (tests/mcp_client/drive.py captures it)."""
    log = list(obs["log"])
    for known in KNOWN_ELSEWHERE:
        if known in log:
            log.remove(known)
    return log


def http_by_rpc(obs, rpc):
    return [e for e in obs["http"] if e["rpc"] == rpc]


def assert_wire(obs):
    """What the official client put on the wire, and what it got back."""
    assert all(e["authorized"] for e in obs["http"]), "Authorization must go on every request"
    init = http_by_rpc(obs, "initialize")
    assert len(init) == 1 and init[0]["status"] == 200 and init[0]["session_header"]
    assert init[0]["protocol_version"] is None  # initialize carries no version header
    after = obs["http"][obs["http"].index(init[0]) + 1:]
    assert after and all(e["session"] and e["protocol_version"] == PROTOCOL for e in after)
    assert http_by_rpc(obs, "notifications/initialized")[0]["status"] == 202
    assert all(e["status"] == 200 for e in after if e["method"] == "POST" and e["rpc"]
               and not e["rpc"].startswith("notifications/"))
    assert not any(e.get("session_header") for e in after), "only the initialize reply mints a session"
    deletes = [e for e in obs["http"] if e["method"] == "DELETE"]
    assert len(deletes) == 1 and deletes[0]["status"] == 200 and obs["deleted"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_python_sdk_core(daphne, mint, fleet, tmp_path, mode):
    server = daphne()
    token = mint("oc-operator", role="Operator", tier="operator")
    obs = run_drive(server, token, mode, "core", tmp_path, agent_id="oc-db-01")

    assert obs["protocol_version"] == PROTOCOL
    assert obs["server_info"]["name"] == "yuzu-server" and obs["server_info"]["version"]
    assert {"tools", "resources", "prompts", "logging", "completions"} <= set(obs["capabilities"])
    assert "classify_operational_question" in obs["instructions"]
    if mode == "auto":  # the server/discover probe is refused so that the client falls back to initialize
        assert obs["discover_probe"] == {"status": 400, "session_header": False}
        assert obs["http"][0]["rpc"] == "server/discover" and obs["http"][1]["rpc"] == "initialize"
    else:
        assert obs["discover_probe"] is None
    assert_wire(obs)
    assert obs["ping"] == {"ok": True, "result": {}}

    tools = obs["lists"]["tools"]
    assert "error" not in tools and tools["pages"] == 1, "the whole catalogue fits one page (up to 200 tools)"
    assert EXPECTED_TOOLS <= set(tools["names"]) and len(tools["names"]) == len(set(tools["names"]))
    assert tools["without_description"] == [] and set(tools["with_output_schema"]) == set(tools["names"])
    assert "list_agents" in tools["read_only"] and "set_tag" not in tools["read_only"]
    assert {"yuzu://server/health", "yuzu://about"} <= set(obs["lists"]["resources"]["uris"])
    assert obs["lists"]["resource_templates"] == {"pages": 1, "uri_templates": []}
    assert {"investigate_agent", "fleet_overview"} <= set(obs["lists"]["prompts"]["names"])

    calls = obs["calls"]
    for label in CORE_CALLS:
        c = calls[label]
        assert "error" not in c, (label, c)
        assert c["is_error"] is False and c["has_output_schema"], (label, c)
        assert c["schema_valid"], (label, c["schema_errors"])
        assert c["text_matches_structured"], label
    agents = {a["agent_id"]: a for a in calls["list_agents"]["structured"]["agents"]}
    assert set(fleet) <= set(agents) and calls["list_agents"]["structured"]["count"] == len(agents)
    assert agents["oc-web-01"]["hostname"] == "web-01.example.test" and agents["oc-web-01"]["connected"] is True
    connected = {a["agent_id"] for a in calls["list_agents_connected"]["structured"]["agents"]}
    assert connected == {a[0] for a in AGENTS if a[3]}
    posture = calls["get_fleet_posture_fast"]["structured"]
    assert posture["agents"]["total"] == len(AGENTS) and posture["agents"]["connected"] == len(connected)
    assert any(e["action"] == "mcp.list_agents" for e in calls["query_audit_log"]["structured"]["events"])
    assert calls["check_permission"]["structured"]["allowed"] is True
    assert calls["check_permission_tag_write"]["structured"]["allowed"] is True  # Operator role, operator tier
    assert calls["classify_operational_question"]["structured"]["category"]

    health = obs["resources_read"]["yuzu://server/health"]["contents"][0]
    assert health["mimeType"] == "application/json"
    assert json.loads(health["text"]) == {"status": "ok", "agents_connected": len(connected)}
    about = obs["resources_read"]["yuzu://about"]["contents"][0]
    assert about["mimeType"] == "text/markdown" and about["text"] == obs["instructions"]
    missing = obs["resources_read"]["missing_resource"]["error"]
    assert missing["code"] == -32002 and missing["data"]["uri"] == "yuzu://no-such-resource"
    assert missing["data"]["correlation_id"].startswith("req-") and missing["data"]["remediation"]

    prompt = obs["prompts_got"]["investigate_agent"]["messages"]
    assert prompt[0]["role"] == "user" and '"oc-db-01"' in prompt[0]["content"]["text"]
    assert "BEGIN_UNTRUSTED_MCP_ARGUMENT agent_id" in prompt[0]["content"]["text"]
    assert obs["prompts_got"]["investigate_agent_missing_arg"]["error"]["code"] == -32602
    assert obs["completions"]["ceo_demo_agentic_endpoint_management"] == {"values": ["dry_run"]}
    assert obs["set_level"] == {"ok": True}

    unknown = calls["unknown_tool"]["error"]
    assert unknown["code"] == -32602 and unknown["message"] == "Unknown tool: no_such_tool"
    invalid = calls["invalid_args"]["error"]
    assert invalid["code"] == -32602 and "/limit" in invalid["message"] and invalid["data"]["remediation"]

    # What the server recorded: one audit row per call, the refusal, and the session's open and close.
    rows = AuditEvent.objects.filter(principal="oc-operator")
    assert rows.filter(action="mcp.list_agents", result="success").count() == 2
    assert rows.filter(action="mcp.get_fleet_posture_fast", result="success").count() == 1
    assert rows.filter(action="mcp.no_such_tool", result="denied").count() == 1
    assert rows.filter(action="mcp.list_agents", result="failure", detail__contains="args_invalid").count() == 1
    assert rows.filter(action="mcp.session.open").count() == 1
    assert rows.filter(action="mcp.session.close", result="success").count() == 1
    # The client connected, listed and called without a single warning in its log (it used to log "Tool
    # list_agents not listed by server, cannot validate structured content" on paginated catalogues).
    assert client_log(obs) == [], obs["log"]


def test_python_sdk_readonly_token_cannot_write(daphne, mint, fleet, tmp_path):
    server = daphne()
    # The Operator role may write tags; the readonly MCP tier is the ceiling that refuses it.
    token = mint("oc-readonly", role="Operator", tier="readonly")
    obs = run_drive(server, token, "legacy", "readonly", tmp_path, agent_id="oc-web-01")

    assert obs["protocol_version"] == PROTOCOL and obs["deleted"]
    # The list is fitted to the token: reads only (the readonly tier), in one page, with their output schemas.
    tools = obs["lists"]["tools"]
    assert tools["pages"] == 1 and set(tools["names"]) == set(tools["read_only"]) and "list_agents" in tools["names"]
    assert "set_tag" not in tools["names"] and "execute_instruction" not in tools["names"]
    calls = obs["calls"]
    assert calls["list_agents"]["schema_valid"] and set(fleet) <= {a["agent_id"] for a in
                                                                    calls["list_agents"]["structured"]["agents"]}
    perm = calls["check_permission"]["structured"]
    assert perm == {"securable_type": "Tag", "operation": "Write", "allowed": False, "rbac_allowed": True,
                    "tier_allowed": False}
    err = calls["set_tag"]["error"]
    assert err["code"] == -32004 and err["data"]["remediation"]
    assert not Tag.objects.filter(agent_id="oc-web-01").exists()
    denied = AuditEvent.objects.get(principal="oc-readonly", action="mcp.set_tag")
    assert denied.result == "denied" and "tier=readonly" in denied.detail
    assert AuditEvent.objects.filter(principal="oc-readonly", action="mcp.session.close").exists()
    assert client_log(obs) == [], obs["log"]


def test_python_sdk_hears_tools_list_changed(daphne, mint, fleet, tmp_path):
    """A role assigned while the session is open (here over REST, in the server process) alters what the token
    may call: the official client gets notifications/tools/list_changed, lists again, and calls the new tool."""
    server = daphne()
    group = ManagementGroup.objects.create(name="web")
    group.members.add(Agent.objects.get(agent_id="oc-web-01"))
    token = mint("oc-lc", role="Viewer", tier="operator")
    admin = mint("oc-admin", role="Administrator")
    listed = tmp_path / "listed"
    proc = start_drive(server, token, "legacy", "list_changed", tmp_path, listed=listed, agent_id="oc-web-01")
    deadline = time.monotonic() + 90
    while not listed.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listed.exists(), "the client never listed its tools"
    body = json.dumps({"username": "oc-lc", "role": "ITServiceOwner"}).encode()
    req = urllib.request.Request(f"{server.base}/api/v1/management-groups/{group.id}/roles", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {admin}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 201
    obs = finish_drive(server, proc)

    before, after = obs["lists"]["tools"]["names"], obs["lists"]["tools_after"]["names"]
    assert "set_tag" not in before and "set_tag" in after and set(before) < set(after)
    assert obs["waited"]["notifications/tools/list_changed"] is True
    assert obs["notifications"].count("notifications/tools/list_changed") == 1
    call = obs["calls"]["set_tag"]
    assert call["is_error"] is False and call["schema_valid"], call
    assert Tag.objects.get(agent_id="oc-web-01", key="role").value == "web"
    assert client_log(obs) == [], obs["log"]


def test_typescript_sdk(daphne, mint, fleet, tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: run `make test` (tests/support/system_deps.py installs Debian's nodejs)")
    if not (TS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        pytest.fail("tests/ts-client/node_modules is missing: run `make test` (its test-deps target runs npm ci)")
    server = daphne()
    token = mint("oc-ts", role="Viewer", tier="readonly")
    env = {**client_env(), "MCP_URL": server.mcp, "MCP_TOKEN": token}
    proc = subprocess.run([node, str(TS_DIR / "client.mjs")], cwd=TS_DIR, env=env, capture_output=True, text=True,
                          timeout=120)
    try:
        obs = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"client.mjs printed no JSON (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    assert "fatal" not in obs, obs["fatal"]

    assert obs["protocol_version"] == PROTOCOL and obs["session_id_length"] >= 32
    assert obs["server_info"]["name"] == "yuzu-server" and obs["instructions_length"] > 0
    assert obs["ping"] == {}
    assert obs["tools"]["pages"] == 1 and EXPECTED_TOOLS - WRITES <= set(obs["tools"]["names"])
    assert not WRITES & set(obs["tools"]["names"]), "a readonly token is listed only what it may call"
    listed = obs["calls"]["list_agents"]
    assert "error" not in listed, listed  # the SDK validated structuredContent against the listed outputSchema
    assert listed["is_error"] is False and listed["content_types"] == ["text"]
    assert set(fleet) <= {a["agent_id"] for a in listed["structured"]["agents"]}
    unknown = obs["calls"]["unknown_tool"]["error"]
    assert unknown["code"] == -32602 and "Unknown tool: no_such_tool" in unknown["message"]
    assert obs["terminated"] and obs["closed"]
    http = obs["http"]
    assert all(e["authorized"] for e in http)
    assert [e["status"] for e in http if e["method"] == "DELETE"] == [200]
    assert all(e["status"] in (200, 202, 405) for e in http if e["method"] != "DELETE")
    assert AuditEvent.objects.filter(principal="oc-ts", action="mcp.list_agents", result="success").count() == 1
    assert AuditEvent.objects.filter(principal="oc-ts", action="mcp.session.close").count() == 1
