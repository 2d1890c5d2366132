"""The approval surface: the Approvals page of the yuzu admin (docs/approvals.md).

The queue lists what each ticket will do (summary, targets, risk), who asked and how long ago, newest
first, with bulk reject. The review page shows the facts the call was planned with before the ticket
existed: the summary, the pinned target agents (paginated), the plugin action's risk and description, the
submitter's token and MCP client, and the raw arguments folded below. Approve and Reject are one POST: a
stale MFA proof is refreshed by the authenticator code typed into the same form. Both go through
``approvals.services.review`` — the same rules as the REST route (interactive session, enrolled TOTP device,
a proof younger than five minutes, reviewer ≠ submitter, pending only, confined to the reviewer's groups),
which also writes the audit rows. An approved ticket not used yet can be revoked from the same page, with the same
proof (``approvals.services.revoke``): it then reads as rejected. Tickets are never edited here.
"""

import json

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import HttpResponseBadRequest, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.timesince import timesince, timeuntil

from yuzu import rbac
from yuzu.admin_rbac import ReadOnlyAdmin, session_principal
from yuzu.errors import YuzuError
from yuzu.plans import redact_arguments
from yuzu.stepup import mfa_is_fresh, prove
from yuzu.text import visible

from . import services
from .models import Approval

DECISIONS = {"approve": Approval.APPROVED, "reject": Approval.REJECTED, "revoke": "revoke"}
RISK_COLOURS = {"destructive": "#ba2121", "write": "#b36b00", "read": "#417690"}


def pretty_arguments(scope_expression):
    """The canonical JSON of the tool arguments, indented, with secret command parameters redacted, and control and
    bidi characters shown by name (yuzu.text.visible)."""
    try:
        args = json.loads(scope_expression)
    except (TypeError, ValueError):
        return visible(scope_expression, multiline=True)
    if isinstance(args, dict):
        args = redact_arguments(args)  # the ticket holds their keyed hashes: noise to a reviewer
    return visible(json.dumps(args, indent=2, sort_keys=True, ensure_ascii=False), multiline=True)


def risk_badge(risk):
    if not risk:
        return "—"
    return format_html('<span class="yuzu-risk yuzu-risk-{}" style="color:#fff;background:{};padding:1px 6px;'
                       'border-radius:3px;font-size:11px;text-transform:uppercase">{}</span>',
                       risk, RISK_COLOURS.get(risk, "#666"), risk)


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
        if value == "all":
            return queryset
        # A pending ticket past its 7-day lifetime has left the queue, swept or not.
        return queryset & Approval.objects.pending() if value == Approval.PENDING else queryset.filter(status=value)


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    securable = "Approval"
    group_scoped = True  # approvers of one group see (and review) that group's tickets
    list_display = ("what", "targets", "risk_class", "requested_by", "age", "expires", "status")
    list_display_links = None
    list_filter = (StatusFilter, "origin")
    search_fields = ("id", "definition_id", "submitted_by", "summary")
    ordering = ("-submitted_at",)
    actions = ["reject_selected"]
    list_per_page = 50
    fields = ("id", "tool_name", "summary", "status", "submitted_by", "submitted_at", "expires", "origin",
              "arguments", "reviewed_by", "reviewed_at", "review_comment", "consumed_at", "consumed_by")
    readonly_fields = fields

    # --- read-only (ReadOnlyAdmin): the admin reviews tickets, it never edits them -----------------

    def get_queryset(self, request):
        """Only the tickets this user submitted or may review (services: visibility rules)."""
        qs = super().get_queryset(request)
        principal = session_principal(request)
        if services._review_scope(principal) is None:
            return qs
        return qs.filter(pk__in=[t.pk for t in services._visible(principal, qs, 10_000)])

    def get_actions(self, request):
        actions = super().get_actions(request)
        if not self.may(request, "Approve"):
            actions.pop("reject_selected", None)
        return actions

    # --- columns ---------------------------------------------------------------------------------

    @admin.display(description="what will happen", ordering="summary")
    def what(self, obj):
        text = visible(obj.summary or obj.tool)
        return format_html('<a href="{}" class="yuzu-review-link">{}</a><br><small style="color:var(--body-quiet-color)">'
                           '{} · {}</small>', self.review_url(obj.id), text[:160] + ("…" if len(text) > 160 else ""),
                           obj.tool, obj.id[:8])

    @admin.display(description="targets")
    def targets(self, obj):
        agents = obj.pinned_agents
        return "—" if agents is None else len(agents)

    @admin.display(description="risk", ordering="risk")
    def risk_class(self, obj):
        return risk_badge(obj.risk)

    @admin.display(description="requested by", ordering="submitted_by")
    def requested_by(self, obj):
        r = obj.requester or {}
        via = " ".join(x for x in (r.get("client_name"), r.get("client_version")) if x)
        tier = f"{r['tier']} token" if r.get("tier") else "token"
        return format_html("{}<br><small style=\"color:var(--body-quiet-color)\">{}{}</small>", visible(obj.submitted_by),
                           tier, visible(f" · {via}") if via else "")

    @admin.display(description="age", ordering="submitted_at")
    def age(self, obj):
        return f"{timesince(obj.submitted_at)} ago"

    @admin.display(description="expires")
    def expires(self, obj):
        if not obj.lapses:
            return "—"
        if obj.is_past_lifetime():
            return "expired"
        return f"in {timeuntil(obj.expires_at)}"

    @admin.display(description="tool", ordering="definition_id")
    def tool_name(self, obj):
        return obj.tool

    @admin.display(description="arguments")
    def arguments(self, obj):
        return format_html('<pre class="yuzu-arguments" style="margin:0;white-space:pre-wrap">{}</pre>',
                           pretty_arguments(obj.scope_expression))

    # --- bulk reject -----------------------------------------------------------------------------

    @admin.action(description="Reject selected tickets")
    def reject_selected(self, request, queryset):
        """An intermediate page asks for a comment (and an authenticator code when the proof is stale), then
        rejects each pending ticket through the same service as a single review."""
        tickets = list(queryset.filter(status=Approval.PENDING))
        principal = session_principal(request)
        error = None
        if request.POST.get("confirm") == "yes":
            error = None if mfa_is_fresh(principal) else prove(request, request.POST.get("otp_token", ""))
            if error is None:
                comment = request.POST.get("comment", "")[:1024]
                done, refused = 0, []
                for t in tickets:
                    try:
                        services.review(session_principal(request), t.id, Approval.REJECTED, comment,
                                        cid=getattr(request, "correlation_id", ""))
                        done += 1
                    except YuzuError as exc:
                        refused.append(f"{t.id[:8]}: {exc.message}")
                if done:
                    messages.success(request, f"Rejected {done} ticket{'s' if done != 1 else ''}.")
                for text in refused:
                    messages.error(request, text)
                return None
        context = {**self.admin_site.each_context(request), "title": "Reject tickets", "opts": self.model._meta,
                   "tickets": tickets, "needs_code": not mfa_is_fresh(principal), "error": error,
                   "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
                   "comment": request.POST.get("comment", "")}
        return TemplateResponse(request, "admin/approvals/approval/bulk_reject.html", context)

    # --- the review view -------------------------------------------------------------------------

    def get_urls(self):
        return [path("<str:approval_id>/review/", self.admin_site.admin_view(self.review_view),
                     name="approvals_approval_review")] + super().get_urls()

    @staticmethod
    def review_url(approval_id):
        return reverse("admin:approvals_approval_review", args=[approval_id])

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {"title": "Approvals", **(extra_context or {})})

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return HttpResponseRedirect(self.review_url(object_id))

    def review_view(self, request, approval_id):
        """GET: the ticket, its facts and the Approve / Reject form. POST: review it (with the authenticator
        code, when the MFA proof is stale, checked first in the same request)."""
        if not self.has_view_permission(request):
            raise DjangoPermissionDenied
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        ticket = get_object_or_404(self.get_queryset(request), pk=approval_id)
        comment, code_error = "", None
        if request.method == "POST":
            decision = DECISIONS.get(request.POST.get("decision", ""))
            if decision is None:
                return HttpResponseBadRequest("decision must be approve, reject or revoke")
            comment = request.POST.get("comment", "")[:1024]
            code = request.POST.get("otp_token", "")
            if code.strip() and not mfa_is_fresh(session_principal(request)):
                code_error = prove(request, code)
            if code_error is None:
                outcome = self._review(request, ticket, decision, comment)
                if outcome is not None:
                    return outcome
        ticket.refresh_from_db()
        principal = session_principal(request)
        page = request.GET.get("page", "1")
        targets = services.pinned_targets(ticket, int(page) if page.isdecimal() else 1)  # not isdigit: "²"
        reviewer = (rbac.has_any(principal, "Approval", "Approve") and ticket.submitted_by != principal.name
                    and not services.asked_by(ticket, principal.user))
        context = {
            **self.admin_site.each_context(request),
            "title": visible(ticket.summary) or f"Review approval {ticket.id}",
            "opts": self.model._meta,
            "ticket": ticket,
            "risk": risk_badge(ticket.risk),
            "facts": ticket.facts or {},
            "requester": ticket.requester or {},
            "targets": targets,
            "arguments": pretty_arguments(ticket.scope_expression),
            "age": timesince(ticket.submitted_at),
            "expires": self.expires(ticket),
            "comment": comment,
            "code_error": code_error,
            "needs_code": not mfa_is_fresh(principal),
            "may_review": ticket.current_status == Approval.PENDING and reviewer,
            "may_revoke": reviewer and services.unused_approval_problem(ticket) is None,
            "changelist_url": reverse("admin:approvals_approval_changelist"),
        }
        return TemplateResponse(request, "admin/approvals/approval/review.html", context)

    def _review(self, request, ticket, decision, comment):
        """Returns a redirect, or None to show the review page again (with the message set)."""
        cid = getattr(request, "correlation_id", "")
        try:
            if decision == "revoke":
                result = services.revoke(session_principal(request), ticket.id, comment, cid=cid)
            else:
                result = services.review(session_principal(request), ticket.id, decision, comment, cid=cid)
        except YuzuError as exc:
            if exc.message.endswith(":mfa_proof_missing"):
                messages.error(request, "Your sign-in proof is older than five minutes: enter the current code "
                                        "from your authenticator app with your decision.")
            else:
                text = exc.message if not exc.remediation or exc.status != 403 else f"{exc.message} — {exc.remediation}"
                messages.error(request, text)
            return None
        verb = {"revoke": "Approval revoked"}.get(decision) or (
            "Approved" if result["status"] == Approval.APPROVED else "Rejected")
        messages.success(request, f"{verb}: {visible(ticket.summary or ticket.tool)} (ticket {ticket.id}, "
                                  f"submitted by {visible(ticket.submitted_by)}).")
        return redirect(reverse("admin:approvals_approval_changelist"))
