"""Fleet service functions shared by the REST views and the MCP tools: agents, tags and
management groups. Callers have passed the capability's generic gate; per-object checks live here."""

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction

from yuzu import rbac
from yuzu.audit import audit
from yuzu.errors import NotFound, PermissionDenied
from yuzu.models import Role, RoleAssignment

from .groups import agents_in_groups, group_agents
from .models import Agent, ManagementGroup, Tag, normalise_tag


AGENT_FIELDS = ("agent_id", "hostname", "os", "arch", "agent_version", "connected", "last_seen", "quarantined")


def agent_view(a):
    """An agent (model instance or a ``values(*AGENT_FIELDS)`` row) as the API shows it."""
    row = a if isinstance(a, dict) else {f: getattr(a, f) for f in AGENT_FIELDS}
    return {**row, "last_seen": row["last_seen"].isoformat() if row["last_seen"] else None}


def visible_agents(principal, securable="Infrastructure", operation="Read"):
    """Agents the principal may see for ``securable:operation`` (global grant = all; group grant = its devices)."""
    scope = rbac.group_scope(principal, securable, operation)
    if scope is None:
        return Agent.objects.all()
    return agents_in_groups(scope)


def list_agents(principal, *, connected=None, limit=1000):
    qs = visible_agents(principal)
    if connected is not None:
        qs = qs.filter(connected=connected)
    return [agent_view(row) for row in qs.order_by("agent_id").values(*AGENT_FIELDS)[:limit]]


def get_agent(principal, agent_id, *, securable="Infrastructure"):
    agent = Agent.objects.filter(pk=agent_id).first()
    if agent is None or not rbac.may(principal, securable, "Read", agent=agent):
        raise NotFound(f"Agent not found: {agent_id}")
    return agent


def agent_details(principal, agent_id):
    agent = get_agent(principal, agent_id)
    data = agent_view(agent)
    data["attributes"] = agent.attributes
    data["tags"] = {t.key: t.value for t in agent.tags.all()}
    data["groups"] = sorted(agent.groups.values_list("name", flat=True))
    return data


def get_tags(principal, agent_id):
    agent = get_agent(principal, agent_id, securable="Tag")
    return {"agent_id": agent.agent_id, "tags": [{"key": t.key, "value": t.value} for t in agent.tags.all()]}


def search_agents_by_tag(principal, key, value=None):
    qs = Tag.objects.filter(key=key, agent__in=visible_agents(principal, "Tag", "Read"))
    if value is not None:
        qs = qs.filter(value=value)
    return {"key": key, "value": value, "agent_ids": sorted(qs.values_list("agent_id", flat=True))}


def set_tag(principal, agent_id, key, value, *, cid=""):
    agent = get_agent(principal, agent_id, securable="Tag")
    if not rbac.may(principal, "Tag", "Write", agent=agent):
        raise PermissionDenied("Tag:Write")
    key, value = normalise_tag(key, value)
    Tag.objects.update_or_create(agent=agent, key=key, defaults={"value": value})
    audit(principal, "tag.set", "success", target_type="Agent", target_id=agent.agent_id, detail=f"{key}={value}",
          correlation_id=cid)
    from .push import push_tags

    push_tags(agent.agent_id)
    return {"agent_id": agent.agent_id, "key": key, "value": value}


def delete_tag(principal, agent_id, key, *, cid=""):
    agent = get_agent(principal, agent_id, securable="Tag")
    if not rbac.may(principal, "Tag", "Delete", agent=agent):
        raise PermissionDenied("Tag:Delete")
    deleted, _ = Tag.objects.filter(agent=agent, key=key).delete()
    if not deleted:
        lowered = key.lower()
        deleted, _ = Tag.objects.filter(agent=agent, key=lowered).delete()
    audit(principal, "tag.delete", "success", target_type="Agent", target_id=agent.agent_id,
          detail=f"key={key} deleted={bool(deleted)}", correlation_id=cid)
    from .push import push_tags

    push_tags(agent.agent_id)
    return {"agent_id": agent.agent_id, "key": key, "deleted": bool(deleted)}


# --- management groups -------------------------------------------------------------------------

def group_view(g):
    return {"id": g.id, "name": g.name, "description": g.description, "parent_id": g.parent_id,
            "membership_type": g.membership_type, "scope_expression": g.scope_expression or None,
            "created_by": g.created_by, "created_at": g.created_at.isoformat(), "updated_at": g.updated_at.isoformat()}


def list_groups(principal):
    return [group_view(g) for g in ManagementGroup.objects.all()]


def _group(group_id):
    g = ManagementGroup.objects.filter(pk=group_id).first() or ManagementGroup.objects.filter(name=group_id).first()
    if g is None:
        raise NotFound(f"management group not found: {group_id}")
    return g


def get_group(principal, group_id):
    g = _group(group_id)
    data = group_view(g)
    data["members"] = sorted(group_agents(g).values_list("agent_id", flat=True))
    return data


def _validate_group_fields(fields):
    mt = fields.get("membership_type")
    if mt is not None and mt not in (ManagementGroup.STATIC, ManagementGroup.DYNAMIC):
        raise ValidationError({"membership_type": "membership_type must be 'static' or 'dynamic'"})
    expr = fields.get("scope_expression")
    if expr:
        from .scope import ScopeError, parse

        try:
            parse(expr)
        except ScopeError as exc:
            raise ValidationError({"scope_expression": str(exc)}) from None


def create_group(principal, *, name, description="", parent_id=None, membership_type="static",
                 scope_expression="", cid=""):
    if not name or len(name) > 128:
        raise ValidationError({"name": "name is required, at most 128 characters"})
    fields = {"membership_type": membership_type, "scope_expression": scope_expression}
    _validate_group_fields(fields)
    if membership_type == ManagementGroup.DYNAMIC and not scope_expression:
        raise ValidationError({"scope_expression": "a dynamic group needs a scope_expression"})
    parent = _group(parent_id) if parent_id else None
    if ManagementGroup.objects.filter(name=name).exists():
        raise ValidationError({"name": f"a group named '{name}' already exists"})
    g = ManagementGroup.objects.create(name=name, description=description or "", parent=parent,
                                       membership_type=membership_type, scope_expression=scope_expression or "",
                                       created_by=principal.name)
    audit(principal, "management_group.create", "success", target_type="ManagementGroup", target_id=g.id,
          detail=f"name={name}", correlation_id=cid)
    return group_view(g)


def update_group(principal, group_id, *, cid="", **fields):
    g = _group(group_id)
    fields = {k: v for k, v in fields.items() if v is not None}
    _validate_group_fields(fields)
    if "parent_id" in fields:
        parent = _group(fields.pop("parent_id")) if fields.get("parent_id") else None
        p = parent
        while p is not None:
            if p.pk == g.pk:
                raise ValidationError({"parent_id": "a group cannot be its own ancestor"})
            p = p.parent
        g.parent = parent
    if "name" in fields and ManagementGroup.objects.exclude(pk=g.pk).filter(name=fields["name"]).exists():
        raise ValidationError({"name": f"a group named '{fields['name']}' already exists"})
    for k in ("name", "description", "membership_type", "scope_expression"):
        if k in fields:
            setattr(g, k, fields[k])
    g.save()
    audit(principal, "management_group.update", "success", target_type="ManagementGroup", target_id=g.id,
          detail=",".join(sorted(fields)), correlation_id=cid)
    return group_view(g)


def add_group_member(principal, group_id, agent_id, *, cid=""):
    g = _group(group_id)
    if g.membership_type == ManagementGroup.DYNAMIC:
        raise ValidationError({"group": "a dynamic group's members come from its scope expression"})
    agent = Agent.objects.filter(pk=agent_id).first()
    if agent is None:
        raise NotFound(f"Agent not found: {agent_id}")
    g.members.add(agent)
    audit(principal, "management_group.add_member", "success", target_type="ManagementGroup", target_id=g.id,
          detail=f"agent_id={agent_id}", correlation_id=cid)
    return {"group_id": g.id, "agent_id": agent_id, "added": True}


def _may_manage_group_roles(principal, g, operation):
    """Compound gate: a fleet-wide ManagementGroup permission, or ITServiceOwner on this group."""
    if rbac.may(principal, "ManagementGroup", operation):
        return True
    return RoleAssignment.objects.filter(user=principal.user, role__name="ITServiceOwner", group=g).exists()


def list_group_roles(principal, group_id):
    g = _group(group_id)
    if not _may_manage_group_roles(principal, g, "Read"):
        raise PermissionDenied("ManagementGroup:Read")
    rows = RoleAssignment.objects.filter(group=g).select_related("user", "role")
    return {"group_id": g.id, "roles": [{"username": r.user.get_username(), "role": r.role.name} for r in rows]}


def assign_group_role(principal, group_id, username, role, *, cid=""):
    g = _group(group_id)
    if not _may_manage_group_roles(principal, g, "Write"):
        raise PermissionDenied("ManagementGroup:Write")
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"user not found: {username}")
    role_obj = Role.objects.filter(name=role).first()
    if role_obj is None:
        raise NotFound(f"role not found: {role}")
    if role_obj.name == "Administrator":
        raise PermissionDenied("UserManagement:Write", "the Administrator role is granted globally, not on a group")
    with transaction.atomic():
        RoleAssignment.objects.get_or_create(user=user, role=role_obj, group=g)
    audit(principal, "management_group.assign_role", "success", target_type="ManagementGroup", target_id=g.id,
          detail=f"username={username} role={role}", correlation_id=cid)
    return {"group_id": g.id, "username": username, "role": role, "assigned": True}
