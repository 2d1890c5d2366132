"""Dispatch claims its agents with one conditional UPDATE per batch (fleet.tasks._claim): racing workers —
Celery redelivering a task, or a re-run while the first still sends — send each agent its command exactly
once. Real threads on the configured database (SQLite by default; PostgreSQL with YUZU_DATABASE_URL)."""

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from fleet import tasks
from fleet.models import Agent, AgentExecStatus, AgentState, Execution

pytestmark = pytest.mark.django_db(transaction=True)
N = 300


@pytest.fixture
def execution():
    Agent.objects.bulk_create([Agent(agent_id=f"c{i:03}", hostname=f"host-c{i:03}", os="linux", connected=True)
                               for i in range(N)])
    ex = Execution.objects.create(plugin="os", action="info", command_id="os-claims", dispatched_by="olive",
                                  agents_targeted=N, expires_at=timezone.now() + timedelta(minutes=5))
    AgentExecStatus.objects.bulk_create([AgentExecStatus(execution=ex, agent_id=f"c{i:03}") for i in range(N)])
    return ex


def race(n, target):
    start = threading.Barrier(n)
    errors = []

    def run(i):
        try:
            start.wait()
            target(i)
        except Exception as exc:  # surfaced below, not lost in the thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_a_claim_is_one_statement_and_takes_each_pending_agent_once(execution, monkeypatch):
    monkeypatch.setattr(tasks, "CLAIM_BATCH", 40)
    claimed = [[] for _ in range(4)]

    def worker(i):
        while batch := tasks._claim(execution.id):
            assert len(batch) <= 40
            claimed[i].extend(batch)

    race(4, worker)
    counts = Counter(a for batch in claimed for a in batch)
    assert len(counts) == N and set(counts.values()) == {1}, counts.most_common(3)
    rows = set(AgentExecStatus.objects.filter(execution=execution).values_list("status", "attempts"))
    assert rows == {(AgentState.DISPATCHED, 1)}
    assert not AgentExecStatus.objects.filter(execution=execution, last_sent_at=None).exists()
    assert tasks._claim(execution.id) == []  # nothing left: a redelivered task claims nothing


def test_racing_dispatch_tasks_send_each_agent_the_command_exactly_once(execution, monkeypatch):
    monkeypatch.setattr(tasks, "CLAIM_BATCH", 64)
    monkeypatch.setattr(tasks, "_schedule", lambda *a: None)  # re-send checks are not this test's subject
    sent = Counter()
    lock = threading.Lock()

    async def record(agent_ids, message):
        assert message["payload"]["command_id"] == "os-claims" and not message.get("resend")
        with lock:
            sent.update(agent_ids)

    monkeypatch.setattr(tasks, "send_to_agents", record)
    totals = []
    race(3, lambda i: totals.append(tasks.dispatch_execution(execution.id)))
    assert sum(totals) == N and len(sent) == N and set(sent.values()) == {1}


def test_a_claim_leaves_other_executions_and_other_states_alone(execution):
    other = Execution.objects.create(plugin="os", action="info", command_id="os-other", dispatched_by="olive",
                                     agents_targeted=1, expires_at=timezone.now() + timedelta(minutes=5))
    AgentExecStatus.objects.create(execution=other, agent_id="c000")
    AgentExecStatus.objects.filter(execution=execution, agent_id="c001").update(status=AgentState.SUCCESS)
    assert len(tasks._claim(execution.id)) == N - 1
    assert AgentExecStatus.objects.get(execution=other).status == AgentState.PENDING
    assert AgentExecStatus.objects.get(execution=execution, agent_id="c001").attempts == 0


def test_a_cancel_between_the_running_check_and_the_claim_sends_nothing(execution, monkeypatch):
    """dispatch_execution checks that the execution runs, then claims a batch: a cancel committed in between
    withheld the pending agents (Execution.cancel: "never sent the command") and the claim took and sent them
    anyway. The claim itself now requires a running execution."""
    sent = []

    async def record(agent_ids, message):
        sent.extend(agent_ids)

    claim = tasks._claim

    def cancelled_first(execution_id):  # the cancel lands in the window, every time
        assert Execution.objects.get(pk=execution_id).cancel("operator stop") == (True, N)
        return claim(execution_id)

    monkeypatch.setattr(tasks, "send_to_agents", record)
    monkeypatch.setattr(tasks, "_schedule", lambda *a: None)
    monkeypatch.setattr(tasks, "_claim", cancelled_first)
    assert tasks.dispatch_execution(execution.id) == 0 and sent == []
    assert set(AgentExecStatus.objects.filter(execution=execution).values_list("status", "error_detail")) == {
        (AgentState.PENDING, "cancelled before dispatch")}
