"""Engine principals (spec/governance.md §1): one service function per capability, shared by the MCP tools
(governance.mcp_tools), the REST views (governance.api) and the admin. Each mutating capability has its one
validation, ``plan_<capability>`` (yuzu.plans), run before any side effect and again on an approved recall.

Invariants, each enforced here for both faces:
- an engine principal never holds admin or admin-equivalent authority (``admin_refusal``), never narrowed;
- its credentials are readonly-tier MCP tokens, ttl ≤ 90 days, at most 2 live at once (only during a rotation);
- an engine-classed caller is denied every capability of this module, reads included (``deny_engine``);
- rotation: ``rotate`` mints a successor while the predecessor keeps working until the overlap ends;
  ``confirm`` (successor id + its secret, proof of possession) revokes the predecessor at once.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from yuzu import rbac, secrets
from yuzu.audit import audit
from yuzu.errors import STORE_FAULT_RETRY_MS, NotFound, PermissionDenied, YuzuError
from yuzu.models import ApiToken, Role, RoleAssignment, RolePermission, hash_secret
from yuzu.plans import Plan, check_role_pin, role_pins
from yuzu.stepup import require_fresh_mfa
from yuzu.text import check_label

from .models import ENGINE_PREFIX, ROTATION_SECRET, EnginePrincipal, EngineRotation, epoch, is_engine_user

log = logging.getLogger("yuzu.governance")
MAX_ACTIVE_CREDENTIALS = 2
MAX_TTL_DAYS = 90
REVEAL_SECONDS = 120
ADMIN_ROLE_NAMES = frozenset({"Administrator", "admin"})
NOT_FOUND = "engine principal not found"
NEVER_ADMIN = "engine principals can never hold admin or system roles"
CONFIRM_PRECONDITION_HINT = ("approval cannot be redeemed right now; check get_engine_principal for the rotation's "
                             "current state")


# --- shared checks ----------------------------------------------------------------------------------

def deny_engine(principal: rbac.Principal, permission: str) -> None:
    """The structural denial belt: a caller whose own credential is engine-classed manages no identities."""
    if is_engine_user(principal.user):
        audit(principal, "engine_principal.structural_denial", "denied", detail=f"permission={permission}")
        raise PermissionDenied(permission, "engine principals may not call identity-governance capabilities",
                               remediation="call with a human operator's credential")


def _authorize(principal: rbac.Principal, securable: str, operation: str) -> None:
    """Engine principals are the whole install's: a fleet-wide grant (a grant held on one management group
    does not reach them); writes from a browser session need a fresh authenticator code."""
    deny_engine(principal, f"{securable}:{operation}")
    rbac.refuse_service_scoped(principal, securable, operation)
    if not rbac.may(principal, securable, operation):
        raise rbac.denial(principal, securable, operation)
    if operation != "Read":
        require_fresh_mfa(principal, f"{securable}:{operation}")


def _store_fault() -> YuzuError:
    return YuzuError("engine principal store unreachable", status=503, rpc_code=-32603,
                     retry_after_ms=STORE_FAULT_RETRY_MS, remediation="retry shortly")


def get_principal(principal_id: str, *, lock: bool = False) -> EnginePrincipal:
    try:
        qs = EnginePrincipal.objects.select_related("owner", "account")
        row = (qs.select_for_update() if lock else qs).filter(pk=principal_id).first()
    except DatabaseError:
        raise _store_fault() from None
    if row is None:
        raise NotFound(NOT_FOUND, remediation="list_engine_principals shows the registered principal ids")
    return row


def _active(ep: EnginePrincipal) -> None:
    if not ep.is_active:
        raise YuzuError(f"engine principal {ep.principal_id} is revoked (terminal)")


def _human(username: str, field: str) -> Any:
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None or is_engine_user(user):
        raise YuzuError(f"{field}: no active user named '{username}'",
                        remediation="an engine principal's owner is an existing, active human user")
    return user


def view(ep: EnginePrincipal, *, credentials_as_list: bool = False) -> dict[str, Any]:
    live = list(ep.active_credentials())
    out = ep.to_dict()
    if credentials_as_list:
        out["active_credentials"] = [{"token_id": t.id, "name": t.name, "created_at": epoch(t.created_at),
                                      "expires_at": epoch(t.expires_at), "retire_at": epoch(t.retire_at),
                                      "last_used_at": epoch(t.last_used_at)} for t in live]
    else:
        out["active_credentials"] = len(live)
    rot = ep.rotations.filter(confirmed_at__isnull=True).first()
    out["rotation"] = None if rot is None else {
        "successor_token_id": rot.successor_id, "predecessor_token_id": rot.predecessor_id,
        "overlap_expires_at": epoch(rot.overlap_expires_at), "initiated_by": rot.initiated_by}
    return out


# --- reads ------------------------------------------------------------------------------------------

def list_engine_principals(principal: rbac.Principal, include_revoked: bool = True) -> dict[str, Any]:
    _authorize(principal, "EnginePrincipal", "Read")
    qs = EnginePrincipal.objects.select_related("owner")
    if not include_revoked:
        qs = qs.filter(lifecycle_state=EnginePrincipal.State.ACTIVE)
    rows = [view(ep) for ep in qs]
    return {"count": len(rows), "principals": rows}


def get_engine_principal(principal: rbac.Principal, principal_id: str, *, rest: bool = False) -> dict[str, Any]:
    _authorize(principal, "EnginePrincipal", "Read")
    return view(get_principal(principal_id), credentials_as_list=rest)


# --- create -----------------------------------------------------------------------------------------

def plan_create_engine_principal(principal: rbac.Principal, args: dict[str, Any],
                                 pinned: dict[str, Any] | None = None) -> Plan[dict[str, Any]]:
    _authorize(principal, "Security", "Write")
    pid = args["principal_id"]
    owner = _human(args["owner_username"], "owner_username")
    if pinned and pinned.get("user") not in (None, owner.pk):  # the name now belongs to another account
        raise NotFound(f"user not found: {args['owner_username']} (the account was replaced after the approval)")
    if EnginePrincipal.objects.filter(pk=pid).exists() or get_user_model().objects.filter(username=pid).exists():
        raise _taken(pid)
    return Plan(summary=f"Register engine principal {pid} ('{args['display_name']}', {args['classification']}), "
                        f"owned by {args['owner_username']}: {args['justification']}",
                value=dict(args), pins={"user": owner.pk}, risk="additive",
                facts={k: args[k] for k in ("principal_id", "owner_username", "classification", "justification")})


def _taken(pid: str) -> YuzuError:
    return YuzuError(f"engine principal {pid} already exists (ids are never reused, even once revoked)")


def create_engine_principal(principal: rbac.Principal, *, cid: str = "",
                            plan: Plan[dict[str, Any]]) -> dict[str, Any]:
    a = plan.value
    try:
        with transaction.atomic():
            owner = _human(a["owner_username"], "owner_username")
            account = get_user_model()(username=a["principal_id"], is_active=True, is_staff=False)
            account.set_unusable_password()
            account.save()
            ep = EnginePrincipal.objects.create(principal_id=a["principal_id"], account=account,
                                                display_name=a["display_name"], owner=owner,
                                                justification=a["justification"],
                                                classification=a["classification"], created_by=principal.name)
            audit(principal, "engine_principal.create", "success", target_type="EnginePrincipal", target_id=ep.pk,
                  detail=f"owner={owner.get_username()} classification={ep.classification}", correlation_id=cid)
    except IntegrityError:  # a concurrent create of the same id passed its plan's check too, and committed first
        raise _taken(a["principal_id"]) from None
    return {k: ep.to_dict()[k] for k in ("principal_id", "display_name", "owner_username", "classification",
                                         "lifecycle_state", "created_at")}


# --- revoke -----------------------------------------------------------------------------------------

def plan_revoke_engine_principal(principal: rbac.Principal, principal_id: str, reason: str = "",
                                 superseded_by: str = "", pinned: dict[str, Any] | None = None) -> Plan[tuple]:
    _authorize(principal, "Security", "Write")
    ep = get_principal(principal_id)
    live = ep.active_credentials().count()
    what = "already revoked: nothing changes" if not ep.is_active else f"and its {live} live credential(s)"
    return Plan(summary=f"Permanently revoke engine principal {principal_id} {what}" + (f": {reason}" if reason else ""),
                value=(principal_id, reason, superseded_by), risk="destructive",
                facts={"principal_id": principal_id, "credentials": live, "reason": reason})


def revoke_engine_principal(principal: rbac.Principal, *, cid: str = "", plan: Plan[tuple]) -> dict[str, Any]:
    principal_id, reason, superseded_by = plan.value
    now = timezone.now()
    with transaction.atomic():
        ep = get_principal(principal_id, lock=True)
        if not ep.is_active:
            return {"revoked": True, "principal_id": principal_id, "credentials_revoked": 0}
        # Credentials first, then the state (and the account: every process refuses it on its next call).
        n = ep.active_credentials().update(revoked_at=now)
        type(ep.account).objects.filter(pk=ep.account_id).update(is_active=False)
        ep.lifecycle_state, ep.revoked_at, ep.superseded_by = EnginePrincipal.State.REVOKED, now, superseded_by or ""
        ep.save(update_fields=["lifecycle_state", "revoked_at", "superseded_by"])
        ep.rotations.filter(secret_sealed__isnull=False).update(secret_sealed=None)
        audit(principal, "engine_principal.revoke", "success", target_type="EnginePrincipal", target_id=principal_id,
              detail=f"credentials_revoked={n} reason={reason}", correlation_id=cid)
    return {"revoked": True, "principal_id": principal_id, "credentials_revoked": n}


# --- credentials ------------------------------------------------------------------------------------

def plan_mint_engine_credential(principal: rbac.Principal, principal_id: str, name: str = "", ttl_days: int = 90,
                                pinned: dict[str, Any] | None = None) -> Plan[tuple]:
    _authorize(principal, "Security", "Write")
    ep = get_principal(principal_id)
    _active(ep)
    if not 1 <= ttl_days <= MAX_TTL_DAYS:
        raise YuzuError(f"ttl_days must be 1..{MAX_TTL_DAYS}")
    name = check_label("name", name or f"{principal_id} credential", ApiToken.NAME_LENGTH)
    if ep.active_credentials().exists():
        raise YuzuError(f"{principal_id} already holds an active credential: rotate it instead "
                        "(rotate_engine_credential), or revoke the principal")
    return Plan(summary=f"Issue a read-only credential for {principal_id}, valid {ttl_days} days",
                value=(principal_id, name, ttl_days), risk="additive",
                facts={"principal_id": principal_id, "ttl_days": ttl_days})


def mint_engine_credential(principal: rbac.Principal, *, cid: str = "", plan: Plan[tuple]) -> dict[str, Any]:
    principal_id, name, ttl_days = plan.value
    now = timezone.now()
    with transaction.atomic():
        ep = get_principal(principal_id, lock=True)
        _active(ep)
        if ep.active_credentials().exists():
            raise YuzuError(f"{principal_id} already holds an active credential: rotate it instead")
        token, raw = ApiToken.mint(ep.account, name, mcp_tier="readonly", expires_at=now + timedelta(days=ttl_days),
                                   now=now)
        audit(principal, "engine_principal.credential.mint", "success", target_type="EnginePrincipal",
              target_id=principal_id, detail=f"token_id={token.id} ttl_days={ttl_days}", correlation_id=cid)
    return {"token_id": token.id, "raw_token": raw, "principal_id": principal_id, "expires_at": epoch(token.expires_at)}


def _pending_rotation(ep: EnginePrincipal) -> EngineRotation | None:
    return ep.rotations.filter(confirmed_at__isnull=True).first()


def _retry(ep: EnginePrincipal, principal: rbac.Principal, now: Any) -> EngineRotation | None:
    """A same-caller retry within the reveal window re-serves the same successor."""
    rot = _pending_rotation(ep)
    if rot is not None and rot.initiated_by == principal.name and rot.reveal_until > now and rot.secret_sealed:
        return rot
    return None


def plan_rotate_engine_credential(principal: rbac.Principal, principal_id: str, overlap_days: int = 7,
                                  pinned: dict[str, Any] | None = None) -> Plan[tuple]:
    _authorize(principal, "Security", "Write")
    ep = get_principal(principal_id)
    _active(ep)
    if not 1 <= overlap_days <= 3650:
        raise YuzuError("overlap_days must be 1..3650 (the overlap is at least 24 hours; shorter is refused, "
                        "never rounded)")
    _rotation_refusal(ep, principal, timezone.now())
    return Plan(summary=f"Rotate {principal_id}'s credential: issue a successor; the current one keeps working "
                        f"for {overlap_days} day(s) or until the rotation is confirmed",
                value=(principal_id, overlap_days), risk="additive",
                facts={"principal_id": principal_id, "overlap_days": overlap_days})


def _rotation_refusal(ep: EnginePrincipal, principal: rbac.Principal, now: Any) -> None:
    if _retry(ep, principal, now) is not None:
        return
    live = ep.active_credentials().count()
    if live == 0:
        raise YuzuError(f"{ep.principal_id} has no active credential to rotate: mint one (mint_engine_credential)")
    if live >= MAX_ACTIVE_CREDENTIALS:
        raise YuzuError(f"{ep.principal_id} already holds {live} active credentials (a rotation is in flight): "
                        "confirm it (confirm_engine_rotation) or wait for its overlap to end")


def rotate_engine_credential(principal: rbac.Principal, *, cid: str = "", plan: Plan[tuple]) -> dict[str, Any]:
    principal_id, overlap_days = plan.value
    now = timezone.now()
    with transaction.atomic():
        ep = get_principal(principal_id, lock=True)
        _active(ep)
        rot = _retry(ep, principal, now)
        if rot is not None:
            raw = secrets.unseal(bytes(rot.secret_sealed or b""), ROTATION_SECRET.where(rot.pk)).decode()
            successor = ApiToken.objects.get(pk=rot.successor_id)
        else:
            _rotation_refusal(ep, principal, now)
            predecessor = ep.active_credentials().select_for_update().get()
            successor, raw = ApiToken.mint(ep.account, predecessor.name, mcp_tier="readonly",
                                           expires_at=now + timedelta(days=MAX_TTL_DAYS), now=now)
            successor.rotated_from = predecessor
            successor.save(update_fields=["rotated_from"])
            overlap_end = now + timedelta(days=overlap_days)
            if predecessor.expires_at:
                overlap_end = min(overlap_end, predecessor.expires_at)
            # The predecessor is retired by the sweep (sweep_rotations), not by retire_at: a successor that was
            # never used keeps both working.
            rot = EngineRotation.objects.create(principal=ep, predecessor_id=predecessor.id,
                                                successor_id=successor.id, initiated_by=principal.name,
                                                overlap_expires_at=overlap_end,
                                                reveal_until=now + timedelta(seconds=REVEAL_SECONDS))
            rot.secret_sealed = secrets.seal(raw, ROTATION_SECRET.where(rot.pk))
            rot.save(update_fields=["secret_sealed"])
            audit(principal, "engine_principal.credential.rotate", "success", target_type="EnginePrincipal",
                  target_id=principal_id, detail=f"predecessor={predecessor.id} successor={successor.id} "
                                                 f"overlap_days={overlap_days}", correlation_id=cid)
        audit(principal, "engine_principal.credential.reveal", "success", target_type="EnginePrincipal",
              target_id=principal_id, detail=f"token_id={successor.id}", correlation_id=cid)
    return {"token_id": successor.id, "raw_token": raw, "principal_id": principal_id,
            "overlap_expires_at": epoch(rot.overlap_expires_at)}


def _confirm_state(ep: EnginePrincipal, token_id: str) -> tuple[EngineRotation, ApiToken]:
    """The live rotation state a confirmation needs, or the -32602 refusal saying what is wrong (no change)."""
    _active(ep)
    confirmed = ep.rotations.filter(successor_id=token_id, confirmed_at__isnull=False).exists()
    if confirmed:
        raise YuzuError("rotation already confirmed", remediation="nothing to do: the predecessor is revoked")
    rot = _pending_rotation(ep)
    if rot is None:
        raise YuzuError(f"no rotation is in flight for {ep.principal_id}")
    if rot.successor_id != token_id:
        raise YuzuError("token_id is not the in-flight rotation's successor (stale or mismatched)",
                        remediation="get_engine_principal shows the rotation's successor_token_id")
    live = {t.id: t for t in ep.active_credentials()}
    if token_id not in live or rot.predecessor_id not in live or len(live) != MAX_ACTIVE_CREDENTIALS:
        raise YuzuError("the rotation is no longer confirmable (a credential of it expired or was revoked)")
    return rot, live[token_id]


def rotation_confirmable(principal_id: str, token_id: str) -> bool:
    """The pre-consume precondition of an approved confirm_engine_rotation: principal active, exactly two live
    credentials, token_id the in-flight successor, rotation unconfirmed. False leaves the ticket unconsumed."""
    try:
        _confirm_state(get_principal(principal_id), token_id)
    except YuzuError:
        return False
    return True


def plan_confirm_engine_rotation(principal: rbac.Principal, principal_id: str, token_id: str, secret: str,
                                 pinned: dict[str, Any] | None = None) -> Plan[tuple]:
    """Before a ticket exists (``pinned`` None) every check runs, the secret last; on an approved recall the
    live rotation state is the precondition's to judge (so a failing one leaves the ticket reusable)."""
    _authorize(principal, "Security", "Write")
    ep = get_principal(principal_id)
    if pinned is None:
        _, successor = _confirm_state(ep, token_id)
        _check_secret(principal, ep, successor, secret)
    return Plan(summary=f"Confirm the rotation of {principal_id}: revoke its previous credential now "
                        f"(successor {token_id})", value=(principal_id, token_id, secret), risk="destructive",
                facts={"principal_id": principal_id, "successor_token_id": token_id})


def _check_secret(principal: rbac.Principal, ep: EnginePrincipal, successor: ApiToken, secret: str) -> None:
    if hash_secret(secret) != successor.token_hash:
        audit(principal, "engine_principal.credential.confirm", "denied", target_type="EnginePrincipal",
              target_id=ep.principal_id, detail="rotation secret mismatch")
        raise PermissionDenied("Security:Write", "rotation secret mismatch",
                               remediation="send the successor's raw secret that rotate_engine_credential returned")


def confirm_engine_rotation(principal: rbac.Principal, *, cid: str = "", plan: Plan[tuple]) -> dict[str, Any]:
    principal_id, token_id, secret = plan.value
    now = timezone.now()
    with transaction.atomic():
        ep = get_principal(principal_id, lock=True)
        rot, successor = _confirm_state(ep, token_id)
        _check_secret(principal, ep, successor, secret)
        ApiToken.objects.filter(pk=rot.predecessor_id, revoked_at__isnull=True).update(revoked_at=now)
        rot.confirmed_at, rot.confirmed_by, rot.secret_sealed = now, principal.name, None
        rot.save(update_fields=["confirmed_at", "confirmed_by", "secret_sealed"])
        audit(principal, "engine_principal.credential.confirm", "success", target_type="EnginePrincipal",
              target_id=principal_id, detail=f"successor={token_id} revoked={rot.predecessor_id}", correlation_id=cid)
    return {"confirmed": True, "principal_id": principal_id}


def sweep_rotations(now: Any = None) -> dict[str, int]:
    """The 60 s sweep: a rotation whose overlap has ended revokes its predecessor (and counts as resolved) once
    the successor has been used; a successor never used keeps both credentials and raises a warning (audited
    ``engine_principal.rotation.stalled``, once per sweep) — revoking the only working credential of a
    consumer that never switched would take it down."""
    now = now or timezone.now()
    done = stalled = 0
    for rot in EngineRotation.objects.filter(confirmed_at__isnull=True, overlap_expires_at__lte=now):
        successor = ApiToken.objects.filter(pk=rot.successor_id).first()
        if successor is None or successor.last_used_at is None:
            stalled += 1
            log.warning("engine rotation of %s: overlap ended but successor %s was never used; both credentials "
                        "kept", rot.principal_id, rot.successor_id)
            audit("system", "engine_principal.rotation.stalled", "failure", target_type="EnginePrincipal",
                  target_id=rot.principal_id, detail=f"successor={rot.successor_id} never used")
            continue
        with transaction.atomic():
            ApiToken.objects.filter(pk=rot.predecessor_id, revoked_at__isnull=True).update(revoked_at=now)
            EngineRotation.objects.filter(pk=rot.pk, confirmed_at__isnull=True).update(
                confirmed_at=now, confirmed_by="sweep", secret_sealed=None)
            audit("system", "engine_principal.credential.confirm", "success", target_type="EnginePrincipal",
                  target_id=rot.principal_id, detail=f"overlap ended: revoked={rot.predecessor_id}")
        done += 1
    return {"revoked": done, "stalled": stalled}


# --- owner ------------------------------------------------------------------------------------------

def plan_transfer_engine_principal_owner(principal: rbac.Principal, principal_id: str, new_owner: str,
                                         pinned: dict[str, Any] | None = None) -> Plan[tuple]:
    _authorize(principal, "Security", "Write")
    ep = get_principal(principal_id)
    _active(ep)
    user = _human(new_owner, "new_owner")
    if pinned and pinned.get("user") not in (None, user.pk):  # the name now belongs to another account
        raise NotFound(f"user not found: {new_owner} (the account was replaced after the approval)")
    return Plan(summary=f"Transfer engine principal {principal_id} from {ep.owner.get_username()} to {new_owner}",
                value=(principal_id, new_owner), pins={"user": user.pk}, risk="write",
                facts={"principal_id": principal_id, "from": ep.owner.get_username(), "to": new_owner})


def transfer_engine_principal_owner(principal: rbac.Principal, *, cid: str = "", plan: Plan[tuple]) -> dict[str, Any]:
    principal_id, new_owner = plan.value
    with transaction.atomic():
        ep = get_principal(principal_id, lock=True)
        _active(ep)
        old = ep.owner.get_username()
        ep.owner = _human(new_owner, "new_owner")
        ep.save(update_fields=["owner"])
        audit(principal, "engine_principal.owner.transfer", "success", target_type="EnginePrincipal",
              target_id=principal_id, detail=f"from={old} to={new_owner}", correlation_id=cid)
    return {"transferred": True, "principal_id": principal_id, "new_owner": new_owner}


# --- roles ------------------------------------------------------------------------------------------

def _slug_principal(slug: str) -> EnginePrincipal:
    return get_principal(ENGINE_PREFIX + slug)


def admin_refusal(role: Role, ep: EnginePrincipal | None = None) -> str | None:
    """Why ``role`` may never be an engine principal's (admin_role | wildcard_equivalent), or None. With ``ep``, the
    roles it holds already count too: two narrower roles that together hold the whole product are as admin as one
    (audit_engine_no_admin reports that union as wildcard_equivalent)."""
    if role.name in ADMIN_ROLE_NAMES:
        return "admin_role"
    held = set(role.permissions.values_list("securable", "operation"))
    if ep is not None:
        held |= set(RolePermission.objects.filter(role__assignments__user=ep.account_id)
                    .values_list("securable", "operation"))
    if held >= set(rbac.ALL):
        return "wildcard_equivalent"
    return None


def plan_assign_engine_role(principal: rbac.Principal, principal_id: str, role: str,
                            pinned: dict[str, Any] | None = None) -> Plan[tuple]:
    _authorize(principal, "Security", "Write")
    ep = _slug_principal(principal_id)
    _active(ep)
    row = Role.objects.filter(name=role).first()
    if row is None:
        raise YuzuError(f"role not found: {role}", remediation="list_roles / GET /api/v1/rbac/roles lists them")
    why = admin_refusal(row, ep)
    if why:
        audit(principal, "engine_principal.role.assign", "denied", target_type="EnginePrincipal",
              target_id=ep.principal_id, detail=f"role={role} reason={why}")
        raise YuzuError(NEVER_ADMIN, remediation="grant a narrower role (create one in the admin if none fits)")
    perms = sorted(f"{s}:{o}" for s, o in row.permissions.values_list("securable", "operation"))
    check_role_pin(pinned, role, row.pk, perms)
    return Plan(summary=f"Grant role {role} fleet-wide to {ep.principal_id} ({len(perms)} permissions)",
                value=(ep.principal_id, role), pins=role_pins(row.pk, perms), risk="write",
                facts={"principal_id": ep.principal_id, "role": role, "permissions": perms})


def assign_engine_role(principal: rbac.Principal, *, cid: str = "", plan: Plan[tuple]) -> dict[str, Any]:
    principal_id, role = plan.value
    with transaction.atomic():
        ep = get_principal(principal_id, lock=True)
        _active(ep)
        row = Role.objects.get(name=role)
        if admin_refusal(row, ep):  # again under the row lock: a concurrent assign may have added the rest
            raise YuzuError(NEVER_ADMIN)
        RoleAssignment.objects.get_or_create(user=ep.account, role=row, group=None)
        audit(principal, "engine_principal.role.assign", "success", target_type="EnginePrincipal",
              target_id=principal_id, detail=f"role={role}", correlation_id=cid)
    return {"assigned": True, "principal_id": principal_id, "role": role}


def plan_unassign_engine_role(principal: rbac.Principal, principal_id: str, role: str,
                              pinned: dict[str, Any] | None = None) -> Plan[tuple]:
    _authorize(principal, "Security", "Write")
    ep = _slug_principal(principal_id)
    if not RoleAssignment.objects.filter(user=ep.account, role__name=role).exists():
        raise YuzuError(f"{ep.principal_id} does not hold role {role}",
                        remediation="list_engine_roles shows what it holds")
    return Plan(summary=f"Remove role {role} from {ep.principal_id}", value=(ep.principal_id, role), risk="destructive",
                facts={"principal_id": ep.principal_id, "role": role})


def unassign_engine_role(principal: rbac.Principal, *, cid: str = "", plan: Plan[tuple]) -> dict[str, Any]:
    principal_id, role = plan.value
    ep = get_principal(principal_id)
    n, _ = RoleAssignment.objects.filter(user=ep.account, role__name=role).delete()
    audit(principal, "engine_principal.role.unassign", "success", target_type="EnginePrincipal",
          target_id=principal_id, detail=f"role={role}", correlation_id=cid)
    return {"unassigned": bool(n), "principal_id": principal_id, "role": role}


def list_engine_roles(principal: rbac.Principal, principal_id: str) -> dict[str, Any]:
    _authorize(principal, "EnginePrincipal", "Read")
    ep = _slug_principal(principal_id)
    roles = sorted(set(RoleAssignment.objects.filter(user=ep.account).values_list("role__name", flat=True)))
    return {"principal_id": ep.principal_id, "count": len(roles),
            "roles": [{"principal_id": ep.principal_id, "role": r} for r in roles]}


# --- the no-admin proof -----------------------------------------------------------------------------

def audit_engine_no_admin(principal: rbac.Principal, include_revoked: bool = True) -> dict[str, Any]:
    """Every engine principal's authority checked against the never-admin rule. A catalogue that cannot be
    read is "unable to verify" (-32603), never ok."""
    _authorize(principal, "AuditLog", "Read")
    violations: list[dict[str, Any]] = []
    try:
        qs = EnginePrincipal.objects.select_related("account")
        if not include_revoked:
            qs = qs.filter(lifecycle_state=EnginePrincipal.State.ACTIVE)
        for ep in qs:
            if ep.account.is_superuser or ep.account.is_staff:
                violations.append({"principal_id": ep.principal_id, "role": None, "reason": "system_role"})
            held: set[tuple[str, str]] = set()
            for ra in RoleAssignment.objects.filter(user=ep.account).select_related("role"):
                why = admin_refusal(ra.role)
                if why:
                    violations.append({"principal_id": ep.principal_id, "role": ra.role.name, "reason": why})
                held |= set(ra.role.permissions.values_list("securable", "operation"))
            if held >= set(rbac.ALL) and not any(v["principal_id"] == ep.principal_id for v in violations):
                violations.append({"principal_id": ep.principal_id, "role": None, "reason": "wildcard_equivalent"})
    except DatabaseError:
        raise YuzuError("unable to verify: the RBAC catalogue could not be read", status=503, rpc_code=-32603,
                        retry_after_ms=STORE_FAULT_RETRY_MS) from None
    return {"ok": not violations, "violations": violations}
