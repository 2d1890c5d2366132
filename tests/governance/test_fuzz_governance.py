"""Fuzz coverage for every governance tool and route (the generic fuzz samples the whole catalogue; this aims at
these 21 tools and their REST twins with an Administrator's untiered token — the one that reaches the service
functions — and a supervised one): hostile arguments and bodies get a clear -32602 / 400 (or a refusal), never
a 5xx, a stack trace or an ERROR log; nothing is half-written."""

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from governance.models import EnginePrincipal
from mcp.registry import catalogue
from tests.support.fuzz import any_json, from_schema
from tests.support.mcp_http import McpClient, request
from tests.yuzu.test_fuzz import Errors  # noqa: F401  (the error_log fixture's handler)

pytestmark = pytest.mark.django_db(transaction=True)

GOVERNANCE = sorted(t.name for t in catalogue("v1").tools.values() if t.module == "governance.mcp_tools")
ROUTES = [("post", "/api/v1/engine-principals"), ("delete", "/api/v1/engine-principals/engine:fz"),
          ("post", "/api/v1/engine-principals/engine:fz/credentials"),
          ("post", "/api/v1/engine-principals/engine:fz/credentials/rotate"),
          ("post", "/api/v1/engine-principals/engine:fz/credentials/confirm"),
          ("post", "/api/v1/engine-principals/engine:fz/transfer-owner"),
          ("post", "/api/v1/engine-principals/engine:fz/roles"), ("post", "/api/v1/access-reviews"),
          ("post", "/api/v1/access-reviews/00000000-0000-4000-8000-000000000000/attestations"),
          ("post", "/api/v1/secrets/kek/rotate"), ("post", "/api/v1/secrets/kek/rewrap")]


@pytest.fixture
def error_log():
    import logging  # deferred: only this fixture touches the root logger

    handler = Errors()
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)


def test_every_governance_tool_is_fuzzed(mint, make_user, error_log):
    assert len(GOVERNANCE) == 21
    make_user("owen")
    admin = McpClient(mint("fz-admin", role="Administrator", days=None))
    admin.initialize()
    supervised = McpClient(mint("fz-admin", role="Administrator", tier="supervised"))
    supervised.initialize()
    tools = {t: catalogue("v1").tools[t] for t in GOVERNANCE}

    @settings(max_examples=300, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(name=st.sampled_from(GOVERNANCE), data=st.data(), who=st.sampled_from([admin, supervised]))
    def one(name, data, who):
        args = data.draw(from_schema(tools[name].input_schema))
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": args}}
        r = request(body=body, headers=who.headers())
        assert r.status < 500 and b"Traceback" not in r.body, (name, args, r.body[:300])

    one()
    assert not error_log.records, error_log.report()
    for ep in EnginePrincipal.objects.all():  # whatever was created is whole: an account, an owner
        assert ep.account.username == ep.principal_id and ep.owner_id


def test_every_governance_route_is_fuzzed(mint, make_user, error_log):
    make_user("owen")
    c = Client(HTTP_AUTHORIZATION=f"Bearer {mint('fz-admin', role='Administrator', days=None)}")

    @settings(max_examples=200, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(route=st.sampled_from(ROUTES), body=any_json)
    def one(route, body):
        method, path = route
        r = getattr(c, method)(path, body, content_type="application/json")
        assert r.status_code < 500 and b"Traceback" not in r.content, (route, body, r.content[:300])

    one()
    assert not error_log.records, error_log.report()
