"""REST views for agents and management groups (thin wrappers over fleet.services)."""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view

from yuzu import rbac
from yuzu.api.envelope import cid_of, ok
from yuzu.api.views import body, principal_of

from . import services

GroupBody = inline_serializer("ManagementGroupBody", {
    "name": serializers.CharField(max_length=128),
    "description": serializers.CharField(required=False, max_length=1024),
    "parent_id": serializers.CharField(required=False, allow_null=True),
    "membership_type": serializers.ChoiceField(choices=["static", "dynamic"], required=False),
    "scope_expression": serializers.CharField(required=False, max_length=8192),
})


@extend_schema(summary="List agents the caller may see")
@api_view(["GET"])
def agents_view(request):
    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    rows = services.list_agents(p)
    return ok(rows, count=len(rows))


@extend_schema(summary="One agent with its tags")
@api_view(["GET"])
def agent_detail(request, agent_id):
    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    return ok(services.agent_details(p, agent_id))


@extend_schema(methods=["GET"], summary="List management groups")
@extend_schema(methods=["POST"], request=GroupBody, summary="Create a management group")
@api_view(["GET", "POST"])
def groups_view(request):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "ManagementGroup", "Read")
        rows = services.list_groups(p)
        return ok(rows, count=len(rows))
    rbac.check(p, "ManagementGroup", "Write")
    d = body(request)
    return ok(services.create_group(p, name=d.get("name", ""), description=d.get("description", ""),
                                    parent_id=d.get("parent_id"), membership_type=d.get("membership_type", "static"),
                                    scope_expression=d.get("scope_expression", ""), cid=cid_of(request)), status=201)


@extend_schema(methods=["PUT"], request=GroupBody, summary="Update a management group")
@extend_schema(methods=["GET"], summary="One management group with its members")
@api_view(["GET", "PUT"])
def group_detail(request, group_id):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "ManagementGroup", "Read")
        return ok(services.get_group(p, group_id))
    rbac.check(p, "ManagementGroup", "Write")
    d = body(request)
    fields = {k: d.get(k) for k in ("name", "description", "parent_id", "membership_type", "scope_expression") if k in d}
    return ok(services.update_group(p, group_id, cid=cid_of(request), **fields))


@extend_schema(request=inline_serializer("GroupMember", {"agent_id": serializers.CharField()}),
               summary="Add an agent to a static group")
@api_view(["POST"])
def group_members(request, group_id):
    p = principal_of(request)
    rbac.check(p, "ManagementGroup", "Write")
    d = body(request)
    return ok(services.add_group_member(p, group_id, str(d.get("agent_id", "")), cid=cid_of(request)), status=201)


@extend_schema(methods=["POST"], request=inline_serializer("GroupRole", {"username": serializers.CharField(),
                                                                         "role": serializers.CharField()}),
               summary="Assign a role on this group")
@extend_schema(methods=["GET"], summary="Role assignments on this group")
@api_view(["GET", "POST"])
def group_roles(request, group_id):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "ManagementGroup", "Read", any_scope=True)
        return ok(services.list_group_roles(p, group_id))
    d = body(request)
    return ok(services.assign_group_role(p, group_id, str(d.get("username", "")), str(d.get("role", "")),
                                         cid=cid_of(request)), status=201)
