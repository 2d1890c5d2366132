"""The per-process principal cache (yuzu.auth.PrincipalCache): a token's owner, tier, scope and grants are
resolved once per process and reused, and any change to what they depend on — a revoked or expired token, a
deactivated owner, a removed role or permission — is refused on the very next call, in every process (the
database's auth version, moved by triggers, is read once per call)."""

import os
import shutil
from datetime import timedelta

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from bridge.testing.harness import start_redis
from .mcp_http import McpClient
from yuzu.auth import AuthError, principal_for_token
from yuzu.models import ApiToken, AuthVersion, RoleAssignment, RolePermission
from yuzu.testing import free_port, server_env, start_daphne

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


# --- two server processes on Redis -------------------------------------------------------------------------


class Remote:
    """A session on one server used from two: the session store is Redis, so B knows A's session."""

    def __init__(self, token, base):
        self.token, self.n = token, 0
        self.http = httpx.Client(timeout=20, trust_env=False)
        r = self.http.post(base + "/mcp/v1/", headers=self.headers(), json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}}})
        assert r.status_code == 200, r.text
        self.sid = r.headers["mcp-session-id"]

    def headers(self):
        h = {"authorization": f"Bearer {self.token}", "accept": "application/json, text/event-stream",
             "content-type": "application/json", "mcp-protocol-version": "2025-11-25"}
        if getattr(self, "sid", None):
            h["mcp-session-id"] = self.sid
        return h

    def list_agents(self, base):
        self.n += 1
        r = self.http.post(base + "/mcp/v1/", headers=self.headers(), json={
            "jsonrpc": "2.0", "id": self.n, "method": "tools/call", "params": {"name": "list_agents", "arguments": {}}})
        if r.status_code == 401:
            return "401"
        body = r.json()
        return "ok" if "result" in body and not body["result"].get("isError") else body["error"]["code"]


@pytest.mark.live
def test_two_processes_refuse_on_the_very_next_call(transactional_db, tmp_path, mint):
    redis_url = os.environ.get("YUZU_REDIS_URL")
    procs = []
    if not redis_url:
        if shutil.which("redis-server") is None:
            pytest.skip("neither YUZU_REDIS_URL nor redis-server (Debian package 'redis-server')")
        redis, redis_url = start_redis(tmp_path)
        procs.append(redis)
    try:
        env = server_env(YUZU_REDIS_URL=redis_url)
        a, b = free_port(), free_port()
        procs += [start_daphne(a, env, tmp_path, "daphne-A"), start_daphne(b, env, tmp_path, "daphne-B")]
        base_a, base_b = f"http://127.0.0.1:{a}", f"http://127.0.0.1:{b}"
        raw = mint("alice", tier="operator")
        c = Remote(raw, base_a)
        for _ in range(3):  # both processes have the principal cached
            assert c.list_agents(base_a) == "ok" and c.list_agents(base_b) == "ok"
        RoleAssignment.objects.filter(user__username="alice").delete()  # removed on neither server
        assert c.list_agents(base_b) == -32003
        assert c.list_agents(base_a) == -32003
        alice = get_user_model().objects.get(username="alice")
        RoleAssignment.objects.create(user=alice, role_id=RolePermission.objects.filter(
            role__name="Operator").values_list("role_id", flat=True)[0])
        assert c.list_agents(base_b) == "ok" and c.list_agents(base_a) == "ok"
        ApiToken.objects.filter(owner=alice).update(revoked_at=timezone.now())
        assert c.list_agents(base_b) == "401"
        assert c.list_agents(base_a) == "401"
    finally:
        for p in reversed(procs):
            p.stop()
