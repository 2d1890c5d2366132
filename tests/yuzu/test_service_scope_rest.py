"""A service-scoped token is refused, on the REST face too, every capability whose MCP tool refuses it (class
"denied": it reaches beyond one service's devices). The PKI, governance and compliance routes let it through:
a token scoped to service=payments listed the CA's certificates, read the KEK status and the access-review
evidence, and read or rewrote the fleet's compliance policies. (The operator routes: tests/operations.)"""

import pytest

from compliance.models import Policy, PolicyFragment
from tests.support.compliance import FRAGMENT

pytestmark = pytest.mark.django_db

ROUTES = [
    ("get", "/api/v1/ca/issued", None),
    ("post", "/api/v1/ca/revoke", {"serial_hex": "AB"}),
    ("get", "/api/v1/secrets/kek/status", None),
    ("post", "/api/v1/secrets/kek/rotate", {}),
    ("get", "/api/v1/engine-principals", None),
    ("get", "/api/v1/access-reviews", None),
    ("get", "/api/v1/access-reviews/export", None),
    ("post", "/api/v1/access-reviews", {"title": "q4"}),
    ("get", "/api/v1/policies", None),
    ("get", "/api/v1/compliance", None),
    ("post", "/api/v1/policy-fragments", {"yaml_source": FRAGMENT}),
    ("get", "/api/v1/guaranteed-state/rules", None),
    ("get", "/api/v1/guaranteed-state/events", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_a_service_scoped_token_is_refused_the_fleet_wide_routes(mint, client, method, path, body):
    raw = mint("svc-admin", role="Administrator", scope_service="payments")
    kw = {"content_type": "application/json"} if body is not None else {}
    r = getattr(client, method)(path, *([body] if body is not None else []), HTTP_AUTHORIZATION=f"Bearer {raw}",
                                **kw)
    assert r.status_code == 403, r.content
    assert "service-scoped" in r.json()["error"]["message"]
    assert not PolicyFragment.objects.exists() and not Policy.objects.exists()


def test_an_unscoped_token_still_reaches_them(mint, client):
    raw = mint("admin", role="Administrator")
    for path in ("/api/v1/ca/issued", "/api/v1/secrets/kek/status", "/api/v1/policies", "/api/v1/access-reviews"):
        assert client.get(path, HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200, path


def test_the_self_check_refuses_a_service_scoped_token(mint, client):
    """POST /rbac/check has no RBAC gate of its own and asked nothing at all — not the service scope its MCP twin
    check_permission (class "denied") refuses, which every REST route but the twins of the confined tools refuses.
    The refusal now lives in rbac.check_tier, which the routes without an RBAC step call too (the approval routes:
    tests/approvals/test_approvals.py)."""
    body = {"securable_type": "Tag", "operation": "Read"}
    raw = mint("svc-admin", role="Administrator", scope_service="payments")
    r = client.post("/api/v1/rbac/check", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 403 and r.json()["error"]["scope_service"] == "payments", r.content
    unscoped = mint("admin", role="Administrator")
    r = client.post("/api/v1/rbac/check", body, content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {unscoped}")
    assert r.status_code == 200 and r.json()["data"]["allowed"] is True
