"""An execution and its execution.start audit row commit together (issue 22, docs/operations.md): a database
that fails between them leaves neither; a broker that is down cancels the execution and answers 503."""

import pytest
import redis
from django.db import OperationalError
from kombu.exceptions import OperationalError as BrokerError

from fleet import executions as ex_svc
from fleet.models import Agent, AgentExecStatus, Execution
from fleet.tasks import dispatch_execution
from yuzu.errors import YuzuError
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def op(principal):
    Agent.objects.create(agent_id="a1", hostname="host-a1", os="linux", connected=True)
    return principal("olive", "Operator")


def test_a_database_lost_before_the_audit_row_leaves_no_execution(op, monkeypatch):
    real = ex_svc.audit

    def lost(principal, action, *a, **kw):
        if action == "execution.start":
            raise OperationalError("server closed the connection unexpectedly")
        return real(principal, action, *a, **kw)

    monkeypatch.setattr(ex_svc, "audit", lost)
    sent = []
    monkeypatch.setattr(dispatch_execution, "delay", lambda *a, **k: sent.append(a))
    with pytest.raises(OperationalError):
        ex_svc.start_execution(op, plugin="os", action="info")
    assert not Execution.objects.exists() and not AgentExecStatus.objects.exists()
    assert not sent  # nothing dispatched for rows that do not exist


def test_the_broker_down_cancels_the_execution_and_answers_503(op, monkeypatch):
    def down(*a, **k):
        raise BrokerError(redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379"))

    monkeypatch.setattr(dispatch_execution, "delay", down)
    with pytest.raises(YuzuError) as info:
        ex_svc.start_execution(op, plugin="os", action="info")
    err = info.value
    assert (err.status, err.rpc_code, err.retry_after_ms, err.extra["store"]) == (503, -32603, 5000, "redis")
    ex = Execution.objects.get(pk=err.extra["execution_id"])
    assert ex.status == "cancelled"
    results = set(AuditEvent.objects.filter(action="execution.start", target_id=ex.id).values_list("result", flat=True))
    assert results == {"success", "failure"}  # created (with the rows), then its dispatch refused
