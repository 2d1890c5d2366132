"""Fixtures of the approval tests."""

import gc
import time

import pytest
from django_otp.plugins.otp_totp.models import TOTPDevice

from tests.support.approvals import PASSWORD
from tests.support.mcp_http import McpClient
from yuzu.rbac import Principal


@pytest.fixture
def release_worker_connections():
    """In-process MCP calls run in short-lived worker threads, each with its own database connection;
    collect them after every test so a PostgreSQL run does not hold dozens of idle connections."""
    yield
    gc.collect()


@pytest.fixture
def mcp(mint):
    """mcp(username, role, tier) → an initialized in-process MCP client for a fresh token."""

    def make(username="alice", role="Operator", tier="operator"):
        c = McpClient(mint(username, role=role, tier=tier))
        c.initialize()
        return c

    return make


@pytest.fixture
def approver(make_user):
    """carol: an Approver (staff) with a TOTP device, as a session principal with a fresh proof."""
    user = make_user("carol", "Approver", password=PASSWORD)
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    principal = Principal(user=user, via="session", mfa_verified_at=time.time())
    principal.device = device
    return principal
