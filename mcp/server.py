"""MCP request handling independent of the HTTP plumbing: authentication, sessions and the
JSON-RPC methods. ``handle`` runs in one worker-thread hop; an async tool returns a continuation
that the transport awaits on the event loop."""

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings

from yuzu import rbac
from yuzu.audit import audit
from yuzu.auth import AuthError, authenticate, bearer_challenge, last_principal_key, step_up_scope
from yuzu.errors import YuzuError, correlation_id
from yuzu.jsondata import JsonObject
from yuzu.metrics import MCP_INITIALIZE_PROTOCOL, MCP_REQUESTS, MCP_SESSIONS_OPENED, mcp_method_label
from yuzu.policy import tier_allows
from yuzu.provisional import StaleGrant, defer, provisionally

from . import jsonrpc as rpc
from . import listing
from .context import ToolContext
from .pipeline import a4, as_rpc_error, pre_checks, run_sync
from .prompts import complete, render_prompt
from .registry import Tool, catalogue
from .streaming.admission import admit_streamed_post, release_streamed_post
from .streaming.follower import cancel
from .streaming.ring import ring_key
from .streaming.sessions import PendingValidation, Session, SessionCapReached, store
from .streaming.wake import close_session_streams

SUPPORTED_VERSIONS = ("2025-11-25", "2025-06-18")
LATEST_VERSION = SUPPORTED_VERSIONS[0]
PAGE_SIZE = 20
TOOLS_PAGE_SIZE = 200  # one page for catalogues up to 200 tools: clients that read only page 1 see them all
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
SERVER_VERSION = "0.1.0"
MISSING_SESSION = "send the Mcp-Session-Id header that initialize returned, or send initialize first"


@dataclass
class Reply:
    status: int = 200
    body: JsonObject | None = None
    headers: dict[str, str] = field(default_factory=dict)
    ctx: ToolContext | None = None  # the tool call's context, when progress may follow


@dataclass
class Continuation:
    """An async tool passed its checks; the transport awaits the handler, then ``finish``."""

    ctx: ToolContext
    tool: Tool
    args: JsonObject
    req_id: rpc.RequestId


#: what a JSON-RPC method answers: its result, a whole reply (initialize: with headers), or an async tool's
#: continuation
MethodResult = JsonObject | Reply | Continuation


@dataclass
class Request:
    http_method: str
    headers: dict[str, str]  # lower-case names
    cookies: dict[str, str]
    catalogue: str
    msg: JsonObject | None = None
    progress_mode: str | None = None  # "post" (SSE on this response) | "get" (progress on the GET channel)


@dataclass
class Attach:
    """A GET that passed auth and the session check: the transport opens the stream."""

    principal: rbac.Principal
    session: Session


def _session_refusal(principal: rbac.Principal, sid: str, req_id: rpc.RequestId) -> Reply:
    if not sid:
        session_reject(principal, "missing_session_header")
        return error_reply(req_id, rpc.RpcError(rpc.INVALID_REQUEST, "Bad Request: Missing session ID",
                                                a4(correlation_id(), remediation=MISSING_SESSION), http_status=400))
    session_reject(principal, "unknown_session", sid)
    return error_reply(req_id, rpc.RpcError(rpc.UNKNOWN_SESSION, "Session not found; re-initialize",
                                            a4(correlation_id(), remediation="send initialize without a session id"),
                                            http_status=404))


def streaming_on() -> bool:
    return not settings.YUZU_MCP_NO_STREAMING


def unauthorized(exc: AuthError, req: Request | None = None) -> Reply:
    """HTTP 401, JSON-RPC -32001 (docs/mcp.md): what was wrong with the credential, and how to get one; the
    WWW-Authenticate challenge names the endpoint's protected resource metadata, where an OAuth client finds the
    authorization server (docs/oauth.md)."""
    headers = req.headers if req is not None else {}
    presented = bool(headers.get("authorization") or headers.get("x-yuzu-token"))
    challenge = bearer_challenge(headers, catalogue(req.catalogue).audiences if req is not None else (),
                                 error="invalid_token" if presented else None)
    err = rpc.RpcError(rpc.UNAUTHORIZED, f"Unauthorized: {exc}", a4(correlation_id(), remediation=exc.remediation),
                       http_status=401, headers={"WWW-Authenticate": challenge})
    return error_reply(None, err)


def insufficient_scope(principal: rbac.Principal, req: Request, err: rpc.RpcError) -> rpc.RpcError:
    """A call the tier refuses (-32004), made with an OAuth token whose holder may get the tier it needs: HTTP 403
    with the step-up challenge (error="insufficient_scope", the scope to ask for), so the client re-authorizes.
    Every other error, and every pasted token, is answered as before."""
    data = err.data if isinstance(err.data, dict) else {}
    scope = step_up_scope(principal, data.get("required_tier")) if err.code == rpc.TIER_DENIED else None
    if scope:
        err.http_status = 403
        err.headers = {**err.headers, "WWW-Authenticate": bearer_challenge(
            req.headers, catalogue(req.catalogue).audiences, error="insufficient_scope", scope=scope)}
    return err


def error_reply(req_id: rpc.RequestId, err: rpc.RpcError) -> Reply:
    return Reply(err.http_status, rpc.error_response(req_id, err), dict(err.headers))


def cut_off(cont: Continuation, reason: str, req: Request) -> Reply:
    """The answer to an async tool's call (``cont``) cancelled while it waited because what admitted it was refused
    meanwhile (mcp.streaming.watch ``reason``): -32001 for the credential (401, with the challenge), -32007 for the
    session (404). Audited as ``cancelled``; what the tool waited for is not handed over."""
    ctx = cont.ctx
    audit(ctx.principal, f"mcp.{cont.tool.name}", "cancelled", target_type="mcp_tool", target_id=cont.tool.name,
          detail=" ".join([reason] + ctx.detail), correlation_id=ctx.cid)
    if reason.startswith("session_"):
        return error_reply(cont.req_id, rpc.RpcError(rpc.UNKNOWN_SESSION, "Session ended while the call waited",
                                                     a4(ctx.cid, remediation="re-initialize, then call again"),
                                                     http_status=404))
    reply = unauthorized(AuthError(f"the credential was refused while the call waited ({reason})"), req)
    assert reply.body is not None
    reply.body["id"] = cont.req_id
    return reply


def _principal(req: Request) -> rbac.Principal | Reply:
    """The caller, or the 401 that answers it."""
    cat = catalogue(req.catalogue)
    try:
        principal = authenticate(req.headers, req.cookies, audiences=cat.audiences)
    except AuthError as exc:
        return unauthorized(exc, req)
    if principal is None:
        return unauthorized(AuthError("no credentials"), req)
    return principal


def session_reject(principal: rbac.Principal, reason: str, sid: str = "") -> None:
    audit(principal, "mcp.session.reject", "denied", target_type="McpSession", target_id=sid[:8], detail=f"reason={reason}")


def handle(req: Request) -> Reply | Continuation | Attach:
    """One HTTP request → Reply | Continuation | Attach. Runs in a worker thread."""
    sid = req.headers.get("mcp-session-id", "")
    early = _early_session_check(req, sid)
    try:
        if _pure_call(req):
            try:
                with provisionally() as prov:
                    reply = _handle(req, sid, early)
                    prov.confirm()
                    return reply
            except StaleGrant:  # nothing of the attempt left: run it again, checking everything first
                pass
            return _handle(req, sid, None)
        return _handle(req, sid, early)
    finally:
        if early is not None:
            early.close()


def _pure_call(req: Request) -> bool:
    """A tools/call of a pure tool (one that only reads the database), without progress: it may run as the cached
    principal, confirmed by its audit row (yuzu.provisional)."""
    msg = req.msg or {}
    params = msg.get("params")
    if req.http_method != "POST" or msg.get("method") != "tools/call" or not isinstance(params, dict):
        return False
    name, meta, args = params.get("name"), params.get("_meta"), params.get("arguments")
    tool = catalogue(req.catalogue).tools.get(name) if isinstance(name, str) else None
    return (tool is not None and tool.pure and not (isinstance(meta, dict) and "progressToken" in meta)
            and not (isinstance(args, dict) and "approval_id" in args))


def _early_session_check(req: Request, sid: str) -> PendingValidation | None:
    """A request that must name a live session has it checked while it is authenticated: begun before, for the
    principal its token authenticated as the last time this process saw it, so that the session store (Redis)
    answers while the database does — one round trip less on every call. Used only when authentication names
    that principal again; otherwise ``_session`` checks anew, for the one it names."""
    if not sid or not _session_bound(req):
        return None
    key = last_principal_key(req.headers)
    return store().begin_validate(sid, key) if key is not None else None


def _session_bound(req: Request) -> bool:
    """Whether the request must name a live session: a GET stream; with streaming on, every POST but initialize."""
    return req.http_method == "GET" or (
        req.http_method == "POST" and streaming_on() and (req.msg or {}).get("method") != "initialize")


def _session(principal: rbac.Principal, sid: str, early: PendingValidation | None, cat: str) -> Session | None:
    """The caller's live session ``sid`` opened on this endpoint (catalogue ``cat``), or None: on another endpoint
    it is as unknown as any other id. A provisional call (yuzu.provisional) takes the one this process last saw,
    its liveness answered by the early check at the confirmation (the Redis reply is read just before the audit row
    is written): what a session was opened with never changes."""
    if early is not None and early.principal == principal.key:
        seen = _seen.get(sid)
        if (seen is not None and seen.principal == principal.key and seen.catalogue == cat
                and defer(lambda: early.result() is not None)):
            return seen
        session = early.result()
    else:
        session = store().validate(sid, principal.key)
    if session is not None and session.catalogue != cat:
        return None
    if session is not None:
        if len(_seen) >= SEEN_SESSIONS:
            _seen.clear()
        _seen[sid] = session
    return session


#: session id → the session as this process last validated it, for provisional calls
_seen: dict[str, Session] = {}
SEEN_SESSIONS = 10_000


def _handle(req: Request, sid: str, early: PendingValidation | None) -> Reply | Continuation | Attach:
    principal = _principal(req)
    if isinstance(principal, Reply):
        return principal
    if req.http_method == "DELETE":
        return _delete(principal, sid, req.catalogue)
    if req.http_method == "GET":
        session = _session(principal, sid, early, req.catalogue) if sid else None
        return Attach(principal, session) if session else _session_refusal(principal, sid, None)
    msg = req.msg or {}  # a POST's (the transport parsed it)
    method = msg.get("method")
    req_id = msg.get("id")
    is_notification = method is not None and "id" not in msg
    session = None
    if _session_bound(req):
        session = _session(principal, sid, early, req.catalogue) if sid else None
        if session is None:
            return _session_refusal(principal, sid, req_id)
    if method is None or is_notification:
        if method == "notifications/cancelled" and session is not None:
            # Detach the named request's stream (in whichever process holds it); never cancel its work.
            cancel(ring_key(principal.key, session.id), (msg.get("params") or {}).get("requestId"))
        MCP_REQUESTS.labels(mcp_method_label(method), "accepted").inc()
        return Reply(202)
    ctx = ToolContext(principal=principal, cid=correlation_id(), catalogue=req.catalogue,
                      session_id=session.id if session else None, request_id=req_id)
    ctx.extra["protocol_version"] = session.protocol_version if session else LATEST_VERSION
    ctx.extra["client"] = session.client if session else {}
    ctx.extra["progress_mode"] = req.progress_mode
    try:
        result = _dispatch(ctx, req, method, msg.get("params") or {})
    except rpc.RpcError as err:
        MCP_REQUESTS.labels(mcp_method_label(method, METHODS), "error").inc()
        return error_reply(req_id, insufficient_scope(principal, req, err))
    if isinstance(result, Continuation):
        result.req_id = req_id
        return result
    if isinstance(result, Reply):
        return result
    MCP_REQUESTS.labels(method, "ok").inc()
    return Reply(200, rpc.result_response(req_id, result), ctx=ctx)


def _delete(principal: rbac.Principal, sid: str, cat: str) -> Reply:
    if not sid:
        return error_reply(None, rpc.RpcError(rpc.INVALID_REQUEST, "Bad Request: Missing session ID",
                                              a4(correlation_id(), remediation=MISSING_SESSION), http_status=400))
    if _session(principal, sid, None, cat) is None or not store().delete(sid, principal.key, by_client=True):
        session_reject(principal, "unknown_session", sid)
        return error_reply(None, rpc.RpcError(rpc.UNKNOWN_SESSION, "Session not found",
                                              a4(correlation_id(), remediation="nothing to end"), http_status=404))
    audit(principal, "mcp.session.close", "success", target_type="McpSession", target_id=sid[:8])
    close_session_streams(principal.key, sid)
    return Reply(200)


Method = Callable[[ToolContext, Request, JsonObject], MethodResult]


def _dispatch(ctx: ToolContext, req: Request, method: str, params: JsonObject) -> MethodResult:
    handler = METHODS.get(method)
    if handler is None:
        raise rpc.RpcError(rpc.METHOD_NOT_FOUND, f"Method not found: {method[:128]}",
                           a4(ctx.cid, remediation=f"this server answers {', '.join(METHODS)}"))
    return handler(ctx, req, params)


def _initialize(ctx: ToolContext, req: Request, params: JsonObject) -> Reply:
    requested = params.get("protocolVersion")
    version = requested if requested in SUPPORTED_VERSIONS else LATEST_VERSION
    MCP_INITIALIZE_PROTOCOL.labels(version).inc()
    cat = catalogue(req.catalogue)
    result = {
        "protocolVersion": version,
        "capabilities": {
            "tools": {"listChanged": True},  # a role change that alters the caller's list (mcp.listing)
            "resources": {"subscribe": False, "listChanged": False},
            "prompts": {"listChanged": False},
            "logging": {},
            "completions": {},
        },
        "serverInfo": {"name": cat.server_name, "title": "yuzu", "version": SERVER_VERSION},
        "instructions": cat.instructions,
    }
    headers: dict[str, str] = {}
    if streaming_on():
        info = params.get("clientInfo")
        if not isinstance(info, dict):
            info = {}
        try:
            session = store().create(ctx.principal.key, req.catalogue, version, _label(info.get("name"), 64),
                                     _label(info.get("version"), 32))
        except SessionCapReached as exc:
            session_reject(ctx.principal, exc.reason)
            raise rpc.RpcError(rpc.SESSION_CAP, "too many MCP sessions; end one (DELETE) or wait for idle expiry",
                               a4(ctx.cid, remediation="close unused sessions"), http_status=429) from None
        MCP_SESSIONS_OPENED.inc()
        audit(ctx.principal, "mcp.session.open", "success", target_type="McpSession", target_id=session.id[:8],
              detail=f"protocol={version}")
        headers["Mcp-Session-Id"] = session.id
    return Reply(200, rpc.result_response(ctx.request_id, result), headers)


def _label(value: object, limit: int) -> str:
    """A client-supplied name for display: printable, bounded, or empty."""
    return "".join(c for c in value if c.isprintable())[:limit] if isinstance(value, str) else ""


def _ping(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject:
    return {}


def _page(items: list[JsonObject], params: JsonObject, key: str, size: int = PAGE_SIZE) -> JsonObject:
    cursor = params.get("cursor")
    start = 0
    if cursor is not None:
        try:
            start = int(base64.urlsafe_b64decode(str(cursor).encode()).decode().removeprefix("o:"))
            if start < 0 or start > len(items):
                raise ValueError
        except (ValueError, UnicodeDecodeError):
            raise rpc.RpcError(rpc.INVALID_PARAMS, "Invalid cursor", a4(
                correlation_id(), remediation="pass nextCursor exactly as the previous page returned it, or omit "
                                              "cursor for the first page")) from None
    page: JsonObject = {key: items[start:start + size]}
    if start + size < len(items):
        page["nextCursor"] = base64.urlsafe_b64encode(f"o:{start + size}".encode()).decode()
    return page


def _tools_list(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject:
    """The tools this caller may call (mcp.listing), in one page up to TOOLS_PAGE_SIZE; ``_meta["yuzu/all"]:
    true`` lists the whole catalogue, each tool the caller may not call marked so."""
    cat = catalogue(req.catalogue)
    meta = params.get("_meta")
    everything = isinstance(meta, dict) and meta.get(listing.ALL_TOOLS) is True
    items = listing.tools_for(ctx.principal, cat, everything=everything)
    page = _page(items, params, "tools", TOOLS_PAGE_SIZE)
    if ctx.session_id and not everything:
        listing.note_listed(ctx.principal, ctx.session_id, cat.name, items)
    return page


def _tools_call(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject | Continuation:
    name = params.get("name")
    arguments = params.get("arguments")
    meta = params.get("_meta") or {}
    if isinstance(meta, dict):
        token = meta.get("progressToken")
        if (isinstance(token, str) and len(token.encode()) <= 512) or (isinstance(token, int) and not isinstance(token, bool)):
            ctx.progress_token = token
    tool = catalogue(req.catalogue).tools.get(name) if isinstance(name, str) else None
    if tool is not None and tool.is_async:
        t, args = pre_checks(ctx, name, arguments)
        return Continuation(ctx, t, args, None)
    if req.progress_mode != "post" or ctx.progress_token is None:
        return run_sync(ctx, name, arguments)
    admit_streamed_post(ctx)  # every refusal happens before the tool creates anything
    try:
        return run_sync(ctx, name, arguments)
    except BaseException:  # refused (tier, schema, approval, RBAC …): the call will not stream, give its slot back
        release_streamed_post(ctx, ctx.extra.pop("admitted"))
        raise


def _resources_list(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject:
    cat = catalogue(req.catalogue)
    shown = [r for r in sorted(cat.resources.values(), key=lambda r: r.uri)
             if not (ctx.principal.scope_service and r.service_scope == "denied")]  # as tools/list fits the token
    return _page([r.listing() for r in shown], params, "resources")


def _templates_list(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject:
    return _page([], params, "resourceTemplates")


def _resources_read(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject:
    uri = params.get("uri")
    res = catalogue(req.catalogue).resources.get(uri) if isinstance(uri, str) else None
    if res is None:
        raise rpc.RpcError(rpc.RESOURCE_NOT_FOUND, "Resource not found",
                           a4(ctx.cid, remediation="resources/list lists the served URIs",
                              uri=uri if isinstance(uri, str) else None))
    if ctx.principal.scope_service and res.service_scope == "denied":  # fleet data: a tool of that class is refused
        raise as_rpc_error(rpc.PERMISSION_DENIED, YuzuError(
            f"service-scoped tokens may not read this resource (this token is scoped to service "
            f"'{ctx.principal.scope_service}')", extra={"scope_service": ctx.principal.scope_service},
            remediation="use a token without a service scope: " + rbac.mint_token_hint(
                ctx.principal, ctx.principal.tier or "readonly") + " (no --service)"), ctx.cid)
    if not tier_allows(ctx.principal.tier, res.securable, res.operation):
        raise as_rpc_error(rpc.TIER_DENIED, rbac.tier_denial(ctx.principal, res.securable, res.operation), ctx.cid)
    if not rbac.has_any(ctx.principal, res.securable, res.operation):
        raise as_rpc_error(rpc.PERMISSION_DENIED, rbac.denial(ctx.principal, res.securable, res.operation), ctx.cid)
    content = res.reader(ctx)
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)
    return {"contents": [{"uri": uri, "mimeType": res.mime_type, "text": text}]}


def _prompts_list(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject:
    cat = catalogue(req.catalogue)
    return _page([p.listing() for p in sorted(cat.prompts.values(), key=lambda p: p.name)], params, "prompts")


def _prompts_get(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject:
    return render_prompt(catalogue(req.catalogue), params)


def _set_level(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject:
    level = params.get("level")
    if level not in LOG_LEVELS:
        raise rpc.RpcError(rpc.INVALID_PARAMS, f"level must be one of {', '.join(LOG_LEVELS)}",
                           a4(ctx.cid, remediation="send one of the listed levels"))
    return {}


def _complete(ctx: ToolContext, req: Request, params: JsonObject) -> JsonObject:
    return complete(catalogue(req.catalogue), params)


METHODS: dict[str, Method] = {
    "initialize": _initialize,
    "ping": _ping,
    "tools/list": _tools_list,
    "tools/call": _tools_call,
    "resources/list": _resources_list,
    "resources/templates/list": _templates_list,
    "resources/read": _resources_read,
    "prompts/list": _prompts_list,
    "prompts/get": _prompts_get,
    "logging/setLevel": _set_level,
    "completion/complete": _complete,
}
