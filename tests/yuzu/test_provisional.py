"""Provisional authentication (yuzu.provisional): a pure read's cached principal is confirmed by the round trip of
its first query instead of one of its own. These tests hold it to what the ordinary check gives — a revoked token,
a removed role or an ended session refused on the very next call — and to letting nothing out unconfirmed: no rows
to the caller, no write, no audit row, no reply."""

import re
import tempfile

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from fleet.models import Agent
from mcp.registry import tool
from mcp.streaming.sessions import store
from tests.support.mcp_http import McpClient
from yuzu import audit as audit_mod
from yuzu.audit import audit, group
from yuzu.auth import PrincipalCache, principal_for_token
from yuzu.models import ApiToken, AuditEvent, AuthVersion, RoleAssignment
from yuzu.provisional import StaleGrant, defer, provisionally

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("postgresql" not in settings.DATABASES["default"]["ENGINE"],
                       reason="provisional calls are made on PostgreSQL only (CI runs on it); SQLite reads the version "
                              "in process, with no round trip to save"),
]


def round_trips(fn):
    """What ``fn`` returns, and how many times the client waited for PostgreSQL meanwhile: libpq's trace of the
    protocol, counting the server's ReadyForQuery (one per round trip: a statement alone, a pipeline once)."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        try:
            result = fn()
        finally:
            pgconn.untrace()
        trace.seek(0)
        return result, sum(1 for line in trace if re.search(r"\tB\t\d+\tReadyForQuery\b", line))


def test_the_version_travels_with_the_audit_row(mint):
    raw = mint("alice", tier="operator")
    principal_for_token(raw)  # cached, at the current version

    def call():
        with provisionally() as prov:
            principal = principal_for_token(raw)
            assert prov.pending  # answered from the cache
            list(Agent.objects.values_list("agent_id", flat=True))
            assert prov.pending  # a read runs unconfirmed
            assert audit(principal, "mcp.list_agents", "success")
            assert prov.confirmed  # the row's INSERT found the version unchanged

    _, trips = round_trips(call)
    assert trips == 2  # the SELECT, then the INSERT that checks the version
    _, trips = round_trips(lambda: (audit(principal_for_token(raw), "mcp.list_agents", "success"),
                                    list(Agent.objects.values_list("agent_id"))))
    assert trips == 3  # the ordinary way: the version, the SELECT, the INSERT


def revoke(raw):
    before = AuthVersion.current()
    ApiToken.objects.filter(owner__username="alice").update(revoked_at=timezone.now())
    assert AuthVersion.current() > before


def test_a_moved_version_writes_no_row_and_abandons_the_attempt(mint):
    raw = mint("alice", tier="operator")
    principal_for_token(raw)
    revoke(raw)  # the cache still holds alice as of the version before
    rows_before = AuditEvent.objects.count()
    with pytest.raises(StaleGrant), provisionally() as prov:
        principal = principal_for_token(raw)
        assert principal.user.username == "alice"  # unconfirmed
        assert audit(principal, "mcp.list_agents", "success") is False  # not written: another version
        assert prov.pending
        prov.confirm()  # what handle does before it answers
    assert AuditEvent.objects.count() == rows_before


def test_a_write_confirms_before_it_runs(mint):
    raw = mint("alice", tier="operator")
    principal_for_token(raw)
    revoke(raw)
    with pytest.raises(StaleGrant), provisionally():
        principal_for_token(raw)
        ApiToken.objects.filter(owner__username="alice").update(name="renamed")
    assert ApiToken.objects.get(owner__username="alice").name != "renamed"


def test_deferred_checks_are_answered_before_the_row_goes(mint, monkeypatch):
    """Group commit may write a call's row on another thread's connection: the row carries its expected version
    with it, and the call's deferred checks (the session) were answered before it was handed over."""
    raw = mint("alice", tier="operator")
    principal_for_token(raw)
    order = []
    monkeypatch.setattr(group, "commit", lambda event, expected=None: order.append(("commit", expected)) or True)
    with provisionally() as prov:
        principal = principal_for_token(raw)
        assert defer(lambda: order.append("session") or True)
        audit(principal, "mcp.list_agents", "success")
        assert order == ["session", ("commit", prov.version)] and prov.confirmed
    with pytest.raises(StaleGrant), provisionally():
        principal = principal_for_token(raw)
        defer(lambda: False)  # the session is gone
        audit(principal, "mcp.list_agents", "success")
    assert len(order) == 2  # no row handed over


def test_one_statement_writes_the_rows_whose_version_holds():
    """A batch with rows of provisional callers: those expecting the current version and those expecting none are
    written, one expecting an older version is not; all in one statement."""
    current = AuthVersion.current()
    events = [AuditEvent(principal=f"p{i}", action="batch.checked", result="success", correlation_id=f"k{i}")
              for i in range(3)]
    assert audit_mod._insert(events, [None, current, current - 1]) == [True, True, False]
    assert sorted(AuditEvent.objects.filter(action="batch.checked").values_list("correlation_id", flat=True)) == [
        "k0", "k1"]


def test_a_current_version_lets_the_write_through(mint):
    raw = mint("alice", tier="operator")
    principal_for_token(raw)
    with provisionally() as prov:
        principal_for_token(raw)
        ApiToken.objects.filter(owner__username="alice").update(name="renamed")
        assert prov.confirmed
    assert ApiToken.objects.get(owner__username="alice").name == "renamed"


def counting_version_reads(monkeypatch):
    reads = []
    current = AuthVersion.current.__func__

    def counted(cls):
        reads.append(1)
        return current(cls)

    monkeypatch.setattr(AuthVersion, "current", classmethod(counted))
    return reads


def outcome(r):
    if r.status != 200:
        return r.status
    body = r.json()
    return "ok" if "result" in body and not body["result"].get("isError") else body["error"]["code"]


def test_a_pure_call_reads_no_version_of_its_own_and_others_do(mint, monkeypatch):
    c = McpClient(mint("alice", tier="operator"))
    c.initialize()
    assert outcome(c.call("list_agents")) == "ok"
    reads = counting_version_reads(monkeypatch)
    assert outcome(c.call("list_agents")) == "ok"
    assert reads == []  # list_agents is pure: the version came with its query
    assert outcome(c.call("list_executions")) == "ok" and reads == [1]  # a read not marked pure
    assert c.rpc("ping").status == 200 and reads == [1, 1]  # not a tool call


def test_revocation_and_a_removed_role_are_refused_on_the_next_pure_call(mint):
    raw = mint("alice", tier="operator")
    c = McpClient(raw)
    c.initialize()
    assert outcome(c.call("list_agents")) == "ok"
    RoleAssignment.objects.filter(user__username="alice").delete()
    assert outcome(c.call("list_agents")) == -32003
    revoke(raw)
    assert outcome(c.call("list_agents")) == 401
    rows = AuditEvent.objects.filter(action="mcp.list_agents")
    assert [r.result for r in rows.order_by("id")] == ["success", "denied"]  # the abandoned attempts wrote none


def test_a_session_ended_elsewhere_is_refused_on_the_next_pure_call(mint):
    """The session this process saw is used unconfirmed; its liveness (the early Redis check, or the memory store)
    is answered at the confirmation: ended by another process's DELETE, the call is answered 404."""
    raw = mint("alice", tier="operator")
    c = McpClient(raw)
    c.initialize()
    assert outcome(c.call("list_agents")) == "ok"
    assert store().delete(c.sid, principal_for_token(raw).key)
    r = c.call("list_agents")
    assert r.status == 404 and r.error["code"] == -32007


def test_only_a_read_may_be_pure():
    with pytest.raises(ValueError, match="only a read"):
        tool(name="impure", title="t", description="d", securable="Tag", operation="Write", input_schema={},
             pure=True, catalogue="test-provisional")(lambda ctx, args: {})


def test_an_entry_loaded_at_an_old_version_does_not_land_in_the_new_one():
    cache = PrincipalCache()
    first, second = object(), object()
    assert cache.get("t", 1) is None
    cache.put("t", 1, first)
    assert cache.get("t", 1) is first
    assert cache.get("t", 2) is None  # another thread read version 2
    cache.put("t", 1, second)  # a thread that loaded at version 1 puts late
    assert cache.get("t", 2) is None
