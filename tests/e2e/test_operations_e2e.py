"""The operator surface end to end, every part a real process (issue 21, "Must show"): daphne, the background
workers (with YUZU_REDIS_URL a Celery worker and Celery beat on Redis, the schedule tick a beat task; embedded:
the tick on daphne's own loop), real agents (`python -m fleet.agent`) and the official MCP Python client.
- a plugin configuration value set over REST reaches the running agent, which acknowledges it and applies it
  on the next run (process.list's default limit), without a restart; bad values are refused, nothing written;
- a kill switch stops a running script.run on the agent at once, and the next dispatch is refused
  (reason kill_switched) over REST and MCP;
- the agent's software inventory arrives by itself; query_installed_software (official client and REST)
  finds a dpkg package really installed here with the version dpkg-query reports;
- an agent uploads a file under a grant (stored 0600 with its SHA-256); a second upload with the same grant
  is refused (409 grant_already_redeemed), an oversized one 413 size_exceeded;
- an interval schedule fires twice through the execution path (dispatched_by schedule:<id>); one created by a
  supervised token does not fire until its approval is granted; a schedule in the past is refused."""

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import time

import httpx
import pytest
from django.core.management import call_command

from approvals.models import Approval
from fleet.models import Agent, AgentExecStatus, AgentInventory, Execution, InstructionDefinition, Response
from operations.models import InstalledSoftware, InstructionSchedule, PluginConfig, UploadSession
from tests.e2e.test_fleet_e2e import live
from tests.support.approvals import approve, approver_principal
from tests.support.official_client import MCP_PY, client_env
from tests.support.stack import Stack, wait_for
from yuzu.rbac import seed_builtin_roles
from yuzu.testing import ROOT

HEARTBEAT_S = 3


@pytest.fixture
def ostack(daphne, tmp_path, monkeypatch):
    monkeypatch.setenv("YUZU_SCHEDULE_TICK_S", "1")
    monkeypatch.setenv("YUZU_UPLOAD_DIR", str(tmp_path / "uploads"))
    seed_builtin_roles()
    s = Stack(daphne(YUZU_AGENT_HEARTBEAT_S=HEARTBEAT_S), tmp_path)
    yield s
    s.close()


def start_agent(stack, name):
    out = io.StringIO()
    call_command("mint_device_token", "--name", f"ops e2e {name}", "--max-uses", "1", stdout=out)
    home = stack.tmp_path / name
    home.mkdir()
    (home / "config.json").write_text(json.dumps({"script_allow": [["sleep", "*"]], "inventory_first_delay_s": 1}))
    proc = stack.spawn(f"agent-{name}", [sys.executable, "-m", "fleet.agent", "--server",
                                         f"ws://127.0.0.1:{stack.server.port}", "--token", out.getvalue().strip(),
                                         "--state-dir", str(home)])

    def connected():
        if proc.proc.poll() is not None:
            pytest.fail(f"agent {name} exited with {proc.proc.returncode}\n{stack.logs()}")
        state = home / "state.json"
        agent_id = json.loads(state.read_text())["agent_id"] if state.exists() else None
        return agent_id if agent_id and Agent.objects.filter(pk=agent_id, connected=True).exists() else None

    return wait_for(connected, 30, f"agent {name} to connect", stack.logs)


def official_client(stack, token, steps):
    if not MCP_PY.exists():
        pytest.fail(f"{MCP_PY} is missing: run `make test` (its test-deps target builds .venv-mcp)")
    cmd = [str(MCP_PY), str(ROOT / "tests" / "mcp_client" / "drive.py"), "--url", stack.server.mcp, "--token", token,
           "--mode", "legacy", "--steps", json.dumps(steps)]
    proc = subprocess.run(cmd, cwd=stack.tmp_path, env=client_env(), capture_output=True, text=True, timeout=90)
    try:
        obs = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"drive.py printed no JSON (exit {proc.returncode}):\n{proc.stderr[-3000:]}\n{stack.logs()}")
    assert "fatal" not in obs, f"the official client failed: {obs['fatal']}\n{stack.logs()}"
    return obs


def run(rest, stack, agent_id, plugin, action, params=None, timeout=30, status_in=("success",)):
    r = rest.post("/api/v1/executions", json={"plugin": plugin, "action": action, "agent_ids": [agent_id],
                                              "params": params or {}})
    assert r.status_code == 202, r.text
    ex_id = r.json()["data"]["execution_id"]
    row = wait_for(lambda: Response.objects.filter(execution_id=ex_id, agent_id=agent_id,
                                                   status__in=("success", "failure", "rejected", "timeout")).first(),
                   timeout, f"{plugin}.{action} to answer", stack.logs)
    assert row.status in status_in, (row.status, row.output, row.error_detail)
    return row


def dpkg_version(package):
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


@live
def test_config_kill_switch_inventory_uploads_and_schedules_on_real_agents(ostack, mint, make_user, tmp_path):
    stack = ostack
    admin = mint("ops-admin", role="Administrator", tier="")
    supervised = mint("ops-admin", role="Administrator", tier="supervised")
    rest = httpx.Client(base_url=stack.server.base, headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    agent = start_agent(stack, "one")
    InstructionDefinition.objects.create(id="e2e-uptime", name="uptime", plugin="system", action="uptime")

    # --- schedules first (the interval is a minute: the other steps run while it passes) -------------------
    r = rest.post("/api/v1/schedules", json={"name": "past", "definition_id": "e2e-uptime", "frequency_type": "once",
                                             "start_at": "2020-01-01T00:00:00+00:00"})
    assert r.status_code == 400 and "past" in r.json()["error"]["message"]
    r = rest.post("/api/v1/schedules", json={"name": "x", "definition_id": "nope", "frequency_type": "interval"})
    assert r.status_code == 400 and "unknown definition" in r.json()["error"]["message"]
    assert not InstructionSchedule.objects.exists()  # nothing half-written
    r = rest.post("/api/v1/schedules", json={"name": "every minute", "definition_id": "e2e-uptime",
                                             "frequency_type": "interval", "interval_minutes": 1,
                                             "scope_expression": "ostype == linux"})
    assert r.status_code == 201, r.text
    every = r.json()["data"]
    assert every["approval_state"] == "not_needed"
    sup = httpx.Client(base_url=stack.server.base, headers={"Authorization": f"Bearer {supervised}"}, timeout=30)
    r = sup.post("/api/v1/schedules", json={"name": "supervised", "definition_id": "e2e-uptime",
                                            "frequency_type": "interval", "interval_minutes": 1})
    assert r.status_code == 201, r.text
    gated = r.json()["data"]
    assert gated["approval_state"] == "pending" and gated["approval_id"]
    ticket = Approval.objects.get(pk=gated["approval_id"])
    assert ticket.origin == "schedule" and ticket.pins == {"agents": [agent]}

    def fired(schedule_id, n):
        rows = Execution.objects.filter(dispatched_by=f"schedule:{schedule_id}", status="succeeded")
        return rows.count() >= n and rows

    wait_for(lambda: fired(every["id"], 1), 20, "the schedule's first run", stack.logs)

    # --- plugin configuration: validated, pushed, applied without a restart ---------------------------------
    for body, path, needle in (({"value": "many"}, "process/default_limit", "does not match"),
                               ({"value": "2"}, "nosuchplugin/default_limit", "unknown plugin"),
                               ({"value": "2"}, "process/undeclared", "declares no configuration key"),
                               ({"value": "2"}, "Bad%20Plugin/x", "plugin must match")):
        r = rest.put(f"/api/v1/plugin-config/{path}", json=body)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    assert not PluginConfig.objects.exists()
    before = json.loads(run(rest, stack, agent, "process", "list").output)
    assert before["count"] > 2 and len(before["processes"]) > 2
    r = rest.put("/api/v1/plugin-config/process/default_limit", json={"value": "2"})
    assert r.status_code == 200 and r.json()["data"]["value"] == "2", r.text
    digest = hashlib.sha256(json.dumps({"default_limit": "2"}, sort_keys=True).encode()).hexdigest()

    def acknowledged():
        row = AgentInventory.objects.filter(agent_id=agent, plugin="plugin_state").first()
        return row and row.data["config"].get("process") == digest

    wait_for(acknowledged, 10, "the agent to acknowledge the configuration", stack.logs)
    after = json.loads(run(rest, stack, agent, "process", "list").output)
    assert after["count"] > 2 and len(after["processes"]) == 2  # applied by the running agent

    # --- kill switch: the running plugin stops, the next dispatch is refused -------------------------------
    r = rest.post("/api/v1/executions", json={"plugin": "script", "action": "run", "agent_ids": [agent],
                                              "params": {"argv": "sleep 60", "timeout": "90"}})
    assert r.status_code == 202, r.text
    long_run = r.json()["data"]["execution_id"]
    wait_for(lambda: AgentExecStatus.objects.filter(execution_id=long_run, status="running").exists(), 15,
             "script.run to start", stack.logs)
    flipped = time.monotonic()
    r = rest.put("/api/v1/plugin-config/script/kill-switch", json={"enabled": False, "reason": "e2e incident"})
    assert r.status_code == 200 and r.json()["data"]["enabled"] is False, r.text
    stopped = wait_for(lambda: Response.objects.filter(execution_id=long_run, status="failure").first(),
                       HEARTBEAT_S + 5, "the running script.run to stop", stack.logs)
    assert "kill_switched" in stopped.error_detail and time.monotonic() - flipped < HEARTBEAT_S + 5
    r = rest.post("/api/v1/executions", json={"plugin": "script", "action": "run", "agent_ids": [agent],
                                              "params": {"argv": "sleep 1"}})
    assert r.status_code == 403 and "kill_switched" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["reason"] == "kill_switched"
    assert rest.get("/api/v1/plugin-config/script/kill-switch").json()["data"]["reason"] == "e2e incident"

    # --- software inventory: a package really installed here, with its real version ----------------------
    package = next((p for p in ("dpkg", "bash", "coreutils") if dpkg_version(p)), None)
    if package is None:
        pytest.skip("this machine has no dpkg database: the dpkg inventory cannot be compared with dpkg-query")
    version = dpkg_version(package)
    wait_for(lambda: InstalledSoftware.objects.filter(agent_id=agent, name=package).exists(), 30,
             "the agent's software inventory", stack.logs)
    r = rest.get("/api/v1/inventory/software", params={"name": package})
    assert r.status_code == 200, r.text
    rows = r.json()["data"]["software"]
    assert [(x["agent_id"], x["version"], x["source"]) for x in rows] == [(agent, version, "dpkg")]
    obs = official_client(stack, mint("ops-reader", role="Viewer", tier="readonly"), [
        {"op": "list", "kind": "tools"},  # the client learns the output schemas, and checks results against them
        {"op": "call", "tool": "query_installed_software", "args": {"name": package, "counts": True}, "as": "sw"},
        {"op": "call", "tool": "query_installed_software",
         "args": {"name": package, "version": version, "version_op": "ge"}, "as": "ge"},
        {"op": "call", "tool": "query_installed_software",
         "args": {"name": package, "version": version, "version_op": "lt"}, "as": "lt"},
        {"op": "call", "tool": "execute_instruction", "args": {"plugin": "script", "action": "run",
                                                               "params": {"argv": "sleep 1"}}, "as": "refused"},
    ])
    sw = obs["calls"]["sw"]
    assert sw["schema_valid"] and sw["structured"]["software"][0]["version"] == version, sw
    assert sw["structured"]["versions"] == [{"name": package, "version": version, "devices": 1}]
    assert obs["calls"]["ge"]["structured"]["count"] == 1 and obs["calls"]["lt"]["structured"]["count"] == 0
    assert obs["calls"]["refused"]["error"]["code"] == -32004  # readonly tier: refused before the kill switch
    licences = rest.get(f"/api/v1/sle/agents/{agent}").json()["data"]
    assert licences["count"] > 0 and all("user_ref" in x for x in licences["licenses"])

    # --- uploads: one file under a grant; the same grant again is refused; an oversized one too -----------
    payload = tmp_path / "evidence.bin"
    payload.write_bytes(os.urandom(5 * 1024 * 1024 + 123))  # more than one chunk
    sha = hashlib.sha256(payload.read_bytes()).hexdigest()
    r = rest.post("/api/v1/upload-grants", json={"agent_id": agent, "declared_max_size": payload.stat().st_size,
                                                 "expected_sha256": sha, "source_path": str(payload)})
    assert r.status_code == 201, r.text
    grant = r.json()["data"]
    params = {"path": str(payload), "grant_id": grant["grant_id"], "grant_secret": grant["grant_secret"]}
    done = json.loads(run(rest, stack, agent, "content_dist", "upload_file", params).output)
    assert done["state"] == "committed" and done["sha256"] == sha and done["actual_size"] == payload.stat().st_size
    stored = tmp_path / "uploads" / grant["destination_key"]
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == sha
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert UploadSession.objects.get(grant_id=grant["grant_id"]).sha256 == sha
    again = run(rest, stack, agent, "content_dist", "upload_file", params, status_in=("failure",))
    assert "grant_already_redeemed" in again.error_detail and '"status": 409' in again.output
    listed = {g["grant_id"]: g for g in rest.get("/api/v1/upload-grants").json()["data"]["data"]}
    assert listed[grant["grant_id"]]["state"] == "redeemed" and "grant_secret" not in listed[grant["grant_id"]]
    r = rest.post("/api/v1/upload-grants", json={"agent_id": agent, "declared_max_size": 1024})
    small = r.json()["data"]
    big = run(rest, stack, agent, "content_dist", "upload_file",
              {"path": str(payload), "grant_id": small["grant_id"], "grant_secret": small["grant_secret"]},
              status_in=("failure",))
    assert "size_exceeded" in big.error_detail
    assert not (tmp_path / "uploads" / small["destination_key"]).exists()

    # --- the schedules: the interval one fired twice; the supervised one only once approved -----------------
    assert not Execution.objects.filter(dispatched_by=f"schedule:{gated['id']}").exists()
    approve(approver_principal(make_user, "ops-approver", "Approver"), ticket.pk)  # the admin's review, with step-up
    wait_for(lambda: fired(gated["id"], 1), 20, "the approved schedule's first run", stack.logs)
    runs = wait_for(lambda: fired(every["id"], 2), 90, "the schedule's second run", stack.logs)
    first, second = sorted(runs.values_list("dispatched_at", flat=True))[:2]
    assert 55 <= (second - first).total_seconds() <= 75
    assert InstructionSchedule.objects.get(pk=every["id"]).execution_count >= 2
    listed = rest.get("/api/v1/schedules").json()["data"]["schedules"]
    assert {s["id"] for s in listed} == {every["id"], gated["id"]}
    assert shutil.which("dpkg-query")


@live
def test_a_group_kill_switch_on_real_agents(ostack, mint):
    """A switch held on one management group stops the plugin on that group's agent only: its running script.run
    is killed, the other agent's keeps running; a dispatch to the group's agent alone is refused, a wider one leaves
    it out; switched back on, the agent runs the plugin again."""
    stack = ostack
    token = mint("ops-admin", role="Administrator")
    rest = httpx.Client(base_url=stack.server.base, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    one, two = start_agent(stack, "one"), start_agent(stack, "two")
    r = rest.post("/api/v1/management-groups", json={"name": "lab"})
    assert r.status_code == 201, r.text
    lab = r.json()["data"]["id"]
    assert rest.post(f"/api/v1/management-groups/{lab}/members", json={"agent_id": two}).status_code in (200, 201)

    r = rest.post("/api/v1/executions", json={"plugin": "script", "action": "run", "agent_ids": [one, two],
                                              "params": {"argv": "sleep 60", "timeout": "90"}})
    assert r.status_code == 202, r.text
    long_run = r.json()["data"]["execution_id"]
    wait_for(lambda: AgentExecStatus.objects.filter(execution_id=long_run, status="running").count() == 2, 15,
             "script.run to start on both agents", stack.logs)
    flipped = time.monotonic()
    r = rest.put("/api/v1/plugin-config/script/kill-switch?group=lab", json={"enabled": False, "reason": "lab incident"})
    assert r.status_code == 200 and r.json()["data"]["group"] == lab, r.text
    stopped = wait_for(lambda: Response.objects.filter(execution_id=long_run, agent_id=two, status="failure").first(),
                       HEARTBEAT_S + 5, "the lab agent's script.run to stop", stack.logs)
    assert "kill_switched" in stopped.error_detail and time.monotonic() - flipped < HEARTBEAT_S + 5
    time.sleep(1)
    assert AgentExecStatus.objects.get(execution_id=long_run, agent_id=one).status == "running"  # not in the group
    assert rest.get("/api/v1/plugin-config/script/kill-switch").json()["data"]["enabled"] is True  # fleet-wide: on

    r = rest.post("/api/v1/executions", json={"plugin": "script", "action": "run", "agent_ids": [two],
                                              "params": {"argv": "sleep 1"}})
    assert r.status_code == 403 and r.json()["error"]["reason"] == "kill_switched", r.text
    assert "in group lab" in r.json()["error"]["message"] and "lab incident" in r.json()["error"]["message"]
    r = rest.post("/api/v1/executions", json={"plugin": "script", "action": "run", "agent_ids": [one, two],
                                              "params": {"argv": "sleep 1"}})
    assert r.status_code == 202, r.text
    receipt = r.json()["data"]
    assert receipt["agents_reached"] == 1 and receipt["kill_switched_agents"] == 1
    assert list(AgentExecStatus.objects.filter(execution_id=receipt["execution_id"])
                .values_list("agent_id", flat=True)) == [one]

    r = rest.put("/api/v1/plugin-config/script/kill-switch?group=lab", json={"enabled": True})
    assert r.status_code == 200, r.text

    def acknowledged():  # the agent reports what it has switched off (plugin_state)
        row = AgentInventory.objects.filter(agent_id=two, plugin="plugin_state").first()
        return row and not row.data.get("switched_off")

    wait_for(acknowledged, 10, "the lab agent to acknowledge the switch back on", stack.logs)
    assert run(rest, stack, two, "script", "run", {"argv": "sleep 1"}).status == "success"
    rest.post(f"/api/v1/executions/{long_run}/cancel")
