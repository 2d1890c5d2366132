"""A held-open stream re-checks, on every tick, what admitted it: the credential is still valid (a token not
revoked, expired or retired, not replaced by a refresh's new secret, its owner still active and not locked out by an
administrator; an admin session cookie still signed in, as the admin would accept it) and the session still exists
(which also slides its idle expiry). A backend that cannot answer is given AUTH_GRACE_SECONDS before the stream
closes with auth_unavailable. Both kinds of stream (GET channel, streamed POST) tick at the same pace.

The checks themselves are made once per tick for every stream of the process (``_Pass``): one worker-thread
hop (``revalidate_all``) whose one query is the auth version (yuzu.models.AuthVersion); only when it moved
since the credentials were last read — a token, user or role changed somewhere — does it read the tokens and
users of the streams, one query each. A stream's own tick (its heartbeat, at its own moment, so 5,000 streams
do not all write at once) reads the verdict of the latest pass, and a pass that finds a stream's credential or
session gone wakes that stream at once, so it closes within a tick. 5,000 streams cost one hop and one query
per tick, not 5,000 hops and 10,000 queries."""

import asyncio
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import DatabaseError
from django.utils import timezone

from yuzu.auth import principal_for_session
from yuzu.models import ApiToken, AuthVersion
from yuzu.rbac import Principal

from ..pipeline import hop
from .sessions import store

TICK_SECONDS = 3.0
AUTH_GRACE_SECONDS = 60


def every_tick(step: Callable[[], Awaitable[bool]]) -> asyncio.Future[None]:
    """Run ``await step()`` every TICK_SECONDS until it returns False; the task to cancel when done."""

    async def loop() -> None:
        try:
            while True:
                await asyncio.sleep(TICK_SECONDS)
                if await step() is False:
                    return
        except asyncio.CancelledError:
            pass

    return asyncio.ensure_future(loop())


class _Verified:
    """The principals whose credentials were read at ``version`` (cleared when it moves). One batch at a time
    reads and marks them (``lock``): a batch that read before a change must not mark after it."""

    version = -1
    keys: set[str] = set()
    lock = threading.Lock()


def _credentials(principals: list[Principal]) -> dict[str, bool]:
    """principal key → credential still good. Reads the tokens and users only when the auth version moved
    since they were last read; refreshes the principals' token objects with what it read."""
    with _Verified.lock:
        return _read_credentials(principals)


def _read_credentials(principals: list[Principal]) -> dict[str, bool]:
    now = timezone.now()
    version = AuthVersion.current()
    if version != _Verified.version or version < 0:
        _Verified.version, _Verified.keys = version, set()
    stale = [p for p in principals if p.key not in _Verified.keys]
    if stale:
        token_ids = {p.token.pk for p in stale if p.token is not None}
        user_ids = {p.user.pk for p in stale if p.token is None}
        tokens = {row[0]: row[1:] for row in ApiToken.objects.filter(pk__in=token_ids).values_list(
            "pk", "revoked_at", "expires_at", "retire_at", "owner__is_active", "token_hash", "owner__lockout__manual",
            "owner__lockout__locked_until")} if token_ids else {}
        users = {row[0]: row[1] and not _locked(*row[2:], now) for row in get_user_model().objects.filter(
            pk__in=user_ids).values_list("pk", "is_active", "lockout__manual", "lockout__locked_until")
        } if user_ids else {}
        gone = set()
        for p in stale:
            if p.token is not None:
                row = tokens.get(p.token.pk)
                if row is None or not row[3] or row[4] != p.token.token_hash or _locked(*row[5:], now):
                    # (a new secret in the same row: an OAuth refresh — the one that admitted the stream is dead)
                    gone.add(p.key)
                else:
                    p.token.revoked_at, p.token.expires_at, p.token.retire_at = row[:3]
            elif not users.get(p.user.pk):
                gone.add(p.key)
        _Verified.keys |= {p.key for p in stale} - gone
    sessions = _admin_sessions(principals)
    return {p.key: p.key in _Verified.keys and (p.token.is_live(now) if p.token is not None else
                                                p.session_key is None or sessions.get(p.session_key, False))
            for p in principals}


def _locked(manual: bool | None, locked_until: datetime | None, now: datetime) -> bool:
    """An administrator's lock on the owner (yuzu.models.AccountLockout.holds_out, from the row's values): its start
    and its end move the auth version, so a stream admitted under it is never marked good."""
    return bool(manual) and locked_until is not None and locked_until > now


def _admin_sessions(principals: list[Principal]) -> dict[str, bool]:
    """Admin session key → whether it still authenticates its user, for the principals of the admin session cookie:
    read on every pass, whatever the auth version — signing out, losing staff, a password change or the
    authenticator removed end it, and none of them moves the version. (A few queries per such stream; streams
    opened with the cookie are the exception, tokens the rule.)"""
    out: dict[str, bool] = {}
    for p in principals:
        if p.token is None and p.session_key is not None and p.session_key not in out:
            now = principal_for_session(p.session_key)
            out[p.session_key] = now is not None and now.user.pk == p.user.pk
    return out


def revalidate_all(checks: list[tuple[Principal, str]]) -> list[str]:
    """For each (principal, session id): "ok", "credential_revoked", "session_terminated", "session_deleted" (by
    its client's own DELETE), or "indeterminate" (the backend did not answer). Runs in a worker thread."""
    try:
        good = _credentials([p for p, _ in checks])
    except (DatabaseError, OSError):
        return ["indeterminate"] * len(checks)
    verdicts = []
    for principal, session_id in checks:
        if not good[principal.key]:
            verdicts.append("credential_revoked")
            continue
        if not session_id:  # a 2026-07-28 stream (subscriptions/listen) has no session: its credential is all
            verdicts.append("ok")
            continue
        try:
            if store().validate(session_id, principal.key) is not None:
                verdicts.append("ok")
            elif store().deleted_by_client(session_id, principal.key):
                verdicts.append("session_deleted")
            else:
                verdicts.append("session_terminated")
        except (DatabaseError, OSError):
            verdicts.append("indeterminate")
    return verdicts


def revalidate(principal: Principal, session_id: str) -> str:
    """One stream's verdict (see revalidate_all)."""
    return revalidate_all([(principal, session_id)])[0]


class _Pass:
    """Every watch of one event loop, re-checked together once per tick by one hop."""

    def __init__(self) -> None:
        self.watches: weakref.WeakSet[CredentialWatch] = weakref.WeakSet()
        self.task: asyncio.Future[None] | None = None

    def add(self, watch: "CredentialWatch") -> None:
        self.watches.add(watch)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self.run())

    async def run(self) -> None:
        while self.watches:
            await asyncio.sleep(TICK_SECONDS)
            watches = list(self.watches)
            if not watches:
                break
            try:
                verdicts = await hop(revalidate_all)([(w.principal, w.session_id) for w in watches])
            except Exception:
                verdicts = ["indeterminate"] * len(watches)
            for watch, verdict in zip(watches, verdicts, strict=True):
                watch.verdict = verdict
                if verdict not in ("ok", "indeterminate") and watch.wake is not None:
                    watch.wake()  # the stream closes now, not at its own next tick


_passes: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pass]" = weakref.WeakKeyDictionary()


class CredentialWatch:
    """A stream's tick verdict: None to go on, else the reason to close with. Created on the event loop;
    the loop's pass re-checks it every tick while the stream lives (``stop`` when it ends), and calls ``wake``
    when the verdict turns against it."""

    def __init__(self, principal: Principal, session_id: str, wake: Callable[[], object] | None = None) -> None:
        self.principal, self.session_id, self.wake = principal, session_id, wake
        self.failing_since: float | None = None
        self.verdict = "ok"  # admitted just now; the next pass says otherwise if it must
        loop = asyncio.get_running_loop()
        if loop not in _passes:
            _passes[loop] = _Pass()
        _passes[loop].add(self)

    def stop(self) -> None:
        for each in _passes.values():
            each.watches.discard(self)

    async def check(self) -> str | None:
        verdict = self.verdict
        if verdict == "ok":
            self.failing_since = None
            return None
        if verdict == "indeterminate":
            self.failing_since = self.failing_since or time.monotonic()
            return "auth_unavailable" if time.monotonic() - self.failing_since >= AUTH_GRACE_SECONDS else None
        return verdict


async def refused(principal: Principal, session_id: str) -> str:
    """Returns once what admitted a held-open request is refused — the credential revoked (or the session ended) —
    with the reason, as a stream would close with it; never otherwise. For a request that awaits (an async tool:
    the bridge's waits), raced against it: cancel this one when the request ends."""
    woken = asyncio.Event()
    watch = CredentialWatch(principal, session_id, wake=woken.set)
    try:
        while True:
            await woken.wait()
            woken.clear()
            reason = await watch.check()
            if reason is not None:
                return reason
    finally:
        watch.stop()
