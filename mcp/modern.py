"""MCP 2026-07-28 ("modern") beside the handshake era (2025-11-25, 2025-06-18) on the same endpoints.

One pipeline, two framings. A modern request carries no session: it names its protocol version, the client's
capabilities and (optionally) the client itself in ``params._meta``, and repeats the version, the method and the
name it acts on in headers. This module decides the era of each request (``era``), runs the modern validation
ladder (``ladder``), authenticates every request on its own, answers the JSON-RPC method through the same
handlers and the same tools/call pipeline as the handshake era (mcp.server, mcp.pipeline), and stamps the
modern result shape (``resultType``, the server's name in ``_meta``, cache hints) and error codes.

The routing rule (spec/mcp-2026.md §1.1), after the Host/Origin/Content-Type checks and before auth:

- GET or DELETE with ``MCP-Protocol-Version: 2026-07-28`` → 405 (``Allow: POST``); other GET/DELETE → legacy.
- POST with no version header, or a handshake version → legacy, unchanged — unless the body claims a modern
  version in ``params._meta`` (400, ``-32020``).
- POST with ``2026-07-28`` → modern.
- Any other value → 400, ``-32022`` with ``supported`` (the modern versions, as server/discover lists them: a
  handshake client is told by the 400 alone) and ``requested`` — except on a request of a live legacy session
  (it carries ``Mcp-Session-Id``), which keeps its handshake-era answer (``-32009``).

The modern ladder, first failure wins: ``params._meta`` shape (``-32602``), the headers against the body
(``-32020``: missing, different, malformed or repeated), the version (``-32022``). Then authentication, then the
method (unknown or removed in 2026-07-28 → HTTP 404, ``-32601``).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from django.conf import settings

from yuzu import rbac
from yuzu.errors import correlation_id
from yuzu.jsondata import JsonObject
from yuzu.metrics import MCP_REQUESTS

from . import jsonrpc as rpc
from . import mrtr, tasks
from .context import ToolContext
from .pipeline import a4
from .registry import Catalogue, catalogue
from .server import (
    METHODS,
    SERVER_VERSION,
    SUPPORTED_VERSIONS,
    Continuation,
    MethodResult,
    Reply,
    Request,
    _principal,
    _tools_call,
    error_reply,
    insufficient_scope,
    streaming_on,
)
from .streaming.admission import admit_modern_post, release_modern_post

MODERN_VERSION = "2026-07-28"
MODERN_VERSIONS = (MODERN_VERSION,)

META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT = "io.modelcontextprotocol/clientInfo"
META_SERVER = "io.modelcontextprotocol/serverInfo"
META_SUBSCRIPTION = "io.modelcontextprotocol/subscriptionId"

#: which body field a method's ``Mcp-Name`` header repeats
NAME_FIELDS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri",
               "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
ROUTING_HEADERS = ("mcp-protocol-version", "mcp-method", "mcp-name")
_B64 = re.compile(r"^=\?base64\?(?P<payload>.*)\?=$")

#: (ttlMs, cacheScope) of the cacheable results. tools/list is fitted to the token (private); the other lists
#: are the same for everyone (access is still checked on every call); resources are live data.
CACHE_HINTS: dict[str, tuple[int, str]] = {
    "server/discover": (3_600_000, "public"),
    "tools/list": (300_000, "private"),
    "prompts/list": (300_000, "public"),
    "resources/list": (0, "private"),
    "resources/templates/list": (0, "private"),
    "resources/read": (0, "private"),
}
#: HTTP status of a modern error by code (the reference SDKs' table); other codes keep their own
ERROR_STATUS = {rpc.PARSE_ERROR: 400, rpc.INVALID_REQUEST: 400, rpc.INVALID_PARAMS: 400, rpc.HEADER_MISMATCH: 400,
                rpc.MISSING_CAPABILITY: 400, rpc.UNSUPPORTED_VERSION: 400, rpc.METHOD_NOT_FOUND: 404}


@dataclass
class Listen:
    """subscriptions/listen passed its checks: the transport opens the listen stream."""

    principal: rbac.Principal
    request_id: rpc.RequestId
    cid: str
    tasks: dict[str, list[str]] = field(default_factory=dict)  # followed task id → its work's groups


# --- which era ------------------------------------------------------------------------------------------

def era(http_method: str, headers: Mapping[str, str], raw_headers: Iterable[tuple[bytes, bytes]],
        msg: JsonObject | None) -> str | Reply:
    """"modern", "legacy", or the Reply that refuses the request (405, or an RpcError raised: -32020/-32022)."""
    version = headers.get("mcp-protocol-version")
    version = version.strip() if version is not None else None
    if http_method != "POST":
        return Reply(405, None, {"Allow": "POST"}) if version in MODERN_VERSIONS else "legacy"
    if repeated(raw_headers, "mcp-protocol-version"):
        raise header_mismatch("MCP-Protocol-Version appears more than once", msg)
    if version is None or version in SUPPORTED_VERSIONS:
        claim = _meta(msg).get(META_VERSION) if msg is not None else None
        if claim is not None:
            raise header_mismatch(f"the body claims protocol version {str(claim)[:40]!r} but MCP-Protocol-Version is "
                                  f"{version or 'absent'}", msg)
        return "legacy"
    if version in MODERN_VERSIONS:
        return "modern"
    if "mcp-session-id" in headers and streaming_on():
        return "legacy"  # a handshake-era session's request: its -32009 answer is unchanged
    raise unsupported(version, msg)


def repeated(raw_headers: Iterable[tuple[bytes, bytes]], name: str) -> bool:
    return sum(1 for k, _ in raw_headers if k.decode("latin-1").lower() == name) > 1


def _meta(msg: JsonObject | None) -> JsonObject:
    params = (msg or {}).get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta if isinstance(meta, dict) else {}


def header_mismatch(message: str, msg: JsonObject | None) -> rpc.RpcError:
    return rpc.RpcError(rpc.HEADER_MISMATCH, f"Header mismatch: {message}",
                        a4(correlation_id(), remediation="send MCP-Protocol-Version, Mcp-Method and Mcp-Name exactly "
                                                         "as the body says them, once each"), http_status=400)


def unsupported(requested: object, msg: JsonObject | None) -> rpc.RpcError:
    text = str(requested)[:40]
    return rpc.RpcError(rpc.UNSUPPORTED_VERSION, f"Unsupported protocol version: {text}",
                        {"supported": list(MODERN_VERSIONS), "requested": text}, http_status=400)


# --- the modern ladder ------------------------------------------------------------------------------------

def decode_header(value: str | None) -> str | None:
    """A header value, trimmed, with the ``=?base64?…?=`` wrapping undone; None when absent or malformed."""
    if value is None:
        return None
    value = value.strip()
    m = _B64.fullmatch(value)
    if m is None:
        return value
    try:
        raw = base64.b64decode(m.group("payload"), validate=True)
        if base64.b64encode(raw).decode() != m.group("payload"):
            return None
        return raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def ladder(msg: JsonObject, headers: Mapping[str, str], raw_headers: Iterable[tuple[bytes, bytes]]) -> JsonObject:
    """A modern request's envelope checks, before auth; → its client capabilities, or RpcError."""
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or META_VERSION not in meta or META_CAPABILITIES not in meta:
        raise rpc.RpcError(rpc.INVALID_PARAMS, f"params._meta must carry {META_VERSION!r} and {META_CAPABILITIES!r}",
                           a4(correlation_id(), remediation="send both keys on every request (capabilities may be "
                                                            "{})"), http_status=400)
    assert isinstance(params, dict)
    raw = list(raw_headers)
    for name in ROUTING_HEADERS:
        if repeated(raw, name):
            raise header_mismatch(f"{name} appears more than once", msg)
    version = meta[META_VERSION]
    if decode_header(headers.get("mcp-protocol-version")) != version:
        raise header_mismatch("MCP-Protocol-Version differs from params._meta's protocol version", msg)
    method = msg["method"]
    if decode_header(headers.get("mcp-method")) != method:
        raise header_mismatch("Mcp-Method is missing or differs from the body's method", msg)
    field = NAME_FIELDS.get(method)
    if field is not None and params.get(field) is not None and decode_header(headers.get("mcp-name")) != params[field]:
        raise header_mismatch(f"Mcp-Name is missing or differs from params.{field}", msg)
    if not isinstance(version, str) or version not in MODERN_VERSIONS:
        raise unsupported(version, msg)
    capabilities = meta[META_CAPABILITIES]
    if not isinstance(capabilities, dict):
        raise rpc.RpcError(rpc.INVALID_PARAMS, f"{META_CAPABILITIES} must be an object",
                           a4(correlation_id(), remediation="send {} when the client declares no capability"),
                           http_status=400)
    return capabilities


# --- answering -------------------------------------------------------------------------------------------

def handle(req: Request) -> Reply | Continuation | Listen:
    """One modern request (past the ladder) → Reply | Continuation | Listen. Runs in a worker thread."""
    principal = _principal(req)
    if isinstance(principal, Reply):
        return principal
    msg = req.msg or {}
    method = msg["method"]
    req_id = msg.get("id")
    params = msg.get("params") or {}
    meta = params["_meta"]
    ctx = ToolContext(principal=principal, cid=correlation_id(), catalogue=req.catalogue, request_id=req_id)
    info = meta.get(META_CLIENT)
    ctx.extra["protocol_version"] = MODERN_VERSION
    ctx.extra["client"] = {"name": _label(info.get("name"), 64), "version": _label(info.get("version"), 32)} \
        if isinstance(info, dict) else {}
    ctx.extra["progress_mode"] = req.progress_mode
    capabilities = meta[META_CAPABILITIES]
    result: MethodResult
    try:
        handler = MODERN_METHODS.get(method)
        if handler is None:
            raise rpc.RpcError(rpc.METHOD_NOT_FOUND, f"Method not found: {method[:128]}",
                               a4(ctx.cid, remediation=f"in {MODERN_VERSION} this server answers "
                                                       f"{', '.join(MODERN_METHODS)}"))
        if method == "subscriptions/listen":
            MCP_REQUESTS.labels(method, "ok").inc()
            wanted = params.get("notifications")
            followed = tasks.followable(ctx, wanted.get("taskIds")) \
                if isinstance(wanted, dict) and tasks.declared(capabilities) else {}
            return Listen(principal, req_id, ctx.cid, followed)
        task_tool = tasks.tasked(req.catalogue, params.get("name")) if tasks.declared(capabilities) else None
        if method == "tools/call" and task_tool is not None:
            tasks.admit(ctx, task_tool)  # the token's cap on concurrent tasks, before the work exists
            try:
                result = mrtr.call_tool(ctx, req, params, capabilities, _call)
                if isinstance(result, dict) and "resultType" not in result:
                    result = tasks.as_task(ctx, params.get("name"), result)
            finally:
                tasks.release(ctx)  # not a task after all (refused, finished at once, input_required)
        elif method == "tools/call":
            result = mrtr.call_tool(ctx, req, params, capabilities, _call)
        elif method.startswith("tasks/"):
            if not tasks.declared(capabilities):
                raise tasks.required(ctx, method)
            result = handler(ctx, req, params)
        else:
            result = handler(ctx, req, params)
    except rpc.RpcError as err:
        MCP_REQUESTS.labels(method if method in MODERN_METHODS else "unknown", "error").inc()
        return error_reply(req_id, modern_error(insufficient_scope(principal, req, err)))
    if isinstance(result, Continuation):
        result.req_id = req_id
        return result
    if isinstance(result, Reply):  # no modern method answers a whole reply (initialize does, and is not one)
        return result
    MCP_REQUESTS.labels(method, "ok").inc()
    return Reply(200, rpc.result_response(req_id, stamp(method, result, catalogue(req.catalogue))), ctx=ctx)


def _call(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject | Continuation:
    """tools/call through the one pipeline; a call that will stream its progress is admitted first (a slot for
    its response, before the tool creates anything)."""
    if req.progress_mode != "modern":
        return _tools_call(ctx, req, params)
    admit_modern_post(ctx)
    try:
        return _tools_call(ctx, req, params)
    except BaseException:
        release_modern_post(ctx)
        raise


def _label(value: object, limit: int) -> str | None:
    return "".join(c for c in value if c.isprintable())[:limit] if isinstance(value, str) else None


def modern_error(err: rpc.RpcError) -> rpc.RpcError:
    """A handshake-era error as a modern one: resource not found is -32602 (with data.uri), and the envelope,
    parameter and method errors get the 2026 HTTP statuses."""
    if err.code == rpc.RESOURCE_NOT_FOUND:
        err.code = rpc.INVALID_PARAMS
    status = ERROR_STATUS.get(err.code)
    if status is not None and err.http_status == 200:
        err.http_status = status
    return err


def stamp(method: str, result: JsonObject, cat: Catalogue) -> JsonObject:
    """The modern result shape: ``resultType``, the server in ``_meta``, cache hints on the cacheable ones."""
    out = dict(result)
    out.setdefault("resultType", "complete")
    meta = out.get("_meta")
    out["_meta"] = {**(meta if isinstance(meta, dict) else {}),
                    META_SERVER: {"name": cat.server_name, "version": SERVER_VERSION}}
    if out["resultType"] == "complete" and method in CACHE_HINTS:
        out["ttlMs"], out["cacheScope"] = CACHE_HINTS[method]
    return out


def _discover(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject:
    cat = catalogue(req.catalogue)
    return {
        "supportedVersions": list(MODERN_VERSIONS),
        "capabilities": {
            "tools": {"listChanged": True},  # on subscriptions/listen, when a role change alters your list
            "resources": {"listChanged": False},
            "prompts": {"listChanged": False},
            "completions": {},
            "extensions": {tasks.EXTENSION: {}},  # fleet executions, for clients that declare it too
        },
        "instructions": cat.instructions,
    }


def _not_here(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject:
    raise AssertionError("answered by the transport")  # subscriptions/listen: see handle


#: the methods of a modern request: the handshake era's, less initialize, ping and logging/setLevel; the Tasks
#: extension's for clients that declare it
MODERN_METHODS = {
    "server/discover": _discover,
    "subscriptions/listen": _not_here,
    "tasks/get": lambda ctx, req, params: tasks.get(ctx, params),
    "tasks/update": lambda ctx, req, params: tasks.update(ctx, params),
    "tasks/cancel": lambda ctx, req, params: tasks.cancel(ctx, params),
    **{name: fn for name, fn in METHODS.items() if name not in ("initialize", "ping", "logging/setLevel")},
}


def streamed(headers: Mapping[str, str], msg: JsonObject, cat_name: str) -> bool:
    """Whether a modern tools/call streams its response: a progress tool, a progressToken, an SSE Accept, and
    streaming on."""
    if msg.get("method") != "tools/call" or not streaming_on() or not settings.YUZU_MCP_STREAMED_POST:
        return False
    params = msg.get("params")
    if not isinstance(params, dict):
        return False
    name = params.get("name")
    tool = catalogue(cat_name).tools.get(name) if isinstance(name, str) else None
    meta = params.get("_meta")
    capabilities = meta.get(META_CAPABILITIES) if isinstance(meta, dict) else None
    if isinstance(capabilities, dict) and tasks.declared(capabilities):
        return False  # answered with a task, which carries no progress
    return tool is not None and tool.progress and isinstance(meta, dict) and "progressToken" in meta \
        and "text/event-stream" in headers.get("accept", "")
