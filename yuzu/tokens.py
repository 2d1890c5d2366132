"""API-token service: one function per capability, shared by REST views and MCP tools."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TypedDict, Unpack

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleet.models import ManagementGroup

from .audit import EPOCH_MAX, audit
from .errors import NotFound, PermissionDenied, YuzuError
from .jsondata import JsonObject, instant
from .models import MCP_TOKEN_MAX_DAYS, ApiToken, validate_token_fields
from .plans import Plan
from .policy import TIER_ORDER
from .rbac import Principal, may
from .stepup import require_fresh_mfa
from .text import check_label

MAX_OVERLAP_SECS = 3650 * 86400


class TokenRequest(TypedDict, total=False):
    """What a caller asks for in a new token (the create_api_token tool's arguments, the REST body)."""

    name: str
    expires_at: str | int | float | None  # ISO-8601 or epoch seconds
    scope_service: str
    mcp_tier: str


class TokenFields(TypedDict):
    """A new token's fields, as planned."""

    name: str
    mcp_tier: str
    expires_at: datetime | None
    scope_service: str


def token_view(t: ApiToken) -> JsonObject:
    return {
        "id": t.id, "name": t.name, "prefix": t.prefix, "created_at": _iso(t.created_at),
        "expires_at": _iso(t.expires_at), "last_used_at": _iso(t.last_used_at), "revoked": t.revoked_at is not None,
        "retire_at": _iso(t.retire_at), "mcp_tier": t.mcp_tier or None, "scope_service": t.scope_service or None,
        "rotated_from": t.rotated_from_id,
    }


def _iso(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt else None


def parse_expiry(value: object, now: datetime | None = None) -> datetime | None:
    """``expires_at`` as ISO-8601 or epoch seconds; ``None`` means no expiry."""
    if value in (None, ""):
        return None
    if isinstance(value, bool):
        raise ValidationError({"expires_at": "expires_at must be ISO-8601 or epoch seconds"})
    if isinstance(value, (int, float)):
        if not 0 <= value <= EPOCH_MAX:
            raise ValidationError({"expires_at": f"expires_at in epoch seconds must be between 0 and {EPOCH_MAX}"})
        return datetime.fromtimestamp(value, tz=UTC)
    dt = instant(value, naive_utc=True)
    if dt is None:
        raise ValidationError({"expires_at": "expires_at must be ISO-8601 (a time within years 1-9999 in UTC) or "
                                             "epoch seconds"})
    return dt


def check_ceiling(principal: Principal, tier: str, expires_at: datetime | None, *, permission: str,
                  token: ApiToken | None = None) -> None:
    """A tiered caller never obtains a token above itself: the tier must be the caller's or lower and the
    token must expire no later than the caller does, so no chain of creates or rotations leads to an
    untiered or non-expiring secret. The caller's own token is always within its ceiling. A token bound to one
    endpoint (an MCP client's, got through OAuth) obtains none: any it obtained would work on the REST API and
    every MCP endpoint."""
    caller = principal.token
    if caller is None or (token is not None and token.pk == caller.pk):
        return
    if caller.audience != ApiToken.AUDIENCE_API:
        raise PermissionDenied(
            permission, "this token is bound to one endpoint (an MCP client's, got through OAuth): it cannot obtain "
                        "other tokens; its client renews it through its connection",
            remediation="create or rotate tokens with a pasted API token (POST /api/v1/tokens), or have an "
                        "administrator mint one: `python manage.py mint_token --user <you> --name <label>`")
    if not caller.mcp_tier:
        return
    rank = {t: i for i, t in enumerate(TIER_ORDER)}
    too_high = rank.get(tier, len(TIER_ORDER)) > rank[caller.mcp_tier]
    outlives = expires_at is None or (caller.expires_at is not None and expires_at > caller.expires_at)
    if too_high or outlives:
        # to the second: a token that outlives the caller's by seconds read "expire by 23:49 (this one: 23:49)"
        what = f"tier {tier or 'untiered'}, " + (f"expiring {expires_at:%Y-%m-%d %H:%M:%S} UTC" if expires_at
                                                  else "never expiring")
        raise PermissionDenied(
            permission, f"a {caller.mcp_tier}-tier token may only obtain tokens of tier {caller.mcp_tier} or lower "
                        f"that expire by {caller.expires_at:%Y-%m-%d %H:%M:%S} UTC (this one: {what})",
            remediation="call with a token of that tier or higher, or have an administrator mint it: "
                        f"`python manage.py mint_token --user {principal.name} --name <label> --tier {tier or '<tier>'}`")


def list_tokens(principal: Principal) -> list[JsonObject]:
    """The caller's API tokens, including those its MCP clients got through OAuth (not bridge workers')."""
    return [token_view(t) for t in ApiToken.objects.filter(owner=principal.user).exclude(
        audience=ApiToken.AUDIENCE_BRIDGE)]


def plan_create_token(principal: Principal, *, name: str, expires_at: str | int | float | None = None,
                      scope_service: str = "", mcp_tier: str = "",
                      pinned: JsonObject | None = None) -> Plan[TokenFields]:
    check_label("name", name, ApiToken.NAME_LENGTH)
    expires = parse_expiry(expires_at)
    check_ceiling(principal, mcp_tier or "", expires, permission="ApiToken:Write")
    validate_token_fields(mcp_tier or "", expires, timezone.now())
    if scope_service:
        _check_service_scope(principal, scope_service)
    what = (f"an MCP token of tier {mcp_tier}" if mcp_tier else "an API token with no MCP tier (full RBAC)")
    until = f"expiring {expires:%Y-%m-%d %H:%M} UTC" if expires else "that never expires"
    scope = f", confined to service {scope_service}" if scope_service else ""
    return Plan(summary=f"Create {what} named '{name}' for {principal.name}, {until}{scope}",
                value={"name": name, "mcp_tier": mcp_tier or "", "expires_at": expires,
                       "scope_service": scope_service or ""}, risk="write")


def create_token(principal: Principal, *, cid: str = "", plan: Plan[TokenFields] | None = None,
                 **request: Unpack[TokenRequest]) -> JsonObject:
    fields = (plan or plan_create_token(principal, **request)).value
    name, mcp_tier = fields["name"], fields["mcp_tier"]
    token, raw = ApiToken.mint(principal.user, name, mcp_tier=mcp_tier, expires_at=fields["expires_at"],
                               scope_service=fields["scope_service"])
    audit(principal, "api_token.create", "success", target_type="ApiToken", target_id=token.id,
          detail=f"name={name} mcp_tier={mcp_tier or '-'}", correlation_id=cid)
    return {**token_view(token), "token": raw}


def _check_service_scope(principal: Principal, service: str) -> None:
    if may(principal, "ManagementGroup", "Write"):
        return
    group = ManagementGroup.objects.filter(name=f"Service: {service}").first()
    if group is not None and principal.user.role_assignments.filter(role__name="ITServiceOwner", group=group).exists():
        return
    raise PermissionDenied("ManagementGroup:Write",
                           "a service-scoped token needs ITServiceOwner on the 'Service: <name>' group or ManagementGroup:Write")


def _own_token(principal: Principal, token_id: str, *, allow_admin: bool = False) -> ApiToken:
    token = ApiToken.objects.filter(pk=token_id).exclude(audience=ApiToken.AUDIENCE_BRIDGE).first()
    if token is None:
        raise NotFound(f"token not found: {token_id}")
    if token.owner_id != principal.user.pk:
        if allow_admin and may(principal, "UserManagement", "Write"):
            return token
        # Not an oracle: another user's token reads as absent.
        raise NotFound(f"token not found: {token_id}")
    return token


def plan_revoke_token(principal: Principal, token_id: str, pinned: JsonObject | None = None) -> Plan[str]:
    token = _own_token(principal, token_id, allow_admin=True)
    owner = "" if token.owner_id == principal.user.pk else f" of {token.owner.get_username()}"
    return Plan(summary=f"Revoke API token '{token.name}' ({token.prefix}…){owner}: it stops working at once",
                value=token.pk, risk="destructive")


def revoke_token(principal: Principal, token_id: str = "", *, cid: str = "",
                 plan: Plan[str] | None = None) -> JsonObject:
    token_id = plan.value if plan is not None else token_id
    with transaction.atomic():
        token = _own_token(principal, token_id, allow_admin=True)
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
    audit(principal, "api_token.revoke", "success", target_type="ApiToken", target_id=token.id, correlation_id=cid)
    return {"id": token.id, "revoked": True}


def rotate_token(principal: Principal, token_id: str, *, overlap_secs: int = 86400, cid: str = "") -> JsonObject:
    """Mint a successor that inherits tier, scope and expires_at; the old one keeps working for the overlap."""
    if isinstance(overlap_secs, bool) or not isinstance(overlap_secs, int) or not 0 <= overlap_secs <= MAX_OVERLAP_SECS:
        raise ValidationError({"overlap_secs": f"overlap_secs must be an integer 0..{MAX_OVERLAP_SECS}"})
    require_fresh_mfa(principal, "ApiToken:Rotate")
    now = timezone.now()
    with transaction.atomic():
        token = _own_token(principal, token_id)
        token = ApiToken.objects.select_for_update().get(pk=token.pk)
        check_ceiling(principal, token.mcp_tier, token.expires_at, permission="ApiToken:Rotate", token=token)
        if token.audience != ApiToken.AUDIENCE_API:
            raise YuzuError("this token was issued through OAuth: its client renews it with its refresh token, so "
                            "it cannot be rotated", status=409, rpc_code=-32602,
                            remediation="revoke it to disconnect the client, or let the client renew it")
        if not token.is_live(now):
            raise YuzuError("token is expired or revoked; mint a new one instead", status=409, rpc_code=-32602)
        if ApiToken.objects.filter(rotated_from=token).exists():
            raise YuzuError("token already has a successor; confirm or revoke it first", status=409, rpc_code=-32602)
        expires = token.expires_at
        if token.mcp_tier and expires is None:
            expires = now + timedelta(days=MCP_TOKEN_MAX_DAYS)
        successor, raw = ApiToken.mint(principal.user, token.name, mcp_tier=token.mcp_tier, expires_at=expires,
                                       scope_service=token.scope_service, now=now)
        successor.rotated_from = token
        successor.save(update_fields=["rotated_from"])
        token.retire_at = now + timedelta(seconds=overlap_secs)
        if token.expires_at and token.retire_at > token.expires_at:
            token.retire_at = token.expires_at
        token.save(update_fields=["retire_at"])
    audit(principal, "api_token.rotate", "success", target_type="ApiToken", target_id=token.id,
          detail=f"successor={successor.id} overlap_secs={overlap_secs}", correlation_id=cid)
    return {**token_view(successor), "token": raw, "predecessor_retire_at": _iso(token.retire_at)}


def confirm_rotation(principal: Principal, successor_id: str, *, cid: str = "") -> JsonObject:
    """Retire the predecessor now that the successor is in use."""
    require_fresh_mfa(principal, "ApiToken:Rotate")
    with transaction.atomic():
        successor = _own_token(principal, successor_id)
        old = successor.rotated_from
        if old is None:
            raise YuzuError("token is not a rotation successor", status=409, rpc_code=-32602)
        check_ceiling(principal, successor.mcp_tier, successor.expires_at, permission="ApiToken:Rotate",
                      token=successor)
        now = timezone.now()
        if old.revoked_at is None:
            old.revoked_at = now
            old.save(update_fields=["revoked_at"])
    audit(principal, "api_token.confirm_rotation", "success", target_type="ApiToken", target_id=successor.id,
          detail=f"retired={old.id}", correlation_id=cid)
    return {"id": successor.id, "retired": old.id}
