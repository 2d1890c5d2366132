"""The two sides of a held-open response, and the SSE it speaks.

``Connection`` is what a stream needs from the HTTP side (mcp.transport.McpConsumer): the request headers,
the response writes, and the consumer's one dispatch loop, into which a stream feeds its channel-layer
messages and its own ticks so that they are handled one at a time. ``Stream`` is what the transport drives:
it routes the stream's messages to it and tells it how the connection ends. Two implementations: the session's
GET channel (get_stream.GetStream) and a streamed POST (post_stream.PostStream).
"""

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from yuzu.errors import STREAM_CAP_RETRY_MS, correlation_id

from .. import jsonrpc as rpc

#: a message on the consumer's dispatch loop: ASGI events and channel-layer messages, keyed by "type"
Message = dict[str, Any]
#: HTTP response headers as ASGI sends them
Headers = list[tuple[bytes, bytes]]

SSE_HEADERS: Headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no"), (b"x-content-type-options", b"nosniff")]
CLOSE_ADVICE: dict[str, tuple[int | None, str]] = {
    "superseded": (None, "another GET took over this session's stream"),
    "session_terminated": (None, "re-initialize"),
    "credential_revoked": (None, "re-authenticate"),
    "auth_unavailable": (STREAM_CAP_RETRY_MS, "retry"),
    "internal_error": (None, "fetch results by execution_id"),
    "cancelled": (None, "fetch by execution_id if you still want it"),
    "cap_expired": (None, "the work continues; fetch by execution_id"),
    "handed_over": (None, "another server process reports this call now: resume with GET and Last-Event-ID"),
}


class Stream(Protocol):
    """A held-open SSE response."""

    async def on_message(self, message: Message) -> None:
        """A message addressed to this stream (``mcp.*``: wake, tick, close, superseded, cancel)."""

    async def gone(self) -> None:
        """The peer went away (http.disconnect): stop writing, give back what the stream holds."""

    async def shutdown(self) -> None:
        """This process is stopping: write the session_terminated close frame before the connection drops."""


class Connection(Protocol):
    """The HTTP side of a stream."""

    stream: Stream | None  # the live stream, which keeps the connection open

    @property
    def headers(self) -> dict[str, str]:
        """The request's, lower-case names."""

    async def send_headers(self, *, status: int = 200, headers: Headers | None = None) -> None: ...

    async def send_body(self, body: bytes, *, more_body: bool = False) -> None: ...

    def listen(self, source: Callable[[], Awaitable[Message]]) -> None:
        """Feed what ``source()`` returns (e.g. a channel-layer receive) into the dispatch loop."""

    def post(self, message: Message) -> None:
        """Queue ``message`` on the dispatch loop (``mcp.stopped`` ends the connection once no stream is live)."""

    async def until_disconnect(self) -> None:
        """Returns when the peer goes away (while a request handler holds the dispatch loop)."""


def says_why(reason: str) -> bool:
    """Whether a stream closing for ``reason`` ends with a close frame. Every server-side close does; a
    completed streamed POST does not (its result is the last frame), and neither do the streams of a session
    its client DELETEd (``session_deleted``): the client asked, and as it shuts down it has stopped reading —
    a frame would land in a closed reader (the official Python SDK logs "Error parsing SSE message …
    ClosedResourceError" for it). A termination the client did not ask for keeps its frame."""
    return reason not in ("completed", "session_deleted")


def event(eid: int | None, frame_json: str) -> bytes:
    head = f"id: {eid}\n" if eid is not None else ""
    return f"{head}event: message\ndata: {frame_json}\n\n".encode()


def priming_event(eid: int) -> bytes:
    """The empty event that tells a 2025-11-25 client the position to resume from."""
    return f"id: {eid}\ndata: \n\n".encode()


def close_frame(reason: str, remediation: str | None = None, **extra: object) -> str:
    """The last frame of a server-side close: off the ring (no id), saying why and what to do."""
    retry, advice = CLOSE_ADVICE.get(reason, (None, None))
    remediation = remediation or advice
    params = {"reason": reason, "correlation_id": correlation_id(), "retry_after_ms": retry,
              "remediation": remediation, **extra}
    return rpc.dumps({"jsonrpc": "2.0", "method": "notifications/yuzu.stream_closed", "params": params}).decode()
