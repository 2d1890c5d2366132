"""The REST face: envelope, correlation ids, auth failures, permission denials, bounds, OpenAPI."""

import json
import re
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from uuid import UUID

import pytest
from django.test import Client
from django.utils import timezone

from fleet.models import Agent
from yuzu.models import ApiToken, AuditEvent

pytestmark = pytest.mark.django_db
CID = re.compile(r"^req-[0-9a-f]+-[0-9a-f]+$")


def api(token=None, **headers):
    if token:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return Client(**headers)


def post(c, path, data, **kw):
    return c.post(path, json.dumps(data) if not isinstance(data, (bytes, str)) else data,
                  content_type="application/json", **kw)


def test_success_envelope_and_correlation_id(mint):
    Agent.objects.create(agent_id="a1", hostname="h")
    r = api(mint("alice", "Viewer")).get("/api/v1/agents")
    body = r.json()
    assert r.status_code == 200 and body["meta"]["api_version"] == "v1"
    assert [a["agent_id"] for a in body["data"]] == ["a1"]
    assert CID.match(r["X-Correlation-Id"])


@pytest.mark.parametrize("headers", [{}, {"HTTP_AUTHORIZATION": "Bearer nope"}, {"HTTP_AUTHORIZATION": "Basic x"},
                                     {"HTTP_X_YUZU_TOKEN": "yuzu_" + "0" * 64}])
def test_missing_or_bad_credentials_are_401(headers):
    r = Client(**headers).get("/api/v1/tokens")
    assert r.status_code == 401 and r["WWW-Authenticate"].startswith("Bearer")
    err = r.json()["error"]
    assert err["code"] == 401 and CID.match(err["correlation_id"]) and err["correlation_id"] == r["X-Correlation-Id"]


def test_expired_and_revoked_tokens_are_401(mint):
    raw = mint("alice", "Viewer")
    ApiToken.objects.filter(owner__username="alice").update(expires_at=timezone.now())
    assert api(raw).get("/api/v1/tokens").status_code == 401
    raw2 = mint("bob", "Viewer")
    ApiToken.objects.filter(owner__username="bob").update(revoked_at=timezone.now())
    assert api(raw2).get("/api/v1/tokens").status_code == 401


def test_permission_denial_names_the_permission(mint):
    r = api(mint("alice", "Viewer")).get("/api/v1/rbac/roles")
    err = r.json()["error"]
    assert r.status_code == 403 and err["permission"] == "UserManagement:Read" and err["code"] == 403
    assert "remediation" in err and err["retry_after_ms"] is None


def test_malformed_json_and_wrong_shape_are_400(mint):
    c = api(mint("alice", "Viewer"))
    r = post(c, "/api/v1/rbac/check", "{oops")
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    r = post(c, "/api/v1/rbac/check", [1, 2])
    assert r.status_code == 400
    r = post(c, "/api/v1/rbac/check", {"securable_type": "Nope", "operation": "Read"})
    assert r.status_code == 400


@pytest.mark.django_db(transaction=True)
def test_oversized_body_is_413(mint):
    """Through the ASGI application, as a server runs it: bodies are bounded before Django sees them
    (yuzu/bodylimit.py; tests/e2e/test_transport_security.py streams them to a real daphne)."""
    from tests.support.mcp_http import request

    headers = {"authorization": f"Bearer {mint('alice', 'Viewer')}"}
    r = request(body=b"{" + b" " * (4 * 1024 * 1024 + 10) + b"}", headers=headers, path="/api/v1/rbac/check")
    assert r.status == 413 and r.json()["error"]["code"] == 413
    assert r.json()["error"]["message"] == "request body exceeds 4 MiB" and CID.match(r.headers["x-correlation-id"])


def test_unknown_ids_are_404(mint):
    c = api(mint("alice", "Administrator"))
    assert c.get("/api/v1/agents/ghost").status_code == 404
    assert c.get("/api/v1/management-groups/ghost").status_code == 404
    assert c.delete("/api/v1/tokens/ghost").status_code == 404
    r = c.get("/api/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


def test_token_lifecycle_over_rest(mint):
    c = api(mint("alice", "Operator"))
    r = post(c, "/api/v1/tokens", {"name": "ci", "mcp_tier": "readonly", "expires_at": "2030-01-01T00:00:00Z"})
    assert r.status_code == 400 and "90 days" in r.json()["error"]["message"]
    soon = (timezone.now() + timezone.timedelta(days=7)).isoformat()
    r = post(c, "/api/v1/tokens", {"name": "ci", "mcp_tier": "readonly", "expires_at": soon})
    assert r.status_code == 201
    new = r.json()["data"]
    assert new["token"].startswith("yuzu_")
    listed = c.get("/api/v1/tokens").json()["data"]
    assert new["id"] in [t["id"] for t in listed] and all("token" not in t for t in listed)
    rot = post(c, f"/api/v1/tokens/{new['id']}/rotate", {"overlap_secs": 60}).json()["data"]
    assert post(c, f"/api/v1/tokens/{rot['id']}/confirm", {}).status_code == 200
    assert c.delete(f"/api/v1/tokens/{rot['id']}").json()["data"]["revoked"] is True
    assert api(rot["token"]).get("/api/v1/tokens").status_code == 401
    assert AuditEvent.objects.filter(action__startswith="api_token.").count() >= 4


def test_rbac_check_and_roles(mint):
    r = post(api(mint("alice", "Viewer", tier="readonly")), "/api/v1/rbac/check",
             {"securable_type": "Tag", "operation": "Write"}).json()["data"]
    assert r == {"securable_type": "Tag", "operation": "Write", "allowed": False, "rbac_allowed": False,
                 "tier_allowed": False}
    admin = api(mint("root", "Administrator"))
    names = [x["name"] for x in admin.get("/api/v1/rbac/roles").json()["data"]]
    assert {"Administrator", "Operator", "Viewer", "Approver", "ITServiceOwner"} <= set(names)
    perms = admin.get("/api/v1/rbac/roles/Viewer/permissions").json()["data"]["permissions"]
    assert "Infrastructure:Read" in perms and "Execution:Execute" not in perms


def test_management_groups_over_rest(mint, make_user):
    Agent.objects.create(agent_id="a1")
    make_user("carol")
    c = api(mint("root", "Administrator"))
    g = post(c, "/api/v1/management-groups", {"name": "web"}).json()["data"]
    assert post(c, "/api/v1/management-groups", {"name": "web"}).status_code == 400
    assert post(c, f"/api/v1/management-groups/{g['id']}/members", {"agent_id": "a1"}).status_code == 201
    assert c.get(f"/api/v1/management-groups/{g['id']}").json()["data"]["members"] == ["a1"]
    upd = c.put(f"/api/v1/management-groups/{g['id']}", json.dumps({"description": "web tier"}),
                content_type="application/json").json()["data"]
    assert upd["description"] == "web tier"
    assert post(c, f"/api/v1/management-groups/{g['id']}/roles", {"username": "carol", "role": "ITServiceOwner"}
                ).status_code == 201
    roles = c.get(f"/api/v1/management-groups/{g['id']}/roles").json()["data"]["roles"]
    assert roles == [{"username": "carol", "role": "ITServiceOwner"}]
    bad = post(c, "/api/v1/management-groups", {"name": "dyn", "membership_type": "dynamic",
                                                "scope_expression": "ostype =="})
    assert bad.status_code == 400 and "position" in bad.json()["error"]["message"]
    assert api(mint("v", "Viewer")).post("/api/v1/management-groups", "{}", content_type="application/json"
                                         ).status_code == 403


def test_unlock_and_audit(mint, make_user):
    from yuzu.models import AccountLockout

    bob = make_user("bob", password="correct horse battery")
    AccountLockout.objects.create(user=bob, failed_attempts=5, locked_until=timezone.now() + timezone.timedelta(minutes=5))
    c = api(mint("root", "Administrator"))
    r = post(c, "/api/v1/users/bob/unlock", {})
    assert r.json()["data"] == {"username": "bob", "unlocked": True, "was_locked": True}
    rows = c.get("/api/v1/audit?action=account.").json()["data"]
    assert rows[0]["action"] == "account.unlock" and rows[0]["principal"] == "root"
    assert c.get("/api/v1/audit?limit=9999").status_code == 400


def test_openapi_document_is_valid_json_with_a_contract_for_every_route():
    from openapi_spec_validator import validate

    from yuzu.api.contract import tool_input

    r = Client().get("/api/v1/openapi.json")
    assert r.status_code == 200 and r["Content-Type"].startswith("application/vnd.oai.openapi+json")
    doc = json.loads(r.content)
    validate(doc)
    assert doc["openapi"] == "3.1.0"
    assert doc["components"]["securitySchemes"]["bearer"] == {**doc["components"]["securitySchemes"]["bearer"],
                                                              "type": "http", "scheme": "bearer"}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            ok_codes = [c for c in op["responses"] if c.startswith("2")]
            assert ok_codes, (method, path)
            body = op["responses"][ok_codes[0]]["content"]["application/json"]["schema"]
            assert body["required"] == ["data", "meta"], (method, path)  # the envelope, with a data schema
            assert op["responses"]["403"] and op["summary"], (method, path)
            assert {"bearer": []} in op["security"] or {"bridgeWorker": []} in op["security"], (method, path)
    # One contract: the REST body IS the MCP tool's input schema (without approval_id).
    body = doc["paths"]["/api/v1/executions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == json.loads(json.dumps(tool_input("execute_instruction")))
    assert "approval_id" not in body["properties"]
    yaml = Client().get("/api/v1/openapi.yaml")
    assert yaml.status_code == 200 and yaml.content.startswith(b"openapi: 3.1.0")


def test_generating_the_openapi_document_warns_about_nothing(capsys):
    from drf_spectacular.generators import SchemaGenerator

    SchemaGenerator().get_schema(request=None, public=True)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_api_docs_page_loads_nothing_from_a_third_party():
    r = Client().get("/api/v1/docs")
    page = r.content.decode()
    assert r.status_code == 200 and "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert "http://" not in page and "https://" not in page and "googleapis" not in page


def test_rest_bodies_are_checked_against_the_same_schema_as_the_tool(mint):
    c = api(mint("olive", "Operator"))
    for body, where in (({"plugin": 5, "action": "info"}, "/plugin"), ({"plugin": "os"}, "/"),
                        ({"plugin": "os", "action": "info", "bogus": 1}, "/"),
                        ({"plugin": "os", "action": "info", "agent_ids": "a1"}, "/agent_ids")):
        r = post(c, "/api/v1/executions", body)
        assert r.status_code == 400, (body, r.content)
        assert r.json()["error"]["message"].startswith(f"body does not match the schema at '{where}'"), r.json()
    assert post(c, "/api/v1/tokens/x/rotate", {"overlap_secs": "1"}).json()["error"]["message"].startswith(
        "body does not match the schema at '/overlap_secs'")


def test_a_trailing_slash_or_a_wrong_mcp_path_says_where_to_go():
    from tests.support.mcp_http import request

    r = Client().get("/api/v1/agents/")
    assert r.status_code == 404 and r.json()["error"]["remediation"] == \
        "this API's paths have no trailing slash: use /api/v1/agents"
    assert "openapi.json" in Client().get("/api/v1/nope").json()["error"]["remediation"]
    for path in ("/mcp", "/mcp/", "/mcp/v2/"):
        r = request("POST", {"jsonrpc": "2.0", "id": 1, "method": "ping"}, path=path)
        assert r.status == 404, path
        assert "/mcp/v1/" in r.json()["error"]["remediation"] and "/mcp/bridge/" in r.json()["error"]["remediation"]


@pytest.mark.django_db(transaction=True)
def test_out_of_range_numeric_filters_are_400_not_500(client, mint):
    """Issue 10 item 8: GET /api/v1/audit?since=99999999999999 answered 500 (datetime overflow)."""
    from tests.support.mcp_http import McpClient

    token = mint("auditor", role="Administrator")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    for query in ("since=99999999999999", "until=-1", "since=1e3", "since=" + "9" * 400, "limit=0", "limit=501"):
        r = client.get(f"/api/v1/audit?{query}", **auth)
        assert r.status_code == 400, (query, r.content)
        assert r.json()["error"]["message"].split(" ")[0] in ("since", "until", "limit")
    assert client.get("/api/v1/audit?since=253402300799", **auth).status_code == 200
    mcp = McpClient(mint("auditor2", role="Administrator", tier="readonly"))
    mcp.initialize()
    for args in ({"since": 99999999999999}, {"until": -1}, {"since": 10 ** 30}):
        err = mcp.call("query_audit_log", args).error
        assert err["code"] == -32602 and "arguments do not match the tool input schema" in err["message"], args


@pytest.mark.django_db(transaction=True)
def test_scope_tools_take_scope_and_keep_expression_as_an_alias(mint):
    from tests.support.mcp_http import McpClient

    c = McpClient(mint("vic", role="Viewer", tier="readonly"))
    c.initialize()
    for args in ({"scope": "ostype == linux"}, {"expression": "ostype == linux"},
                 {"scope": "ostype == linux", "expression": "ostype == linux"}):
        assert c.call("validate_scope", args).json()["result"]["structuredContent"]["valid"] is True, args
        assert c.call("preview_scope_targets", args).json()["result"]["structuredContent"]["total"] == 0
    err = c.call("validate_scope", {"scope": "ostype == linux", "expression": "ostype == windows"}).error
    assert err["code"] == -32602 and "not two different ones" in err["message"]
    assert c.call("validate_scope", {}).error["code"] == -32602
    rest = api(mint("val", "Viewer"))
    assert post(rest, "/api/v1/scope/validate", {"scope": "ostype == linux"}).json()["data"]["valid"] is True
    assert post(rest, "/api/v1/scope/validate", {"expression": "ostype =="}).json()["data"]["valid"] is False


@pytest.mark.parametrize("data", [
    {"at": datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC), "naive": datetime(2026, 1, 2), "day": date(2026, 1, 2),
     "time": time(3, 4, 5, 6), "span": timedelta(seconds=3), "price": Decimal("1.50"), "id": UUID(int=7)},
    {"js": "line\u2028para\u2029end", "text": "é ✓ \U0001f600", "int_key": {1: "x"}, "big": 2**70},
    {"int_key": {1: "x", None: [2]}, "at": datetime(2026, 1, 2, tzinfo=UTC)},  # keys no str: orjson's second try
    [None, True, 0.1, -0, ""], None, "plain",
])
def test_the_orjson_renderer_writes_what_drfs_json_renderer_wrote(data):
    """REST replies are written by orjson (yuzu.api.renderers); their bytes are DRF's JSONRenderer's, datetimes,
    decimals, JavaScript-unsafe separators and what orjson refuses (a big int) included."""
    from rest_framework.renderers import JSONRenderer as DrfRenderer

    from yuzu.api.renderers import JSONRenderer
    assert JSONRenderer().render(data) == DrfRenderer().render(data)
    assert JSONRenderer().render({"x": data}, "application/json; indent=2") == \
        DrfRenderer().render({"x": data}, "application/json; indent=2")


def test_the_openapi_document_is_built_once_whoever_asks(mint, monkeypatch):
    """It was cached by Django's cache_page, whose key holds the Authorization header of a request that bears one,
    the query string and the Accept header: each new token (or ``?x=1``) built the document again — 1.4-1.9 s of
    CPU a request on daphne, and another 2.5 MB kept. Nothing in it depends on the caller (drf-spectacular's public
    document: every route, not filtered by the caller's permissions), so it is built once and every caller —
    whatever their role, tier or credential — is served the same, complete document."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer, OpenApiYamlRenderer

    from yuzu.api import openapi
    from yuzu.mcp_tools import openapi_resource

    full = json.loads(json.dumps(SchemaGenerator().get_schema(request=None, public=True)))
    openapi.forget()
    work = []
    for cls in (SchemaGenerator, OpenApiYamlRenderer, OpenApiJsonRenderer):
        name = "get_schema" if cls is SchemaGenerator else "render"
        real = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda self, *a, _real=real, _cls=cls, **kw: work.append(_cls) or _real(
            self, *a, **kw))
    admin, viewer, other_viewer = mint("root", "Administrator"), mint("vic", "Viewer"), mint("val", "Viewer")
    readonly = mint("ro", "Operator", tier="readonly")
    callers = [api(admin), api(viewer), api(other_viewer), api(readonly), api(), api(HTTP_X_YUZU_TOKEN=viewer)]
    for path, accept, content_type in [
            ("/api/v1/openapi.yaml", "application/vnd.oai.openapi", "application/vnd.oai.openapi; charset=utf-8"),
            ("/api/v1/openapi.yaml", "application/yaml", "application/yaml; charset=utf-8"),
            ("/api/v1/openapi.json", "application/vnd.oai.openapi+json", "application/vnd.oai.openapi+json"),
            ("/api/v1/openapi.json", "application/json", "application/json")]:
        bodies = set()
        for c in callers:
            for query in ("", "?x=1", "?version=v9"):
                r = c.get(path + query, HTTP_ACCEPT=accept)
                assert r.status_code == 200 and r["Content-Type"] == content_type, (path, query, r.content[:200])
                bodies.add(r.content)
        assert len(bodies) == 1, path
        body = bodies.pop()
        doc = json.loads(body) if "json" in path else __import__("yaml").safe_load(body)
        assert doc == full  # every route, the admin-only ones too, for the Viewer and the anonymous caller alike
    assert "/api/v1/users/{username}/unlock" in full["paths"] and full["info"]["version"] == "v1"
    assert json.loads(json.dumps(openapi_resource(None))) == full  # the MCP resource: the same document
    assert sorted(w.__name__ for w in work) == ["OpenApiJsonRenderer", "OpenApiYamlRenderer", "SchemaGenerator"]
    # A JSON indentation is a rendering of its own (bounded: 1-8); a bad token is still a 401.
    r = api(viewer).get("/api/v1/openapi.json", HTTP_ACCEPT="application/json; indent=2")
    assert r.content.startswith(b'{\n  "openapi"') and json.loads(r.content) == full
    assert api("yuzu_not_a_token").get("/api/v1/openapi.yaml").status_code == 401
    assert api().get("/api/v1/openapi.yaml", HTTP_ACCEPT="text/html").status_code == 406
