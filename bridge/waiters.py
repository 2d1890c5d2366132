"""Which bridge_send waits are alive, in any server process: a waiter holds a short lease on its turn while it
waits, renewed every RENEW_SECONDS. A turn whose waiter is registered (``Turn.waiter_until``) but holds no lease
lost its waiter with its process (SIGKILL, OOM, a lost host) — a process that dies cannot record the drop
(``Turn.release_waiter``) — so the caller's re-send of the same message finds that turn again instead of
pasting it twice (turns.prepare_send; docs/operations.md "A server process killed").

Redis when YUZU_REDIS_URL is set (every process sees every lease); process memory otherwise (one process: after
a restart no lease survives, which is right — no waiter did either).
"""

import threading
import time
from typing import Protocol

import redis

from mcp.streaming.backend import configured

LEASE_SECONDS = 10.0
RENEW_SECONDS = 3.0


class WaiterLeases(Protocol):
    def hold(self, turn_pk: int, owner: str) -> None:
        """Take or renew the lease of ``owner``'s wait on turn ``turn_pk``."""

    def release(self, turn_pk: int, owner: str) -> None: ...

    def alive(self, turn_pk: int) -> bool:
        """Whether some process's wait on the turn holds a lease now."""

    def clear(self) -> None:
        """Forget every lease (tests: a rolled-back test database hands the same turn ids out again)."""


class MemoryLeases(WaiterLeases):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[int, dict[str, float]] = {}

    def hold(self, turn_pk: int, owner: str) -> None:
        with self._lock:
            self._leases.setdefault(turn_pk, {})[owner] = time.monotonic() + LEASE_SECONDS

    def release(self, turn_pk: int, owner: str) -> None:
        with self._lock:
            held = self._leases.get(turn_pk, {})
            held.pop(owner, None)
            if not held:
                self._leases.pop(turn_pk, None)

    def alive(self, turn_pk: int) -> bool:
        with self._lock:
            now = time.monotonic()
            return any(until > now for until in self._leases.get(turn_pk, {}).values())

    def clear(self) -> None:
        with self._lock:
            self._leases.clear()


_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


class RedisLeases(WaiterLeases):
    """One key per turn holding the latest renewer (two waits on one turn keep it alive between them)."""

    prefix = "yuzu:bridge:waiter:"

    def __init__(self, url: str) -> None:
        self.redis: redis.Redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
        self._release = self.redis.register_script(_RELEASE)

    def hold(self, turn_pk: int, owner: str) -> None:
        self.redis.set(f"{self.prefix}{turn_pk}", owner, px=int(LEASE_SECONDS * 1000))

    def release(self, turn_pk: int, owner: str) -> None:
        self._release(keys=[f"{self.prefix}{turn_pk}"], args=[owner])

    def alive(self, turn_pk: int) -> bool:
        return bool(self.redis.exists(f"{self.prefix}{turn_pk}"))

    def clear(self) -> None:
        for key in self.redis.scan_iter(self.prefix + "*"):
            self.redis.delete(key)


leases = configured(MemoryLeases, RedisLeases)
