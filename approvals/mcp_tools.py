"""Approval MCP tools. Reviewing is for humans: approve_request / reject_request always refuse over MCP
(approver_assurance_required), after the read-only, service-scope and tier checks."""

from mcp.registry import tool
from mcp.schema import array, enum, integer, nullable, obj, string
from yuzu.errors import PermissionDenied

from . import services

APPROVAL = obj({"id": string(32), "definition_id": string(160), "status": string(16), "submitted_by": string(150),
                "submitted_at": string(64), "scope_expression": string(65536)}, ["id", "status"], additional=True)


@tool(name="list_pending_approvals", title="List approvals", securable="Approval", operation="Read",
      description="Approval tickets {id, definition_id, status, submitted_by, submitted_at, scope_expression}, "
                  "newest first (at most 100). An empty list means no ticket has that status.",
      input_schema=obj({"status": enum(["pending", "approved", "rejected", "expired"], default="pending"),
                        "submitted_by": string(150)}),
      output_schema=obj({"approvals": array(APPROVAL), "count": integer(0)}, ["approvals", "count"]))
def list_pending_approvals(ctx, args):
    rows = services.list_approvals(status=args.get("status", "pending"), submitted_by=args.get("submitted_by"))
    return {"approvals": rows, "count": len(rows)}


REVIEW_INPUT = obj({"approval_id": string(32, minLength=1), "comment": string(1024)}, ["approval_id"])
REVIEW_OUTPUT = obj({"status": nullable(string(16))})


def _refuse(ctx, args):
    reason = "non_interactive_session"
    if ctx.principal.token is not None and ctx.principal.token.audience != "api":
        reason = "non_human_principal"
    ctx.note(f"approval_id={args['approval_id'][:32]} approver_assurance:{reason}")
    raise PermissionDenied("Approval:Approve", f"approver_assurance_required:{reason}",
                           remediation="approve in the yuzu admin (Approvals page) with a fresh MFA proof")


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
