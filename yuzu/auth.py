"""Authentication shared by REST, MCP and the bridge: a ``yuzu_`` token in ``Authorization: Bearer``
or ``X-Yuzu-Token``, or the admin session cookie. Sessions (MCP ones) never authenticate."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from .models import ApiToken, hash_secret
from .rbac import Principal

LAST_USED_GRANULARITY = timedelta(seconds=60)
MFA_SESSION_KEY = "yuzu_mfa_verified_at"


MINT_HINT = "`python manage.py mint_token --user <you> --name <label> --tier readonly`"


class AuthError(Exception):
    """Missing, malformed, expired or revoked credentials → 401 with WWW-Authenticate. ``remediation`` says
    how to get a credential that works."""

    def __init__(self, message, remediation=None):
        super().__init__(message)
        self.remediation = remediation or f"send Authorization: Bearer yuzu_…; an administrator mints a token with {MINT_HINT}"


def token_from_headers(headers):
    """``headers``: a mapping of lower-case header names to str values."""
    auth = headers.get("authorization", "")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthError("malformed Authorization header; use 'Bearer yuzu_…'")
        return value.strip()
    return headers.get("x-yuzu-token", "").strip() or None


def principal_for_token(raw, *, audiences=(ApiToken.AUDIENCE_API,), now=None):
    if not raw.startswith("yuzu_") or len(raw) != 69:
        raise AuthError("malformed token")
    now = now or timezone.now()
    try:
        token = ApiToken.objects.select_related("owner").get(token_hash=hash_secret(raw))
    except ApiToken.DoesNotExist:
        raise AuthError("unknown token") from None
    if not token.is_live(now):
        raise AuthError("token expired or revoked", f"this token no longer works: use another one (GET /api/v1/tokens lists "
                        f"yours), or have an administrator mint one with {MINT_HINT}")
    if not token.owner.is_active:
        raise AuthError("token owner is inactive", "an administrator must reactivate the user in the admin "
                        "(/admin/auth/user/)")
    if token.audience not in audiences:
        raise AuthError("token not valid for this endpoint", f"a bridge worker token works only at /mcp/bridge/; here use "
                        f"an API token (GET /api/v1/tokens lists yours; {MINT_HINT} mints one)")
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_GRANULARITY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return Principal(user=token.owner, token=token, via="token")


def principal_for_session(session_key):
    """The admin session cookie: only an OTP-verified staff session authenticates."""
    from django.contrib.sessions.backends.db import SessionStore
    from django_otp import DEVICE_ID_SESSION_KEY

    if not session_key:
        return None
    store = SessionStore(session_key=session_key)
    user_id = store.get("_auth_user_id")
    if not user_id or not store.get(DEVICE_ID_SESSION_KEY):
        return None
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return None
    return Principal(user=user, via="session", mfa_verified_at=store.get(MFA_SESSION_KEY))


def authenticate(headers, cookies=None, *, audiences=(ApiToken.AUDIENCE_API,)):
    """Return a Principal, None (no credentials at all), or raise AuthError."""
    raw = token_from_headers(headers)
    if raw:
        return principal_for_token(raw, audiences=audiences)
    if cookies:
        from django.conf import settings

        return principal_for_session(cookies.get(settings.SESSION_COOKIE_NAME))
    return None
