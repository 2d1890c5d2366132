"""A streamed call's follower outlives its process: the follow is recorded beside the session's ring, and held
by a short lease its follower renews while it runs. A process that dies (SIGKILL, OOM, a lost host) stops
renewing; a GET on another process that resumes the call (Last-Event-ID of one of its frames) finds the lease
free and adopts the follow — it rebuilds the call's FollowSpec from its recipe (mcp.context.follow_recipe) and
reports the rest, the result included, to the ring. Without this the resume would wait for frames no process
writes (issue 22, "a server process killed with streams open"; docs/operations.md).

Only a follow whose tool gave a recipe (``FollowSpec.resume``) is recorded; in embedded mode (one process) the
records live in process memory and an adoption never happens unless the follower itself was lost.

A record lives as long as the ring that holds its call's frames, however long after the call's 120 s cap: a resume
from one of those frames may come whenever its session is still alive, and the adopter's one last look at the work
writes the result. In Redis the records are a part of the ring (ringkeys.PARTS: ``:follows``), expired, slid by the
session check and dropped with it; in memory they end with their session (sessions.MemorySessionStore).

Two processes never report one call at once: the adopter takes the lease only when it is free (SET NX), and a
follower that finds its lease held by another (it stalled past LEASE_SECONDS) stops with ``handed_over``.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Protocol, TypedDict, cast

import redis

from yuzu.jsondata import JsonObject

from .backend import configured
from .ringkeys import RING_TTL, follows_key

LEASE_SECONDS = 10.0  # a follower renews its lease at least every ~2 s (follower.SNAPSHOT_EVERY)


class FollowRecord(TypedDict):
    """What another process needs to take a streamed call's follow over."""

    recipe: str  # the name a tool registered its FollowSpec builder under (mcp.context.follow_recipe)
    args: JsonObject  # the builder's arguments
    request_id: str | int | None  # the streamed call's JSON-RPC id (its ring frames are tagged post:<id>)
    token: str | int | None  # its progressToken
    deadline: float  # wall-clock end of its response cap (time.time())


class HandoverStore(Protocol):
    def record(self, key: str, stream: str, rec: FollowRecord) -> None:
        """Remember the follow of ``stream`` (a ring's stream tag) in the session's ring ``key``."""

    def record_of(self, key: str, stream: str) -> FollowRecord | None: ...

    def forget(self, key: str, stream: str) -> None:
        """The follow settled: nothing is left to adopt."""

    def claim(self, key: str, stream: str, owner: str) -> bool:
        """Take or renew the lease for ``owner``: True if ``owner`` holds it now (it was free, or already its)."""

    def release(self, key: str, stream: str, owner: str) -> None:
        """Give the lease back if ``owner`` holds it."""

    def drop(self, key: str) -> None:
        """Forget every follow of the ring ``key`` (its session ended)."""


class MemoryHandover(HandoverStore):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, FollowRecord]] = {}  # ring key -> stream tag -> record
        self._leases: dict[tuple[str, str], tuple[str, float]] = {}

    def record(self, key: str, stream: str, rec: FollowRecord) -> None:
        with self._lock:
            self._records.setdefault(key, {})[stream] = rec

    def record_of(self, key: str, stream: str) -> FollowRecord | None:
        with self._lock:
            return self._records.get(key, {}).get(stream)

    def forget(self, key: str, stream: str) -> None:
        with self._lock:
            records = self._records.get(key)
            if records is not None:
                records.pop(stream, None)
                if not records:
                    del self._records[key]

    def claim(self, key: str, stream: str, owner: str) -> bool:
        with self._lock:
            now = time.monotonic()
            held = self._leases.get((key, stream))
            if held is not None and held[0] != owner and held[1] > now:
                return False
            self._leases[(key, stream)] = (owner, now + LEASE_SECONDS)
            return True

    def release(self, key: str, stream: str, owner: str) -> None:
        with self._lock:
            held = self._leases.get((key, stream))
            if held is not None and held[0] == owner:
                del self._leases[(key, stream)]

    def drop(self, key: str) -> None:
        with self._lock:
            self._records.pop(key, None)
            for lease in [k for k in self._leases if k[0] == key]:  # (only the followers running now hold one)
                del self._leases[lease]


_CLAIM = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


class RedisHandover(HandoverStore):
    """(The casts say what this client answers: synchronously, in str — see RedisSessionStore.)"""

    prefix = "yuzu:mcp:follow:"

    def __init__(self, url: str) -> None:
        self.redis: redis.Redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
        self._claim = self.redis.register_script(_CLAIM)
        self._release = self.redis.register_script(_RELEASE)

    def _key(self, key: str, stream: str, what: str) -> str:
        return f"{self.prefix}{key}:{stream}:{what}"

    def record(self, key: str, stream: str, rec: FollowRecord) -> None:
        """One round trip; the ring's expiry is never later than now + RING_TTL, so this never shortens it."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(follows_key(key), stream, json.dumps(rec))
        pipe.expire(follows_key(key), RING_TTL)
        pipe.execute()

    def record_of(self, key: str, stream: str) -> FollowRecord | None:
        raw = cast(str | None, self.redis.hget(follows_key(key), stream))
        return cast(FollowRecord, json.loads(raw)) if raw else None

    def forget(self, key: str, stream: str) -> None:
        self.redis.hdel(follows_key(key), stream)

    def claim(self, key: str, stream: str, owner: str) -> bool:
        return bool(self._claim(keys=[self._key(key, stream, "lease")], args=[owner, int(LEASE_SECONDS * 1000)]))

    def release(self, key: str, stream: str, owner: str) -> None:
        self._release(keys=[self._key(key, stream, "lease")], args=[owner])

    def drop(self, key: str) -> None:
        self.redis.delete(follows_key(key))  # (the ring's drop does it too; a lease runs out in seconds)


handovers = configured(MemoryHandover, RedisHandover)
