"""Audit group commit (yuzu.audit.GroupCommit): concurrent callers' rows go to the database in one INSERT, each
caller learns only once its row is committed, and an audit store that is down still answers
``audit_persisted: false`` instead of failing the call."""

import threading

import pytest
from django.db import connection, connections

from tests.support.mcp_http import McpClient
from yuzu import audit as audit_mod
from yuzu.audit import audit
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_rows_share_inserts_and_each_is_committed_when_its_caller_returns(monkeypatch):
    batches = []
    write = audit_mod._write

    def spy(events, expected=None):
        batches.append(len(events))
        return write(events, expected)

    monkeypatch.setattr(audit_mod, "_write", spy)
    n = 24
    start = threading.Barrier(n)
    seen = {}

    def caller(i):
        start.wait()
        ok = audit(f"p{i}", "bench.call", "success", correlation_id=f"c{i}")
        # committed: another connection sees it the moment audit() returned
        other = connections.create_connection("default")
        try:
            with other.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM yuzu_auditevent WHERE correlation_id = %s", [f"c{i}"])
                seen[i] = (ok, cur.fetchone()[0])
        finally:
            other.close()
            connections.close_all()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(v == (True, 1) for v in seen.values()), seen
    assert sum(batches) == n and AuditEvent.objects.filter(action="bench.call").count() == n
    assert len(batches) < n, batches  # some rows shared an INSERT


def test_a_bad_row_costs_no_other_row_of_its_batch_its_commit():
    """A batch is one transaction: a row the database refuses (here a missing timestamp) rolls the batch back,
    and the group commit then writes each of its rows by itself, so only the bad one is lost."""
    def event(i):
        return AuditEvent(principal=f"p{i}", action="batch.row", result="success", correlation_id=f"b{i}")

    good, bad, later = event(1), event(2), event(3)
    bad.timestamp = None
    assert audit_mod._write([good, bad, later]) is None
    assert not AuditEvent.objects.filter(action="batch.row").exists()

    group = audit_mod.GroupCommit()
    waiting = [audit_mod._Slot(good), audit_mod._Slot(bad)]  # callers queued while a write was under way
    group.queue = list(waiting)
    assert group.commit(later) is True
    assert [s.ok for s in waiting] == [True, False]
    assert sorted(AuditEvent.objects.filter(action="batch.row").values_list("correlation_id", flat=True)) == \
        ["b1", "b3"]


def _statements(fn):
    """Run ``fn``; every statement it sent, with whether a transaction was open around it."""
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append((sql, params, connection.in_atomic_block))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        result = fn()
    return result, seen


def _events(n, action="batch.stmt"):
    return [AuditEvent(principal=f"p{i}", action=action, result="success", correlation_id=f"s{i}") for i in range(n)]


def test_a_batch_is_one_insert_committed_by_itself():
    """One statement for the whole batch and no transaction around it: one round trip, where BEGIN, the rows and
    COMMIT took three — the batch is still all or nothing, as one statement is."""
    ok, seen = _statements(lambda: audit_mod._write(_events(3)))
    assert ok == [True] * 3
    assert len(seen) == 1, seen
    sql, params, in_transaction = seen[0]
    assert sql.startswith("INSERT") and len(params) == 3 * len(audit_mod._COLUMNS) and not in_transaction
    assert sorted(AuditEvent.objects.filter(action="batch.stmt").values_list("correlation_id", flat=True)) == \
        ["s0", "s1", "s2"]


def test_a_batch_longer_than_one_statement_is_one_transaction(monkeypatch):
    monkeypatch.setattr(audit_mod, "_STATEMENT_ROWS", 2)
    ok, seen = _statements(lambda: audit_mod._write(_events(5)))
    assert ok == [True] * 5
    inserts = [(params, in_transaction) for sql, params, in_transaction in seen if sql.startswith("INSERT")]
    assert [len(params) // len(audit_mod._COLUMNS) for params, _ in inserts] == [2, 2, 1]
    assert all(in_transaction for _, in_transaction in inserts)
    assert AuditEvent.objects.filter(action="batch.stmt").count() == 5

    rows = _events(5, action="batch.late")
    rows[4].timestamp = None  # refused in the last statement: the first two statements' rows go with it
    assert audit_mod._write(rows) is None
    assert not AuditEvent.objects.filter(action="batch.late").exists()


def test_inside_a_transaction_the_row_is_the_transactions():
    from django.db import transaction

    with pytest.raises(RuntimeError):
        with transaction.atomic():
            assert audit("alice", "tx.call", "success")
            raise RuntimeError
    assert not AuditEvent.objects.filter(action="tx.call").exists()


def test_audit_store_down_answers_audit_persisted_false(mint):
    c = McpClient(mint("alice", tier="operator"))
    c.initialize()
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE yuzu_auditevent RENAME TO yuzu_auditevent_away")
    try:
        r = c.call("list_agents").json()
    finally:
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE yuzu_auditevent_away RENAME TO yuzu_auditevent")
    assert r["result"]["structuredContent"]["audit_persisted"] is False, r
    r = c.call("list_agents").json()
    assert "audit_persisted" not in r["result"]["structuredContent"]
