"""Approval tickets: listing and lookups shared by REST and MCP. The gate lives in approvals.gate."""

from yuzu.errors import NotFound

from .models import Approval


def approval_view(a):
    return {"id": a.id, "definition_id": a.definition_id, "status": a.status, "submitted_by": a.submitted_by,
            "submitted_at": a.submitted_at.isoformat(), "reviewed_by": a.reviewed_by or None,
            "reviewed_at": a.reviewed_at.isoformat() if a.reviewed_at else None,
            "review_comment": a.review_comment or None, "scope_expression": a.scope_expression,
            "origin": a.origin, "consumed": a.consumed_at is not None, "expires_at": a.expires_at.isoformat()}


def list_approvals(*, status="pending", submitted_by=None, limit=100):
    qs = Approval.objects.filter(status=status)
    if submitted_by:
        qs = qs.filter(submitted_by=submitted_by)
    return [approval_view(a) for a in qs.order_by("-submitted_at")[:limit]]


def get_approval(approval_id):
    a = Approval.objects.filter(pk=approval_id).first()
    if a is None:
        raise NotFound(f"approval not found: {approval_id}")
    return approval_view(a)


# --- reviewing (humans only) -------------------------------------------------------------------

def assurance_problem(principal):
    """Why this principal may not review, or None. Reviews need a human in an interactive session with an
    enrolled MFA device and a fresh proof (seed: approver assurance)."""
    from django_otp.plugins.otp_totp.models import TOTPDevice

    from yuzu.stepup import mfa_is_fresh

    if principal.via != "session":
        return "non_interactive_session"
    if not TOTPDevice.objects.filter(user=principal.user, confirmed=True).exists():
        return "mfa_not_enrolled"
    if not mfa_is_fresh(principal):
        return "mfa_proof_missing"
    return None


def review(principal, approval_id, decision, comment="", *, cid=""):
    """Approve or reject a pending ticket. Raises YuzuError on every refusal (REST 400/403)."""
    from django.db import transaction
    from django.utils import timezone

    from yuzu import rbac
    from yuzu.audit import audit
    from yuzu.errors import PermissionDenied, YuzuError

    from .gate import expire_stale

    assert decision in (Approval.APPROVED, Approval.REJECTED)
    action = "approval.approve" if decision == Approval.APPROVED else "approval.reject"
    problem = assurance_problem(principal)
    if problem is not None:
        audit(principal, action, "denied", target_type="Approval", target_id=approval_id,
              detail=f"approver_assurance:{problem}", correlation_id=cid)
        raise PermissionDenied("Approval:Approve", f"approver_assurance_required:{problem}",
                               remediation="sign in to the admin and confirm a fresh TOTP code (step-up)")
    rbac.check(principal, "Approval", "Approve")
    comment = (comment or "")[:1024]
    with transaction.atomic():
        expire_stale()
        ticket = Approval.objects.select_for_update().filter(pk=approval_id).first()
        if ticket is None:
            raise NotFound(f"approval not found: {approval_id}")
        refusal = None
        if ticket.status != Approval.PENDING:
            refusal = f"only pending approvals can be reviewed (this one is {ticket.status})"
        elif ticket.submitted_by == principal.name:
            refusal = "the reviewer must differ from the submitter"
        if refusal is None:
            ticket.status = decision
            ticket.reviewed_by = principal.name
            ticket.reviewed_at = timezone.now()
            ticket.review_comment = comment
            ticket.save(update_fields=["status", "reviewed_by", "reviewed_at", "review_comment"])
    if refusal is not None:
        audit(principal, action, "denied", target_type="Approval", target_id=approval_id, detail=refusal,
              correlation_id=cid)
        raise YuzuError(refusal, status=400, rpc_code=-32602)
    audit(principal, action, "success", target_type="Approval", target_id=ticket.id,
          detail=f"definition_id={ticket.definition_id} submitted_by={ticket.submitted_by}", correlation_id=cid)
    return {"id": ticket.id, "status": ticket.status}


def pending_count():
    return Approval.objects.filter(status=Approval.PENDING).count()
