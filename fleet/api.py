"""REST views for agents and management groups (thin wrappers over fleet.services)."""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view

from yuzu import rbac
from yuzu.api.envelope import cid_of, ok
from yuzu.api.views import body, int_param, principal_of

from . import executions, inventory, services

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
        rbac.check(p, "ManagementGroup", "Read", any_scope=True)
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
        rbac.check(p, "ManagementGroup", "Read", any_scope=True)
        return ok(services.get_group(p, group_id))
    rbac.check(p, "ManagementGroup", "Write", any_scope=True)
    d = body(request)
    fields = {k: d.get(k) for k in ("name", "description", "parent_id", "membership_type", "scope_expression") if k in d}
    return ok(services.update_group(p, group_id, cid=cid_of(request), **fields))


@extend_schema(request=inline_serializer("GroupMember", {"agent_id": serializers.CharField()}),
               summary="Add an agent to a static group")
@api_view(["POST"])
def group_members(request, group_id):
    p = principal_of(request)
    rbac.check(p, "ManagementGroup", "Write", any_scope=True)
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
    rbac.check(p, "ManagementGroup", "Write", any_scope=True)
    d = body(request)
    return ok(services.assign_group_role(p, group_id, str(d.get("username", "")), str(d.get("role", "")),
                                         cid=cid_of(request)), status=201)


# --- executions, bundles, tags, inventory, scope, quarantine (twins of the MCP tools) ----------


ExecutionBody = inline_serializer("ExecutionBody", {
    "plugin": serializers.CharField(max_length=128), "action": serializers.CharField(max_length=128),
    "params": serializers.DictField(required=False), "scope": serializers.CharField(required=False, max_length=8192),
    "agent_ids": serializers.ListField(child=serializers.CharField(max_length=128), required=False),
})


@extend_schema(methods=["POST"], request=ExecutionBody, summary="Dispatch plugin.action to agents (async)")
@extend_schema(methods=["GET"], summary="Recent executions")
@api_view(["GET", "POST"])
def executions_view(request):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "Execution", "Read", any_scope=True)
        q = request.query_params
        return ok(executions.list_executions(p, definition_id=q.get("definition_id"), status=q.get("status"),
                                             limit=int_param(request, "limit", 50, 1, 500)))
    rbac.check(p, "Execution", "Execute", any_scope=True)
    d = body(request)
    return ok(executions.start_execution(p, plugin=d.get("plugin"), action=d.get("action"), params=d.get("params"),
                                         scope=d.get("scope"), agent_ids=d.get("agent_ids"), cid=cid_of(request)),
              status=202)


@extend_schema(summary="One execution with counts and progress")
@api_view(["GET"])
def execution_detail(request, execution_id):
    rbac.check(principal_of(request), "Execution", "Read", any_scope=True)
    return ok(executions.execution_status(principal_of(request), execution_id))


@extend_schema(request=None, summary="Cancel: stop further dispatch (commands already sent keep running)")
@api_view(["POST"])
def execution_cancel(request, execution_id):
    p = principal_of(request)
    rbac.check(p, "Execution", "Execute", any_scope=True)
    return ok(executions.cancel_execution(p, execution_id, cid=cid_of(request)))


@extend_schema(summary="Agents' responses for one execution")
@api_view(["GET"])
def execution_responses(request, execution_id):
    p = principal_of(request)
    rbac.check(p, "Response", "Read", any_scope=True)
    q = request.query_params
    return ok(executions.query_responses(p, execution_id=execution_id, agent_id=q.get("agent_id"),
                                         status=q.get("status"), limit=int_param(request, "limit", 100, 1, 1000)))


@extend_schema(summary="Count responses grouped by status, agent_id, exit_code or output")
@api_view(["GET"])
def execution_aggregate(request, execution_id):
    p = principal_of(request)
    rbac.check(p, "Response", "Read", any_scope=True)
    return ok(executions.aggregate_responses(p, execution_id=execution_id,
                                             group_by=request.query_params.get("group_by", "status")))


@extend_schema(request=inline_serializer("BundleBody", {"agent_id": serializers.CharField(max_length=128),
                                                        "steps": serializers.ListField(child=serializers.DictField())}),
               summary="Run 1-32 steps on one agent")
@api_view(["POST"])
def bundles_view(request):
    p = principal_of(request)
    rbac.check(p, "Execution", "Execute", any_scope=True)
    d = body(request)
    return ok(executions.start_bundle(p, agent_id=d.get("agent_id"), steps=d.get("steps"), cid=cid_of(request)),
              status=202)


@extend_schema(summary="A bundle's collated result")
@api_view(["GET"])
def bundle_detail(request, bundle_id):
    p = principal_of(request)
    rbac.check(p, "Response", "Read", any_scope=True)
    return ok(executions.bundle_result(p, bundle_id))


@extend_schema(methods=["PUT"], request=inline_serializer("TagBody", {
    "agent_id": serializers.CharField(), "key": serializers.CharField(), "value": serializers.CharField()}),
    summary="Set a tag (pushed to the agent)")
@extend_schema(methods=["GET"], summary="Tags of one agent (?agent_id=) or agents with a tag (?key=&value=)")
@api_view(["GET", "PUT"])
def tags_view(request):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "Tag", "Read", any_scope=True)
        q = request.query_params
        if q.get("agent_id"):
            return ok(services.get_tags(p, q["agent_id"]))
        return ok(services.search_agents_by_tag(p, q.get("key", ""), q.get("value")))
    d = body(request)
    rbac.check(p, "Tag", "Write", any_scope=True)
    return ok(services.set_tag(p, str(d.get("agent_id", "")), d.get("key"), d.get("value"), cid=cid_of(request)))


@extend_schema(summary="Delete a tag")
@api_view(["DELETE"])
def tag_detail(request, agent_id, key):
    p = principal_of(request)
    rbac.check(p, "Tag", "Delete", any_scope=True)
    return ok(services.delete_tag(p, agent_id, key, cid=cid_of(request)))


@extend_schema(summary="Inventory rows (?agent_id=&plugin=)")
@api_view(["GET"])
def inventory_view(request):
    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    q = request.query_params
    return ok(inventory.query_inventory(p, agent_id=q.get("agent_id"), plugin=q.get("plugin"),
                                        limit=int_param(request, "limit", 100, 1, 1000)))


@extend_schema(summary="Inventory plugins and agent counts")
@api_view(["GET"])
def inventory_tables(request):
    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    return ok(inventory.list_inventory_tables(p))


@extend_schema(summary="All inventory of one agent")
@api_view(["GET"])
def agent_inventory_view(request, agent_id):
    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    return ok(inventory.agent_inventory(p, agent_id))


@extend_schema(request=inline_serializer("ScopeBody", {"expression": serializers.CharField(max_length=8192)}),
               summary="Validate a scope expression")
@api_view(["POST"])
def scope_validate(request):
    rbac.check(principal_of(request), "Infrastructure", "Read", any_scope=True)
    return ok(inventory.validate_scope(str(body(request).get("expression", ""))))


@extend_schema(request=inline_serializer("ScopePreview", {"expression": serializers.CharField(max_length=8192)}),
               summary="Agents a scope expression matches")
@api_view(["POST"])
def scope_preview(request):
    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    return ok(inventory.preview_scope_targets(p, str(body(request).get("expression", ""))))


@extend_schema(summary="Discovery: plugins, instructions or the scope language")
@api_view(["GET"])
def discover_view(request, kind):
    from yuzu.errors import NotFound

    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    if kind == "plugins":
        return ok(inventory.discover_plugins(p))
    if kind == "instructions":
        rbac.check(p, "InstructionDefinition", "Read", any_scope=True)
        return ok(inventory.discover_instructions(p))
    if kind == "scope-kinds":
        return ok(inventory.describe_scope())
    if kind == "routes":
        from .orientation import routes

        return ok(routes())
    raise NotFound(f"unknown discovery kind: {kind}")


@extend_schema(request=inline_serializer("QuarantineBody", {"agent_id": serializers.CharField(max_length=128),
                                                            "reason": serializers.CharField(required=False, max_length=1024)}),
               summary="Quarantine a device")
@api_view(["POST"])
def quarantine_view(request):
    p = principal_of(request)
    rbac.check(p, "Security", "Execute", any_scope=True)
    d = body(request)
    return ok(inventory.quarantine_device(p, str(d.get("agent_id", "")), reason=str(d.get("reason", ""))[:1024],
                                          cid=cid_of(request)))
