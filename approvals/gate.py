"""The approval gate: ticket-then-recall for every approval-gated MCP call (seed: "Supervised-tier /
approval-gated operations"). The pipeline calls ``gate`` after schema validation and RBAC.

No approval_id → plan the call (the tool's full validation and target resolution: nothing invalid
reaches a human), then mint with the plan's summary, risk and pinned targets (or return the caller's
identical pending ticket) → -32006.
With approval_id → look up, match tool and arguments, check status and lifetime, re-plan pinned to what
was approved (a target the approver never saw is never acted on; none reachable → refused, ticket kept),
run the tool's pre-consume precondition, then consume with one conditional UPDATE → the handler runs.
"""

import json
import re

from django.contrib.auth import get_user_model
from django.db import DatabaseError, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.crypto import salted_hmac

from mcp import jsonrpc as rpc
from mcp.pipeline import a4
from yuzu.audit import audit
from yuzu.errors import APPROVAL_POLL_RETRY_MS, STORE_FAULT_RETRY_MS, YuzuError
from yuzu.metrics import (
    MCP_APPROVAL_MASKED,
    MCP_APPROVAL_PRECONDITION,
    MCP_APPROVAL_REFUSED,
)
from yuzu.models import ApiToken
from yuzu.plans import redact_arguments
from yuzu.rbac import APPROVALS_PAGE

from .models import Approval

PLAIN_ID = re.compile(r"[A-Za-z0-9_.:@-]+")
PER_SUBMITTER_CAP = 25
GLOBAL_CAP = 1000
MISMATCH = "approval_id does not match this tool and arguments"
ALREADY_USED = "approval already used (one-time ticket)"
EXPIRED_APPROVED = "approval expired (past its 7-day lifetime)"
PRECONDITION = "approval cannot be redeemed right now; the ticket is still valid — retry later"
REMEDIATION = ("a human approver reviews it in the admin (review_url, on the Approvals page {page}); poll get_approval "
               "(or GET status_url) no faster than retry_after_ms, then re-call this tool with the same arguments "
               "plus approval_id")
#: a service-scoped token reads no ticket (docs/approvals.md): it follows its own by recalling
SCOPED_REMEDIATION = ("a human approver reviews it in the admin (review_url, on the Approvals page {page}); "
                      "re-call this tool with the same arguments plus approval_id no faster than retry_after_ms: "
                      "it answers -32006 while the ticket waits (this token is service-scoped: it may not read "
                      "tickets)")


#: arguments that carry a secret (confirm_engine_rotation's proof of possession), and command parameters whose name
#: marks one (yuzu.plans.redact): the ticket stores a keyed hash of each, never the value — the same
#: recall still matches, and neither the approvals table nor a view of a ticket holds a recoverable secret.
SECRET_ARGS = frozenset({"secret"})


def canonical_args(args):
    """Sorted keys, compact separators, UTF-8 verbatim; approval_id never part of it; secrets as their hash."""
    shown = {k: _hidden(v) if k in SECRET_ARGS else v for k, v in args.items() if k != "approval_id"}
    return json.dumps(redact_arguments(shown, _hidden), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _hidden(value):
    """A secret as the ticket keeps it: HMAC-SHA256 under the server's key, so that a copy of the table alone
    cannot test guesses of a short password. A value that is not a string (a numeric PIN) is hashed as its JSON text
    under a salt of its own: 5 and "5" stay different arguments, as they were in clear."""
    if isinstance(value, str):
        salt, text = "yuzu.approvals.secret-argument", value
    else:
        salt, text = "yuzu.approvals.secret-argument.json", json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "hmac-sha256:" + salted_hmac(salt, text, algorithm="sha256").hexdigest()


def _record(ctx, result, detail):
    audit(ctx.principal, f"mcp.{ctx.tool}", result, target_type="mcp_tool", target_id=ctx.tool,
          detail=" ".join([detail] + ctx.detail), correlation_id=ctx.cid)


def _refuse(ctx, code, message, detail, retry_after_ms=None, remediation=None):
    MCP_APPROVAL_REFUSED.inc()
    _record(ctx, "denied", detail)
    raise rpc.RpcError(code, message, a4(ctx.cid, retry_after_ms, remediation))


def _required(ctx, tool, ticket, detail):
    _record(ctx, "pending", detail)
    raise rpc.RpcError(rpc.APPROVAL_REQUIRED, f"approval required: a human must approve this call (on tier "
                       f"'{ctx.principal.tier}', {tool.securable}:{tool.operation} needs an approval)",
                       _pending_data(ctx, ticket))


def _pending_data(ctx, ticket):
    scoped = bool(ctx.principal.scope_service)  # the status_url would refuse it: no ticket reads for such a token
    follow = {} if scoped else {"status_url": f"/api/v1/approvals/{ticket.id}"}
    remediation = (SCOPED_REMEDIATION if scoped else REMEDIATION).format(page=APPROVALS_PAGE)
    return a4(ctx.cid, APPROVAL_POLL_RETRY_MS, remediation, approval_id=ticket.id, **follow,
              review_url=reverse("admin:approvals_approval_review", args=[ticket.id]), tier=ctx.principal.tier)


NOTHING_TO_APPROVE = ("nothing to approve: the target matches no connected, unquarantined agent you may act on")
UNREACHABLE = ("none of the agents this approval is pinned to can be reached now (disconnected, quarantined or no "
               "longer yours); the ticket is still valid — retry later")


def gate(ctx, tool, args, approval_id):
    agent = f"agent_id={_audited_id(args['agent_id'])} " if isinstance(args.get("agent_id"), str) else ""
    canonical = canonical_args(args)
    definition = f"mcp.{tool.name}"
    if approval_id is None:
        plan = ctx.plan = tool.plan(ctx, args)  # raises on invalid input: no ticket exists yet
        if plan.pins.get("agents") == []:
            raise YuzuError(NOTHING_TO_APPROVE, status=400, rpc_code=rpc.INVALID_PARAMS,
                            remediation="check the target with preview_scope_targets / list_agents, then call again")
        ticket, deduped = _mint(ctx, definition, canonical, plan)
        _required(ctx, tool, ticket, f"{agent}approval_id={ticket.id}" + (" (deduped)" if deduped else ""))
    return _recall(ctx, tool, args, definition, canonical, approval_id, agent)


def _audited_id(agent_id):
    """An agent_id as the audit detail records it: as it is when it is a plain id, else as a JSON string — the recall's
    refusals write it before anything checked it, and a space or a newline in it wrote words of the caller's
    choosing into the row ('… approval_id=<another> consumed')."""
    return agent_id if PLAIN_ID.fullmatch(agent_id) else json.dumps(agent_id)


def _requester(ctx):
    token = ctx.principal.token
    client = ctx.extra.get("client") or {}
    return {"token_id": token.id if token else None, "token_name": token.name if token else None,
            "tier": ctx.principal.tier or None, "client_name": client.get("name"),
            "client_version": client.get("version")}


def _mint(ctx, definition, canonical, plan):
    name = ctx.principal.name
    try:
        with transaction.atomic():
            # Serialise one submitter's mints: dedup and the per-submitter cap hold under concurrency.
            get_user_model().objects.select_for_update().filter(pk=ctx.principal.user.pk).first()
            Approval.objects.expire_stale()
            mine = Approval.objects.pending().filter(submitted_by=name)
            token = ctx.principal.token
            # this token's identical pending ticket: another token of the same person could not redeem it
            same = mine.filter(definition_id=definition, scope_expression=canonical,
                               requester__token_id=token.pk if token is not None else None
                               ).order_by("-submitted_at").first()
            if same is not None:
                return same, True
            if mine.count() >= PER_SUBMITTER_CAP:
                refusal = ("cap", None)
            elif Approval.objects.pending().count() >= GLOBAL_CAP:
                refusal = ("global", None)
            else:
                return Approval.objects.create(
                    definition_id=definition, submitted_by=name, scope_expression=canonical,
                    origin=Approval.ORIGIN_MCP, summary=plan.summary[:1024], risk=plan.risk, pins=plan.pins,
                    facts=plan.facts, requester=_requester(ctx)), False
    except DatabaseError:
        _refuse(ctx, rpc.INTERNAL_ERROR, "approval store unavailable", "approval_store_fault",
                STORE_FAULT_RETRY_MS, "retry shortly")
    if refusal[0] == "cap":
        _refuse(ctx, rpc.TIER_DENIED, f"too many pending approvals (you hold {PER_SUBMITTER_CAP}, the most one "
                f"submitter may)", "pending_cap", None,
                "withdraw the tickets you no longer need (list_pending_approvals, then withdraw_approval), or wait "
                f"for an approver to review them on the admin's Approvals page ({APPROVALS_PAGE})")
    _refuse(ctx, rpc.INTERNAL_ERROR, "the approval queue is full; retry later", "global_pending_cap",
            STORE_FAULT_RETRY_MS, "retry later")


def _recall(ctx, tool, args, definition, canonical, approval_id, agent):
    now = timezone.now()
    try:
        ticket = Approval.objects.filter(pk=approval_id).first()
    except DatabaseError:
        _refuse(ctx, rpc.INTERNAL_ERROR, "approval store unavailable", f"approval_id={approval_id} store_fault",
                STORE_FAULT_RETRY_MS, "retry shortly; the ticket is untouched")
    detail = f"{agent}approval_id={approval_id}"
    if ticket is None or ticket.definition_id != definition or ticket.scope_expression != canonical:
        _refuse(ctx, rpc.PERMISSION_DENIED, MISMATCH, f"{detail} mismatch",
                remediation="re-call with exactly the arguments the ticket was minted for")
    if ticket.origin != Approval.ORIGIN_MCP or ticket.submitted_by != ctx.principal.name \
            or not _asked_with(ticket, ctx.principal.token):
        _already_used(ctx, ticket, detail)  # before any status: another's ticket tells its caller nothing of it
    if ticket.status in (Approval.PENDING, Approval.APPROVED) and ticket.consumed_at is None \
            and ticket.is_past_lifetime(now):
        Approval.objects.filter(pk=ticket.pk, status=ticket.status, consumed_at__isnull=True).update(
            status=Approval.EXPIRED)
        ticket.status = Approval.EXPIRED
    if ticket.status == Approval.EXPIRED and ticket.reviewed_at is not None:
        # Approved, then expired — just now, on an earlier recall, or by the lazy sweep of a mint or review
        # elsewhere: the same distinct message whichever flipped it (only approved tickets carry a review).
        _refuse(ctx, rpc.PERMISSION_DENIED, EXPIRED_APPROVED, f"{detail} expired",
                remediation="call again without approval_id to request a new approval")
    if ticket.status == Approval.PENDING:
        _required(ctx, tool, ticket, f"{detail} still pending")
    if ticket.status in (Approval.REJECTED, Approval.EXPIRED, Approval.WITHDRAWN):
        _refuse(ctx, rpc.PERMISSION_DENIED, f"approval was {ticket.status}", f"{detail} {ticket.status}",
                remediation="call again without approval_id to request a new approval")
    if ticket.consumed_at is not None:
        _already_used(ctx, ticket, detail)  # before re-planning: a replay learns nothing more
    # Re-plan against what was approved: raises (ticket untouched) if the call is no longer valid.
    plan = ctx.plan = tool.plan(ctx, args, pinned=ticket.pins or {})
    if ticket.pinned_agents is not None and not plan.pins.get("agents"):
        MCP_APPROVAL_PRECONDITION.inc()
        _refuse(ctx, rpc.PERMISSION_DENIED, UNREACHABLE, f"{detail} pinned_targets_unreachable",
                remediation="retry later with the same approval_id, or call again without it for a new approval")
    if tool.precondition is not None and not tool.precondition(ctx, args):
        MCP_APPROVAL_PRECONDITION.inc()
        _refuse(ctx, rpc.PERMISSION_DENIED, PRECONDITION, f"{detail} precondition_failed",
                remediation="retry later with the same approval_id")
    consumed = Approval.objects.filter(
        pk=ticket.pk, status=Approval.APPROVED, consumed_at__isnull=True, origin=Approval.ORIGIN_MCP,
        submitted_by=ctx.principal.name,
    ).update(consumed_at=now, consumed_by=ctx.principal.name)
    if consumed != 1:
        # Lost to a revoke or a withdrawal of this (the caller's own) ticket since it was read: told as such.
        now_status = Approval.objects.filter(pk=ticket.pk).values_list("status", flat=True).first()
        if now_status in (Approval.REJECTED, Approval.WITHDRAWN):
            _refuse(ctx, rpc.PERMISSION_DENIED, f"approval was {now_status}", f"{detail} {now_status}",
                    remediation="call again without approval_id to request a new approval")
        _already_used(ctx, ticket, detail)
    ctx.note(f"consumed approval_id={ticket.id}")
    return ticket


#: how many rotations back a recalling token's lineage is followed to the token that asked
MAX_ROTATIONS = 32


def _asked_with(ticket, token):
    """Whether ``token`` is the one that asked for the ticket, or a rotation successor of it: the approver approved
    what that token (that MCP client) asked, not what any token of the same person may ask. A ticket that names no
    token (minted before tickets recorded it) is bound to its submitter only."""
    asked = (ticket.requester or {}).get("token_id")
    if asked is None:
        return True
    current = token.pk if token is not None else None
    previous = token.rotated_from_id if token is not None else None
    for _ in range(MAX_ROTATIONS):
        if current is None:
            return False
        if current == asked:
            return True
        current, previous = previous, (ApiToken.objects.filter(pk=previous).values_list("rotated_from_id", flat=True)
                                       .first() if previous is not None else None)
    return False


def _already_used(ctx, ticket, detail):
    """Replay, lost race, foreign origin and foreign submitter read alike (anti-oracle)."""
    MCP_APPROVAL_MASKED.inc()
    _refuse(ctx, rpc.PERMISSION_DENIED, ALREADY_USED, f"{detail} refused:{_real_reason(ticket, ctx)}",
            remediation="call again without approval_id to request a new approval")


def _real_reason(ticket, ctx):
    """For the audit detail only: the client always reads the same 'already used' message."""
    fresh = Approval.objects.filter(pk=ticket.pk).values("consumed_at", "origin", "submitted_by").first() or {}
    if fresh.get("origin") != Approval.ORIGIN_MCP:
        return f"foreign_origin:{fresh.get('origin')}"
    if fresh.get("submitted_by") != ctx.principal.name:
        return "foreign_submitter"
    if not _asked_with(ticket, ctx.principal.token):
        return "foreign_token"
    return "replay" if fresh.get("consumed_at") else "lost_race"
