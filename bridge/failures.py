"""The bridge's business failures, one vocabulary for both faces.

A ``BridgeFailure`` is raised before any side effect its check can precede; the MCP tools render it as
a tool result with ``isError`` and ``{error: {code, message, retryable}}``, the REST face as the envelope
with the HTTP ``status`` and ``reason: code`` (docs/bridge.md, "Outcomes and errors").
"""

from mcp.registry import ToolFailure
from yuzu.errors import YuzuError


class BridgeFailure(Exception):
    """A business failure both faces render: MCP → ToolFailure (isError, {error:{code, message,
    retryable}}); REST → the envelope with ``status`` and ``reason: code``."""

    STATUS = {"worker_gone": 410, "subscription_boundary": 403, "isolation_boundary": 403, "unknown_worker": 404,
              "no_worker": 404, "ambiguous_worker": 409, "wrong_role": 403, "not_a_worker": 403, "unknown_turn": 404,
              "no_question": 409, "unknown_profile": 404, "spawn_failed": 502, "delivery_failed": 502,
              "content_too_large": 413, "worker_limit": 429,
              "queue_full": 429, "inbox_full": 429}

    def __init__(self, code, message, *, retryable=False, status=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.status = status or self.STATUS.get(code, 409)

    def as_tool_failure(self):
        return ToolFailure(self.message, {"code": self.code, "retryable": self.retryable},
                           audit_result=self.audit_result)

    @property
    def audit_result(self):
        """A refusal of who the caller is (403: wrong_role, not_a_worker, subscription_boundary,
        isolation_boundary) is audited ``denied`` on both faces; any other failure ``failure``."""
        return "denied" if self.status == 403 else "failure"

    def as_yuzu_error(self):
        return YuzuError(self.message, status=self.status, extra={"reason": self.code, "retryable": self.retryable},
                         audit_result=self.audit_result)


def error_outcome(code, message, turn_id=None, retryable=False):
    """An error as a turn outcome (worker_gone, delivery_failed): what a waiter or the inbox receives."""
    out = {"outcome": "error", "error": {"code": code, "message": message, "retryable": retryable}}
    if turn_id is not None:
        out["turnId"] = turn_id
    return out

