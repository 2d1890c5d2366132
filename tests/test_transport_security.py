"""The transport's guards against a real daphne (issue 10): what another site's page can do with an admin's
session cookie, and test-only switches that must not exist in production."""

import subprocess
import sys

import pytest

from .conftest import ROOT, free_port, server_env

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def test_the_removed_anonymous_switch_refuses_to_start(tmp_path):
    """YUZU_MCP_TEST_ANONYMOUS_USER used to turn unauthenticated calls into a Viewer. Set on a server now,
    daphne refuses to start instead of serving."""
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "yuzu.asgi:application"],
                          cwd=ROOT, env=server_env(YUZU_MCP_TEST_ANONYMOUS_USER="viewer"), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert "YUZU_MCP_TEST_ANONYMOUS_USER is no longer supported" in proc.stderr
