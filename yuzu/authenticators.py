"""Authenticators (yuzu.models.TOTPDevice: django-otp's TOTP device, its seed sealed): a secret known to its user
alone, so that an approval's code proves *that* approver.

The superuser's page lists them, adds one for a user, resets or deletes one, and shows whether each is confirmed — never
the secret: not in a form, a column, a filter, a search or the history. (django-otp's own page showed it, and a QR code
of it, so a superuser could compute any approver's codes and approve in their name.) An added or reset authenticator
waits unconfirmed until its user sets it up at /admin/enrol/ — with their password when they have no working
authenticator (a new account, a lost phone), otherwise signed in with one and a fresh code. That page shows the secret
(QR code and otpauth:// URI) to them, once, and confirms the authenticator with its first code. The first administrator
is enrolled by ``manage.py bootstrap`` on the terminal of whoever installs yuzu."""

from __future__ import annotations

import base64
import io
import time
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django_otp import devices_for_user
from django_otp.qr import write_qrcode_image

from .admin_rbac import AuditedAdmin, StepUpAdmin, session_principal
from .audit import audit
from .models import TOTPDevice
from .secrets import SecretError
from .stepup import CODE_THROTTLED, CODE_WRONG, StepUpForm, mfa_is_fresh

if TYPE_CHECKING:
    from django.contrib.auth.models import User

ENROL_SESSION_KEY = "yuzu_enrol"  # [device pk, time the password was checked]
ENROL_SECONDS = 600
HAS_AUTHENTICATOR = ("This account already has an authenticator: sign in with it, then open /admin/enrol/ to set up "
                     "another.")
NOTHING_PENDING = ("No authenticator is waiting to be set up for this account. Ask an administrator to add one for "
                   "you (admin → TOTP devices), then come back here.")
UNREADABLE = ("This authenticator's secret cannot be opened on this server. Ask an administrator to reset it (admin → "
              "TOTP devices), then come back here.")


def pending(user: Any) -> TOTPDevice | None:
    """The authenticator an administrator added (or reset) for ``user`` that they have not set up yet."""
    device: TOTPDevice | None = TOTPDevice.objects.filter(user=user, confirmed=False).order_by("-pk").first()
    return device


class AuthenticatorAdmin(StepUpAdmin, AuditedAdmin):
    """The TOTP device page without the secret (it is sealed, ``key_sealed``, and not editable: no form field;
    ``exclude`` keeps it out of query-string filters too); adding, resetting or deleting one needs a fresh code."""

    list_display = ("user", "name", "confirmed", "created_at", "last_used_at")
    list_filter = ("confirmed",)
    search_fields = ("user__username", "name")
    exclude = ("key_sealed",)
    actions = ["reset"]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return [(None, {"fields": ("user", "name"), "description": (
                "The new authenticator waits until its user sets it up at /admin/enrol/ with their own password: "
                "only they see its secret (QR code), and its first code confirms it.")})]
        return [(None, {"fields": ("user", "name", "confirmed", "created_at", "last_used_at")})]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("user", "confirmed", "created_at", "last_used_at") if obj is not None else ()

    def save_model(self, request: HttpRequest, obj: TOTPDevice, form: Any, change: bool) -> None:
        if not change:
            obj.confirmed = False  # its user confirms it, with its first code
        super().save_model(request, obj, form, change)

    @admin.action(description="Reset selected authenticators (a new secret; their users set them up again)")
    def reset(self, request: HttpRequest, queryset: QuerySet[TOTPDevice]) -> None:
        for device in queryset:
            device.reset()
            device.save()
            self._audited(request, "reset", device)
        messages.success(request, f"Reset {len(queryset)} authenticator(s): each user sets theirs up again at "
                                  "/admin/enrol/ (with their password when it was their only one).")


class EnrolSignInForm(AuthenticationForm):
    """Step 1 without a signed-in session: the account's password. A wrong one counts towards the lockout like a
    failed sign-in (``authenticate`` signals it); a right one signs nobody in. Valid: ``device`` is the one to set up."""

    device: TOTPDevice

    def confirm_login_allowed(self, user: User) -> None:
        super().confirm_login_allowed(user)
        if any(devices_for_user(user, confirmed=True)):
            raise forms.ValidationError(HAS_AUTHENTICATOR, code="has_authenticator")
        device = pending(user)
        if device is None:
            raise forms.ValidationError(NOTHING_PENDING, code="nothing_pending")
        self.device = device


def _unlocked_by_password(request: HttpRequest) -> TOTPDevice | None:
    """The authenticator the password of step 1 unlocked for this browser, for ten minutes."""
    held = request.session.get(ENROL_SESSION_KEY)
    if not (isinstance(held, list) and len(held) == 2 and time.time() - float(held[1]) <= ENROL_SECONDS):
        request.session.pop(ENROL_SESSION_KEY, None)
        return None
    device: TOTPDevice | None = TOTPDevice.objects.filter(
        pk=held[0], confirmed=False, user__is_active=True).select_related("user").first()
    if device is None or any(devices_for_user(device.user, confirmed=True)):
        return None
    return device


def enrol(request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
    """/admin/enrol/: set up the authenticator an administrator added for you. Step 1 proves who you are (signed in
    with a fresh code, or else your password); step 2 shows the secret and takes its first code."""
    page = {**context, "title": "Set up your authenticator"}
    user = request.user
    signed_in = bool(user.is_authenticated and getattr(user, "is_verified", lambda: False)())
    if signed_in:
        if not mfa_is_fresh(session_principal(request)):
            return redirect(f"{reverse('admin:stepup')}?{urlencode({'next': request.path})}")
        device = pending(user)
        if device is None:
            return render(request, "admin/enrol.html", {**page, "notice": NOTHING_PENDING})
    else:
        device = _unlocked_by_password(request)
        if device is None:
            sign_in = EnrolSignInForm(request, data=request.POST or None)
            if request.method == "POST" and sign_in.is_valid():
                request.session.cycle_key()  # as a sign-in does: a session id planted beforehand learns nothing
                request.session[ENROL_SESSION_KEY] = [sign_in.device.pk, time.time()]
                return redirect(request.path)
            return render(request, "admin/enrol.html", {**page, "sign_in": sign_in})
    form = StepUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        allowed = device.verify_is_allowed()[0]
        confirmed = allowed and device.verify_token(form.cleaned_data["otp_token"])
        audit(device.user, "auth.mfa_enrol", "success" if confirmed else "failure", target_type="User",
              target_id=device.user.get_username(), detail=f"authenticator={device.pk}")
        if confirmed:
            TOTPDevice.objects.filter(pk=device.pk).update(confirmed=True)
            request.session.pop(ENROL_SESSION_KEY, None)
            messages.success(request, "Your authenticator is set up." + ("" if signed_in else
                             " Sign in with your password and the code it shows."))
            return redirect("admin:index" if signed_in else "admin:login")
        form.add_error("otp_token", CODE_WRONG if allowed else CODE_THROTTLED)
    try:
        uri = device.config_url  # the seed, unsealed to be shown once
    except SecretError:  # audited by yuzu.secrets; a reset seals a new one
        return render(request, "admin/enrol.html", {**page, "notice": UNREADABLE})
    qr = io.BytesIO()
    write_qrcode_image(uri, qr)
    return render(request, "admin/enrol.html", {**page, "device": device, "form": form, "uri": uri,
                                                "qr": base64.b64encode(qr.getvalue()).decode()})
