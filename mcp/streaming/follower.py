"""Progress reporting: a tools/call carrying ``_meta.progressToken`` is correlated to the work it started
(a channel-layer group announcing changes, declared by the tool through ``ToolContext.follow``), and a
follower turns that work's state into notifications/progress frames — an immediate 0/N, then strictly
increasing (a watermark suppresses non-advancing snapshots), then, for a streamed POST, the JSON-RPC result
last. Every frame is committed to the session's replay ring first.

Closing a response never cancels work: a follower detached by notifications/cancelled, a dropped
connection or the 120 s cap stops *reporting*, never the fleet command.
"""

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal

from channels.layers import BaseChannelLayer

from yuzu.jsondata import JsonObject

from ..context import FOLLOW_RECIPES, FollowSpec, ToolContext
from ..jsonrpc import RequestId
from ..pipeline import hop, tool_result
from .admission import admit_record, follower_of, hold_record, reject, release_record
from .handover import FollowRecord, handovers
from .metrics import ADOPTIONS, CANCELS, PROGRESS_SUPPRESSED
from .ring import ring_key, rings
from .wake import awake, channel_layer, wake, wake_group

log = logging.getLogger("yuzu.mcp")

RESPONSE_CAP_SECONDS = 120
SNAPSHOT_EVERY = 2.0

_tasks: set[asyncio.Future[Any]] = set()  # followers running in the background (kept referenced until done)
#: writer(eid, frame) -> whether the frame got onto the live response
Writer = Callable[[int, JsonObject], Awaitable[bool]]


def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
    task = asyncio.ensure_future(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return task


class Follower:
    """Follows one call's work (``spec``, a mcp.context.FollowSpec) for the session's ring ``key``. Mode
    "post" ends with the result frame (pinned); mode "get" reports progress only. ``writer(eid, frame)``,
    when given, also puts each frame on a live response and says whether it got there."""

    adoptable = True  # a streamed POST's follow (with a recipe) is recorded for another process to adopt

    def __init__(self, *, key: str, request_id: RequestId, token: str | int | None, spec: FollowSpec,
                 mode: Literal["post", "get"], stream_tag: str, writer: Writer | None = None,
                 adopted: FollowRecord | None = None, lease_owner: str | None = None, watermark: int = 0) -> None:
        self.key, self.request_id, self.token, self.spec = key, request_id, token, spec
        self.mode, self.stream_tag, self.writer = mode, stream_tag, writer
        self.watermark = watermark  # the progress last reported (the first snapshot reports 0 whatever it says)
        self.closed: str | None = None  # close reason once settled
        self.done = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        # A streamed POST's follow with a recipe is recorded and leased, so another process can adopt it if this
        # one dies (mcp.streaming.handover); an adopted follow goes on from where the dead process left it.
        self.adopted = adopted is not None
        self.lease_owner = lease_owner or (secrets.token_hex(8) if self.adoptable and mode == "post" and spec.resume
                                           else None)
        self.record: FollowRecord | None = adopted
        hold_record(key, request_id, self)

    def detach(self, reason: str) -> None:
        """Stop reporting. Thread-safe: notifications/cancelled arrives in a worker thread (mcp.server)."""
        if self.closed is None:
            self.closed = reason
            self._loop.call_soon_threadsafe(self.done.set)

    async def run(self) -> str:
        """Report until the work settles or the follower is detached; → the close reason."""
        layer = channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(self.spec.group, channel)
        await layer.group_add(wake_group(self.key), channel)
        deadline = time.monotonic() + RESPONSE_CAP_SECONDS
        settled = False
        try:
            if self.lease_owner is not None:
                if self.record is None and self.spec.resume is not None:
                    self.record = {"recipe": self.spec.resume[0], "args": self.spec.resume[1],
                                   "request_id": self.request_id, "token": self.token,
                                   "deadline": time.time() + RESPONSE_CAP_SECONDS}
                    await hop(handovers().record)(self.key, self.stream_tag, self.record)
                    await hop(handovers().claim)(self.key, self.stream_tag, self.lease_owner)
                if self.record is not None:  # an adopted follow keeps the cap its call started with
                    deadline = time.monotonic() + (self.record["deadline"] - time.time())
            if await self._advance(first=not self.adopted):
                settled = True
                return "completed"
            renewed = time.monotonic()
            while self.closed is None:
                if self.lease_owner is not None and time.monotonic() - renewed >= SNAPSHOT_EVERY:
                    if not await hop(handovers().claim)(self.key, self.stream_tag, self.lease_owner):
                        self.detach("handed_over")  # this process stalled past its lease: another reports it now
                        break
                    renewed = time.monotonic()
                left = deadline - time.monotonic()
                if left <= 0:
                    await self._advance()  # one more drain pass, then settle
                    settled = True
                    return self.closed or "cap_expired"
                try:
                    msg = await asyncio.wait_for(self._next(layer, channel), min(left, SNAPSHOT_EVERY))
                except TimeoutError:
                    msg = None
                if self.closed is not None:
                    break
                if msg and msg.get("type") == "mcp.cancel" and msg.get("request_id") == self.request_id:
                    self.detach("cancelled")
                    break
                if msg and msg.get("type") == "mcp.close":
                    self.detach(msg.get("reason", "session_terminated"))
                    break
                if await self._advance():
                    settled = True
                    return "completed"
            assert self.closed is not None  # every way out of the loop settled it
            settled = self.closed != "handed_over"
            return self.closed
        finally:
            await layer.group_discard(self.spec.group, channel)
            await layer.group_discard(wake_group(self.key), channel)
            release_record(self.key, self.request_id)
            if self.lease_owner is not None:
                await asyncio.shield(self._let_go(settled))

    async def _let_go(self, settled: bool) -> None:
        """Give the lease back; once the follow has settled (result committed, cap, cancel) forget its record —
        nothing is left to adopt. A follower cancelled before it settled keeps the record: a resume on another
        process adopts the follow at once instead of after the lease would have run out."""
        assert self.lease_owner is not None
        try:
            if settled:
                await hop(handovers().forget)(self.key, self.stream_tag)
            await hop(handovers().release)(self.key, self.stream_tag, self.lease_owner)
        except Exception:  # the store is away: the lease runs out by itself, the record with the ring
            log.warning("could not release the follow lease of %s", self.stream_tag, exc_info=True)

    async def _next(self, layer: BaseChannelLayer, channel: str) -> JsonObject | None:
        done = asyncio.ensure_future(self.done.wait())
        recv = asyncio.ensure_future(layer.receive(channel))
        finished, pending = await asyncio.wait({done, recv}, return_when=asyncio.FIRST_COMPLETED)
        for p in pending:
            p.cancel()
        return recv.result() if recv in finished else None

    async def _advance(self, first: bool = False) -> bool:
        """Read the current state; emit progress only if it advanced; emit the final when terminal."""
        progress, total, terminal = await hop(self.spec.snapshot)()
        if first:  # an immediate 0/N, so the client knows the total at once
            self.watermark = 0
            await self._emit(self._progress_frame(0, total))
        if progress > self.watermark:
            self.watermark = progress
            await self._emit(self._progress_frame(progress, total))
        elif not first:
            PROGRESS_SUPPRESSED.inc()
        if not terminal:
            return False
        if self.mode == "post":
            final = await hop(self.spec.final)()
            await self._emit({"jsonrpc": "2.0", "id": self.request_id, "result": tool_result(final)}, pin=True)
        self.closed = "completed"
        return True

    def _progress_frame(self, progress: int, total: int) -> JsonObject:
        params: JsonObject = {"progressToken": self.token, "progress": progress, "total": total,
                  "_meta": dict(self.spec.meta)}
        if self.spec.message:
            params["message"] = self.spec.message
        return {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}

    async def _emit(self, frame: JsonObject, pin: bool = False) -> None:
        eid = await hop(rings().append)(self.key, frame, self.stream_tag, pin)
        if self.writer is not None:
            delivered = await self.writer(eid, frame)
            if delivered and pin:
                await hop(rings().unpin)(self.key, eid)
            elif not delivered:  # the POST's wire is gone: a GET that resumed this stream (any process) reads it
                await awake(self.key)
        else:  # the GET channel's progress, or an adopted follow (ring-only): the session's GET stream reads it
            await awake(self.key)


def follow_on_get_channel(ctx: ToolContext, spec: FollowSpec) -> None:
    """A progressToken without an SSE Accept: the plain response goes now; the progress frames go to the
    session's GET channel (through the ring). At the record cap the call simply reports no progress."""
    key = ring_key(ctx.principal.key, ctx.session_id)
    if admit_record(key, ctx.request_id, ctx.principal.key) is not None:
        reject("get_progress_degraded")
        return
    follower = Follower(key=key, request_id=ctx.request_id, token=ctx.progress_token, spec=spec, mode="get",
                        stream_tag="get")
    spawn(follower.run())


async def adopt(key: str, stream: str, principal_key: str) -> bool:
    """A GET stream that resumed the streamed POST ``stream`` ("post:<id>") has its result still to come: if the
    process following that call is gone (its lease ran out: SIGKILL, OOM, a lost host), follow it from here —
    rebuilt from its record, ring-only, from the progress the ring already holds, its record counted against the
    session's principal (``principal_key``). → whether it was adopted."""
    rec = await hop(handovers().record_of)(key, stream)
    build = FOLLOW_RECIPES.get(rec["recipe"]) if rec is not None else None
    if rec is None or build is None:
        return False
    owner = secrets.token_hex(8)
    if not await hop(handovers().claim)(key, stream, owner):
        return False  # its follower is alive (here or elsewhere), or another process adopted it first
    if admit_record(key, rec["request_id"], principal_key) is not None:
        # at the record cap: the lease runs out, a later tick retries
        await hop(handovers().release)(key, stream, owner)
        return False
    frames, _ = await hop(rings().read)(key, 0, stream)
    watermark = 0
    for _, _, data in frames:
        frame = json.loads(data)
        if frame.get("method") == "notifications/progress":
            watermark = max(watermark, int(frame["params"].get("progress") or 0))
    follower = Follower(key=key, request_id=rec["request_id"], token=rec["token"], spec=build(rec["args"]),
                        mode="post", stream_tag=stream, adopted=rec, lease_owner=owner, watermark=watermark)
    ADOPTIONS.inc()
    log.warning("adopted the follow of streamed call %s: the process that followed it stopped renewing its lease",
                stream)
    spawn(follower.run())
    return True


def cancel(key: str, request_id: object) -> None:
    """notifications/cancelled: detach the named request's stream, never its work — here if its follower
    runs in this process, else in whichever process does (through the session's group)."""
    if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
        CANCELS.labels("noop").inc()
        return
    follower = follower_of(key, request_id)
    if follower is not None:
        follower.detach("cancelled")
        CANCELS.labels("detached").inc()
    else:
        wake(key, {"type": "mcp.cancel", "request_id": request_id})
        CANCELS.labels("accepted").inc()
