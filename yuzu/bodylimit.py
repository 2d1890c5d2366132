"""Request-body limits on every HTTP path, counted while the bytes arrive.

The limits: 4 MiB on the MCP endpoints (`/mcp/…`), `DATA_UPLOAD_MAX_MEMORY_SIZE` everywhere else. A declared
`Content-Length` over the limit is refused before any of the body is read; a body that declares none (chunked)
is counted as it arrives and refused the moment it passes the limit. The MCP endpoints also require the
length up front (spec: any `Transfer-Encoding`, or a POST/PUT/PATCH without `Content-Length` → 411).

One `Meter` per request holds these rules; two adapters run it:

- `BodyLimit`, ASGI middleware in front of every HTTP route (yuzu/asgi.py), for servers that stream the body
  to the application and for the in-process test communicators;
- `install_daphne`: daphne (through Twisted) receives a request's whole body — spooled to a temporary file,
  then queued to the application all at once — before the application even starts, so middleware alone
  would only count bytes already read and held. Under daphne the meter runs while Twisted receives the body:
  it answers at once, then reads and drops whatever the peer still sends, for at most `LINGER_SECONDS`.
  The same adapter leaves the body unparsed (Twisted would parse form and multipart bodies for daphne, which
  never reads them) and drops Twisted's own access line (daphne writes the access log): per-request work that
  served nobody.
"""

import io
import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from asgiref.typing import (
    ASGI3Application,
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    HTTPScope,
    Scope,
)
from daphne import http_protocol
from django.conf import settings
from twisted.web.http import RESPONSES

from .errors import correlation_id
from .metrics import MCP_BODY_TOO_LARGE

log = logging.getLogger("yuzu.http")

MCP_PREFIX = "/mcp/"
MCP_MAX_BODY = 4 * 1024 * 1024
BODY_METHODS = ("POST", "PUT", "PATCH")
LINGER_SECONDS = 5.0

#: an answer sent instead of the application's: (status, headers, body)
Refusal = tuple[int, list[tuple[bytes, bytes]], bytes]


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n} bytes"


class Meter:
    """One request's body bound: what its head allows, and how many body bytes have arrived."""

    def __init__(self, method: str, path: str, headers: Mapping[str, str]) -> None:
        self.method, self.path, self.headers = method, path, headers  # headers: lower-case name → str
        self.mcp = path.startswith(MCP_PREFIX)
        self.limit = MCP_MAX_BODY if self.mcp else settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        self.received = 0

    @classmethod
    def for_scope(cls, scope: HTTPScope) -> "Meter":
        headers: dict[str, str] = {}
        for raw_name, value in scope.get("headers", []):
            name = raw_name.decode("latin-1").lower()
            headers[name] = f"{headers[name]}, {value.decode('latin-1')}" if name in headers \
                else value.decode("latin-1")
        return cls(scope["method"], scope["path"], headers)

    def head(self) -> Refusal | None:
        """A refusal the request line and headers already earn (before any of the body), or None."""
        declared = self.headers.get("content-length")
        if self.mcp and self.method in BODY_METHODS and ("transfer-encoding" in self.headers or declared is None):
            return self._refusal(411, "Content-Length required", "no_length")
        if declared is not None:
            if not declared.strip().isdigit():
                return self._refusal(400, "invalid Content-Length", "invalid_length")
            if self.limit is not None and int(declared) > self.limit:
                return self._refusal(413, f"request body exceeds {_size(self.limit)}", "too_large")
        return None

    def add(self, n: int) -> Refusal | None:
        """Count n more body bytes: a refusal once the limit is passed, else None."""
        self.received += n
        if self.limit is not None and self.received > self.limit:
            return self._refusal(413, f"request body exceeds {_size(self.limit)}", "too_large")
        return None

    def _refusal(self, status: int, message: str, reason: str) -> Refusal:
        if self.mcp:
            MCP_BODY_TOO_LARGE.labels(reason).inc()
        log.info("refused %s %s: %s (%s)", self.method, self.path[:200], status, message)
        cid = correlation_id()
        body: dict[str, Any] | None
        if self.mcp:
            body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message, "data": {
                "correlation_id": cid, "retry_after_ms": None,
                "remediation": "send one identity-encoded JSON body of at most 4 MiB, with a Content-Length"}}}
        elif self.path.startswith("/api/"):
            body = {"error": {"code": status, "message": message, "correlation_id": cid, "retry_after_ms": None,
                              "remediation": "send a smaller body"}, "meta": {"api_version": "v1"}}
        else:
            body = None
        data = json.dumps(body).encode() if body is not None else message.encode()
        ctype = b"application/json" if body is not None else b"text/plain; charset=utf-8"
        return status, [(b"content-type", ctype), (b"x-correlation-id", cid.encode()),
                        (b"content-length", str(len(data)).encode()), (b"connection", b"close")], data


async def _answer(send: ASGISendCallable, refusal: Refusal) -> None:
    status, headers, body = refusal
    await send({"type": "http.response.start", "status": status, "headers": headers, "trailers": False})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BodyLimit:
    """ASGI middleware: the application sees a body only while it stays within its limit. Past it, the
    client gets the refusal, the application gets http.disconnect, and the rest of the body is dropped."""

    def __init__(self, app: ASGI3Application) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        meter = Meter.for_scope(scope)
        refusal = meter.head()
        if refusal is not None:
            return await _answer(send, refusal)
        state = {"refused": False, "started": False}

        async def bounded_receive() -> ASGIReceiveEvent:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return message
                if state["refused"]:
                    continue  # what the client still sends of a refused body
                refusal = meter.add(len(message.get("body", b"")))
                if refusal is None:
                    return message
                state["refused"] = True
                if not state["started"]:
                    await _answer(send, refusal)
                return {"type": "http.disconnect"}

        async def guarded_send(message: ASGISendEvent) -> None:
            if state["refused"]:
                return
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        return await self.app(scope, bounded_receive, guarded_send)


def install_daphne() -> None:
    """Make daphne's requests run the meter while Twisted receives their body (see the module doc), and leave
    the body's parsing to the application."""
    if getattr(http_protocol.WebRequest, "bounded", False):
        return

    def drop(data: bytes) -> None:
        return None

    def cut(transport: Any) -> None:
        if not getattr(transport, "disconnected", False):
            transport.abortConnection()

    class BoundedWebRequest(http_protocol.WebRequest):  # type: ignore[misc]  # daphne ships no type information
        bounded = True
        meter: Meter | None = None
        refused = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # Twisted would parse every POST's Content-Type (through the email package, ~60 µs a request) and
            # a form or multipart body into request.args, which daphne never reads (the application gets the
            # body), and would answer a malformed multipart body with a bare 400 of its own.
            super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)

        def gotLength(self, length: int | None) -> None:
            channel = self.channel  # the request line is the channel's until the body is complete
            headers = {name.decode("latin-1").lower(): ", ".join(v.decode("latin-1") for v in values)
                       for name, values in self.requestHeaders.getAllRawHeaders()}
            path = unquote(urlsplit(channel._path.decode("latin-1")).path)
            self.meter = Meter(channel._command.decode("latin-1"), path, headers)
            refusal = self.meter.head()
            if refusal is not None:
                self.content = io.BytesIO()
                return self.refuse(refusal)
            super().gotLength(length)

        def handleContentChunk(self, data: bytes) -> None:
            if self.refused:
                return None
            assert self.meter is not None  # gotLength made it, before any of the body
            refusal = self.meter.add(len(data))
            if refusal is not None:
                return self.refuse(refusal)
            super().handleContentChunk(data)

        def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
            if not self.refused:  # a refused request never reaches the application
                super().requestReceived(command, path, version)

        def refuse(self, refusal: Refusal) -> None:
            # deferred: importing twisted's reactor installs one; daphne installs its own before it runs this
            from twisted.internet import reactor

            self.refused = True
            self.requestHeaders.removeHeader(b"expect")  # no "100 Continue" after the answer
            status, headers, body = refusal
            head = [b"HTTP/1.1 %d %s" % (status, RESPONSES.get(status, b"Error"))]
            head += [name + b": " + value for name, value in headers]
            transport = self.channel.transport
            transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
            self.channel.dataReceived = drop  # the rest of the body is read and thrown away, never kept
            transport.loseWriteConnection()  # the answer, then FIN: the peer learns now, not at the end
            # (twisted types its reactor through zope.interface declarations, whose methods mypy reads without self)
            reactor.callLater(LINGER_SECONDS, cut, transport)  # type: ignore[arg-type]

    http_protocol.WebRequest = BoundedWebRequest
    # Twisted formats its own access line for every request and hands it to Twisted's logging, which daphne
    # routes nowhere (or, verbose, to the stdlib log beside its own access log): daphne writes the access log.
    http_protocol.HTTPFactory.log = lambda factory, request: None
