"""The admin is password + TOTP (django-otp's OTPAdminSite). It also hosts the step-up page that
refreshes the MFA proof sensitive actions (approving, token writes) require.

Login is one submission: with exactly one confirmed authenticator the code is checked against it (django-otp
alone first answers "Please select a device"). Every message says "authenticator code" — never "token",
which in yuzu means an API token."""

import time
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin as DjangoGroupAdmin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.models import Group, User
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.db.models import QuerySet
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import URLPattern, URLResolver, path
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django_otp import devices_for_user
from django_otp.admin import OTPAdminAuthenticationForm, OTPAdminSite

from . import accounts, tokens
from .accounts import record_failure
from .admin_rbac import AuditedAdmin, ServiceForm, ServiceFormAdmin, StepUpAdmin, session_principal
from .audit import audit
from .auth import MFA_SESSION_KEY
from .authenticators import AuthenticatorAdmin, enrol
from .errors import YuzuError
from .middleware import request_cid
from .models import (
    AccountLockout,
    ApiToken,
    AuditEvent,
    Role,
    RoleAssignment,
    RolePermission,
    TOTPDevice,
)
from .stepup import (
    CODE_REQUIRED,
    CODE_REUSED,
    CODE_THROTTLED,
    CODE_WRONG,
    StepUpForm,
    code_was_used,
    prove,
)

DEVICE_REQUIRED = "Choose the authenticator the code comes from."
NO_DEVICE = ("This account has no authenticator set up, so it cannot sign in here. If an administrator added one for "
             "you, set it up at /admin/enrol/; otherwise ask an administrator to add one.")
ACCOUNT_LOCKED = ("This account is locked after too many failed sign-ins. Try again after {until:%H:%M} UTC, or "
                  "ask an administrator to unlock it.")
ACCOUNT_LOCKED_BY_ADMIN = "An administrator locked this account until {until:%Y-%m-%d %H:%M} UTC. Ask them to unlock it."


class LoginForm(OTPAdminAuthenticationForm):  # type: ignore[misc]  # django-otp ships no type information
    """Password + authenticator code in one submission; the device list only for several devices."""

    otp_error_messages = {
        **OTPAdminAuthenticationForm.otp_error_messages,
        "token_required": CODE_REQUIRED, "invalid_token": CODE_WRONG, "device_required": DEVICE_REQUIRED,
        "n_failed_attempts": CODE_THROTTLED, "verification_not_allowed": CODE_THROTTLED,
    }
    otp_token = forms.CharField(required=False, label="Authenticator code", max_length=16, widget=forms.TextInput(
        attrs={"autocomplete": "one-time-code", "inputmode": "numeric", "size": 8}))
    show_devices = False

    def _chosen_device(self, user: User) -> Any:  # a django_otp Device, or None
        chosen = self.cleaned_data.get("otp_device")
        if chosen and chosen not in {pid for pid, _ in self.device_choices(user)}:
            # Not one of this user's devices: django-otp loads whatever model the posted label names, and one that
            # is no device ("auth.user/1") crashed the sign-in with a 500. Treated as no choice.
            self.cleaned_data["otp_device"] = ""
        device = super()._chosen_device(user)
        if device is None and not self.cleaned_data.get("otp_device"):
            # Runs inside clean_otp's transaction: lock the device as django-otp does for a chosen one.
            devices = list(devices_for_user(user, confirmed=True, for_verify=True))
            if not devices:
                raise forms.ValidationError(NO_DEVICE, code="no_device")
            if len(devices) == 1:
                device = devices[0]
        return device

    def _verify_token(self, user: User, token: str, device: Any = None) -> Any:
        try:
            return super()._verify_token(user, token, device)
        except forms.ValidationError as exc:
            if exc.code == "invalid_token" and code_was_used(device, token):
                raise forms.ValidationError(CODE_REUSED, code="reused_code") from None
            raise

    def _update_form(self, user: User) -> None:
        # Not django-otp's: it re-renders the password into the page for a second submission we no
        # longer need. Offer the device list only when there is a choice to make.
        choices = self.device_choices(user)
        self.fields["otp_device"].widget.choices = choices
        self.show_devices = len(choices) > 2  # the blank entry + two or more devices

    def get_invalid_login_error(self) -> forms.ValidationError:
        """A locked account with the right password learns it is locked (not "wrong password"); without the
        password nobody learns whether an account exists or is locked."""
        User = get_user_model()
        user = User.objects.filter(**{User.USERNAME_FIELD: self.cleaned_data.get("username")}).first()
        lock = AccountLockout.objects.filter(user=user).first() if user is not None else None
        password = self.cleaned_data.get("password") or ""
        if user is not None and lock is not None and lock.is_locked() and user.check_password(password):
            message = ACCOUNT_LOCKED_BY_ADMIN if lock.manual else ACCOUNT_LOCKED
            return forms.ValidationError(message.format(until=lock.locked_until), code="locked")
        error: forms.ValidationError = super().get_invalid_login_error()
        return error


class YuzuAdminSite(OTPAdminSite):  # type: ignore[misc]  # django-otp ships no type information
    site_header = "yuzu administration"
    site_title = "yuzu"
    index_title = "Fleet, approvals and access"
    login_form = LoginForm
    login_template = "admin/login.html"

    def get_urls(self) -> list[URLPattern | URLResolver]:
        urls: list[URLPattern | URLResolver] = super().get_urls()
        return [path("stepup/", self.admin_view(self.stepup_view), name="stepup"),
                path("enrol/", never_cache(self.enrol_view), name="enrol")] + urls

    def enrol_view(self, request: HttpRequest) -> HttpResponse:
        """Set up the authenticator an administrator added for you (yuzu.authenticators): no sign-in needed."""
        return enrol(request, self.each_context(request))

    def stepup_view(self, request: HttpRequest) -> HttpResponse:
        """Ask for the current authenticator code and stamp a fresh MFA proof on the session."""
        next_url = request.GET.get("next") or request.POST.get("next") or "/admin/"
        if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()}):
            next_url = "/admin/"
        form = StepUpForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            problem = prove(request, form.cleaned_data["otp_token"])
            if problem is None:
                messages.success(request, "MFA proof refreshed.")
                return redirect(next_url)
            form.add_error("otp_token", problem)
        return render(request, "admin/stepup.html", {**self.each_context(request), "form": form, "next": next_url,
                                                     "title": "Confirm it's you"})


admin.site.__class__ = YuzuAdminSite


@receiver(user_logged_in)
def _stamp_mfa(sender: type, request: HttpRequest | None, user: User, **kwargs: object) -> None:
    if getattr(user, "otp_device", None) is not None and request is not None:
        request.session[MFA_SESSION_KEY] = time.time()
        AccountLockout.objects.filter(user=user).update(failed_attempts=0, locked_until=None, manual=False)
        audit(user, "auth.login", "success", target_type="User", target_id=user.get_username(), detail="mfa=totp")


@receiver(user_login_failed)
def _count_failure(sender: str, credentials: dict[str, Any], request: HttpRequest | None = None,
                   **kwargs: object) -> None:
    username = credentials.get("username")
    if username:
        record_failure(username)
        audit(username, "auth.login", "failure", target_type="User", target_id=username)


class RolePermissionInline(admin.TabularInline[RolePermission, Role]):
    model = RolePermission
    extra = 1


@admin.register(Role)
class RoleAdmin(StepUpAdmin, AuditedAdmin):
    list_display = ("name", "description", "builtin")
    inlines = [RolePermissionInline]


@admin.register(RoleAssignment)
class RoleAssignmentAdmin(StepUpAdmin, AuditedAdmin):
    list_display = ("user", "role", "group", "created_at")
    list_filter = ("role",)


# Not django-otp's TOTP page, which showed every authenticator's secret (and a QR code of it) to the superuser.
admin.site.register(TOTPDevice, AuthenticatorAdmin)


class UserAdmin(StepUpAdmin, AuditedAdmin, DjangoUserAdmin[User]):
    """Django's user page: making someone staff or superuser, or setting their password, grants as much as a role —
    and a superuser who sets an approver's password and resets their authenticator could act as them, so each edit
    leaves its audit row."""

    def user_change_password(self, request: HttpRequest, id: str, form_url: str = "") -> HttpResponse:
        step_up = self.step_up_first(request)
        return step_up if step_up is not None else super().user_change_password(request, id, form_url)


class GroupAdmin(StepUpAdmin, AuditedAdmin, DjangoGroupAdmin):
    """Django's permission groups: they grant the superuser's admin pages."""


for model, model_admin in ((User, UserAdmin), (Group, GroupAdmin)):
    admin.site.unregister(model)
    admin.site.register(model, model_admin)


@admin.register(ApiToken)
class ApiTokenAdmin(StepUpAdmin):
    """Read-only except revoke: a token's tier, expiry or revocation never changes here without the rules
    (ceiling, step-up, audit) the token service applies. Tokens are minted by the API / mint_token."""

    list_display = ("name", "owner", "prefix", "mcp_tier", "audience", "created_at", "expires_at", "last_used_at", "revoked_at")
    list_filter = ("mcp_tier", "audience")
    fields = ("id", "name", "owner", "prefix", "mcp_tier", "scope_service", "audience", "created_at", "expires_at",
              "last_used_at", "revoked_at", "retire_at", "rotated_from")
    readonly_fields = fields
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: ApiToken | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: ApiToken | None = None) -> bool:
        return False

    @admin.action(description="Revoke selected tokens (needs a fresh authenticator code)", permissions=["view"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        """The token service's revoke, token by token: the same step-up as REST's DELETE (a fresh authenticator
        code, asked by StepUpAdmin before any action runs), the same rule on whose tokens (one's own, or anyone's
        with UserManagement:Write) and the same audit row."""
        principal = session_principal(request)
        revoked = 0
        for token_id in queryset.filter(revoked_at__isnull=True).values_list("pk", flat=True):
            try:
                tokens.revoke_token(principal, token_id, cid=request_cid(request))
            except YuzuError as exc:
                messages.error(request, f"{token_id}: {exc.message}")
            else:
                revoked += 1
        messages.success(request, f"Revoked {revoked} token{'s' if revoked != 1 else ''}.")


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin[AuditEvent]):
    list_display = ("timestamp", "principal", "action", "result", "target_type", "target_id")
    list_filter = ("result", "target_type")
    search_fields = ("principal", "action", "target_id", "correlation_id")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False


class LockoutForm(ServiceForm):
    """The accounts service's lock and unlock, as REST and MCP's unlock_account: the row locked as a failed sign-in
    locks it (a full-row save wrote back the failure count the page had shown), and the service's audit rows
    (``account.lock``, ``account.unlock``). A date locks the account until then; no date unlocks it."""

    class Meta:
        model = AccountLockout
        fields = ["user", "locked_until"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "locked_until" in self.fields:
            self.fields["locked_until"].help_text = ("Until when the account is locked (new sign-ins refused, live "
                                                     "sessions ended). Leave it empty to unlock the account.")
            self.fields["locked_until"].required = self.instance.pk is None  # a new row is a lock

    def write(self, principal: Any, data: dict[str, Any]) -> Any:
        user = data["user"] if "user" in data else self.instance.user  # read-only on a change
        if self.instance.pk is not None and "locked_until" not in self.changed_data:
            return self.instance.pk  # nothing asked: the failures' own lock stays theirs
        cid = request_cid(self.request)
        if data.get("locked_until") is None:
            accounts.unlock_account(principal, user.get_username(), cid=cid)
        else:
            accounts.lock_account(principal, user.get_username(), data["locked_until"], cid=cid)
        return AccountLockout.objects.get(user=user).pk


@admin.register(AccountLockout)
class AccountLockoutAdmin(StepUpAdmin, ServiceFormAdmin, AuditedAdmin):
    """Failed sign-ins lock an account for new sign-ins only; a lock set here is an administrator's: it also ends the
    account's live sessions. Locks and unlocks go through yuzu.accounts (LockoutForm, the unlock action); a row's
    delete (a user's, with the user) stays, audited."""

    form = LockoutForm
    list_display = ("user", "failed_attempts", "locked_until", "manual")
    list_filter = ("manual",)
    actions = ["unlock"]

    def get_readonly_fields(self, request: HttpRequest, obj: AccountLockout | None = None) -> tuple[str, ...]:
        return ("user", "failed_attempts", "manual") if obj is not None else ()

    def get_fields(self, request: HttpRequest, obj: AccountLockout | None = None) -> Any:
        return ["user", "failed_attempts", "manual", "locked_until"] if obj is not None else ["user", "locked_until"]

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        return admin.ModelAdmin.log_addition(self, request, obj, message)  # the service's row is the record

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        return admin.ModelAdmin.log_change(self, request, obj, message)  # the service's row is the record

    @admin.action(description="Unlock selected accounts (needs a fresh authenticator code)", permissions=["change"])
    def unlock(self, request: HttpRequest, queryset: QuerySet[AccountLockout]) -> None:
        """unlock_account, account by account: its row lock and audit row, as over REST and MCP."""
        principal = session_principal(request)
        for lock in queryset.select_related("user"):
            accounts.unlock_account(principal, lock.user.get_username(), cid=request_cid(request))
        messages.success(request, f"Unlocked {len(queryset)} account{'s' if len(queryset) != 1 else ''}.")
