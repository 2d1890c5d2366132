"""Fresh-MFA step-up for browser sessions: a TOTP proof within the last five minutes."""

import time

from .errors import PermissionDenied

MFA_FRESH_SECONDS = 300


def mfa_is_fresh(principal, now=None):
    at = principal.mfa_verified_at
    return at is not None and (now or time.time()) - float(at) <= MFA_FRESH_SECONDS


def require_fresh_mfa(principal):
    """Browser sessions must re-prove MFA for sensitive writes; tokens are their own credential."""
    if principal.via != "session":
        return
    if not mfa_is_fresh(principal):
        raise PermissionDenied("ApiToken:Write",
                               "mfa_proof_missing: enter a fresh authenticator code (step-up) and retry",
                               remediation="open /admin/stepup/ and enter the current code from your authenticator app")
