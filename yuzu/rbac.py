"""RBAC: one service function answers "may principal P do Securable:Operation (on device D / group G)?".

Permissions are ``Securable:Operation`` pairs held by roles; a user holds roles globally or on a
management group. A token acts with its owner's RBAC; an MCP token's tier is an extra ceiling
(yuzu.policy.tier_allows), applied by ``check``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from django.contrib.auth import get_user_model
from django.db.models import Model, Q, QuerySet

from fleet.groups import agent_group_ids, in_service
from fleet.models import ManagementGroup

from .errors import NotFound, PermissionDenied
from .jsondata import JsonObject
from .models import (
    OPERATIONS,
    SECURABLES,
    AccountLockout,
    ApiToken,
    Role,
    RoleAssignment,
    RolePermission,
)
from .policy import requires_approval, tier_allows, tier_floor

if TYPE_CHECKING:
    from django.contrib.auth.models import User

#: (securable, operation)
Permission = tuple[str, str]
#: what a permission is held on: None for every device (a global grant), else the management group ids
Grants = dict[Permission, "set[str] | None"]

ALL: list[Permission] = [(s, o) for s in SECURABLES for o in OPERATIONS]
#: Securables whose grants may be held on a management group: they concern devices, groups, tickets
#: pinned to devices, or a group's own plugin kill switches (PluginConfig; the rest of the plugin store stays
#: fleet-wide). A role held on a group grants nothing on any other securable (the audit log, tokens,
#: users, definitions, the bridge …): those are not any group's, and need a global grant.
GROUP_SCOPED = frozenset({"Infrastructure", "Tag", "Execution", "Response", "Security", "Inventory",
                          "ManagementGroup", "Approval", "PluginConfig"})
READS: list[Permission] = [(s, "Read") for s in SECURABLES]

BUILTIN_ROLES: dict[str, tuple[str, list[Permission]]] = {
    "Administrator": ("Everything, on every device.", ALL),
    "Operator": (
        "Runs instructions, manages tags and reads everything.",
        READS + [("Execution", "Execute"), ("Tag", "Write"), ("Tag", "Delete"), ("ApiToken", "Write"),
                 ("ApiToken", "Delete"), ("ApiToken", "Rotate"), ("Response", "Write"), ("Bridge", "Write"),
                 ("Bridge", "Execute"), ("GuaranteedState", "Push")],
    ),
    "Viewer": ("Reads fleet state; changes nothing.", [p for p in READS if p[0] not in ("UserManagement",)]
              + [("ApiToken", "Write"), ("ApiToken", "Delete"), ("ApiToken", "Rotate")]),
    "Approver": ("Reviews approval tickets.", [("Approval", "Read"), ("Approval", "Approve"), ("AuditLog", "Read"),
                                                ("Infrastructure", "Read"), ("ApiToken", "Read")]),
    "ITServiceOwner": (
        "Operates the devices of one management group (assign it on that group).",
        [("Infrastructure", "Read"), ("Execution", "Execute"), ("Execution", "Read"), ("Response", "Read"),
         ("Tag", "Read"), ("Tag", "Write"), ("Tag", "Delete"), ("ManagementGroup", "Read"),
         ("ManagementGroup", "Write"), ("Security", "Execute"), ("Inventory", "Read")]
        + [("Policy", o) for o in ("Read", "Write", "Execute", "Delete")]
        + [("GuaranteedState", o) for o in ("Read", "Write", "Delete", "Push")],
    ),
    "Reviewer": ("Attests access reviews (SOC 2 CC6.2): reads and decides on review campaigns.",
                 [("AccessReview", "Read"), ("AccessReview", "Attest")]),
    "PlatformEngineer": (
        "Authors compliance policies and Guardian rules, and deploys the rules.",
        [("Infrastructure", "Read"), ("Policy", "Read"), ("Policy", "Write"), ("Policy", "Delete"),
         ("GuaranteedState", "Read"), ("GuaranteedState", "Write"), ("GuaranteedState", "Delete"),
         ("GuaranteedState", "Push")],
    ),
}


def seed_builtin_roles() -> None:
    """Idempotent: create or refresh the built-in roles and their permissions."""
    for name, (description, perms) in BUILTIN_ROLES.items():
        role, _ = Role.objects.update_or_create(name=name, defaults={"description": description, "builtin": True})
        wanted = set(perms)
        have = set(role.permissions.values_list("securable", "operation"))
        RolePermission.objects.bulk_create(
            [RolePermission(role=role, securable=s, operation=o) for s, o in wanted - have]
        )
        for s, o in have - wanted:
            role.permissions.filter(securable=s, operation=o).delete()


@dataclass
class Principal:
    """Who is calling: a user, through a token or an interactive session."""

    user: User
    token: ApiToken | None = None
    via: Literal["token", "session"] = "token"
    mfa_verified_at: float | None = None
    _grants: Grants | None = field(default=None, repr=False)
    # the admin session a "session" principal authenticated with (the cookie's value: never shown), so that what
    # it holds open can be re-checked against it (mcp.streaming.watch)
    session_key: str | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.user.get_username()

    @property
    def tier(self) -> str:
        return self.token.mcp_tier if self.token is not None else ""

    @property
    def scope_service(self) -> str:
        return self.token.scope_service if self.token is not None else ""

    @property
    def key(self) -> str:
        """Stable identity for keying per-principal state (sessions, streams)."""
        return self.key_for(self.user.pk, self.token.pk if self.token is not None else None)

    @classmethod
    def key_for(cls, user_id: int, token_id: str | None) -> str:
        """The key of user ``user_id``'s principal through token ``token_id`` (None: the admin session)."""
        return cls.key_prefix(user_id) + (f"t{token_id}" if token_id is not None else "s")

    @staticmethod
    def key_prefix(user_id: int) -> str:
        """What every key of one user's principals (each token, the admin session) starts with."""
        return f"u{user_id}."

    @property
    def user_key(self) -> str:
        """Stable identity of the user account behind this principal, whichever token or session it came
        through: for keying per-user shares of process-wide state (mcp.streaming)."""
        return self.key_prefix(self.user.pk)

    @staticmethod
    def user_key_of(key: str) -> str:
        """The user key (``user_key``) of the principal key ``key``; a key that names no user is its own."""
        match = re.match(r"u\d+\.", key)
        return match[0] if match is not None else key

    @staticmethod
    def token_id_of(key: str | None) -> str | None:
        """The id of the token a principal key names (None: the admin session, or no key at all)."""
        match = re.fullmatch(r"u(\d+)\.(?:t([0-9a-f]+)|s)", key or "")
        return match[2] if match is not None else None

    @classmethod
    def from_key(cls, key: str | None) -> Principal | None:
        """The principal behind a key as it stands now, or None when its user is inactive, gone or locked out by
        an administrator, or its token is no longer live."""
        match = re.fullmatch(r"u(\d+)\.(?:t([0-9a-f]+)|s)", key or "")
        if match is None:
            return None
        user = get_user_model().objects.select_related("lockout").filter(pk=int(match[1]), is_active=True).first()
        if user is None or AccountLockout.holds_out(user):
            return None
        if match[2] is None:
            return cls(user=user, via="session")
        token = ApiToken.objects.filter(pk=match[2], owner=user).first()
        return cls(user=user, token=token) if token is not None and token.is_live() else None

    @staticmethod
    def locked_out(key: str | None) -> bool:
        """Whether an administrator's lock holds out the user a key names, now: ``from_key`` finds nobody then,
        but only for as long as the lock holds (it revokes nothing)."""
        match = re.fullmatch(r"u(\d+)\.(?:t[0-9a-f]+|s)", key or "")
        lock = AccountLockout.objects.filter(user_id=int(match[1])).first() if match is not None else None
        return lock is not None and lock.ends_sessions()

    def grants(self) -> Grants:
        """{(securable, operation): set of group ids, or None for a global grant}, cached per request."""
        if self._grants is None:
            grants: Grants = {}
            if self.user.is_superuser:
                grants = dict.fromkeys(ALL)
            else:
                rows = RolePermission.objects.filter(role__assignments__user=self.user).values_list(
                    "securable", "operation", "role__assignments__group_id"
                )
                for sec, op, group_id in rows:
                    if group_id is not None and sec not in GROUP_SCOPED:
                        continue
                    if group_id is None:
                        grants[(sec, op)] = None
                    else:
                        held = grants.setdefault((sec, op), set())
                        if held is not None:  # None: a global grant already covers every group
                            held.add(group_id)
            self._grants = grants
        return self._grants


def may(principal: Principal, securable: str, operation: str, *, agent: Model | str | None = None,
        group: Model | str | None = None) -> bool:
    """RBAC alone (no tier): a global grant allows everything; a group grant allows the devices of that
    group (``agent``) or the group itself (``group``)."""
    if agent is not None and principal.scope_service and not in_service(principal.scope_service, agent):
        return False  # a service-scoped token reaches its service's devices only, whatever its grants
    scope = _held_on(principal, securable, operation)
    if scope is None:
        return True
    if not scope:
        return False
    if group is not None:
        gid = _pk(group)
        return gid in scope or _ancestor_granted(gid, scope)
    if agent is not None:
        return bool(agent_group_ids(agent) & scope)
    return False


def _held_on(principal: Principal, securable: str, operation: str) -> set[str] | None:
    """None for a global grant, else the ids of the groups the permission is held on (empty: held nowhere)."""
    grants = principal.grants()
    return grants[(securable, operation)] if (securable, operation) in grants else set()


def _pk(obj: Model | str) -> str:
    """An object's primary key, or the key itself."""
    return obj if isinstance(obj, str) else str(obj.pk)


def _ancestor_granted(group_id: str, scope: set[str]) -> bool:

    seen: set[str] = set()
    current = ManagementGroup.objects.filter(pk=group_id).values_list("parent_id", flat=True).first()
    while current and current not in seen:
        if current in scope:
            return True
        seen.add(current)
        current = ManagementGroup.objects.filter(pk=current).values_list("parent_id", flat=True).first()
    return False


def group_scope(principal: Principal, securable: str, operation: str) -> set[str] | None:
    """None = every device; otherwise the set of group ids the grant is confined to (may be empty)."""
    scope = _held_on(principal, securable, operation)
    return None if scope is None else set(scope)


def has_any(principal: Principal, securable: str, operation: str) -> bool:
    """A global grant or a grant on at least one group (admit-then-filter reads)."""
    scope = _held_on(principal, securable, operation)
    return scope is None or bool(scope)


def check_tier(principal: Principal, securable: str, operation: str, *, surface: str = "rest",
               confined: bool = False) -> None:
    """What refuses a token whatever its roles, for a capability with no RBAC gate of its own (withdrawing one's
    own ticket) as for every other, in the MCP pipeline's order: a service-scoped token, unless the capability is
    the twin of a "confined" tool (``confined``: its service function keeps to the token's service); then the tier
    ceiling — refused above the tier, and on non-MCP surfaces an MCP token may not perform an approval-gated
    operation (the ticket could otherwise be bypassed)."""
    if not confined:
        refuse_service_scoped(principal, securable, operation)
    perm = f"{securable}:{operation}"
    if not tier_allows(principal.tier, securable, operation):
        raise tier_denial(principal, securable, operation)
    if surface != "mcp" and requires_approval(principal.tier, securable, operation):
        raise PermissionDenied(perm, f"{perm} needs a human approval for a '{principal.tier}' MCP token; call it "
                                     "through MCP", extra={"tier": principal.tier},
                               remediation="call the MCP tool at /mcp/v1/ (tools/call): it mints an approval ticket "
                                           f"that a human reviews in the admin at {APPROVALS_PAGE}")


def check(principal: Principal, securable: str, operation: str, *, agent: Model | str | None = None,
          group: Model | str | None = None, surface: str = "rest", any_scope: bool = False,
          confined: bool = False) -> None:
    """The REST face's gate, in the MCP pipeline's order: the service scope and the tier ceiling (check_tier),
    then RBAC."""
    check_tier(principal, securable, operation, surface=surface, confined=confined)
    allowed = has_any(principal, securable, operation) if any_scope else may(
        principal, securable, operation, agent=agent, group=group)
    if not allowed:
        raise denial(principal, securable, operation, agent=agent, group=group)


# Surfaces a refusal may send a caller to: each exists (the admin's pages, a management command).
APPROVALS_PAGE = "/admin/approvals/approval/"
ROLE_ASSIGNMENT_PAGE = "/admin/yuzu/roleassignment/add/"


def mint_token_hint(principal: Principal, tier: str) -> str:
    return f"`python manage.py mint_token --user {principal.name} --name <label> --tier {tier}`"


def tier_denial(principal: Principal, securable: str, operation: str) -> PermissionDenied:
    """The tier ceiling's refusal: the tier held, and the lowest tier that allows the operation."""
    perm = f"{securable}:{operation}"
    floor = tier_floor(securable, operation)
    needs = floor if floor == "supervised" else f"{floor} or higher"
    return PermissionDenied(perm, f"tier '{principal.tier}' does not allow {perm} (needs {needs})",
                            extra={"tier": principal.tier, "required_tier": floor},
                            remediation=f"use a token of tier '{floor}' or higher; an administrator mints one with "
                                        f"{mint_token_hint(principal, floor)}")


def refuse_service_scoped(principal: Principal, securable: str, operation: str) -> None:
    """A capability that reaches beyond one service's devices (the install's stores, fleet-wide identities): a
    service-scoped token is refused it on every face — over MCP its tool's class is "denied"; its REST twin
    calls this from the capability's own check."""
    if principal.scope_service:
        perm = f"{securable}:{operation}"
        raise PermissionDenied(perm, f"service-scoped tokens may not {perm}: it reaches beyond one service's "
                                     f"devices (this token is scoped to service '{principal.scope_service}')",
                               extra={"scope_service": principal.scope_service},
                               remediation="use a token without a service scope")


def denial(principal: Principal, securable: str, operation: str, *, agent: Model | str | None = None,
           group: Model | str | None = None) -> PermissionDenied:
    """RBAC's refusal, saying what the caller holds: no grant at all (and the built-in roles that carry one),
    or a grant confined to management groups that do not cover this agent or group."""
    perm = f"{securable}:{operation}"
    scope = group_scope(principal, securable, operation)
    if scope is None:  # a fleet-wide grant: refused by a rule of the tool's own (its message says which)
        return PermissionDenied(perm)
    if not scope:
        roles = list(Role.objects.filter(builtin=True, permissions__securable=securable,
                                         permissions__operation=operation).values_list("name", flat=True))
        which = f"; built-in roles that do: {', '.join(roles)}" if roles else ""
        # A role held on a group carries this permission, but a group grant counts only for device-scoped
        # securables: say so, rather than name a role the caller already holds as the fix.
        inert = sorted(set(RoleAssignment.objects.filter(
            user=principal.user, group__isnull=False, role__permissions__securable=securable,
            role__permissions__operation=operation).values_list("role__name", flat=True)))
        if inert:
            return PermissionDenied(perm, f"permission denied: {perm} must be held fleet-wide; your role(s) "
                                          f"{', '.join(inert)} carry it only on management groups, where it grants "
                                          "nothing",
                                    extra={"granted_on": [], "roles_granting": roles},
                                    remediation=f"ask an administrator to assign a role that grants {perm} without "
                                                f"a group (admin: {ROLE_ASSIGNMENT_PAGE})")
        return PermissionDenied(perm, f"permission denied: {perm} (none of your roles grants it{which})",
                                extra={"granted_on": [], "roles_granting": roles},
                                remediation=f"ask an administrator to assign you a role that grants {perm} "
                                            f"(admin: {ROLE_ASSIGNMENT_PAGE})")
    groups = sorted(ManagementGroup.objects.filter(pk__in=scope).values_list("name", flat=True))
    if agent is not None:
        target = {"agent_id": str(getattr(agent, "pk", agent))}
        what = f"agent '{target['agent_id']}'"
    elif group is not None:
        target = {"group_id": str(getattr(group, "pk", group))}
        what = f"management group '{getattr(group, 'name', None) or target['group_id']}'"
    else:
        target, what = {}, "this target"
    return PermissionDenied(perm, f"permission denied: {perm} on {what}: your grant is confined to management "
                                  f"group(s) {', '.join(repr(g) for g in groups)}, which do not cover it",
                            extra={"granted_on": groups, **target},
                            remediation="act on what those groups cover (list_agents, or GET /api/v1/agents, shows "
                                        "it), or ask an administrator for the role on the target's group "
                                        f"(admin: {ROLE_ASSIGNMENT_PAGE})")


def self_check(principal: Principal, securable: str, operation: str) -> JsonObject:
    """May the caller do securable:operation (tier ceiling included)? check_permission and POST /rbac/check."""
    rbac_ok = may(principal, securable, operation)
    tier_ok = tier_allows(principal.tier, securable, operation)
    return {"securable_type": securable, "operation": operation, "allowed": rbac_ok and tier_ok,
            "rbac_allowed": rbac_ok, "tier_allowed": tier_ok}


def list_roles() -> list[JsonObject]:
    return [{"name": r.name, "description": r.description, "builtin": r.builtin} for r in Role.objects.all()]


def role_permissions(name: str) -> JsonObject:
    role = Role.objects.filter(name=name).first()
    if role is None:
        raise NotFound(f"role not found: {name}")
    return {"role": role.name, "permissions": [f"{p.securable}:{p.operation}" for p in role.permissions.all()]}


def roles_with(securable: str, operation: str) -> list[str]:
    return list(Role.objects.filter(permissions__securable=securable, permissions__operation=operation)
                .values_list("name", flat=True))


def assign_role(user: User, role_name: str, group: Model | None = None) -> RoleAssignment:
    role = Role.objects.get(name=role_name)
    return RoleAssignment.objects.get_or_create(user=user, role=role, group=group)[0]


def user_assignments(user: User) -> QuerySet[RoleAssignment]:
    return RoleAssignment.objects.filter(user=user).select_related("role", "group")


__all__ = ["Principal", "may", "check", "check_tier", "group_scope", "seed_builtin_roles", "assign_role", "Q"]
