"""Fleet service functions shared by the REST views and the MCP tools: agents, tags and
management groups. Callers have passed the capability's generic gate; per-object checks live here."""

from operator import itemgetter

import orjson
from django.contrib.auth import get_user_model
from django.core.exceptions import EmptyResultSet, ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from pki import services as pki_services
from yuzu import rbac
from yuzu.audit import audit
from yuzu.dbfuncs import IsoUtc
from yuzu.errors import NotFound, PermissionDenied, YuzuError
from yuzu.models import Role, RoleAssignment
from yuzu.plans import Plan, check_role_pin, role_pins
from yuzu.stepup import require_fresh_mfa

from .groups import agents_in_groups, group_agents, service_agent_ids
from .models import Agent, DeviceToken, ManagementGroup, Tag, normalise_tag
from .push import push_tags, send_to_agent
from .scope import ScopeError, parse

AGENT_FIELDS = ("agent_id", "hostname", "os", "arch", "agent_version", "connected", "last_seen", "quarantined")


def agent_view(a):
    """An agent (model instance or a ``values(*AGENT_FIELDS)`` row) as the API shows it."""
    row = a if isinstance(a, dict) else {f: getattr(a, f) for f in AGENT_FIELDS}
    return {**row, "last_seen": row["last_seen"].isoformat() if row["last_seen"] else None}


def visible_agents(principal, securable="Infrastructure", operation="Read"):
    """Agents the principal may see for ``securable:operation`` (global grant = all; group grant = its devices),
    and of those, for a service-scoped token, its service's devices only."""
    scope = rbac.group_scope(principal, securable, operation)
    return in_service(principal, Agent.objects.all() if scope is None else agents_in_groups(scope))


def in_service(principal, qs):
    """``qs`` (agents) as far as a service-scoped token reaches: the devices tagged service=<its service>
    (docs/tokens-and-rbac.md); ``qs`` itself for any other caller."""
    if not principal.scope_service:
        return qs
    return qs.filter(pk__in=service_agent_ids(principal.scope_service))


# (connected, limit) → the SQL and parameters of the fleet-wide list (a reader with a global grant). The same text
# every call, so the ORM compiles it once per shape, not on every call (that compile was a quarter of the
# call's CPU). At most 3 × 1000 entries: the tool's schema bounds limit.
_FLEET_LIST_SQL: dict[tuple[bool | None, int], tuple[str, tuple]] = {}


def _list_sql(qs, connected, limit):
    if connected is not None:
        qs = qs.filter(connected=connected)
    fields = ["seen_iso" if f == "last_seen" else f for f in AGENT_FIELDS]
    qs = qs.annotate(seen_iso=IsoUtc("last_seen")).order_by("agent_id").values_list(*fields)[:limit]
    return qs.query.sql_with_params()


def list_agents(principal, *, connected=None, limit=1000):
    """The agents ``principal`` may see (management-group confinement: visible_agents), as the API shows them."""
    scope = rbac.group_scope(principal, "Infrastructure", "Read")
    try:
        if scope is None:
            key = (connected, limit)
            if key not in _FLEET_LIST_SQL:
                _FLEET_LIST_SQL[key] = _list_sql(Agent.objects.all(), connected, limit)
            sql, params = _FLEET_LIST_SQL[key]
        else:
            sql, params = _list_sql(agents_in_groups(scope), connected, limit)
    except EmptyResultSet:  # confined to no group
        return []
    sqlite = connection.vendor == "sqlite"
    if sqlite:
        # One step for the whole list: Python's sqlite3 lets go of the GIL around every sqlite3_step, once per
        # row, and in a busy process each of those hands the GIL to another thread and waits to get it back (the
        # worker threads' CPU per call doubled at 16 connections). The same values as the driver's rows; SQLite
        # keeps no promise about an aggregate's order, so the rows are put back in the query's own.
        sql = f"WITH t(a, b, c, d, e, f, g, h) AS ({sql}) SELECT json_group_array(json_array(a, b, c, d, e, f, g, h)) FROM t"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if sqlite:
        rows = sorted(orjson.loads(rows[0][0]), key=itemgetter(0))
    # The driver's own values: bools (0/1 on SQLite), and last_seen already as the API writes it (IsoUtc).
    return [{"agent_id": agent_id, "hostname": hostname, "os": os, "arch": arch, "agent_version": version,
             "connected": bool(conn), "last_seen": seen, "quarantined": bool(quarantined)}
            for agent_id, hostname, os, arch, version, conn, seen, quarantined in rows]


def get_agent(principal, agent_id, *, securable="Infrastructure"):
    agent = Agent.objects.filter(pk=agent_id).first()
    if agent is None or not rbac.may(principal, securable, "Read", agent=agent):
        raise NotFound(f"Agent not found: {agent_id}")
    return agent


def agent_details(principal, agent_id):
    agent = get_agent(principal, agent_id)
    data = agent_view(agent)
    data["attributes"] = agent.attributes
    tags = list(agent.tags.all())
    data["tags"] = {t.key: t.value for t in tags}
    data["tag_origins"] = {t.key: t.origin for t in tags}  # server: set on the server, wins; agent: reported
    data["groups"] = sorted(agent.groups.values_list("name", flat=True))
    return data


def get_tags(principal, agent_id):
    agent = get_agent(principal, agent_id, securable="Tag")
    return {"agent_id": agent.agent_id,
            "tags": [{"key": t.key, "value": t.value, "origin": t.origin} for t in agent.tags.all()]}


def search_agents_by_tag(principal, key, value=None):
    qs = Tag.objects.filter(key=key, agent__in=visible_agents(principal, "Tag", "Read"))
    if value is not None:
        qs = qs.filter(value=value)
    return {"key": key, "value": value, "agent_ids": sorted(qs.values_list("agent_id", flat=True))}


def set_tag(principal, agent_id, key, value, *, cid=""):
    agent = get_agent(principal, agent_id, securable="Tag")
    if not rbac.may(principal, "Tag", "Write", agent=agent):
        raise rbac.denial(principal, "Tag", "Write", agent=agent)
    key, value = normalise_tag(key, value)
    # the server's from now on: a register no longer changes or removes it (a reported one is taken over)
    Tag.objects.update_or_create(agent=agent, key=key, defaults={"value": value, "origin": Tag.Origin.SERVER})
    audit(principal, "tag.set", "success", target_type="Agent", target_id=agent.agent_id, detail=f"{key}={value}",
          correlation_id=cid)
    push_tags(agent.agent_id)
    return {"agent_id": agent.agent_id, "key": key, "value": value}


def plan_delete_tag(principal, agent_id, key, pinned=None):
    """The one validation of a tag deletion: an agent the caller may delete tags on. Pins the agent."""
    agent = get_agent(principal, agent_id, securable="Tag")
    if not rbac.may(principal, "Tag", "Delete", agent=agent):
        raise rbac.denial(principal, "Tag", "Delete", agent=agent)
    current = Tag.objects.filter(agent=agent, key__in={key, key.lower()}).values_list("key", "value").first()
    where = f"{agent.hostname or agent.agent_id} ({agent.agent_id})"
    summary = (f"Delete tag {current[0]}={current[1]} from {where}" if current
               else f"Delete tag {key} from {where} (it is not set now)")
    return Plan(summary=summary, value=(agent, key), pins={"agents": [agent.agent_id]}, risk="destructive",
                facts={"tag": key})


def delete_tag(principal, agent_id=None, key=None, *, cid="", plan=None):
    agent, key = (plan or plan_delete_tag(principal, agent_id, key)).value
    deleted, _ = Tag.objects.filter(agent=agent, key=key).delete()
    if not deleted:
        lowered = key.lower()
        deleted, _ = Tag.objects.filter(agent=agent, key=lowered).delete()
    audit(principal, "tag.delete", "success", target_type="Agent", target_id=agent.agent_id,
          detail=f"key={key} deleted={bool(deleted)}", correlation_id=cid)
    push_tags(agent.agent_id)
    return {"agent_id": agent.agent_id, "key": key, "deleted": bool(deleted)}


# --- management groups -------------------------------------------------------------------------

def group_view(g):
    return {"id": g.id, "name": g.name, "description": g.description, "parent_id": g.parent_id,
            "membership_type": g.membership_type, "scope_expression": g.scope_expression or None,
            "created_by": g.created_by, "created_at": g.created_at.isoformat(), "updated_at": g.updated_at.isoformat()}


def visible_groups(principal, operation="Read", securable="ManagementGroup"):
    """The groups the principal may see for <securable>:<operation> (ManagementGroup by default): all with a
    fleet-wide grant, otherwise the groups it holds the grant on and their descendants."""
    scope = rbac.group_scope(principal, securable, operation)
    if scope is None:
        return ManagementGroup.objects.all()
    children, seen, todo = {}, set(), list(scope)
    for gid, parent in ManagementGroup.objects.values_list("id", "parent_id"):
        children.setdefault(parent, []).append(gid)
    while todo:
        g = todo.pop()
        if g not in seen:
            seen.add(g)
            todo.extend(children.get(g, []))
    return ManagementGroup.objects.filter(pk__in=seen)


def list_groups(principal):
    return [group_view(g) for g in visible_groups(principal)]


def _group(group_id, principal=None, operation="Read"):
    """A group by id or exact name; one the principal may not reach reads as absent (no oracle)."""
    qs = visible_groups(principal, operation) if principal is not None else ManagementGroup.objects.all()
    g = qs.filter(pk=group_id).first() or qs.filter(name=group_id).first()
    if g is None:
        raise NotFound(f"management group not found: {group_id}")
    return g


def _require_fleet_wide_write(principal):
    """Which devices a group holds decides what its role holders may do on them, so creating a group or
    changing its members, scope, type or parent needs a fleet-wide ManagementGroup:Write — a grant on one
    group would otherwise widen itself (issue 10, found by the authorization matrix)."""
    if not rbac.may(principal, "ManagementGroup", "Write"):
        raise PermissionDenied("ManagementGroup:Write", "permission denied: ManagementGroup:Write (fleet-wide: "
                               "creating or changing a group needs a grant on every group, not on one)")


def get_group(principal, group_id):
    g = _group(group_id, principal)
    data = group_view(g)
    data["members"] = sorted(group_agents(g).values_list("agent_id", flat=True))
    return data


def _validate_group_fields(fields):
    mt = fields.get("membership_type")
    if mt is not None and mt not in ManagementGroup.Membership.values:
        raise ValidationError({"membership_type": "membership_type must be 'static' or 'dynamic'"})
    expr = fields.get("scope_expression")
    if expr:
        try:
            parse(expr)
        except ScopeError as exc:
            raise ValidationError({"scope_expression": str(exc)}) from None


def _pinned_group(principal, group_id, pinned, key="group"):
    """The group a plan acts on, among those the principal may write: looked up by id or name, or — on an
    approved recall — the very group the approver saw (a group renamed or re-created under the same name
    since is not silently swapped in)."""
    if pinned is not None and (pinned or {}).get(key):
        g = visible_groups(principal, "Write").filter(pk=pinned[key]).first()
        if g is None:
            raise NotFound(f"management group not found: {group_id} (it was deleted after the approval)")
        return g
    return _group(group_id, principal, "Write")


def plan_create_group(principal, *, name, description="", parent_id=None,
                      membership_type=ManagementGroup.Membership.STATIC, scope_expression="", pinned=None):
    _require_fleet_wide_write(principal)
    if not name or len(name) > 128:
        raise ValidationError({"name": "name is required, at most 128 characters"})
    _validate_group_fields({"membership_type": membership_type, "scope_expression": scope_expression})
    if membership_type == ManagementGroup.Membership.DYNAMIC and not scope_expression:
        raise ValidationError({"scope_expression": "a dynamic group needs a scope_expression"})
    parent = _pinned_group(principal, parent_id, pinned, "parent") if parent_id else None
    if ManagementGroup.objects.filter(name=name).exists():
        raise _name_taken(name)
    fields = {"name": name, "description": description or "", "parent": parent, "membership_type": membership_type,
              "scope_expression": scope_expression or ""}
    summary = (f"Create {membership_type} management group '{name}'" + (f" under '{parent.name}'" if parent else "")
               + (f" holding the agents matching `{scope_expression}`" if scope_expression else ""))
    return Plan(summary=summary, value=fields, pins={"parent": parent.pk} if parent else {}, risk="write")


def _name_taken(name):
    return ValidationError({"name": f"a group named '{name}' already exists"})


def _check_not_own_ancestor(g, parent):
    """Refuse ``parent`` when ``g`` is it or one of its ancestors (the tree as the database holds it now)."""
    parents = dict(ManagementGroup.objects.values_list("id", "parent_id"))
    p, seen = parent and parent.pk, set()
    while p is not None and p not in seen:
        if p == g.pk:
            raise ValidationError({"parent_id": "a group cannot be its own ancestor"})
        seen.add(p)
        p = parents.get(p)


def _unique_name(write, name):
    """Run ``write``; a concurrent write that took ``name`` since the plan checked it is the plan's refusal."""
    try:
        with transaction.atomic():
            return write()
    except IntegrityError:
        if name is not None and ManagementGroup.objects.filter(name=name).exists():
            raise _name_taken(name) from None
        raise


def create_group(principal, *, cid="", plan=None, **request):
    fields = (plan or plan_create_group(principal, **request)).value
    g = _unique_name(lambda: ManagementGroup.objects.create(created_by=principal.name, **fields), fields["name"])
    audit(principal, "management_group.create", "success", target_type="ManagementGroup", target_id=g.id,
          detail=f"name={g.name}", correlation_id=cid)
    return group_view(g)


def plan_update_group(principal, group_id, *, pinned=None, **fields):
    g = _pinned_group(principal, group_id, pinned)
    _require_fleet_wide_write(principal)
    fields = {k: v for k, v in fields.items() if v is not None}
    _validate_group_fields(fields)
    if "parent_id" in fields:
        parent = _pinned_group(principal, fields["parent_id"], pinned, "parent") if fields["parent_id"] else None
        _check_not_own_ancestor(g, parent)
        fields["parent"] = parent
        fields.pop("parent_id")
    if "name" in fields and ManagementGroup.objects.exclude(pk=g.pk).filter(name=fields["name"]).exists():
        raise _name_taken(fields["name"])
    changes = ", ".join(f"{k} → {getattr(v, 'name', v)!r}" for k, v in sorted(fields.items())) or "nothing"
    pins = {"group": g.pk, **({"parent": fields["parent"].pk} if fields.get("parent") else {})}
    return Plan(summary=f"Update management group '{g.name}': {changes}"[:1000], value=(g, fields), pins=pins,
                risk="write")


def update_group(principal, group_id=None, *, cid="", plan=None, unchanged_since=None, **fields):
    """Writes only the fields asked for (a concurrent edit of the others stands); a new parent is checked again
    with every group locked, so two re-parentings at once cannot make a cycle that each alone would not.
    ``unchanged_since``: the ``updated_at`` the caller's edit started from (the admin's form, which cannot tell
    what its user changed from what someone else changed since): a group changed since is refused."""
    g, fields = (plan or plan_update_group(principal, group_id, **fields)).value

    def write():
        if "parent" in fields:  # every group locked, in one order: one re-parenting at a time
            list(ManagementGroup.objects.select_for_update().order_by("pk").values_list("pk", flat=True))
            _check_not_own_ancestor(g, fields["parent"])
        rows = ManagementGroup.objects.filter(pk=g.pk)
        if unchanged_since is not None:
            rows = rows.filter(updated_at=unchanged_since)
        if not rows.update(updated_at=timezone.now(), **fields):
            if unchanged_since is not None and ManagementGroup.objects.filter(pk=g.pk).exists():
                raise ValidationError(f"management group '{g.name}' was changed after your edit started; nothing "
                                      "was saved: reload it and make your change again")
            raise NotFound(f"management group not found: {g.pk}")

    _unique_name(write, fields.get("name"))
    g.refresh_from_db()
    audit(principal, "management_group.update", "success", target_type="ManagementGroup", target_id=g.id,
          detail=",".join(sorted("parent_id" if k == "parent" else k for k in fields)), correlation_id=cid)
    return group_view(g)


def plan_add_group_member(principal, group_id, agent_id, pinned=None):
    g = _pinned_group(principal, group_id, pinned)
    _require_fleet_wide_write(principal)
    if g.membership_type == ManagementGroup.Membership.DYNAMIC:
        raise ValidationError({"group": "a dynamic group's members come from its scope expression"})
    agent = Agent.objects.filter(pk=agent_id).first()
    if agent is None:
        raise NotFound(f"Agent not found: {agent_id}")
    return Plan(summary=f"Add agent {agent.hostname or agent_id} ({agent_id}) to management group '{g.name}' "
                        f"(whoever holds a role on that group gains it on this agent)",
                value=(g, agent), pins={"group": g.pk, "agents": [agent_id]}, risk="write")


def add_group_member(principal, group_id=None, agent_id=None, *, cid="", plan=None):
    g, agent = (plan or plan_add_group_member(principal, group_id, agent_id)).value
    g.members.add(agent)
    audit(principal, "management_group.add_member", "success", target_type="ManagementGroup", target_id=g.id,
          detail=f"agent_id={agent.agent_id}", correlation_id=cid)
    return {"group_id": g.id, "agent_id": agent.agent_id, "added": True}


def remove_group_member(principal, group_id, agent_id, *, cid=""):
    """Take an agent out of a static group (the admin's group page is its face)."""
    g = _group(group_id, principal, "Write")
    _require_fleet_wide_write(principal)
    g.members.remove(agent_id)
    audit(principal, "management_group.remove_member", "success", target_type="ManagementGroup", target_id=g.id,
          detail=f"agent_id={agent_id}", correlation_id=cid)
    return {"group_id": g.id, "agent_id": agent_id, "removed": True}


def delete_group(principal, group_id, *, cid=""):
    """Delete a group (the admin's group page is its face): its role assignments, kill switches and policy
    bindings go with it, and its child groups become top-level (a grant on it no longer reaches them)."""
    g = _group(group_id, principal, "Write")
    _require_fleet_wide_write(principal)
    pk, children = g.pk, sorted(g.children.values_list("name", flat=True))
    g.delete()
    audit(principal, "management_group.delete", "success", target_type="ManagementGroup", target_id=pk,
          detail=f"name={g.name}" + (f" children_now_top_level={','.join(children)}"[:1000] if children else ""),
          correlation_id=cid)
    return {"group_id": pk, "deleted": True}


def _may_manage_group_roles(principal, g, operation):
    """Compound gate: a fleet-wide ManagementGroup permission, or ITServiceOwner on this group."""
    if rbac.may(principal, "ManagementGroup", operation):
        return True
    return RoleAssignment.objects.filter(user=principal.user, role__name="ITServiceOwner", group=g).exists()


def _group_roles_denial(g, operation):
    perm = f"ManagementGroup:{operation}"
    return PermissionDenied(perm, f"permission denied: {perm} on management group '{g.name}': role assignments on a "
                                  f"group need {perm} fleet-wide, or ITServiceOwner on that group",
                            extra={"group_id": g.id},
                            remediation="ask an administrator for ITServiceOwner on this group (admin: "
                                        f"{rbac.ROLE_ASSIGNMENT_PAGE})")


def list_group_roles(principal, group_id):
    g = _group(group_id, principal)
    if not _may_manage_group_roles(principal, g, "Read"):
        raise _group_roles_denial(g, "Read")
    rows = RoleAssignment.objects.filter(group=g).select_related("user", "role")
    return {"group_id": g.id, "roles": [{"username": r.user.get_username(), "role": r.role.name} for r in rows]}


def plan_assign_group_role(principal, group_id, username, role, pinned=None):
    g = _pinned_group(principal, group_id, pinned)
    if not _may_manage_group_roles(principal, g, "Write"):
        raise _group_roles_denial(g, "Write")
    require_fresh_mfa(principal, "ManagementGroup:Write")  # a browser left signed in grants no role
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"user not found: {username}")
    role_obj = Role.objects.filter(name=role).first()
    if role_obj is None:
        raise NotFound(f"role not found: {role}")
    try:
        RoleAssignment(user=user, role=role_obj, group=g).clean()  # the rules the admin's page keeps too
    except ValidationError as exc:
        raise PermissionDenied("UserManagement:Write", exc.messages[0],
                               remediation="an administrator assigns it globally in the admin "
                                           f"({rbac.ROLE_ASSIGNMENT_PAGE}, no group)") from None
    permissions = sorted((p.securable, p.operation) for p in role_obj.permissions.all())
    check_role_pin(pinned, role, role_obj.pk, [f"{sec}:{op}" for sec, op in permissions])
    # No escalation: a group's ITServiceOwner granted itself (or anyone) Approver there, reading and — as staff —
    # reviewing tickets it held no permission for. A grantor passes on only what it holds on the group itself, of
    # what a role held on a group confers at all (rbac.GROUP_SCOPED: device-scoped securables).
    beyond = [f"{sec}:{op}" for sec, op in permissions
              if sec in rbac.GROUP_SCOPED and not rbac.may(principal, sec, op, group=g)]
    if beyond:
        raise PermissionDenied(beyond[0], f"permission denied: role {role_obj.name} carries {', '.join(beyond)}, "
                                          f"which you do not hold on management group '{g.name}'; you may grant "
                                          "there only roles whose permissions you hold there",
                               extra={"group_id": g.id},
                               remediation="grant a role within your own, or ask an administrator (admin: "
                                           f"{rbac.ROLE_ASSIGNMENT_PAGE})")
    if pinned is not None and (pinned or {}).get("user") not in (None, user.pk):
        raise NotFound(f"user not found: {username} (the account was replaced after the approval)")
    return Plan(summary=f"Grant role {role_obj.name} on management group '{g.name}' to {username}",
                value=(g, user, role_obj),
                pins={"group": g.pk, "user": user.pk, **role_pins(role_obj.pk, [f"{s}:{o}" for s, o in permissions])},
                risk="write",
                facts={"permissions": [f"{sec}:{op}" for sec, op in permissions]})


def assign_group_role(principal, group_id=None, username=None, role=None, *, cid="", plan=None):
    g, user, role_obj = (plan or plan_assign_group_role(principal, group_id, username, role)).value
    with transaction.atomic():
        RoleAssignment.objects.get_or_create(user=user, role=role_obj, group=g)
    audit(principal, "management_group.assign_role", "success", target_type="ManagementGroup", target_id=g.id,
          detail=f"username={user.get_username()} role={role_obj.name}", correlation_id=cid)
    return {"group_id": g.id, "username": user.get_username(), "role": role_obj.name, "assigned": True}


def revoke_device_token(principal, token_id, *, cid=""):
    """Revoke an enrolment token for good (the admin's device-token page, its only write): no agent enrols with it
    again; agents enrolled with it keep their own credentials. A token already revoked is left as it is, unaudited."""
    token = DeviceToken.objects.filter(pk=token_id).first()
    if token is None:
        raise NotFound(f"device token not found: {token_id}")
    revoked = bool(DeviceToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()))
    if revoked:
        audit(principal, "device_token.revoke", "success", target_type="DeviceToken", target_id=token.pk,
              detail=f"name={token.name} uses={token.uses}", correlation_id=cid)
    return {"token_id": token.pk, "revoked": revoked}


# --- an agent's own credential -----------------------------------------------------------------------

def plan_revoke_agent_credential(principal, agent_id, reason="", pinned=None):
    """The one validation of a credential's revocation. As a certificate's (pki.services): a fleet-wide
    Security:Delete — a grant on one management group does not reach it, nor does a service-scoped token — and
    destructive (approval-gated on the supervised tier). Pins the agent."""
    rbac.refuse_service_scoped(principal, "Security", "Delete")
    if not rbac.may(principal, "Security", "Delete"):
        raise rbac.denial(principal, "Security", "Delete")
    if pinned and pinned.get("agents") != [agent_id]:
        raise YuzuError("the approval was for another agent")
    agent = Agent.objects.filter(pk=agent_id).first() if isinstance(agent_id, str) else None
    if agent is None:
        raise NotFound(f"Agent not found: {agent_id}")
    if not agent.credential_hash:
        raise YuzuError("the agent's credential is already revoked", remediation="nothing was changed; the device "
                        "enrols again with a new device token (it gets a new agent id)")
    certs = list(pki_services.active_agent_certs(agent.pk).values_list("serial_hex", flat=True))
    held = (f", and every certificate it holds is revoked with it (now {len(certs)}: {', '.join(certs)}; the CRL is "
            "republished)") if certs else ", and any certificate it holds is revoked with it (none now)"
    return Plan(summary=f"Revoke the credential of agent {agent.hostname or agent_id} ({agent_id}): its connection "
                        f"closes now and it must enrol again with a new device token{held}"
                        + (f" — reason: {reason[:200]}" if reason else ""),
                value=(agent, reason or ""), pins={"agents": [agent_id]}, risk="destructive",
                facts={"agent_id": agent_id, "hostname": agent.hostname, "connected": agent.connected,
                       "reason": reason or "", "certificates": certs})


def revoke_agent_credential(principal, agent_id=None, reason="", *, cid="", plan=None):
    """Revoke the agent's own credential (the one enroll traded for a device token): its register is refused from
    now on (fleet.identity.register), its live connection is closed through the channel layer (and, were that
    message lost, at its next heartbeat), audited ``agent.credential.revoked``. With it, in one transaction, every
    certificate the agent still holds is revoked through the CA (pki.services.revoke_agent_certificates: audited
    ``ca.cert.revoked`` each, the CRL republished): the key that proved them is the device's, and the device is
    no longer trusted. The Agent row, its tags, groups and records stay; the device comes back only by enrolling
    again with a new device token (a new agent id, certified afresh)."""
    agent, reason = (plan or plan_revoke_agent_credential(principal, agent_id, reason)).value
    with transaction.atomic():
        if not Agent.objects.filter(pk=agent.pk).exclude(credential_hash="").update(credential_hash=""):
            raise YuzuError("the agent's credential is already revoked", remediation="nothing was changed")
        audit(principal, "agent.credential.revoked", "success", target_type="Agent", target_id=agent.pk,
              detail=f"hostname={agent.hostname} reason={reason[:256]}", correlation_id=cid)
        certs = pki_services.revoke_agent_certificates(
            principal, agent.pk, f"agent credential revoked: {reason}" if reason else "agent credential revoked",
            cid=cid)
    send_to_agent(agent.pk, {"type": "agent.cut_off", "why": "agent credential revoked"})
    return {"agent_id": agent.pk, "revoked": True, **certs}
