"""Streamable HTTP transport: a Channels HTTP consumer at /mcp/v1 and /mcp/v1/ (and the bridge's
/mcp/bridge/). The body's size and declared length are bounded before it gets here, while it arrives
(yuzu.bodylimit). Guards that need no database run here, before any work: kill switch, Host, Origin,
Content-Type and -Encoding, protocol version, JSON framing. Everything else is one worker-thread hop
(mcp.server.handle)."""

import asyncio
import functools
import logging
from urllib.parse import urlsplit

from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from django.http import parse_cookie
from django.http.request import split_domain_port, validate_host

from yuzu.errors import correlation_id
from yuzu.metrics import MCP_BODY_TOO_LARGE

from . import jsonrpc as rpc
from yuzu.errors import YuzuError

from .pipeline import finish, hop, internal_error
from .registry import ToolFailure
from . import sse
from .registry import catalogue
from .server import SUPPORTED_VERSIONS, Attach, Continuation, Reply, Request, handle, streaming_on

log = logging.getLogger("yuzu.mcp")


class StopEarly(Exception):
    def __init__(self, reply):
        self.reply = reply


def _refuse(status, code, message, *, req_id=None, headers=None, data=None):
    err = rpc.RpcError(code, message, data, http_status=status, headers=headers)
    return Reply(status, rpc.error_response(req_id, err), dict(headers or {}))


class McpConsumer(AsyncHttpConsumer):
    catalogue = "v1"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stream = None  # a live GET stream or streamed POST (mcp.sse) keeps the consumer open

    async def __call__(self, scope, receive, send):
        """Like Channels' AsyncConsumer, except that a channel-layer channel is opened only by a stream that
        needs one: a plain POST never touches the layer."""
        self.scope = scope
        self.base_send = send
        self.channel_layer = get_channel_layer()
        self.channel_name = None
        self._inbox = asyncio.Queue()
        self._feeders = [asyncio.ensure_future(self._feed(receive))]
        try:
            while True:
                await self.dispatch(await self._inbox.get())
        except StopConsumer:
            pass
        except asyncio.CancelledError:
            # daphne cancels every application instance when it stops (Server.kill_all_applications, on
            # SIGTERM/SIGINT): a live stream writes its session_terminated close frame before the drop.
            if self.stream is not None:
                await self.stream.shutdown()
            raise
        finally:
            for task in self._feeders:
                task.cancel()

    async def _feed(self, source):
        while True:
            await self._inbox.put(await source())

    def stop_soon(self):
        """End this consumer from its own dispatch loop once its stream has finished."""
        self._inbox.put_nowait({"type": "mcp.stopped"})

    async def open_channel(self):
        if self.channel_name is None:
            self.channel_name = await self.channel_layer.new_channel()
            self._feeders.append(asyncio.ensure_future(
                self._feed(functools.partial(self.channel_layer.receive, self.channel_name))))
        return self.channel_name

    async def dispatch(self, message):
        """Route by message type without Channels' per-message connection sweep: every database hop this
        consumer makes (mcp.pipeline.hop) already does that hygiene in its own worker thread."""
        handler = getattr(self, message["type"].replace(".", "_"), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    @property
    def headers(self):
        if not hasattr(self, "_headers"):
            self._headers = {}
            for k, v in self.scope.get("headers", []):
                name = k.decode("latin-1").lower()
                value = v.decode("latin-1")
                self._headers[name] = f"{self._headers[name]}, {value}" if name in self._headers else value
        return self._headers

    async def http_request(self, message):
        self.body.append(message.get("body", b""))  # within the 4 MiB yuzu.bodylimit lets through
        if not message.get("more_body"):
            try:
                await self.handle(b"".join(self.body))
            finally:
                if self.stream is None:
                    await self.disconnect()
            if self.stream is None:
                raise StopConsumer()

    async def reply(self, reply):
        headers = [(b"x-correlation-id", correlation_id().encode())]
        body = b""
        if reply.body is not None:
            body = rpc.dumps(reply.body)
            headers.append((b"content-type", b"application/json"))
        for k, v in reply.headers.items():
            headers.append((k.lower().encode(), str(v).encode("latin-1")))
        await self.send_response(reply.status, body, headers=headers)

    async def handle(self, body):
        try:
            reply = await self.process(body)
        except StopEarly as stop:
            reply = stop.reply
        except Exception:
            log.exception("MCP transport failure")
            reply = _refuse(500, rpc.INTERNAL_ERROR, "internal error", data={"correlation_id": correlation_id()})
        if reply is not None:
            await self.reply(reply)

    def precheck(self):
        """Kill switch, method, Host and Origin: pre-auth, pre-parse."""
        method = self.scope["method"]
        if settings.YUZU_MCP_DISABLE:
            return Reply(200, {"jsonrpc": "2.0", "id": None,
                               "error": {"code": rpc.MCP_DISABLED, "message": "MCP is disabled on this server"}})
        if method not in ("POST", "GET", "DELETE"):
            return Reply(405, None, {"Allow": "GET, POST, DELETE"})
        if method in ("GET", "DELETE") and not streaming_on():
            return Reply(405, None, {"Allow": "POST"})
        host = self.headers.get("host", "")
        domain, _ = split_domain_port(host)
        if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
            return _refuse(421, rpc.INVALID_REQUEST, "Misdirected Request: Host not allowed")
        # Origin on every request, whatever the streaming mode: with the admin session cookie also accepted,
        # this check and the JSON-only body below are what keep another site's page (even one on another port
        # of this host, which the browser treats as same-site) from calling tools with an admin's cookie.
        origin = self.headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, host):
            return _refuse(403, rpc.ORIGIN_REJECTED, "Origin not allowed",
                           data={"correlation_id": correlation_id(), "retry_after_ms": None})
        if method == "POST":
            # application/json cannot be sent cross-origin without a CORS preflight, which yuzu never grants.
            media_type = self.headers.get("content-type", "").split(";")[0].strip().lower()
            if media_type != "application/json":
                return _refuse(415, rpc.INVALID_REQUEST, "Content-Type must be application/json")
            if self.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
                MCP_BODY_TOO_LARGE.labels("encoding").inc()
                return _refuse(415, rpc.INVALID_REQUEST, "Content-Encoding must be identity")
        return None

    @staticmethod
    def origin_allowed(origin, host):
        if origin in settings.YUZU_ALLOWED_ORIGINS:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and parts.netloc == host

    async def process(self, body):
        early = self.precheck()
        if early is not None:
            return early
        method = self.scope["method"]
        msg = None
        if method == "POST":
            try:
                msg = rpc.parse_message(body)
            except rpc.RpcError as err:
                return Reply(err.http_status, rpc.error_response(None, err))
            if msg.get("method") == "server/discover":
                # A 2026 client's probe: answer so it falls back to the initialize handshake.
                return _refuse(400, rpc.INVALID_REQUEST, "Bad Request: Missing session ID")
        version = self.headers.get("mcp-protocol-version")
        if version is not None and version not in SUPPORTED_VERSIONS and streaming_on():
            return _refuse(400, rpc.BAD_PROTOCOL_VERSION, f"Unsupported MCP-Protocol-Version: {version[:40]}",
                           req_id=(msg or {}).get("id"),
                           data={"supported": list(SUPPORTED_VERSIONS), "requested": version[:40]})
        cookies = parse_cookie(self.headers.get("cookie", ""))
        req = Request(http_method=method, headers=self.headers, cookies=cookies, catalogue=self.catalogue, msg=msg,
                      progress_mode=self.progress_mode(msg))
        outcome = await hop(handle)(req)
        if isinstance(outcome, Continuation):
            return await self.run_async_tool(outcome)
        if isinstance(outcome, Attach):
            return await self.attach(outcome)
        if isinstance(outcome, Reply) and outcome.ctx is not None and "admitted" in outcome.ctx.extra:
            return await sse.streamed_post(self, outcome)
        if isinstance(outcome, Reply) and outcome.ctx is not None and outcome.ctx.following is not None:
            sse.follow_on_get_channel(outcome)
        return outcome

    def progress_mode(self, msg):
        """The seed's opt-in table: a progressToken is the opt-in; an SSE-capable Accept (even ;q=0) picks
        the streamed POST, otherwise progress goes to the session's GET channel."""
        if not msg or msg.get("method") != "tools/call" or not streaming_on() or "mcp-session-id" not in self.headers:
            return None
        params = msg.get("params") or {}
        tool = catalogue(self.catalogue).tools.get(params.get("name"))
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        if tool is None or not tool.progress or "progressToken" not in meta:
            return None
        if settings.YUZU_MCP_STREAMED_POST and "text/event-stream" in self.headers.get("accept", ""):
            return "post"
        return "get"

    async def attach(self, attach):
        return await sse.attach_get(self, attach)

    async def mcp_wake(self, message):
        if self.stream is not None:
            await self.stream.on_wake()

    async def mcp_close(self, message):
        if self.stream is not None:
            await self.stream.close(message.get("reason", "session_terminated"))

    async def mcp_superseded(self, message):
        if self.stream is not None and message.get("stream") != self.stream.id:
            await self.stream.close("superseded")

    async def mcp_tick(self, message):
        if self.stream is not None:
            await self.stream.on_tick()

    async def mcp_stopped(self, message):
        if self.stream is None:
            raise StopConsumer()

    async def mcp_cancel(self, message):
        return None  # addressed to streamed POST followers, which listen on their own channels

    async def http_disconnect(self, message):
        if self.stream is not None:
            await self.stream.gone()
        await super().http_disconnect(message)

    async def run_async_tool(self, cont):
        try:
            result = await cont.tool.handler(cont.ctx, cont.args)
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
