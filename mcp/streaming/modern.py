"""The held-open responses of modern (2026-07-28) requests: a streamed tools/call and subscriptions/listen.

No session, no ring, no event ids, no resumption: a frame is written to the response or not at all.

- **Streamed tools/call** (a progress tool, a progressToken, an SSE Accept): ``notifications/progress`` frames as
  the handshake era gets them, then the result, then EOF. Whatever ends the response ends it with a JSON-RPC
  response — a client whose stream ends without one re-issues the call, which for fleet work would run it
  twice. At the 120 s cap that response is a success-shaped result carrying ``execution_id`` and the
  execution's state so far (``still_running``: poll get_execution_status); on a revoked credential or a
  stopping server, an error naming ``execution_id``. The client closing the response cancels the *request*:
  reporting stops and the drop is audited, but fleet work already dispatched continues.
- **subscriptions/listen**: the acknowledgement first (honouring ``toolsListChanged``, and ``taskIds`` — the
  caller's own tasks — for a client that declares the tasks extension), then
  ``notifications/tools/list_changed`` when a role change alters what the token is listed,
  ``notifications/tasks`` (the tasks/get shape) when a followed task's work moves, a heartbeat comment on
  every tick (the credential re-validated each time), and a graceful ``{"resultType": "complete"}`` result when the
  server ends it (revocation, shutdown). It counts against the GET stream budget (4 per principal; 429 ``-32012``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from channels.layers import BaseChannelLayer

from yuzu.audit import audit
from yuzu.errors import correlation_id
from yuzu.jsondata import JsonObject
from yuzu.rbac import Principal

from .. import jsonrpc as rpc
from .. import tasks
from ..context import FollowSpec, ToolContext
from ..jsonrpc import RequestId
from ..listing import fingerprint, tools_for
from ..pipeline import hop, tool_result
from ..registry import catalogue
from .admission import admit_get, post_budget, release_get, release_record
from .follower import Follower, spawn
from .metrics import CLOSES, DROPPED, STREAMS_ACTIVE
from .post_stream import PostStream
from .shutdown import SHUTDOWN_FLUSH_SECONDS, track, untrack
from .stream import SSE_HEADERS, Connection, Message
from .wake import channel_layer, listen_group
from .watch import CredentialWatch, every_tick

if TYPE_CHECKING:
    from ..server import Reply

log = logging.getLogger("yuzu.mcp")

#: result → the modern result shape (mcp.modern.stamp, bound to the call's method and catalogue)
Stamp = Callable[[JsonObject], JsonObject]
HEARTBEAT = b": heartbeat\n\n"
CAP_NOTE = ("the 120 s response cap elapsed; the execution continues on the agents: poll get_execution_status "
            "with execution_id (do not re-send this call)")


def frame(obj: JsonObject) -> bytes:
    return b"event: message\ndata: " + rpc.dumps(obj) + b"\n\n"


async def respond_streamed(conn: Connection, reply: Reply, ctx: ToolContext, stamp: Stamp) -> Reply | None:
    """Answer an admitted modern call: its SSE response when there is work to follow, else ``reply`` itself."""
    key = ctx.extra.get("admitted", "")
    spec = ctx.following
    if spec is None or "error" in (reply.body or {}):
        _release(ctx, key)
        return reply
    try:
        await conn.send_headers(status=200, headers=SSE_HEADERS + [(b"x-correlation-id", ctx.cid.encode())])
    except Exception:
        _release(ctx, key)
        return None
    post = ModernPostStream(conn, ctx, key, spec, stamp)
    conn.stream = post
    spawn(post.run())
    return None


def _release(ctx: ToolContext, key: str) -> None:
    release_record(key, ctx.request_id)
    post_budget.release(ctx.principal.key)


class _WireFollower(Follower):
    """A follower whose frames go to the response only (a modern request has no ring to resume from)."""

    adoptable = False  # nothing to resume from, so nothing for another process to adopt

    async def _emit(self, frame: JsonObject, pin: bool = False) -> None:
        if self.writer is not None:
            await self.writer(0, frame)


class ModernPostStream(PostStream):
    """One modern streamed tools/call: the handshake era's streamed POST (mcp.streaming.post_stream.PostStream —
    its wire, its POST-budget lease, the follower feeding it, the tick) with the 2026-07-28 hooks: no ring and no
    event ids, the result stamped, heartbeat comments, a last word that is always a JSON-RPC response, and a drop
    that cancels the request (audited) but never the dispatched work."""

    def __init__(self, conn: Connection, ctx: ToolContext, key: str, spec: FollowSpec, stamp: Stamp) -> None:
        self.stamp = stamp
        self.answered = False
        super().__init__(conn, ctx, key, spec)

    @property
    def execution_id(self) -> object:
        return self.spec.meta.get("yuzu.execution_id")

    def _follower(self) -> Follower:
        return _WireFollower(key=self.key, request_id=self.ctx.request_id, token=self.ctx.progress_token,
                             spec=self.spec, mode="post", stream_tag="modern", writer=self.write_frame)

    def _watch(self) -> CredentialWatch:
        return CredentialWatch(self.ctx.principal, "")

    def _encode(self, eid: int, obj: JsonObject) -> bytes:
        if "result" in obj:
            obj = {**obj, "result": self.stamp(obj["result"])}
            self.answered = True
        return frame(obj)

    async def _beat(self) -> None:
        if self.wire_open:
            try:
                await self.conn.send_body(HEARTBEAT, more_body=True)
            except Exception:
                self.wire_open = False

    async def _last_word(self, reason: str) -> None:
        """Never end without a response: the client would re-issue the call."""
        if self.answered:
            return
        if reason == "cap_expired":
            try:
                final = await hop(self.spec.final)()
            except Exception:
                final = {"execution_id": self.execution_id}
            result = tool_result({**final, "still_running": final.get("status") not in ("succeeded", "completed",
                                                                                        "failed", "cancelled"),
                                  "note": CAP_NOTE})
            await self.write_frame(0, {"jsonrpc": "2.0", "id": self.ctx.request_id, "result": result})
            return
        code, message = {
            "credential_revoked": (rpc.UNAUTHORIZED, "the credential was revoked while the call streamed"),
            "auth_unavailable": (rpc.INTERNAL_ERROR, "the credential could not be checked"),
        }.get(reason, (rpc.INTERNAL_ERROR, f"the response ended early ({reason})"))
        err = rpc.RpcError(code, message, {"correlation_id": correlation_id(), "execution_id": self.execution_id,
                                           "remediation": "the work continues: fetch it by execution_id with "
                                                          "get_execution_status; do not re-send this call"})
        await self.conn.send_body(frame(rpc.error_response(self.ctx.request_id, err)), more_body=True)

    async def _farewell(self) -> None:
        await self._last_word("server_stopping")

    async def _dropped(self) -> None:
        """Closing the response cancels the request — reporting stops, the drop is audited — never the fleet
        work it dispatched."""
        self.follower.detach("client_disconnect")
        await hop(audit)(self.ctx.principal, f"mcp.{self.ctx.tool}", "cancelled", target_type="mcp_tool",
                         target_id=self.ctx.tool, detail=f"client_disconnect execution_id={self.execution_id} "
                                                         "(dispatched work continues)", correlation_id=self.ctx.cid)


# --- subscriptions/listen ----------------------------------------------------------------------------------

async def listen(conn: Connection, principal: Principal, request_id: RequestId, meta: JsonObject,
                 streaming: bool, wanted: JsonObject, cat_name: str,
                 followed: dict[str, list[str]] | None = None) -> None:
    """Open a listen stream on ``conn``, or raise the refusal (406 without an SSE Accept, 429 at the cap).
    ``wanted``: the request's ``notifications`` filter; ``followed``: the task ids of it this caller may follow
    (mcp.tasks.followable), each with its work's channel-layer groups."""
    ranges = [part.split(";")[0].strip().lower() for part in conn.headers.get("accept", "").split(",")]
    if "text/event-stream" not in ranges:
        raise rpc.RpcError(rpc.NOT_ACCEPTABLE, "Not Acceptable: subscriptions/listen needs Accept: text/event-stream",
                           http_status=406)
    admit_get(principal.key, handover_pending=False)
    stream = ListenStream(conn, principal, request_id, meta, cat_name,
                          tools_changed=wanted.get("toolsListChanged") is True and streaming,
                          followed=followed if streaming else None)
    try:
        if stream.tools_changed or stream.followed:
            await stream.subscribe()
        await conn.send_headers(status=200, headers=SSE_HEADERS + [(b"x-correlation-id", correlation_id().encode())])
        await conn.send_body(frame(stream.acknowledgement()), more_body=True)
        for task_id in list(stream.followed):  # where each task stands now: an end before this stream opened too
            await stream.task_changed(task_id)
    except Exception:
        await stream.unsubscribe()
        stream.release()
        return
    if not streaming:  # YUZU_MCP_NO_STREAMING: the acknowledgement, the graceful end, at once
        await stream.end("streaming_off")
        return
    conn.stream = stream
    stream.ticker = every_tick(stream.tick)


def _listed(principal: Principal, cat_name: str) -> str:
    """What the token is listed now: re-read (a Principal caches its grants), "" for a token gone."""
    fresh = Principal.from_key(principal.key)
    return fingerprint(cat_name, tools_for(fresh, catalogue(cat_name))) if fresh is not None else ""


def _task_notification(principal: Principal, cat_name: str, task_id: str) -> JsonObject | None:
    return tasks.notification(ToolContext(principal=principal, cid=correlation_id(), catalogue=cat_name), task_id)


class ListenStream:
    """One subscriptions/listen response. Honoured: ``toolsListChanged`` (a role change that alters what the
    token is listed) and, for a client that declares the tasks extension, ``taskIds`` — the caller's own tasks,
    each reported as ``notifications/tasks`` (the tasks/get shape) when it is followed and whenever its work
    announces a change of state or count, until it ends. Every other type is left out of the acknowledgement and
    never sent. Heartbeats carry it until it ends."""

    def __init__(self, conn: Connection, principal: Principal, request_id: RequestId, meta: JsonObject,
                 cat_name: str = "v1", tools_changed: bool = False,
                 followed: dict[str, list[str]] | None = None) -> None:
        self.conn, self.principal, self.request_id, self.meta = conn, principal, request_id, meta
        self.cat_name, self.tools_changed = cat_name, tools_changed
        self.followed: dict[str, list[str]] = dict(followed or {})  # task id → its work's groups (while live)
        self.acknowledged_tasks = list(self.followed)
        self.task_seen: dict[str, tuple[object, object]] = {}  # task id → (status, statusMessage) last sent
        self.rechecking = self.recheck_again = False
        self.open = True
        self.leased = True
        self.ticker: asyncio.Future[None] | None = None
        self.watch = CredentialWatch(principal, "")
        self.layer: BaseChannelLayer | None = None
        self.channel: str | None = None
        self.listed = ""
        STREAMS_ACTIVE.inc()
        track(self)

    def acknowledgement(self) -> JsonObject:
        honoured: JsonObject = {"toolsListChanged": True} if self.tools_changed else {}
        if self.acknowledged_tasks:
            honoured["taskIds"] = list(self.acknowledged_tasks)
        return {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                "params": {"notifications": honoured, "_meta": dict(self.meta)}}

    async def subscribe(self) -> None:
        """Join the user's listen group (role changes, in any process) and remember what the token is listed;
        join the groups of the followed tasks' work."""
        self.layer = channel_layer()
        self.channel = await self.layer.new_channel()
        self.conn.listen(functools.partial(self._receive, self.layer, self.channel))
        if self.tools_changed:
            self.listed = await hop(_listed)(self.principal, self.cat_name)
            await self.layer.group_add(listen_group(self.principal.user.pk), self.channel)
        for group in {g for groups in self.followed.values() for g in groups}:
            await self.layer.group_add(group, self.channel)

    @staticmethod
    async def _receive(layer: BaseChannelLayer, channel: str) -> Message:
        """The next message of this stream's channel, for the connection's dispatch loop (which hands a stream
        ``mcp.*`` messages only): an app's announcement on a followed task's group is one ``mcp.task_event``."""
        message = await layer.receive(channel)
        return message if str(message.get("type", "")).startswith("mcp.") else {"type": "mcp.task_event"}

    async def unsubscribe(self) -> None:
        if self.layer is not None and self.channel is not None:
            channel, self.channel = self.channel, None
            if self.tools_changed:
                await self.layer.group_discard(listen_group(self.principal.user.pk), channel)
            for group in {g for groups in self.followed.values() for g in groups}:
                await self.layer.group_discard(group, channel)

    async def tasks_changed(self) -> None:
        """Re-read the followed tasks; announcements arriving meanwhile fold into one more pass."""
        if self.rechecking:
            self.recheck_again = True
            return
        self.rechecking = True
        try:
            while True:
                self.recheck_again = False
                for task_id in list(self.followed):
                    await self.task_changed(task_id)
                if not self.recheck_again:
                    return
        finally:
            self.rechecking = False

    async def task_changed(self, task_id: str) -> None:
        """Report a followed task if its status or message moved; stop following it once it has ended (or the
        caller may no longer read it)."""
        if not self.open or task_id not in self.followed:
            return
        task = await hop(_task_notification)(self.principal, self.cat_name, task_id)
        if task is None or task.get("status") != "working":
            groups = self.followed.pop(task_id)
            still = {g for gs in self.followed.values() for g in gs}
            if self.layer is not None and self.channel is not None:
                for group in set(groups) - still:
                    await self.layer.group_discard(group, self.channel)
        if task is None:
            return
        seen = (task.get("status"), task.get("statusMessage"))
        if self.task_seen.get(task_id) == seen:
            return
        self.task_seen[task_id] = seen
        try:
            await self.conn.send_body(frame({"jsonrpc": "2.0", "method": "notifications/tasks",
                                             "params": {**task, "_meta": dict(self.meta)}}), more_body=True)
        except Exception:
            self.open = False

    async def on_message(self, message: Message) -> None:
        if message.get("type") == "mcp.task_event":  # an announcement on a followed task's group
            await self.tasks_changed()
            return
        if message.get("type") != "mcp.rbac_changed" or not self.open or not self.tools_changed:
            return
        try:
            now = await hop(_listed)(self.principal, self.cat_name)
        except Exception:  # e.g. a token revoked meanwhile: the tick ends the stream
            return
        if now == self.listed:
            return
        self.listed = now
        try:
            await self.conn.send_body(frame({"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
                                             "params": {"_meta": dict(self.meta)}}), more_body=True)
        except Exception:
            self.open = False

    async def tick(self) -> bool:
        if not self.open:
            return False
        reason = await self.watch.check()
        if reason is not None:
            await self.end(reason)
            return False
        try:
            await self.conn.send_body(HEARTBEAT, more_body=True)
        except Exception:
            self.open = False
            DROPPED.inc()
            return False
        return True

    async def end(self, reason: str) -> None:
        """The server ends the subscription: the graceful result, then EOF."""
        if self.open:
            self.open = False
            CLOSES.labels(reason).inc()
            try:
                await self.conn.send_body(frame(rpc.result_response(self.request_id, {
                    "resultType": "complete", "_meta": dict(self.meta)})), more_body=True)
                await self.conn.send_body(b"", more_body=False)
            except Exception:
                pass
        await self.unsubscribe()
        self.release()
        if self.conn.stream is self:
            self.conn.stream = None
            self.conn.post({"type": "mcp.stopped"})

    def release(self) -> None:
        untrack(self)
        if self.ticker is not None:
            self.ticker.cancel()
        if self.leased:
            self.leased = False
            release_get(self.principal.key)
            STREAMS_ACTIVE.dec()

    async def gone(self) -> None:
        if self.open:
            self.open = False
            CLOSES.labels("client_disconnect").inc()
        await self.unsubscribe()
        self.release()
        if self.conn.stream is self:
            self.conn.stream = None

    async def shutdown(self) -> None:
        await self.end("session_terminated")
        await asyncio.sleep(SHUTDOWN_FLUSH_SECONDS)
