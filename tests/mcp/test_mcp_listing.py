"""tools/list fitted to the caller (tier, RBAC, service scope, read-only mode), the whole-catalogue switch,
the approval marks, one page with a stable order, and notifications/tools/list_changed on the session's
GET stream when a role change alters what the caller is listed."""

import json

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import override_settings

from mcp import server
from mcp.registry import catalogue
from mcp.streaming.ring import ring_key, rings
from tests.support.mcp_http import McpClient
from tests.support.samples import sample
from tests.support.sse_client import Stream
from yuzu.models import ApiToken, Role, RoleAssignment, RolePermission
from yuzu.policy import requires_approval, tier_allows
from yuzu.rbac import BUILTIN_ROLES, Principal, assign_role

pytestmark = pytest.mark.django_db(transaction=True)

REFUSALS = (-32003, -32004)


@pytest.fixture(autouse=True)
def fresh_rings():
    rings().clear()
    yield
    rings().clear()


def connect(mint, username, role, tier, **kw):
    c = McpClient(mint(username, role=role, tier=tier, **kw))
    c.initialize()
    return c


def listed(client, **params):
    page = client.rpc("tools/list", params).json()["result"]
    return page


def names(client, **params):
    return [t["name"] for t in listed(client, **params)["tools"]]


def expected_names(role, tier):
    perms = set(BUILTIN_ROLES[role][1]) if role else set()
    return sorted(t.name for t in catalogue("v1").tools.values()
                  if tier_allows(tier, t.securable, t.operation) and (not t.rbac or (t.securable, t.operation) in perms))


@pytest.mark.parametrize("role,tier", [("Viewer", "readonly"), ("Operator", "operator"), ("Operator", "readonly"),
                                       ("Administrator", "supervised"), ("Approver", "operator"), (None, "readonly")])
def test_the_list_is_what_tier_and_rbac_allow_in_one_sorted_page(mint, make_user, role, tier):
    make_user("u")
    c = connect(mint, "u", role, tier)
    page = listed(c)
    got = [t["name"] for t in page["tools"]]
    assert "nextCursor" not in page and got == expected_names(role, tier)
    assert got == sorted(got)
    if role is None:  # no role at all: the self-checks, and following one's own approval tickets
        assert got == ["check_permission", "get_approval", "list_pending_approvals", "validate_scope"]
    # Stable: the same list on every call.
    assert names(c) == got


def test_every_listed_tool_passes_tier_and_rbac_and_every_unlisted_one_is_refused(mint):
    """What the list promises is what the pipeline does: calling a listed tool never ends in a tier or RBAC
    refusal; calling one left out always does."""
    for role, tier in (("Viewer", "readonly"), ("Operator", "operator")):
        c = connect(mint, f"{role.lower()}-{tier}", role, tier)
        shown = set(names(c))
        for tool in catalogue("v1").tools.values():
            if requires_approval(tier, tool.securable, tool.operation):
                continue  # would mint a ticket: its refusal code is the gate's, covered by the approvals tests
            code = (c.call(tool.name, sample(tool.input_schema)).json().get("error") or {}).get("code")
            if tool.name in ("approve_request", "reject_request") and tool.name in shown:
                assert code == -32003  # listed (Approval:Write allowed) yet always refused: its description says so
                continue
            assert (code in REFUSALS) == (tool.name not in shown), (role, tier, tool.name, code)


def test_gated_tools_are_marked_for_this_callers_tier(mint):
    op = {t["name"]: t for t in listed(connect(mint, "op", "Operator", "operator"))["tools"]}
    assert op["delete_tag"]["annotations"]["yuzu/approvalRequired"] is True
    assert op["delete_tag"]["_meta"] == {"yuzu/approvalRequired": True}
    assert op["delete_tag"]["description"].startswith("Needs a human approval on your tier (operator): the first "
                                                      "call answers -32006 with an approval_id. ")
    assert "yuzu/approvalRequired" not in op["set_tag"]["annotations"]  # not gated on the operator tier
    assert "yuzu/approvalRequired" not in op["execute_instruction"]["annotations"]
    sup = {t["name"]: t for t in listed(connect(mint, "sup", "Administrator", "supervised"))["tools"]}
    assert sup["execute_instruction"]["annotations"]["yuzu/approvalRequired"] is True
    assert sup["execute_instruction"]["description"].startswith("Needs a human approval on your tier (supervised)")
    assert "yuzu/approvalRequired" not in sup["list_agents"]["annotations"]
    # The catalogue's own listing (docs/mcp-tools.md) carries no caller's marks.
    assert "yuzu/approvalRequired" not in catalogue("v1").tools["delete_tag"].listing()["annotations"]


def test_the_whole_catalogue_on_request_with_what_refuses_this_caller(mint):
    c = connect(mint, "ro", "Viewer", "readonly")
    everything = listed(c, _meta={"yuzu/all": True})["tools"]
    assert [t["name"] for t in everything] == sorted(catalogue("v1").tools)
    by_name = {t["name"]: t for t in everything}
    set_tag = by_name["set_tag"]
    assert set_tag["annotations"]["yuzu/callable"] is False and set_tag["_meta"] == {"yuzu/callable": False}
    assert set_tag["description"].startswith("Not callable with your token: tier 'readonly' does not allow "
                                             "Tag:Write (needs operator or higher). ")
    assert "yuzu/callable" not in by_name["list_agents"]["annotations"] and "_meta" not in by_name["list_agents"]
    users = by_name["unlock_account"]["description"]
    assert users.startswith("Not callable with your token: tier 'readonly' does not allow UserManagement:Write")
    # Only a literal true switches; anything else is the fitted list.
    assert names(c, _meta={"yuzu/all": "true"}) == names(c)
    assert "set_tag" not in names(c, _meta={"yuzu/all": 1})


def test_service_scope_and_read_only_mode_fit_the_list_too(mint):
    svc = connect(mint, "svc", "Operator", "operator", scope_service="payments")
    shown = set(names(svc))
    assert "list_agents" not in shown and "set_tag" in shown  # denied class hidden; confined class kept
    op = connect(mint, "op", "Operator", "operator")
    with override_settings(YUZU_MCP_READ_ONLY=True):
        shown = {t["name"]: t for t in listed(op)["tools"]}
    assert shown and all(t["annotations"]["readOnlyHint"] for t in shown.values())


def test_a_cursor_still_pages_larger_catalogues_in_the_same_order(mint, monkeypatch):
    c = connect(mint, "op", "Operator", "operator")
    whole = names(c)
    monkeypatch.setattr(server, "TOOLS_PAGE_SIZE", 7)
    paged, cursor = [], None
    while True:
        page = listed(c, **({"cursor": cursor} if cursor else {}))
        assert len(page["tools"]) <= 7
        paged += [t["name"] for t in page["tools"]]
        cursor = page.get("nextCursor")
        if not cursor:
            break
    assert paged == whole
    assert server.TOOLS_PAGE_SIZE == 7 and len(whole) > 7


def test_initialize_advertises_list_changed(mint):
    c = McpClient(mint("op", role="Operator", tier="operator"))
    assert c.initialize().json()["result"]["capabilities"]["tools"] == {"listChanged": True}


# --- notifications/tools/list_changed ------------------------------------------------------------

LIST_CHANGED = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


def key_of(client, username):
    user = get_user_model().objects.get(username=username)
    token = ApiToken.objects.filter(owner=user).order_by("-created_at").first()
    return ring_key(Principal(user=user, token=token).key, client.sid)


def frames(client, username):
    out, gap = rings().read(key_of(client, username), 0)
    assert not gap
    return [json.loads(data) for _, _, data in out]


def test_a_role_change_that_alters_the_list_reaches_the_get_stream(mint):
    c = connect(mint, "vic", "Viewer", "operator")
    assert "set_tag" not in names(c)
    headers = {"host": "127.0.0.1:8000", "accept": "text/event-stream", **c.headers()}

    async def go():
        from yuzu.asgi import application

        stream = await Stream(application, "GET", "/mcp/v1/", headers).open()
        assert stream.status == 200
        await database_sync_to_async(lambda: assign_role(get_user_model().objects.get(username="vic"),
                                                         "Operator"))()
        events = await stream.read_until(lambda ev: any(e.get("json") == LIST_CHANGED for e in ev), timeout=10)
        assert [e["json"] for e in events if e.get("json")] == [LIST_CHANGED]
        await stream.disconnect()

    async_to_sync(go)()
    assert "set_tag" in names(c)  # the re-fetched list now carries what the new role allows


def test_only_changes_that_alter_the_callers_list_notify(mint, make_user):
    alice = connect(mint, "alice", "Viewer", "operator")
    bob = connect(mint, "bob", "Viewer", "operator")
    quiet = connect(mint, "quiet", "Viewer", "operator")  # never lists: nothing to tell it
    names(alice), names(bob)
    alice_user = get_user_model().objects.get(username="alice")

    assign_role(alice_user, "Approver")  # Approver's permissions add no tool an operator-tier Viewer lacks
    assert frames(alice, "alice") == []
    assign_role(alice_user, "Operator")  # Tag:Write, Execution:Execute, …: the list grows
    assert frames(alice, "alice") == [LIST_CHANGED]
    assert frames(bob, "bob") == [] and frames(quiet, "quiet") == []
    assign_role(get_user_model().objects.get(username="bob"), "Approver")
    assert frames(bob, "bob") == []

    # A permission taken from a role alice holds shrinks her list; she is told once per change.
    names(alice)
    custom = Role.objects.create(name="Taggers")
    perm = RolePermission.objects.create(role=custom, securable="Tag", operation="Delete")
    assert frames(alice, "alice") == [LIST_CHANGED]  # not hers yet: nothing new
    RoleAssignment.objects.filter(user=alice_user, role__name="Operator").delete()
    assert frames(alice, "alice") == [LIST_CHANGED] * 2  # lost set_tag, execute_instruction, …
    assign_role(alice_user, "Taggers")
    assert frames(alice, "alice") == [LIST_CHANGED] * 3  # gained delete_tag
    perm.delete()
    assert frames(alice, "alice") == [LIST_CHANGED] * 4  # lost it again
    custom.delete()  # the (now empty) role and its assignment go: the list is unchanged, nobody is told
    assert frames(alice, "alice") == [LIST_CHANGED] * 4
    assert "delete_tag" not in names(alice) and "set_tag" not in names(alice)


def test_a_superuser_flag_and_a_revoked_token(mint):
    c = connect(mint, "carol", None, "operator")
    names(c)
    user = get_user_model().objects.get(username="carol")
    user.is_superuser = True
    user.save(update_fields=["last_login"])  # an unrelated field: not even looked at
    assert frames(c, "carol") == []
    user.save()
    assert frames(c, "carol") == [LIST_CHANGED]
    from django.utils import timezone

    ApiToken.objects.filter(owner=user).update(revoked_at=timezone.now())
    user.is_superuser = False
    user.save()
    assert frames(c, "carol") == [LIST_CHANGED]  # a revoked token's session is not re-fitted (its stream closes)


def test_the_whole_catalogue_listing_is_not_what_a_change_is_measured_against(mint):
    c = connect(mint, "dan", "Viewer", "operator")
    listed(c, _meta={"yuzu/all": True})  # the whole catalogue: it does not change with roles
    assign_role(get_user_model().objects.get(username="dan"), "Operator")
    assert frames(c, "dan") == []


def test_fitting_the_list_costs_one_query_for_the_grants(principal, django_assert_max_num_queries):
    """RBAC's explanation (roles, group names) is built only for the whole-catalogue listing."""
    from mcp.listing import tools_for

    nobody = principal("nobody", role=None, tier="supervised")  # every RBAC-gated tool refused
    with django_assert_max_num_queries(1):
        assert [t["name"] for t in tools_for(nobody, catalogue("v1"))] == [
            "check_permission", "get_approval", "list_pending_approvals", "validate_scope", "withdraw_approval"]
