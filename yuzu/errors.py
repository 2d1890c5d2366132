"""Correlation ids, the named retry floors and the error type shared by the REST and MCP faces."""

import itertools
import threading
import time
from typing import TypedDict, Unpack

from django.core.exceptions import ValidationError

from .jsondata import JsonObject

# retry_after_ms floors (seed: "retry_after_ms floors"). Each is its own symbol even where values
# coincide, so one can be re-tuned without dragging the others.
#: a transient store/subsystem fault on an error-shaped response (REST 503 parity)
STORE_FAULT_RETRY_MS = 5000
#: the database refuses writes until an operator acts (read-only file system, disk full: yuzu.faults)
STORE_FAULT_OPERATOR_RETRY_MS = 60000
#: the API-token rotation family (REST Retry-After: 2 parity)
STORE_FAULT_SHORT_RETRY_MS = 2000
#: a success-shaped "result not ready yet" poll: get_execution_status, query_responses, get_bundle_result.
#: No dispatch-to-first-result histogram exists to derive it from; 2 s bounds poll amplification.
RESULT_POLL_RETRY_MS = 2000
#: an approval ticket poll (-32006): humans approve on minute timescales, so polling faster than
#: every 30 s only amplifies load.
APPROVAL_POLL_RETRY_MS = 30000
#: a GET stream refused for capacity or a pending handover
STREAM_CAP_RETRY_MS = 5000
#: a streamed POST refused for capacity: its slot is held until the work finishes
POST_STREAM_CAP_RETRY_MS = 30000

_seq = itertools.count(1)
_lock = threading.Lock()


def correlation_id() -> str:
    """``req-<hex epoch ms>-<hex seq>``, the format of the REST X-Correlation-Id header."""
    with _lock:
        n = next(_seq)
    return f"req-{int(time.time() * 1000):x}-{n:x}"


class RefusalOptions(TypedDict, total=False):
    """YuzuError's keyword arguments other than ``permission`` (the subclasses below pass them on)."""

    status: int
    rpc_code: int
    retry_after_ms: int | None
    remediation: str | None
    extra: JsonObject | None
    audit_result: str


class YuzuError(Exception):
    """A refusal with everything both faces need to render it.

    ``status`` is the REST HTTP status; ``rpc_code`` the JSON-RPC code the MCP face uses."""

    def __init__(self, message: str, *, status: int = 400, rpc_code: int = -32602, retry_after_ms: int | None = None,
                 remediation: str | None = None, permission: str | None = None, extra: JsonObject | None = None,
                 audit_result: str = "failure") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.rpc_code = rpc_code
        self.retry_after_ms = retry_after_ms
        self.remediation = remediation
        self.permission = permission
        self.extra = extra or {}
        self.audit_result = audit_result

    def envelope(self, cid: str) -> JsonObject:
        data: JsonObject = {"correlation_id": cid, "retry_after_ms": self.retry_after_ms,
                            "remediation": self.remediation}
        if self.permission:
            data["permission"] = self.permission
        data.update(self.extra)
        return data


def validation_message(detail: object) -> str:
    """A Django/DRF validation error's detail (dict, list or text) as one line: ``field: message; …``."""
    if isinstance(detail, dict):
        return "; ".join(validation_message(v) if k in ("__all__", "non_field_errors") else
                         f"{k}: {validation_message(v)}" for k, v in detail.items())
    if isinstance(detail, list):
        return "; ".join(validation_message(v) for v in detail)
    return str(detail)


def invalid_input(exc: ValidationError) -> YuzuError:
    """A Django ValidationError raised by a service, as the YuzuError both faces render (400 / -32602)."""
    detail = exc.message_dict if hasattr(exc, "error_dict") else exc.messages
    return YuzuError(validation_message(detail), status=400, rpc_code=-32602,
                     remediation="correct the request and retry")


class NotFound(YuzuError):
    def __init__(self, message: str, **kw: Unpack[RefusalOptions]) -> None:
        kw.setdefault("status", 404)
        kw.setdefault("rpc_code", -32602)
        super().__init__(message, **kw)


class PermissionDenied(YuzuError):
    def __init__(self, permission: str, message: str | None = None, **kw: Unpack[RefusalOptions]) -> None:
        kw.setdefault("status", 403)
        kw.setdefault("rpc_code", -32003)
        kw.setdefault("audit_result", "denied")
        kw.setdefault("remediation", f"ask an administrator for a role that grants {permission}")
        super().__init__(message or f"permission denied: {permission}", permission=permission, **kw)


class StoreFault(YuzuError):
    def __init__(self, message: str = "store unavailable, retry shortly", **kw: Unpack[RefusalOptions]) -> None:
        kw.setdefault("status", 503)
        kw.setdefault("rpc_code", -32603)
        kw.setdefault("retry_after_ms", STORE_FAULT_RETRY_MS)
        super().__init__(message, **kw)
