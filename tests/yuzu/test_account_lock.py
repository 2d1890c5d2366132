"""An administrator's lock on an account (yuzu.accounts.lock_account; docs/tokens-and-rbac.md "Account lockout"):
while it holds, nothing authenticates as that person — not their admin sessions (tests/yuzu/test_admin_writes.py),
and not their API tokens either, on any face (REST with either header, MCP /mcp/v1/ in both eras, /mcp/bridge/),
nor their live streams, nor work that runs as them later (bridge workers, schedules: Principal.from_key). The lock
reaches every process on the very next call (it moves the auth version) and is no revocation: unlocking, or the
lock running out, lets the same tokens in again. A lock from failed sign-ins (anyone's to cause) refuses new
sign-ins only, and leaves tokens alone. OAuth connections of a locked person: tests/oauth/test_oauth.py."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from bridge.models import Member
from bridge.workers import stop_orphans
from mcp.streaming import watch
from mcp.streaming.sessions import store
from tests.support.mcp_http import McpClient, request
from yuzu.accounts import lock_account, record_failure, unlock_account
from yuzu.auth import AuthError, principal_for_token
from yuzu.models import AccountLockout, ApiToken, AuditEvent, AuthVersion
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db(transaction=True)  # the server's worker threads see committed rows only

MODERN = "2026-07-28"
SOCKET = "yuzu-test-lock"


@pytest.fixture
def admin(make_user):
    return Principal(user=make_user("root", superuser=True), via="session")


def lock(admin, username="alice", minutes=30):
    return lock_account(admin, username, timezone.now() + timedelta(minutes=minutes))


def rest(raw, header="authorization"):
    value = f"Bearer {raw}" if header == "authorization" else raw
    return Client(HTTP_HOST="127.0.0.1:8000").get("/api/v1/tokens", headers={header: value})


def mcp_initialize(raw, path="/mcp/v1/", header="authorization"):
    value = f"Bearer {raw}" if header == "authorization" else raw
    return request(body={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                         "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "t", "version": "0"}}},
                   headers={header: value}, path=path)


def mcp_modern(raw):
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"}}
    return request(body={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}},
                   headers={"authorization": f"Bearer {raw}", "mcp-protocol-version": MODERN,
                            "mcp-method": "tools/list"})


FACES = {
    "rest_bearer": lambda raw: rest(raw).status_code,
    "rest_x_yuzu_token": lambda raw: rest(raw, "x-yuzu-token").status_code,
    "mcp_v1_bearer": lambda raw: mcp_initialize(raw).status,
    "mcp_v1_x_yuzu_token": lambda raw: mcp_initialize(raw, header="x-yuzu-token").status,
    "mcp_v1_modern": lambda raw: mcp_modern(raw).status,
    "mcp_bridge": lambda raw: mcp_initialize(raw, "/mcp/bridge/").status,
}


@pytest.mark.parametrize("face", FACES)
def test_a_lock_refuses_every_token_of_the_person_until_it_is_lifted(face, mint, admin):
    """Before, the lock ended the admin sessions only: a pasted token of the locked person went on working on every
    face — the person an administrator locked out went on acting through their AI client or script."""
    raw = mint("alice", role="Operator", tier="" if face.startswith("rest") else "operator")
    call = FACES[face]
    assert call(raw) == 200  # known, and cached in this process
    lock(admin)
    assert call(raw) == 401
    unlock_account(admin, "alice")
    assert call(raw) == 200, "a lock is not a revocation: unlocking lets the same token in again"


def test_the_refusal_says_why_and_points_at_the_unlock(mint, admin):
    raw = mint("alice", role="Operator")
    lock(admin)
    r = rest(raw)
    assert r.status_code == 401 and r.json()["error"]["message"] == "account locked by an administrator"
    refused = mcp_initialize(raw)
    assert refused.error["code"] == -32001 and "account locked" in refused.error["message"]
    assert "unlock" in refused.error["data"]["remediation"]


def test_a_lock_moves_the_auth_version_from_any_write_path(mint, admin):
    """A lock written by another process (or the admin's page, or raw SQL) is seen by this process's principal
    cache on its very next call: the lock moves the auth version, as a revocation or a role change does."""
    raw = mint("alice", role="Operator", tier="operator")
    principal_for_token(raw)
    user = get_user_model().objects.get(username="alice")
    before = AuthVersion.current()
    AccountLockout.objects.create(user=user, locked_until=timezone.now() + timedelta(minutes=5), manual=True)
    assert AuthVersion.current() > before
    with pytest.raises(AuthError, match="locked"):
        principal_for_token(raw)
    before = AuthVersion.current()
    AccountLockout.objects.filter(user=user).update(locked_until=None, manual=False)
    assert AuthVersion.current() > before
    assert principal_for_token(raw).user == user


def test_a_lock_that_ran_out_lets_the_token_in_without_a_write(mint, admin):
    raw = mint("alice", role="Operator", tier="operator")
    lock(admin, minutes=5)
    with pytest.raises(AuthError, match="locked"):
        principal_for_token(raw)
    assert principal_for_token(raw, now=timezone.now() + timedelta(minutes=6)).user.username == "alice"


def test_failed_sign_ins_refuse_new_sign_ins_only_and_never_move_the_version(mint):
    """Anyone can type five wrong passwords for a known name: that must neither stop the person's tokens nor, by
    moving the auth version, empty every process's principal cache for everyone."""
    raw = mint("alice", role="Operator", tier="operator")
    principal_for_token(raw)
    before = AuthVersion.current()
    for _ in range(7):
        record_failure("alice")
    assert AccountLockout.objects.get(user__username="alice").is_locked()
    assert AuthVersion.current() == before
    assert principal_for_token(raw).user.username == "alice"


def test_failed_sign_ins_on_a_locked_account_do_not_move_the_version(mint, admin):
    mint("alice", role="Operator")
    lock(admin)
    before = AuthVersion.current()
    for _ in range(6):
        record_failure("alice")
    assert AuthVersion.current() == before


def test_a_lock_ends_a_live_stream_on_its_next_tick(mint, admin):
    """Held-open streams (GET channel, streamed POST, blocking calls) re-check their credential every tick
    (mcp.streaming.watch): the lock is refused there like a revocation, and lifting it admits the token again."""
    raw = mint("alice", role="Operator", tier="operator")
    opened = principal_for_token(raw, audiences=("api",))
    session = store().create(opened.key, "v1", "2025-11-25", "t", "0").id
    assert watch.revalidate_all([(opened, session)]) == ["ok"]
    lock(admin)
    assert watch.revalidate_all([(opened, session)]) == ["credential_revoked"]
    unlock_account(admin, "alice")
    assert watch.revalidate_all([(principal_for_token(raw), session)]) == ["ok"]


def test_work_that_runs_as_a_locked_person_later_finds_no_principal(mint, admin):
    """Principal.from_key re-reads a principal for work begun earlier (bridge workers, schedules, listings)."""
    mint("alice", role="Operator")
    token = ApiToken.objects.get(owner__username="alice")
    key = Principal.key_for(token.owner_id, token.pk)
    assert Principal.from_key(key) is not None and Principal.from_key(Principal.key_for(token.owner_id, None))
    lock(admin)
    assert Principal.from_key(key) is None and Principal.from_key(Principal.key_for(token.owner_id, None)) is None
    unlock_account(admin, "alice")
    assert Principal.from_key(key) is not None


def test_the_poller_stops_the_workers_of_a_locked_person(mint, admin):
    mint("alice", role="Operator")
    token = ApiToken.objects.get(owner__username="alice")
    m = Member.objects.create(owner=token.owner, owner_key=Principal.key_for(token.owner_id, token.pk),
                              profile_name="standin", socket_name=SOCKET, name="w")
    assert stop_orphans(SOCKET) == 0
    lock(admin)
    assert stop_orphans(SOCKET) == 1 and not Member.objects.get(pk=m.pk).live
    assert AuditEvent.objects.filter(action="bridge.stop", target_id=m.session_id,
                                     detail__contains="reason=primary_revoked").exists()


def test_a_deactivated_person_is_refused_alike(mint):
    """is_active=False was already refused everywhere: kept so, beside the lock."""
    raw = mint("alice", role="Operator", tier="operator")
    assert mcp_initialize(raw).status == 200
    get_user_model().objects.filter(username="alice").update(is_active=False)
    assert mcp_initialize(raw).status == 401 and rest(raw).status_code == 401
    token = ApiToken.objects.get(owner__username="alice")
    assert Principal.from_key(Principal.key_for(token.owner_id, token.pk)) is None


def test_a_session_opened_before_the_lock_is_refused_on_its_next_call(mint, admin):
    c = McpClient(mint("alice", role="Operator", tier="operator"))
    c.initialize()
    lock(admin)
    assert c.rpc("tools/list").status == 401
