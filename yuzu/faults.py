"""Backing-store faults as honest refusals (issue 22, docs/operations.md).

When PostgreSQL/SQLite or Redis is unreachable (a restart, a failover, a network blip) or the embedded
database cannot be written (read-only file system, disk full), the driver raises its own exception deep in
a request. Without this module that surfaced as a 500 "internal error". ``store_fault(exc)`` recognises
those exceptions (and the exceptions they were raised from) and returns the refusal both faces render:
REST 503 with ``retry_after_ms`` (and a ``Retry-After`` header), MCP ``-32603`` with the same data. Every
recognised fault is counted in ``yuzu_store_faults_total{store, kind}`` and logged once per request as
``store fault: <store> <kind>`` on the ``yuzu.faults`` logger (no stack trace: it is not a bug).

What counts as a fault of the store (and not a bug of ours) is deliberately narrow: connection-level and
availability errors. A constraint violation, a bad query or a Redis script error still ends as a 500 with a
stack trace in the log.
"""

from __future__ import annotations

import logging
import sqlite3

import redis.exceptions
from django.db import InterfaceError, OperationalError, connection
from kombu.exceptions import OperationalError as BrokerError  # Celery's broker (Redis) unreachable

from .errors import STORE_FAULT_OPERATOR_RETRY_MS, STORE_FAULT_RETRY_MS, StoreFault
from .metrics import STORE_FAULTS

log = logging.getLogger("yuzu.faults")


_REDIS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.BusyLoadingError,
          redis.exceptions.ReadOnlyError)

#: what each kind of fault tells the caller (the message) and the operator (the kind label)
_MESSAGES = {
    ("database", "read_only"): "the database is read-only: writes are refused, reads keep working",
    ("database", "disk_full"): "the database's disk is full: writes are refused, reads keep working",
    ("database", "locked"): "the database is busy, retry shortly",
    ("database", "unavailable"): "the database is unavailable, retry shortly",
    ("redis", "unavailable"): "Redis (sessions, streams, the channel layer and the task queue) is unavailable, "
                              "retry shortly; reads that need only the database keep working",
}


def _classify(exc: BaseException) -> tuple[str, str] | None:
    if isinstance(exc, _REDIS):
        return "redis", "unavailable"
    if isinstance(exc, BrokerError):
        return "redis", "unavailable"
    if isinstance(exc, (OperationalError, InterfaceError, sqlite3.OperationalError)):
        text = str(exc).lower()
        if "readonly" in text or "read-only" in text or "read only" in text:
            return "database", "read_only"
        if "disk is full" in text or "no space left" in text or "disk full" in text:
            return "database", "disk_full"
        if "database is locked" in text:
            return "database", "locked"
        if isinstance(exc, sqlite3.OperationalError) or "sqlite" in type(exc).__module__:
            # other SQLite operational errors are mostly ours (no such table, syntax): not a store fault,
            # except I/O errors from the file system underneath
            return ("database", "unavailable") if "disk i/o error" in text or "unable to open" in text else None
        if getattr(exc, "__cause__", None) is not None and isinstance(exc.__cause__, sqlite3.Error):
            return ("database", "unavailable") if "disk i/o error" in text or "unable to open" in text else None
        return "database", "unavailable"
    return None


def classify(exc: BaseException) -> tuple[str, str] | None:
    """``(store, kind)`` when ``exc`` or one it was raised from is a backing-store fault, else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = _classify(current)
        if found:
            return found
        current = current.__cause__ or current.__context__
    return None


def _drop_connection() -> None:
    """Reopen on the next query: a SQLite connection opened while its file system was read-only stays read-only
    after the file system is writable again, and Django keeps embedded connections for 10 minutes (issue 22)."""
    if connection.in_atomic_block:
        return  # the transaction's owner sees the error and rolls back; the request end closes it
    try:
        connection.close()
    except Exception:  # closing a broken connection may fail too: it is discarded either way
        log.debug("closing the database connection after a fault failed", exc_info=True)


def store_fault(exc: BaseException, *, what: str = "") -> StoreFault | None:
    """The refusal for a backing-store fault (counted and logged), or None when ``exc`` is something else."""
    found = classify(exc)
    if found is None:
        return None
    store, kind = found
    STORE_FAULTS.labels(store, kind).inc()
    if store == "database":
        _drop_connection()
    log.warning("store fault: %s %s%s (%s: %s)", store, kind, f" during {what}" if what else "",
                type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
    if kind in ("read_only", "disk_full"):  # an operator has to act: polling faster only adds load
        return StoreFault(_MESSAGES[(store, kind)], retry_after_ms=STORE_FAULT_OPERATOR_RETRY_MS,
                          remediation="an operator must free disk space or make the database writable; "
                                      "reads keep working", extra={"store": store, "fault": kind})
    return StoreFault(_MESSAGES[(store, kind)], retry_after_ms=STORE_FAULT_RETRY_MS,
                      remediation="retry after retry_after_ms", extra={"store": store, "fault": kind})
