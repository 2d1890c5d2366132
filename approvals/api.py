from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view

from yuzu import rbac
from yuzu.api.envelope import cid_of, ok
from yuzu.api.views import principal_of
from yuzu.errors import YuzuError

from . import services
from .models import Approval


@extend_schema(summary="List approval tickets (newest 100)")
@api_view(["GET"])
def approvals_view(request):
    rbac.check(principal_of(request), "Approval", "Read")
    status = request.query_params.get("status", "pending")
    if status not in Approval.STATUSES:
        raise YuzuError(f"status must be one of {', '.join(Approval.STATUSES)}", status=400)
    rows = services.list_approvals(status=status, submitted_by=request.query_params.get("submitted_by"))
    return ok(rows, count=len(rows))


@extend_schema(summary="How many approvals wait for review")
@api_view(["GET"])
def pending_count_view(request):
    rbac.check(principal_of(request), "Approval", "Read")
    return ok({"pending": services.pending_count()})


@extend_schema(summary="One approval ticket (the status_url of a -32006 answer)")
@api_view(["GET"])
def approval_detail(request, approval_id):
    rbac.check(principal_of(request), "Approval", "Read")
    return ok(services.get_approval(approval_id))


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
