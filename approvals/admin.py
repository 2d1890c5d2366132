"""The approval surface: the Approvals page of the yuzu admin (docs/approvals.md).

Tickets are read-only here (no add, change or delete). A reviewer opens a pending ticket, writes a
comment and presses Approve or Reject; both go through ``approvals.services.review`` — the same rules as
the REST route (interactive session, enrolled TOTP device, a proof younger than five minutes, reviewer ≠
submitter, pending only), which also writes the audit rows. When the proof is stale the reviewer is sent
to the step-up page and, after a fresh code, lands back here and the interrupted review completes.
"""

import json
import time

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import HttpResponseBadRequest, HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.timesince import timesince, timeuntil

from yuzu import rbac
from yuzu.auth import MFA_SESSION_KEY
from yuzu.errors import YuzuError

from . import services
from .models import Approval

#: a review interrupted by the step-up prompt: {"id", "decision", "comment", "at"} in the session
INTENT_KEY = "yuzu_approval_review_intent"
INTENT_TTL_SECONDS = 600
STALE_PROOF = "approver_assurance_required:mfa_proof_missing"
DECISIONS = {"approve": Approval.APPROVED, "reject": Approval.REJECTED}


def pretty_arguments(scope_expression):
    """scope_expression is the canonical JSON of the tool arguments; show it indented."""
    try:
        return json.dumps(json.loads(scope_expression), indent=2, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return scope_expression


def session_principal(request):
    return rbac.Principal(user=request.user, via="session", mfa_verified_at=request.session.get(MFA_SESSION_KEY))


class StatusFilter(admin.SimpleListFilter):
    """Pending by default — the page is a review queue; "all" shows every ticket."""

    title = "status"
    parameter_name = "status"
    DEFAULT = Approval.PENDING

    def lookups(self, request, model_admin):
        return [(s, s) for s in Approval.STATUSES] + [("all", "all")]

    def current(self):
        value = self.value()
        return value if value in Approval.STATUSES or value == "all" else self.DEFAULT

    def choices(self, changelist):
        for lookup, title in self.lookup_choices:
            yield {"selected": self.current() == lookup,
                   "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                   "display": title}

    def queryset(self, request, queryset):
        value = self.current()
        return queryset if value == "all" else queryset.filter(status=value)


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    list_display = ("ticket", "tool_name", "submitted_by", "arguments", "status", "age", "expires", "review")
    list_display_links = ("ticket",)
    list_filter = (StatusFilter, "origin")
    search_fields = ("id", "definition_id", "submitted_by")
    ordering = ("-submitted_at",)
    actions = None
    list_per_page = 50
    fields = ("id", "tool_name", "definition_id", "status", "submitted_by", "submitted_at", "expires", "origin",
              "arguments", "reviewed_by", "reviewed_at", "review_comment", "consumed_at", "consumed_by")
    readonly_fields = fields

    # --- read-only: the admin reviews tickets, it never edits them -------------------------------

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _may(self, request, operation):
        user = request.user
        return bool(user.is_active and user.is_staff and rbac.may(rbac.Principal(user=user, via="session"),
                                                                  "Approval", operation))

    def has_view_permission(self, request, obj=None):
        return self._may(request, "Read")

    def has_module_permission(self, request):
        return self._may(request, "Read")

    # --- columns ---------------------------------------------------------------------------------

    @admin.display(description="ticket", ordering="id")
    def ticket(self, obj):
        return obj.id

    @admin.display(description="tool", ordering="definition_id")
    def tool_name(self, obj):
        return obj.tool

    @admin.display(description="arguments")
    def arguments(self, obj):
        return format_html('<pre class="yuzu-arguments" style="margin:0;white-space:pre-wrap">{}</pre>',
                           pretty_arguments(obj.scope_expression))

    @admin.display(description="age", ordering="submitted_at")
    def age(self, obj):
        return f"{timesince(obj.submitted_at)} ago"

    @admin.display(description="expires")
    def expires(self, obj):
        at = obj.expires_at.strftime("%Y-%m-%d %H:%M UTC")
        if obj.status not in (Approval.PENDING, Approval.APPROVED) or obj.consumed_at is not None:
            return at
        if obj.is_past_lifetime():
            return f"{at} (past its 7-day lifetime)"
        return f"{at} (in {timeuntil(obj.expires_at)})"

    @admin.display(description="review")
    def review(self, obj):
        if obj.status != Approval.PENDING:
            return "—"
        return format_html('<a class="button" href="{}">Review</a>', self.review_url(obj.id))

    # --- the review views ------------------------------------------------------------------------

    def get_urls(self):
        return [path("<str:approval_id>/review/", self.admin_site.admin_view(self.review_view),
                     name="approvals_approval_review")] + super().get_urls()

    @staticmethod
    def review_url(approval_id):
        return reverse("admin:approvals_approval_review", args=[approval_id])

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {"title": "Approvals", **(extra_context or {})})

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {"review_url": self.review_url(object_id), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra)

    def review_view(self, request, approval_id):
        """GET: the ticket and the Approve / Reject form. POST: review it. GET ?resume=1 after a
        step-up completes the review the step-up interrupted."""
        if not self.has_view_permission(request):
            raise DjangoPermissionDenied
        ticket = get_object_or_404(Approval, pk=approval_id)
        comment = ""
        if request.method == "POST":
            decision = DECISIONS.get(request.POST.get("decision", ""))
            if decision is None:
                return HttpResponseBadRequest("decision must be approve or reject")
            comment = request.POST.get("comment", "")[:1024]
            outcome = self._review(request, ticket, decision, comment)
            if outcome is not None:
                return outcome
        elif request.method == "GET":
            intent = request.session.get(INTENT_KEY)
            if request.GET.get("resume") and isinstance(intent, dict) and intent.get("id") == ticket.id:
                comment = intent.get("comment", "")
                if self._resumable(request, intent):
                    del request.session[INTENT_KEY]
                    outcome = self._review(request, ticket, intent["decision"], comment, resumed=True)
                    if outcome is not None:
                        return outcome
        else:
            return HttpResponseNotAllowed(["GET", "POST"])
        ticket.refresh_from_db()
        context = {
            **self.admin_site.each_context(request),
            "title": f"Review approval {ticket.id}",
            "opts": self.model._meta,
            "ticket": ticket,
            "arguments": pretty_arguments(ticket.scope_expression),
            "age": timesince(ticket.submitted_at),
            "expires": self.expires(ticket),
            "comment": comment,
            "changelist_url": reverse("admin:approvals_approval_changelist"),
            "stepup_url": reverse("admin:stepup"),
        }
        return TemplateResponse(request, "admin/approvals/approval/review.html", context)

    @staticmethod
    def _resumable(request, intent):
        """Only a review this session asked for recently, and only once the step-up stamped a proof
        after it was asked for."""
        asked = float(intent.get("at") or 0)
        proof = request.session.get(MFA_SESSION_KEY)
        return (time.time() - asked <= INTENT_TTL_SECONDS and intent.get("decision") in DECISIONS.values()
                and proof is not None and float(proof) >= asked)

    def _review(self, request, ticket, decision, comment, resumed=False):
        """Returns a redirect, or None to show the review page again (with the message set)."""
        try:
            result = services.review(session_principal(request), ticket.id, decision, comment,
                                     cid=getattr(request, "correlation_id", ""))
        except YuzuError as exc:
            if exc.message == STALE_PROOF and not resumed:
                request.session[INTENT_KEY] = {"id": ticket.id, "decision": decision, "comment": comment,
                                               "at": time.time()}
                back = f"{self.review_url(ticket.id)}?resume=1"
                return redirect(f"{reverse('admin:stepup')}?{urlencode({'next': back})}")
            text = exc.message if not exc.remediation or exc.status != 403 else f"{exc.message} — {exc.remediation}"
            messages.error(request, text)
            return None
        verb = "Approved" if result["status"] == Approval.APPROVED else "Rejected"
        messages.success(request, f"{verb} {ticket.tool} ticket {ticket.id} (submitted by {ticket.submitted_by}).")
        return redirect(reverse("admin:approvals_approval_changelist"))
