"""Compliance end to end, every part a real process (issue 17, "Must show"): daphne, the background workers
(with YUZU_REDIS_URL: a Celery worker and Celery beat on Redis, the evaluator a beat task; embedded: the
evaluator on daphne's own event loop), two real agents (`python -m fleet.agent`) and the official MCP Python
client (tests/mcp_client/drive.py in .venv-mcp).

- a policy authored over REST as raw YAML is evaluated on schedule through the execution path: compliant on
  the agent whose file is in order, non_compliant on the one whose file is world-writable;
- get_fleet_compliance, get_compliance_summary, yuzu://compliance/fleet and the compliance_report prompt
  through the official client report those counts and 50 %;
- POST …/remediate runs the fix on the non-compliant agent only; the verify step flips it to compliant, and
  the file on disk really changed;
- Guardian rules pushed to the agents report drift.detected, under each agent's authenticated id, within
  seconds of a watched file changing (its SHA-256 against the baseline captured when armed) and of another
  disappearing.

The two agents run on one host: each works in its own directory, and the policy checks a path relative to it,
so their file states differ. Runs on SQLite or PostgreSQL, embedded or on Redis. Every wait has a deadline."""

import hashlib
import io
import json
import os
import stat
import subprocess
import sys

import httpx
import pytest
from django.core.management import call_command

from compliance.models import GuardianEvent, PolicyAgentStatus, PolicyRun
from fleet.models import Agent, Execution
from tests.e2e.test_fleet_e2e import live
from tests.support.official_client import MCP_PY, client_env
from tests.support.stack import Proc, Stack, wait_for
from yuzu.models import AuditEvent
from yuzu.rbac import seed_builtin_roles
from yuzu.testing import ROOT

FRAGMENT = """apiVersion: yuzu.io/v1alpha1
kind: PolicyFragment
metadata:
  name: e2e-not-world-writable
spec:
  check:
    plugin: file
    action: stat
    parameters: {path: "${path}"}
    compliance: "result.exists && !result.world_writable"
  fix:
    plugin: script
    action: run
    parameters: {argv: '["chmod", "o-w", "${path}"]'}
"""
POLICY = """apiVersion: yuzu.io/v1alpha1
kind: Policy
metadata:
  name: e2e-marker
  description: the agent's marker file is not world-writable
spec:
  fragment: e2e-not-world-writable
  scope: "ostype == linux"
  triggers: [{type: interval, interval_seconds: 3600}]
  inputs: {path: marker}
"""
AGENT_MAIN = ("import os, runpy, sys; sys.path.insert(0, {root!r}); os.chdir({cwd!r}); "
              "sys.argv = ['fleet.agent'] + {args!r}; runpy.run_module('fleet.agent', run_name='__main__')")


@pytest.fixture
def cstack(daphne, tmp_path, monkeypatch):
    # A fast evaluator for the test: ticks every second, no cache on the fleet counts.
    for k, v in {"YUZU_COMPLIANCE_TICK_S": "1", "YUZU_COMPLIANCE_CACHE_S": "0",
                 "YUZU_COMPLIANCE_GRACE_S": "30"}.items():
        monkeypatch.setenv(k, v)
    seed_builtin_roles()
    s = Stack(daphne(), tmp_path)
    yield s
    s.close()


def start_agent(stack, name, marker_mode):
    """A real agent working in its own directory, which holds ``marker`` with ``marker_mode``."""
    out = io.StringIO()
    call_command("mint_device_token", "--name", f"compliance e2e {name}", "--max-uses", "1", stdout=out)
    home = stack.tmp_path / name
    home.mkdir()
    (home / "config.json").write_text(json.dumps({"script_allow": [["chmod", "o-w", "marker"]],
                                                  "guardian_poll_s": 0.5}))
    marker = home / "marker"
    marker.write_text("ok\n")
    os.chmod(marker, marker_mode)
    args = ["--server", f"ws://127.0.0.1:{stack.server.port}", "--token", out.getvalue().strip(),
            "--state-dir", str(home)]
    proc = Proc(f"agent-{name}", [sys.executable, "-c", AGENT_MAIN.format(root=str(ROOT), cwd=str(home), args=args)],
                stack.tmp_path, stack.env)
    stack.procs.append(proc)

    def connected():
        if proc.proc.poll() is not None:
            pytest.fail(f"agent {name} exited with {proc.proc.returncode}\n{stack.logs()}")
        state = home / "state.json"
        agent_id = json.loads(state.read_text())["agent_id"] if state.exists() else None
        return agent_id if agent_id and Agent.objects.filter(pk=agent_id, connected=True).exists() else None

    return wait_for(connected, 30, f"agent {name} to connect", stack.logs), marker


def official_client(stack, token, steps, **params):
    if not MCP_PY.exists():
        pytest.fail(f"{MCP_PY} is missing: run `make test` (its test-deps target builds .venv-mcp)")
    cmd = [str(MCP_PY), str(ROOT / "tests" / "mcp_client" / "drive.py"), "--url", stack.server.mcp, "--token", token,
           "--mode", "legacy", "--steps", json.dumps(steps)] + [a for k, v in params.items()
                                                              for a in ("--param", f"{k}={v}")]
    proc = subprocess.run(cmd, cwd=stack.tmp_path, env=client_env(), capture_output=True, text=True, timeout=90)
    try:
        obs = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"drive.py printed no JSON (exit {proc.returncode}):\n{proc.stderr[-3000:]}\n{stack.logs()}")
    assert "fatal" not in obs, f"the official client failed: {obs['fatal']}\n{stack.logs()}"
    return obs


def verdicts(policy_id):
    return dict(PolicyAgentStatus.objects.filter(policy_id=policy_id).values_list("agent_id", "status"))


@live
def test_policy_verdicts_official_client_remediation_and_guardian_drift_on_real_agents(cstack, mint):
    stack = cstack
    bad, bad_marker = start_agent(stack, "bad", 0o666)
    good, _ = start_agent(stack, "good", 0o644)
    admin = mint("ce-admin", role="Administrator", tier="")
    rest = httpx.Client(base_url=stack.server.base, headers={"Authorization": f"Bearer {admin}"}, timeout=20)

    # Authored as raw YAML; a broken one is refused first and leaves nothing behind.
    r = rest.post("/api/v1/policies", content=POLICY.replace("e2e-not-world-writable", "nope"),
                  headers={"Content-Type": "application/yaml"})
    assert r.status_code == 400 and "unknown fragment 'nope'" in r.json()["error"]["message"]
    r = rest.post("/api/v1/policy-fragments", content=FRAGMENT, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    r = rest.post("/api/v1/policies", json={"yaml_source": POLICY})
    assert r.status_code == 201, r.text
    policy_id = r.json()["data"]["id"]

    # The evaluator picks the new (due) policy up on its own and dispatches the check to both agents.
    wait_for(lambda: verdicts(policy_id) == {bad: "non_compliant", good: "compliant"}, 60,
             "the scheduled check's verdicts", lambda: f"{verdicts(policy_id)}\n{stack.logs()}")
    check = Execution.objects.get(definition_id=f"policy/{policy_id}/check")
    assert (check.plugin, check.action, check.agents_targeted, check.dispatched_by) == ("file", "stat", 2,
                                                                                       "system:compliance")
    assert AuditEvent.objects.filter(action="execution.start", target_id=check.pk).exists()
    row = PolicyAgentStatus.objects.get(policy_id=policy_id, agent_id=bad)
    assert row.check_result["result"]["world_writable"] is True and row.check_result["result"]["mode"] == "0666"

    # The official MCP client on a readonly token.
    reader = mint("ce-reader", role="Viewer", tier="readonly")
    obs = official_client(stack, reader, [
        {"op": "list", "kind": "tools"},  # the client learns the output schemas, and checks results against them
        {"op": "call", "tool": "get_fleet_compliance", "args": {}, "as": "fleet"},
        {"op": "call", "tool": "list_policies", "args": {"enabled": True}, "as": "policies"},
        {"op": "call", "tool": "get_compliance_summary", "args": {"policy_id": "$policy_id"}, "as": "summary"},
        {"op": "call", "tool": "get_compliance_summary", "args": {"policy_id": "no-such-policy"}, "as": "unknown"},
        {"op": "read", "uri": "yuzu://compliance/fleet"},
        {"op": "prompt", "name": "compliance_report", "args": {"policy_id": "$policy_id"}, "as": "report"},
    ], policy_id=policy_id)
    fleet = obs["calls"]["fleet"]
    assert fleet["schema_valid"] and fleet["is_error"] is False, fleet
    assert fleet["structured"] == {"total_checks": 2, "compliant": 1, "non_compliant": 1, "unknown": 0,
                                   "fixing": 0, "error": 0, "compliance_pct": 50.0}
    assert [p["id"] for p in obs["calls"]["policies"]["structured"]["policies"]] == [policy_id]
    assert {"list_policies", "get_compliance_summary", "get_fleet_compliance", "get_guardian_schemas"} <= set(
        obs["lists"]["tools"]["names"])
    assert obs["calls"]["summary"]["schema_valid"] and obs["calls"]["policies"]["schema_valid"]
    summary = obs["calls"]["summary"]["structured"]
    assert (summary["compliant"], summary["non_compliant"], summary["total"]) == (1, 1, 2)
    unknown = obs["calls"]["unknown"]["error"]
    assert unknown["code"] == -32602 and "policy not found" in unknown["message"], unknown
    [content] = obs["resources_read"]["yuzu://compliance/fleet"]["contents"]
    assert json.loads(content["text"]) == fleet["structured"]
    text = obs["prompts_got"]["report"]["messages"][0]["content"]["text"]
    assert "BEGIN_UNTRUSTED_MCP_ARGUMENT policy_id" in text and policy_id in text

    # Remediation: only on request; the fix runs on the non-compliant agent only, then the verify step.
    r = rest.post(f"/api/v1/policies/{policy_id}/remediate", json={})
    assert r.status_code == 200, r.text
    assert r.json()["data"]["agent_ids"] == [bad]
    wait_for(lambda: verdicts(policy_id) == {bad: "compliant", good: "compliant"}, 60,
             "the verify step to flip the fixed agent", lambda: f"{verdicts(policy_id)}\n{stack.logs()}")
    assert stat.S_IMODE(bad_marker.stat().st_mode) == 0o664  # chmod o-w really ran on that agent
    phases = list(PolicyRun.objects.filter(policy_id=policy_id).order_by("started_at").values_list("phase",
                                                                                                  flat=True))
    assert phases == ["check", "fix", "verify"]
    assert PolicyAgentStatus.objects.get(policy_id=policy_id, agent_id=bad).fix_attempts == 0
    assert AuditEvent.objects.filter(action="policy.remediate", principal="ce-admin", result="success").exists()
    assert rest.post(f"/api/v1/policies/{policy_id}/remediate", json={}).status_code == 409  # nothing left to fix

    # Guardian: a guard pushed to both agents; the watched file disappears; drift arrives from each.
    watched = stack.tmp_path / "guarded.conf"
    watched.write_text("x\n")
    r = rest.post("/api/v1/guaranteed-state/rules", json={
        "name": "guarded-conf-present", "severity": "high", "spec": {
            "spark": {"type": "file-change"},
            "assertion": {"type": "file-exists", "params": {"path": str(watched), "expected": "present"}},
            "remediation": {"type": "alert-only"}}})
    assert r.status_code == 201, r.text
    rule_id = r.json()["data"]["rule_id"]
    hashed = stack.tmp_path / "hashed.conf"
    hashed.write_text("baseline\n")
    r = rest.post("/api/v1/guaranteed-state/rules", json={
        "name": "hashed-conf-unchanged", "spec": {
            "spark": {"type": "file-change"},
            "assertion": {"type": "file-hash-equals", "params": {"path": str(hashed), "settle_ms": 100}},
            "remediation": {"type": "alert-only"}}})
    hash_rule = r.json()["data"]["rule_id"]
    r = rest.post("/api/v1/guaranteed-state/push", json={"scope": "ostype == linux"})
    assert r.status_code == 202 and r.json()["data"] == {"rules": 2, "agents": 2, "full_sync": True,
                                                         "status": "accepted"}, r.text
    armed = lambda: sum("guardian: 2 guard(s) armed" in p.log_path.read_text(errors="replace")  # noqa: E731
                        for p in stack.procs if p.name.startswith("agent-"))
    wait_for(lambda: armed() == 2, 20, "both agents to arm the guards", stack.logs)
    hashed.write_text("tampered\n")
    changed = lambda: list(GuardianEvent.objects.filter(rule_id=hash_rule, event_type="drift.detected"))  # noqa: E731
    wait_for(lambda: len(changed()) == 2, 20, "drift.detected from the hash guard", stack.logs)
    assert {(e.detected_value, e.expected_value) for e in changed()} == {
        (hashlib.sha256(b"tampered\n").hexdigest(), hashlib.sha256(b"baseline\n").hexdigest())}
    watched.unlink()
    drifted = lambda: set(GuardianEvent.objects.filter(rule_id=rule_id, event_type="drift.detected")  # noqa: E731
                          .values_list("agent_id", flat=True))
    wait_for(lambda: drifted() == {bad, good}, 20, "drift.detected from both agents", stack.logs)
    event = GuardianEvent.objects.filter(rule_id=rule_id, agent_id=bad).first()
    assert (event.detected_value, event.expected_value, event.severity) == ("absent", "present", "high")
    listed = rest.get("/api/v1/guaranteed-state/events", params={"rule_id": rule_id}).json()["data"]["events"]
    assert {e["agent_id"] for e in listed} == {bad, good}
    assert rest.get("/api/v1/guaranteed-state/status").json()["data"]["drifted_rules"] == 4  # 2 rules × 2 agents
