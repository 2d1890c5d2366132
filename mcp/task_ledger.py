"""How many tasks a token holds open (mcp.tasks): the per-token cap on concurrent tasks.

A task id is self-contained (signed, mcp.tasks), so this ledger is not where tasks live: it only counts them.
Per principal, a sorted set of members scored by their expiry: ``<tool>|<work id>`` for a task handed out, and a
short-lived ``~<random>`` reservation taken before a call that may become a task runs (so the cap is checked
before the work exists, and two concurrent calls cannot both take the last slot). Entries leave when the task is
seen ended (tasks/get, or the sweep at the cap) or when their task id expires.

Two stores behind one interface, like the sessions (mcp.streaming.sessions): process memory in embedded mode,
Redis when YUZU_REDIS_URL is set (one Lua script reserves atomically across every server process).
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import cast

import redis

from .streaming.backend import configured

RESERVATION_TTL = 120.0  # seconds: longer than any tools/call that creates work takes to answer


class Ledger:
    def reserve(self, principal: str, cap: int) -> str | None:
        """A reservation under ``cap``, or None at the cap."""
        raise NotImplementedError

    def settle(self, principal: str, reservation: str, member: str | None, ttl: float) -> None:
        """The reservation becomes ``member`` for ``ttl`` seconds, or (None) is given back."""
        raise NotImplementedError

    def live(self, principal: str) -> list[str]:
        raise NotImplementedError

    def forget(self, principal: str, member: str) -> None:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError


def _reservation() -> str:
    return "~" + secrets.token_hex(8)


class MemoryLedger(Ledger):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, dict[str, float]] = {}

    def _live(self, principal: str, now: float) -> dict[str, float]:
        held = self._held.setdefault(principal, {})
        for member in [m for m, exp in held.items() if exp <= now]:
            del held[member]
        return held

    def reserve(self, principal: str, cap: int) -> str | None:
        now = time.time()
        with self._lock:
            held = self._live(principal, now)
            if len(held) >= cap:
                return None
            member = _reservation()
            held[member] = now + RESERVATION_TTL
            return member

    def settle(self, principal: str, reservation: str, member: str | None, ttl: float) -> None:
        with self._lock:
            held = self._held.setdefault(principal, {})
            held.pop(reservation, None)
            if member is not None:
                held[member] = time.time() + ttl

    def live(self, principal: str) -> list[str]:
        with self._lock:
            return [m for m in self._live(principal, time.time()) if not m.startswith("~")]

    def forget(self, principal: str, member: str) -> None:
        with self._lock:
            self._held.get(principal, {}).pop(member, None)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()


_RESERVE = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[4])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
return 1
"""


class RedisLedger(Ledger):
    prefix = "yuzu:mcp:tasks:"
    horizon = 2 * 24 * 3600  # the key's own expiry: past every member's

    def __init__(self, url: str) -> None:
        self.redis: redis.Redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
        self._reserve = self.redis.register_script(_RESERVE)

    def reserve(self, principal: str, cap: int) -> str | None:
        member = _reservation()
        ok = self._reserve(keys=[self.prefix + principal],
                           args=[time.time(), cap, RESERVATION_TTL, member, self.horizon])
        return member if ok else None

    def settle(self, principal: str, reservation: str, member: str | None, ttl: float) -> None:
        pipe = self.redis.pipeline()
        pipe.zrem(self.prefix + principal, reservation)
        if member is not None:
            pipe.zadd(self.prefix + principal, {member: time.time() + ttl})
        pipe.execute()

    def live(self, principal: str) -> list[str]:
        members = cast(list[str], self.redis.zrangebyscore(self.prefix + principal, time.time(), "+inf"))
        return [m for m in members if not m.startswith("~")]

    def forget(self, principal: str, member: str) -> None:
        self.redis.zrem(self.prefix + principal, member)

    def clear(self) -> None:
        for key in self.redis.scan_iter(self.prefix + "*"):
            self.redis.delete(key)


ledger = configured(MemoryLedger, RedisLedger)
