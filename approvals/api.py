"""REST face of approvals: reading and withdrawing tickets (the MCP tools' twins), and reviewing, which only
an interactive admin session with a fresh MFA proof may do."""

from rest_framework.decorators import api_view

from mcp.schema import array, integer, obj, string
from yuzu import rbac
from yuzu.api.contract import contract, payload, tool_output
from yuzu.api.envelope import cid_of, ok
from yuzu.api.views import int_param, principal_of
from yuzu.errors import YuzuError

from . import services
from .models import Approval

TICKET = tool_output("list_pending_approvals")["properties"]["approvals"]["items"]
REVIEW = obj({"comment": string(1024)})
DECIDED = obj({"id": string(32), "status": string(16)}, ["id", "status"])


@contract("GET", "Approval tickets you submitted or may review (newest 100)", response=array(TICKET),
          query=[("status", str, "pending (default), approved, rejected, expired or withdrawn"),
                 ("submitted_by", str, "")])
@api_view(["GET"])
def approvals_view(request):
    p = principal_of(request)
    # one's own tickets need no role (the service confines the rest); a service-scoped token is refused: a ticket
    # names devices of any service (its MCP twins are of the "denied" class)
    rbac.check_tier(p, "Approval", "Read")
    status = request.query_params.get("status", "pending")
    if status not in Approval.STATUSES:
        raise YuzuError(f"status must be one of {', '.join(Approval.STATUSES)}", status=400)
    rows = services.list_approvals(p, status=status, submitted_by=request.query_params.get("submitted_by"))
    return ok(rows, count=len(rows))


@contract("GET", "How many approvals you may review wait for review",
          response=obj({"pending": integer(0, 1_000_000)}, ["pending"]))
@api_view(["GET"])
def pending_count_view(request):
    p = principal_of(request)
    rbac.check(p, "Approval", "Read", any_scope=True)
    return ok({"pending": services.pending_count(p) if rbac.has_any(p, "Approval", "Approve") else 0})


@contract("GET", "One approval ticket with its pinned targets (?page=); the status_url of a -32006 answer",
          response=tool_output("get_approval"), query=[("page", int, "target page, 50 agents per page")])
@api_view(["GET"])
def approval_detail(request, approval_id):
    p = principal_of(request)
    rbac.check_tier(p, "Approval", "Read")  # a -32006's status_url: its submitter follows it with no role of its own
    return ok(services.approval_detail(p, approval_id, int_param(request, "page", 1, 1, 10000)))


@contract("POST", "Withdraw your own pending, or approved and unused, ticket",
          response=tool_output("withdraw_approval"))
@api_view(["POST"])
def withdraw_view(request, approval_id):
    p = principal_of(request)
    rbac.check_tier(p, "Approval", "Write")  # the submitter's own ticket: no role needed, but a readonly token may not
    return ok(services.withdraw(p, approval_id, cid=cid_of(request)))


def _review(request, approval_id, decision):
    comment = payload(request, REVIEW).get("comment", "")
    return ok(services.review(principal_of(request), approval_id, decision, comment, cid=cid_of(request)))


@contract("POST", "Approve (interactive session with a fresh MFA proof only)", body=REVIEW, response=DECIDED)
@api_view(["POST"])
def approve_view(request, approval_id):
    return _review(request, approval_id, Approval.APPROVED)


@contract("POST", "Reject (interactive session with a fresh MFA proof only)", body=REVIEW, response=DECIDED)
@api_view(["POST"])
def reject_view(request, approval_id):
    return _review(request, approval_id, Approval.REJECTED)


@contract("POST", "Revoke an approved ticket not used yet (interactive session with a fresh MFA proof only); it then "
          "reads as rejected", body=REVIEW, response=DECIDED)
@api_view(["POST"])
def revoke_approval_view(request, approval_id):
    comment = payload(request, REVIEW).get("comment", "")
    return ok(services.revoke(principal_of(request), approval_id, comment, cid=cid_of(request)))
