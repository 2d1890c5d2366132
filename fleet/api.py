"""REST views of the fleet: thin wrappers over the same service functions as the MCP tools, with the same
input contracts (each body is the twin tool's input schema; yuzu.api.contract)."""

from rest_framework.decorators import api_view

from mcp.schema import obj, string, without
from yuzu import rbac
from yuzu.api.contract import contract, items_of, payload, tool_input, tool_output
from yuzu.api.envelope import cid_of, ok
from yuzu.api.views import int_param, principal_of
from yuzu.errors import NotFound

from . import executions, inventory, orientation, services
from .models import Execution, Response

GROUP_CREATE = tool_input("create_management_group")
GROUP_UPDATE = without(tool_input("update_management_group"), "group_id")  # the group is in the path
GROUP_MEMBER = obj({"agent_id": string(128, minLength=1)}, ["agent_id"])
GROUP_ROLE = obj({"username": string(150, minLength=1), "role": string(64, minLength=1)}, ["username", "role"])
EXECUTE = tool_input("execute_instruction")
BUNDLE = tool_input("execute_bundle")
SET_TAG = tool_input("set_tag")
SCOPE = tool_input("validate_scope")
QUARANTINE = tool_input("quarantine_device")
REVOKE_CREDENTIAL = without(tool_input("revoke_agent_credential"), "agent_id", "approval_id")  # agent: the path
AGENTS = items_of(tool_output("list_agents"), "agents")


@contract("GET", "List agents the caller may see", response=AGENTS)
@api_view(["GET"])
def agents_view(request):
    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    rows = services.list_agents(p)
    return ok(rows, count=len(rows))


@contract("GET", "One agent with its attributes, tags and groups", response=tool_output("get_agent_details"))
@api_view(["GET"])
def agent_detail(request, agent_id):
    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    return ok(services.agent_details(p, agent_id))


@contract("POST", "Revoke an agent's credential (it must enrol again)", body=REVOKE_CREDENTIAL,
          response=tool_output("revoke_agent_credential"))
@api_view(["POST"])
def agent_revoke_credential(request, agent_id):
    p = principal_of(request)
    rbac.check(p, "Security", "Delete", any_scope=True)
    d = payload(request, REVOKE_CREDENTIAL)
    return ok(services.revoke_agent_credential(p, agent_id, d.get("reason", ""), cid=cid_of(request)))


@contract("GET", "List management groups", response=items_of(tool_output("list_management_groups"), "groups"))
@contract("POST", "Create a management group", body=GROUP_CREATE, response=tool_output("create_management_group"),
          status=201)
@api_view(["GET", "POST"])
def groups_view(request):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "ManagementGroup", "Read", any_scope=True)
        rows = services.list_groups(p)
        return ok(rows, count=len(rows))
    rbac.check(p, "ManagementGroup", "Write")
    return ok(services.create_group(p, cid=cid_of(request), **payload(request, GROUP_CREATE)), status=201)


@contract("PUT", "Update a management group", body=GROUP_UPDATE, response=tool_output("update_management_group"))
@contract("GET", "One management group with its members", response=tool_output("get_management_group"))
@api_view(["GET", "PUT"])
def group_detail(request, group_id):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "ManagementGroup", "Read", any_scope=True)
        return ok(services.get_group(p, group_id))
    rbac.check(p, "ManagementGroup", "Write", any_scope=True)
    return ok(services.update_group(p, group_id, cid=cid_of(request), **payload(request, GROUP_UPDATE)))


@contract("POST", "Add an agent to a static group", body=GROUP_MEMBER,
          response=tool_output("add_management_group_member"), status=201)
@api_view(["POST"])
def group_members(request, group_id):
    p = principal_of(request)
    rbac.check(p, "ManagementGroup", "Write", any_scope=True)
    d = payload(request, GROUP_MEMBER)
    return ok(services.add_group_member(p, group_id, d["agent_id"], cid=cid_of(request)), status=201)


@contract("POST", "Assign a role on this group", body=GROUP_ROLE,
          response=tool_output("assign_management_group_role"), status=201)
@contract("GET", "Role assignments on this group", response=tool_output("list_management_group_roles"))
@api_view(["GET", "POST"])
def group_roles(request, group_id):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "ManagementGroup", "Read", any_scope=True)
        return ok(services.list_group_roles(p, group_id))
    rbac.check(p, "ManagementGroup", "Write", any_scope=True)
    d = payload(request, GROUP_ROLE)
    return ok(services.assign_group_role(p, group_id, d["username"], d["role"], cid=cid_of(request)), status=201)


# --- executions, bundles, tags, inventory, scope, quarantine (twins of the MCP tools) ----------


@contract("POST", "Dispatch plugin.action to agents (async)", body=EXECUTE, response=tool_output("execute_instruction"),
          status=202)
@contract("GET", "Recent executions", response=tool_output("list_executions"),
          query=[("definition_id", str, ""), ("status", str, "|".join(Execution.Status.values)),
                 ("limit", int, "1-500, default 50")])
@api_view(["GET", "POST"])
def executions_view(request):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "Execution", "Read", any_scope=True)
        q = request.query_params
        return ok(executions.list_executions(p, definition_id=q.get("definition_id"), status=q.get("status"),
                                             limit=int_param(request, "limit", 50, 1, 500)))
    rbac.check(p, "Execution", "Execute", any_scope=True, confined=True)
    return ok(executions.start_execution(p, cid=cid_of(request), **payload(request, EXECUTE)), status=202)


@contract("GET", "One execution with counts and progress", response=tool_output("get_execution_status"))
@api_view(["GET"])
def execution_detail(request, execution_id):
    rbac.check(principal_of(request), "Execution", "Read", any_scope=True)
    return ok(executions.execution_status(principal_of(request), execution_id))


@contract("POST", "Cancel: stop further dispatch (commands already sent keep running)")
@api_view(["POST"])
def execution_cancel(request, execution_id):
    p = principal_of(request)
    rbac.check(p, "Execution", "Execute", any_scope=True)
    return ok(executions.cancel_execution(p, execution_id, cid=cid_of(request)))


@contract("GET", "Agents' responses for one execution", response=tool_output("query_responses"),
          query=[("agent_id", str, ""), ("status", str, "|".join(s.name for s in Response.STATES)),
                 ("limit", int, "1-1000, default 100")])
@api_view(["GET"])
def execution_responses(request, execution_id):
    p = principal_of(request)
    rbac.check(p, "Response", "Read", any_scope=True)
    q = request.query_params
    return ok(executions.query_responses(p, execution_id=execution_id, agent_id=q.get("agent_id"),
                                         status=q.get("status"), limit=int_param(request, "limit", 100, 1, 1000)))


@contract("GET", "Count responses grouped by status, agent_id, exit_code or output",
          response=tool_output("aggregate_responses"), query=[("group_by", str, "status|agent_id|exit_code|output")])
@api_view(["GET"])
def execution_aggregate(request, execution_id):
    p = principal_of(request)
    rbac.check(p, "Response", "Read", any_scope=True)
    return ok(executions.aggregate_responses(p, execution_id=execution_id,
                                             group_by=request.query_params.get("group_by", "status")))


@contract("POST", "Run 1-32 steps on one agent", body=BUNDLE, response=tool_output("execute_bundle"), status=202)
@api_view(["POST"])
def bundles_view(request):
    p = principal_of(request)
    rbac.check(p, "Execution", "Execute", any_scope=True, confined=True)
    return ok(executions.start_bundle(p, cid=cid_of(request), **payload(request, BUNDLE)), status=202)


@contract("GET", "A bundle's collated result", response=tool_output("get_bundle_result"))
@api_view(["GET"])
def bundle_detail(request, bundle_id):
    p = principal_of(request)
    rbac.check(p, "Response", "Read", any_scope=True)
    return ok(executions.bundle_result(p, bundle_id))


@contract("POST", "Cancel a bundle: stop further dispatch of its steps (steps already sent keep running)")
@api_view(["POST"])
def bundle_cancel(request, bundle_id):
    p = principal_of(request)
    rbac.check(p, "Execution", "Execute", any_scope=True)
    return ok(executions.cancel_bundle(p, bundle_id, cid=cid_of(request)))


@contract("PUT", "Set a tag (pushed to the agent)", body=SET_TAG, response=tool_output("set_tag"))
@contract("GET", "Tags of one agent (?agent_id=) or agents with a tag (?key=&value=)",
          response={"oneOf": [tool_output("get_tags"), tool_output("search_agents_by_tag")]},
          query=[("agent_id", str, ""), ("key", str, ""), ("value", str, "")])
@api_view(["GET", "PUT"])
def tags_view(request):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "Tag", "Read", any_scope=True)
        q = request.query_params
        if q.get("agent_id"):
            return ok(services.get_tags(p, q["agent_id"]))
        return ok(services.search_agents_by_tag(p, q.get("key", ""), q.get("value")))
    rbac.check(p, "Tag", "Write", any_scope=True, confined=True)
    d = payload(request, SET_TAG)
    return ok(services.set_tag(p, d["agent_id"], d["key"], d["value"], cid=cid_of(request)))


@contract("DELETE", "Delete a tag", response=tool_output("delete_tag"))
@api_view(["DELETE"])
def tag_detail(request, agent_id, key):
    p = principal_of(request)
    rbac.check(p, "Tag", "Delete", any_scope=True, confined=True)
    return ok(services.delete_tag(p, agent_id, key, cid=cid_of(request)))


@contract("GET", "Inventory rows (?agent_id=&plugin=)", response=tool_output("query_inventory"),
          query=[("agent_id", str, ""), ("plugin", str, ""), ("limit", int, "1-1000, default 100")])
@api_view(["GET"])
def inventory_view(request):
    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    q = request.query_params
    return ok(inventory.query_inventory(p, agent_id=q.get("agent_id"), plugin=q.get("plugin"),
                                        limit=int_param(request, "limit", 100, 1, 1000)))


@contract("GET", "Inventory plugins and agent counts", response=tool_output("list_inventory_tables"))
@api_view(["GET"])
def inventory_tables(request):
    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    return ok(inventory.list_inventory_tables(p))


@contract("GET", "All inventory of one agent", response=tool_output("get_agent_inventory"))
@api_view(["GET"])
def agent_inventory_view(request, agent_id):
    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    return ok(inventory.agent_inventory(p, agent_id))


@contract("POST", "Validate a scope expression", body=SCOPE, response=tool_output("validate_scope"))
@api_view(["POST"])
def scope_validate(request):
    rbac.check(principal_of(request), "Infrastructure", "Read", any_scope=True)
    return ok(inventory.validate_scope(inventory.scope_argument(payload(request, SCOPE))))


PREVIEW = tool_input("preview_scope_targets")


@contract("POST", "Agents a scope expression matches", body=PREVIEW, response=tool_output("preview_scope_targets"))
@api_view(["POST"])
def scope_preview(request):
    p = principal_of(request)
    rbac.check(p, "Infrastructure", "Read", any_scope=True)
    d = payload(request, PREVIEW)
    return ok(inventory.preview_scope_targets(p, inventory.scope_argument(d), d.get("limit", 100)))


@contract("GET", "Discovery: plugins, instructions, the scope language or the REST routes")
@api_view(["GET"])
def discover_view(request, kind):
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
        return ok(orientation.routes())
    raise NotFound(f"unknown discovery kind: {kind}")


@contract("POST", "Quarantine a device", body=QUARANTINE, response=tool_output("quarantine_device"))
@api_view(["POST"])
def quarantine_view(request):
    p = principal_of(request)
    rbac.check(p, "Security", "Execute", any_scope=True, confined=True)
    d = payload(request, QUARANTINE)
    return ok(inventory.quarantine_device(p, d["agent_id"], reason=d.get("reason", ""), whitelist=d.get("whitelist", ""),
                                          cid=cid_of(request)))
