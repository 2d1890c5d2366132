from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view

from yuzu import rbac
from yuzu.api.envelope import cid_of, ok
from yuzu.api.views import int_param, principal_of
from yuzu.errors import YuzuError

from . import services
from .models import Approval


@extend_schema(summary="Approval tickets you submitted or may review (newest 100)")
@api_view(["GET"])
def approvals_view(request):
    p = principal_of(request)
    rbac.check(p, "Approval", "Read", any_scope=True)
    status = request.query_params.get("status", "pending")
    if status not in Approval.STATUSES:
        raise YuzuError(f"status must be one of {', '.join(Approval.STATUSES)}", status=400)
    rows = services.list_approvals(p, status=status, submitted_by=request.query_params.get("submitted_by"))
    return ok(rows, count=len(rows))


@extend_schema(summary="How many approvals you may review wait for review")
@api_view(["GET"])
def pending_count_view(request):
    p = principal_of(request)
    rbac.check(p, "Approval", "Read", any_scope=True)
    return ok({"pending": services.pending_count(p) if rbac.has_any(p, "Approval", "Approve") else 0})


@extend_schema(summary="One approval ticket with its pinned targets (?page=); the status_url of a -32006 answer")
@api_view(["GET"])
def approval_detail(request, approval_id):
    p = principal_of(request)
    rbac.check(p, "Approval", "Read", any_scope=True)
    return ok(services.approval_detail(p, approval_id, int_param(request, "page", 1, 1, 10000)))


@extend_schema(request=None, summary="Withdraw your own pending ticket")
@api_view(["POST"])
def withdraw_view(request, approval_id):
    p = principal_of(request)
    rbac.check_tier(p, "Approval", "Write")  # the submitter's own ticket: no role needed, but a readonly token may not
    return ok(services.withdraw(p, approval_id, cid=cid_of(request)))


Review = inline_serializer("Review", {"comment": serializers.CharField(required=False, max_length=1024)})


def _review(request, approval_id, decision):
    comment = request.data.get("comment", "") if isinstance(request.data, dict) else ""
    return ok(services.review(principal_of(request), approval_id, decision, str(comment), cid=cid_of(request)))


@extend_schema(request=Review, summary="Approve (interactive session with a fresh MFA proof only)")
@api_view(["POST"])
def approve_view(request, approval_id):
    return _review(request, approval_id, Approval.APPROVED)


@extend_schema(request=Review, summary="Reject (interactive session with a fresh MFA proof only)")
@api_view(["POST"])
def reject_view(request, approval_id):
    return _review(request, approval_id, Approval.REJECTED)
