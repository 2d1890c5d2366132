"""Approving tickets in process, and reading MCP answers."""

import time

from approvals.models import Approval
from approvals.services import review
from yuzu.models import TOTPDevice
from yuzu.rbac import Principal

PASSWORD = "approver-password-1"


def approver_principal(make_user, username="ann", role="Administrator"):
    """A staff user with a confirmed TOTP device, as a session principal with a fresh proof (what the admin's
    step-up gives a reviewer); ``.device`` is the device."""
    user = make_user(username, role, password=PASSWORD)
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    principal = Principal(user=user, via="session", mfa_verified_at=time.time())
    principal.device = device
    return principal


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
