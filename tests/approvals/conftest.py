"""Fixtures of the approval tests."""

import gc

import pytest

from tests.support.approvals import approver_principal
from tests.support.mcp_http import McpClient


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
    return approver_principal(make_user, "carol", "Approver")