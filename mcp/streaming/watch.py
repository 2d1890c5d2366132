"""A held-open stream re-checks, on every tick, what admitted it: the credential is still valid (not revoked,
expired or retired; its owner still active) and the session still exists (which also slides its idle
expiry). A backend that cannot answer is given AUTH_GRACE_SECONDS before the stream closes with
auth_unavailable. Both kinds of stream (GET channel, streamed POST) tick at the same pace."""

import asyncio
import time
from collections.abc import Awaitable, Callable

from django.core.exceptions import ObjectDoesNotExist
from django.db import DatabaseError

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


def revalidate(principal: Principal, session_id: str) -> str:
    """"ok", "credential_revoked", "session_terminated", "session_deleted" (by its client's own DELETE), or
    "indeterminate" (the backend did not answer). Runs in a worker thread."""
    try:
        token = principal.token
        if token is not None:
            token.refresh_from_db(fields=["revoked_at", "expires_at", "retire_at"])
            if not token.is_live():
                return "credential_revoked"
        user = principal.user
        user.refresh_from_db(fields=["is_active"])
        if not user.is_active:
            return "credential_revoked"
        if session_id and store().validate(session_id, principal.key) is None:  # "": a modern, session-less stream
            return "session_deleted" if store().deleted_by_client(session_id, principal.key) else "session_terminated"
        return "ok"
    except ObjectDoesNotExist:
        return "credential_revoked"
    except (DatabaseError, OSError):
        return "indeterminate"


class CredentialWatch:
    """A stream's tick verdict: None to go on, else the reason to close with."""

    def __init__(self, principal: Principal, session_id: str) -> None:
        self.principal, self.session_id = principal, session_id
        self.failing_since: float | None = None

    async def check(self) -> str | None:
        verdict = await hop(revalidate)(self.principal, self.session_id)
        if verdict == "ok":
            self.failing_since = None
            return None
        if verdict == "indeterminate":
            self.failing_since = self.failing_since or time.monotonic()
            return "auth_unavailable" if time.monotonic() - self.failing_since >= AUTH_GRACE_SECONDS else None
        return verdict
