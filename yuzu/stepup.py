"""Fresh-MFA step-up for browser sessions: a TOTP proof within the last five minutes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from django import forms
from django_otp import devices_for_user, match_token

from .audit import audit
from .auth import MFA_SESSION_KEY
from .errors import PermissionDenied
from .models import TOTPDevice

if TYPE_CHECKING:
    from django.http import HttpRequest

    from .rbac import Principal

CODE_REQUIRED = "Enter the 6-digit code your authenticator app shows for yuzu."
CODE_WRONG = "That authenticator code is not right. Enter the code your authenticator app shows now."
CODE_REUSED = ("That authenticator code was already used. Wait for the next one (the code changes every 30 "
               "seconds) and enter it.")
CODE_THROTTLED = "Too many wrong authenticator codes in a row. Wait a few seconds, then enter the current code."

MFA_FRESH_SECONDS = 300


def mfa_is_fresh(principal: Principal, now: float | None = None) -> bool:
    at = principal.mfa_verified_at
    return at is not None and (now or time.time()) - float(at) <= MFA_FRESH_SECONDS


def require_fresh_mfa(principal: Principal, permission: str = "ApiToken:Write") -> None:
    """Browser sessions must re-prove MFA for sensitive writes; tokens are their own credential."""
    if principal.via != "session":
        return
    if not mfa_is_fresh(principal):
        raise PermissionDenied(permission, "mfa_proof_missing: enter a fresh authenticator code (step-up) and retry",
                               remediation="open /admin/stepup/ and enter the current code from your authenticator app")


def code_was_used(device: object, code: str) -> bool:
    """True when ``code`` is one this TOTP device already accepted (its time step is at or before the last
    accepted one): then "wrong code" would mislead — the person typed the right code a second time."""
    return isinstance(device, TOTPDevice) and device.was_used(code)


def prove(request: HttpRequest, code: str | None) -> str | None:
    """Check an authenticator code of the signed-in admin user; on success stamp a fresh MFA proof on the
    session and return None, otherwise the message to show. A code is accepted once (django-otp remembers
    the last one used) and a device is throttled after wrong codes. Audited either way."""
    code = code.strip() if isinstance(code, str) else ""
    devices = list(devices_for_user(request.user, confirmed=True))
    throttled = bool(devices) and all(not d.verify_is_allowed()[0] for d in devices if hasattr(d, "verify_is_allowed"))
    device = match_token(request.user, code) if code else None
    audit(request.user, "auth.mfa_stepup", "success" if device else "failure", target_type="User",
          target_id=request.user.get_username())
    if device is not None:
        request.session[MFA_SESSION_KEY] = time.time()
        return None
    if not code:
        return CODE_REQUIRED
    if throttled:
        return CODE_THROTTLED
    if any(code_was_used(d, code) for d in devices):
        return CODE_REUSED
    return CODE_WRONG


class StepUpForm(forms.Form):
    """One field, the current authenticator code: the step-up page's, and the last step of setting one up."""

    otp_token = forms.CharField(label="Authenticator code", max_length=16,
                                error_messages={"required": CODE_REQUIRED},
                                widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "autofocus": True,
                                                              "inputmode": "numeric", "size": 8}))

    def clean_otp_token(self) -> str:
        code: str = "".join(self.cleaned_data["otp_token"].split())
        if not code.isdigit() or not 6 <= len(code) <= 8:
            raise forms.ValidationError(CODE_REQUIRED)
        return code
