"""Who may hold a stream. A client that asked for a stream is told when it is not getting one (429 with
``-32012`` and a Retry-After, docs/streaming.md "Admission"); nothing is evicted to make room, and every
streamed-POST refusal happens before the call's work exists.

- GET streams: 4 per principal, 32 per user, ``YUZU_MCP_MAX_STREAMS`` per process (``get_budget``);
- streamed POSTs: 4 held open per principal, 16 per user, 1024 per process (``post_budget``), 256 progress
  records per process, 32 per user and 16 per principal (its streamed calls and the calls reporting to its GET
  channels), 4 streamed calls per session (live, or finished with an undelivered pinned result);
- a request id in flight on its session once (409).

A principal is one token (or one admin session) of a user; a user mints as many tokens as they like
(create_api_token, each OAuth connection), so each per-principal share is also bounded per user
(``yuzu.rbac.Principal.user_key_of`` of the principal key): one account cannot take a process-wide cap by
spreading its streams over tokens.

A progress record is reserved before the call runs and released when its follower settles; it is also how
notifications/cancelled finds a follower in this process.
"""

from __future__ import annotations

import secrets
import threading
from typing import TYPE_CHECKING

from django.conf import settings

from yuzu.errors import POST_STREAM_CAP_RETRY_MS, STREAM_CAP_RETRY_MS, correlation_id
from yuzu.rbac import Principal

from .. import jsonrpc as rpc
from ..pipeline import a4
from .metrics import PIN_DISPLACED, RECORDS_ACTIVE, REJECTS
from .ring import ring_key, rings

if TYPE_CHECKING:
    from ..context import ToolContext
    from ..jsonrpc import RequestId
    from .follower import Follower

GET_PER_PRINCIPAL = 4
GET_PER_USER = 32  # a user's share of YUZU_MCP_MAX_STREAMS, over all their tokens
POST_PER_PRINCIPAL = 4
POST_PER_USER = 16
POST_GLOBAL = 1024
PIN_SLOTS_PER_SESSION = 4
RECORD_CAP = 256
RECORD_PER_PRINCIPAL = 16  # a token's share of RECORD_CAP: its calls reporting to a GET channel stop here
RECORD_PER_USER = 32  # a user's share of RECORD_CAP, over all their tokens


class Budget:
    """Held-open stream admission for this process: reject, never evict. Each slot counts against the process,
    its principal and the principal's user (``per_user``: the user key, ``Principal.user_key_of``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self.per_principal: dict[str, int] = {}
        self.per_user: dict[str, int] = {}

    def acquire(self, principal_key: str, per_principal_cap: int, global_cap: int,
                per_user_cap: int | None = None) -> str | None:
        user = Principal.user_key_of(principal_key)
        with self._lock:
            if self.total >= global_cap:
                return "global_cap"
            if self.per_principal.get(principal_key, 0) >= per_principal_cap:
                return "per_principal_cap"
            if per_user_cap is not None and self.per_user.get(user, 0) >= per_user_cap:
                return "per_user_cap"
            self.total += 1
            _add(self.per_principal, principal_key, 1)
            _add(self.per_user, user, 1)
            return None

    def release(self, principal_key: str) -> None:
        with self._lock:
            self.total -= 1
            _add(self.per_principal, principal_key, -1)
            _add(self.per_user, Principal.user_key_of(principal_key), -1)


def _add(counts: dict[str, int], key: str, n: int) -> None:
    """Count ``n`` more (or fewer) for ``key``; a key at zero is forgotten."""
    left = counts.get(key, 0) + n
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


get_budget = Budget()
post_budget = Budget()


def reject(reason: str) -> None:
    REJECTS.labels(reason).inc()


# --- GET streams --------------------------------------------------------------------------------

def admit_get(principal_key: str, handover_pending: bool) -> None:
    """Take a GET stream slot, or raise the 429. ``handover_pending``: a superseded stream of the session
    is still closing."""
    reason = "stream_handover_pending" if handover_pending else \
        get_budget.acquire(principal_key, GET_PER_PRINCIPAL, settings.YUZU_MCP_MAX_STREAMS, GET_PER_USER)
    if reason is None:
        return
    reject(reason)
    raise rpc.RpcError(rpc.STREAM_CAP, f"stream refused ({reason})",
                       a4(correlation_id(), STREAM_CAP_RETRY_MS,
                          "close another stream of this token (or of your other tokens), or retry later"),
                       http_status=429, headers={"Retry-After": str(STREAM_CAP_RETRY_MS // 1000)})


def release_get(principal_key: str) -> None:
    get_budget.release(principal_key)


# --- progress records ---------------------------------------------------------------------------

_lock = threading.Lock()
#: (ring_key, request_id) -> its Follower, or None while reserved
_records: dict[tuple[str, RequestId], Follower | None] = {}
#: (ring_key, request_id) -> the principal key it counts against; principal key, user key -> how many it holds
_owners: dict[tuple[str, RequestId], str] = {}
_held: dict[str, int] = {}
_held_by_user: dict[str, int] = {}


def admit_record(key: str, request_id: RequestId, principal_key: str) -> str | None:
    """Reserve a record for ``principal_key`` before any work exists. Returns a refusal reason or None."""
    with _lock:
        if (key, request_id) in _records:
            return "duplicate_request_id"
        if len(_records) >= RECORD_CAP:
            return "post_record_cap"
        if _held.get(principal_key, 0) >= RECORD_PER_PRINCIPAL:
            return "post_record_per_principal_cap"
        user = Principal.user_key_of(principal_key)
        if _held_by_user.get(user, 0) >= RECORD_PER_USER:
            return "post_record_per_user_cap"
        _records[(key, request_id)] = None
        _owners[(key, request_id)] = principal_key
        _add(_held, principal_key, 1)
        _add(_held_by_user, user, 1)
        RECORDS_ACTIVE.set(len(_records))
        return None


def hold_record(key: str, request_id: RequestId, follower: Follower) -> None:
    """The record's follower now exists (it is what notifications/cancelled detaches)."""
    with _lock:
        _records[(key, request_id)] = follower


def release_record(key: str, request_id: RequestId) -> None:
    with _lock:
        _records.pop((key, request_id), None)
        owner = _owners.pop((key, request_id), None)
        if owner is not None:
            _add(_held, owner, -1)
            _add(_held_by_user, Principal.user_key_of(owner), -1)
        RECORDS_ACTIVE.set(len(_records))


def follower_of(key: str, request_id: RequestId) -> Follower | None:
    with _lock:
        return _records.get((key, request_id))


def inflight(key: str) -> int:
    with _lock:
        return sum(1 for k, _ in _records if k == key)


# --- streamed POSTs -----------------------------------------------------------------------------

def admit_streamed_post(ctx: ToolContext) -> None:
    """Admit a streamed POST before the tool runs: a POST slot, a progress record, a pin slot on the session
    — or raise the refusal (429, or 409 for a request id already in flight), having kept nothing. An admitted
    call carries its ring key in ``ctx.extra["admitted"]``."""
    key = ring_key(ctx.principal.key, ctx.session_id)
    reason = post_budget.acquire(ctx.principal.key, POST_PER_PRINCIPAL, POST_GLOBAL, POST_PER_USER)
    if reason is not None:
        reason = "post_" + reason
    else:
        reason = admit_record(key, ctx.request_id, ctx.principal.key)
        if reason is None:
            reason = _claim_pin_slot(key)
            if reason is not None:
                release_record(key, ctx.request_id)
        if reason is not None:
            post_budget.release(ctx.principal.key)
    if reason is None:
        ctx.extra["admitted"] = key
        return
    reject(reason)
    if reason == "duplicate_request_id":
        raise rpc.RpcError(rpc.INVALID_REQUEST, "a request with this id is already in flight on this session",
                           a4(ctx.cid, remediation="use a fresh request id"), http_status=409)
    raise rpc.RpcError(rpc.STREAM_CAP, f"streamed call refused ({reason})",
                       a4(ctx.cid, POST_STREAM_CAP_RETRY_MS,
                          "retry later, or retry without an SSE Accept for a plain response"),
                       http_status=429, headers={"Retry-After": str(POST_STREAM_CAP_RETRY_MS // 1000)})


def release_streamed_post(ctx: ToolContext, key: str) -> None:
    """Give back what admit_streamed_post took, when the call will not stream after all."""
    release_record(key, ctx.request_id)
    post_budget.release(ctx.principal.key)


def _claim_pin_slot(key: str) -> str | None:
    """A session holds at most 4 streamed calls: live ones plus undelivered pinned finals. Admission first
    reclaims the oldest undelivered final (it stays in the ring, unpinned, and fetchable by id)."""
    live = inflight(key) - 1  # not counting this request's own record
    pinned = rings().pinned(key)
    if live + len(pinned) < PIN_SLOTS_PER_SESSION:
        return None
    if pinned and live < PIN_SLOTS_PER_SESSION:
        rings().unpin(key, pinned[0])
        PIN_DISPLACED.inc()
        return None
    return "post_pin_slots"


# --- modern (2026-07-28) streamed responses -------------------------------------------------------------

def admit_modern_post(ctx: ToolContext) -> None:
    """A modern request's streamed response: a POST slot and a progress record (there is no session, so no ring
    and no pin slot) — or the 429, having kept nothing. The admitted call's record key is in
    ``ctx.extra["admitted"]``."""
    key = f"modern-{secrets.token_hex(12)}"  # also a channel-layer group name (mcp.streaming.wake): no colon
    reason = post_budget.acquire(ctx.principal.key, POST_PER_PRINCIPAL, POST_GLOBAL, POST_PER_USER)
    if reason is not None:
        reason = "post_" + reason
    else:
        reason = admit_record(key, ctx.request_id, ctx.principal.key)
        if reason is not None:
            post_budget.release(ctx.principal.key)
    if reason is None:
        ctx.extra["admitted"] = key
        return
    reject(reason)
    raise rpc.RpcError(rpc.STREAM_CAP, f"streamed call refused ({reason})",
                       a4(ctx.cid, POST_STREAM_CAP_RETRY_MS,
                          "retry later, or retry without an SSE Accept for a plain response"),
                       http_status=429, headers={"Retry-After": str(POST_STREAM_CAP_RETRY_MS // 1000)})


def release_modern_post(ctx: ToolContext) -> None:
    """Give back what admit_modern_post took (the call will not stream after all)."""
    key = ctx.extra.pop("admitted", None)
    if key is not None:
        release_streamed_post(ctx, key)
