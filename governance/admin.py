"""Governance in the admin: engine principals (read-only: their changes go through the gated tools or REST),
and access reviews as a reviewer's workflow — open a campaign, go down its frozen grants pressing Keep or Revoke
(with a fresh authenticator code, step-up), then close it, which applies the revocations. Every button calls
the same service function as the MCP tool and the REST route."""

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import HttpResponseBadRequest, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from yuzu.admin_rbac import ReadOnlyAdmin, session_principal
from yuzu.errors import YuzuError
from yuzu.stepup import mfa_is_fresh, prove

from . import reviews
from .models import AccessReviewAttestation, AccessReviewCampaign, EnginePrincipal


@admin.register(EnginePrincipal)
class EnginePrincipalAdmin(ReadOnlyAdmin):
    """Rows are never deleted here: revoke through revoke_engine_principal."""

    securable = "EnginePrincipal"
    list_display = ("principal_id", "display_name", "owner", "classification", "lifecycle_state", "live_credentials",
                    "created_at", "revoked_at")
    list_filter = ("lifecycle_state", "classification")
    search_fields = ("principal_id", "display_name", "owner__username")
    readonly_fields = [f.name for f in EnginePrincipal._meta.fields]

    @admin.display(description="live credentials")
    def live_credentials(self, obj):
        return obj.active_credentials().count()


DECISIONS = {"keep": AccessReviewAttestation.Decision.ATTESTED, "revoke": AccessReviewAttestation.Decision.FLAGGED_REVOKE}


@admin.register(AccessReviewCampaign)
class AccessReviewAdmin(ReadOnlyAdmin):
    """Campaigns are opened with the tool or REST (opening freezes the population in one transaction); this
    page is the reviewer's keep/revoke workflow."""

    securable = "AccessReview"
    list_display = ("title", "status", "grant_count", "created_by", "closed_by", "revocations_applied")
    list_filter = ("status",)
    actions = None

    def get_urls(self):
        return [path("<str:campaign_id>/review/", self.admin_site.admin_view(self.review_view),
                     name="governance_accessreviewcampaign_review")] + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return HttpResponseRedirect(reverse("admin:governance_accessreviewcampaign_review", args=[object_id]))

    def review_view(self, request, campaign_id):
        """GET: the campaign's frozen grants with Keep / Revoke buttons. POST: one decision (or close), with the
        authenticator code checked first when the sign-in proof is older than five minutes."""
        if not self.has_view_permission(request):
            raise DjangoPermissionDenied
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        campaign = get_object_or_404(AccessReviewCampaign, pk=campaign_id) if _is_uuid(campaign_id) else None
        if campaign is None:
            return HttpResponseBadRequest("no such campaign")
        code_error = None
        if request.method == "POST":
            code = request.POST.get("otp_token", "")
            if not mfa_is_fresh(session_principal(request)):
                code_error = prove(request, code)
            if code_error is None:
                self._act(request, campaign)
                return HttpResponseRedirect(request.path)
        principal = session_principal(request)
        rows = list(campaign.attestations.all())
        context = {**self.admin_site.each_context(request), "title": f"Access review: {campaign.title}",
                   "opts": self.model._meta, "campaign": campaign, "rows": rows,
                   "pending": sum(1 for r in rows if r.decision == "pending"),
                   "needs_code": not mfa_is_fresh(principal), "code_error": code_error,
                   "may_attest": self.may(request, "Attest") and campaign.status == "open",
                   "changelist_url": reverse("admin:governance_accessreviewcampaign_changelist")}
        return TemplateResponse(request, "admin/governance/accessreviewcampaign/review.html", context)

    def _act(self, request, campaign):
        principal = session_principal(request)
        cid = getattr(request, "correlation_id", "")
        try:
            if request.POST.get("action") == "close":
                out = reviews.close_access_review(principal, str(campaign.pk), cid=cid)
                messages.success(request, f"Review closed; {out['revocations_applied']} grant(s) revoked.")
                return
            decision = DECISIONS.get(request.POST.get("decision", ""))
            row = campaign.attestations.filter(pk=request.POST.get("row", "")).first() \
                if str(request.POST.get("row", "")).isdecimal() else None
            if decision is None or row is None:
                messages.error(request, "Choose Keep or Revoke on one grant.")
                return
            reviews.record_attestation(principal, str(campaign.pk), row.principal_type, row.principal_id,
                                       row.role_name, decision, request.POST.get("justification", "")[:2048], cid=cid)
            verb = "kept" if decision == "attested" else "flagged for revocation (applied when the review closes)"
            messages.success(request, f"{row.principal_id} — {row.role_name}: {verb}.")
        except YuzuError as exc:
            messages.error(request, exc.message)


def _is_uuid(text):
    import uuid  # deferred: only this view parses campaign ids from a URL

    try:
        uuid.UUID(str(text))
    except ValueError:
        return False
    return True
