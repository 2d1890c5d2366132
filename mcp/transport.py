"""Streamable HTTP transport: HTTP in, JSON-RPC messages out.

A Channels HTTP consumer serves /mcp/v1 and /mcp/v1/ (and the bridge catalogue's /mcp/bridge/). A request
arrives with its body already bounded (yuzu.bodylimit); then, before any work:

1. the kill switch and the method (405; GET and DELETE only when streaming is on);
2. transport security — Host, Origin, Content-Type and -Encoding (mcp.security);
3. one JSON-RPC message parsed from the body (400 for framing), and the protocol version header.

The request then goes to ``mcp.server.handle`` in one worker-thread hop, which authenticates it and answers
the JSON-RPC method. Its outcome is written back as HTTP: a JSON reply; an async tool awaited here on the
event loop; or a held-open SSE response from mcp.streaming — the session's GET channel, or a streamed POST.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from asgiref.typing import (
    ASGIReceiveCallable,
    ASGISendCallable,
    HTTPDisconnectEvent,
    HTTPRequestEvent,
    HTTPScope,
)
from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer
from django.conf import settings
from django.http import parse_cookie

from yuzu.errors import YuzuError, correlation_id
from yuzu.faults import store_fault
from yuzu.jsondata import JsonObject

from . import jsonrpc as rpc
from . import modern, modern_transport, security
from .pipeline import finish, hop, internal_error
from .registry import AsyncHandler, ToolFailure, catalogue
from .server import (
    SUPPORTED_VERSIONS,
    Attach,
    Continuation,
    Reply,
    Request,
    cut_off,
    error_reply,
    handle,
    streaming_on,
)
from .streaming import get_stream, post_stream
from .streaming.follower import follow_on_get_channel
from .streaming.stream import Message, Stream
from .streaming.watch import refused

if TYPE_CHECKING:
    from channels.consumer import _ChannelScope

log = logging.getLogger("yuzu.mcp")
handle_in_thread = hop(handle)  # built once: asgiref inspects the function on every wrapper it builds


class McpConsumer(AsyncHttpConsumer):
    catalogue = "v1"
    # Channels opens a channel-layer channel for every consumer whose alias names a configured layer. This
    # one names none, so a plain POST never touches the layer; a stream that needs a channel opens its own
    # and feeds it into this consumer's dispatch loop (``listen``).
    channel_layer_alias = "mcp.transport.no-channel"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a live GET stream or streamed POST (mcp.streaming) keeps the consumer open
        self.stream: Stream | None = None

    async def __call__(self, scope: "_ChannelScope", receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        """Channels' own dispatch loop, fed from one inbox: the ASGI input, and what a stream adds to it (ASGI
        events and channel-layer messages alike: dicts keyed by "type"). The usual request — its whole body in its
        first message, answered with one reply — is served without the loop and its tasks; one that opens a
        stream enters the loop once it has."""
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._feeders: list[asyncio.Future[None]] = []
        self._peer = cast(Callable[[], Awaitable[Message]], receive)
        self._peer_heard = False
        try:
            first = await receive()
            if first["type"] == "http.request" and not first.get("more_body"):
                # what Channels' __call__ sets (this consumer names no channel layer)
                self.scope, self.base_send = cast(HTTPScope, scope), send
                try:
                    await self.http_request(first)
                except StopConsumer:
                    return
            else:
                self.post(cast(Message, first))
            self.hear_peer()
            await super().__call__(scope, cast(ASGIReceiveCallable, self._inbox.get), send)
        except asyncio.CancelledError:
            # daphne cancels every application instance when it stops (Server.kill_all_applications, on
            # SIGTERM/SIGINT): a live stream writes its session_terminated close frame before the drop.
            if self.stream is not None:
                await self.stream.shutdown()
            raise
        finally:
            for task in self._feeders:
                task.cancel()
            self._feeders.clear()  # no consumer ↔ task cycle: a finished consumer is freed at once, not by the GC

    def hear_peer(self) -> None:
        """Feed what the client sends next (more body, its disconnect) into the inbox, once."""
        if not self._peer_heard:
            self._peer_heard = True
            self.listen(self._peer)

    def listen(self, source: Callable[[], Awaitable[Message]]) -> None:
        async def feed() -> None:
            while True:
                await self._inbox.put(await source())

        self._feeders.append(asyncio.ensure_future(feed()))

    def post(self, message: Message) -> None:
        self._inbox.put_nowait(message)

    async def until_disconnect(self) -> None:
        """Returns when the peer goes away. Only while the request's handler holds the dispatch loop (an async
        tool awaited for a modern request, mcp.modern_transport): then nothing else reads the inbox."""
        self.hear_peer()
        while (await self._inbox.get())["type"] != "http.disconnect":
            pass

    async def dispatch(self, message: Message) -> None:
        """Route by message type — HTTP to the handlers below, ``mcp.*`` to the live stream — without Channels'
        per-message connection sweep: every database hop this consumer makes (mcp.pipeline.hop) already does
        that hygiene in its own worker thread."""
        kind = message["type"]
        if kind == "mcp.stopped":
            if self.stream is None:
                raise StopConsumer()
        elif kind.startswith("mcp."):
            if self.stream is not None:
                await self.stream.on_message(message)
        else:
            await getattr(self, get_handler_name(message))(message)

    @property
    def headers(self) -> dict[str, str]:
        if not hasattr(self, "_headers"):
            self._headers: dict[str, str] = {}
            for k, v in self.scope.get("headers", []):
                name = k.decode("latin-1").lower()
                value = v.decode("latin-1")
                self._headers[name] = f"{self._headers[name]}, {value}" if name in self._headers else value
        return self._headers

    # --- HTTP in ---------------------------------------------------------------------------------

    async def http_request(self, message: HTTPRequestEvent) -> None:
        self.body.append(message.get("body", b""))  # within the 4 MiB yuzu.bodylimit lets through
        if not message.get("more_body"):
            try:
                await self.handle(b"".join(self.body))
            finally:
                if self.stream is None:
                    await self.disconnect()
            if self.stream is None:
                raise StopConsumer()

    async def http_disconnect(self, message: HTTPDisconnectEvent) -> None:
        if self.stream is not None:
            await self.stream.gone()
        await super().http_disconnect(message)

    async def handle(self, body: bytes) -> None:
        try:
            reply = await self.process(body)
        except rpc.RpcError as err:
            reply = error_reply(None, err)
        except Exception as exc:
            cid = correlation_id()
            if (fault := store_fault(exc, what=f"MCP {cid}")) is not None:  # 503 + -32603 with a retry hint
                reply = error_reply(None, rpc.RpcError(rpc.INTERNAL_ERROR, fault.message, fault.envelope(cid),
                                                       http_status=503))
            else:
                log.exception("MCP transport failure")
                reply = error_reply(None, rpc.RpcError(rpc.INTERNAL_ERROR, "internal error",
                                                       {"correlation_id": cid}, http_status=500))
        if reply is not None:
            await self.reply(reply)

    def gate(self, method: str) -> Reply | None:
        """Kill switch and method: before anything else."""
        if settings.YUZU_MCP_DISABLE:
            return Reply(200, {"jsonrpc": "2.0", "id": None,
                               "error": {"code": rpc.MCP_DISABLED, "message": "MCP is disabled on this server"}})
        if method not in ("POST", "GET", "DELETE"):
            return Reply(405, None, {"Allow": "GET, POST, DELETE"})
        if method in ("GET", "DELETE") and not streaming_on():
            return Reply(405, None, {"Allow": "POST"})
        return None

    async def process(self, body: bytes) -> Reply | None:
        method = self.scope["method"]
        refusal = self.gate(method)
        if refusal is not None:
            return refusal
        err = security.check(method, self.headers)
        if err is not None:
            return error_reply(None, err)
        msg = rpc.parse_message(body) if method == "POST" else None
        try:
            era = modern.era(method, self.headers, self.scope.get("headers", []), msg)
        except rpc.RpcError as refused:  # -32020 / -32022: echo the request's id
            return error_reply(msg.get("id") if msg is not None else None, refused)
        if isinstance(era, Reply):
            return era
        if era == "modern":
            assert msg is not None
            return await modern_transport.serve(self, msg, self.catalogue, self.scope.get("headers", []))
        version = self.headers.get("mcp-protocol-version")
        if version is not None and version not in SUPPORTED_VERSIONS and streaming_on():
            return error_reply((msg or {}).get("id"), rpc.RpcError(
                rpc.BAD_PROTOCOL_VERSION, f"Unsupported MCP-Protocol-Version: {version[:40]}",
                {"supported": list(SUPPORTED_VERSIONS), "requested": version[:40]}, http_status=400))
        cookies = parse_cookie(self.headers.get("cookie", ""))
        req = Request(http_method=method, headers=self.headers, cookies=cookies, catalogue=self.catalogue, msg=msg,
                      progress_mode=self.progress_mode(msg))
        return await self.respond(await handle_in_thread(req))

    def progress_mode(self, msg: JsonObject | None) -> str | None:
        """The seed's opt-in table: a progressToken is the opt-in; an SSE-capable Accept (even ;q=0) picks
        the streamed POST, otherwise progress goes to the session's GET channel."""
        if not msg or msg.get("method") != "tools/call" or not streaming_on() or "mcp-session-id" not in self.headers:
            return None
        params = msg.get("params")
        if not isinstance(params, dict):
            params = {}
        name = params.get("name")
        tool = catalogue(self.catalogue).tools.get(name) if isinstance(name, str) else None  # hostile bodies too
        meta = params.get("_meta")
        if not isinstance(meta, dict):
            meta = {}
        if tool is None or not tool.progress or "progressToken" not in meta:
            return None
        if settings.YUZU_MCP_STREAMED_POST and "text/event-stream" in self.headers.get("accept", ""):
            return "post"
        return "get"

    # --- messages out ----------------------------------------------------------------------------

    async def respond(self, outcome: Reply | Continuation | Attach) -> Reply | None:
        """What mcp.server.handle decided, written as HTTP (None: a stream is answering)."""
        if isinstance(outcome, Continuation):
            return await self.run_async_tool(outcome)
        if isinstance(outcome, Attach):
            await get_stream.attach(self, outcome.principal, outcome.session)
            return None
        ctx = outcome.ctx
        if ctx is not None and "admitted" in ctx.extra:
            return await post_stream.respond(self, outcome, ctx)
        if ctx is not None and ctx.following is not None:
            follow_on_get_channel(ctx, ctx.following)
        return outcome

    async def reply(self, reply: Reply) -> None:
        headers = [(b"x-correlation-id", (rpc.correlation_of(reply.body) or correlation_id()).encode())]
        body = b""
        if reply.body is not None:
            body = rpc.dumps(reply.body)
            headers.append((b"content-type", b"application/json"))
        for k, v in reply.headers.items():
            headers.append((k.lower().encode(), str(v).encode("latin-1")))
        await self.send_response(reply.status, body, headers=headers)

    async def run_async_tool(self, cont: Continuation) -> Reply:
        """Await the tool while what admitted the call stays valid: a credential revoked (or the session ended)
        while it waits cancels it within a tick (mcp.streaming.watch), as it would close a stream."""
        result: JsonObject | ToolFailure | YuzuError
        work = asyncio.ensure_future(cast(AsyncHandler, cont.tool.handler)(cont.ctx, cont.args))
        cut = asyncio.ensure_future(refused(cont.ctx.principal, cont.ctx.session_id or ""))
        try:
            await asyncio.wait({work, cut}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cut.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            req = Request(http_method="POST", headers=self.headers, cookies={}, catalogue=self.catalogue)
            return await hop(cut_off)(cont, cut.result(), req)
        try:
            result = work.result()
        except (ToolFailure, YuzuError) as exc:
            result = exc
        except Exception:
            result = internal_error(cont.ctx)
        try:
            final = await hop(finish)(cont.ctx, cont.tool, result)
        except rpc.RpcError as err:
            return Reply(err.http_status, rpc.error_response(cont.req_id, err))
        return Reply(200, rpc.result_response(cont.req_id, final))


class BridgeConsumer(McpConsumer):
    catalogue = "bridge"
