"""The admin is password + TOTP (django-otp's OTPAdminSite). It also hosts the step-up page that
refreshes the MFA proof sensitive actions (approving, token writes) require."""

import time

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.dispatch import receiver
from django.shortcuts import redirect, render
from django.urls import path
from django.utils.http import url_has_allowed_host_and_scheme
from django_otp import match_token
from django_otp.admin import OTPAdminSite

from .accounts import record_failure
from .audit import audit
from .auth import MFA_SESSION_KEY
from .models import AccountLockout, ApiToken, AuditEvent, Role, RoleAssignment, RolePermission


class YuzuAdminSite(OTPAdminSite):
    site_header = "yuzu administration"
    site_title = "yuzu"
    index_title = "Fleet, approvals and access"

    def get_urls(self):
        return [path("stepup/", self.admin_view(self.stepup_view), name="stepup")] + super().get_urls()

    def stepup_view(self, request):
        """Ask for a current TOTP code and stamp a fresh MFA proof on the session."""
        next_url = request.GET.get("next") or request.POST.get("next") or "/admin/"
        if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()}):
            next_url = "/admin/"
        form = StepUpForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            device = match_token(request.user, form.cleaned_data["otp_token"])
            if device is not None:
                request.session[MFA_SESSION_KEY] = time.time()
                audit(request.user, "auth.mfa_stepup", "success", target_type="User", target_id=request.user.get_username())
                messages.success(request, "MFA proof refreshed.")
                return redirect(next_url)
            audit(request.user, "auth.mfa_stepup", "failure", target_type="User", target_id=request.user.get_username())
            form.add_error("otp_token", "That code is not valid. Enter the current code from your authenticator.")
        return render(request, "admin/stepup.html", {**self.each_context(request), "form": form, "next": next_url,
                                                     "title": "Confirm it's you"})


class StepUpForm(forms.Form):
    otp_token = forms.CharField(label="Authenticator code", max_length=8, min_length=6,
                                widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "autofocus": True}))


admin.site.__class__ = YuzuAdminSite


@receiver(user_logged_in)
def _stamp_mfa(sender, request, user, **kwargs):
    if getattr(user, "otp_device", None) is not None and request is not None:
        request.session[MFA_SESSION_KEY] = time.time()
        AccountLockout.objects.filter(user=user).update(failed_attempts=0, locked_until=None)
        audit(user, "auth.login", "success", target_type="User", target_id=user.get_username(), detail="mfa=totp")


@receiver(user_login_failed)
def _count_failure(sender, credentials, request=None, **kwargs):
    username = credentials.get("username")
    if username:
        record_failure(username)
        audit(username, "auth.login", "failure", target_type="User", target_id=username)


class RolePermissionInline(admin.TabularInline):
    model = RolePermission
    extra = 1


@admin.register(Role)
class RoleAdmin(admin.ModelAdmin):
    list_display = ("name", "description", "builtin")
    inlines = [RolePermissionInline]


@admin.register(RoleAssignment)
class RoleAssignmentAdmin(admin.ModelAdmin):
    list_display = ("user", "role", "group", "created_at")
    list_filter = ("role",)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "prefix", "mcp_tier", "audience", "created_at", "expires_at", "last_used_at", "revoked_at")
    list_filter = ("mcp_tier", "audience")
    readonly_fields = ("id", "prefix", "owner", "created_at", "last_used_at", "rotated_from", "audience")
    fields = ("id", "name", "owner", "prefix", "mcp_tier", "scope_service", "audience", "created_at", "expires_at",
              "last_used_at", "revoked_at", "retire_at", "rotated_from")
    actions = ["revoke"]

    def has_add_permission(self, request):  # tokens are minted by the API / mint_token, shown once
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        from django.utils import timezone

        n = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        audit(request.user, "api_token.revoke", "success", target_type="ApiToken", detail=f"admin bulk revoke count={n}")


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ("timestamp", "principal", "action", "result", "target_type", "target_id")
    list_filter = ("result", "target_type")
    search_fields = ("principal", "action", "target_id", "correlation_id")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(AccountLockout)
class AccountLockoutAdmin(admin.ModelAdmin):
    list_display = ("user", "failed_attempts", "locked_until")
