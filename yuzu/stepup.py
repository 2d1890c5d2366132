"""Fresh-MFA step-up for browser sessions: a TOTP proof within the last five minutes."""

import time

from .errors import PermissionDenied

MFA_FRESH_SECONDS = 300


def mfa_is_fresh(principal, now=None):
    at = principal.mfa_verified_at
    return at is not None and (now or time.time()) - float(at) <= MFA_FRESH_SECONDS


def require_fresh_mfa(principal, permission="ApiToken:Write"):
    """Browser sessions must re-prove MFA for sensitive writes; tokens are their own credential."""
    if principal.via != "session":
        return
    if not mfa_is_fresh(principal):
        raise PermissionDenied(permission, "mfa_proof_missing: enter a fresh TOTP code (step-up) and retry",
                               remediation="open /admin/stepup/ and enter a current TOTP code")


def prove(request, code):
    """Check an authenticator code of the signed-in admin user; on success stamp a fresh MFA proof on the
    session. A code is accepted once (django-otp remembers the last one used). Audited either way."""
    from django_otp import match_token

    from .audit import audit
    from .auth import MFA_SESSION_KEY

    device = match_token(request.user, code.strip()) if isinstance(code, str) and code.strip() else None
    audit(request.user, "auth.mfa_stepup", "success" if device else "failure", target_type="User",
          target_id=request.user.get_username())
    if device is None:
        return False
    request.session[MFA_SESSION_KEY] = time.time()
    return True
