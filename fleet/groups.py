"""Management-group membership: static members, or every agent a scope expression matches; and a service's
devices (those tagged service=<name>), the reach of a service-scoped token (docs/tokens-and-rbac.md)."""

from django.db.models import Q

from .models import Agent, ManagementGroup, Tag
from .scope import to_q


def service_agent_ids(service):
    """The ids of the devices tagged service=<service>, as a subquery."""
    return Tag.objects.filter(key="service", value=service.strip().lower()).values("agent_id")


def in_service(service, agent):
    """Whether the device (an Agent or its id) is tagged service=<service>."""
    return Tag.objects.filter(agent_id=getattr(agent, "pk", agent), key="service",
                              value=service.strip().lower()).exists()


def agent_group_ids(agent):
    agent_id = getattr(agent, "pk", agent)
    ids = set(ManagementGroup.objects.filter(members__agent_id=agent_id).values_list("id", flat=True))
    for group in ManagementGroup.objects.filter(membership_type=ManagementGroup.Membership.DYNAMIC).exclude(scope_expression=""):
        if group_agents(group).filter(pk=agent_id).exists():
            ids.add(group.id)
    # A grant on a parent group covers its descendants' devices.
    parents = dict(ManagementGroup.objects.values_list("id", "parent_id"))
    for gid in list(ids):
        p = parents.get(gid)
        while p and p not in ids:
            ids.add(p)
            p = parents.get(p)
    return ids


def group_agents(group):
    """The agents a group holds, as a queryset."""
    if group.membership_type == ManagementGroup.Membership.DYNAMIC and group.scope_expression:
        return Agent.objects.filter(to_q(group.scope_expression))
    return group.members.all()


def agents_in_groups(group_ids):
    """Agents in any of the groups (and their descendant groups), as a queryset."""
    children = {}
    for gid, parent in ManagementGroup.objects.values_list("id", "parent_id"):
        children.setdefault(parent, []).append(gid)
    todo, seen = list(group_ids), set()
    while todo:
        g = todo.pop()
        if g in seen:
            continue
        seen.add(g)
        todo.extend(children.get(g, []))
    q = Q(pk__in=[])
    for group in ManagementGroup.objects.filter(pk__in=seen):
        if group.membership_type == ManagementGroup.Membership.DYNAMIC and group.scope_expression:
            q |= to_q(group.scope_expression)
        else:
            q |= Q(groups=group)
    return Agent.objects.filter(q).distinct()
