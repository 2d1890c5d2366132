"""The audit log writer. Every security-relevant action calls ``audit``; secrets never enter a row."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .jsondata import JsonObject
from .models import AuditEvent

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser
    from django.contrib.auth.models import AnonymousUser

    from .rbac import Principal

log = logging.getLogger("yuzu.audit")
_SECRET_RE = re.compile(r"yuzu_[0-9a-fA-F]{16,}|(?i:(password|secret|token)=)\S+")


def scrub(text: str) -> str:
    return _SECRET_RE.sub(lambda m: (m.group(1) + "[redacted]") if m.group(1) else "yuzu_[redacted]", text)


def audit(principal: Principal | AbstractBaseUser | AnonymousUser | str | None, action: str, result: str, *,
          target_type: str = "", target_id: object = "", detail: str = "", correlation_id: str = "") -> bool:
    """Append one row. ``principal`` is a Principal, a user, or a name. Returns True when persisted."""
    if principal is None or isinstance(principal, str):
        name = principal or ""
    elif hasattr(principal, "get_username"):  # a user
        name = principal.get_username()
    else:
        name = principal.name
    try:
        AuditEvent.objects.create(
            principal=name[:150], action=action[:128], result=result, target_type=target_type[:64],
            target_id=str(target_id)[:256], detail=scrub(detail)[:8192], correlation_id=correlation_id,
        )
        return True
    except Exception:  # set-and-proceed: the caller reports audit_persisted:false
        log.exception("audit write failed for %s", action)
        return False


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
