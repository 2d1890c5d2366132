"""The streamed POST: the tools/call response itself is the SSE stream — progress frames, then the JSON-RPC
result, then EOF — capped at 120 s and re-validated on the GET channel's tick.

The follower runs as its own task, not inside the consumer's request handler, so the consumer keeps reading
its ASGI input: a peer that goes away is noticed (http.disconnect) instead of every later write vanishing
silently into a closed connection and being counted as delivered. The follower outlives the connection: what
it reports after the drop is committed to the ring (the result pinned) for a GET resume with Last-Event-ID, on
any process.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from yuzu.jsondata import JsonObject

from .. import jsonrpc as rpc
from ..context import FollowSpec, ToolContext
from .admission import post_budget, release_record, release_streamed_post
from .follower import Follower, spawn
from .metrics import CLOSES, DROPPED, POST_STREAMS_ACTIVE
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
from .watch import CredentialWatch, every_tick

if TYPE_CHECKING:
    from ..server import Reply

log = logging.getLogger("yuzu.mcp")


async def respond(conn: Connection, reply: Reply, ctx: ToolContext) -> Reply | None:
    """Answer an admitted streamed call (``ctx``, the reply's: ``ctx.extra["admitted"]`` holds its ring key) on
    ``conn``: the SSE response, or — when there is nothing to follow (e.g. no agents reached) — ``reply`` itself,
    the plain response. Returns what the transport still has to send (None once the stream has taken over)."""
    key = ctx.extra["admitted"]
    handed_off = False
    try:
        spec = ctx.following
        if spec is None or "error" in (reply.body or {}):
            return reply
        try:
            await conn.send_headers(status=200, headers=SSE_HEADERS + [(b"x-correlation-id", ctx.cid.encode())])
            if ctx.extra.get("protocol_version", "") >= "2025-11-25":
                await conn.send_body(priming_event(0), more_body=True)
        except Exception:
            return None
        post = PostStream(conn, ctx, key, spec)
        conn.stream = post
        spawn(post.run())
        handed_off = True
        return None
    finally:
        if not handed_off:
            release_streamed_post(ctx, key)


class PostStream:
    """One streamed POST response: its wire, its lease on the POST budget, and the follower feeding it. This is the
    handshake era's; a 2026-07-28 request's (mcp.streaming.modern.ModernPostStream) is the same stream with the
    era's hooks overridden — how a frame is written, what a tick adds, the last word, and what a drop means."""

    def __init__(self, conn: Connection, ctx: ToolContext, key: str, spec: FollowSpec) -> None:
        self.conn, self.ctx, self.key, self.spec = conn, ctx, key, spec
        self.wire_open = True
        self.leased = True
        POST_STREAMS_ACTIVE.inc()
        track(self)
        self.follower = self._follower()
        self.watch = self._watch()

    # --- the era's hooks (the handshake era's here) ----------------------------------------------------------

    def _follower(self) -> Follower:
        """Every frame committed to the session's ring first (a GET resume with Last-Event-ID finds it)."""
        return Follower(key=self.key, request_id=self.ctx.request_id, token=self.ctx.progress_token, spec=self.spec,
                        mode="post", stream_tag=f"post:{self.ctx.request_id}", writer=self.write_frame)

    def _watch(self) -> CredentialWatch:
        return CredentialWatch(self.ctx.principal, self.ctx.session_id or "",
                               wake=lambda: asyncio.ensure_future(self._tick()))

    def _encode(self, eid: int, frame: JsonObject) -> bytes:
        return event(eid, rpc.dumps(frame).decode())

    async def _beat(self) -> None:
        """What a tick adds to a live response (nothing: the session's GET channel carries the heartbeats)."""

    async def _last_word(self, reason: str) -> None:
        """The response ends early (cap, revocation, session end, …): a close frame saying why."""
        if says_why(reason):
            await self.conn.send_body(event(None, close_frame(reason, **self._close_extra())), more_body=True)

    async def _farewell(self) -> None:
        """This process is stopping (the work continues)."""
        await self.conn.send_body(event(None, close_frame("session_terminated", SHUTDOWN_REMEDIATION,
                                                          **self._close_extra())), more_body=True)

    async def _dropped(self) -> None:
        """The client went away: the follower carries on ring-only until the work settles, so a GET resume can
        still collect the pinned result."""

    # --- the stream ------------------------------------------------------------------------------------------

    async def write_frame(self, eid: int, frame: JsonObject) -> bool:
        if not self.wire_open:
            return False
        try:
            await self.conn.send_body(self._encode(eid, frame), more_body=True)
            return True
        except Exception:
            self.wire_open = False
            DROPPED.inc()
            return False

    def _close_extra(self) -> JsonObject:
        eid = self.spec.meta.get("yuzu.execution_id")
        return {"execution_id": eid, "partial": True} if eid else {}

    async def _tick(self) -> bool:
        """The GET stream's re-validation, on the same tick: a credential revoked (or a session ended) while the
        call streams stops the follower, and the response closes with that reason."""
        if self.follower.closed is not None:
            return False
        reason = await self.watch.check()
        if reason is not None:
            self.follower.detach(reason)
            return False
        await self._beat()
        return True

    async def run(self) -> None:
        ticker = every_tick(self._tick)
        try:
            try:
                reason = await self.follower.run()
            except Exception:
                log.exception("streamed POST failed after dispatch (%s)", self.ctx.cid)
                reason = "internal_error"
            if self.wire_open:
                CLOSES.labels(reason).inc()
                try:
                    await self._last_word(reason)
                except Exception:
                    pass
                await self._end()
        finally:
            ticker.cancel()
            self.watch.stop()
            release_record(self.key, self.ctx.request_id)
            self._release_lease()

    async def _end(self) -> None:
        self.wire_open = False
        try:
            await self.conn.send_body(b"", more_body=False)
        except Exception:
            pass
        if self.conn.stream is self:
            self.conn.stream = None
            self.conn.post({"type": "mcp.stopped"})

    def _release_lease(self) -> None:
        untrack(self)
        if self.leased:
            self.leased = False
            post_budget.release(self.ctx.principal.key)
            POST_STREAMS_ACTIVE.dec()

    async def on_message(self, message: Message) -> None:
        return None  # fed by its follower and its own tick, never by the connection's messages

    async def gone(self) -> None:
        """The peer went away (http.disconnect). The response is over, so is its lease; what else the drop means
        is the era's (``_dropped``)."""
        if self.wire_open:
            self.wire_open = False
            CLOSES.labels("client_disconnect").inc()
            await self._dropped()
        self._release_lease()
        if self.conn.stream is self:
            self.conn.stream = None

    async def shutdown(self) -> None:
        """This process is stopping: tell the client before the connection drops (the work continues)."""
        if not self.wire_open:
            return
        self.wire_open = False  # nothing more from the follower: the farewell is the last frame
        CLOSES.labels("session_terminated").inc()
        try:
            await self._farewell()
        except Exception:
            pass
        try:
            await self.conn.send_body(b"", more_body=False)
        except Exception:
            pass
        await asyncio.sleep(SHUTDOWN_FLUSH_SECONDS)
        self._release_lease()
        self.conn.stream = None
