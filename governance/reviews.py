"""Access reviews (spec/governance.md §2, SOC 2 CC6.2): a campaign freezes who holds which role where — every
direct role assignment of users and engine principals (API tokens act with their owner's roles, so a token's
authority is its owner's grant) — reviewers attest keep or flag-for-revoke per frozen grant, and closing the
campaign applies the flagged revocations (each audited). The export is evidence an auditor can verify: its
rows with the SHA-256 of their canonical JSON.

The check is always global (AccessReview is no management group's), engine-classed callers are denied, and
nothing here is approval-gated (Attest is not in the approval rule)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import time
import uuid
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Max

from yuzu import rbac
from yuzu.audit import audit
from yuzu.errors import STORE_FAULT_RETRY_MS, NotFound, PermissionDenied, YuzuError
from yuzu.models import ApiToken, RoleAssignment
from yuzu.policy import requires_approval
from yuzu.stepup import require_fresh_mfa

from .engines import deny_engine
from .models import AccessReviewAttestation, AccessReviewCampaign, EnginePrincipal, is_engine_user

MAX_LISTED = 500
CSV_INJECTION = ("=", "+", "-", "@", "\t", "\r")
Att = AccessReviewAttestation


def _now_ms() -> int:
    return int(time.time() * 1000)


def _authorize(principal: rbac.Principal, operation: str) -> None:
    deny_engine(principal, f"AccessReview:{operation}")
    rbac.refuse_service_scoped(principal, "AccessReview", operation)
    if not rbac.may(principal, "AccessReview", operation):
        raise rbac.denial(principal, "AccessReview", operation)
    if operation != "Read":
        require_fresh_mfa(principal, f"AccessReview:{operation}")


def _partial() -> YuzuError:
    return YuzuError("the grant population could not be read completely", status=503, rpc_code=-32603,
                     retry_after_ms=STORE_FAULT_RETRY_MS, remediation="retry shortly; nothing partial is returned")


def role_label(ra: RoleAssignment) -> str:
    return ra.role.name if ra.group is None else f"{ra.role.name}@{ra.group.name}"


def _grants() -> list[dict[str, Any]]:
    """Every live direct grant with its principal's frozen facts."""
    engines = {ep.account_id: ep for ep in EnginePrincipal.objects.select_related("owner")}
    out = []
    for ra in RoleAssignment.objects.select_related("user", "role", "group").order_by("id"):
        user = ra.user
        ep = engines.get(user.pk)
        if ep is not None:
            facts = {"principal_type": "engine", "principal_id": ep.principal_id, "display_name": ep.display_name,
                     "owner_or_email": ep.owner.get_username(), "classification": ep.classification,
                     "lifecycle_state": ep.lifecycle_state, "source": "engine"}
        elif is_engine_user(user):  # an engine account with no registry row: an orphan grant
            facts = {"principal_type": "engine", "principal_id": user.get_username(), "display_name": "",
                     "owner_or_email": "", "classification": "", "lifecycle_state": "unknown", "source": "orphan"}
        else:
            facts = {"principal_type": "user", "principal_id": user.get_username(),
                     "display_name": user.get_full_name() or user.get_username(), "owner_or_email": user.email,
                     "classification": "", "lifecycle_state": "active" if user.is_active else "inactive",
                     "source": "user"}
        out.append({**facts, "role_name": role_label(ra), "assignment_id": ra.pk, "user": user})
    return out


def digest(rows: list[dict[str, Any]]) -> str:
    """SHA-256 of the rows' canonical JSON (sorted keys, compact, UTF-8): what an auditor recomputes."""
    return hashlib.sha256(json.dumps(rows, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                          .encode()).hexdigest()


# --- export -----------------------------------------------------------------------------------------

def export_access_review(principal: rbac.Principal, campaign_id: str | None = None, *, cid: str = "",
                         fmt: str = "json") -> dict[str, Any]:
    """One row per principal holding ≥1 live direct grant (or, with ``campaign_id``, the campaign's frozen rows
    and their decisions), plus ``sha256`` over the rows' canonical JSON."""
    _authorize(principal, "Read")
    try:
        if campaign_id:
            campaign = _campaign(campaign_id)
            rows = [a.to_dict() for a in campaign.attestations.all()]
            doc: dict[str, Any] = {"campaign": campaign.to_dict()}
        else:
            rows = _principal_rows()
            doc = {}
    except DatabaseError:
        raise _partial() from None
    audit(principal, "access_review.exported", "success", target_type="AccessReviewCampaign",
          target_id=campaign_id or "", detail=f"format={fmt} rows={len(rows)}", correlation_id=cid)
    return {**doc, "count": len(rows), "rows": rows, "generated_at_ms": _now_ms(), "sha256": digest(rows)}


def _principal_rows() -> list[dict[str, Any]]:
    by: dict[tuple[str, str], dict[str, Any]] = {}
    users: dict[tuple[str, str], Any] = {}
    for g in _grants():
        key = (g["principal_type"], g["principal_id"])
        users[key] = g.pop("user")
        g.pop("assignment_id")
        role = g.pop("role_name")
        by.setdefault(key, {**g, "roles": []})["roles"].append(role)
    last_token = dict(ApiToken.objects.values_list("owner_id").annotate(m=Max("last_used_at")))
    rows = []
    for key, row in sorted(by.items()):
        user = users[key]
        row["roles"] = sorted(row["roles"])
        row["effective_permission_count"] = len(rbac.Principal(user=user, via="session").grants())
        used, login = last_token.get(user.pk), user.last_login
        if used and (not login or used >= login):
            row["last_activity_ms"], row["last_activity_kind"] = int(used.timestamp() * 1000), "token"
        elif login:
            row["last_activity_ms"], row["last_activity_kind"] = int(login.timestamp() * 1000), "login"
        else:
            row["last_activity_ms"], row["last_activity_kind"] = None, None
        rows.append(row)
    return rows


CSV_COLUMNS = ("principal_type", "principal_id", "display_name", "owner_or_email", "roles",
               "effective_permission_count", "last_activity_ms", "last_activity_kind", "classification",
               "lifecycle_state", "source")
CAMPAIGN_CSV_COLUMNS = ("principal_type", "principal_id", "role_name", "decision", "reviewer", "justification",
                        "decided_at_ms", "display_name", "classification", "lifecycle_state", "revoked_on_close")


def _cell(value: Any) -> str:
    text = ";".join(value) if isinstance(value, list) else ("" if value is None else str(value))
    return "'" + text if text.startswith(CSV_INJECTION) else text


def to_csv(doc: dict[str, Any]) -> str:
    """The export as CSV: cells that a spreadsheet would run as a formula are prefixed with ``'``; the last line
    carries the JSON document's SHA-256 (verify against the JSON export)."""
    columns = CAMPAIGN_CSV_COLUMNS if "campaign" in doc else CSV_COLUMNS
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(columns)
    for row in doc["rows"]:
        writer.writerow([_cell(row.get(c)) for c in columns])
    writer.writerow([f"# sha256={doc['sha256']}"])
    return out.getvalue()


# --- campaigns --------------------------------------------------------------------------------------

def _campaign(campaign_id: str, *, lock: bool = False) -> AccessReviewCampaign:
    try:
        key = uuid.UUID(str(campaign_id))
    except ValueError:
        key = None
    qs = AccessReviewCampaign.objects.select_for_update() if lock else AccessReviewCampaign.objects
    row = qs.filter(pk=key).first() if key else None
    if row is None:
        raise NotFound(f"access review not found: {campaign_id}",
                       remediation="list_access_reviews shows the campaigns")
    return row


def open_access_review(principal: rbac.Principal, title: str, *, cid: str = "") -> dict[str, Any]:
    _authorize(principal, "Attest")
    title = title.strip()
    if not 1 <= len(title) <= 256:
        raise YuzuError("title is required, at most 256 characters")
    try:
        with transaction.atomic():
            grants = _grants()
            campaign = AccessReviewCampaign.objects.create(campaign_id=uuid.uuid4(), title=title,
                                                           created_by=principal.name, created_at_ms=_now_ms(),
                                                           grant_count=len(grants))
            Att.objects.bulk_create([Att(campaign=campaign, principal_type=g["principal_type"],
                                         principal_id=g["principal_id"], role_name=g["role_name"],
                                         assignment_id=g["assignment_id"], display_name=g["display_name"][:256],
                                         classification=g["classification"], lifecycle_state=g["lifecycle_state"])
                                     for g in grants])
            audit(principal, "access_review.campaign_opened", "success", target_type="AccessReviewCampaign",
                  target_id=campaign.pk, detail=f"grant_count={len(grants)}", correlation_id=cid)
    except DatabaseError:
        raise _partial() from None
    return {"campaign_id": str(campaign.pk), "grant_count": len(grants)}


def record_attestation(principal: rbac.Principal, campaign_id: str, principal_type: str, principal_id: str,
                       role_name: str, decision: str, justification: str = "", *, cid: str = "") -> dict[str, Any]:
    """Overwrites any earlier decision on that frozen grant; never changes the grant itself."""
    _authorize(principal, "Attest")
    if decision not in (Att.Decision.ATTESTED, Att.Decision.FLAGGED_REVOKE):
        raise YuzuError("decision must be attested or flagged_revoke")
    if len(justification or "") > 2048:
        raise YuzuError("justification: at most 2048 characters")
    with transaction.atomic():
        campaign = _campaign(campaign_id, lock=True)
        if campaign.status == AccessReviewCampaign.Status.CLOSED:
            raise YuzuError("campaign is closed")
        n = campaign.attestations.filter(principal_type=principal_type, principal_id=principal_id,
                                         role_name=role_name).update(decision=decision, reviewer=principal.name,
                                                                     justification=justification or "",
                                                                     decided_at_ms=_now_ms())
        if n != 1:
            raise YuzuError("grant not in campaign", remediation="get_access_review lists the frozen grants")
        verb = "attested" if decision == Att.Decision.ATTESTED else "flagged"
        audit(principal, f"access_review.{verb}", "success", target_type="AccessReviewCampaign",
              target_id=campaign.pk, detail=f"{principal_type}:{principal_id} role={role_name}", correlation_id=cid)
    return {"recorded": True}


def get_access_review(principal: rbac.Principal, campaign_id: str, *, cid: str = "") -> dict[str, Any]:
    _authorize(principal, "Read")
    campaign = _campaign(campaign_id)
    rows = [a.to_dict() for a in campaign.attestations.all()]
    audit(principal, "access_review.get", "success", target_type="AccessReviewCampaign", target_id=campaign.pk,
          correlation_id=cid)
    return {"campaign": campaign.to_dict(), "attestations": rows,
            "pending_count": sum(1 for r in rows if r["decision"] == Att.Decision.PENDING)}


def list_access_reviews(principal: rbac.Principal, *, cid: str = "") -> dict[str, Any]:
    _authorize(principal, "Read")
    rows = [c.to_dict() for c in AccessReviewCampaign.objects.all()[:MAX_LISTED]]
    audit(principal, "access_review.list", "success", detail=f"count={len(rows)}", correlation_id=cid)
    return {"count": len(rows), "campaigns": rows}


def close_access_review(principal: rbac.Principal, campaign_id: str, *, cid: str = "") -> dict[str, Any]:
    """One-way. Applies every flagged revocation whose grant still exists (each audited as a role-assignment
    removal); pending rows stay pending, as evidence."""
    _authorize(principal, "Attest")
    with transaction.atomic():
        campaign = _campaign(campaign_id, lock=True)
        if campaign.status == AccessReviewCampaign.Status.CLOSED:
            raise YuzuError("campaign is closed")
        flagged = campaign.attestations.filter(decision=Att.Decision.FLAGGED_REVOKE, assignment_id__isnull=False)
        if requires_approval(principal.tier, "UserManagement", "Write") and flagged.exists():
            # Removing a grant is UserManagement:Write, which this tier may do only with a human's approval:
            # closing may not be the way round it.
            raise PermissionDenied(
                "UserManagement:Write", f"closing this campaign would revoke flagged grants, which needs a human "
                f"approval on tier '{principal.tier}'; nothing was changed",
                extra={"tier": principal.tier}, remediation="a person closes it in the admin (Access reviews), or "
                "records its flagged rows as attested first")
        revoked = 0
        for att in flagged:
            ra = None if att.assignment_id is None else RoleAssignment.objects.filter(pk=att.assignment_id).select_related("role", "group", "user").first()
            if ra is None or ra.user.get_username() != att.principal_id or role_label(ra) != att.role_name:
                continue  # already gone (or the id now names another grant): nothing to revoke
            ra.delete()
            att.revoked_on_close = True
            att.save(update_fields=["revoked_on_close"])
            revoked += 1
            audit(principal, "role_assignment.revoke", "success", target_type="RoleAssignment", target_id=att.assignment_id,
                  detail=f"{att.principal_type}:{att.principal_id} role={att.role_name} access_review={campaign.pk}",
                  correlation_id=cid)
        campaign.status, campaign.closed_by, campaign.closed_at_ms = "closed", principal.name, _now_ms()
        campaign.revocations_applied = revoked
        campaign.save(update_fields=["status", "closed_by", "closed_at_ms", "revocations_applied"])
        audit(principal, "access_review.closed", "success", target_type="AccessReviewCampaign", target_id=campaign.pk,
              detail=f"revocations_applied={revoked}", correlation_id=cid)
    return {"closed": True, "revocations_applied": revoked}
