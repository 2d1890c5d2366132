"""The Tasks extension (``io.modelcontextprotocol/tasks``) for modern (2026-07-28) clients that declare it.

A tool that declares ``TaskHooks`` (fleet executions, bundles) answers such a client with a ``CreateTaskResult`` instead
of its receipt, once the whole pipeline has run and the work exists (knownness, read-only, scope, tier, schema,
approval, RBAC, the dispatch, the audit row: the call itself is unchanged). ``tasks/get`` reads the work's state
back through the tool's hooks with the caller's own permissions; ``tasks/cancel`` asks the app to cancel it (for
an execution: no further dispatch to agents that have not started; dispatched work runs on); ``tasks/update``
acknowledges (yuzu asks for no input once a task exists: an approval is settled before the work starts). A
bundle's task maps onto its steps' executions: working until every step has ended, tasks/cancel cancels each step
still running.

Task ids carry their own binding instead of a table: the work's id, the principal (token), the catalogue and the
tool, signed with the server's key (Django's ``signing``, HMAC-SHA256, salted for this use) and valid for TASK_TTL.
They are unguessable and unforgeable; an unknown, expired or forged id and another principal's read alike
(-32602), so nothing leaks existence. Without the extension in this request's capabilities: tasks/* → -32021.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.conf import settings
from django.core import signing

from yuzu.audit import audit
from yuzu.errors import YuzuError
from yuzu.jsondata import JsonObject

from . import jsonrpc as rpc
from .context import ToolContext
from .pipeline import a4, as_rpc_error, tool_result
from .registry import Tool, catalogue
from .task_ledger import ledger

EXTENSION = "io.modelcontextprotocol/tasks"
TASK_SALT = "yuzu.mcp.tasks"
TASK_TTL_MS = 24 * 3600 * 1000  # an execution stays readable far longer; a task id is a day's handle on it
POLL_INTERVAL_MS = 2000  # the poll floor of get_execution_status
UNKNOWN = "Unknown task"
TASK_CAP_RETRY_MS = 5000


def declared(capabilities: JsonObject) -> bool:
    extensions = capabilities.get("extensions")
    return isinstance(extensions, dict) and isinstance(extensions.get(EXTENSION), dict)


def required(ctx: ToolContext, method: str) -> rpc.RpcError:
    return rpc.RpcError(rpc.MISSING_CAPABILITY, f"{method} needs the {EXTENSION} extension",
                        a4(ctx.cid, remediation=f"declare clientCapabilities.extensions[{EXTENSION!r}] on the request",
                           requiredCapabilities={"extensions": {EXTENSION: {}}}), http_status=400)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def tasked(cat_name: str, tool_name: object) -> Tool | None:
    """The tool a tools/call names, when it may answer with a task."""
    tool = catalogue(cat_name).tools.get(tool_name) if isinstance(tool_name, str) else None
    return tool if tool is not None and tool.task is not None else None


def cap() -> int:
    return int(settings.YUZU_MCP_MAX_TASKS)


def _member(tool: str, work_id: str) -> str:
    return f"{tool}|{work_id}"


def admit(ctx: ToolContext, tool: Tool) -> None:
    """Before a call that may become a task runs: a slot under the token's cap on concurrent tasks, or the 429
    (-32010, with Retry-After) having created nothing. At the cap, the token's tasks are re-read first and the
    ended ones let go (a client that never polls its tasks to the end does not lock itself out)."""
    book = ledger()
    slot = book.reserve(ctx.principal.key, cap())
    if slot is None:
        _sweep(ctx)
        slot = book.reserve(ctx.principal.key, cap())
    if slot is None:
        audit(ctx.principal, f"mcp.{tool.name}", "denied", target_type="mcp_tool", target_id=tool.name,
              detail=f"task_cap limit={cap()}", correlation_id=ctx.cid)
        raise rpc.RpcError(rpc.SESSION_CAP, f"too many tasks in progress for this token (at most {cap()})",
                           a4(ctx.cid, TASK_CAP_RETRY_MS, "wait for a task to end (tasks/get, or notifications/tasks "
                                                          "on subscriptions/listen) or cancel one (tasks/cancel), "
                                                          "then retry", reason="task_cap", limit=cap()),
                           http_status=429, headers={"Retry-After": str(TASK_CAP_RETRY_MS // 1000)})
    ctx.extra["task_reservation"] = slot


def release(ctx: ToolContext, tool: str | None = None, work_id: str | None = None) -> None:
    """The call is over: its reservation becomes the task (``tool``/``work_id``) or is given back."""
    slot = ctx.extra.pop("task_reservation", None)
    if isinstance(slot, str):
        member = _member(tool, work_id) if tool and work_id else None
        ledger().settle(ctx.principal.key, slot, member, TASK_TTL_MS / 1000)


def _sweep(ctx: ToolContext) -> None:
    book = ledger()
    for member in book.live(ctx.principal.key):
        name, _, work_id = member.partition("|")
        tool = tasked(ctx.catalogue, name)
        try:
            ended = tool is None or tool.task is None or tool.task.state(ctx, work_id)[0] != "working"
        except YuzuError:
            ended = True  # gone, or no longer visible to this token
        if ended:
            book.forget(ctx.principal.key, member)


def as_task(ctx: ToolContext, tool_name: object, result: JsonObject) -> JsonObject:
    """A tools/call result for a client that declared tasks: a CreateTaskResult when the tool's work is still
    running, else the result itself (a finished or refused call is answered at once)."""
    tool = catalogue(ctx.catalogue).tools.get(tool_name) if isinstance(tool_name, str) else None
    structured = result.get("structuredContent")
    if tool is None or tool.task is None or result.get("isError") or not isinstance(structured, dict):
        return result
    work_id = structured.get(tool.task.id_field)
    if not isinstance(work_id, str) or structured.get("status") not in ("running", "pending", "dispatched"):
        return result
    created = _now()
    task_id = signing.dumps({"i": work_id, "p": ctx.principal.key, "c": ctx.catalogue, "t": tool.name,
                             "at": created}, salt=TASK_SALT, compress=False)
    ctx.note(f"task {tool.task.id_field}={work_id}")
    release(ctx, tool.name, work_id)
    return {"resultType": "task", "taskId": task_id, "status": "working", "statusMessage": _message(structured),
            "createdAt": created, "lastUpdatedAt": created, "ttlMs": TASK_TTL_MS, "pollIntervalMs": POLL_INTERVAL_MS}


def _message(view: JsonObject) -> str:
    if isinstance(view.get("expected"), int):  # a bundle: its steps
        return f"{view.get('received') or 0}/{view['expected']} steps finished"
    done, total = view.get("agents_responded"), view.get("agents_targeted", view.get("agents_reached"))
    return f"{done or 0}/{total} agents responded" if isinstance(total, int) else str(view.get("status", ""))


def _open(ctx: ToolContext, params: JsonObject) -> tuple[Tool, str, JsonObject]:
    """The tool and work a task id names, for this caller — or the one -32602 for every kind of wrong id."""
    try:
        payload = signing.loads(str(params.get("taskId", "")), salt=TASK_SALT, max_age=TASK_TTL_MS // 1000)
    except signing.BadSignature:  # SignatureExpired too
        payload = None
    tool = None
    if isinstance(payload, dict) and payload.get("p") == ctx.principal.key and payload.get("c") == ctx.catalogue:
        tool = catalogue(ctx.catalogue).tools.get(str(payload.get("t")))
    if tool is None or tool.task is None or not isinstance(payload, dict) or not isinstance(payload.get("i"), str):
        raise rpc.RpcError(rpc.INVALID_PARAMS, UNKNOWN, a4(ctx.cid, remediation="use a taskId this token was given "
                                                                               "by tools/call (they expire after a day)"))
    ctx.tool = tool.name
    return tool, payload["i"], payload


def get(ctx: ToolContext, params: JsonObject) -> JsonObject:
    tool, work_id, payload = _open(ctx, params)
    assert tool.task is not None
    try:
        state, view = tool.task.state(ctx, work_id)
    except YuzuError as exc:  # e.g. visibility lost since: the same answer as an unknown id
        raise rpc.RpcError(rpc.INVALID_PARAMS, UNKNOWN, a4(ctx.cid, remediation=exc.message)) from None
    task: JsonObject = {"resultType": "complete", "taskId": params["taskId"], "status": state,
                        "statusMessage": _message(view), "createdAt": payload.get("at"), "lastUpdatedAt": _now(),
                        "ttlMs": TASK_TTL_MS, "pollIntervalMs": POLL_INTERVAL_MS}
    if state == "completed":
        task["result"] = tool_result(view)
    if state != "working":
        ledger().forget(ctx.principal.key, _member(tool.name, work_id))
    return task


def cancel(ctx: ToolContext, params: JsonObject) -> JsonObject:
    """Cooperative: the app stops what has not started; the task may still end completed."""
    tool, work_id, _ = _open(ctx, params)
    assert tool.task is not None
    try:
        tool.task.cancel(ctx, work_id)
    except YuzuError as exc:
        raise as_rpc_error(exc.rpc_code, exc, ctx.cid) from None
    return {"resultType": "complete"}


def update(ctx: ToolContext, params: JsonObject) -> JsonObject:
    _open(ctx, params)
    return {"resultType": "complete"}  # nothing to answer: input is asked for before a task exists


# --- following tasks on subscriptions/listen ----------------------------------------------------------------

MAX_FOLLOWED = 64  # task ids one listen stream may follow


def followable(ctx: ToolContext, wanted: object) -> dict[str, list[str]]:
    """The ``taskIds`` of a listen request's filter that this caller may follow → each one's channel-layer groups.
    Anything else (not this token's, expired, forged, not a list) is left out of the acknowledgement, unanswered,
    like every other notification type yuzu does not honour."""
    out: dict[str, list[str]] = {}
    if not isinstance(wanted, list):
        return out
    for task_id in wanted[:MAX_FOLLOWED]:
        if not isinstance(task_id, str) or task_id in out:
            continue
        try:
            tool, work_id, _ = _open(ctx, {"taskId": task_id})
        except rpc.RpcError:
            continue
        if tool.task is not None and tool.task.groups is not None:
            out[task_id] = tool.task.groups(work_id)
    return out


def notification(ctx: ToolContext, task_id: str) -> JsonObject | None:
    """``notifications/tasks`` params for a followed task as it is now (the tasks/get shape), or None once the
    caller may no longer read it."""
    try:
        task = get(ctx, {"taskId": task_id})
    except rpc.RpcError:
        return None
    task.pop("resultType", None)
    return task
