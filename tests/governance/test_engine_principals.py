"""Engine principals (spec/governance.md §1) through the in-process MCP face and the REST twin: lifecycle,
credentials on /mcp/v1/ through the ordinary token machinery, never-admin, the structural denial belt, rotation
with its overlap, retry window and confirmation (incl. the pre-consume precondition of an approved recall)."""

from functools import partial

import pytest
from django.test import Client

from approvals.models import Approval
from governance.models import EnginePrincipal, EngineRotation
from tests.support.approvals import approve
from tests.support.mcp_http import McpClient
from tests.support.races import at_once
from yuzu.models import ApiToken, AuditEvent, Role, RolePermission
from yuzu.rbac import ALL

pytestmark = pytest.mark.django_db(transaction=True)

NEW = {"principal_id": "engine:patch-bot", "display_name": "Patch bot", "owner_username": "owen",
       "justification": "applies patches", "classification": "internal"}


@pytest.fixture
def admin(mint, make_user):
    make_user("owen")
    c = McpClient(mint("root", role="Administrator"))
    c.initialize()
    return c


def ok(resp):
    body = resp.json()
    assert "error" not in body, body
    assert not body["result"].get("isError"), body
    return body["result"]["structuredContent"]


def err(resp):
    body = resp.json()
    assert "error" in body, body
    return body["error"]


def created(admin, fleet_reader=None):
    ok(admin.call("create_engine_principal", NEW))
    if fleet_reader is not None:
        ok(admin.call("assign_engine_role", {"principal_id": "patch-bot", "role": fleet_reader.name}))
    return ok(admin.call("mint_engine_credential", {"principal_id": NEW["principal_id"], "ttl_days": 30}))


def test_an_engine_credential_acts_within_its_roles_only(admin, fleet_reader):
    cred = created(admin, fleet_reader)
    assert cred["raw_token"].startswith("yuzu_") and len(cred["token_id"]) == 24
    token = ApiToken.objects.get(pk=cred["token_id"])
    assert token.mcp_tier == "readonly" and token.owner.username == "engine:patch-bot"
    engine = McpClient(cred["raw_token"])
    engine.initialize()
    assert ok(engine.call("list_agents", {}))["agents"] == []
    assert err(engine.call("query_audit_log", {}))["code"] == -32003  # not in its role
    assert err(engine.call("set_tag", {"agent_id": "a", "key": "k", "value": "v"}))["code"] == -32004  # tier
    # The structural belt: even a read of this family is refused to an engine credential.
    assert err(engine.call("list_engine_principals", {}))["code"] == -32003
    r = Client().get("/api/v1/engine-principals", HTTP_AUTHORIZATION=f"Bearer {cred['raw_token']}")
    assert r.status_code == 403
    listed = ok(admin.call("list_engine_principals", {}))
    assert listed["count"] == 1 and listed["principals"][0]["active_credentials"] == 1
    # Revoked: the credential stops working on the very next call.
    out = ok(admin.call("revoke_engine_principal", {"principal_id": "engine:patch-bot", "reason": "retired"}))
    assert out == {"revoked": True, "principal_id": "engine:patch-bot", "credentials_revoked": 1}
    assert engine.call("list_agents", {}).status == 401
    again = ok(admin.call("revoke_engine_principal", {"principal_id": "engine:patch-bot"}))
    assert again["credentials_revoked"] == 0  # a no-op success
    assert EnginePrincipal.objects.get().lifecycle_state == "revoked"
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"engine_principal.create", "engine_principal.credential.mint", "engine_principal.role.assign",
            "engine_principal.revoke"} <= actions


def test_never_admin(admin, fleet_reader):
    ok(admin.call("create_engine_principal", NEW))
    e = err(admin.call("assign_engine_role", {"principal_id": "patch-bot", "role": "Administrator"}))
    assert e["code"] == -32602 and e["message"] == "engine principals can never hold admin or system roles"
    everything = Role.objects.create(name="Everything")
    RolePermission.objects.bulk_create([RolePermission(role=everything, securable=s, operation=o) for s, o in ALL])
    assert err(admin.call("assign_engine_role", {"principal_id": "patch-bot", "role": "Everything"}))["code"] == -32602
    assert ok(admin.call("audit_engine_no_admin", {})) == {"ok": True, "violations": []}
    # Granted behind the service's back (the admin, raw SQL): the proof says so.
    from yuzu.rbac import assign_role
    assign_role(EnginePrincipal.objects.get().account, "Administrator")
    out = ok(admin.call("audit_engine_no_admin", {}))
    assert out["ok"] is False and out["violations"] == [{"principal_id": "engine:patch-bot", "role": "Administrator",
                                                         "reason": "admin_role"}]
    roles = ok(admin.call("list_engine_roles", {"principal_id": "patch-bot"}))
    assert roles["count"] == 1
    assert ok(admin.call("unassign_engine_role", {"principal_id": "patch-bot", "role": "Administrator"}))["unassigned"]


def test_never_admin_by_two_roles_that_together_hold_everything(admin):
    """Two narrower roles whose union is the whole securable × operation product make an admin-equivalent engine as
    surely as one role does (audit_engine_no_admin reports it as wildcard_equivalent): the second is refused, and
    nothing is granted."""
    ok(admin.call("create_engine_principal", NEW))
    half = len(ALL) // 2
    for name, perms in (("FirstHalf", ALL[:half]), ("SecondHalf", ALL[half:])):
        role = Role.objects.create(name=name)
        RolePermission.objects.bulk_create([RolePermission(role=role, securable=s, operation=o) for s, o in perms])
    ok(admin.call("assign_engine_role", {"principal_id": "patch-bot", "role": "FirstHalf"}))
    e = err(admin.call("assign_engine_role", {"principal_id": "patch-bot", "role": "SecondHalf"}))
    assert e["code"] == -32602 and e["message"] == "engine principals can never hold admin or system roles"
    assert ok(admin.call("list_engine_roles", {"principal_id": "patch-bot"}))["roles"] == [
        {"principal_id": "engine:patch-bot", "role": "FirstHalf"}]
    assert ok(admin.call("audit_engine_no_admin", {})) == {"ok": True, "violations": []}
    refused = AuditEvent.objects.get(action="engine_principal.role.assign", result="denied")
    assert "reason=wildcard_equivalent" in refused.detail and "role=SecondHalf" in refused.detail
    # Over REST alike.
    r = Client().post("/api/v1/engine-principals/engine:patch-bot/roles", {"role": "SecondHalf"},
                      content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {admin.token}")
    assert r.status_code == 400, r.content


def test_bad_input_is_refused_before_anything_happens(admin):
    assert err(admin.call("create_engine_principal", {**NEW, "principal_id": "patch-bot"}))["code"] == -32602
    assert err(admin.call("create_engine_principal", {**NEW, "owner_username": "nobody"}))["code"] == -32602
    assert err(admin.call("create_engine_principal", {**NEW, "classification": "x"}))["code"] == -32602
    assert not EnginePrincipal.objects.exists()
    e = err(admin.call("get_engine_principal", {"principal_id": "engine:ghost"}))
    assert e["code"] == -32602 and e["message"] == "engine principal not found"
    ok(admin.call("create_engine_principal", NEW))
    assert err(admin.call("create_engine_principal", NEW))["code"] == -32602
    assert err(admin.call("rotate_engine_credential", {"principal_id": "engine:patch-bot"}))["code"] == -32602
    assert err(admin.call("mint_engine_credential", {"principal_id": "engine:patch-bot", "ttl_days": 91}))["code"] \
        == -32602
    sly = err(admin.call("mint_engine_credential", {"principal_id": "engine:patch-bot", "name": "nightly\u202egol"}))
    assert sly["code"] == -32602 and "U+202E" in sly["message"]
    assert not ApiToken.objects.filter(owner__username="engine:patch-bot").exists()
    assert err(admin.call("transfer_engine_principal_owner", {"principal_id": "engine:patch-bot",
                                                              "new_owner": "engine:patch-bot"}))["code"] == -32602
    ok(admin.call("mint_engine_credential", {"principal_id": "engine:patch-bot"}))
    assert err(admin.call("mint_engine_credential", {"principal_id": "engine:patch-bot"}))["code"] == -32602


def test_rotation_overlap_retry_and_confirm(admin):
    first = created(admin)
    succ = ok(admin.call("rotate_engine_credential", {"principal_id": "engine:patch-bot", "overlap_days": 2}))
    again = ok(admin.call("rotate_engine_credential", {"principal_id": "engine:patch-bot", "overlap_days": 2}))
    assert again["token_id"] == succ["token_id"] and again["raw_token"] == succ["raw_token"]  # the 120 s retry
    assert AuditEvent.objects.filter(action="engine_principal.credential.reveal").count() == 2
    rot = EngineRotation.objects.get()
    assert succ["raw_token"].encode() not in bytes(rot.secret_sealed)  # sealed, not stored in plaintext
    ep = EnginePrincipal.objects.get()
    assert ep.active_credentials().count() == 2
    for raw in (first["raw_token"], succ["raw_token"]):  # both work during the overlap
        c = McpClient(raw)
        assert c.initialize().status == 200
    args = {"principal_id": "engine:patch-bot", "token_id": succ["token_id"]}
    e = err(admin.call("confirm_engine_rotation", {**args, "secret": "yuzu_wrong"}))
    assert e["code"] == -32003 and e["message"] == "rotation secret mismatch"
    e = err(admin.call("confirm_engine_rotation", {**args, "token_id": first["token_id"], "secret": "x"}))
    assert e["code"] == -32602  # not the successor: refused before the secret is looked at
    assert ok(admin.call("confirm_engine_rotation", {**args, "secret": succ["raw_token"]})) == {
        "confirmed": True, "principal_id": "engine:patch-bot"}
    assert list(ep.active_credentials().values_list("pk", flat=True)) == [succ["token_id"]]
    assert EngineRotation.objects.get().secret_sealed is None
    e = err(admin.call("confirm_engine_rotation", {**args, "secret": succ["raw_token"]}))
    assert e["code"] == -32602 and e["message"] == "rotation already confirmed"


def test_an_approved_confirm_whose_precondition_fails_keeps_its_ticket(mint, make_user, approver):
    make_user("owen")
    root = McpClient(mint("root", role="Administrator"))
    root.initialize()
    created(root)
    succ = ok(root.call("rotate_engine_credential", {"principal_id": "engine:patch-bot"}))
    sup = McpClient(mint("sue", role="Administrator", tier="supervised"))
    sup.initialize()
    args = {"principal_id": "engine:patch-bot", "token_id": succ["token_id"], "secret": succ["raw_token"]}
    ticket_id = err(sup.call("confirm_engine_rotation", args))["data"]["approval_id"]
    ticket = Approval.objects.get(pk=ticket_id)
    assert succ["raw_token"] not in ticket.scope_expression  # the ticket holds the secret's hash only
    approve(approver, ticket_id)
    ep = EnginePrincipal.objects.get()
    pred = ApiToken.objects.get(pk=EngineRotation.objects.get().predecessor_id)
    revoked_at = pred.revoked_at
    ApiToken.objects.filter(pk=pred.pk).update(revoked_at="2026-01-01T00:00:00Z")  # only one live now
    e = err(sup.call("confirm_engine_rotation", {**args, "approval_id": ticket_id}))
    assert e["code"] == -32003 and "cannot be redeemed right now" in e["message"]
    assert Approval.objects.get(pk=ticket_id).consumed_at is None
    ApiToken.objects.filter(pk=pred.pk).update(revoked_at=revoked_at)
    assert ok(sup.call("confirm_engine_rotation", {**args, "approval_id": ticket_id}))["confirmed"] is True
    assert Approval.objects.get(pk=ticket_id).consumed_at is not None
    assert ep.active_credentials().count() == 1


def test_rest_twins(mint, make_user):
    make_user("owen")
    raw = mint("root", role="Administrator")
    c = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = {k: v for k, v in NEW.items() if k != "principal_id"} | {"slug": "patch-bot"}
    r = c.post("/api/v1/engine-principals", body, content_type="application/json")
    assert r.status_code == 201 and r.json()["data"]["principal_id"] == "engine:patch-bot"
    assert c.post("/api/v1/engine-principals", {**body, "slug": "Bad Slug"},
                  content_type="application/json").status_code == 400
    r = c.post("/api/v1/engine-principals/engine:patch-bot/credentials", {}, content_type="application/json")
    assert r.status_code == 201
    r = c.get("/api/v1/engine-principals/engine:patch-bot")
    assert r.status_code == 200 and len(r.json()["data"]["active_credentials"]) == 1
    assert c.get("/api/v1/engine-principals/engine:ghost").status_code == 404
    assert c.post("/api/v1/engine-principals/engine:patch-bot/roles", {"role": "Viewer"},
                  content_type="application/json").status_code == 201
    assert c.get("/api/v1/engine-principals/engine:patch-bot/roles").json()["data"]["count"] == 1
    assert c.delete("/api/v1/engine-principals/engine:patch-bot/roles/Viewer").status_code == 200
    assert c.get("/api/v1/engine-principals/audit/no-admin").json()["data"]["ok"] is True
    r = c.post("/api/v1/engine-principals/engine:patch-bot/credentials/rotate", {"overlap_days": 1},
               content_type="application/json")
    assert r.status_code == 201
    succ = r.json()["data"]
    r = c.post("/api/v1/engine-principals/engine:patch-bot/credentials/confirm",
               {"token_id": succ["token_id"], "secret": succ["raw_token"]}, content_type="application/json")
    assert r.status_code == 200, r.content
    assert c.post("/api/v1/engine-principals/engine:patch-bot/transfer-owner", {"new_owner": "root"},
                  content_type="application/json").status_code == 200
    r = c.delete("/api/v1/engine-principals/engine:patch-bot", {"reason": "done"}, content_type="application/json")
    assert r.status_code == 200 and r.json()["data"]["credentials_revoked"] == 1


def test_the_sweep_ends_an_overlap_only_once_the_successor_is_used(admin):
    from datetime import timedelta

    from django.utils import timezone

    from governance.engines import sweep_rotations

    created(admin)
    succ = ok(admin.call("rotate_engine_credential", {"principal_id": "engine:patch-bot", "overlap_days": 1}))
    later = timezone.now() + timedelta(days=1, minutes=1)
    assert sweep_rotations(timezone.now()) == {"revoked": 0, "stalled": 0}  # the overlap has not ended
    assert sweep_rotations(later) == {"revoked": 0, "stalled": 1}  # never used: both kept, a warning
    ep = EnginePrincipal.objects.get()
    assert ep.active_credentials().count() == 2
    assert AuditEvent.objects.filter(action="engine_principal.rotation.stalled").exists()
    engine = McpClient(succ["raw_token"])
    assert engine.initialize().status == 200  # the consumer switched
    assert sweep_rotations(later) == {"revoked": 1, "stalled": 0}
    assert list(ep.active_credentials().values_list("pk", flat=True)) == [succ["token_id"]]
    e = err(admin.call("confirm_engine_rotation", {"principal_id": "engine:patch-bot", "token_id": succ["token_id"],
                                                   "secret": succ["raw_token"]}))
    assert e["message"] == "rotation already confirmed"


def test_two_creates_of_one_id_at_once_register_it_once_and_refuse_the_other_clearly(mint, make_user):
    """Both creates passed the plan's "already exists" check before either wrote: the later one's account hit the
    unique username and answered 500 with an IntegrityError."""
    make_user("owen")
    raw = mint("root", role="Administrator")

    def create(slug):
        body = {k: v for k, v in NEW.items() if k != "principal_id"} | {"slug": slug}
        return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", raise_request_exception=False).post(
            "/api/v1/engine-principals", body, content_type="application/json")

    for n in range(10):  # the 500 showed within a few rounds on PostgreSQL
        slug = f"patch-bot-{n}"
        answers = at_once(partial(create, slug), partial(create, slug))
        assert all(kind == "ok" for kind, _ in answers), answers
        assert sorted(r.status_code for _, r in answers) == [201, 400], [r.content[:300] for _, r in answers]
        refused = next(r for _, r in answers if r.status_code == 400).json()
        assert f"engine principal engine:{slug} already exists" in str(refused)
    assert EnginePrincipal.objects.count() == 10
    assert AuditEvent.objects.filter(action="engine_principal.create", result="success").count() == 10
