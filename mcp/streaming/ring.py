"""Per-session replay rings: every frame a session's streams carry, with per-session event ids (monotonic
from 1), so a client that reconnects with Last-Event-ID gets what it missed — or a gap, never a silently
short history.

A ring is bounded to 500 frames and 64 KiB; a pinned frame (a streamed call's final result) is exempt from
eviction until some connection has delivered it. Two stores behind one interface (``RingStore``): process
memory in embedded mode and Redis when YUZU_REDIS_URL is set, so a client may POST to one daphne process and
resume its GET on another. Every ring is keyed by principal + session (``ring_key``).
"""

import json
import threading
from collections import OrderedDict
from typing import Protocol, TypedDict, cast

import redis

from yuzu.jsondata import JsonObject

from .backend import configured
from .metrics import EVICTIONS, TOO_LARGE
from .ringkeys import REDIS_PREFIX, RING_TTL, redis_keys
from .ringkeys import ring_key as ring_key  # (where the ring's users take it from)

RING_FRAMES = 500
RING_BYTES = 64 * 1024
FRAME_CAP = 16 * 1024
PIN_SLOTS = 4

#: one ring frame: (event id, stream tag — "get" or "post:<request id>", the frame's JSON text)
Frame = tuple[int, str, str]


def encode(frame: JsonObject) -> str:
    data = json.dumps(frame, separators=(",", ":"), ensure_ascii=False)
    if len(data.encode()) > FRAME_CAP:
        TOO_LARGE.inc()
        params = frame.get("params") or {}
        short = {"jsonrpc": "2.0", "method": frame.get("method", "notifications/message"),
                 "params": {"truncated": True, **{k: params[k] for k in ("progressToken", "progress", "total")
                                                  if k in params}}}
        if "id" in frame:
            short = {"jsonrpc": "2.0", "id": frame["id"],
                     "error": {"code": -32014, "message": "result too large for the stream; fetch by execution_id",
                               "data": {"truncated": True}}}
        data = json.dumps(short, separators=(",", ":"))
    return data


class RingStore(Protocol):
    """A session's replay ring, addressed by ``ring_key``."""

    def append(self, key: str, frame: JsonObject, stream: str = "get", pin: bool = False) -> int:
        """Commit one frame (truncated to FRAME_CAP) and return its event id; evict past the bounds."""

    def read(self, key: str, after: int, stream: str | None = None) -> tuple[list[Frame], bool]:
        """Frames after ``after`` (of one stream tag, or all) → (frames, gap). A cursor the ring no longer
        covers, or never issued, is a gap."""

    def stream_of(self, key: str, eid: int) -> str | None:
        """The stream tag of frame ``eid``, if the ring still holds it."""

    def unpin(self, key: str, eid: int) -> None:
        """Let frame ``eid`` be evicted again (its result was delivered, or its pin slot reclaimed)."""

    def pinned(self, key: str) -> list[int]:
        """The pinned event ids, oldest first."""

    def drop(self, key: str) -> None:
        """Forget the ring (its session ended)."""

    def clear(self) -> None:
        """Forget every ring (tests)."""


class _Ring(TypedDict):
    next: int  # the next event id
    frames: OrderedDict[int, tuple[str, str]]  # event id -> (stream tag, frame JSON)
    bytes: int
    pinned: set[int]
    oldest: int  # the oldest event id still covered (older ones were evicted)


def _empty() -> _Ring:
    return {"next": 1, "frames": OrderedDict(), "bytes": 0, "pinned": set(), "oldest": 1}


class MemoryRing(RingStore):
    """Embedded mode's rings, which nothing expires: the memory session store drops a session's ring when the
    session ends (sessions.MemorySessionStore), and only an append makes one — a read, a pin count or an unpin
    of a ring that is not there (its session ended) answers as an empty ring would and keeps nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rings: dict[str, _Ring] = {}

    def _ring(self, key: str) -> _Ring:
        return self._rings.get(key) or _empty()

    def append(self, key: str, frame: JsonObject, stream: str = "get", pin: bool = False) -> int:
        data = encode(frame)
        with self._lock:
            ring = self._rings.get(key)
            if ring is None:
                ring = self._rings[key] = _empty()
            eid = ring["next"]
            ring["next"] += 1
            ring["frames"][eid] = (stream, data)
            ring["bytes"] += len(data)
            if pin:
                ring["pinned"].add(eid)
                while len(ring["pinned"]) > PIN_SLOTS:
                    ring["pinned"].discard(min(ring["pinned"]))
            self._evict(ring)
            return eid

    def _evict(self, ring: _Ring) -> None:
        frames = ring["frames"]
        for eid in list(frames):
            if len(frames) <= RING_FRAMES and ring["bytes"] <= RING_BYTES:
                break
            if eid in ring["pinned"] or eid == next(reversed(frames)):
                continue
            ring["bytes"] -= len(frames.pop(eid)[1])
            ring["oldest"] = max(ring["oldest"], eid + 1)
            EVICTIONS.inc()

    def read(self, key: str, after: int, stream: str | None = None) -> tuple[list[Frame], bool]:
        """Frames after ``after`` → (list of (id, stream, data), gap). A cursor the ring no longer covers
        (or never issued) is a gap, never a silently short replay."""
        with self._lock:
            ring = self._ring(key)
            if after >= ring["next"] or (after and after + 1 < ring["oldest"]):
                return [], True
            out = [(eid, s, d) for eid, (s, d) in ring["frames"].items()
                   if eid > after and (stream is None or s == stream)]
            return out, False

    def stream_of(self, key: str, eid: int) -> str | None:
        with self._lock:
            entry = self._ring(key)["frames"].get(eid)
            return entry[0] if entry else None

    def unpin(self, key: str, eid: int) -> None:
        with self._lock:
            self._ring(key)["pinned"].discard(eid)

    def pinned(self, key: str) -> list[int]:
        with self._lock:
            return sorted(self._ring(key)["pinned"])

    def drop(self, key: str) -> None:
        with self._lock:
            self._rings.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._rings.clear()


_APPEND = """
local eid = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], eid, ARGV[1])
redis.call('RPUSH', KEYS[3], eid)
local bytes = redis.call('INCRBY', KEYS[4], string.len(ARGV[1]))
if ARGV[2] == '1' then
  redis.call('ZADD', KEYS[5], eid, eid)
  while redis.call('ZCARD', KEYS[5]) > tonumber(ARGV[6]) do redis.call('ZPOPMIN', KEYS[5]) end
end
local evicted = 0
local n = redis.call('LLEN', KEYS[3])
local scanned = 0
while (n > tonumber(ARGV[3]) or bytes > tonumber(ARGV[4])) and scanned < n - 1 do
  local victim = redis.call('LINDEX', KEYS[3], scanned)
  if redis.call('ZSCORE', KEYS[5], victim) then
    scanned = scanned + 1
  else
    redis.call('LREM', KEYS[3], 1, victim)
    local v = redis.call('HGET', KEYS[2], victim)
    if v then bytes = redis.call('INCRBY', KEYS[4], -string.len(v)) end
    redis.call('HDEL', KEYS[2], victim)
    redis.call('SET', KEYS[6], tonumber(victim) + 1)
    evicted = evicted + 1
    n = n - 1
  end
end
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[5])) end
return {eid, evicted}
"""


class RedisRing(RingStore):
    """(The casts say what this client answers: synchronously, in str — see RedisSessionStore.)"""

    prefix = REDIS_PREFIX

    def __init__(self, url: str) -> None:
        self.redis: redis.Redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
        self._append = self.redis.register_script(_APPEND)

    @staticmethod
    def _keys(key: str) -> list[str]:
        return redis_keys(key)

    def append(self, key: str, frame: JsonObject, stream: str = "get", pin: bool = False) -> int:
        payload = json.dumps([stream, encode(frame)], separators=(",", ":"))
        eid, evicted = self._append(keys=self._keys(key), args=[payload, "1" if pin else "0", RING_FRAMES,
                                                                 RING_BYTES, RING_TTL, PIN_SLOTS])
        if evicted:
            EVICTIONS.inc(evicted)
        return int(eid)

    def read(self, key: str, after: int, stream: str | None = None) -> tuple[list[Frame], bool]:
        seq, frames, ids, _, _, oldest, _ = self._keys(key)
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(seq)
        pipe.get(oldest)
        pipe.lrange(ids, 0, -1)
        pipe.hgetall(frames)
        last, first, order, data = pipe.execute()
        nxt = int(last or 0) + 1
        first = int(first or 1)
        if after >= nxt or (after and after + 1 < first):
            return [], True
        out: list[Frame] = []
        for eid in sorted(int(i) for i in order):
            if eid <= after or str(eid) not in data:
                continue
            s, d = json.loads(data[str(eid)])
            if stream is None or s == stream:
                out.append((eid, s, d))
        return out, False

    def stream_of(self, key: str, eid: int) -> str | None:
        raw = cast(str | None, self.redis.hget(self._keys(key)[1], str(eid)))
        return str(json.loads(raw)[0]) if raw else None

    def unpin(self, key: str, eid: int) -> None:
        self.redis.zrem(self._keys(key)[4], eid)

    def pinned(self, key: str) -> list[int]:
        return sorted(int(x) for x in cast(list[str], self.redis.zrange(self._keys(key)[4], 0, -1)))

    def drop(self, key: str) -> None:
        self.redis.delete(*self._keys(key))

    def clear(self) -> None:
        for k in self.redis.scan_iter(self.prefix + "*"):
            self.redis.delete(k)


rings = configured(MemoryRing, RedisRing)
