"""Admin pages gated by yuzu's RBAC instead of Django's model permissions: active staff whose roles grant a
page's securable see it (Read), edit it (Write) and delete from it (Delete). The apps' admins build on it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin, messages
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import urlencode

from . import rbac
from .audit import audit
from .auth import MFA_SESSION_KEY
from .stepup import mfa_is_fresh

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def session_principal(request: HttpRequest) -> rbac.Principal:
    """The admin's user as a session principal, with the time of their last authenticator proof."""
    return rbac.Principal(user=cast("User", request.user), via="session",
                          mfa_verified_at=request.session.get(MFA_SESSION_KEY))


STEP_UP_FIRST = ("This needs a fresh authenticator code (your last one is over five minutes old): enter the current "
                 "one, then carry on. Nothing was changed.")


class StepUpAdmin(admin.ModelAdmin[Any]):
    """A page whose writes change who may do what (roles, their assignments, users, authenticators, tokens): its add,
    change and delete pages and its bulk actions need a fresh authenticator code (five minutes, yuzu.stepup), so that
    a browser left signed in grants nothing. Without one the browser goes to /admin/stepup/ and comes back to the
    page — before anything is typed in, and with nothing changed. Pages that only show rows ask for nothing, nor does
    one the person may not use at all (its 403 comes first)."""

    def step_up_first(self, request: HttpRequest) -> HttpResponse | None:
        if mfa_is_fresh(session_principal(request)):
            return None
        messages.warning(request, STEP_UP_FIRST)
        return redirect(f"{reverse('admin:stepup')}?{urlencode({'next': request.get_full_path()})}")

    def changeform_view(self, request: HttpRequest, object_id: str | None = None, form_url: str = "",
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        writes = self.has_add_permission(request) if object_id is None else self.has_change_permission(request)
        step_up = self.step_up_first(request) if writes else None
        return step_up if step_up is not None else super().changeform_view(request, object_id, form_url, extra_context)

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        step_up = self.step_up_first(request) if self.has_delete_permission(request) else None
        return step_up if step_up is not None else super().delete_view(request, object_id, extra_context)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        writes = request.method == "POST"  # an action (delete selected, revoke, …) or a list edit
        step_up = self.step_up_first(request) if writes else None
        return step_up if step_up is not None else super().changelist_view(request, extra_context)


class HiddenColumnsAdmin(admin.ModelAdmin[Any]):
    """A page whose hidden columns (``exclude``) stay hidden from the query string too."""

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        """A column the page hides (``exclude``: a secret's hash) is no filter either: Django admits a lookup on any
        local column from the query string, so ?secret_sha256__startswith=a read a hidden hash a prefix at a time.
        Nor is a regular expression of the reader's (``__regex``), which the database runs against every row."""
        if lookup.split("__", 1)[0] in (self.exclude or ()):
            return False
        if lookup.rsplit("__", 1)[-1] in ("regex", "iregex"):
            return False  # a reader's own regular expression, run by the database on every row: no
        return super().lookup_allowed(lookup, value, request)


class AuditedAdmin(HiddenColumnsAdmin):
    """A page that edits rows directly (the superuser's: roles, role assignments, users, permission groups,
    authenticators, lockouts, agents, groups, device tokens, bridge profiles): every add, change and delete also writes yuzu's audit row — Django's own change log
    is no audit trail (it is not in the audit log, its API or its export). The RbacAdmin pages edit through the
    services, which audit for themselves."""

    def _audited(self, request: HttpRequest, what: str, obj: Model, detail: str = "") -> None:
        meta = self.model._meta
        audit(request.user, f"admin.{meta.model_name}.{what}", "success", target_type=meta.label,
              target_id=obj.pk, detail=f"{str(obj)[:200]} {detail}".strip())

    def log_addition(self, request: HttpRequest, obj: Model, message: Any) -> Any:
        entry = super().log_addition(request, obj, message)
        self._audited(request, "add", obj)
        return entry

    def log_change(self, request: HttpRequest, obj: Model, message: Any) -> Any:
        entry = super().log_change(request, obj, message)
        fields = sorted({f for m in message or [] if isinstance(m, dict) for f in m.get("changed", {}).get("fields", [])})
        self._audited(request, "change", obj, f"fields={','.join(fields)}" if fields else "")
        return entry

    def log_deletions(self, request: HttpRequest, queryset: Any) -> Any:
        entries = super().log_deletions(request, queryset)
        for obj in queryset:
            self._audited(request, "delete", obj)
        return entries


class RbacAdmin(HiddenColumnsAdmin):
    """A ModelAdmin whose permissions are RBAC operations on ``securable``."""

    securable = ""
    #: False: only a global grant admits. True: a grant on any management group does too (admit, then the page
    #: filters its rows to what the user may see, as the approval queue does).
    group_scoped = False

    def may(self, request: HttpRequest, operation: str) -> bool:
        user = request.user
        if not (user.is_active and user.is_staff):
            return False
        principal = rbac.Principal(user=user, via="session")
        check = rbac.has_any if self.group_scoped else rbac.may
        return check(principal, self.securable, operation)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.may(request, "Read")

    def has_view_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return self.may(request, "Read")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self.may(request, "Write")

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return self.may(request, "Write")

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return self.may(request, "Delete")


class ReadOnlyAdmin(RbacAdmin):
    """An RBAC-gated page that shows rows and never adds, edits or deletes them from the admin (the app's
    service functions, behind their own actions or tools, are the only writers)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False
