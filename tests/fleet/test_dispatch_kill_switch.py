"""A kill switch engaged after a command was launched stops its sends from then on: the background dispatch
(fleet.tasks.dispatch_execution) asks the dispatch gates (operations' kill switches) before each batch of first
sends and before each round of re-sends, not only the plan and the launch (docs/fleet.md, "Kill switches and the
dispatch"). Real switches flipped through operations.plugins, on the configured database (SQLite by default;
PostgreSQL with YUZU_DATABASE_URL)."""

from collections import Counter
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import DatabaseError
from django.test import Client
from django.utils import timezone
from jsonschema import Draft202012Validator

from fleet import events, executions, mcp_tools, tasks
from fleet.models import Agent, AgentExecStatus, AgentState, Execution, ManagementGroup, Response
from fleet.responses import record_responses
from mcp.registry import catalogue
from operations import plugins
from operations.models import PluginKillSwitch
from tests.fleet.test_dispatch_claims import race
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)
AGENTS = ["a1", "a2", "a3", "a4"]  # a3 and a4 are in group lab


@pytest.fixture
def sent(monkeypatch):
    """[(agent ids, whether a re-send)] for every send the dispatch makes; nothing is scheduled or enqueued (the
    test runs the dispatch task itself, after it flipped a switch)."""
    sends = []

    async def record(agent_ids, message):
        sends.append((sorted(agent_ids), bool(message.get("resend"))))

    monkeypatch.setattr(tasks, "send_to_agents", record)
    monkeypatch.setattr(tasks, "_schedule", lambda *a: None)
    monkeypatch.setattr(executions, "_enqueue", lambda *a: None)
    return sends


@pytest.fixture
def fleet(db):
    lab = ManagementGroup.objects.create(name="lab")
    since = timezone.now() - timedelta(minutes=10)
    for agent_id in AGENTS:
        Agent.objects.create(agent_id=agent_id, hostname=f"{agent_id}.example", os="linux", connected=True,
                             connected_since=since)
    lab.members.add(*Agent.objects.filter(pk__in=["a3", "a4"]))
    return lab


@pytest.fixture
def admin(principal):
    return principal("root", "Administrator")


@pytest.fixture
def launched(fleet, principal, sent):
    """An execution of os.info to the four agents, launched (rows pending) while no switch was off."""
    receipt = executions.start_execution(principal("olive", "Operator"), plugin="os", action="info", agent_ids=AGENTS)
    assert receipt["agents_reached"] == 4 and "kill_switched_agents" not in receipt
    return receipt["execution_id"]


def switch(admin, enabled, group=""):
    plugins.set_plugin_kill_switch(admin, "os", enabled, reason="" if enabled else "incident 42", group=group)


def resends_due(eid):
    """Every agent sent the command a minute ago and reconnected since (the evidence of a loss), none has
    acknowledged it: a re-send is due for each."""
    now = timezone.now()
    AgentExecStatus.objects.filter(execution_id=eid).update(last_sent_at=now - timedelta(seconds=60))
    Agent.objects.update(connected_since=now - timedelta(seconds=30))


def rows(eid):
    return {r.agent_id: r for r in AgentExecStatus.objects.filter(execution_id=eid)}


def assert_stopped(eid, admin, mint):
    """The execution is cancelled with the fleet-wide switch's refusal as its reason, everywhere a caller reads it:
    the view (MCP, valid against its output schema, and REST), its progress event, a streamed call's result, and an
    audit row."""
    ex = Execution.objects.get(pk=eid)
    assert ex.status == "cancelled" and ex.completed_at is not None
    view = ex.to_dict()
    assert view["status_reason"].startswith("kill_switched: os.info refused") and "incident 42" in view["status_reason"]
    assert not list(Draft202012Validator(catalogue("v1").tools["get_execution_status"].output_schema).iter_errors(view))
    assert events.event(ex)["status_reason"] == view["status_reason"] and events.event(ex)["terminal"]
    assert mcp_tools._final(eid, {"execution_id": eid})["status_reason"] == view["status_reason"]  # a streamed call's
    rest = Client(headers={"Authorization": f"Bearer {mint('olive', role='Operator')}"})
    assert rest.get(f"/api/v1/executions/{eid}").json()["data"]["status_reason"] == view["status_reason"]
    row = AuditEvent.objects.get(action="execution.cancel", target_id=eid)
    assert row.principal == tasks.SYSTEM and row.result == "success" and "kill_switched" in row.detail


def test_a_fleet_wide_switch_engaged_after_launch_stops_the_first_sends(launched, sent, admin, mint):
    switch(admin, False)
    assert tasks.dispatch_execution(launched) == 0 and sent == []
    assert {(r.status, r.attempts, r.error_detail) for r in rows(launched).values()} == {
        (AgentState.PENDING, 0, "cancelled before dispatch")}
    assert_stopped(launched, admin, mint)
    switch(admin, True)  # released: the execution stays stopped, nothing is sent
    assert tasks.dispatch_execution(launched) == 0 and sent == []
    assert Execution.objects.get(pk=launched).status == "cancelled"


def test_a_fleet_wide_switch_engaged_between_two_batches_stops_the_second(launched, sent, admin, mint, monkeypatch):
    """A 5,000-agent fan-out is sent a batch at a time: the gates are asked before each batch is sent."""
    monkeypatch.setattr(tasks, "CLAIM_BATCH", 2)
    first = tasks.send_to_agents

    async def kill_after_the_first_batch(agent_ids, message):
        await first(agent_ids, message)
        await sync_to_async(switch)(admin, False)

    monkeypatch.setattr(tasks, "send_to_agents", kill_after_the_first_batch)
    assert tasks.dispatch_execution(launched) == 2 and sent == [(["a1", "a2"], False)]
    assert {a: r.status for a, r in rows(launched).items()} == {"a1": "dispatched", "a2": "dispatched",
                                                                "a3": "pending", "a4": "pending"}
    assert_stopped(launched, admin, mint)


def test_a_groups_switch_holds_back_only_its_agents_for_good(launched, sent, admin, fleet):
    switch(admin, False, group="lab")
    assert tasks.dispatch_execution(launched) == 2 and sent == [(["a1", "a2"], False)]
    held = rows(launched)
    for agent_id in ("a3", "a4"):  # never sent: answered as the agent answers a switched-off plugin
        row = held[agent_id]
        assert (row.status, row.attempts, row.last_sent_at, row.acknowledged_at) == ("rejected", 0, None, None)
        assert row.error_detail.startswith("kill_switched: os.info") and "not sent" in row.error_detail
        answer = Response.objects.get(execution_id=launched, agent_id=agent_id).to_dict()
        assert answer["status"] == "REJECTED" and answer["error"] == row.error_detail
        assert "lab" not in answer["error"] and "incident 42" not in answer["error"]  # no other group's switch named
    ex = Execution.objects.get(pk=launched)
    assert (ex.status, ex.agents_responded, ex.agents_failure) == ("running", 2, 2)
    switch(admin, True, group="lab")  # released: nothing resumes, the held agents stay held
    assert tasks.dispatch_execution(launched) == 0 and len(sent) == 1
    record_responses([(a, {"command_id": ex.command_id, "status": "SUCCESS", "exit_code": 0}) for a in ("a1", "a2")])
    ex.refresh_from_db()
    assert (ex.status, ex.agents_responded, ex.agents_success, ex.agents_failure) == ("completed", 4, 2, 2)


def test_a_fleet_wide_switch_stops_the_re_sends(launched, sent, admin, mint):
    assert tasks.dispatch_execution(launched) == 4
    resends_due(launched)
    switch(admin, False)
    assert tasks.dispatch_execution(launched) == 0 and sent == [(AGENTS, False)]
    assert Execution.objects.get(pk=launched).resent == 0
    assert {(r.status, r.attempts) for r in rows(launched).values()} == {(AgentState.DISPATCHED, 1)}
    assert_stopped(launched, admin, mint)
    assert tasks._next_check(launched) is None  # no re-send is ever due again


def test_a_groups_switch_stops_the_re_sends_to_its_agents_for_good(launched, sent, admin):
    assert tasks.dispatch_execution(launched) == 4
    resends_due(launched)
    switch(admin, False, group="lab")
    assert tasks.dispatch_execution(launched) == 2 and sent[1:] == [(["a1", "a2"], True)]
    held = rows(launched)
    for agent_id in ("a3", "a4"):  # sent once, maybe running: kept dispatched (its answer still counts), not re-sent
        assert (held[agent_id].status, held[agent_id].attempts) == (AgentState.DISPATCHED, 1)
        assert held[agent_id].error_detail.startswith("kill_switched: not sent again")
    assert Execution.objects.get(pk=launched).resent == 2
    switch(admin, True, group="lab")  # released: their re-sends do not resume
    resends_due(launched)
    assert tasks.dispatch_execution(launched) == 2 and sent[2:] == [(["a1", "a2"], True)]
    AgentExecStatus.objects.filter(execution_id=launched, agent_id__in=["a1", "a2"]).update(status="success")
    assert tasks._next_check(launched) is None  # the held agents are never due again
    ex = Execution.objects.get(pk=launched)
    record_responses([("a3", {"command_id": ex.command_id, "status": "SUCCESS", "exit_code": 0})])
    assert rows(launched)["a3"].status == "success"  # an answer from a held agent that had it is still recorded


def test_a_switch_store_that_cannot_be_read_sends_nothing_and_asks_again(launched, sent, monkeypatch):
    """Fail closed, honestly: the batch is not sent, its agents stay pending (the claim rolled back) and the
    execution keeps running — a store fault is not a switch — and the dispatch is asked again after the hint."""
    scheduled = []
    monkeypatch.setattr(tasks, "_schedule", lambda eid, sensitive, delay: scheduled.append((eid, delay)))

    def broken(*a, **kw):
        raise DatabaseError("down")

    with monkeypatch.context() as m:
        m.setattr(PluginKillSwitch.objects, "filter", broken)
        assert tasks.dispatch_execution(launched) == 0 and sent == []
    assert scheduled == [(launched, 2.0)]
    assert {(r.status, r.attempts, r.error_detail) for r in rows(launched).values()} == {(AgentState.PENDING, 0, "")}
    assert Execution.objects.get(pk=launched).status == "running"
    assert tasks.dispatch_execution(launched) == 4  # the store is back: sent


def test_racing_dispatch_tasks_never_send_to_a_held_agent(sent, admin, monkeypatch, db):
    """Three workers racing over 300 agents in batches of 32, half of them in a switched-off group: each other
    agent is sent the command once, no held one ever, and the counters stay exact (the holds are answered inside
    each claim's transaction)."""
    monkeypatch.setattr(tasks, "CLAIM_BATCH", 32)
    n = 300
    lab = ManagementGroup.objects.create(name="lab")
    Agent.objects.bulk_create([Agent(agent_id=f"c{i:03}", hostname=f"c{i:03}", os="linux", connected=True)
                               for i in range(n)])
    lab.members.add(*Agent.objects.filter(agent_id__in=[f"c{i:03}" for i in range(0, n, 2)]))
    ex = Execution.objects.create(plugin="os", action="info", command_id="os-race", dispatched_by="olive",
                                  agents_targeted=n, expires_at=timezone.now() + timedelta(minutes=5))
    AgentExecStatus.objects.bulk_create([AgentExecStatus(execution=ex, agent_id=f"c{i:03}") for i in range(n)])
    switch(admin, False, group="lab")
    race(3, lambda i: tasks.dispatch_execution(ex.id))
    counts = Counter(a for agent_ids, _ in sent for a in agent_ids)
    assert set(counts) == {f"c{i:03}" for i in range(1, n, 2)} and set(counts.values()) == {1}
    ex.refresh_from_db()
    assert (ex.status, ex.agents_responded, ex.agents_failure) == ("running", n // 2, n // 2)
    assert Counter(AgentExecStatus.objects.filter(execution=ex).values_list("status", flat=True)) == {
        "dispatched": n // 2, "rejected": n // 2}
    assert Response.objects.filter(execution=ex, status="rejected").count() == n // 2
