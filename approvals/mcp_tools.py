"""Approval MCP tools. Reviewing is for humans: approve_request / reject_request always refuse over MCP
(approver_assurance_required), after the read-only, service-scope and tier checks. A submitter reads and
withdraws its own tickets, with no role of its own needed (whoever may call a gated tool must be able to follow
its ticket: approvals.services confines what each caller sees); a reviewer reads the queue it may review."""

from mcp.registry import tool
from mcp.schema import array, enum, integer, nullable, obj, string
from yuzu.errors import PermissionDenied
from yuzu.rbac import APPROVALS_PAGE

from . import services
from .models import Approval

HIDDEN_CHARACTERS = ("The fields holding control, bidirectional or invisible characters (U+200B, U+202E, …): the text "
                     "is answered as submitted, and the review page shows those characters by name")
APPROVAL = obj({"id": string(32), "definition_id": string(160), "tool": string(128), "status": string(16),
                "summary": nullable(string(1024)), "risk": nullable(string(16)), "submitted_by": string(150),
                "submitted_at": string(64), "expires_at": string(64), "target_count": nullable(integer(0)),
                "scope_expression": string(65536),
                "hidden_characters": array(string(32), 16, description=HIDDEN_CHARACTERS)},
               ["id", "status"], additional=True)
APPROVAL_ID_ARG = string(32, "The approval_id from a -32006 answer", minLength=1)


@tool(name="list_pending_approvals", title="List approvals", securable="Approval", operation="Read", rbac=False,
      description="Approval tickets, newest first (at most 100): {id, tool, status, summary, risk, target_count, "
                  "submitted_by, submitted_at, expires_at, scope_expression, hidden_characters}. Text is as "
                  "submitted; hidden_characters names the fields holding control, bidi or invisible characters. You "
                  "see the tickets you submitted, and — if you may approve — the ones you may review. An empty list means none of those has that "
                  "status (pending tickets past their 7-day lifetime are not pending).",
      input_schema=obj({"status": enum(Approval.STATUSES, default="pending"), "submitted_by": string(150)}),
      output_schema=obj({"approvals": array(APPROVAL), "count": integer(0)}, ["approvals", "count"]))
def list_pending_approvals(ctx, args):
    rows = services.list_approvals(ctx.principal, status=args.get("status", "pending"),
                                   submitted_by=args.get("submitted_by"))
    return {"approvals": rows, "count": len(rows)}


@tool(name="get_approval", title="One approval ticket", securable="Approval", operation="Read", poll=True, rbac=False,
      description="One ticket you submitted or may review: status, summary, risk, the facts the approver sees and "
                  "one page of its pinned target agents (hostname, OS, groups). Poll it while status is pending "
                  "(no faster than every 30 s); once approved, re-call the gated tool with the same arguments plus "
                  "approval_id. An unknown or invisible id is -32602 'approval not found'.",
      input_schema=obj({"approval_id": APPROVAL_ID_ARG, "page": integer(1, 10000, "Target page (50 per page)")},
                       ["approval_id"]),
      output_schema=obj({"id": string(32), "status": string(16), "summary": nullable(string(1024)),
                         "targets": {"type": ["object", "null"]}, "facts": {"type": "object"},
                         "hidden_characters": array(string(32), 16, description=HIDDEN_CHARACTERS)},
                        ["id", "status"], additional=True))
def get_approval(ctx, args):
    return services.approval_detail(ctx.principal, args["approval_id"], args.get("page", 1))


@tool(name="withdraw_approval", title="Withdraw my approval request", securable="Approval", operation="Write",
      effect="destructive", idempotent=False, rbac=False,
      description="Withdraws a ticket you submitted (you no longer need it, or the arguments were wrong) while it "
                  "is pending, or approved and not used yet: it leaves the approvers' queue and can never be "
                  "redeemed (its recall answers 'approval was withdrawn'). Only the submitter may withdraw; a used, "
                  "rejected or expired ticket cannot be; anyone else's ticket reads as not found.",
      input_schema=obj({"approval_id": APPROVAL_ID_ARG}, ["approval_id"]),
      output_schema=obj({"id": string(32), "status": string(16)}, ["id", "status"]))
def withdraw_approval(ctx, args):
    return services.withdraw(ctx.principal, args["approval_id"], cid=ctx.cid)


REVIEW_INPUT = obj({"approval_id": string(32, minLength=1), "comment": string(1024)}, ["approval_id"])
REVIEW_OUTPUT = obj({"status": nullable(string(16))})


def _refuse(ctx, args):
    reason = "non_interactive_session"
    if ctx.principal.token is not None and ctx.principal.token.audience != "api":
        reason = "non_human_principal"
    ctx.note(f"approval_id={args['approval_id'][:32]} approver_assurance:{reason}")
    raise PermissionDenied("Approval:Approve", f"approver_assurance_required:{reason}",
                           remediation=f"a human approver reviews it on the admin's Approvals page ({APPROVALS_PAGE}) "
                                       "with a fresh authenticator code")


@tool(name="approve_request", title="Approve a request", securable="Approval", operation="Write",
      effect="destructive", idempotent=False,
      description="Always refused over MCP: approvals need a human in an interactive session with a fresh MFA "
                  "proof (the admin's Approvals page). Answers -32003 approver_assurance_required:<reason>.",
      input_schema=REVIEW_INPUT, output_schema=REVIEW_OUTPUT)
def approve_request(ctx, args):
    _refuse(ctx, args)


@tool(name="reject_request", title="Reject a request", securable="Approval", operation="Write",
      effect="destructive", idempotent=False,
      description="Always refused over MCP: reviews need a human in an interactive session with a fresh MFA "
                  "proof. Answers -32003 approver_assurance_required:<reason>.",
      input_schema=REVIEW_INPUT, output_schema=REVIEW_OUTPUT)
def reject_request(ctx, args):
    _refuse(ctx, args)
