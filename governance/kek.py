"""The KEK tools (spec/governance.md §4): rotate the key-encryption key of the secrets at rest, finish an
interrupted rotation, and read the key state — over yuzu.secrets, which does the cryptography.

KEK operations are serialised: on PostgreSQL by one advisory lock (``secrets_kek_op``, so every server
process agrees), in embedded mode (one process) by a process lock. Rotation mints ONE new version and re-wraps
every registered sealed column under it, under the same lock; a failure after the new version exists is
HalfCommitted — call rewrap_secrets, never rotate again. There is deliberately no retire tool: retiring key
material races with writes (``manage.py retire_kek`` retires a version no row uses any more)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models.functions import Now
from django.utils import timezone

from yuzu import rbac, secrets
from yuzu.audit import audit
from yuzu.errors import STORE_FAULT_RETRY_MS, YuzuError
from yuzu.models import KekVersion
from yuzu.stepup import require_fresh_mfa

from .engines import deny_engine

LOCK_NAME = "secrets_kek_op"
_local_lock = threading.Lock()


def min_rotate_interval() -> int:
    return int(getattr(settings, "YUZU_KEK_MIN_ROTATE_INTERVAL", 3600))


def max_live_versions() -> int:
    return int(getattr(settings, "YUZU_KEK_MAX_LIVE_VERSIONS", 8))


def _authorize(principal: rbac.Principal, operation: str) -> None:
    deny_engine(principal, f"Security:{operation}")
    rbac.refuse_service_scoped(principal, "Security", operation)
    if not rbac.may(principal, "Security", operation):
        raise rbac.denial(principal, "Security", operation)
    if operation != "Read":
        require_fresh_mfa(principal, f"Security:{operation}")


def failure(tag: str, message: str, *, retry_after_ms: int | None = None, remediation: str | None = None,
            status: int = 503) -> YuzuError:
    return YuzuError(f"{tag}: {message}", status=status, rpc_code=-32603, retry_after_ms=retry_after_ms,
                     remediation=remediation, extra={"failure": tag})


def _is_pg() -> bool:
    return connection.vendor == "postgresql"


@contextmanager
def kek_lock() -> Iterator[None]:
    """Held for one KEK operation; Conflict when another holds it."""
    if _is_pg():
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [LOCK_NAME])
            got = cur.fetchone()[0]
        if not got:
            raise failure("conflict", "another KEK operation holds the lock", retry_after_ms=STORE_FAULT_RETRY_MS,
                          status=409)
        try:
            yield
        finally:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(hashtext(%s))", [LOCK_NAME])
    else:
        if not _local_lock.acquire(blocking=False):
            raise failure("conflict", "another KEK operation holds the lock", retry_after_ms=STORE_FAULT_RETRY_MS,
                          status=409)
        try:
            yield
        finally:
            _local_lock.release()


_versions_in_use = secrets.versions_in_use


def rotate_kek(principal: rbac.Principal, *, cid: str = "") -> dict[str, Any]:
    _authorize(principal, "Write")
    try:
        with kek_lock():
            newest = KekVersion.objects.order_by("-version").first()
            if newest is not None:
                db_now = KekVersion.objects.annotate(now=Now()).values_list("now", flat=True).first() or timezone.now()
                if newest.created_at > db_now:
                    raise failure("clock_anomaly", "the newest KEK version was created in the future (DB clock)")
                age = (db_now - newest.created_at).total_seconds()
                if age < min_rotate_interval():
                    remaining = int((min_rotate_interval() - age) * 1000) + 1
                    raise failure("cooldown", f"the KEK was rotated {int(age)} s ago (minimum interval "
                                  f"{min_rotate_interval()} s)", retry_after_ms=remaining, status=429)
            live = KekVersion.objects.filter(retired_at__isnull=True).count()
            if live >= max_live_versions():
                raise failure("version_ceiling", f"{live} live KEK versions (the most is {max_live_versions()})",
                              remediation="run rewrap_secrets, then retire versions no row uses (manage.py "
                                          "retire_kek); not retryable as is", status=409)
            version = secrets.create_version()
            try:
                moved = secrets.rewrap_all(version)
            except (DatabaseError, secrets.SecretError) as exc:
                audit(principal, "kek.rotate", "failure", detail="half_committed", correlation_id=cid)
                raise failure("half_committed", f"version {version} is active but the rewrap did not finish ({exc})",
                              remediation="call rewrap_secrets (safe to repeat); do NOT rotate again") from None
    except YuzuError as exc:
        if exc.extra.get("failure") != "half_committed":
            audit(principal, "kek.rotate", "failure", detail=str(exc.extra.get("failure", "internal")),
                  correlation_id=cid)
        raise
    complete = set(_versions_in_use()) - {secrets.UNREADABLE} <= {version}
    audit(principal, "kek.rotate", "success", detail=f"new_version={version} rows_rewrapped={moved}",
          correlation_id=cid)
    return {"new_version": version, "rotation_complete": complete}


def rewrap_secrets(principal: rbac.Principal, *, cid: str = "") -> dict[str, Any]:
    _authorize(principal, "Write")
    try:
        with kek_lock():
            moved = secrets.rewrap_all()
    except YuzuError as exc:
        audit(principal, "kek.rewrap", "failure", detail=str(exc.extra.get("failure", "internal")), correlation_id=cid)
        raise
    except (DatabaseError, secrets.SecretError) as exc:
        audit(principal, "kek.rewrap", "failure", detail=getattr(exc, "failure_class", "internal"), correlation_id=cid)
        raise failure("internal", "the rewrap did not finish; it is safe to repeat",
                      retry_after_ms=STORE_FAULT_RETRY_MS) from None
    audit(principal, "kek.rewrap", "success", detail=f"rows_rewrapped={moved}", correlation_id=cid)
    return {"rows_rewrapped": moved}


def get_kek_status(principal: rbac.Principal) -> dict[str, Any]:
    _authorize(principal, "Read")
    active = KekVersion.objects.order_by("-version").values_list("version", flat=True).first()
    in_use = _versions_in_use()
    unreadable = in_use.pop(secrets.UNREADABLE, 0)
    oldest = min(in_use) if in_use else None
    lock_held, pid, captured = _lock_diagnostics()
    return {"active_version": active, "oldest_in_use": oldest,
            "rotation_complete": oldest is None or oldest == active,
            "live_versions": len(in_use) if in_use else None, "lock_held": lock_held,
            "lock_holder_pid": pid, "lock_holder_captured_at": captured, "unreadable_secrets": unreadable}


def _lock_diagnostics() -> tuple[bool | None, int | None, str | None]:
    if not _is_pg():
        return _local_lock.locked(), None, None
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = "
                        "(hashtext(%s)::bigint & 4294967295)::oid LIMIT 1", [LOCK_NAME])
            row = cur.fetchone()
    except DatabaseError:
        return None, None, None
    return (row is not None, int(row[0]) if row else None, timezone.now().isoformat() if row else None)
