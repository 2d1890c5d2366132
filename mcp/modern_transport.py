"""A modern (2026-07-28) request from the transport's side: the ladder, the one worker-thread hop, and the
outcome written as HTTP — a JSON reply, an async tool awaited on the event loop, a streamed tools/call, or a
subscriptions/listen stream (mcp.streaming.modern). mcp.transport calls ``serve`` once ``mcp.modern.era`` said
"modern"."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Mapping
from functools import partial
from typing import cast

from django.conf import settings
from django.http import parse_cookie

from yuzu.audit import audit
from yuzu.auth import AuthError, last_principal_key, token_from_headers
from yuzu.errors import YuzuError, correlation_id
from yuzu.jsondata import JsonObject
from yuzu.metrics import MCP_REQUESTS, mcp_method_label
from yuzu.rbac import Principal

from . import jsonrpc as rpc
from .modern import Listen, handle, ladder, modern_error, stamp, streamed
from .pipeline import a4, finish, hop, internal_error
from .registry import AsyncHandler, ToolFailure, catalogue
from .server import Continuation, Reply, Request, cut_off, error_reply, streaming_on
from .streaming.admission import Budget, reject, release_modern_post
from .streaming.modern import listen, respond_streamed
from .streaming.stream import Connection
from .streaming.watch import refused

#: modern requests in flight per token, in this process: no session caps them, so this does (429 -32010). A
#: streamed call or a listen stream counts here only until its stream takes over (the stream budgets count it then);
#: an async tool (the bridge's blocking waits) counts for as long as it blocks.
inflight = Budget()
#: the same per user (every token of theirs: ``INFLIGHT_USER_FACTOR`` tokens' worth), once this process has seen the
#: token authenticate (yuzu.auth.last_principal_key: known before authenticating, without a database read)
inflight_users = Budget()
INFLIGHT_USER_FACTOR = 4
INFLIGHT_GLOBAL = 1 << 30  # no process-wide cap of its own: the ASGI server's limits apply
INFLIGHT_RETRY_MS = 1000
handle_in_thread = hop(handle)  # built once: asgiref inspects the function on every wrapper it builds


def credential_key(headers: Mapping[str, str]) -> str | None:
    """Which credential a request presents (a digest of it), before authenticating it: the token as
    authentication reads it — from either header, whatever the scheme's case and the blanks around it, and
    nothing else beside it — else the admin session cookie. None without credentials, or with an Authorization
    header authentication refuses as malformed (that request is answered 401 at once, and counted nowhere)."""
    try:
        raw = token_from_headers(headers)
    except AuthError:
        return None
    cookie = parse_cookie(headers.get("cookie", "")).get(settings.SESSION_COOKIE_NAME, "")
    credential = f"token\0{raw}" if raw else f"session\0{cookie}" if cookie else None
    return hashlib.sha256(credential.encode()).hexdigest()[:32] if credential is not None else None


def _too_many(msg: JsonObject, per_user: bool = False) -> Reply:
    reject("modern_inflight_user_cap" if per_user else "modern_inflight_cap")
    limit = settings.YUZU_MCP_MODERN_INFLIGHT * (INFLIGHT_USER_FACTOR if per_user else 1)
    whose = "your tokens together" if per_user else "this token"
    return error_reply(msg.get("id"), rpc.RpcError(
        rpc.SESSION_CAP, f"too many requests in flight for {whose} (at most {limit} at once)",
        a4(correlation_id(), INFLIGHT_RETRY_MS, "wait for an answer before sending more, then retry",
           reason="inflight_user_cap" if per_user else "inflight_cap", limit=limit),
        http_status=429, headers={"Retry-After": str(max(1, INFLIGHT_RETRY_MS // 1000))}))


async def serve(conn: Connection, msg: JsonObject, cat_name: str, raw_headers: Iterable[tuple[bytes, bytes]]) -> Reply | None:
    """Answer one modern POST on ``conn`` (None: a stream is answering)."""
    if "method" not in msg or "id" not in msg:
        # Notifications (notifications/cancelled included: on HTTP the client cancels by closing the response,
        # and a caller-chosen id could name another client's request) and posted responses: nothing to do.
        MCP_REQUESTS.labels(mcp_method_label(msg.get("method")), "accepted").inc()
        return Reply(202)
    try:
        ladder(msg, conn.headers, raw_headers)
    except rpc.RpcError as err:
        return error_reply(msg.get("id"), err)
    key = credential_key(conn.headers)
    if key is not None and inflight.acquire(key, settings.YUZU_MCP_MODERN_INFLIGHT, INFLIGHT_GLOBAL) is not None:
        return _too_many(msg)
    seen = last_principal_key(conn.headers) if key is not None else None
    user = Principal.user_key_of(seen) if seen is not None else None
    if key is not None and user is not None and inflight_users.acquire(
            user, settings.YUZU_MCP_MODERN_INFLIGHT * INFLIGHT_USER_FACTOR, INFLIGHT_GLOBAL) is not None:
        inflight.release(key)
        return _too_many(msg, per_user=True)
    try:
        return await _serve(conn, msg, cat_name)
    finally:
        if key is not None:
            inflight.release(key)
        if user is not None:
            inflight_users.release(user)


async def _serve(conn: Connection, msg: JsonObject, cat_name: str) -> Reply | None:
    mode = "modern" if streamed(conn.headers, msg, cat_name) else None
    req = Request(http_method="POST", headers=conn.headers, cookies=parse_cookie(conn.headers.get("cookie", "")),
                  catalogue=cat_name, msg=msg, progress_mode=mode)
    outcome = await handle_in_thread(req)
    if isinstance(outcome, Listen):
        meta = {"io.modelcontextprotocol/subscriptionId": outcome.request_id}
        wanted = (msg.get("params") or {}).get("notifications")
        try:
            await listen(conn, outcome.principal, outcome.request_id, meta, streaming_on(),
                         wanted if isinstance(wanted, dict) else {}, cat_name, outcome.tasks)
        except rpc.RpcError as err:
            return error_reply(outcome.request_id, err)
        return None
    cat = catalogue(cat_name)
    if isinstance(outcome, Continuation):
        return await _run_async_tool(conn, outcome, cat_name)
    ctx = outcome.ctx
    if ctx is not None and "admitted" in ctx.extra:
        return await respond_streamed(conn, outcome, ctx, partial(stamp, "tools/call", cat=cat))
    return outcome


async def _run_async_tool(conn: Connection, cont: Continuation, cat_name: str) -> Reply | None:
    """An async tool (the bridge's blocking ones) awaited here, then its audit row in a second hop. The client
    closing the response cancels the request (2026-07-28): the handler is cancelled — a bridge wait gives its
    turn back, so the outcome lands in bridge_poll and a re-send with the turnId finds it — and the drop is
    audited; nothing is written to the closed connection (None)."""
    release_modern_post(cont.ctx)  # an async tool answers once, without progress
    work = asyncio.ensure_future(cast(AsyncHandler, cont.tool.handler)(cont.ctx, cont.args))
    gone = asyncio.ensure_future(conn.until_disconnect())
    cut = asyncio.ensure_future(refused(cont.ctx.principal, ""))  # a token revoked meanwhile ends the wait
    try:
        await asyncio.wait({work, gone, cut}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        cut.cancel()
    if not work.done() and cut.done() and not cut.cancelled():
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        req = Request(http_method="POST", headers=conn.headers, cookies={}, catalogue=cat_name)
        return await hop(cut_off)(cont, cut.result(), req)
    if not work.done():
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        await hop(audit)(cont.ctx.principal, f"mcp.{cont.tool.name}", "cancelled", target_type="mcp_tool",
                         target_id=cont.tool.name, detail=" ".join(["client_disconnect"] + cont.ctx.detail),
                         correlation_id=cont.ctx.cid)
        return None
    result: JsonObject | ToolFailure | YuzuError
    try:
        result = work.result()
    except (ToolFailure, YuzuError) as exc:
        result = exc
    except Exception:
        result = internal_error(cont.ctx)
    try:
        final = await hop(finish)(cont.ctx, cont.tool, result)
    except rpc.RpcError as err:
        return error_reply(cont.req_id, modern_error(err))
    return Reply(200, rpc.result_response(cont.req_id, stamp("tools/call", final, catalogue(cat_name))))
