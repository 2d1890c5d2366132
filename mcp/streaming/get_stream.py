"""The session's GET channel: ``GET /mcp/v1/`` with the session's id opens its server→client stream.

It replays what the ring holds after the client's Last-Event-ID (a gap is a 404 that ends the session, never a
short replay; a cursor that is no event id at all is a 400 that changes nothing, never a replay from the start),
then carries live frames as the session's group wakes it, a heartbeat on every tick that delivered nothing, and
re-validates the credential on every tick. One stream per session: a second GET takes over and the first closes
with ``superseded``. A GET that resumes a streamed POST (its Last-Event-ID is one of that POST's frames) follows
that call up to and including its result, then carries GET frames again.
"""

import asyncio
import functools
import json
import logging
import re
import secrets
from collections.abc import Mapping

from yuzu.audit import audit
from yuzu.errors import correlation_id
from yuzu.rbac import Principal

from .. import jsonrpc as rpc
from ..pipeline import a4, hop
from .admission import admit_get, release_get
from .follower import adopt
from .metrics import CLOSES, DROPPED, STREAMS_ACTIVE
from .ring import Frame, ring_key, rings
from .sessions import Session, store
from .shutdown import SHUTDOWN_FLUSH_SECONDS, SHUTDOWN_REMEDIATION, track, untrack
from .stream import (
    SSE_HEADERS,
    Connection,
    Message,
    close_frame,
    event,
    priming_event,
    says_why,
)
from .wake import channel_layer, wake_group
from .watch import CredentialWatch, every_tick

log = logging.getLogger("yuzu.mcp")

_live: dict[str, "GetStream"] = {}  # ring key -> the session's current GetStream in this process
_draining: set[str] = set()  # ring keys whose superseded stream is still closing


def accepts_sse(headers: Mapping[str, str]) -> bool:
    ranges = [part.split(";")[0].strip().lower() for part in headers.get("accept", "").split(",")]
    return "text/event-stream" in ranges


def last_event_id(headers: Mapping[str, str]) -> int:
    """The resume cursor: 0 without the header (or with an empty one, which is what SSE means by no last id), else
    the id it names — a decimal event id as this server writes them (``id: <n>``). Anything else is no cursor the
    server could have issued: a 400, before anything happens, never a replay from the start that the client would
    take for the rest of its stream. (An id in that form that the ring does not cover is the gap: see ``attach``.)"""
    value = headers.get("last-event-id", "").strip(" \t")
    if not value:
        return 0
    if re.fullmatch(r"[0-9]{1,19}", value) is None:
        raise rpc.RpcError(rpc.INVALID_REQUEST, "Bad Request: Last-Event-ID must be an event id this stream sent",
                           a4(correlation_id(), remediation="send the id of the last event you received, as it "
                              "was sent (decimal digits), or no Last-Event-ID to start from what the server holds"),
                           http_status=400)
    return int(value)


async def attach(conn: Connection, principal: Principal, session: Session) -> None:
    """Open the session's stream on ``conn`` (auth and the session check have passed), or raise the refusal:
    406 without an SSE Accept, 400 for a Last-Event-ID that is no event id, 429 at a cap, 404 for a cursor the ring
    does not cover."""
    if not accepts_sse(conn.headers):
        raise rpc.RpcError(rpc.NOT_ACCEPTABLE, "Not Acceptable: Accept must list text/event-stream", http_status=406)
    cursor = last_event_id(conn.headers)
    key = ring_key(principal.key, session.id)
    admit_get(principal.key, handover_pending=key in _draining)
    try:
        stream_tag = await hop(rings().stream_of)(key, cursor) if cursor else "get"
        frames, gap = await hop(rings().read)(key, cursor, stream_tag or "get")
    except Exception:
        release_get(principal.key)
        raise
    if gap:
        release_get(principal.key)
        await hop(_terminate)(principal, session, key)
        raise rpc.RpcError(rpc.UNKNOWN_SESSION, "Replay window exceeded",
                           a4(correlation_id(), remediation="re-initialize, then fetch results by execution_id"),
                           http_status=404)
    stream = GetStream(conn, principal, session, key)
    if stream_tag and stream_tag.startswith("post:"):
        stream.follow = stream_tag  # resuming a streamed POST: its later frames, and its result, come here too
    if key in _live:
        _draining.add(key)  # cleared when the superseded stream has closed
    await stream.layer.group_send(wake_group(key), {"type": "mcp.superseded", "stream": stream.id})
    await stream.start(frames, cursor, priming=session.protocol_version >= "2025-11-25")


def _is_response(data: str) -> bool:
    """A ring frame carrying a JSON-RPC response (a streamed call's result), not a notification."""
    try:
        frame = json.loads(data)
    except ValueError:
        return False
    return isinstance(frame, dict) and "method" not in frame and "id" in frame


def _terminate(principal: Principal, session: Session, key: str) -> None:
    store().delete(session.id, principal.key)
    rings().drop(key)
    audit(principal, "mcp.session.close", "success", target_type="McpSession", target_id=session.id[:8],
          detail="reason=replay_window_exceeded")


class GetStream:
    def __init__(self, conn: Connection, principal: Principal, session: Session, key: str) -> None:
        self.conn, self.principal, self.session, self.key = conn, principal, session, key
        self.id = secrets.token_hex(8)
        self.layer = channel_layer()
        self.channel: str | None = None  # its own channel-layer channel, in the session's wake group
        self.last_get = 0  # newest frame id this connection has passed (delivered, or another stream's)
        # "post:<id>" when this GET resumed a streamed POST, until its result is delivered
        self.follow: str | None = None
        self.closed = False
        self.wrote_since_tick = False
        self.watch = CredentialWatch(principal, session.id, wake=lambda: self.conn.post({"type": "mcp.tick"}))
        self.ticker: asyncio.Future[None] | None = None
        self.budget_held = True

    async def start(self, replay: list[Frame], cursor: int, priming: bool) -> None:
        self.conn.stream = self
        _live[self.key] = self  # a superseded stream still draining deregisters itself only if it is current
        track(self)
        STREAMS_ACTIVE.inc()
        self.channel = await self.layer.new_channel()
        self.conn.listen(functools.partial(self.layer.receive, self.channel))
        await self.layer.group_add(wake_group(self.key), self.channel)
        await self.conn.send_headers(status=200,
                                     headers=SSE_HEADERS + [(b"x-correlation-id", correlation_id().encode())])
        self.last_get = max([cursor] + [eid for eid, _, _ in replay])
        if priming:  # the position before the replay, so a resume from it loses nothing
            await self.write(priming_event(cursor))
        for eid, stream, data in replay:
            await self.deliver(eid, stream, data)
        await hop(audit)(self.principal, "mcp.stream.attach", "success", target_type="McpSession",
                         target_id=self.session.id[:8])
        self.ticker = every_tick(self._tick)
        await self.on_wake()

    async def _tick(self) -> bool:
        """The tick is handled on the connection's dispatch loop, one message at a time like the rest."""
        if self.closed:
            return False
        self.conn.post({"type": "mcp.tick"})
        return True

    async def on_message(self, message: Message) -> None:
        kind = message["type"]
        if kind == "mcp.wake":
            await self.on_wake()
        elif kind == "mcp.tick":
            await self.on_tick()
        elif kind == "mcp.close":
            await self.close(message.get("reason", "session_terminated"))
        elif kind == "mcp.superseded" and message.get("stream") != self.id:
            await self.close("superseded")
        # mcp.cancel is for streamed-POST followers, which listen on their own channels

    async def write(self, data: bytes) -> bool:
        try:
            await self.conn.send_body(data, more_body=True)
            self.wrote_since_tick = True
            return True
        except Exception:
            DROPPED.inc()
            return False

    async def on_wake(self) -> None:
        if self.closed:
            return
        frames, gap = await hop(rings().read)(self.key, self.last_get, None if self.follow else "get")
        for eid, stream, data in frames:
            if stream == "get" or stream == self.follow:
                await self.deliver(eid, stream, data)
            self.last_get = max(self.last_get, eid)

    async def deliver(self, eid: int, stream: str, data: str) -> None:
        """Write one ring frame. The result of a resumed streamed POST is this resume's to release: once it
        is on the wire its pin is dropped and the channel goes back to carrying only GET frames."""
        ok = await self.write(event(eid, data))
        if stream != "get" and stream == self.follow and _is_response(data):
            self.follow = None
            if ok:
                await hop(rings().unpin)(self.key, eid)

    async def on_tick(self) -> None:
        if self.closed:
            return
        reason = await self.watch.check()
        if reason is not None:
            return await self.close(reason)
        if not self.wrote_since_tick:
            await self.write(b": heartbeat\n\n")
        self.wrote_since_tick = False
        if self.follow is not None:
            # Still waiting for a resumed streamed POST's result: if the process that followed it died, follow it
            # from here (mcp.streaming.handover). A look at the ring first: it may have come without a wake.
            await self.on_wake()
            if self.follow is not None and not self.closed:
                try:
                    await adopt(self.key, self.follow, self.principal.key)
                except Exception:  # the store is away: the next tick tries again
                    log.warning("could not adopt the follow of %s", self.follow, exc_info=True)

    async def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        CLOSES.labels(reason).inc()
        if says_why(reason):
            await self.write(event(None, close_frame(reason)))
        try:
            await self.conn.send_body(b"", more_body=False)
        except Exception:
            pass
        await self._release()
        self.conn.stream = None
        self.conn.post({"type": "mcp.stopped"})

    async def shutdown(self) -> None:
        """This process is stopping (daphne cancels every application instance): write the close frame
        before the connection drops, so the client learns why instead of seeing a truncated stream."""
        if self.closed:
            return
        self.closed = True
        CLOSES.labels("session_terminated").inc()
        await self.write(event(None, close_frame("session_terminated", SHUTDOWN_REMEDIATION)))
        try:
            await self.conn.send_body(b"", more_body=False)
        except Exception:
            pass
        await asyncio.sleep(SHUTDOWN_FLUSH_SECONDS)
        await self._release()
        self.conn.stream = None

    async def gone(self) -> None:
        if not self.closed:
            self.closed = True
            CLOSES.labels("client_disconnect").inc()
            await self._release()
            self.conn.stream = None

    async def _release(self) -> None:
        if self.ticker is not None:
            self.ticker.cancel()
        self.watch.stop()
        if self.budget_held:
            self.budget_held = False
            release_get(self.principal.key)
            STREAMS_ACTIVE.dec()
        untrack(self)
        if _live.get(self.key) is self:
            del _live[self.key]
        _draining.discard(self.key)
        try:
            if self.channel is not None:
                await self.layer.group_discard(wake_group(self.key), self.channel)
        except Exception:
            pass
        await hop(audit)(self.principal, "mcp.stream.close", "success", target_type="McpSession",
                         target_id=self.session.id[:8])
