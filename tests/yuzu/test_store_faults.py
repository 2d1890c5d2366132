"""Backing-store faults answered honestly (issue 22, yuzu.faults, docs/operations.md): 503 / -32603 with a
retry hint and the store named, never a 500 with a stack trace; a bug still is one."""

import sqlite3

import pytest
import redis
from django.db import IntegrityError, OperationalError
from kombu.exceptions import OperationalError as BrokerError
from prometheus_client import REGISTRY

from tests.support.mcp_http import request
from yuzu.faults import classify

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("exc,expected", [
    (OperationalError("connection to server at \"127.0.0.1\", port 5432 failed: Connection refused"),
     ("database", "unavailable")),
    (OperationalError("server closed the connection unexpectedly"), ("database", "unavailable")),
    (OperationalError("attempt to write a readonly database"), ("database", "read_only")),
    (OperationalError("database or disk is full"), ("database", "disk_full")),
    (OperationalError("database is locked"), ("database", "locked")),
    (redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379"), ("redis", "unavailable")),
    (redis.exceptions.TimeoutError("Timeout reading from socket"), ("redis", "unavailable")),
    (BrokerError("Error 111 connecting"), ("redis", "unavailable")),
    (IntegrityError("duplicate key"), None),
    (redis.exceptions.ResponseError("ERR wrong number of arguments"), None),
    (ValueError("a bug"), None),
])
def test_classify(exc, expected):
    assert classify(exc) == expected


def test_sqlite_errors_of_ours_are_not_store_faults():
    assert classify(sqlite3.OperationalError("no such table: fleet_agent")) is None
    wrapped = OperationalError("no such table: fleet_agent")
    wrapped.__cause__ = sqlite3.OperationalError("no such table: fleet_agent")
    assert classify(wrapped) is None
    wrapped = OperationalError("attempt to write a readonly database")
    wrapped.__cause__ = sqlite3.OperationalError("attempt to write a readonly database")
    assert classify(wrapped) == ("database", "read_only")


def test_a_chained_fault_is_found():
    try:
        try:
            raise redis.exceptions.ConnectionError("refused")
        except redis.exceptions.ConnectionError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert classify(outer) == ("redis", "unavailable")


def _faults(store, kind):
    return REGISTRY.get_sample_value("yuzu_store_faults_total", {"store": store, "kind": kind}) or 0.0


def test_rest_answers_503_with_retry_hints(mint, monkeypatch):
    token = mint("alice", role="Operator")

    def down(*a, **kw):
        raise OperationalError("connection to server failed: Connection refused")

    monkeypatch.setattr("fleet.api.services.list_agents", down)
    before = _faults("database", "unavailable")
    r = request("GET", path="/api/v1/agents", headers={"authorization": f"Bearer {token}"})
    assert r.status == 503, r.body
    err = r.json()["error"]
    assert err["retry_after_ms"] == 5000 and err["store"] == "database" and err["fault"] == "unavailable"
    assert r.headers["retry-after"] == "5"
    assert _faults("database", "unavailable") == before + 1


def test_rest_read_only_database_is_a_clear_refusal(mint, monkeypatch):
    token = mint("alice", role="Operator")

    def read_only(*a, **kw):
        raise OperationalError("attempt to write a readonly database")

    monkeypatch.setattr("fleet.api.services.list_agents", read_only)
    r = request("GET", path="/api/v1/agents", headers={"authorization": f"Bearer {token}"})
    err = r.json()["error"]
    assert r.status == 503 and "read-only" in err["message"] and err["retry_after_ms"] == 60000


def test_mcp_session_store_down_is_503_minus_32603(mint, monkeypatch):
    """The handshake era keeps sessions in Redis: with Redis down, initialize is refused with a hint."""
    from mcp.streaming import sessions

    token = mint("alice", role="Operator", tier="operator")

    class Down:
        def __getattr__(self, name):
            def fail(*a, **kw):
                raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
            return fail

    monkeypatch.setattr(sessions, "store", lambda: Down())
    monkeypatch.setattr("mcp.server.store", lambda: Down())
    r = request(body={"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "t", "version": "1"}}},
                headers={"authorization": f"Bearer {token}"})
    assert r.status == 503, r.body
    err = r.json()["error"]
    assert err["code"] == -32603 and err["data"]["retry_after_ms"] == 5000 and err["data"]["store"] == "redis"


def test_a_bug_is_still_a_500(mint, monkeypatch):
    token = mint("alice", role="Operator")

    def bug(*a, **kw):
        raise IntegrityError("a constraint we broke")

    monkeypatch.setattr("fleet.api.services.list_agents", bug)
    r = request("GET", path="/api/v1/agents", headers={"authorization": f"Bearer {token}"})
    assert r.status == 500
