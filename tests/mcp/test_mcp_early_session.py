"""The session check begun before authentication (mcp.server._early_session_check): a request that names a session
has it checked in the session store while the database authenticates it, for the principal its token was last
seen as in this process — one Redis round trip less on every call. These tests hold it to giving what the plain
check gives: the same answer, the same failures, nothing left half-read on a pooled connection, and no use of a
guess that authentication did not confirm."""

import secrets
import socket

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from mcp.streaming.sessions import MemorySessionStore, RedisSessionStore
from tests.support.mcp_http import McpClient, request
from yuzu.auth import last_principal_key, principal_for_token
from yuzu.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)

needs_redis = pytest.mark.skipif(not settings.REDIS_URL, reason="needs YUZU_REDIS_URL (CI sets it)")


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=needs_redis)])
def test_a_pending_check_answers_as_validate_does(backend):
    sessions = MemorySessionStore() if backend == "memory" else RedisSessionStore(settings.REDIS_URL)
    mine, other = f"u1.t{secrets.token_hex(4)}", f"u2.t{secrets.token_hex(4)}"
    s = sessions.create(mine, "bridge", "2025-11-25", "claude-code", "2.1")
    for sid, principal in [(s.id, mine), (s.id, other), ("0" * 32, mine)]:
        pending = sessions.begin_validate(sid, principal)
        try:
            assert pending.result() == sessions.validate(sid, principal)
        finally:
            pending.close()
    pending = sessions.begin_validate(s.id, mine)
    got = pending.result()
    pending.close()
    assert got is not None and (got.id, got.principal, got.catalogue, got.client_name, got.client_version) == (
        s.id, mine, "bridge", "claude-code", "2.1")


@needs_redis
def test_a_check_closed_unread_leaves_its_connection_clean():
    """Authentication refused, the answer is never asked for: close() reads it, so the pooled connection goes
    back holding no stale reply, and is used again as it is."""
    sessions = RedisSessionStore(settings.REDIS_URL)
    mine = f"u1.t{secrets.token_hex(4)}"
    s = sessions.create(mine, "v1", "2025-11-25")
    client_id = sessions.redis.client_id()
    for _ in range(3):
        sessions.begin_validate(s.id, mine).close()
    pool = sessions.redis.connection_pool
    assert not pool._in_use_connections and len(pool._available_connections) == 1
    # the same connection, never dropped: redis-py reconnects one it is given back with a reply unread
    assert sessions.redis.client_id() == client_id
    assert sessions.deleted_by_client(s.id, mine) is False  # a GET: would read the script's array if left behind
    assert sessions.validate(s.id, mine) is not None and sessions.active() >= 1


@needs_redis
@pytest.mark.parametrize("mishap", ["script_flushed", "connection_broken"])
def test_a_check_that_went_wrong_on_its_way_is_answered_by_validate(mishap):
    """script_flushed: Redis restarted (scripts are not kept) between the script's registration and the check —
    the NOSCRIPT reply is caught and validate() loads the script again. connection_broken: the pooled connection
    the check went out on breaks before its reply is read (Redis restarted, a proxy's idle timeout) — validate()
    answers on a connection of its own. Either way the pool holds no connection in use afterwards."""
    sessions = RedisSessionStore(settings.REDIS_URL)
    mine = f"u1.t{secrets.token_hex(4)}"
    s = sessions.create(mine, "v1", "2025-11-25")
    sessions.validate(s.id, mine)
    if mishap == "script_flushed":
        sessions.redis.script_flush()
    pending = sessions.begin_validate(s.id, mine)
    assert pending.conn is not None
    if mishap == "connection_broken":
        pending.conn._sock.shutdown(socket.SHUT_RDWR)
    try:
        got = pending.result()
    finally:
        pending.close()
    assert got is not None and got.id == s.id
    assert not sessions.redis.connection_pool._in_use_connections
    assert sessions.validate(s.id, mine) is not None  # and the pool's connections still serve


def test_redis_down_fails_as_validate_does():
    """Nothing raises before authentication has run: begin_validate swallows the refused connection, and the
    answer, asked for, is validate()'s own ConnectionError (the transport's 503 with a retry hint)."""
    sessions = RedisSessionStore("redis://127.0.0.1:1/0")  # nothing listens on port 1
    pending = sessions.begin_validate("0" * 32, "u1.tx")
    with pytest.raises(redis.exceptions.ConnectionError):
        pending.result()
    pending.close()


def test_the_guess_is_the_last_principal_the_token_was(mint):
    raw = mint("alice", role="Operator", tier="operator")
    headers = {"authorization": f"Bearer {raw}"}
    assert last_principal_key(headers) is None  # not seen yet
    p = principal_for_token(raw)
    assert last_principal_key(headers) == p.key == last_principal_key({"x-yuzu-token": raw})
    assert last_principal_key({"authorization": "Basic abc"}) is None
    assert last_principal_key({"authorization": f"Bearer yuzu_{'0' * 64}"}) is None
    ApiToken.objects.filter(pk=p.token.pk).update(revoked_at=timezone.now())
    with pytest.raises(Exception, match="revoked"):
        principal_for_token(raw)
    assert last_principal_key(headers) is None  # refused: no check is begun for it any more


@needs_redis
def test_a_call_checks_its_session_once(mint, monkeypatch):
    """On Redis a session-bound call takes the early check's answer: validate() itself is not called again."""
    c = McpClient(mint("alice", role="Operator", tier="operator"))
    c.initialize()
    assert c.rpc("ping").status == 200  # the token seen: the next call's check begins early

    def second_check(*args, **kwargs):
        raise AssertionError("the session was checked twice")

    monkeypatch.setattr(RedisSessionStore, "validate", second_check)
    r = c.call("list_agents")
    assert r.status == 200 and not r.json()["result"].get("isError")


def test_a_guess_authentication_does_not_confirm_is_not_used(mint, monkeypatch):
    """The early check ran for the principal the token was; if authentication names another (here: the guess
    is forced wrong), the session is checked again for the one it names."""
    alice = mint("alice", role="Operator", tier="operator")
    c = McpClient(alice)
    c.initialize()
    monkeypatch.setattr("mcp.server.last_principal_key", lambda headers: "u999999.tnobody")
    assert c.rpc("ping").status == 200  # alice's own session, checked for alice
    mallory = mint("mallory", role="Operator", tier="operator")
    alice_key = principal_for_token(alice).key
    monkeypatch.setattr("mcp.server.last_principal_key", lambda headers: alice_key)
    r = request(body={"jsonrpc": "2.0", "id": 2, "method": "ping"},
                headers={"authorization": f"Bearer {mallory}", "mcp-session-id": c.sid,
                         "mcp-protocol-version": "2025-11-25"})
    assert r.status == 404 and r.error["code"] == -32007  # alice's session, asked for by mallory: unknown
