"""SSE plumbing for the transport: the session's GET channel (replay, resume, takeover, heartbeats,
credential re-validation, close frames) and the streamed POST response."""

import asyncio
import json
import logging
import os
import secrets
import sys
import time


from yuzu.audit import audit
from yuzu.errors import STREAM_CAP_RETRY_MS, correlation_id

from . import jsonrpc as rpc
from .pipeline import hop, tool_result
from .progress import Follower, admit_record, release_record
from .server import Reply, error_reply
from .sessions import store
from .streams import (CLOSES, DROPPED, POST_STREAMS_ACTIVE, REJECTS, STREAMS_ACTIVE, STREAMS_CAP, get_budget,
                      post_budget, ring_key, rings, wake_group)

log = logging.getLogger("yuzu.mcp")
TICK_SECONDS = 3.0
AUTH_GRACE_SECONDS = 60
GET_PER_PRINCIPAL = 4


def _stream_cap():
    """Held-open GET streams per process (YUZU_MCP_MAX_STREAMS, default 1024): reject, never evict."""
    raw = os.environ.get("YUZU_MCP_MAX_STREAMS", "").strip()
    try:
        cap = int(raw) if raw else 1024
    except ValueError:
        log.warning("YUZU_MCP_MAX_STREAMS=%r is not an integer; using 1024", raw)
        cap = 1024
    return max(1, cap)


GET_GLOBAL = _stream_cap()
STREAMS_CAP.set(GET_GLOBAL)
SHUTDOWN_FLUSH_SECONDS = 0.2  # lets the transport write the shutdown close frames before daphne drops sockets
SHUTDOWN_WAIT_SECONDS = 5.0  # the most a stop waits for this process's streams to say goodbye
SHUTDOWN_REMEDIATION = ("this server process is stopping: reconnect (GET with Last-Event-ID) to another instance, "
                        "or re-initialize; results stay fetchable by execution_id")
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no"), (b"x-content-type-options", b"nosniff")]
CLOSE_ADVICE = {
    "superseded": (None, "another GET took over this session's stream"),
    "session_terminated": (None, "re-initialize"),
    "credential_revoked": (None, "re-authenticate"),
    "auth_unavailable": (STREAM_CAP_RETRY_MS, "retry"),
    "internal_error": (None, "fetch results by execution_id"),
    "cancelled": (None, "fetch by execution_id if you still want it"),
    "cap_expired": (None, "the work continues; fetch by execution_id"),
}
_live = {}  # ring key -> GetStream in this process
_draining = set()  # ring keys whose superseded stream is still closing
_tasks = set()  # background followers (kept referenced until done)
_open = set()  # every held-open stream of this process (GET and streamed POST), for shutdown
_shutdown_hooked = False


def _hook_shutdown():
    """Under daphne, close every live stream with session_terminated BEFORE the reactor drops connections.

    On SIGTERM/SIGINT daphne's "before shutdown" trigger cancels every application instance, and the
    first one to finish releases the reactor to disconnect all sockets at once — so a close frame written
    from a cancelled consumer may never leave the process. This trigger writes the frames and holds the
    shutdown until they are flushed (SHUTDOWN_FLUSH_SECONDS), bounded by SHUTDOWN_WAIT_SECONDS."""
    global _shutdown_hooked
    if _shutdown_hooked:
        return
    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is None or not getattr(reactor, "running", False):
        return  # not served by daphne (e.g. the in-process test communicator): nothing to hook
    _shutdown_hooked = True
    reactor.addSystemEventTrigger("before", "shutdown", _before_shutdown)


def _before_shutdown():
    streams = list(_open)
    if not streams:
        return None
    from twisted.internet.defer import Deferred

    async def close_all():
        tasks = [asyncio.ensure_future(stream.shutdown()) for stream in streams]
        await asyncio.wait(tasks, timeout=SHUTDOWN_WAIT_SECONDS)

    return Deferred.fromFuture(asyncio.ensure_future(close_all()))


def event(eid, frame_json):
    head = f"id: {eid}\n" if eid is not None else ""
    return f"{head}event: message\ndata: {frame_json}\n\n".encode()


def close_frame(reason, remediation=None, **extra):
    retry, advice = CLOSE_ADVICE.get(reason, (None, None))
    remediation = remediation or advice
    params = {"reason": reason, "correlation_id": correlation_id(), "retry_after_ms": retry,
              "remediation": remediation, **extra}
    return rpc.dumps({"jsonrpc": "2.0", "method": "notifications/yuzu.stream_closed", "params": params}).decode()


def _accepts_sse(headers):
    ranges = [part.split(";")[0].strip().lower() for part in headers.get("accept", "").split(",")]
    return "text/event-stream" in ranges


def _last_event_id(headers):
    try:
        return max(0, int(headers.get("last-event-id", "0")))
    except ValueError:
        return 0


async def attach_get(consumer, attach):
    """Open the session's server→client stream (the checks in the seed's order after auth/session)."""
    principal, session = attach.principal, attach.session
    headers = consumer.headers
    if not _accepts_sse(headers):
        return Reply(406, rpc.error_response(None, rpc.RpcError(
            rpc.NOT_ACCEPTABLE, "Not Acceptable: Accept must list text/event-stream")))
    key = ring_key(principal.key, session.id)
    cursor = _last_event_id(headers)
    if key in _draining:
        REJECTS.labels("stream_handover_pending").inc()
        return _cap_reply("stream_handover_pending")
    refusal = get_budget.acquire(principal.key, GET_PER_PRINCIPAL, GET_GLOBAL)
    if refusal is not None:
        REJECTS.labels(refusal).inc()
        return _cap_reply(refusal)
    try:
        stream_tag = await hop(rings().stream_of)(key, cursor) if cursor else "get"
        frames, gap = await hop(rings().read)(key, cursor, stream_tag or "get")
    except Exception:
        get_budget.release(principal.key)
        raise
    if gap:
        get_budget.release(principal.key)
        await hop(_terminate)(principal, session, key)
        return error_reply(None, rpc.RpcError(rpc.UNKNOWN_SESSION, "Replay window exceeded", {
            "correlation_id": correlation_id(), "retry_after_ms": None,
            "remediation": "re-initialize, then fetch results by execution_id"}, http_status=404))
    stream = GetStream(consumer, principal, session, key)
    if stream_tag and stream_tag.startswith("post:"):
        stream.follow = stream_tag  # resuming a streamed POST: its later frames, and its result, come here too
    if key in _live:
        _draining.add(key)  # cleared when the superseded stream has closed
    await consumer.channel_layer.group_send(wake_group(key), {"type": "mcp.superseded", "stream": stream.id})
    await stream.start(frames, cursor, priming=session.protocol_version >= "2025-11-25")
    return None


def _is_response(data):
    """A ring frame carrying a JSON-RPC response (a streamed call's result), not a notification."""
    try:
        frame = json.loads(data)
    except ValueError:
        return False
    return isinstance(frame, dict) and "method" not in frame and "id" in frame


def _cap_reply(reason):
    return Reply(429, rpc.error_response(None, rpc.RpcError(
        rpc.STREAM_CAP, f"stream refused ({reason})",
        {"correlation_id": correlation_id(), "retry_after_ms": STREAM_CAP_RETRY_MS,
         "remediation": "close another stream of this principal, or retry later"})),
        {"Retry-After": str(STREAM_CAP_RETRY_MS // 1000)})


def _terminate(principal, session, key):
    store().delete(session.id, principal.key)
    rings().drop(key)
    audit(principal, "mcp.session.close", "success", target_type="McpSession", target_id=session.id[:8],
          detail="reason=replay_window_exceeded")


def revalidate(principal, session_id):
    """Once a tick, for every held-open stream: the credential still valid (revoked, expired or its owner
    deactivated → credential_revoked; backend unreachable → indeterminate), and the session still alive (this
    also slides its idle expiry). Runs in a worker thread."""
    from django.core.exceptions import ObjectDoesNotExist
    from django.db import DatabaseError

    try:
        token = principal.token
        if token is not None:
            token.refresh_from_db(fields=["revoked_at", "expires_at", "retire_at"])
            if not token.is_live():
                return "credential_revoked"
        user = principal.user
        user.refresh_from_db(fields=["is_active"])
        if not user.is_active:
            return "credential_revoked"
        if store().validate(session_id, principal.key) is None:
            return "session_terminated"
        return "ok"
    except ObjectDoesNotExist:
        return "credential_revoked"
    except (DatabaseError, OSError):
        return "indeterminate"


class CredentialWatch:
    """A stream's tick verdict: None to go on, else the reason to close with. A backend that cannot answer
    is given AUTH_GRACE_SECONDS before the stream closes with auth_unavailable."""

    def __init__(self, principal, session_id):
        self.principal, self.session_id = principal, session_id
        self.failing_since = None

    async def check(self):
        verdict = await hop(revalidate)(self.principal, self.session_id)
        if verdict == "ok":
            self.failing_since = None
            return None
        if verdict == "indeterminate":
            self.failing_since = self.failing_since or time.monotonic()
            return "auth_unavailable" if time.monotonic() - self.failing_since >= AUTH_GRACE_SECONDS else None
        return verdict


class GetStream:
    def __init__(self, consumer, principal, session, key):
        self.consumer, self.principal, self.session, self.key = consumer, principal, session, key
        self.id = secrets.token_hex(8)
        self.last_get = 0  # newest frame id this connection has passed (delivered, or another stream's)
        self.follow = None  # "post:<id>" when this GET resumed a streamed POST, until its result is delivered
        self.closed = False
        self.wrote_since_tick = False
        self.watch = CredentialWatch(principal, session.id)
        self.ticker = None
        self.budget_held = True

    async def start(self, replay, cursor, priming):
        c = self.consumer
        c.stream = self
        _live[self.key] = self  # a superseded stream still draining deregisters itself only if it is current
        _open.add(self)
        _hook_shutdown()
        STREAMS_ACTIVE.inc()
        await c.channel_layer.group_add(wake_group(self.key), await c.open_channel())
        await c.send_headers(status=200, headers=SSE_HEADERS + [(b"x-correlation-id", correlation_id().encode())])
        self.last_get = max([cursor] + [eid for eid, _, _ in replay])
        if priming:  # the position before the replay, so a resume from it loses nothing
            await self.write(f"id: {cursor}\ndata: \n\n".encode())
        for eid, stream, data in replay:
            await self.deliver(eid, stream, data)
        await hop(audit)(self.principal, "mcp.stream.attach", "success", target_type="McpSession",
                         target_id=self.session.id[:8])
        self.ticker = asyncio.ensure_future(self._tick_loop())
        await self.on_wake()

    async def _tick_loop(self):
        try:
            while not self.closed:
                await asyncio.sleep(TICK_SECONDS)
                await self.consumer.channel_layer.send(self.consumer.channel_name, {"type": "mcp.tick"})
        except asyncio.CancelledError:
            pass

    async def write(self, data):
        try:
            await self.consumer.send_body(data, more_body=True)
            self.wrote_since_tick = True
            return True
        except Exception:
            DROPPED.inc()
            return False

    async def on_wake(self):
        if self.closed:
            return
        frames, gap = await hop(rings().read)(self.key, self.last_get, None if self.follow else "get")
        for eid, stream, data in frames:
            if stream == "get" or stream == self.follow:
                await self.deliver(eid, stream, data)
            self.last_get = max(self.last_get, eid)

    async def deliver(self, eid, stream, data):
        """Write one ring frame. The result of a resumed streamed POST is this resume's to release: once it
        is on the wire its pin is dropped and the channel goes back to carrying only GET frames."""
        ok = await self.write(event(eid, data))
        if stream != "get" and stream == self.follow and _is_response(data):
            self.follow = None
            if ok:
                await hop(rings().unpin)(self.key, eid)

    async def on_tick(self):
        if self.closed:
            return
        reason = await self.watch.check()
        if reason is not None:
            return await self.close(reason)
        if not self.wrote_since_tick:
            await self.write(b": heartbeat\n\n")
        self.wrote_since_tick = False

    async def close(self, reason):
        if self.closed:
            return
        self.closed = True
        CLOSES.labels(reason).inc()
        await self.write(event(None, close_frame(reason)))
        try:
            await self.consumer.send_body(b"", more_body=False)
        except Exception:
            pass
        await self._release()
        self.consumer.stream = None
        # End the consumer from its own dispatch loop (this may run on another consumer's takeover).
        await self.consumer.channel_layer.send(self.consumer.channel_name, {"type": "mcp.stopped"})

    async def shutdown(self):
        """This process is stopping (daphne cancels every application instance): write the close frame
        before the connection drops, so the client learns why instead of seeing a truncated stream."""
        if self.closed:
            return
        self.closed = True
        CLOSES.labels("session_terminated").inc()
        await self.write(event(None, close_frame("session_terminated", SHUTDOWN_REMEDIATION)))
        try:
            await self.consumer.send_body(b"", more_body=False)
        except Exception:
            pass
        await asyncio.sleep(SHUTDOWN_FLUSH_SECONDS)
        await self._release()
        self.consumer.stream = None

    async def gone(self):
        if not self.closed:
            self.closed = True
            CLOSES.labels("client_disconnect").inc()
            await self._release()
            self.consumer.stream = None

    async def _release(self):
        if self.ticker is not None:
            self.ticker.cancel()
        if self.budget_held:
            self.budget_held = False
            get_budget.release(self.principal.key)
            STREAMS_ACTIVE.dec()
        _open.discard(self)
        if _live.get(self.key) is self:
            del _live[self.key]
        _draining.discard(self.key)
        try:
            await self.consumer.channel_layer.group_discard(wake_group(self.key), self.consumer.channel_name)
        except Exception:
            pass
        await hop(audit)(self.principal, "mcp.stream.close", "success", target_type="McpSession",
                         target_id=self.session.id[:8])


async def streamed_post(consumer, reply):
    """The POST response is the SSE stream: progress frames, then the JSON-RPC result, then EOF.

    The follower runs as its own task, not inside the consumer's request handler, so the consumer keeps
    reading its ASGI input: a peer that goes away is noticed (http.disconnect) instead of every later
    write vanishing silently into a closed connection and being counted as delivered. The follower
    outlives the connection: what it reports after the drop is committed to the ring (the result
    pinned) for a GET resume with Last-Event-ID, on any process."""
    ctx = reply.ctx
    key = ctx.extra["admitted"]
    handed_off = False
    try:
        if ctx.following is None or "error" in (reply.body or {}):
            return reply  # nothing to follow (e.g. no agents reached): the plain response
        try:
            await consumer.send_headers(status=200, headers=SSE_HEADERS + [(b"x-correlation-id", ctx.cid.encode())])
            if ctx.extra.get("protocol_version", "") >= "2025-11-25":
                await consumer.send_body(b"id: 0\ndata: \n\n", more_body=True)
        except Exception:
            return None
        post = PostStream(consumer, ctx, key)
        consumer.stream = post
        task = asyncio.ensure_future(post.run())
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)
        handed_off = True
        return None
    finally:
        if not handed_off:
            release_record(key, ctx.request_id)
            post_budget.release(ctx.principal.key)


class PostStream:
    """One streamed POST response: its wire, its lease on the POST budget, and the follower feeding it."""

    def __init__(self, consumer, ctx, key):
        self.consumer, self.ctx, self.key = consumer, ctx, key
        self.id = None  # never a GET stream's id (takeover messages do not concern a POST response)
        self.wire_open = True
        self.leased = True
        POST_STREAMS_ACTIVE.inc()
        _open.add(self)
        _hook_shutdown()
        self.follower = Follower(key=key, request_id=ctx.request_id, token=ctx.progress_token, spec=ctx.following,
                                 mode="post", stream_tag=f"post:{ctx.request_id}", tool_result=tool_result,
                                 writer=self.write_frame)
        self.watch = CredentialWatch(ctx.principal, ctx.session_id)

    async def write_frame(self, eid, frame):
        if not self.wire_open:
            return False
        try:
            await self.consumer.send_body(event(eid, rpc.dumps(frame).decode()), more_body=True)
            return True
        except Exception:
            self.wire_open = False
            DROPPED.inc()
            return False

    def _close_extra(self):
        eid = self.ctx.following.meta.get("yuzu.execution_id")
        return {"execution_id": eid, "partial": True} if eid else {}

    async def _tick_loop(self):
        """The GET stream's re-validation, on the same tick: a credential revoked (or a session ended) while the
        call streams stops the follower, and the response closes with that reason."""
        try:
            while self.follower.closed is None:
                await asyncio.sleep(TICK_SECONDS)
                reason = await self.watch.check()
                if reason is not None:
                    self.follower.detach(reason)
                    return
        except asyncio.CancelledError:
            pass

    async def run(self):
        ticker = asyncio.ensure_future(self._tick_loop())
        try:
            try:
                reason = await self.follower.run()
            except Exception:
                log.exception("streamed POST failed after dispatch (%s)", self.ctx.cid)
                reason = "internal_error"
            if self.wire_open:
                self.wire_open = False
                CLOSES.labels(reason).inc()
                try:
                    if reason != "completed":
                        await self.consumer.send_body(event(None, close_frame(reason, **self._close_extra())),
                                                      more_body=True)
                    await self.consumer.send_body(b"", more_body=False)
                except Exception:
                    pass
                if self.consumer.stream is self:
                    self.consumer.stream = None
                    self.consumer.stop_soon()
        finally:
            ticker.cancel()
            release_record(self.key, self.ctx.request_id)
            self._release_lease()

    def _release_lease(self):
        _open.discard(self)
        if self.leased:
            self.leased = False
            post_budget.release(self.ctx.principal.key)
            POST_STREAMS_ACTIVE.dec()

    async def gone(self):
        """The peer went away (http.disconnect). The response is over, so is its lease; the follower carries
        on ring-only until the work settles, so a GET resume can still collect the pinned result."""
        if self.wire_open:
            self.wire_open = False
            CLOSES.labels("client_disconnect").inc()
        self._release_lease()
        if self.consumer.stream is self:
            self.consumer.stream = None

    async def shutdown(self):
        """This process is stopping: tell the client before the connection drops (the work continues)."""
        if not self.wire_open:
            return
        self.wire_open = False
        CLOSES.labels("session_terminated").inc()
        try:
            await self.consumer.send_body(event(None, close_frame("session_terminated", SHUTDOWN_REMEDIATION,
                                                                  **self._close_extra())), more_body=True)
            await self.consumer.send_body(b"", more_body=False)
        except Exception:
            pass
        await asyncio.sleep(SHUTDOWN_FLUSH_SECONDS)
        self._release_lease()
        self.consumer.stream = None

    async def on_wake(self):  # a POST response is fed by its follower, not by ring wake-ups
        return None

    async def on_tick(self):  # its own tick loop re-validates (a plain POST opens no channel to be ticked on)
        return None

    async def close(self, reason):
        return None


def follow_on_get_channel(reply):
    """Token without an SSE Accept: the plain response now, progress frames on the session's GET channel."""
    ctx = reply.ctx
    key = ring_key(ctx.principal.key, ctx.session_id)
    if admit_record(key, ctx.request_id) is not None:
        from .streams import REJECTS as _r

        _r.labels("get_progress_degraded").inc()
        return
    follower = Follower(key=key, request_id=ctx.request_id, token=ctx.progress_token, spec=ctx.following,
                        mode="get", stream_tag="get", tool_result=tool_result)
    task = asyncio.ensure_future(follower.run())
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)

