"""Executions: the start_execution bounds of spec §2.4, target resolution, response accounting,
the overdue sweep, cancel, the reads and bundle collation."""

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from fleet import executions as ex_svc
from fleet import responses
from fleet.events import execution_group
from fleet.models import (
    Agent,
    AgentExecStatus,
    AgentState,
    Execution,
    ManagementGroup,
    Response,
)
from fleet.push import agent_group
from fleet.tasks import dispatch_execution, sweep_overdue
from yuzu.errors import NotFound, YuzuError


@pytest.fixture(autouse=True)
def eager_celery():
    """Dispatch runs in the test process; with YUZU_REDIS_URL set the app would otherwise queue to a broker."""
    from yuzu.celery import app

    old = app.conf.task_always_eager
    app.conf.CELERY_TASK_ALWAYS_EAGER = True  # the app reads Django settings with the CELERY_ namespace
    yield
    app.conf.CELERY_TASK_ALWAYS_EAGER = old


@pytest.fixture
def agents(db):
    def make(*ids, **fields):
        fields.setdefault("connected", True)
        return [Agent.objects.create(agent_id=a, hostname=f"host-{a}", os="linux", **fields) for a in ids]

    return make


@pytest.fixture
def op(principal):
    return principal("olive", "Operator")


@pytest.fixture
def start(op, django_capture_on_commit_callbacks):
    """start_execution as the Operator, running the on-commit dispatch."""

    def run(principal=None, **kw):
        kw.setdefault("plugin", "os")
        kw.setdefault("action", "info")
        with django_capture_on_commit_callbacks(execute=True):
            return ex_svc.start_execution(principal or op, **kw)

    return run


def refused(start, **kw):
    with pytest.raises(YuzuError) as info:
        start(**kw)
    assert (info.value.status, info.value.rpc_code) == (400, -32602)
    return info.value.message


# --- §2.4 bounds -------------------------------------------------------------------------------

def test_plugin_and_action_are_required_and_bounded_in_bytes(start, agents):
    agents("a1")
    assert refused(start, plugin="") == "plugin is required"
    assert refused(start, plugin=None) == "plugin is required"
    assert refused(start, action="  ") == "action is required"
    assert refused(start, plugin="é" * 65) == "plugin exceeds 128 bytes"  # 65 characters, 130 bytes
    assert refused(start, action="a" * 129) == "action exceeds 128 bytes"
    assert start(plugin="p" * 128, action="a" * 128)["status"] == "running"
    assert Execution.objects.count() == 1  # a refused call creates nothing


def test_plugin_and_action_are_lower_cased(start, agents):
    agents("a1")
    out = start(plugin="OS", action="Info")
    assert (out["plugin"], out["action"]) == ("os", "info") and out["command_id"].startswith("os-")
    assert len(out["command_id"]) == len("os-") + 16


def test_params_bounds(start, agents):
    agents("a1")
    assert refused(start, params=["x"]) == "params must be an object"
    assert refused(start, params={f"k{i}": "v" for i in range(33)}) == "params has 33 keys; at most 32 are allowed"
    assert start(params={f"k{i}": "v" for i in range(32)})["status"] == "running"
    assert "must be 1-256 bytes" in refused(start, params={"k" * 257: "v"})
    assert start(params={"k" * 256: "v"})["status"] == "running"
    assert refused(start, params={"v": "x" * (64 * 1024 + 1)}) == "params value of 'v' exceeds 65536 bytes"
    assert start(params={"v": "x" * 64 * 1024})["status"] == "running"
    # Non-strings are measured by their JSON dump (the list below is 65 537 bytes as JSON) ...
    assert "exceeds 65536 bytes" in refused(start, params={"v": ["x" * (64 * 1024 - 3)]})
    # ... and stored stringified.
    out = start(params={"n": 5, "flag": True, "obj": {"a": [1]}})
    assert Execution.objects.get(pk=out["execution_id"]).parameter_values == {"n": "5", "flag": "true",
                                                                               "obj": '{"a":[1]}'}


def test_scope_bounds(start, agents):
    agents("a1")
    assert refused(start, scope="") == "scope is empty"
    assert refused(start, scope="   ") == "scope is empty"
    assert refused(start, scope=5) == "scope must be a string"
    assert refused(start, scope="hostname == " + "x" * 8192) == "scope exceeds 8192 bytes"
    with pytest.raises(YuzuError) as info:
        start(scope="hostname ==")
    assert info.value.message.startswith("invalid scope expression:") and "position" in info.value.extra


def test_agent_ids_bounds(start, agents):
    agents("a1")
    assert refused(start, agent_ids=[]) == "agent_ids is empty"
    assert refused(start, agent_ids="a1") == "agent_ids must be an array of strings"
    assert refused(start, agent_ids=["a1", 7]) == "agent_ids entries must be strings"
    assert refused(start, agent_ids=["x" * 129]) == "an agent_ids entry must be 1-128 bytes"
    assert refused(start, agent_ids=["a"] * 10001) == "agent_ids has 10001 entries; at most 10000 are allowed"
    assert start(agent_ids=["a1"] + [f"missing-{i}" for i in range(9999)])["agents_reached"] == 1


def test_scope_and_agent_ids_are_mutually_exclusive(start, agents):
    agents("a1")
    assert refused(start, scope="__all__", agent_ids=["a1"]) == "scope and agent_ids are mutually exclusive"


def test_an_omitted_target_means_all_agents(start, agents):
    agents("a1", "a2", "a3")
    out = start()
    assert out == {"command_id": out["command_id"], "execution_id": out["execution_id"], "agents_reached": 3,
                   "plugin": "os", "action": "info", "status": "running"}
    ex = Execution.objects.get(pk=out["execution_id"])
    assert ex.status == "running" and ex.agents_targeted == 3 and ex.dispatched_by == "olive"
    assert set(ex.agent_statuses.values_list("status", flat=True)) == {"dispatched"}


def test_scope_selects_targets(start, agents):
    agents("a1", "a2")
    Agent.objects.filter(pk="a2").update(hostname="db-1")
    out = start(scope='hostname LIKE "db-*"')
    assert out["agents_reached"] == 1
    assert Execution.objects.get(pk=out["execution_id"]).scope_expression == 'hostname LIKE "db-*"'
    assert list(AgentExecStatus.objects.values_list("agent_id", flat=True)) == ["a2"]


# --- targets -----------------------------------------------------------------------------------

def test_zero_agents_is_no_agents_reached_and_cancelled(start, agents):
    agents("offline", connected=False)
    out = start(agent_ids=["offline", "unknown"])
    assert out["status"] == "no_agents_reached" and out["agents_reached"] == 0 and out["message"]
    ex = Execution.objects.get(pk=out["execution_id"])
    assert ex.status == "cancelled" and ex.completed_at is not None and not ex.agent_statuses.exists()


def test_targets_are_confined_to_visible_unquarantined_connected_agents(start, agents, principal):
    agents("in-group", "outside", "quarantined-in-group")
    agents("offline-in-group", connected=False)
    Agent.objects.filter(pk="quarantined-in-group").update(quarantined=True)
    g = ManagementGroup.objects.create(name="web")
    g.members.add("in-group", "quarantined-in-group", "offline-in-group")
    owner = principal("sam", "ITServiceOwner", group=g)
    out = start(owner, agent_ids=["in-group", "outside", "quarantined-in-group", "offline-in-group"])
    assert out["agents_reached"] == 1
    assert list(AgentExecStatus.objects.values_list("agent_id", flat=True)) == ["in-group"]
    assert start(owner, agent_ids=["outside"])["status"] == "no_agents_reached"
    assert start(owner)["agents_reached"] == 1  # "all agents" is all the caller may execute on


def test_sensitive_parameters_are_stored_redacted_but_reach_the_agent(start, agents):
    agents("a1")
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(agent_group("a1"), channel)
    out = start(params={"path": "/etc/hosts", "api_token": "s3cret", "Password": "hunter2"})
    ex = Execution.objects.get(pk=out["execution_id"])
    assert ex.parameter_values == {"path": "/etc/hosts", "api_token": "[redacted]", "Password": "[redacted]"}
    message = async_to_sync(layer.receive)(channel)
    assert message["type"] == "agent.command"
    assert message["payload"] == {"type": "command", "command_id": out["command_id"], "plugin": "os",
                                  "action": "info", "parameters": {"path": "/etc/hosts", "api_token": "s3cret",
                                                                   "Password": "hunter2"},
                                  "expires_at": ex.expires_at.timestamp()}


@pytest.mark.django_db(transaction=True)
def test_a_dispatch_failure_cancels_and_answers_500(agents, op, monkeypatch):
    agents("a1")

    def broken(*a, **k):
        raise ConnectionError("broker down")

    monkeypatch.setattr(dispatch_execution, "delay", broken)
    with pytest.raises(YuzuError) as info:
        ex_svc.start_execution(op, plugin="os", action="info")  # autocommit: dispatch runs at once
    err = info.value
    assert (err.status, err.rpc_code, err.retry_after_ms) == (500, -32603, 5000)
    ex = Execution.objects.get(pk=err.extra["execution_id"])
    assert ex.status == "cancelled" and ex.last_error_detail.startswith("dispatch failed")
    # its reason is shown to the execution's readers: the queue's own error (hosts, ports) stays in the log
    assert ex.to_dict()["status_reason"] == "dispatch failed: the task queue did not take it (ConnectionError)"


def test_dispatch_is_idempotent_and_stops_when_cancelled(start, agents, op):
    agents("a1", "a2")
    out = start()
    assert dispatch_execution(out["execution_id"]) == 0  # a redelivered task sends nothing twice
    ex = Execution.objects.create(plugin="os", action="info", command_id="os-manual", dispatched_by="olive",
                                  agents_targeted=2, expires_at=timezone.now() + timedelta(minutes=5))
    for a in ("a1", "a2"):
        AgentExecStatus.objects.create(execution=ex, agent_id=a)
    assert ex_svc.cancel_execution(op, ex.id)["agents_withheld"] == 2
    assert dispatch_execution(ex.id) == 0
    assert set(ex.agent_statuses.values_list("status", "error_detail")) == {("pending", "cancelled before dispatch")}


# --- responses ---------------------------------------------------------------------------------

def frame(command_id, status, output="", exit_code=None, error=None):
    return {"command_id": command_id, "status": status, "output": output, "exit_code": exit_code, "error": error}


def test_record_response_counts_and_turns_succeeded(start, agents):
    agents("a1", "a2")
    out = start()
    cid, eid = out["command_id"], out["execution_id"]
    responses.record_response("a1", frame(cid, "RUNNING", "part"))
    responses.record_response("a1", frame(cid, "SUCCESS", "partial and full", 0))
    ex = Execution.objects.get(pk=eid)
    assert (ex.status, ex.agents_responded, ex.agents_success) == ("running", 1, 1)
    r = Response.objects.get(execution_id=eid, agent_id="a1")  # the RUNNING row was updated in place
    assert (r.status, r.output, r.exit_code, r.instruction_id, r.plugin) == (AgentState.SUCCESS, "partial and full", 0,
                                                                             cid, "os")
    responses.record_response("a2", frame(cid, "SUCCESS", "ok", 0))
    ex.refresh_from_db()
    assert (ex.status, ex.agents_responded, ex.agents_success, ex.agents_failure) == ("succeeded", 2, 2, 0)
    assert ex.completed_at is not None and ex.progress_pct == 100.0
    assert set(AgentExecStatus.objects.values_list("status", flat=True)) == {"success"}


def test_record_response_with_a_failure_turns_completed_and_ignores_duplicates(start, agents):
    agents("a1", "a2", "a3")
    out = start()
    cid, eid = out["command_id"], out["execution_id"]
    responses.record_response("a1", frame(cid, "SUCCESS", "ok", 0))
    responses.record_response("a1", frame(cid, "SUCCESS", "again", 0))  # duplicate terminal frame
    responses.record_response("a1", frame(cid, "FAILURE", "late", 1))  # a different late frame
    responses.record_response("a1", frame(cid, "RUNNING", "stale"))
    responses.record_response("outsider", frame(cid, "SUCCESS"))  # not a target
    responses.record_response("a1", frame("os-unknown", "SUCCESS"))  # unknown command
    ex = Execution.objects.get(pk=eid)
    assert (ex.agents_responded, ex.agents_success, ex.agents_failure) == (1, 1, 0)
    assert Response.objects.get(agent_id="a1").output == "ok" and Response.objects.count() == 1
    responses.record_response("a2", frame(cid, "FAILURE", "boom", 2, "exit code 2"))
    responses.record_response("a3", frame(cid, "REJECTED", error="unknown plugin/action"))
    ex.refresh_from_db()
    assert (ex.status, ex.agents_responded, ex.agents_success, ex.agents_failure) == ("completed", 3, 1, 2)
    assert AgentExecStatus.objects.get(agent_id="a2").exit_code == 2


def test_each_change_publishes_an_event(start, agents):
    agents("a1")
    layer = get_channel_layer()
    out = start()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(execution_group(out["execution_id"]), channel)
    responses.record_response("a1", frame(out["command_id"], "SUCCESS", "ok", 0))
    event = async_to_sync(layer.receive)(channel)
    assert event == {"type": "execution.event", "execution_id": out["execution_id"], "status": "succeeded",
                     "agents_targeted": 1, "agents_responded": 1, "agents_success": 1, "agents_failure": 0,
                     "terminal": True}


def test_sweep_marks_silent_agents_timeout(start, agents):
    agents("a1", "a2")
    out = start()
    cid, eid = out["command_id"], out["execution_id"]
    responses.record_response("a1", frame(cid, "SUCCESS", "ok", 0))
    responses.record_response("a2", frame(cid, "RUNNING", "half"))
    assert sweep_overdue() == 0  # not yet expired
    Execution.objects.filter(pk=eid).update(expires_at=timezone.now() - timedelta(seconds=10))
    assert sweep_overdue() == 1
    assert sweep_overdue() == 0  # idempotent
    r = Response.objects.get(agent_id="a2")
    assert r.status == AgentState.TIMEOUT and r.output == "half" and "expired" in r.error_detail
    assert AgentExecStatus.objects.get(agent_id="a2").status == "timeout"
    ex = Execution.objects.get(pk=eid)
    assert (ex.status, ex.agents_responded, ex.agents_failure) == ("completed", 2, 1)


def test_sweep_marks_agents_whose_heartbeats_stopped_disconnected(agents):
    agents("silent", last_seen=timezone.now() - timedelta(minutes=5))
    agents("beating", last_seen=timezone.now())
    sweep_overdue()
    assert dict(Agent.objects.values_list("agent_id", "connected")) == {"silent": False, "beating": True}


# --- cancel and reads --------------------------------------------------------------------------

def test_cancel_and_status(start, agents, op, principal):
    agents("a1")
    out = start()
    eid = out["execution_id"]
    status = ex_svc.execution_status(op, eid)
    assert status["status"] == "running" and status["retry_after_ms"] == 2000 and status["progress_pct"] == 0.0
    assert set(status) >= {"id", "definition_id", "plugin", "action", "status", "scope_expression", "dispatched_by",
                           "dispatched_at", "completed_at", "agents_targeted", "agents_responded", "agents_success",
                           "agents_failure", "progress_pct", "retry_after_ms", "bundle_id"}
    g = ManagementGroup.objects.create(name="web")
    g.members.add("a1")
    with pytest.raises(NotFound):  # neither the dispatcher nor a holder of a fleet-wide grant
        ex_svc.cancel_execution(principal("sam", "ITServiceOwner", group=g), eid)
    assert ex_svc.cancel_execution(op, eid)["status"] == "cancelled"
    status = ex_svc.execution_status(op, eid)
    assert status["status"] == "cancelled" and status["retry_after_ms"] is None and status["completed_at"]
    responses.record_response("a1", frame(out["command_id"], "SUCCESS", "ran anyway", 0))  # still recorded
    assert ex_svc.execution_status(op, eid)["status"] == "cancelled"
    assert Response.objects.get(agent_id="a1").output == "ran anyway"
    with pytest.raises(NotFound, match="Execution not found: nope"):
        ex_svc.execution_status(op, "nope")


def test_list_query_and_aggregate(start, agents, op):
    agents("a1", "a2")
    out = start(definition_id="demo.os")
    cid, eid = out["command_id"], out["execution_id"]
    start(plugin="disk", action="usage")
    listed = ex_svc.list_executions(op, definition_id="demo.os")
    assert listed["count"] == 1 and listed["executions"][0]["id"] == eid
    assert ex_svc.list_executions(op, limit=1)["count"] == 1

    responses.record_response("a1", frame(cid, "SUCCESS", "ok", 0))
    q = ex_svc.query_responses(op, execution_id=eid)
    assert q["count"] == 1 and q["execution_status"] == "running" and q["retry_after_ms"] == 2000
    assert q["responses"][0] == {"agent_id": "a1", "execution_id": eid, "status": "SUCCESS", "output": "ok",
                                 "exit_code": 0, "error": None, "timestamp": q["responses"][0]["timestamp"]}
    responses.record_response("a2", frame(cid, "FAILURE", "no", 1, "exit code 1"))
    q = ex_svc.query_responses(op, execution_id=eid, limit=1)
    assert q["result_truncated_by_cap"] is True and q["retry_after_ms"] is None and q["execution_status"] == "completed"
    assert ex_svc.query_responses(op, instruction_id=cid, status="FAILURE")["responses"][0]["agent_id"] == "a2"
    assert ex_svc.query_responses(op, instruction_id=cid)["retry_after_ms"] is None  # only with execution_id
    agg = ex_svc.aggregate_responses(op, execution_id=eid, group_by="status")
    assert sorted((g["key"], g["count"]) for g in agg["groups"]) == [("FAILURE", 1), ("SUCCESS", 1)]
    assert agg["total"] == 2
    with pytest.raises(YuzuError):
        ex_svc.aggregate_responses(op, execution_id=eid, group_by="hostname")
    with pytest.raises(NotFound):
        ex_svc.query_responses(op, execution_id="nope")


# --- bundles -----------------------------------------------------------------------------------

def test_bundle_collation(agents, op, principal, django_capture_on_commit_callbacks):
    agents("a1")
    steps = [{"plugin": "os", "action": "info"}, {"plugin": "file", "action": "hash", "params": {"path": "/x"}},
             {"plugin": "disk", "action": "usage"}]
    with django_capture_on_commit_callbacks(execute=True):
        b = ex_svc.start_bundle(op, agent_id="a1", steps=steps)
    assert b["bundle_id"].startswith("bundle-") and b["expected"] == 3 and b["agent_id"] == "a1"
    exs = list(Execution.objects.filter(bundle_id=b["bundle_id"]).order_by("bundle_step"))
    assert [(e.bundle_step, e.plugin) for e in exs] == [(0, "os"), (1, "file"), (2, "disk")]
    result = ex_svc.bundle_result(op, b["bundle_id"])
    assert (result["complete"], result["received"], result["retry_after_ms"]) == (False, 0, 2000)
    responses.record_response("a1", frame(exs[0].command_id, "SUCCESS", "os out", 0))
    responses.record_response("a1", frame(exs[1].command_id, "FAILURE", "", None, "cannot read /x"))
    responses.record_response("a1", frame(exs[2].command_id, "RUNNING", "partial"))
    result = ex_svc.bundle_result(op, b["bundle_id"])
    assert (result["complete"], result["received"], result["succeeded"]) == (False, 2, 1)
    responses.record_response("a1", frame(exs[2].command_id, "SUCCESS", "disk out", 0))
    result = ex_svc.bundle_result(op, b["bundle_id"])
    assert (result["complete"], result["received"], result["succeeded"], result["expected"]) == (True, 3, 2, 3)
    assert result["retry_after_ms"] is None
    assert [(s["plugin"], s["action"], s["state"], s["status"], s["output"]) for s in result["steps"]] == [
        ("os", "info", "succeeded", "SUCCESS", "os out"), ("file", "hash", "completed", "FAILURE", ""),
        ("disk", "usage", "succeeded", "SUCCESS", "disk out")]
    g = ManagementGroup.objects.create(name="web")
    g.members.add("a1")
    with pytest.raises(NotFound):  # owner-guarded: a group-scoped reader is neither owner nor global
        ex_svc.bundle_result(principal("sam", "ITServiceOwner", group=g), b["bundle_id"])


def test_bundle_bounds(agents, op):
    agents("a1")
    with pytest.raises(YuzuError, match="steps must be an array of 1-32 steps"):
        ex_svc.start_bundle(op, agent_id="a1", steps=[])
    with pytest.raises(YuzuError, match="steps must be an array of 1-32 steps"):
        ex_svc.start_bundle(op, agent_id="a1", steps=[{"plugin": "os", "action": "info"}] * 33)
    with pytest.raises(YuzuError, match=r"steps\[1\]: action is required"):
        ex_svc.start_bundle(op, agent_id="a1", steps=[{"plugin": "os", "action": "info"}, {"plugin": "os"}])
    with pytest.raises(NotFound, match="Agent not found: ghost"):
        ex_svc.start_bundle(op, agent_id="ghost", steps=[{"plugin": "os", "action": "info"}])
    assert not Execution.objects.exists()


def test_quarantine_dispatches_what_the_agents_plugin_accepts(agents, principal, django_capture_on_commit_callbacks):
    from jsonschema import Draft202012Validator

    from fleet.agent.plugins import PLUGINS
    from fleet.inventory import quarantine_device

    agents("q1", "q2")
    admin = principal("root", "Administrator")
    with django_capture_on_commit_callbacks(execute=True):
        out = quarantine_device(admin, "q1", reason="suspected compromise", whitelist="10.0.0.1")
    ex = Execution.objects.get(pk=out["execution_id"])
    assert (ex.plugin, ex.action, ex.agents_targeted) == ("quarantine", "quarantine", 1)
    schema = PLUGINS["quarantine.quarantine"].params
    assert not list(Draft202012Validator(schema).iter_errors(ex.parameter_values))  # the agent will not REJECT it
    q1 = Agent.objects.get(pk="q1")
    assert q1.quarantined and q1.quarantine_reason == "suspected compromise"
    assert quarantine_device(admin, "q1")["already_quarantined"] is True
    # A quarantined agent is withheld from every later dispatch.
    with django_capture_on_commit_callbacks(execute=True):
        later = ex_svc.start_execution(admin, plugin="os", action="info")
    assert later["agents_reached"] == 1
    with pytest.raises(NotFound):
        quarantine_device(principal("nobody", None), "q2")


def test_execution_reads_are_confined_to_the_callers_groups(start, agents, op, principal, client):
    """Issue 10 item 10: list_executions / get_execution_status (and REST) showed every execution to anyone
    holding Execution:Read on one group."""
    agents("web-1", "db-1")
    web, db_ = ManagementGroup.objects.create(name="web"), ManagementGroup.objects.create(name="db")
    web.members.add("web-1")
    db_.members.add("db-1")
    on_web = start(agent_ids=["web-1"])["execution_id"]
    on_db = start(agent_ids=["db-1"])["execution_id"]
    on_both = start(agent_ids=["web-1", "db-1"])["execution_id"]
    owner = principal("wendy", "ITServiceOwner", group=web)
    mine = start(principal=owner, agent_ids=["web-1"])["execution_id"]

    def listed(p):
        return {row["id"] for row in ex_svc.list_executions(p)["executions"]}

    assert listed(op) == {on_web, on_db, on_both, mine}  # a fleet-wide reader
    assert listed(owner) == {on_web, mine}
    assert ex_svc.execution_status(owner, on_web)["id"] == on_web
    for hidden in (on_db, on_both):
        with pytest.raises(NotFound, match="Execution not found"):
            ex_svc.execution_status(owner, hidden)
    # The REST twins read the same.
    from yuzu.models import ApiToken

    _, raw = ApiToken.mint(owner.user, "rest")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    assert {r["id"] for r in client.get("/api/v1/executions", **auth).json()["data"]["executions"]} == {on_web, mine}
    assert client.get(f"/api/v1/executions/{on_db}", **auth).status_code == 404
    assert client.get(f"/api/v1/executions/{on_web}", **auth).status_code == 200
