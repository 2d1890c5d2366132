"""A NUL character (U+0000) in a REST path or query, or in an MCP argument, is a clear 400 / -32602 where the
request comes in. PostgreSQL stores NUL in no text column: the lookups of the compliance, DEX, operator,
governance and fleet routes and tools failed deep inside the request (DataError: a 500 or -32603 with a stack
trace in the log, their audit rows lost). On SQLite they answered not found or an empty result."""

import pytest

from tests.operations.conftest import Caller
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db

PATHS = ["/api/v1/plugin-config/os/kill-switch?group=a%00b", "/api/v1/dex/perf/group?group_id=a%00b&app=j",
         "/api/v1/dex/perf/compare?app=j&group=a%00b&baseline=1&candidate=2",
         "/api/v1/guaranteed-state/events?agent_id=a%00b", "/api/v1/guaranteed-state/status/a%00b",
         "/api/v1/guaranteed-state/rules/a%00b", "/api/v1/compliance/a%00b", "/api/v1/policies/a%00b",
         "/api/v1/inventory/software?name=a%00b", "/api/v1/sle/agents/a%00b", "/api/v1/engine-principals/engine:a%00b",
         "/api/v1/agents/a%00b", "/api/v1/policies?a%00=1"]


@pytest.mark.parametrize("path", PATHS)
def test_a_nul_in_a_rest_path_or_query_is_a_400(mint, client, path):
    raw = mint("adm", role="Administrator")
    r = client.get(path, HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 400, r.content
    assert "NUL character" in r.json()["error"]["message"]


CALLS = [("get_dex_group_app_perf", {"group_id": "a\x00b", "app": "j"}),
         ("query_software_licenses", {"agent_id": "a\x00b"}),
         ("get_compliance_summary", {"policy_id": "a\x00b"}),
         ("query_installed_software", {"name": "a\x00b"}),
         ("get_agent_details", {"agent_id": "a\x00b"})]


@pytest.mark.parametrize(("name", "args"), CALLS, ids=[c[0] for c in CALLS])
def test_a_nul_in_an_mcp_argument_is_32602_and_audited(mint, name, args):
    out, error = Caller(mint("adm", role="Administrator")).tool(name, args)
    assert out is None and error["code"] == -32602, error
    assert "NUL character: U+0000 at offset" in error["message"]
    assert AuditEvent.objects.filter(action=f"mcp.{name}", result="failure").exists()
