"""The tools/call check pipeline (spec/yuzu-mcp.md §2.1, project order):

knownness → read-only kill switch → service scope → tier (before RBAC) → input schema →
approval gate → RBAC → handler → one audit row ``mcp.<tool>``.

Sync tools run all of it in one worker-thread hop; async tools (the bridge's blocking ones) run the
checks in one hop, await the handler on the event loop, then audit in a second hop.
"""

import logging
import os
import sys
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn, ParamSpec, TypeVar, cast

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from jsonschema.exceptions import ValidationError as SchemaError

from yuzu import jsondata, rbac
from yuzu.audit import audit, kept_rows, rewrite
from yuzu.errors import YuzuError, invalid_input
from yuzu.faults import store_fault
from yuzu.jsondata import JsonObject
from yuzu.metrics import (
    MCP_APPROVAL_BURNED,
    MCP_TOOL_ARGS_INVALID,
    MCP_TOOL_CALLS,
    MCP_TOOL_LATENCY,
    MCP_TOOL_SECURITY_MISCONFIG,
)
from yuzu.models import OPERATIONS, SECURABLES
from yuzu.policy import requires_approval, tier_allows

from . import jsonrpc as rpc
from .context import ToolContext
from .registry import SyncHandler, Tool, ToolFailure, catalogue
from .schema import error_path, error_text, first_error

log = logging.getLogger("yuzu.mcp")

P = ParamSpec("P")
R = TypeVar("R")
#: gate(ctx, tool, args, approval_id) -> the consumed ticket; it plans the call (ctx.plan) and raises
#: rpc.RpcError on every refusal (a mint answers -32006 with the new ticket's id)
ApprovalGate = Callable[[ToolContext, Tool, JsonObject, "str | None"], object]
#: what refuses a caller a tool whatever the arguments: (rpc code, the refusal, audit detail)
Refusal = tuple[int, YuzuError, str]

# The approval gate is plugged in by the approvals app (AppConfig.ready); without one, gated calls
# take the seed's degraded path: -32004 with no ticket.
_approval_gate: ApprovalGate | None = None


# The hops' threads, one pool per process whatever event loop awaits them (the size of asyncio's default
# executor). A loop's default executor dies with its loop, and its threads with their database connections
# open until the cyclic GC frees them: an event loop per call (async_to_sync in Celery tasks, in-process
# tests) under the server's GC thresholds (yuzu/gctune.py) held 70 PostgreSQL connections open at once.
_HOPS = ThreadPoolExecutor(max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="yuzu-hop")


def hop(fn: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """One worker-thread hop with Django's connection hygiene; not pinned to a single thread, so
    concurrent calls use concurrent database connections (at most one per thread of _HOPS)."""
    return database_sync_to_async(fn, thread_sensitive=False, executor=_HOPS)


def set_approval_gate(gate: ApprovalGate | None) -> None:
    global _approval_gate
    _approval_gate = gate


def approval_gate() -> ApprovalGate | None:
    return _approval_gate


def a4(cid: str, retry_after_ms: int | None = None, remediation: str | None = None, **extra: object) -> JsonObject:
    data: JsonObject = {"correlation_id": cid, "retry_after_ms": retry_after_ms, "remediation": remediation}
    data.update(extra)
    return data


def _audit(ctx: ToolContext, result: str, detail: str = "", strict: bool = False) -> bool:
    parts = [p for p in [detail] + ctx.detail if p]
    return audit(ctx.principal, f"mcp.{ctx.tool}", result, target_type="mcp_tool", target_id=ctx.tool,
                 detail=" ".join(parts), correlation_id=ctx.cid, strict=strict)


def _tool_label(ctx: ToolContext) -> str:
    """MCP_TOOL_CALLS' tool label: a served tool's name, else ``unknown`` — the name is the client's text, and a
    series per invented one would grow every process's counter (and the public /metrics) for good."""
    return ctx.tool if ctx.tool in catalogue(ctx.catalogue).tools else "unknown"


def _deny(ctx: ToolContext, code: int, message: str, result: str = "denied", detail: str = "", stamp_cid: bool = False,
          remediation: str | None = None, **extra: object) -> NoReturn:
    _audit(ctx, result, detail + (f" correlation_id={ctx.cid}" if stamp_cid else ""))
    MCP_TOOL_CALLS.labels(_tool_label(ctx), result).inc()
    data = a4(ctx.cid, remediation=remediation)
    data.update(extra)
    raise rpc.RpcError(code, message, data)


def schema_error_message(error: SchemaError) -> str:
    return f"arguments do not match the tool input schema at '{error_path(error)}': {error_text(error)}"


def check_arguments(tool: Tool, arguments: JsonObject) -> SchemaError | None:
    """Returns None or the first validation error, deterministic (by path)."""
    return first_error(tool.input_schema, arguments)


def pre_checks(ctx: ToolContext, name: object, arguments: object) -> tuple[Tool, JsonObject]:
    """Everything before the handler: knownness, kill switch, service scope, tier, schema, RBAC, the
    tool's own validation (its Plan) and the approval gate. Returns (tool, handler_arguments); the Plan
    is on ``ctx.plan``."""
    cat = catalogue(ctx.catalogue)
    tool = cat.tools.get(name) if isinstance(name, str) else None
    ctx.tool = name if isinstance(name, str) and len(name) <= 128 else "unknown"
    if tool is None:
        _deny(ctx, rpc.INVALID_PARAMS, f"Unknown tool: {str(name)[:128]}", remediation="call tools/list for the served tools")
    if tool.securable not in SECURABLES or tool.operation not in OPERATIONS:
        MCP_TOOL_SECURITY_MISCONFIG.inc()
        _deny(ctx, rpc.INTERNAL_ERROR, "tool is misconfigured (no security registration)", stamp_cid=True,
              remediation="report this to the server operator")
    principal = ctx.principal
    refusal = standing_refusal(principal, tool)
    if refusal is not None:
        _refuse(ctx, *refusal)
    if arguments is None:
        arguments = {}
    error = check_arguments(tool, arguments) if isinstance(arguments, dict) else None
    if not isinstance(arguments, dict) or error is not None:
        MCP_TOOL_ARGS_INVALID.labels(tool.name).inc()
        message = schema_error_message(error) if error else "arguments must be an object"
        _deny(ctx, rpc.INVALID_PARAMS, message, result="failure", detail="args_invalid", stamp_cid=True,
              remediation="fix the argument named in the message; see the tool's inputSchema in tools/list")
    nul = jsondata.nul_at(arguments)
    if nul is not None:
        MCP_TOOL_ARGS_INVALID.labels(tool.name).inc()
        where = nul[0][:128].replace("\x00", "\\u0000")
        _deny(ctx, rpc.INVALID_PARAMS, f"arguments hold a NUL character: U+0000 at offset {nul[1]} of '{where}' "
              "(no stored text may contain it)", result="failure", detail="args_invalid", stamp_cid=True,
              remediation="remove the NUL character (\\u0000) from the argument")
    args = {k: v for k, v in arguments.items() if k != "approval_id"} if tool.gate_capable else dict(arguments)
    try:
        # RBAC; a tool's object permission may also answer "not found" for an object outside the caller's
        # groups (the same answer as for one that does not exist: no oracle).
        if tool.rbac and not _rbac_allows(principal, tool, args):
            exc = rbac.denial(principal, tool.securable, tool.operation)  # says what is held and what is needed
            _refuse(ctx, rpc.PERMISSION_DENIED, exc, f"permission={exc.permission}")
        if requires_approval(principal.tier, tool.securable, tool.operation):
            gate = approval_gate()
            if gate is None:
                _deny(ctx, rpc.TIER_DENIED, f"on tier '{principal.tier}' {tool.securable}:{tool.operation} needs a "
                      "human approval, and this server has no approval store",
                      remediation="the server operator must install the approvals app (INSTALLED_APPS); meanwhile "
                                  "use the REST API with a token that is not an MCP token",
                      tier=principal.tier)
            # The gate plans the call (mint: as asked; recall: pinned to what was approved) and raises
            # RpcError on every refusal.
            ctx.approval = gate(ctx, tool, args, arguments.get("approval_id"))
        else:
            ctx.plan = tool.plan(ctx, args)
    except (YuzuError, ValidationError) as exc:
        err = invalid_input(exc) if isinstance(exc, ValidationError) else exc
        # The call's own validation (or its object permission) refused it before anything happened (no ticket,
        # nothing consumed).
        _refuse(ctx, err.rpc_code, err, result=err.audit_result)
    return tool, args


def standing_refusal(principal: rbac.Principal, tool: Tool) -> Refusal | None:
    """What refuses this caller the tool whatever the arguments, before RBAC: the read-only kill switch, the
    service scope, the tier ceiling. → (rpc code, YuzuError, audit detail) or None. tools/list fits the
    catalogue to the caller with it too."""
    perm = f"{tool.securable}:{tool.operation}"
    if settings.YUZU_MCP_READ_ONLY and tool.is_write:
        return rpc.TIER_DENIED, YuzuError(
            "MCP is in read-only mode", permission=perm, extra={"tier": principal.tier},
            remediation="this server runs with YUZU_MCP_READ_ONLY: write tools are off for every token; use the "
                        "read tools, or ask the server operator to unset it"), ""
    if principal.scope_service and tool.service_scope == "denied":
        return rpc.PERMISSION_DENIED, YuzuError(
            f"service-scoped tokens may not call this tool (this token is scoped to service "
            f"'{principal.scope_service}')", extra={"scope_service": principal.scope_service},
            remediation="use a token without a service scope: " + rbac.mint_token_hint(
                principal, principal.tier or "readonly") + " (no --service)"), "service_scope=denied"
    if not tier_allows(principal.tier, tool.securable, tool.operation):
        return rpc.TIER_DENIED, rbac.tier_denial(principal, tool.securable, tool.operation), f"tier={principal.tier}"
    return None


def _refuse(ctx: ToolContext, code: int, exc: YuzuError, detail: str = "", result: str = "denied") -> NoReturn:
    """Answer a YuzuError as the JSON-RPC error ``code``: its message, remediation, permission and extras."""
    _audit(ctx, result, detail)
    MCP_TOOL_CALLS.labels(_tool_label(ctx), result).inc()
    raise as_rpc_error(code, exc, ctx.cid)


def as_rpc_error(code: int, exc: YuzuError, cid: str) -> rpc.RpcError:
    """A YuzuError as the JSON-RPC error ``code`` with the A4 data (yuzu.errors.YuzuError.envelope)."""
    return rpc.RpcError(code, exc.message, exc.envelope(cid))


def _rbac_allows(principal: rbac.Principal, tool: Tool, args: JsonObject) -> bool:
    """The tool's object permission when it declares one, else the permission on any scope (admit, then
    the handler filters what the caller may see)."""
    if tool.object_permission is not None:
        return tool.object_permission(principal, tool, args)
    return rbac.has_any(principal, tool.securable, tool.operation)


def tool_result(structured: JsonObject, is_error: bool = False) -> JsonObject:
    encoded = jsondata.dumps(structured, default=str)
    fields: JsonObject = {"content": [{"type": "text", "text": encoded.decode()}], "structuredContent": structured}
    if is_error:
        fields["isError"] = True
    return rpc.Result(fields, "structuredContent", encoded)


def finish(ctx: ToolContext, tool: Tool, outcome: JsonObject | ToolFailure | YuzuError) -> JsonObject:
    """Turn the handler's outcome (a dict, ToolFailure or YuzuError) into a result; write the audit row."""
    if isinstance(outcome, ToolFailure):
        if ctx.approval is not None:
            MCP_APPROVAL_BURNED.labels(tool.name, "handler_reject").inc()
        _audit(ctx, outcome.audit_result, outcome.message[:200])
        MCP_TOOL_CALLS.labels(tool.name, outcome.audit_result).inc()
        return tool_result({"error": {"message": outcome.message, **outcome.data}}, is_error=True)
    if isinstance(outcome, YuzuError):
        if ctx.approval is not None:
            MCP_APPROVAL_BURNED.labels(tool.name, "handler_reject").inc()
        _refuse(ctx, outcome.rpc_code, outcome, result=outcome.audit_result)
    result = "approved" if ctx.approval is not None else "success"
    persisted = ctx.audited or _audit(ctx, result)
    MCP_TOOL_CALLS.labels(tool.name, result).inc()
    if not persisted and isinstance(outcome, dict):
        outcome = {**outcome, "audit_persisted": False}
    return tool_result(outcome)


def run_sync(ctx: ToolContext, name: object, arguments: object) -> JsonObject:
    """Checks, handler and audit in one hop (sync tools)."""
    start = time.perf_counter()
    if isinstance(arguments, dict) and arguments.get("approval_id") is not None:
        tool, outcome = _recall_atomically(ctx, name, arguments)
    else:
        tool, args = pre_checks(ctx, name, arguments)
        outcome = _call(ctx, tool, args)
    try:
        return finish(ctx, tool, outcome)
    finally:
        MCP_TOOL_LATENCY.labels(tool.name).observe(time.perf_counter() - start)


def _call(ctx: ToolContext, tool: Tool, args: JsonObject) -> JsonObject | ToolFailure | YuzuError:
    try:
        return cast(SyncHandler, tool.handler)(ctx, args)  # an async tool's handler is awaited by the transport
    except (ToolFailure, YuzuError) as exc:
        return exc
    except ValidationError as exc:
        return invalid_input(exc)
    except Exception:
        return internal_error(ctx)


class _Undo(Exception):
    def __init__(self, outcome: YuzuError) -> None:
        self.outcome = outcome


def _recall_atomically(ctx: ToolContext, name: object,
                       arguments: JsonObject) -> tuple[Tool, JsonObject | ToolFailure | YuzuError]:
    """A gated recall (``approval_id``): the ticket's consumption and the handler's writes in one transaction
    (issue 22). When the store fails under the handler (PostgreSQL restarting, a failover) both roll back: the
    ticket stays approved and unconsumed for the retry, and no execution exists without its consumed ticket
    or the reverse, nor either without the call's ``approved`` audit row (written in the same transaction). A
    refusal commits what it wrote (its audit row, a lazy expiry) as before; the rows of a rolled-back call's
    refusal are written again after the rollback."""
    refusal: rpc.RpcError | None = None
    with kept_rows() as rows:
        try:
            with transaction.atomic():
                try:
                    tool, args = pre_checks(ctx, name, arguments)
                except rpc.RpcError as exc:
                    refusal = exc  # committed below with its audit row, then raised
                else:
                    outcome = _call(ctx, tool, args)
                    if ctx.approval is not None and isinstance(outcome, YuzuError) and outcome.extra.get("store"):
                        raise _Undo(outcome)
                    if ctx.approval is not None and isinstance(outcome, dict):
                        # the approved row commits with the consumption and the handler's writes, or none does
                        ctx.audited = _audit(ctx, "approved", strict=True)
        except _Undo as undo:
            rewrite([r for r in rows if r.action == f"mcp.{ctx.tool}"])  # the gate's rows, not the handler's
            ctx.approval = None  # nothing was consumed: the ticket is not burned
            ctx.note("approval_untouched=store_fault")
            return tool, undo.outcome
        except Exception as exc:  # the commit itself failed, or an on_commit hook (dispatch) raised after it
            fault = store_fault(exc, what=f"commit of {ctx.tool}")
            if fault is None or refusal is not None or connection.in_atomic_block:
                raise
            return tool, fault
    if refusal is not None:
        raise refusal
    return tool, outcome


def internal_error(ctx: ToolContext) -> YuzuError:
    """A handler bug: logged with the correlation id, answered -32603 without a stack trace. A backing store
    that failed under the handler (yuzu.faults) is no bug: -32603 with its retry hint, logged in one line."""
    exc = sys.exc_info()[1]
    if exc is not None and (fault := store_fault(exc, what=f"tool {ctx.tool} {ctx.cid}")) is not None:
        return fault
    log.exception("tool %s failed (%s)", ctx.tool, ctx.cid)
    return YuzuError("internal error", status=500, rpc_code=rpc.INTERNAL_ERROR,
                     remediation="retry; cite the correlation_id if it persists")
