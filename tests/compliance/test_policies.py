"""Policy documents and the evaluator (docs/compliance.md): documents checked before anything is written, CEL
verdicts, claims, remediation and its 409 rules, startup triggers, the REST writes."""

import asyncio
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from functools import partial

import pytest
from channels.db import database_sync_to_async
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connections
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from compliance import documents, engine, services
from compliance.models import Policy, PolicyAgentStatus, PolicyFragment, PolicyRun
from fleet.agent.plugins import PLUGINS, Context, execute
from fleet.models import Agent, AgentState, Execution, ManagementGroup, Response
from operations.models import PluginKillSwitch
from tests.support.agent_ws import enrolled_agent, mint_device_token
from tests.support.compliance import FRAGMENT, POLICY, admin_client, agents, answer, make_policy, nothing_written
from tests.support.fuzz import NASTY_STRINGS
from tests.support.races import at_once
from yuzu.errors import YuzuError
from yuzu.models import AuditEvent
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db


def metric(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- documents: clear refusals, nothing half-written ------------------------------------------------

BAD_DOCUMENTS = [
    ("kind: Policy\napiVersion: yuzu.io/v1alpha1\n", "kind must be 'PolicyFragment', not 'Policy'", "expected_schema"),
    ("apiVersion: yuzu.io/v1alpha1\nmetadata: {name: x}\n", "kind must be 'PolicyFragment' (it is missing)",
     "expected_schema"),
    ("apiVersion: yuzu.io/v1alpha1\nkind: PolicyFragment\nmetadata: {name: [x\n", "malformed YAML", "line"),
    (FRAGMENT.replace("result.exists && !result.world_writable", "result.exists &&& 1"),
     "spec.check.compliance is not valid CEL (syntax error at line 1, column 17)", "column"),
    (FRAGMENT.replace("compliance: \"result.exists && !result.world_writable\"", "compliance: \"  \""),
     "spec.check.compliance is empty", None),
    (FRAGMENT.replace("plugin: file", "plugin: 'file; rm -rf /'"), "does not match its schema at 'spec/check/plugin'",
     "expected_schema"),
    ("a: &x [1, 2]\nb: *x\n", "YAML aliases (*name) are not allowed", "line"),
    ("- just\n- a list\n", "must be a YAML mapping", None),
    # YAML's .inf / .nan (and 1.0e+999, which overflows to inf) passed the schema's "number" and reached the
    # database: SQLite's JSON check refused the row, answered as 409 "a fragment named … exists already"
    # (none did); PostgreSQL's jsonb refuses 'Infinity' with a DataError (a 500)
    (FRAGMENT.replace('parameters: {path: "${path}"}', 'parameters: {path: "${path}", n: .inf}'),
     "'.inf' at line 10 is not a finite number", "line"),
    (FRAGMENT.replace('parameters: {path: "${path}"}', 'parameters: {path: "${path}", n: .nan}'),
     "'.nan' at line 10 is not a finite number", "column"),
    (FRAGMENT.replace('parameters: {path: "${path}"}', 'parameters: {path: "${path}", n: -1.0e+999}'),
     "'-1.0e+999' at line 10 is not a finite number", None),
    ("apiVersion: yuzu.io/v1alpha1\nkind: PolicyFragment\nmetadata: {name: x}\nspec: {check: {}}\n" + "#" * 70000,
     "exceeds 65536 bytes", None),
]


@pytest.mark.parametrize("text,message,extra", BAD_DOCUMENTS, ids=[m[:30] for _, m, _ in BAD_DOCUMENTS])
def test_a_bad_fragment_is_refused_with_a_clear_400_and_nothing_written(mint, text, message, extra):
    c = admin_client(mint)
    for r in (c.post("/api/v1/policy-fragments", {"yaml_source": text}, content_type="application/json"),
              c.post("/api/v1/policy-fragments", text, content_type="application/yaml")):
        assert r.status_code == 400, r.content
        error = r.json()["error"]
        assert message in error["message"], error
        if extra:
            assert extra in error, error
        assert "Traceback" not in r.content.decode()
    assert nothing_written()
    if extra == "expected_schema":
        assert error["expected_schema"]["properties"]["kind"] == {"const": "PolicyFragment"}


def test_a_bad_policy_is_refused_and_leaves_no_row(mint):
    c = admin_client(mint)
    assert c.post("/api/v1/policy-fragments", FRAGMENT, content_type="application/yaml").status_code == 201
    cases = [
        (POLICY.replace("fragment: marker-present", "fragment: no-such-fragment"), "unknown fragment 'no-such-fragment'"),
        (POLICY.replace("inputs: {path: /tmp/marker}", "inputs: {other: 1}"),
         "parameter 'path' uses input '${path}', which the policy does not bind"),
        (POLICY.replace("triggers:", "scope: 'ostype == '\n  triggers:"), "spec.scope is not a valid scope expression"),
        (POLICY.replace("spec:", "spec:\n  managementGroups: [nope]"), "unknown management group 'nope'"),
        (POLICY.replace("type: interval", "type: hourly"), "does not match its schema at 'spec/triggers/0/type'"),
        (POLICY.replace("kind: Policy", "kind: PolicyFragment"), "kind must be 'Policy'"),
        (POLICY.replace("inputs: {path: /tmp/marker}", "inputs: {path: .nan}"),
         "'.nan' at line 7 is not a finite number"),
    ]
    for text, message in cases:
        r = c.post("/api/v1/policies", {"yaml_source": text}, content_type="application/json")
        assert r.status_code == 400 and message in r.json()["error"]["message"], (message, r.content)
    r = c.post("/api/v1/policies", {"yaml": POLICY}, content_type="application/json")
    assert r.status_code == 400 and "yaml_source" in r.json()["error"]["message"]
    assert not Policy.objects.exists()
    assert not AuditEvent.objects.filter(action="policy.create").exists()


def test_create_list_get_enable_disable_delete_with_audit_rows(mint):
    c = admin_client(mint)
    r = c.post("/api/v1/policy-fragments", FRAGMENT, content_type="application/yaml")
    assert r.status_code == 201 and r.json()["data"]["status"] == "created"
    assert c.post("/api/v1/policy-fragments", FRAGMENT, content_type="application/yaml").status_code == 409
    r = c.post("/api/v1/policies", {"yaml_source": POLICY}, content_type="application/json")
    assert r.status_code == 201
    pid = r.json()["data"]["id"]
    view = c.get(f"/api/v1/policies/{pid}").json()["data"]
    assert view["interval_seconds"] == 120 and view["remediation_available"] is True
    assert view["unsupported_triggers"] == ["file_change"] and view["inputs"] == {"path": "/tmp/marker"}
    assert view["summary"]["total"] == 0
    assert c.post(f"/api/v1/policies/{pid}/disable").json()["data"]["enabled"] is False
    assert c.get("/api/v1/policies?enabled_only=true").json()["data"]["policies"] == []
    assert c.post(f"/api/v1/policies/{pid}/enable").json()["data"]["enabled"] is True
    frag = PolicyFragment.objects.get().pk
    assert c.delete(f"/api/v1/policy-fragments/{frag}").status_code == 409  # in use
    assert c.delete(f"/api/v1/policies/{pid}").status_code == 200
    assert c.delete(f"/api/v1/policies/{pid}").status_code == 404
    assert c.delete(f"/api/v1/policy-fragments/{frag}").status_code == 200
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"policy.fragment.create", "policy.create", "policy.disable", "policy.enable", "policy.delete",
            "policy.fragment.delete"} <= actions


def test_the_shipped_examples_load(mint):
    call_command("load_policies", stdout=open("/dev/null", "w"))
    assert set(Policy.objects.values_list("name", flat=True)) == {
        "ssh-root-login-disabled", "cron-running", "passwd-not-world-writable"}


# --- CEL ---------------------------------------------------------------------------------------------

def test_cel_verdicts_are_booleans_or_undecided():
    assert documents.evaluate("result.exists && result.matches > 0", {"exists": True, "matches": 2}) == (True, "")
    assert documents.evaluate("result.exists && result.matches > 0", {"exists": True, "matches": 0}) == (False, "")
    assert documents.evaluate("", {"exists": True})[0] is None  # empty is never compliant
    assert documents.evaluate("result.matches", {"matches": 1})[0] is None  # not a boolean
    assert documents.evaluate("result.nope", {"exists": True})[0] is None  # evaluation error
    # never Python: attribute walks and dunder tricks are CEL syntax errors or plain misses
    assert documents.evaluate("result.__class__", {})[0] is None


# --- evaluation ------------------------------------------------------------------------------------

def test_a_check_writes_one_verdict_per_agent():
    agents("a1", "a2", "a3", "a4")
    agents("off", connected=False)
    before = {s: metric("yuzu_server_policy_verdicts_total", status=s)
              for s in ("compliant", "non_compliant", "error", "unknown")}
    errors_before = metric("yuzu_server_policy_eval_errors_total", phase="check")
    policy = make_policy()
    run = engine.evaluate_now(policy)
    assert run.agent_ids == ["a1", "a2", "a3", "a4"]  # reachable targets only
    ex = Execution.objects.get(pk=run.execution_id)
    assert (ex.plugin, ex.action, ex.parameter_values) == ("file", "stat", {"path": "/tmp/marker"})
    answer(run, "a1", output={"exists": True, "world_writable": False})
    answer(run, "a2", output={"exists": False})
    answer(run, "a3", status=AgentState.FAILURE, error="permission denied")
    assert engine.collect(run) == 4
    assert engine.collect(run) == 0  # claimed once
    verdicts = dict(PolicyAgentStatus.objects.values_list("agent_id", "status"))
    assert verdicts == {"a1": "compliant", "a2": "non_compliant", "a3": "error", "a4": "unknown"}
    for status in ("compliant", "non_compliant", "error", "unknown"):
        assert metric("yuzu_server_policy_verdicts_total", status=status) == before[status] + 1
    assert metric("yuzu_server_policy_eval_errors_total", phase="check") == errors_before + 1
    assert policy.summary() == {"policy_id": policy.pk, "compliant": 1, "non_compliant": 1, "unknown": 1,
                                "fixing": 0, "error": 1, "total": 4}


def test_one_agent_answering_json_nested_past_the_parsers_stack_does_not_poison_the_run():
    """An agent's output is its own text (up to 1 MiB): one answering a check with arrays nested far deeper than the
    json module's stack made result_value raise RecursionError, which failed the whole collection — every agent's
    verdict rolled back, and the run retried (and failed) at every tick. Its own verdict is an error now; the others
    are written."""
    agents("a1", "evil")
    run = engine.evaluate_now(make_policy())
    answer(run, "a1", output={"exists": True, "world_writable": False})
    Response.objects.create(execution_id=run.execution_id, agent_id="evil", instruction_id="x",
                            status=AgentState.SUCCESS, output="[" * 100_000)
    assert engine.collect(run) == 2
    verdicts = dict(PolicyAgentStatus.objects.values_list("agent_id", "status"))
    assert verdicts == {"a1": "compliant", "evil": "error"}
    evil = PolicyAgentStatus.objects.get(agent_id="evil").check_result
    assert "reason" in evil and len(json.dumps(evil)) < 10_000


def test_due_policies_are_dispatched_once_per_interval_and_the_clock_survives_a_restart():
    agents("a1")
    policy = make_policy()
    now = timezone.now()
    assert engine.tick(now) == (0, 1)
    assert engine.tick(now + timedelta(seconds=10))[1] == 0  # not due again within its interval
    again = Policy.objects.get(pk=policy.pk)  # "restart": the clock is in the database
    assert again.next_due_at == again.last_dispatch_at + timedelta(seconds=120)
    # two evaluators racing for the same due interval: exactly one claim wins
    later = now + timedelta(seconds=121)
    assert [Policy.objects.get(pk=policy.pk).claim(later), Policy.objects.get(pk=policy.pk).claim(later)] == [True,
                                                                                                              False]
    assert PolicyRun.objects.count() == 1
    # the run's grace window passes without an answer: unknown
    assert engine.tick(now + timedelta(seconds=130))[0] == 1
    assert PolicyAgentStatus.objects.get().status == "unknown"


def test_interval_floor_default_and_a_disabled_policy():
    assert documents.interval_of([{"type": "interval", "interval_seconds": 5}]) == 60
    assert documents.interval_of([{"type": "startup"}]) == 3600
    agents("a1")
    policy = make_policy(POLICY.replace("spec:", "spec:\n  enabled: false"))
    assert not policy.enabled and engine.tick() == (0, 0)


def test_evaluate_on_demand_409_without_targets(mint):
    c = admin_client(mint)
    policy = make_policy()
    r = c.post(f"/api/v1/policies/{policy.pk}/evaluate")
    assert r.status_code == 409 and "no matching agents" in r.json()["error"]["message"]
    agents("a1")
    r = c.post(f"/api/v1/policies/{policy.pk}/evaluate")
    assert r.status_code == 202 and Execution.objects.filter(pk=r.json()["data"]["execution_id"]).exists()
    ex = Execution.objects.get()
    assert ex.definition_id == f"policy/{policy.pk}/check" and ex.dispatched_by == "comp-admin"
    assert AuditEvent.objects.filter(action="policy.evaluate", result="success").exists()
    assert AuditEvent.objects.filter(action="execution.start").exists()  # the normal execution path


def test_group_bindings_target_the_group_and_its_descendants():
    a1, a2, a3 = agents("a1", "a2", "a3")
    parent = ManagementGroup.objects.create(name="parent")
    child = ManagementGroup.objects.create(name="child", parent=parent)
    parent.members.add(a1)
    child.members.add(a2)
    make_policy(POLICY.replace("spec:", "spec:\n  managementGroups: [parent]"))
    assert Policy.objects.get().reachable_targets() == ["a1", "a2"]


def test_remediation_fix_then_verify_and_the_rules_of_409(mint):
    c = admin_client(mint)
    agents("a1", "a2")
    policy = make_policy()
    url = f"/api/v1/policies/{policy.pk}/remediate"
    r = c.post(url, {}, content_type="application/json")
    assert r.status_code == 409 and "retry cap" in r.json()["error"]["message"]  # nothing non-compliant yet
    run = engine.evaluate_now(policy)
    answer(run, "a1", output={"exists": False})
    answer(run, "a2", output={"exists": True, "world_writable": False})
    engine.collect(run)
    r = c.post(url, {"agent_ids": ["a2", "elsewhere"]}, content_type="application/json")
    assert r.status_code == 409  # a2 is compliant; "elsewhere" is no target
    r = c.post(url, {}, content_type="application/json")
    assert r.status_code == 200, r.content
    fix = PolicyRun.objects.get(execution_id=r.json()["data"]["execution_id"])
    assert fix.phase == "fix" and fix.agent_ids == ["a1"]
    row = PolicyAgentStatus.objects.get(agent_id="a1")
    assert (row.status, row.fix_attempts) == ("fixing", 1)
    assert c.post(url, {}, content_type="application/json").status_code == 409  # a fix is in flight
    answer(fix, "a1", output={"ok": True})
    engine.collect(fix)
    verify = PolicyRun.objects.get(phase="verify")
    assert verify.agent_ids == ["a1"] and PolicyAgentStatus.objects.get(agent_id="a1").status == "fixing"
    answer(verify, "a1", output={"exists": True, "world_writable": False})
    engine.collect(verify)
    row.refresh_from_db()
    assert (row.status, row.fix_attempts) == ("compliant", 0)
    assert AuditEvent.objects.filter(action="policy.remediate", result="success").count() == 1


def test_a_fix_that_never_helps_ends_in_error_after_three_attempts():
    agents("a1")
    policy = make_policy()
    run = engine.evaluate_now(policy)
    answer(run, "a1", output={"exists": False})
    engine.collect(run)
    for attempt in range(1, 4):
        fix = engine.remediate(policy)
        answer(fix, "a1", output={})
        engine.collect(fix)
        verify = PolicyRun.objects.filter(phase="verify").first()
        answer(verify, "a1", output={"exists": False})
        engine.collect(verify)
        verify.delete()
        row = PolicyAgentStatus.objects.get()
        assert row.fix_attempts == attempt
    assert row.status == "error"
    with pytest.raises(services.YuzuError) as exc:
        engine.remediate(policy)
    assert exc.value.status == 409


def test_remediation_needs_a_fix_step(mint):
    agents("a1")
    PolicyFragment().apply_yaml(FRAGMENT.split("  fix:")[0]).save()
    policy = Policy.from_yaml(POLICY)
    PolicyAgentStatus.objects.create(policy=policy, agent_id="a1", status="non_compliant")
    r = admin_client(mint).post(f"/api/v1/policies/{policy.pk}/remediate", {}, content_type="application/json")
    assert r.status_code == 409 and "no fix step" in r.json()["error"]["message"]


def test_invalidate_resets_to_unknown_and_makes_the_policy_due(mint):
    agents("a1")
    policy = make_policy()
    PolicyAgentStatus.objects.create(policy=policy, agent_id="a1", status="compliant", last_check_at=timezone.now())
    policy.claim(timezone.now())
    r = admin_client(mint).post(f"/api/v1/policies/{policy.pk}/invalidate")
    assert r.json()["data"] == {"policies": 1, "rows_reset": 1}
    assert PolicyAgentStatus.objects.get().status == "unknown"
    assert Policy.objects.due(timezone.now()).filter(pk=policy.pk).exists()


# --- hostile documents (fuzz) --------------------------------------------------------------------------



LINES = FRAGMENT.splitlines()
mutated = st.builds(lambda i, junk: "\n".join(LINES[:i] + [junk] + LINES[i + 1:]),
                    st.integers(0, len(LINES) - 1), st.one_of(st.sampled_from(NASTY_STRINGS), st.text(max_size=60)))
documents_st = st.one_of(mutated, st.text(max_size=200), st.sampled_from(NASTY_STRINGS))


@settings(max_examples=60, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(text=documents_st)
def test_hostile_documents_get_a_400_or_a_201_never_a_500(mint, text):
    c = admin_client(mint)
    before = PolicyFragment.objects.count()
    r = c.post("/api/v1/policy-fragments", {"yaml_source": text}, content_type="application/json")
    assert r.status_code in (201, 400, 409), (text, r.content[:300])
    assert "Traceback" not in r.content.decode(errors="replace")
    assert PolicyFragment.objects.count() == before + (r.status_code == 201)
    PolicyFragment.objects.all().delete()


@pytest.mark.parametrize("value", [
    "9" * 5000,  # a decimal integer int() refuses to read (over 4,300 digits): ValueError out of the YAML loader
    "0x" + "f" * 5000,  # read (a power-of-two base has no limit), then a number no JSON column can write back
    "!!timestamp 2020-13-45",  # a timestamp the loader builds a date of: ValueError too
])
def test_a_number_or_date_the_loader_cannot_build_is_a_400(mint, value):
    """The YAML loader raises ValueError (no YAMLError) for these: a 500 on create, and nothing may be written."""
    c = admin_client(mint)
    assert c.post("/api/v1/policy-fragments", {"yaml_source": FRAGMENT}, content_type="application/json"
                  ).status_code == 201
    text = POLICY.replace("inputs: {path: /tmp/marker}", f"inputs: {{path: /tmp/marker, n: {value}}}")
    r = c.post("/api/v1/policies", text, content_type="application/yaml")
    assert r.status_code == 400, r.content[:300]
    assert not Policy.objects.exists()


# --- startup triggers --------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_startup_trigger_checks_an_agent_when_it_connects():
    make_policy(POLICY.replace("triggers: [{type: interval, interval_seconds: 120}, {type: startup}, "
                               "{type: file_change, path: /tmp}]", "triggers: [{type: startup}]"))
    make_policy(POLICY.replace("name: marker}", "name: scheduled-only}").replace(", {type: startup}", ""))
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        command = None
        if not django_settings.REDIS_URL:  # embedded: the dispatch reaches the agent in-process (with Redis: a worker's job)
            command = await comm.receive_json_from(timeout=5)
        for _ in range(100):
            if await database_sync_to_async(PolicyRun.objects.exists)():
                break
            await asyncio.sleep(0.05)
        await comm.disconnect()
        return agent_id, command

    agent_id, command = asyncio.run(scenario())
    if command is not None:
        assert (command["type"], command["plugin"], command["action"]) == ("command", "file", "stat")
    run = PolicyRun.objects.get()
    assert run.policy.name == "marker" and run.agent_ids == [agent_id]




# --- the read-only plugins the examples use ----------------------------------------------------------

def test_file_stat_and_file_grep_on_real_files(tmp_path):
    def run(name, **params):
        r = execute(PLUGINS, *name.split("."), params, Context())
        return r.status, json.loads(r.output) if r.output else None

    conf = tmp_path / "sshd_config"
    conf.write_text("# PermitRootLogin yes\nPort 22\nPermitRootLogin no\n")
    os.chmod(conf, 0o646)
    link = tmp_path / "link"
    link.symlink_to(conf)
    status, out = run("file.stat", path=str(link))
    assert status == "SUCCESS" and out["symlink"] and out["mode"] == "0646" and out["world_writable"]
    assert run("file.stat", path=str(tmp_path / "nope"))[1] == {"path": str(tmp_path / "nope"), "exists": False}
    status, out = run("file.grep", path=str(conf), pattern=r"^\s*PermitRootLogin\s+no\b")
    assert (status, out["matches"], out["lines"]) == ("SUCCESS", 1, [3])
    assert run("file.grep", path=str(tmp_path / "nope"), pattern="x")[1]["exists"] is False
    assert run("file.grep", path=str(conf), pattern="-v")[1]["matches"] == 0  # a pattern is never an option
    assert run("file.grep", path=str(conf), pattern="(")[0] == "FAILURE"  # grep's own error, reported
    evil = tmp_path / "evil"
    evil.write_text("a" * 5000 + "!\n")
    started = time.monotonic()
    assert run("file.grep", path=str(evil), pattern="^(a+)+$")[1]["matches"] == 0
    assert time.monotonic() - started < 5  # no catastrophic backtracking


@pytest.mark.django_db(transaction=True)
def test_evaluators_racing_dispatch_a_due_policy_once_and_write_a_run_once():
    """Four evaluators tick at the same instant (as several Celery workers would): the due policy is dispatched
    once, and later its run is collected once."""
    agents("a1")
    make_policy()
    barrier = threading.Barrier(4)

    def tick(at):
        barrier.wait()
        try:
            return engine.tick(at)
        finally:
            connections.close_all()

    now = timezone.now()
    with ThreadPoolExecutor(4) as pool:
        assert sum(d for _, d in pool.map(tick, [now] * 4)) == 1
    run = PolicyRun.objects.get()
    answer(run, "a1", output={"exists": True, "world_writable": False})
    later = now + timedelta(seconds=30)  # past the grace window, within the interval
    with ThreadPoolExecutor(4) as pool:
        assert [c for c, _ in pool.map(tick, [later] * 4)].count(1) == 1
    assert PolicyAgentStatus.objects.get().status == "compliant"


@pytest.mark.django_db(transaction=True)
def test_two_runs_of_a_policy_collected_at_once_both_write_their_verdicts():
    """Two runs checking a new agent (its startup check and the interval's, say), collected by two evaluators at
    the same instant: each found no verdict row and inserted one, and the second collection failed on the unique
    (policy, agent) — an IntegrityError with its traceback in the log, the run left for the next tick."""
    agents("a1")
    policy = make_policy()
    for _ in range(5):  # the failed collection showed within two rounds on PostgreSQL
        PolicyAgentStatus.objects.all().delete()
        runs = [engine.dispatch(policy, PolicyRun.Phase.CHECK, ["a1"]) for _ in range(2)]
        for run in runs:
            answer(run, "a1", output={"exists": True, "world_writable": False})
        now = timezone.now()
        assert at_once(*[partial(engine.collect, run, now) for run in runs]) == [("ok", 1), ("ok", 1)]
        assert PolicyAgentStatus.objects.get().status == "compliant"


def test_a_group_kill_switch_holds_its_agents_out_of_checks_and_fixes_at_no_cost(caplog):
    """The check and the fix go to the agents a group's kill switch does not hold back; a held agent's fix costs
    no attempt; a tick whose every target is held says so once as a warning (no traceback)."""
    _, a2 = agents("a1", "a2")
    lab = ManagementGroup.objects.create(name="lab")
    lab.members.add(a2)
    policy = make_policy()
    run = engine.evaluate_now(policy)
    answer(run, "a1", output={"exists": False})
    answer(run, "a2", output={"exists": False})
    engine.collect(run)
    PluginKillSwitch.objects.create(scope_key=f"script@{lab.pk}", plugin="script", group=lab, enabled=False,
                                    set_by="test")
    fix = engine.remediate(policy)
    assert fix.agent_ids == ["a1"]
    assert dict(PolicyAgentStatus.objects.values_list("agent_id", "fix_attempts")) == {"a1": 1, "a2": 0}
    PluginKillSwitch.objects.create(scope_key=f"file@{lab.pk}", plugin="file", group=lab, enabled=False, set_by="t")
    Agent.objects.filter(pk="a1").update(connected=False)  # the check now reaches only the held agent
    with pytest.raises(services.YuzuError) as exc:
        engine.evaluate_now(policy)
    assert exc.value.extra["reason"] == "kill_switched" and "in group lab" in exc.value.message
    with caplog.at_level("WARNING", logger="yuzu.compliance"):
        assert engine.tick(timezone.now() + timedelta(seconds=300))[1] == 0
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "not dispatched" in r.getMessage()]
    assert len(said) == 1 and said[0][0] == "WARNING" and "kill_switched" in said[0][1], caplog.records
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_metadata_name_another_document_has_is_a_409_on_create_and_replace(make_user):
    """create_policy, update_policy and update_fragment map the unique index's refusal to one 409 with its
    remediation, and write nothing: the document replaced keeps its name and definition."""
    principal = Principal(user=make_user("comp-writer"))
    make_policy()
    other = make_policy(POLICY.replace("name: marker}", "name: other}"))
    fragment = PolicyFragment.objects.get(name="marker-present")
    services.create_fragment(principal, FRAGMENT.replace("name: marker-present", "name: second"))
    second = PolicyFragment.objects.get(name="second")
    before = AuditEvent.objects.count()
    attempts = [
        ("policy", lambda: services.create_policy(principal, POLICY)),
        ("policy", lambda: services.update_policy(principal, other.pk, POLICY)),
        ("fragment", lambda: services.update_fragment(principal, second.pk, FRAGMENT)),
    ]
    for what, attempt in attempts:
        with pytest.raises(YuzuError) as refused:
            attempt()
        assert refused.value.status == 409, refused.value.message
        assert refused.value.message == f"a {what} with that metadata.name exists already"
        assert refused.value.remediation == f"choose another metadata.name, or delete the existing {what}"
    assert sorted(Policy.objects.values_list("name", flat=True)) == ["marker", "other"]
    assert Policy.objects.get(pk=other.pk).yaml_source == other.yaml_source
    assert PolicyFragment.objects.get(pk=second.pk).name == "second" and fragment.pk != second.pk
    assert AuditEvent.objects.count() == before
