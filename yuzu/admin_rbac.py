"""Admin pages gated by yuzu's RBAC instead of Django's model permissions: active staff whose roles grant a
page's securable see it (Read), edit it (Write) and delete from it (Delete). The apps' admins build on it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import transaction
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import urlencode

from . import rbac
from .audit import audit
from .auth import MFA_SESSION_KEY
from .errors import YuzuError
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
    authenticators, agents, bridge profiles; the records' deletes): every add, change and delete also writes
    yuzu's audit row — Django's own change log is no audit trail (it is not in the audit log, its API or its
    export). The pages that edit through the services (ServiceForm, the RbacAdmin pages) leave the services'
    rows."""

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


class RecordAdmin(AuditedAdmin):
    """Rows the system writes — what was dispatched, what agents answered and report (fleet), a bridge's workers,
    turns, messages and inbox: shown, never added or edited here (a record of what happened is no one's to rewrite
    from a form). Deletes stay, audited: deleting what they hang from — an Agent (the way to cut one off), a User —
    deletes them too, and the admin refuses that delete to whoever may not delete them."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


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


class RevokeAction:
    """For a read-only page whose one write is a revoke action (``permissions=["revoke"]``): the action is offered
    to whoever holds Django's change permission on the model — revoking is a change — never to whoever may only view
    the rows (a viewer was offered it, and revoked with it)."""

    opts: Any

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.change_{self.opts.model_name}")


class ServiceForm(forms.ModelForm[Any]):
    """An admin form that is the service call: once its fields parse, its validation runs ``write`` — the service
    functions REST and MCP run (their checks, row locks, version and audit row) — in a savepoint, and a refusal
    (including one a concurrent edit causes at write time) is the form's error with nothing written. The page
    (ServiceFormAdmin) then saves nothing itself. ``service_fields`` names, for a service's error on one of its
    fields, the form field that shows it."""

    request: HttpRequest
    service_fields: dict[str, str] = {}
    refusal_field: str | None = None  # where a service's refusal (a YuzuError) shows: None, above the form

    def describe(self, exc: YuzuError) -> str:
        """A service's refusal as the page says it."""
        return exc.message

    def write(self, principal: rbac.Principal, data: dict[str, Any]) -> Any:
        """Call the service; return the primary key of the row it created or changed."""
        raise NotImplementedError

    def validate_unique(self) -> None:
        """The service checks uniqueness itself, at write time too (a concurrent write takes a name in between)."""

    def full_clean(self) -> None:
        super().full_clean()
        if not self.is_bound or self.errors:
            return
        try:
            with transaction.atomic():
                pk = self.write(session_principal(self.request), self.cleaned_data)
        except ValidationError as exc:
            errors = exc.error_dict if hasattr(exc, "error_dict") else {NON_FIELD_ERRORS: exc.error_list}
            for field, messages_ in errors.items():
                shown = self.service_fields.get(field, field)
                self.add_error(shown if shown in self.fields else None, messages_)
        except YuzuError as exc:
            self.add_error(self.refusal_field, self.describe(exc))
        else:
            self.instance = self._meta.model.objects.get(pk=pk)  # as written, for the page's message and redirect


class ServiceFormAdmin(admin.ModelAdmin[Any]):
    """A page whose form (a ServiceForm) has written through the service by the time Django saves: its save is
    none of Django's ``save()`` (nor its many-to-many ``set()``), and the service's audit row is the record."""

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form: Any = super().get_form(request, obj, change, **kwargs)
        form.request = request  # a class made for this request (modelform_factory)
        return form

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Written already, by the form's service call."""

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """Written already, by the form's service call."""
