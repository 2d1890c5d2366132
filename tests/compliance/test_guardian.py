"""Guardian (docs/compliance.md#guardian): rules checked against the catalogue and versioned, reports stored under
the connection's agent id, the agent's guards."""

import asyncio
import time
from functools import partial

import pytest
from channels.db import database_sync_to_async

from compliance import receivers, services
from compliance.models import GuardianEvent, GuardRule
from fleet.agent.guardian import Guardian
from fleet.models import Agent
from tests.support.agent_ws import enrolled_agent, mint_device_token
from tests.support.compliance import admin_client
from tests.support.races import at_once
from yuzu.errors import NotFound
from yuzu.models import AuditEvent
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db


# --- Guardian rules and events ----------------------------------------------------------------------

RULE = {"name": "passwd-present", "severity": "high", "spec": {
    "spark": {"type": "file-change"}, "assertion": {"type": "file-exists", "params": {"path": "/etc/passwd"}},
    "remediation": {"type": "alert-only"}}}


def test_guard_rules_are_checked_against_the_catalogue_and_versioned(mint):
    c = admin_client(mint)
    bad = {**RULE, "spec": {**RULE["spec"], "assertion": {"type": "file-exists", "params": {"path": 3}}}}
    r = c.post("/api/v1/guaranteed-state/rules", bad, content_type="application/json")
    assert r.status_code == 400 and "spec.assertion/params/path" in r.json()["error"]["message"]
    mismatch = {**RULE, "spec": {**RULE["spec"], "spark": {"type": "registry-change"}}}
    assert c.post("/api/v1/guaranteed-state/rules", mismatch, content_type="application/json").status_code == 400
    assert not GuardRule.objects.exists()
    r = c.post("/api/v1/guaranteed-state/rules", RULE, content_type="application/json")
    assert r.status_code == 201
    rule = r.json()["data"]
    assert rule["version"] == 1 and rule["created_by"] == "comp-admin"
    assert "kind: GuaranteedStateRule" in rule["yaml_source"] and "path: /etc/passwd" in rule["yaml_source"]
    r = c.put(f"/api/v1/guaranteed-state/rules/{rule['rule_id']}", {"enforcement_mode": "enforce"},
              content_type="application/json")
    assert r.json()["data"]["version"] == 2 and r.json()["data"]["enforcement_mode"] == "enforce"
    r = c.post("/api/v1/guaranteed-state/push", {"scope": "ostype == linux"}, content_type="application/json")
    assert r.status_code == 202 and r.json()["data"]["rules"] == 1
    row = AuditEvent.objects.get(action="guaranteed_state.push")
    assert row.detail == 'rules=1 full_sync=true scope="ostype == linux" agents=0'


@pytest.mark.django_db(transaction=True)
def test_a_guardian_report_is_stored_under_the_connections_agent_id():
    rule = GuardRule.objects.create(name="r", severity="critical", spec_json=RULE["spec"])
    Agent.objects.create(agent_id="victim", hostname="victim")
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        await comm.send_json_to({"type": "report", "kind": "guardian", "rule_id": rule.pk, "agent_id": "victim",
                                 "event_type": "drift.detected", "guard_type": "file-exists",
                                 "detected_value": "absent", "expected_value": "present"})
        await comm.send_json_to({"type": "report", "kind": "guardian", "rule_id": "no-such-rule",
                                 "event_type": "drift.detected"})
        for _ in range(100):
            if await database_sync_to_async(GuardianEvent.objects.exists)():
                break
            await asyncio.sleep(0.05)
        await comm.disconnect()
        return agent_id

    agent_id = asyncio.run(scenario())
    event = GuardianEvent.objects.get()
    assert event.agent_id == agent_id != "victim" and event.severity == "critical"
    assert services.guard_status(agent_id)["drifted_rules"] == 1


# --- Guardian on the agent ---------------------------------------------------------------------------

def test_the_agent_guardian_reports_drift_once_and_recovery(tmp_path):
    watched = tmp_path / "watched"
    watched.write_text("v1")
    sent = []

    async def send(frame, keep=False):
        sent.append(frame)

    rules = [
        {"rule_id": "r-exists", "name": "exists", "enforcement_mode": "enforce", "spec": {
            "spark": {"type": "file-change"}, "assertion": {"type": "file-exists", "params": {"path": str(watched)}},
            "remediation": {"type": "enforce"}}},
        {"rule_id": "r-hash", "name": "hash", "spec": {
            "spark": {"type": "file-change"},
            "assertion": {"type": "file-hash-equals", "params": {"path": str(watched), "settle_ms": 10}},
            "remediation": {"type": "alert-only"}}},
        {"rule_id": "r-reg", "name": "reg", "spec": {
            "spark": {"type": "registry-change"}, "assertion": {"type": "registry-value-equals", "params": {}},
            "remediation": {"type": "alert-only"}}},
    ]

    async def scenario():
        g = Guardian(send, {"guardian_poll_s": 0.05})
        g.apply(rules)
        await asyncio.sleep(0.3)
        armed = list(sent)
        watched.write_text("v2")  # the hash drifts, the file still exists
        await asyncio.sleep(0.3)
        watched.unlink()
        await asyncio.sleep(0.3)
        watched.write_text("v1")  # back to the baseline
        await asyncio.sleep(0.3)
        g.task.cancel()
        return armed

    armed = asyncio.run(scenario())
    assert [(f["rule_id"], f["event_type"], f["detail"]) for f in armed] == [
        ("r-reg", "guard.unhealthy", {"reason": "unsupported_on_platform"})]
    events = [(f["rule_id"], f["event_type"]) for f in sent[1:]]
    assert events[:3] == [("r-hash", "drift.detected"), ("r-exists", "drift.detected"),
                          ("r-exists", "remediation.failed")]
    # the two guards recover from the same write independently: either may report first (a loaded machine
    # showed both orders)
    assert sorted(events[3:]) == [("r-exists", "guard.healthy"), ("r-hash", "guard.healthy")]
    failed = next(f for f in sent if f["event_type"] == "remediation.failed")
    assert "guardian_enforce" in failed["detail"]["reason"]  # the operator never allowed enforcement
    assert all(f["type"] == "report" and f["kind"] == "guardian" and "agent_id" not in f for f in sent)


def test_reports_on_rules_an_agent_was_not_sent_or_over_budget_are_dropped(monkeypatch):
    linux = Agent.objects.create(agent_id="lin", hostname="lin", os="linux")
    Agent.objects.create(agent_id="win", hostname="win", os="windows")
    rule = GuardRule.objects.create(name="r", os_target="linux", spec_json=RULE["spec"])
    frame = {"kind": "guardian", "rule_id": rule.pk, "event_type": "drift.detected"}
    receivers.guardian_report(None, "win", frame)  # a windows agent was never sent a linux rule
    assert not GuardianEvent.objects.exists()
    monkeypatch.setattr(receivers, "REPORTS_PER_MINUTE", 3)
    receivers._recent.clear()
    for _ in range(5):
        receivers.guardian_report(None, linux.pk, frame)
    assert GuardianEvent.objects.filter(agent=linux).count() == 3
    assert receivers.within_budget(linux.pk, now=time.monotonic() + 61)  # a minute later: room again


@pytest.mark.django_db(transaction=True)
def test_concurrent_edits_of_a_rule_keep_both_changes_and_get_their_own_versions(make_user):
    """Two edits at once each read the rule, then saved every column of what they had read: the later one put
    back the earlier one's change, and its version too, so both answered version 2."""
    p = Principal(user=make_user("root", "Administrator"))
    for _ in range(20):  # the lost edit showed within a few rounds on PostgreSQL
        rule_id = services.create_rule(p, dict(RULE))["rule_id"]
        outcomes = at_once(partial(services.update_rule, p, rule_id, {"severity": "critical"}),
                           partial(services.update_rule, p, rule_id, {"enabled": False}))
        assert [kind for kind, _ in outcomes] == ["ok", "ok"], outcomes
        assert sorted(out["version"] for _, out in outcomes) == [2, 3]
        rule = GuardRule.objects.get(pk=rule_id)
        assert (rule.version, rule.severity, rule.enabled) == (3, "critical", False)
        rule.delete()


@pytest.mark.django_db(transaction=True)
def test_an_edit_racing_a_delete_never_brings_the_rule_back(make_user):
    """An edit saved a rule deleted since it read it: Django's save() found no row to update and inserted it
    again, so the delete answered deleted and the rule was still there."""
    p = Principal(user=make_user("root", "Administrator"))
    for _ in range(20):
        rule_id = services.create_rule(p, dict(RULE))["rule_id"]
        edit, delete = at_once(partial(services.update_rule, p, rule_id, {"severity": "critical"}),
                               partial(services.delete_rule, p, rule_id))
        assert delete[0] == "ok", delete
        assert edit[0] == "ok" or isinstance(edit[1], NotFound), edit
        assert not GuardRule.objects.filter(pk=rule_id).exists()
