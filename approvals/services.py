"""Approval tickets: who sees which, what the approver is shown, reviewing and withdrawing. Shared by the
REST views, the MCP tools and the admin. The gate (minting and redeeming) lives in approvals.gate.

Visibility: a reviewer (Approval:Approve) sees the tickets they may review — every ticket with a global
grant; with a grant on management groups, the tickets whose pinned agents all lie in those groups. Everyone
else with Approval:Read sees only the tickets they submitted themselves."""

from django.db import transaction
from django.utils import timezone

from fleet.groups import agent_group_ids, agents_in_groups
from fleet.models import Agent, ManagementGroup
from yuzu import rbac
from yuzu.audit import audit
from yuzu.errors import NotFound, PermissionDenied, YuzuError
from yuzu.models import ApiToken, TOTPDevice
from yuzu.stepup import mfa_is_fresh
from yuzu.text import hidden_fields

from .models import Approval

TARGETS_PER_PAGE = 50
MAX_LIST = 100
#: the audit detail of a review of a ticket that does not exist or that the reviewer may not see (no oracle)
NOT_VISIBLE = "not found (or not one this reviewer may see)"


# --- who sees and reviews what -------------------------------------------------------------------

def _review_scope(principal):
    """None: may review every ticket; a set of group ids: tickets whose agents all lie in them; empty: none."""
    return rbac.group_scope(principal, "Approval", "Approve")


def may_review(principal, ticket, scope=False):
    scope = _review_scope(principal) if scope is False else scope
    if scope is None:
        return True
    agents = ticket.pinned_agents
    if not scope or not agents:
        return False
    return set(agents) <= set(agents_in_groups(scope).filter(pk__in=agents).values_list("agent_id", flat=True))


def _visible(principal, qs, limit):
    """Up to ``limit`` tickets of ``qs`` the principal may see, in order."""
    scope = _review_scope(principal)
    if scope is None:
        return list(qs[:limit])
    own = qs.filter(submitted_by=principal.name)
    if not scope:
        return list(own[:limit])
    rows = []
    for ticket in qs.iterator(chunk_size=200):
        if ticket.submitted_by == principal.name or may_review(principal, ticket, scope):
            rows.append(ticket)
            if len(rows) >= limit:
                break
    return rows


def list_approvals(principal, *, status="pending", submitted_by=None, limit=MAX_LIST):
    qs = Approval.objects.pending() if status == Approval.PENDING else Approval.objects.filter(status=status)
    if submitted_by:
        qs = qs.filter(submitted_by=submitted_by)
    return [a.to_dict() for a in _visible(principal, qs.order_by("-submitted_at"), limit)]


def visible_ticket(principal, approval_id):
    """The ticket if the principal submitted it or may review it; otherwise 'not found' (no oracle)."""
    ticket = Approval.objects.filter(pk=approval_id).first() if isinstance(approval_id, str) else None
    if ticket is None or not (ticket.submitted_by == principal.name or may_review(principal, ticket)):
        raise NotFound(f"approval not found: {approval_id}")
    return ticket


def pinned_targets(ticket, page=1, per_page=TARGETS_PER_PAGE):
    """One page of the agents a ticket is pinned to, as the approver sees them (hostname, OS, groups, state)."""
    ids = ticket.pinned_agents
    if ids is None:
        return None
    pages = max(1, -(-len(ids) // per_page))
    page = min(max(1, page), pages)
    chunk = sorted(ids)[(page - 1) * per_page: page * per_page]
    agents = {a.agent_id: a for a in Agent.objects.filter(pk__in=chunk)}
    names = dict(ManagementGroup.objects.values_list("id", "name"))
    rows = []
    for agent_id in chunk:
        a = agents.get(agent_id)
        if a is None:
            rows.append({"agent_id": agent_id, "hostname": None, "os": None, "groups": [], "connected": False,
                         "quarantined": False, "enrolled": False})
            continue
        rows.append({"agent_id": a.agent_id, "hostname": a.hostname, "os": a.os, "enrolled": True,
                     "groups": sorted(names[g] for g in agent_group_ids(a) if g in names),
                     "connected": a.connected, "quarantined": a.quarantined})
    return {"total": len(ids), "page": page, "pages": pages, "per_page": per_page, "agents": rows}


def approval_detail(principal, approval_id, page=1):
    ticket = visible_ticket(principal, approval_id)
    out = {**ticket.to_dict(), "facts": ticket.facts or {}, "targets": pinned_targets(ticket, page),
           "may_review": ticket.current_status == Approval.PENDING and may_review(principal, ticket)}
    out["hidden_characters"] = sorted({*out["hidden_characters"], *hidden_fields(out, ("facts", "targets"))})
    return out


def pending_count(principal=None):
    qs = Approval.objects.pending()
    if principal is None or _review_scope(principal) is None:
        return qs.count()
    return len(_visible(principal, qs, 10_000))


# --- reviewing (humans only) -------------------------------------------------------------------

def assurance_problem(principal):
    """Why this principal may not review, or None. Reviews need a human in an interactive session with an
    enrolled MFA device and a fresh proof (seed: approver assurance)."""
    if principal.via != "session":
        return "non_interactive_session"
    if not TOTPDevice.objects.filter(user=principal.user, confirmed=True).exists():
        return "mfa_not_enrolled"
    if not mfa_is_fresh(principal):
        return "mfa_proof_missing"
    return None


def asked_by(ticket, user):
    """Whether ``user``'s own token asked for the ticket: the submitter's name is compared too, but an account renamed
    since keeps its tokens."""
    token_id = (ticket.requester or {}).get("token_id")
    return token_id is not None and ApiToken.objects.filter(pk=token_id, owner=user).exists()


def _check_reviewer(principal, action, approval_id, cid):
    """What a review and a revoke ask of the person first — an interactive session with an enrolled authenticator and
    a fresh proof, then Approval:Approve somewhere — each refusal audited as ``action``."""
    problem = assurance_problem(principal)
    if problem is not None:
        audit(principal, action, "denied", target_type="Approval", target_id=approval_id,
              detail=f"approver_assurance:{problem}", correlation_id=cid)
        raise PermissionDenied("Approval:Approve", f"approver_assurance_required:{problem}",
                               remediation="sign in to the admin and confirm a fresh authenticator code (step-up)")
    if not rbac.has_any(principal, "Approval", "Approve"):
        exc = rbac.denial(principal, "Approval", "Approve")
        audit(principal, action, "denied", target_type="Approval", target_id=approval_id,
              detail=f"permission={exc.permission}", correlation_id=cid)
        raise exc


def review(principal, approval_id, decision, comment="", *, cid=""):
    """Approve or reject a pending ticket. Raises YuzuError on every refusal (REST 400/403)."""
    assert decision in (Approval.APPROVED, Approval.REJECTED)
    action = "approval.approve" if decision == Approval.APPROVED else "approval.reject"
    _check_reviewer(principal, action, approval_id, cid)
    comment = (comment or "")[:1024]
    with transaction.atomic():
        Approval.objects.expire_stale()
        ticket = Approval.objects.select_for_update().filter(pk=approval_id).first()
        refusal = None
        if ticket is None or not (ticket.submitted_by == principal.name or may_review(principal, ticket)):
            refusal = NOT_VISIBLE
        elif ticket.status != Approval.PENDING:
            refusal = f"only pending approvals can be reviewed (this one is {ticket.status})"
        elif ticket.submitted_by == principal.name or asked_by(ticket, principal.user):
            refusal = "the reviewer must differ from the submitter"
        else:
            ticket.status = decision
            ticket.reviewed_by = principal.name
            ticket.reviewed_at = timezone.now()
            ticket.review_comment = comment
            ticket.save(update_fields=["status", "reviewed_by", "reviewed_at", "review_comment"])
    if refusal is not None:
        audit(principal, action, "denied", target_type="Approval", target_id=approval_id, detail=refusal,
              correlation_id=cid)
        if refusal == NOT_VISIBLE:  # an unknown ticket and one the reviewer may not see read alike
            raise NotFound(f"approval not found: {approval_id}")
        raise YuzuError(refusal, status=400, rpc_code=-32602)
    audit(principal, action, "success", target_type="Approval", target_id=ticket.id,
          detail=f"definition_id={ticket.definition_id} submitted_by={ticket.submitted_by}", correlation_id=cid)
    return {"id": ticket.id, "status": ticket.status}


def unused_approval_problem(ticket):
    """Why an approved ticket cannot be taken back (revoked or withdrawn), or None: it must be approved, unused, within
    its lifetime, and not a schedule's standing approval (the schedule is disabled or deleted instead)."""
    if ticket.consumed_at is not None:
        return "this approval was already used; it cannot be taken back"
    if ticket.current_status != Approval.APPROVED:
        return f"only an approved, unused ticket can be revoked (this one is {ticket.current_status})"
    if ticket.origin == Approval.ORIGIN_SCHEDULE:
        return "a schedule's standing approval is not revoked here: disable or delete the schedule"
    return None


def _take_back(ticket, **changes):
    """One conditional UPDATE of an approved, unused ticket — the recall consumes with the mirror image (status
    approved, consumed_at null), so exactly one of them wins whatever the database's locking. False: the recall won."""
    return Approval.objects.filter(pk=ticket.pk, status=Approval.APPROVED, consumed_at__isnull=True).update(
        **changes) == 1


def revoke(principal, approval_id, comment="", *, cid=""):
    """A reviewer takes back an approval before it is used: the ticket reads as rejected from then on (its recall
    is refused 'approval was rejected'). The same assurance as a review (interactive session, enrolled TOTP device,
    fresh proof), confined to the tickets the reviewer may review; the submitter withdraws instead."""
    action = "approval.revoke"
    _check_reviewer(principal, action, approval_id, cid)
    comment = (comment or "")[:1024]
    with transaction.atomic():
        ticket = Approval.objects.select_for_update().filter(pk=approval_id).first()
        refusal = None
        if ticket is None or not (ticket.submitted_by == principal.name or may_review(principal, ticket)):
            refusal = NOT_VISIBLE
        elif ticket.submitted_by == principal.name or asked_by(ticket, principal.user):
            refusal = "the submitter withdraws their own ticket (withdraw); a reviewer revokes another's"
        else:
            refusal = unused_approval_problem(ticket)
        if refusal is None:
            approved_by = ticket.reviewed_by
            ticket.reviewed_by, ticket.reviewed_at = principal.name, timezone.now()
            ticket.review_comment = f"revoked (approved by {approved_by}): {comment}"[:1024]
            if not _take_back(ticket, status=Approval.REJECTED, reviewed_by=ticket.reviewed_by,
                              reviewed_at=ticket.reviewed_at, review_comment=ticket.review_comment):
                refusal = "this approval was already used; it cannot be taken back"
    if refusal is not None:
        audit(principal, action, "denied", target_type="Approval", target_id=approval_id, detail=refusal,
              correlation_id=cid)
        if refusal == NOT_VISIBLE:
            raise NotFound(f"approval not found: {approval_id}")
        raise YuzuError(refusal, status=409 if "already used" in refusal else 400, rpc_code=-32602)
    audit(principal, action, "success", target_type="Approval", target_id=ticket.id,
          detail=f"definition_id={ticket.definition_id} submitted_by={ticket.submitted_by} approved_by={approved_by}",
          correlation_id=cid)
    return {"id": ticket.id, "status": Approval.REJECTED}


def withdraw(principal, approval_id, *, cid=""):
    """The submitter takes back their own ticket while pending, or approved and not used yet (it can then never be
    approved or redeemed). Racing a recall of an approved ticket, exactly one of them wins (``_take_back``)."""
    refusal = None
    with transaction.atomic():
        ticket = Approval.objects.select_for_update().filter(pk=approval_id).first()
        if ticket is None or ticket.submitted_by != principal.name:
            raise NotFound(f"approval not found: {approval_id}")
        if ticket.current_status == Approval.PENDING:
            if not Approval.objects.filter(pk=ticket.pk, status=Approval.PENDING).update(status=Approval.WITHDRAWN):
                refusal = "only a pending ticket can be withdrawn (a review decided it meanwhile)"
        elif ticket.status == Approval.APPROVED and ticket.consumed_at is None \
                and ticket.origin != Approval.ORIGIN_SCHEDULE and ticket.current_status == Approval.APPROVED:
            if not _take_back(ticket, status=Approval.WITHDRAWN):
                refusal = "this approval was already used; it cannot be taken back"
        elif ticket.consumed_at is not None or ticket.current_status == Approval.APPROVED:
            refusal = unused_approval_problem(ticket)  # used, or a schedule's standing approval
        else:
            refusal = (f"only a pending, or approved and unused, ticket can be withdrawn (this one is "
                       f"{ticket.current_status})")
    if refusal is not None:
        audit(principal, "approval.withdraw", "denied", target_type="Approval", target_id=ticket.id, detail=refusal,
              correlation_id=cid)
        raise YuzuError(refusal, status=409, rpc_code=-32602)
    audit(principal, "approval.withdraw", "success", target_type="Approval", target_id=ticket.id,
          detail=f"definition_id={ticket.definition_id}", correlation_id=cid)
    return {"id": ticket.id, "status": Approval.WITHDRAWN}
