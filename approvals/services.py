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
