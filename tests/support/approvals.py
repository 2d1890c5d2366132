"""Approving tickets in process, and reading MCP answers."""

from approvals.models import Approval
from approvals.services import review

PASSWORD = "approver-password-1"


def approve(approver, approval_id, decision=Approval.APPROVED):
    return review(approver, approval_id, decision, "looks fine")


def error_of(resp):
    assert resp.status == 200, resp.body
    err = resp.json().get("error")
    assert err is not None, resp.body
    return err


def result_of(resp):
    assert resp.status == 200, resp.body
    body = resp.json()
    assert "error" not in body, body
    return body["result"]
