"""MCP sessions: minted on ``initialize``, bound to the principal and the endpoint, capped, with sliding idle expiry.

Two stores behind one interface (``SessionStore``): in-process memory (embedded mode) and Redis (when
YUZU_REDIS_URL is set) so a client may hit any daphne process. Every key includes the principal; another
principal's session id reads exactly like an unknown one. A session remembers the catalogue (the endpoint) it was
opened on; mcp.server honours it there only — on another endpoint it reads like an unknown one too.
"""

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, cast

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from yuzu.rbac import Principal

from . import handover
from .backend import configured
from .ringkeys import PARTS, RING_SLIDE, RING_TTL, redis_base, ring_key

PER_PRINCIPAL_CAP = 8
PER_USER_CAP = 64  # a user's share of GLOBAL_CAP, over all their tokens (each of which has its own 8)
GLOBAL_CAP = 1024
IDLE_TTL = 1800
ENDED_TTL = 60  # how long a session its client DELETEd is remembered as such: past every stream's next tick


class SessionCapReached(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # "per_principal_cap" | "per_user_cap" | "global_cap"


@dataclass
class Session:
    id: str
    principal: str
    catalogue: str  # the endpoint it was opened on (mcp.registry's catalogue name): the only one that honours it
    protocol_version: str
    client_name: str = ""  # the client's own clientInfo on initialize (shown to approvers; never trusted)
    client_version: str = ""
    listing: str = ""  # "<catalogue>:<fingerprint>" of the tools/list it was last given (mcp.listing)

    @property
    def client(self) -> dict[str, str | None]:
        return {"name": self.client_name or None, "version": self.client_version or None}


def new_session_id() -> str:
    return secrets.token_hex(16)  # 128 bits, lowercase hex (visible ASCII)


class SessionStore(Protocol):
    """Where sessions live. ``principal`` is the principal's key (yuzu.rbac.Principal.key)."""

    def create(self, principal: str, catalogue: str, protocol_version: str, client_name: str = "",
               client_version: str = "") -> Session:
        """Mint a session, or raise SessionCapReached (global cap first, then the principal's, then its user's:
        yuzu.rbac.Principal.user_key_of)."""

    def validate(self, sid: str, principal: str) -> Session | None:
        """The live session ``sid`` of this principal (sliding its idle expiry), or None."""

    def begin_validate(self, sid: str, principal: str) -> "PendingValidation":
        """``validate``, its answer read later: the Redis store sends the command at once, so that it travels
        while the caller waits on something else (mcp.server: the database, authenticating). The caller closes
        what it gets, whether it read the answer or not."""

    def delete(self, sid: str, principal: str, by_client: bool = False) -> bool:
        """End the session; False when this principal has no such session. ``by_client``: its client's own
        DELETE, remembered for ENDED_TTL (``deleted_by_client``)."""

    def deleted_by_client(self, sid: str, principal: str) -> bool:
        """Whether this principal's client DELETEd the session (in the last ENDED_TTL seconds)."""

    def note_listing(self, sid: str, principal: str, listing: str) -> None:
        """Remember the fingerprint of the tools/list this session was given (mcp.listing)."""

    def listed(self, principal_prefix: str) -> list[Session]:
        """Live sessions that were given a tools/list, of the principals whose key starts with the prefix."""

    def active(self) -> int:
        """Live sessions (in Redis: of every process)."""

    def clear(self) -> None:
        """Forget every session (tests)."""


class PendingValidation:
    """A session check begun, answered by ``result()``; ``close()`` always follows (the memory store: nothing
    was begun, ``result`` validates)."""

    def __init__(self, store: SessionStore, sid: str, principal: str) -> None:
        self.store, self.sid, self.principal = store, sid, principal

    def result(self) -> Session | None:
        return self.store.validate(self.sid, self.principal)

    def close(self) -> None:
        pass


def _end_in_memory(ended: list[tuple[str, str]]) -> None:
    """Embedded mode: what a session keeps in this process's memory beside it — its replay ring and its streamed
    calls' follow records — has nothing to expire it (Redis gives the ring a TTL); it ends with the session, here,
    for each (principal, session id)."""
    from .ring import rings  # cycle: ring → metrics → sessions

    for principal, sid in ended:
        key = ring_key(principal, sid)
        rings().drop(key)
        handover.handovers().drop(key)


class MemorySessionStore(SessionStore):
    """``on_end`` is told which sessions ended — DELETEd, or found expired by the sweep (``_gc``) that initialize,
    the active-session count and the ended-by-client check already run — outside the store's lock."""

    def __init__(self, on_end: Callable[[list[tuple[str, str]]], None] = _end_in_memory) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, tuple[Session, float]] = {}  # sid -> (Session, expires_at)
        self._ended: dict[str, tuple[str, float]] = {}  # sid -> (principal, forgotten_at): DELETEd by their client
        self._on_end = on_end

    def _gc(self, now: float) -> list[tuple[str, str]]:
        """Forget what has expired → the (principal, session id) of each session that did, for ``on_end``."""
        expired = [(s.principal, sid) for sid, (s, exp) in self._sessions.items() if exp <= now]
        for _, sid in expired:
            del self._sessions[sid]
        for sid in [s for s, (_, exp) in self._ended.items() if exp <= now]:
            del self._ended[sid]
        return expired

    def _sweep(self) -> None:
        with self._lock:
            expired = self._gc(time.time())
        if expired:
            self._on_end(expired)

    def create(self, principal: str, catalogue: str, protocol_version: str, client_name: str = "",
               client_version: str = "") -> Session:
        now = time.time()
        expired: list[tuple[str, str]] = []
        try:
            with self._lock:
                expired = self._gc(now)
                if len(self._sessions) >= GLOBAL_CAP:
                    raise SessionCapReached("global_cap")
                if sum(1 for s, _ in self._sessions.values() if s.principal == principal) >= PER_PRINCIPAL_CAP:
                    raise SessionCapReached("per_principal_cap")
                user = Principal.user_key_of(principal)
                if sum(1 for s, _ in self._sessions.values()
                       if Principal.user_key_of(s.principal) == user) >= PER_USER_CAP:
                    raise SessionCapReached("per_user_cap")
                session = Session(new_session_id(), principal, catalogue, protocol_version, client_name,
                                  client_version)
                self._sessions[session.id] = (session, now + IDLE_TTL)
                return session
        finally:
            if expired:
                self._on_end(expired)

    def validate(self, sid: str, principal: str) -> Session | None:
        now = time.time()
        with self._lock:
            entry = self._sessions.get(sid)
            if entry is None or entry[1] <= now or entry[0].principal != principal:
                return None
            self._sessions[sid] = (entry[0], now + IDLE_TTL)
            return entry[0]

    def begin_validate(self, sid: str, principal: str) -> PendingValidation:
        return PendingValidation(self, sid, principal)

    def delete(self, sid: str, principal: str, by_client: bool = False) -> bool:
        with self._lock:
            entry = self._sessions.get(sid)
            if entry is None or entry[0].principal != principal:
                return False
            del self._sessions[sid]
            if by_client:
                self._ended[sid] = (principal, time.time() + ENDED_TTL)
        self._on_end([(principal, sid)])
        return True

    def deleted_by_client(self, sid: str, principal: str) -> bool:
        self._sweep()
        with self._lock:
            entry = self._ended.get(sid)
            return entry is not None and entry[0] == principal

    def note_listing(self, sid: str, principal: str, listing: str) -> None:
        with self._lock:
            entry = self._sessions.get(sid)
            if entry is not None and entry[0].principal == principal:
                entry[0].listing = listing

    def listed(self, principal_prefix: str) -> list[Session]:
        """Live sessions of the principals whose key starts with ``principal_prefix`` that were given a
        tools/list. Never slides their idle expiry."""
        now = time.time()
        with self._lock:
            return [replace(s) for s, exp in self._sessions.values()
                    if exp > now and s.listing and s.principal.startswith(principal_prefix)]

    def active(self) -> int:
        self._sweep()
        with self._lock:
            return len(self._sessions)

    def clear(self) -> None:
        with self._lock:
            self._sessions.clear()
            self._ended.clear()


_CREATE = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 'global_cap' end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return 'per_principal_cap' end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
if redis.call('ZCARD', KEYS[4]) >= tonumber(ARGV[11]) then return 'per_user_cap' end
local exp = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], exp, ARGV[5])
redis.call('ZADD', KEYS[2], exp, ARGV[5])
redis.call('ZADD', KEYS[4], exp, ARGV[5])
redis.call('HSET', KEYS[3], 'principal', ARGV[6], 'version', ARGV[7], 'client', ARGV[8], 'client_version', ARGV[9],
           'catalogue', ARGV[10])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[2]))
return 'ok'
"""
# Set a field of a live session only: never re-create the hash of a session deleted meanwhile (it would
# live on without an expiry).
_NOTE = """
if redis.call('HGET', KEYS[1], 'principal') == ARGV[1] then redis.call('HSET', KEYS[1], ARGV[2], ARGV[3]) end
return 0
"""

# Validate in one round trip: the session's fields, its idle expiry slid only when it is this principal's — and with
# it the expiry of its replay ring (mcp.streaming.ring: the keys KEYS[4] .. each of ringkeys.PARTS), which an append
# alone slid before (a session kept busy with no stream event lost its replay window and its event ids). The ring's
# is slid at most once in ARGV[6] seconds: the session remembers until when it last was (ring_until, read by the
# HGETALL), so most checks add no command and send only the ring's base name. A ring's expiry is never before
# ring_until (an append only pushes it later), nor is a ring made later's; EXPIRE creates no ring. (The ring's key
# names are made here rather than sent: this script already spans keys of several hash slots, so no Redis Cluster.)
# KEYS[5] is the user's set of sessions (every token's: their share of the global cap), slid with the others.
_VALIDATE = """
local data = redis.call('HGETALL', KEYS[3])
local principal, ring_until = nil, 0
for i = 1, #data, 2 do
  if data[i] == 'principal' then principal = data[i + 1]
  elseif data[i] == 'ring_until' then ring_until = tonumber(data[i + 1]) end
end
if principal ~= ARGV[1] then return {} end
local now = tonumber(ARGV[2])
local exp = now + tonumber(ARGV[3])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
redis.call('ZADD', KEYS[1], exp, ARGV[4])
redis.call('ZADD', KEYS[2], exp, ARGV[4])
redis.call('ZADD', KEYS[5], exp, ARGV[4])
local ring_ttl = tonumber(ARGV[5])
if now + ring_ttl - ring_until > tonumber(ARGV[6]) then
  for _, part in ipairs({PARTS}) do redis.call('EXPIRE', KEYS[4] .. part, ring_ttl) end
  redis.call('HSET', KEYS[3], 'ring_until', now + ring_ttl)
end
return data
""".replace("{PARTS}", "{" + ", ".join(f"'{part}'" for part in PARTS) + "}")


class RedisSessionStore(SessionStore):
    """(redis-py types each command's answer for its sync and asyncio clients at once; this client answers
    synchronously, in str — decode_responses — which the casts below say.)"""

    prefix = "yuzu:mcp:"

    def __init__(self, url: str) -> None:
        self.redis: redis.Redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
        self._create = self.redis.register_script(_CREATE)
        self._note = self.redis.register_script(_NOTE)
        self._validate = self.redis.register_script(_VALIDATE)

    def _keys(self, principal: str, sid: str) -> list[str]:
        return [self.prefix + "sessions", self.prefix + "psessions:" + principal, self.prefix + "session:" + sid]

    def _user_key(self, principal: str) -> str:
        """The user's sessions (every token's), for their share of the global cap."""
        return self.prefix + "usessions:" + Principal.user_key_of(principal)

    def _hash(self, key: str) -> dict[str, str]:
        return cast(dict[str, str], self.redis.hgetall(key))

    def create(self, principal: str, catalogue: str, protocol_version: str, client_name: str = "",
               client_version: str = "") -> Session:
        sid = new_session_id()
        verdict = self._create(keys=[*self._keys(principal, sid), self._user_key(principal)],
                               args=[time.time(), IDLE_TTL, GLOBAL_CAP, PER_PRINCIPAL_CAP, sid, principal,
                                     protocol_version, client_name, client_version, catalogue, PER_USER_CAP])
        if verdict != "ok":
            raise SessionCapReached(verdict)
        return Session(sid, principal, catalogue, protocol_version, client_name, client_version)

    def validate(self, sid: str, principal: str) -> Session | None:
        return self._answer(sid, self._validate(keys=self._validate_keys(principal, sid),
                                                args=self._validate_args(sid, principal)))

    def begin_validate(self, sid: str, principal: str) -> PendingValidation:
        return _PendingRedis(self, sid, principal)

    def _validate_keys(self, principal: str, sid: str) -> list[str]:
        return self._keys(principal, sid) + [redis_base(principal, sid), self._user_key(principal)]

    @staticmethod
    def _validate_args(sid: str, principal: str) -> list[str | float | int]:
        return [principal, time.time(), IDLE_TTL, sid, RING_TTL, RING_SLIDE]

    def _answer(self, sid: str, flat: object) -> Session | None:
        pairs = cast(list[str], flat)
        return self._session(sid, dict(zip(pairs[::2], pairs[1::2], strict=True))) if pairs else None

    @staticmethod
    def _session(sid: str, data: dict[str, str]) -> Session:
        return Session(sid, data["principal"], data.get("catalogue", ""), data.get("version", ""), data.get("client", ""),
                       data.get("client_version", ""), data.get("listing", ""))

    def note_listing(self, sid: str, principal: str, listing: str) -> None:
        self._note(keys=[self._keys(principal, sid)[2]], args=[principal, "listing", listing])

    def listed(self, principal_prefix: str) -> list[Session]:
        """Live sessions of the principals whose key starts with ``principal_prefix`` that were given a
        tools/list. Never slides their idle expiry."""
        now, out = time.time(), []
        head = self.prefix + "psessions:"
        for p_key in self.redis.scan_iter(head + principal_prefix + "*", count=500):
            principal = p_key[len(head):]
            for sid in cast(list[str], self.redis.zrangebyscore(p_key, now, "+inf")):
                data = self._hash(self._keys(principal, sid)[2])
                if data.get("principal") == principal and data.get("listing"):
                    out.append(self._session(sid, data))
        return out

    def delete(self, sid: str, principal: str, by_client: bool = False) -> bool:
        all_key, p_key, s_key = self._keys(principal, sid)
        data = self._hash(s_key)
        if not data or data.get("principal") != principal:
            return False
        pipe = self.redis.pipeline()
        pipe.delete(s_key)
        pipe.zrem(all_key, sid)
        pipe.zrem(p_key, sid)
        pipe.zrem(self._user_key(principal), sid)
        if by_client:
            pipe.set(self.prefix + "ended:" + sid, principal, ex=ENDED_TTL)
        pipe.execute()
        return True

    def deleted_by_client(self, sid: str, principal: str) -> bool:
        return self.redis.get(self.prefix + "ended:" + sid) == principal

    def active(self) -> int:
        key = self.prefix + "sessions"
        self.redis.zremrangebyscore(key, "-inf", time.time())
        return cast(int, self.redis.zcard(key))

    def clear(self) -> None:
        for key in self.redis.scan_iter(self.prefix + "*"):
            self.redis.delete(key)


class _PendingRedis(PendingValidation):
    """The validation script sent on a connection of the pool's own, its reply read on ``result()`` (or read and
    dropped on ``close()``) before the connection goes back. Where anything goes wrong on the way — the send, the
    read, Redis having lost the script — ``validate`` runs instead, with redis-py's own retries: the answer and
    its failures are what ``validate`` gives."""

    store: RedisSessionStore

    def __init__(self, store: RedisSessionStore, sid: str, principal: str) -> None:
        super().__init__(store, sid, principal)
        self.pool = store.redis.connection_pool
        self.conn: redis.Connection | None = None
        try:
            self.conn = self.pool.get_connection()
            keys = store._validate_keys(principal, sid)
            self.conn.send_command("EVALSHA", store._validate.sha, len(keys), *keys,
                                   *store._validate_args(sid, principal))
        except (RedisConnectionError, RedisTimeoutError, OSError):
            self._drop(disconnect=True)

    def result(self) -> Session | None:
        if self.conn is not None:
            try:
                return self.store._answer(self.sid, self.conn.read_response())
            except NoScriptError:  # Redis restarted or flushed its scripts: validate() loads it again
                pass
            except (RedisConnectionError, RedisTimeoutError, OSError):
                self._drop(disconnect=True)
            finally:
                self._drop()
        return super().result()

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.read_response()
            except Exception:  # the answer no longer matters; a connection that failed mid-read is not reused
                self._drop(disconnect=True)
            finally:
                self._drop()

    def _drop(self, disconnect: bool = False) -> None:
        if self.conn is not None:  # (None: get_connection failed, and the pool took its connection back itself)
            if disconnect:
                self.conn.disconnect()
            self.pool.release(self.conn)
            self.conn = None


store = configured(MemorySessionStore, RedisSessionStore)
