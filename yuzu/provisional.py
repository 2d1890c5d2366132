"""A read-only call authenticated in the round trip of its audit row, not one of its own (PostgreSQL).

Every call reads the auth version before it may use a principal ``yuzu.auth`` cached (``PrincipalCache``): one
round trip before the call can start. Inside ``provisionally()`` that read travels with the call's audit row
instead: ``yuzu.auth`` answers with the cached principal at once, the call runs, and its audit row is written only
if the database still holds the version the principal was cached at — one statement both checks and writes
(``yuzu.audit``). Nothing the call computed gets out before that:

- its reads run unconfirmed; any other statement (a write) confirms first, in a round trip of its own;
- its audit row confirms: checks deferred to then (``defer``: mcp.server's session, checked in Redis meanwhile)
  are answered before the row goes, and the row is written only at the expected version;
- the reply confirms (``confirm``) when no row did;
- a version that moved, or a deferred check that failed, raises ``StaleGrant``, a BaseException, so that no
  handler's ``except Exception`` keeps it; the caller (``mcp.server.handle``) runs the call again the ordinary
  way, and the revoked token, the removed role or the ended session is refused on that very call, as without this.

What runs before the confirmation is therefore reads under a grant that may have just been revoked, whose results
nobody outside the process sees. So only a tool that does nothing but read the database may run provisionally
(``mcp.registry.Tool``'s ``pure``): a tool that sent a message, wrote to Redis or called out would do it
unconfirmed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import connection

from .models import AuthVersion


class StaleGrant(BaseException):
    """What a provisional call ran as is no longer current (or a deferred check failed): abandon the attempt and
    run the call again the ordinary way. Nothing of the attempt has left the process."""


class Provisional:
    """One call's provisional state, and the connection's execute wrapper that confirms it."""

    def __init__(self) -> None:
        self.version: int | None = None  # the auth version of the cached principal, once yuzu.auth used one
        self.confirmed = False
        self.checks: list[Callable[[], bool]] = []

    @property
    def pending(self) -> bool:
        return self.version is not None and not self.confirmed

    def confirm(self) -> None:
        """Read the version now (its own round trip) unless it was read already; StaleGrant if it moved."""
        if self.pending:
            with connection.cursor() as cursor:  # a read: the execute wrapper lets it through
                cursor.execute(AuthVersion.READ_SQL)
                row = cursor.fetchone()
            self._check(row)

    def carry(self) -> int | None:
        """For a statement that checks the version itself (yuzu.audit's row): the deferred checks answered now
        (StaleGrant if one fails), and the version the statement must find; None when nothing is pending."""
        if not self.pending:
            return None
        if not all(map(_passes, self.checks)):
            raise StaleGrant
        self.checks = []
        return self.version

    def settle(self) -> None:
        """A statement that carried the version found it unchanged."""
        self.confirmed = True

    def _check(self, row: tuple[Any, ...] | None) -> None:
        if row is None or int(row[0]) != self.version or not all(map(_passes, self.checks)):
            raise StaleGrant
        self.confirmed = True

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                 context: dict[str, Any]) -> Any:
        """The connection's execute wrapper: a statement that is not a read confirms first, unless it carries the
        version itself."""
        if self.pending and not sql.startswith("SELECT ") and not _carrying.get():
            self.confirm()
        return execute(sql, params, many, context)


def _passes(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except Exception:  # the ordinary run asks again, and answers the failure as it always does
        return False


_current: ContextVar[Provisional | None] = ContextVar("yuzu_provisional", default=None)
_carrying: ContextVar[bool] = ContextVar("yuzu_provisional_carrying", default=False)


@contextmanager
def provisionally() -> Iterator[Provisional]:
    """Within: ``yuzu.auth`` may answer a token it has cached without reading the auth version first (on
    PostgreSQL). The caller catches StaleGrant around it and, having confirmed, answers."""
    prov = Provisional()
    token = _current.set(prov)
    try:
        with connection.execute_wrapper(prov):
            yield prov
    finally:
        _current.reset(token)


def may_defer() -> Provisional | None:
    """The call's Provisional when ``yuzu.auth`` may use a cached principal unconfirmed, else None."""
    prov = _current.get()
    return prov if prov is not None and prov.version is None and connection.vendor == "postgresql" else None


def defer(check: Callable[[], bool]) -> bool:
    """Have ``check`` answered at the confirmation instead of now; False (ask it now) when nothing is pending."""
    prov = _current.get()
    if prov is None or not prov.pending:
        return False
    prov.checks.append(check)
    return True


def carry() -> int | None:
    """``Provisional.carry`` of the call in progress: None outside a pending provisional call."""
    prov = _current.get()
    return prov.carry() if prov is not None else None


def settle() -> None:
    prov = _current.get()
    if prov is not None:
        prov.settle()


@contextmanager
def carrying() -> Iterator[None]:
    """Around the statements that check the version themselves (yuzu.audit's INSERT, for whichever callers'
    rows it writes): the execute wrapper lets them through unconfirmed."""
    token = _carrying.set(True)
    try:
        yield
    finally:
        _carrying.reset(token)


def confirm() -> None:
    """Before something leaves: an audit row, a reply. A no-op outside a pending provisional call."""
    prov = _current.get()
    if prov is not None:
        prov.confirm()
