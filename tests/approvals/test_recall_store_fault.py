"""A store fault under a gated recall burns no ticket and half-writes nothing (issue 22, docs/operations.md):
the ticket's consumption and the handler's writes are one transaction (mcp.pipeline._recall_atomically)."""

import pytest
from django.db import OperationalError

from approvals.models import Approval
from fleet.models import Tag
from tests.support.approvals import approve, error_of, result_of
from yuzu import audit as audit_module
from yuzu.models import AuditEvent

from .test_approvals import ARGS, mint_ticket, tagged_agent  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("release_worker_connections")]


def test_a_store_fault_after_the_consume_rolls_the_consume_back(mcp, tagged_agent, approver, monkeypatch):  # noqa: F811
    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)

    def lost_connection(agent_id):  # the tag is deleted, then the database goes away (a PostgreSQL restart)
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr("fleet.services.push_tags", lost_connection)
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert err["code"] == -32603 and err["data"]["retry_after_ms"] == 5000, err
    assert err["data"]["store"] == "database"
    ticket = Approval.objects.get(pk=tid)
    assert ticket.status == Approval.APPROVED and ticket.consumed_at is None  # not burned
    assert Tag.objects.filter(agent_id="host-1", key="owner").exists()  # the handler's write rolled back with it
    assert not AuditEvent.objects.filter(action="tag.delete").exists()  # and its audit row: nothing half-written
    refusal = AuditEvent.objects.filter(action="mcp.delete_tag").order_by("-id").first()
    assert refusal.result == "failure" and "approval_untouched=store_fault" in refusal.detail

    monkeypatch.undo()  # the store is back: the same ticket works, once
    result_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert Approval.objects.get(pk=tid).consumed_at is not None
    assert not Tag.objects.filter(agent_id="host-1", key="owner").exists()
    assert AuditEvent.objects.filter(action="tag.delete", result="success").count() == 1
    assert error_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))["code"] != -32603  # already used


def test_a_refused_recall_still_commits_its_audit_row(mcp, tagged_agent, approver):  # noqa: F811
    alice = mcp("alice")
    tid = mint_ticket(alice)  # pending: the recall is refused with -32006 inside the recall's transaction
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert err["code"] == -32006
    assert AuditEvent.objects.filter(action="mcp.delete_tag", result="pending", detail__contains="still pending").exists()


def test_a_recall_whose_approved_row_cannot_be_written_consumes_nothing(mcp, tagged_agent, approver,  # noqa: F811
                                                                        monkeypatch):
    """The store goes away after the handler ran, as the call's own ``approved`` row is written: the row, the
    consumption and the handler's writes roll back together — never a consumed ticket without its row (found by
    the PostgreSQL outage scenario: the row used to be written after the recall's transaction committed)."""
    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)
    real = audit_module._insert

    def store_gone(events):
        if any(e.result == "approved" for e in events):
            raise OperationalError("server closed the connection unexpectedly")
        return real(events)

    monkeypatch.setattr(audit_module, "_insert", store_gone)
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert err["code"] == -32603 and err["data"]["store"] == "database", err
    ticket = Approval.objects.get(pk=tid)
    assert ticket.status == Approval.APPROVED and ticket.consumed_at is None
    assert Tag.objects.filter(agent_id="host-1", key="owner").exists()
    assert not AuditEvent.objects.filter(action="tag.delete").exists()
    assert not AuditEvent.objects.filter(action="mcp.delete_tag", result="approved").exists()

    monkeypatch.undo()
    result_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert Approval.objects.get(pk=tid).consumed_at is not None
    assert AuditEvent.objects.filter(action="mcp.delete_tag", result="approved").count() == 1
