"""The audit log writer. Every security-relevant action calls ``audit``; secrets never enter a row."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from django.db import connection, transaction

from . import provisional
from .jsondata import JsonObject
from .models import AuditEvent, AuthVersion

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser
    from django.contrib.auth.models import AnonymousUser

    from .rbac import Principal

log = logging.getLogger("yuzu.audit")
_SECRET_RE = re.compile(r"yuzu_[0-9a-fA-F]{16,}|(?i:(password|secret|token)=)\S+")


def scrub(text: str) -> str:
    return _SECRET_RE.sub(lambda m: (m.group(1) + "[redacted]") if m.group(1) else "yuzu_[redacted]", text)


def audit(principal: Principal | AbstractBaseUser | AnonymousUser | str | None, action: str, result: str, *,
          target_type: str = "", target_id: object = "", detail: str = "", correlation_id: str = "",
          strict: bool = False) -> bool:
    """Append one row. ``principal`` is a Principal, a user, or a name. Returns True once the row is committed
    (or written in the caller's open transaction, which commits or rolls back with it). ``strict`` (inside a
    transaction only): a failed write raises, so the caller's transaction rolls back with it — for a row that
    must exist whenever the writes it records do.

    A provisional call's row (yuzu.provisional) confirms the call: its deferred checks are answered first, and the
    row is written only if the auth version is still the one the call ran as — checked by the INSERT itself, so
    no round trip is added. Inside a transaction the call is confirmed before, in a round trip of its own."""
    if connection.in_atomic_block:
        provisional.confirm()
        expected = None
    else:
        expected = provisional.carry()
    if principal is None or isinstance(principal, str):
        name = principal or ""
    elif hasattr(principal, "get_username"):  # a user
        name = principal.get_username()
    else:
        name = principal.name
    event = AuditEvent(principal=name[:150], action=action[:128], result=result, target_type=target_type[:64],
                       target_id=str(target_id)[:256], detail=scrub(detail)[:8192], correlation_id=correlation_id)
    if connection.in_atomic_block:  # the row belongs to the caller's transaction
        kept = _kept.get()
        if kept is not None:
            kept.append(event)
        if strict:
            _insert([event])
            return True
        return _write([event]) is not None
    ok = group.commit(event, expected)
    if ok and expected is not None:
        provisional.settle()  # else the reply confirms: a moved version abandons the call there
    return ok


_COLUMNS = ("timestamp", "principal", "action", "target_type", "target_id", "detail", "result", "correlation_id")
_insert_sql: dict[tuple[str, int], str] = {}  # per database vendor and number of rows
#: rows per INSERT statement: more than a batch holds (one per concurrent caller), and 8 × 100 bound parameters
#: stay within the 999 of a SQLite older than 3.32
_STATEMENT_ROWS = 100


def _insert_statement(rows: int) -> str:
    sql = _insert_sql.get((connection.vendor, rows))
    if sql is None:
        q = connection.ops.quote_name
        values = f"({', '.join(['%s'] * len(_COLUMNS))})"
        sql = _insert_sql[(connection.vendor, rows)] = (
            f"INSERT INTO {q(AuditEvent._meta.db_table)} ({', '.join(map(q, _COLUMNS))}) "
            f"VALUES {', '.join([values] * rows)}")
    return sql


def _checked_statement(rows: int) -> str:
    """PostgreSQL: the rows of ``_insert_statement``, each with the auth version its caller expects (NULL: none),
    written only if the database holds that version; the statement answers the version it found."""
    sql = _insert_sql.get(("checked", rows))
    if sql is None:
        q = connection.ops.quote_name
        cols = ", ".join(map(q, _COLUMNS))
        values = f"({', '.join(['%s'] * len(_COLUMNS))}, %s::bigint)"
        sql = _insert_sql[("checked", rows)] = (
            f"WITH v AS ({AuthVersion.READ_SQL}), "
            f"r ({cols}, expected) AS (VALUES {', '.join([values] * rows)}), "
            f"w AS (INSERT INTO {q(AuditEvent._meta.db_table)} ({cols}) SELECT {cols} FROM r "
            f"WHERE r.expected IS NULL OR r.expected = (SELECT n FROM v)) "
            f"SELECT (SELECT n FROM v)")
    return sql


def _insert(events: list[AuditEvent], expected: list[int | None] | None = None) -> list[bool]:
    """The INSERT ``e.save()`` would run for each event, without compiling it through the ORM on every call (a
    third of a tools/call's Python time went there). A batch is one statement committed by itself — all its rows
    or none, in one round trip, where BEGIN, the rows and COMMIT took three. Append-only as ever: this only ever
    inserts. ``expected``: per event, the auth version its provisional caller ran as (yuzu.provisional), or None;
    such a row is written only at that version. Answers, per event, whether its row was written."""
    checked = expected is not None and any(w is not None for w in expected)
    written: list[bool] = []
    with (transaction.atomic() if len(events) > _STATEMENT_ROWS else nullcontext(), connection.cursor() as cursor,
          provisional.carrying() if checked else nullcontext()):
        for start in range(0, len(events), _STATEMENT_ROWS):
            chunk = events[start:start + _STATEMENT_ROWS]
            params = [v for e in chunk for v in (
                connection.ops.adapt_datetimefield_value(e.timestamp), e.principal, e.action, e.target_type,
                e.target_id, e.detail, e.result, e.correlation_id)]
            if not checked:
                cursor.execute(_insert_statement(len(chunk)), params)
                written += [True] * len(chunk)
                continue
            wants = (expected or [])[start:start + _STATEMENT_ROWS]
            n = len(_COLUMNS)
            cursor.execute(_checked_statement(len(chunk)),
                           [v for i, w in enumerate(wants) for v in (*params[i * n:i * n + n], w)])
            found = cursor.fetchone()[0]
            written += [w is None or w == found for w in wants]
    return written


_kept: ContextVar[list[AuditEvent] | None] = ContextVar("yuzu_audit_kept", default=None)


@contextmanager
def kept_rows() -> Iterator[list[AuditEvent]]:
    """Collect the rows written inside a transaction the caller may roll back, so that ``rewrite`` can write
    them again after it did: a refusal's audit row must outlive the transaction its call ran in."""
    rows: list[AuditEvent] = []
    token = _kept.set(rows)
    try:
        yield rows
    finally:
        _kept.reset(token)


def rewrite(rows: list[AuditEvent]) -> bool:
    """Write rows again that a rolled-back transaction took with it (each committed by itself)."""
    ok = True
    for row in rows:
        row.pk = None
        row._state.adding = True
        ok = group.commit(row) and ok
    return ok


def _write(events: list[AuditEvent], expected: list[int | None] | None = None) -> list[bool] | None:
    """``_insert``; None when the database refused the batch (logged; the caller reports audit_persisted:false)."""
    try:
        return _insert(events, expected)
    except Exception:  # set-and-proceed
        log.exception("audit write failed for %s", ", ".join(sorted({e.action for e in events})))
        return None


class GroupCommit:
    """Concurrent callers' rows in one INSERT, each caller returning only once its row is committed.

    The first caller to arrive while no write is under way leads: it takes every row queued so far and writes
    them in one transaction on its own connection. Callers arriving meanwhile queue; when the write ends, each
    learns its row's fate, and one of those still queued leads the next write. A lone caller writes at once, so
    nobody waits for a batch to fill. A failed batch is retried row by row, so one bad row costs no other
    caller its row."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queue: list[_Slot] = []
        self.writing = False

    def commit(self, event: AuditEvent, expected: int | None = None) -> bool:
        """True once the row is committed; False when the database refused it, or (``expected``: the auth version
        a provisional caller ran as) found another version and it was not written."""
        slot = _Slot(event, expected)
        with self.cond:
            self.queue.append(slot)
            while slot.ok is None and self.writing:
                self.cond.wait()
            if slot.ok is not None:
                return slot.ok
            batch, self.queue, self.writing = self.queue, [], True
        outcomes: list[bool] = []
        try:
            written = _write([s.event for s in batch], [s.expected for s in batch])
            if written is not None:
                outcomes = written
            else:
                outcomes = [False] if len(batch) == 1 else [_write_one(s) for s in batch]
        except BaseException:
            outcomes = [False] * len(batch)
            raise
        finally:
            with self.cond:
                for s, o in zip(batch, outcomes, strict=True):
                    s.ok = o
                self.writing = False
                self.cond.notify_all()
        return bool(slot.ok)


class _Slot:
    __slots__ = ("event", "expected", "ok")

    def __init__(self, event: AuditEvent, expected: int | None = None) -> None:
        self.event, self.expected = event, expected
        self.ok: bool | None = None


def _write_one(slot: _Slot) -> bool:
    outcome = _write([slot.event], [slot.expected])
    return outcome is not None and outcome[0]


group = GroupCommit()


def event_view(e: AuditEvent) -> JsonObject:
    return {"id": e.id, "timestamp": e.timestamp.isoformat(), "principal": e.principal, "action": e.action,
            "target_type": e.target_type, "target_id": e.target_id, "detail": e.detail, "result": e.result,
            "correlation_id": e.correlation_id or None}


#: the largest epoch second a filter accepts (9999-12-31T23:59:59Z): every datetime Python can hold
EPOCH_MAX = 253402300799


def query_audit(*, principal: str | None = None, action: str | None = None, target_type: str | None = None,
                since: int | None = None, until: int | None = None, limit: int = 50) -> list[JsonObject]:
    """Newest first. ``since``/``until`` are epoch seconds; ``action`` matches a prefix."""
    qs = AuditEvent.objects.all()
    if principal:
        qs = qs.filter(principal=principal)
    if action:
        qs = qs.filter(action__startswith=action)
    if target_type:
        qs = qs.filter(target_type=target_type)
    if since is not None:
        qs = qs.filter(timestamp__gte=datetime.fromtimestamp(since, UTC))
    if until is not None:
        qs = qs.filter(timestamp__lte=datetime.fromtimestamp(until, UTC))
    return [event_view(e) for e in qs.order_by("-id")[: max(1, min(int(limit), 500))]]
