"""Authentication shared by REST, MCP and the bridge: a ``yuzu_`` token in ``Authorization: Bearer``
or ``X-Yuzu-Token``, or the admin session cookie. Sessions (MCP ones) never authenticate. An OAuth access token is
accepted in ``Authorization: Bearer`` only (docs/oauth.md; RFC 6750 §2.1); in ``X-Yuzu-Token`` it is unknown.

Tokens an MCP client got through OAuth (docs/oauth.md) are API tokens bound to one MCP endpoint (RFC 8707): their
audience names it, and an endpoint's 401 says where a client finds out how to get one (RFC 9728)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth import get_user
from django.contrib.sessions.backends.db import SessionStore
from django.db import DatabaseError, connection
from django.utils import timezone
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.models import Device

from .faults import classify
from .models import AccountLockout, ApiToken, AuthVersion, hash_secret
from .policy import TIER_ORDER, tier_allows
from .provisional import may_defer
from .rbac import Grants, Principal, may

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger("yuzu.auth")
LAST_USED_GRANULARITY = timedelta(seconds=60)
MFA_SESSION_KEY = "yuzu_mfa_verified_at"


MINT_HINT = "`python manage.py mint_token --user <you> --name <label> --tier readonly`"

# The audience of an OAuth-issued token → the one MCP endpoint it is valid on. (A pasted API token, audience
# "api", works on both endpoints and the REST API; a bridge worker's, "bridge", on /mcp/bridge/ only.)
OAUTH_RESOURCES = {"mcp-v1": "/mcp/v1", "mcp-bridge": "/mcp/bridge"}


class AuthError(Exception):
    """Missing, malformed, expired or revoked credentials → 401 with WWW-Authenticate. ``remediation`` says
    how to get a credential that works."""

    def __init__(self, message: str, remediation: str | None = None) -> None:
        super().__init__(message)
        self.remediation = remediation or f"send Authorization: Bearer yuzu_…; an administrator mints a token with {MINT_HINT}"


def token_from_headers(headers: Mapping[str, str]) -> str | None:
    """``headers``: a mapping of lower-case header names to str values."""
    auth = headers.get("authorization", "")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthError("malformed Authorization header; use 'Bearer yuzu_…'")
        return value.strip()
    return headers.get("x-yuzu-token", "").strip() or None


@dataclass(frozen=True)
class _Known:
    """What one token resolved to, as of an auth version: the token and its owner as loaded, and the owner's
    grants. Shared read-only by every call that presents the token until the version moves."""

    token: ApiToken
    grants: Grants


class PrincipalCache:
    """Per process: token hash → what it resolved to. Each call reads the database's auth version (one
    single-row SELECT; yuzu.models.AuthVersion, moved by triggers on every change to tokens, users, roles,
    assignments and administrators' locks, in any process) and drops every entry when it moved, so a revocation,
    a removed role or a lock is refused on the very next call anywhere. Time-based ends (expiry, rotation
    retirement, a lock running out) are checked on every call against the cached token, and never need a
    version."""

    MAX_ENTRIES = 10_000

    def __init__(self) -> None:
        # (auth version, token hash → what it resolved to at that version): replaced whole, never changed in
        # place across versions, so that a reader in another thread sees a version and entries that belong together
        self.current: tuple[int, dict[str, _Known]] = (-1, {})
        # token hash → the key of the principal it last authenticated as: kept across versions (a token's id
        # and owner never change), dropped when the token is refused
        self.keys: dict[str, str] = {}

    def get(self, token_hash: str, version: int) -> _Known | None:
        if version != self.current[0]:
            self.current = (version, {})
            return None
        return self.current[1].get(token_hash)

    def put(self, token_hash: str, version: int, known: _Known) -> None:
        # -1: no version row (a test run flushed the tables): nothing would invalidate the entry, so keep none
        cached, entries = self.current
        if version == cached and version >= 0:
            if len(entries) >= self.MAX_ENTRIES:
                entries.clear()
            entries[token_hash] = known

    def note_key(self, token_hash: str, key: str | None) -> None:
        if key is None:
            self.keys.pop(token_hash, None)
        elif self.keys.get(token_hash) != key:
            if len(self.keys) >= self.MAX_ENTRIES:
                self.keys = {}
            self.keys[token_hash] = key


principals = PrincipalCache()


def _load(token_hash: str) -> _Known:
    try:
        token = ApiToken.objects.select_related("owner", "owner__lockout").get(token_hash=token_hash)
    except ApiToken.DoesNotExist:
        raise AuthError("unknown token") from None
    return _Known(token, Principal(user=token.owner, token=token).grants())


def principal_for_token(raw: str, *, audiences: Iterable[str] = (ApiToken.AUDIENCE_API,),
                        now: datetime | None = None, bearer: bool = True) -> Principal:
    """``bearer``: the token came in ``Authorization: Bearer`` (not ``X-Yuzu-Token``)."""
    if not raw.startswith("yuzu_") or len(raw) != 69:
        raise AuthError("malformed token")
    now = now or timezone.now()
    token_hash = hash_secret(raw)
    known = _provisional_known(token_hash)
    try:
        if known is None:
            version = AuthVersion.current()
            known = principals.get(token_hash, version)
            if known is None:
                known = _load(token_hash)
                principals.put(token_hash, version, known)
        _refuse_unusable(known.token, now, audiences, bearer)
    except AuthError:
        principals.note_key(token_hash, None)
        raise
    token = known.token
    principals.note_key(token_hash, Principal.key_for(token.owner_id, token.pk))
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_GRANULARITY:
        try:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        except DatabaseError as exc:
            # Bookkeeping, not authentication: a database that refuses writes (disk full, read-only) must not
            # refuse reads too (issue 22). Inside a transaction the caller's own writes fail anyway.
            if connection.in_atomic_block or classify(exc) is None:
                raise
            log.warning("token %s: last_used_at not recorded (%s)", token.id, str(exc).splitlines()[0][:120])
        else:
            token.last_used_at = now
    return Principal(user=token.owner, token=token, via="token", _grants=known.grants)


def _provisional_known(token_hash: str) -> _Known | None:
    """Inside yuzu.provisional's ``provisionally()``: what the token resolved to at the last version this process
    read, its version left to be confirmed by the call's audit row. None: read the version now."""
    prov = may_defer()
    if prov is None:
        return None
    version, entries = principals.current
    known = entries.get(token_hash)
    if known is not None:
        prov.version = version
    return known


def _refuse_unusable(token: ApiToken, now: datetime, audiences: Iterable[str], bearer: bool) -> None:
    if not bearer and token.audience in OAUTH_RESOURCES:
        raise AuthError("unknown token")  # as _load answers one that does not exist: nothing about it is told
    if not token.is_live(now):
        raise AuthError("token expired or revoked", f"this token no longer works: use another one (GET /api/v1/tokens lists "
                        f"yours), or have an administrator mint one with {MINT_HINT}")
    if not token.owner.is_active:
        raise AuthError("token owner is inactive", "an administrator must reactivate the user in the admin "
                        "(/admin/auth/user/)")
    if AccountLockout.holds_out(token.owner, now):
        raise AuthError("account locked by an administrator", "the token works again once an administrator unlocks "
                        f"the account (POST /api/v1/users/{token.owner.get_username()}/unlock, or the admin's "
                        "Account lockouts page) or the lock runs out")
    if token.audience not in audiences and token.audience in OAUTH_RESOURCES:
        raise AuthError("token not valid for this endpoint", f"this token was issued through OAuth for "
                        f"{OAUTH_RESOURCES[token.audience]}/ only: use it there, or connect your client to this "
                        "endpoint so that it gets a token for it")
    if token.audience not in audiences:
        raise AuthError("token not valid for this endpoint", f"a bridge worker token works only at /mcp/bridge/; here use "
                        f"an API token (GET /api/v1/tokens lists yours; {MINT_HINT} mints one)")


def last_principal_key(headers: Mapping[str, str]) -> str | None:
    """The key of the principal the token in ``headers`` last authenticated as in this process, from memory (no
    database read, no check): for work begun before authentication that depends on nothing but the key, and is
    used only once ``authenticate`` names that same principal (mcp.server's early session check). None for no
    token, a malformed header, a token not seen yet, or one refused since."""
    try:
        raw = token_from_headers(headers)
    except AuthError:
        return None
    return principals.keys.get(hash_secret(raw)) if raw else None


def principal_for_session(session_key: str | None) -> Principal | None:
    """The admin session cookie: only an OTP-verified staff session authenticates, and only while the admin itself
    would still accept it — Django's own check of the session (the password it was opened with: a change ends it;
    the user active and not locked out), the user still staff, the authenticator that verified it still theirs
    and confirmed (django_otp's check). Before, a session outlived all three on this face."""
    if not session_key:
        return None
    holder = _SessionHolder(SessionStore(session_key=session_key))
    if not holder.session.get(DEVICE_ID_SESSION_KEY):
        return None
    user = get_user(holder)  # type: ignore[arg-type]  # reads (on a stale hash: flushes) its .session only
    if not user.is_authenticated or not user.is_staff:
        return None
    device = Device.from_persistent_id(holder.session[DEVICE_ID_SESSION_KEY])
    if device is None or device.user_id != user.pk or not device.confirmed:
        return None
    return Principal(user=user, via="session", mfa_verified_at=holder.session.get(MFA_SESSION_KEY),
                     session_key=session_key)


@dataclass
class _SessionHolder:
    """What ``django.contrib.auth.get_user`` reads of a request: its session."""

    session: SessionStore


def authenticate(headers: Mapping[str, str], cookies: Mapping[str, str] | None = None, *,
                 audiences: Iterable[str] = (ApiToken.AUDIENCE_API,)) -> Principal | None:
    """Return a Principal, None (no credentials at all), or raise AuthError."""
    raw = token_from_headers(headers)
    if raw:
        return principal_for_token(raw, audiences=audiences, bearer=bool(headers.get("authorization")))
    if cookies:
        return principal_for_session(cookies.get(settings.SESSION_COOKIE_NAME))
    return None


def tier_scope(tier: str) -> str:
    """The OAuth scope that asks for an MCP tier."""
    return f"mcp:{tier}"


def public_base(host: str | None) -> str:
    """The origin clients reach yuzu at: YUZU_PUBLIC_URL when it is set, else the request's own host (already
    checked against ALLOWED_HOSTS)."""
    if settings.YUZU_OAUTH_ISSUER or not host:
        return settings.YUZU_OAUTH_ISSUER or settings.YUZU_PUBLIC_URL
    return f"http://{host}"


def bearer_challenge(headers: Mapping[str, str], audiences: Iterable[str], **params: str | None) -> str:
    """``WWW-Authenticate`` for an MCP endpoint accepting ``audiences``: yuzu's realm, and where its protected
    resource metadata is (RFC 9728), which leads an OAuth client to the authorization server."""
    path = next((OAUTH_RESOURCES[a] for a in audiences if a in OAUTH_RESOURCES), "")
    params = {"realm": "yuzu", "resource_metadata": f"{public_base(headers.get('host'))}/.well-known/"
              f"oauth-protected-resource{path}", **params}
    return "Bearer " + ", ".join(f'{k}="{v}"' for k, v in params.items() if v)


def tier_ceiling(user: User) -> str | None:
    """The highest MCP tier ``user`` may grant a client by OAuth consent. None without ApiToken:Write (they may not
    hold a token at all, as for POST /api/v1/tokens); else the lowest tier that covers every permission their roles
    grant beyond managing their own tokens: a higher tier would add nothing they could use."""
    principal = Principal(user=user, via="session")
    if not may(principal, "ApiToken", "Write"):
        return None
    held = [perm for perm in principal.grants() if perm[0] != "ApiToken"]
    return next(t for t in TIER_ORDER if all(tier_allows(t, *perm) for perm in held))


def step_up_scope(principal: Principal, required_tier: str | None) -> str | None:
    """For a call the token's tier refuses: the scope its holder may step up to through OAuth (MCP authorization,
    insufficient_scope), or None — a pasted token, or a tier their roles do not reach."""
    token = principal.token
    if token is None or token.audience not in OAUTH_RESOURCES or required_tier not in TIER_ORDER:
        return None
    ceiling = tier_ceiling(principal.user)
    if ceiling is None or TIER_ORDER.index(required_tier) > TIER_ORDER.index(ceiling):
        return None
    return tier_scope(required_tier)
