"""The per-process principal cache (yuzu.auth.PrincipalCache): a token's owner, tier, scope and grants are
resolved once per process and reused, and any change to what they depend on — a revoked or expired token, a
deactivated owner, a removed role or permission — is refused on the very next call, in every process (the
database's auth version, moved by triggers, is read once per call)."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from tests.support.mcp_http import McpClient
from yuzu.auth import AuthError, principal_for_token
from yuzu.models import ApiToken, AuthVersion, RoleAssignment, RolePermission

pytestmark = pytest.mark.django_db(transaction=True)  # the server's worker threads see committed rows only

def test_a_known_token_costs_one_query(mint, django_assert_num_queries):
    raw = mint("alice", tier="operator")
    principal_for_token(raw)  # loads and caches (and stamps last_used_at)
    with django_assert_num_queries(1):  # the auth version, nothing else
        p = principal_for_token(raw)
    assert p.tier == "operator" and p.grants()[("Infrastructure", "Read")] is None


@pytest.mark.parametrize("change", ["queryset_update", "save", "admin_delete"])
def test_revocation_is_refused_on_the_next_call(mint, change):
    raw = mint("alice", tier="operator")
    principal_for_token(raw)
    token = ApiToken.objects.get(owner__username="alice")
    before = AuthVersion.current()
    if change == "queryset_update":  # what the admin's bulk action, OAuth and the bridge do
        ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    elif change == "save":
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    else:
        token.delete()
    assert AuthVersion.current() > before
    with pytest.raises(AuthError):
        principal_for_token(raw)


def test_expiry_needs_no_change_to_be_refused(mint):
    raw = mint("alice", tier="operator")
    p = principal_for_token(raw)
    with pytest.raises(AuthError, match="expired"):
        principal_for_token(raw, now=p.token.expires_at + timedelta(seconds=1))


def test_last_used_at_does_not_invalidate(mint):
    raw = mint("alice", tier="operator")
    principal_for_token(raw)
    before = AuthVersion.current()
    ApiToken.objects.update(last_used_at=timezone.now() - timedelta(hours=1))
    principal_for_token(raw)  # stamps last_used_at again: not a change a principal depends on
    assert AuthVersion.current() == before


def outcome(r):
    if r.status == 401:
        return "401"
    body = r.json()
    return "ok" if "result" in body and not body["result"].get("isError") else body["error"]["code"]


def test_role_and_owner_changes_reach_the_next_call(mint):
    raw = mint("alice", tier="operator")
    c = McpClient(raw)
    c.initialize()
    assert outcome(c.call("list_agents")) == "ok"
    operator = RoleAssignment.objects.get(user__username="alice").role
    RoleAssignment.objects.filter(user__username="alice").delete()
    assert outcome(c.call("list_agents")) == -32003
    RoleAssignment.objects.create(user=get_user_model().objects.get(username="alice"), role=operator)
    assert outcome(c.call("list_agents")) == "ok"
    RolePermission.objects.filter(role=operator, securable="Infrastructure", operation="Read").delete()
    assert outcome(c.call("list_agents")) == -32003
    RolePermission.objects.create(role=operator, securable="Infrastructure", operation="Read")
    assert outcome(c.call("list_agents")) == "ok"
    get_user_model().objects.filter(username="alice").update(is_active=False)
    assert outcome(c.call("list_agents")) == "401"
