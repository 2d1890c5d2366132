"""The REST face: envelope, correlation ids, auth failures, permission denials, bounds, OpenAPI."""

import json
import re

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
    (yuzu/bodylimit.py; tests/test_transport_security.py streams them to a real daphne)."""
    from .mcp_http import request

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


def test_openapi_document_is_valid(mint):
    from openapi_spec_validator import validate

    r = Client().get("/api/v1/openapi.json")
    assert r.status_code in (200, 401)
    doc = json.loads(api(mint("alice", "Viewer")).get("/api/v1/openapi.json", HTTP_ACCEPT="application/json").content)
    validate(doc)
    assert "/api/v1/tokens" in doc["paths"] and "/api/v1/management-groups/{group_id}" in doc["paths"]


def test_api_docs_page(mint):
    r = api(mint("alice", "Viewer")).get("/api/v1/docs")
    assert r.status_code == 200 and b"redoc" in r.content.lower()
