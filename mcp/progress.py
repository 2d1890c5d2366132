"""The progress bridge: a tools/call carrying _meta.progressToken is correlated to the work it started
(a channel-layer group of events), and those events become notifications/progress frames — an
immediate 0/N, then strictly increasing (a watermark suppresses non-advancing snapshots), then, for a
streamed POST, the JSON-RPC result last. Every frame is committed to the session's replay ring first.

Closing a response never cancels work: a follower detached by notifications/cancelled, a dropped
connection or the 120 s cap stops *reporting*, never the fleet command.
"""

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from channels.layers import get_channel_layer

from .pipeline import hop
from .streams import PROGRESS_SUPPRESSED, RECORDS_ACTIVE, REJECTS, awake, rings, wake_group

log = logging.getLogger("yuzu.mcp")
RESPONSE_CAP_SECONDS = 120
RECORD_CAP = 256
SNAPSHOT_EVERY = 2.0


@dataclass
class FollowSpec:
    """What a tool handler asks to follow (set through ToolContext.follow)."""

    group: str  # channel-layer group whose messages announce a change
    snapshot: object  # sync () -> (progress, total, terminal)
    final: object  # sync () -> structured result for the final frame
    meta: dict
    message: str = ""


_lock = threading.Lock()
_records = {}  # (ring_key, request_id) -> Follower


def admit_record(key, request_id):
    """Reserve a record before any work exists. Returns a refusal reason or None."""
    with _lock:
        if (key, request_id) in _records:
            return "duplicate_request_id"
        if len(_records) >= RECORD_CAP:
            return "post_record_cap"
        _records[(key, request_id)] = None
        RECORDS_ACTIVE.set(len(_records))
        return None


def release_record(key, request_id):
    with _lock:
        _records.pop((key, request_id), None)
        RECORDS_ACTIVE.set(len(_records))


def inflight(key):
    with _lock:
        return sum(1 for k, _ in _records if k == key)


def detach(key, request_id):
    """notifications/cancelled in this process: True if a live follower was detached."""
    with _lock:
        follower = _records.get((key, request_id))
    if follower is None:
        return False
    follower.detach("cancelled")
    return True


class Follower:
    def __init__(self, *, key, request_id, token, spec, mode, stream_tag, tool_result, writer=None):
        self.key, self.request_id, self.token, self.spec = key, request_id, token, spec
        self.mode, self.stream_tag, self.tool_result, self.writer = mode, stream_tag, tool_result, writer
        self.watermark = None
        self.closed = None  # close reason once settled
        self.done = asyncio.Event()
        with _lock:
            _records[(key, request_id)] = self

    def detach(self, reason):
        if self.closed is None:
            self.closed = reason
            self.done.set()

    async def run(self):
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(self.spec.group, channel)
        await layer.group_add(wake_group(self.key), channel)
        deadline = time.monotonic() + RESPONSE_CAP_SECONDS
        try:
            if await self._advance(first=True):
                return "completed"
            while self.closed is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    await self._advance()  # one more drain pass, then settle
                    return self.closed or "cap_expired"
                try:
                    msg = await asyncio.wait_for(self._next(layer, channel), min(left, SNAPSHOT_EVERY))
                except asyncio.TimeoutError:
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
                    return "completed"
            return self.closed
        finally:
            await layer.group_discard(self.spec.group, channel)
            await layer.group_discard(wake_group(self.key), channel)
            release_record(self.key, self.request_id)

    async def _next(self, layer, channel):
        done = asyncio.ensure_future(self.done.wait())
        recv = asyncio.ensure_future(layer.receive(channel))
        finished, pending = await asyncio.wait({done, recv}, return_when=asyncio.FIRST_COMPLETED)
        for p in pending:
            p.cancel()
        return recv.result() if recv in finished else None

    async def _advance(self, first=False):
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
            await self._emit({"jsonrpc": "2.0", "id": self.request_id, "result": self.tool_result(final)}, pin=True)
        self.closed = "completed"
        return True

    def _progress_frame(self, progress, total):
        params = {"progressToken": self.token, "progress": progress, "total": total,
                  "_meta": dict(self.spec.meta)}
        if self.spec.message:
            params["message"] = self.spec.message
        return {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}

    async def _emit(self, frame, pin=False):
        eid = await hop(rings().append)(self.key, frame, self.stream_tag, pin)
        if self.writer is not None:
            delivered = await self.writer(eid, frame)
            if delivered and pin:
                await hop(rings().unpin)(self.key, eid)
            elif not delivered:  # the POST's wire is gone: a GET that resumed this stream (any process) reads it
                await awake(self.key)
        elif self.mode == "get":
            await awake(self.key)


def reject(reason):
    REJECTS.labels(reason).inc()
