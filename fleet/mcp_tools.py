"""Fleet MCP tools: agents, tags, management groups and the orientation reads. Each is a thin
handler over the same fleet.services function its REST twin uses."""

from mcp.registry import tool
from mcp.schema import APPROVAL_ID, array, boolean, enum, integer, nullable, obj, string

from . import orientation, services

AGENT = obj({
    "agent_id": string(128), "hostname": string(255), "os": string(64), "arch": string(32),
    "agent_version": string(32), "connected": boolean(), "last_seen": nullable(string(64)), "quarantined": boolean(),
}, additional=True)
AGENT_ID = string(128, "The agent_id, as list_agents returns it", minLength=1)
GROUP = obj({"id": string(32), "name": string(128), "description": string(1024), "parent_id": nullable(string(32)),
             "membership_type": enum(["static", "dynamic"]), "scope_expression": nullable(string(8192))},
            additional=True)
GROUP_ID = string(128, "Group id (32 hex) or exact name", minLength=1)


@tool(name="list_agents", title="List agents", securable="Infrastructure", operation="Read",
      description="Lists the agents (endpoints) the caller may see: agent_id, hostname, os, arch, agent_version, "
                  "connected, last_seen. An empty list means no agent is enrolled or none is visible to you — "
                  "not that the fleet is healthy.",
      input_schema=obj({"connected": boolean("Only connected (true) or disconnected (false) agents"),
                        "limit": integer(1, 1000, "At most this many rows (default 1000)")}),
      output_schema=obj({"agents": array(AGENT), "count": integer(0)}, ["agents", "count"]))
def list_agents(ctx, args):
    rows = services.list_agents(ctx.principal, connected=args.get("connected"), limit=args.get("limit", 1000))
    return {"agents": rows, "count": len(rows)}


@tool(name="get_agent_details", title="Agent details", securable="Infrastructure", operation="Read",
      rbac_agent_arg="agent_id",
      description="One agent with its self-reported attributes, tags and management groups. An unknown or "
                  "invisible agent_id is an error (-32602 'Agent not found'), never an empty result.",
      input_schema=obj({"agent_id": AGENT_ID}, ["agent_id"]),
      output_schema=obj({"agent_id": string(128), "attributes": {"type": "object"}, "tags": {"type": "object"},
                         "groups": array(string(128))}, ["agent_id", "tags"], additional=True))
def get_agent_details(ctx, args):
    return services.agent_details(ctx.principal, args["agent_id"])


@tool(name="get_tags", title="Agent tags", securable="Tag", operation="Read", rbac_agent_arg="agent_id",
      description="The tags (key=value) of one agent. An empty list means the agent has no tags.",
      input_schema=obj({"agent_id": AGENT_ID}, ["agent_id"]),
      output_schema=obj({"agent_id": string(128), "tags": array(obj({"key": string(64), "value": string(256)}))},
                        ["agent_id", "tags"]))
def get_tags(ctx, args):
    return services.get_tags(ctx.principal, args["agent_id"])


@tool(name="search_agents_by_tag", title="Find agents by tag", securable="Tag", operation="Read",
      description="agent_ids carrying tag `key` (and `value`, if given). An empty list means no visible agent has "
                  "that tag.",
      input_schema=obj({"key": string(64, "Tag key", minLength=1), "value": string(256, "Exact tag value")}, ["key"]),
      output_schema=obj({"key": string(64), "value": nullable(string(256)), "agent_ids": array(string(128))},
                        ["key", "agent_ids"]))
def search_agents_by_tag(ctx, args):
    return services.search_agents_by_tag(ctx.principal, args["key"], args.get("value"))


@tool(name="set_tag", title="Set a tag", securable="Tag", operation="Write", effect="destructive", idempotent=True,
      service_scope="confined", rbac_agent_arg="agent_id",
      description="Sets tag key=value on one agent and pushes the tags to it. Category keys (role, environment, "
                  "location, service) are lower-cased and validated.",
      input_schema=obj({"agent_id": AGENT_ID, "key": string(64, minLength=1), "value": string(256)},
                       ["agent_id", "key", "value"]),
      output_schema=obj({"agent_id": string(128), "key": string(64), "value": string(256)}, ["agent_id", "key"]))
def set_tag(ctx, args):
    return services.set_tag(ctx.principal, args["agent_id"], args["key"], args["value"], cid=ctx.cid)


@tool(name="delete_tag", title="Delete a tag", securable="Tag", operation="Delete", effect="destructive",
      idempotent=True, service_scope="confined", rbac_agent_arg="agent_id",
      description="Deletes tag `key` from one agent. Approval-gated for MCP tokens (operator and supervised): the "
                  "first call answers -32006 with an approval_id. deleted:false means the tag did not exist.",
      input_schema=obj({"agent_id": AGENT_ID, "key": string(64, minLength=1), "approval_id": APPROVAL_ID},
                       ["agent_id", "key"]),
      output_schema=obj({"agent_id": string(128), "key": string(64), "deleted": boolean()}, ["deleted"]))
def delete_tag(ctx, args):
    return services.delete_tag(ctx.principal, args["agent_id"], args["key"], cid=ctx.cid)


@tool(name="list_management_groups", title="List management groups", securable="ManagementGroup", operation="Read",
      description="All management groups {id, name, description, parent_id, membership_type, scope_expression}. "
                  "An empty list means no group has been created yet.",
      input_schema=obj(),
      output_schema=obj({"groups": array(GROUP), "count": integer(0)}, ["groups", "count"]))
def list_management_groups(ctx, args):
    rows = services.list_groups(ctx.principal)
    return {"groups": rows, "count": len(rows)}


@tool(name="get_management_group", title="Management group", securable="ManagementGroup", operation="Read",
      description="One management group with its member agent_ids (for a dynamic group, the agents its scope "
                  "expression matches now). Unknown group → -32602.",
      input_schema=obj({"group_id": GROUP_ID}, ["group_id"]),
      output_schema=obj({"id": string(32), "name": string(128), "members": array(string(128))},
                        ["id", "name", "members"], additional=True))
def get_management_group(ctx, args):
    return services.get_group(ctx.principal, args["group_id"])


@tool(name="list_management_group_roles", title="Group role assignments", securable="ManagementGroup",
      operation="Read",
      description="Who holds which role on one group. Needs ManagementGroup:Read plus a fleet-wide grant or "
                  "ITServiceOwner on that group. An empty list means nobody holds a role on it.",
      input_schema=obj({"group_id": GROUP_ID}, ["group_id"]),
      output_schema=obj({"group_id": string(32), "roles": array(obj({"username": string(150), "role": string(64)}))},
                        ["group_id", "roles"]))
def list_management_group_roles(ctx, args):
    return services.list_group_roles(ctx.principal, args["group_id"])


GROUP_FIELDS = {
    "description": string(1024), "parent_id": string(128), "membership_type": enum(["static", "dynamic"]),
    "scope_expression": string(8192, "Scope expression for a dynamic group"),
}


@tool(name="create_management_group", title="Create a management group", securable="ManagementGroup",
      operation="Write", effect="additive", idempotent=False,
      description="Creates a management group (static, or dynamic by scope expression). Approval-gated on the "
                  "supervised tier.",
      input_schema=obj({"name": string(128, minLength=1), **GROUP_FIELDS, "approval_id": APPROVAL_ID}, ["name"]),
      output_schema=GROUP)
def create_management_group(ctx, args):
    return services.create_group(ctx.principal, cid=ctx.cid, **args)


@tool(name="update_management_group", title="Update a management group", securable="ManagementGroup",
      operation="Write", effect="destructive", idempotent=True,
      description="Changes a group's name, description, parent, membership type or scope expression. "
                  "Approval-gated on the supervised tier.",
      input_schema=obj({"group_id": GROUP_ID, "name": string(128, minLength=1), **GROUP_FIELDS,
                        "approval_id": APPROVAL_ID}, ["group_id"]),
      output_schema=GROUP)
def update_management_group(ctx, args):
    args = dict(args)
    return services.update_group(ctx.principal, args.pop("group_id"), cid=ctx.cid, **args)


@tool(name="add_management_group_member", title="Add a group member", securable="ManagementGroup",
      operation="Write", effect="additive", idempotent=True,
      description="Adds an agent to a static group. Approval-gated on the supervised tier.",
      input_schema=obj({"group_id": GROUP_ID, "agent_id": AGENT_ID, "approval_id": APPROVAL_ID},
                       ["group_id", "agent_id"]),
      output_schema=obj({"group_id": string(32), "agent_id": string(128), "added": boolean()}, ["added"]))
def add_management_group_member(ctx, args):
    return services.add_group_member(ctx.principal, args["group_id"], args["agent_id"], cid=ctx.cid)


@tool(name="assign_management_group_role", title="Assign a role on a group", securable="ManagementGroup",
      operation="Write", effect="additive", idempotent=True,
      description="Grants a user a role on one group (e.g. ITServiceOwner). Needs a fleet-wide grant or "
                  "ITServiceOwner on the group. Approval-gated on the supervised tier.",
      input_schema=obj({"group_id": GROUP_ID, "username": string(150, minLength=1), "role": string(64, minLength=1),
                        "approval_id": APPROVAL_ID}, ["group_id", "username", "role"]),
      output_schema=obj({"group_id": string(32), "username": string(150), "role": string(64), "assigned": boolean()},
                        ["assigned"]))
def assign_management_group_role(ctx, args):
    return services.assign_group_role(ctx.principal, args["group_id"], args["username"], args["role"], cid=ctx.cid)


# --- orientation reads ----------------------------------------------------------------------

@tool(name="get_fleet_posture_fast", title="Fleet posture (cached)", securable="Infrastructure", operation="Read",
      description="A cached snapshot: agent counts, connected ratio, OS mix, quarantined count, and recommended "
                  "next tools. data_age_seconds says how old it is; partial:true with missing_sources means some "
                  "inputs were unavailable. Zero agents means nothing is enrolled.",
      input_schema=obj({"ttl_seconds": integer(5, 300, "Accept a cached snapshot at most this old (default 30)")}),
      output_schema=orientation.POSTURE_SCHEMA)
def get_fleet_posture_fast(ctx, args):
    return orientation.fleet_posture(ctx.principal, ttl_seconds=args.get("ttl_seconds", 30))


@tool(name="classify_operational_question", title="Classify a question", securable="Infrastructure",
      operation="Read",
      description="Advisory keyword classifier: is the question answerable_now from stored data, "
                  "answerable_with_live_dispatch, requires_external_connector, unsafe_without_approval, or "
                  "outside_yuzu_scope? Returns suggested first tools. It never runs anything.",
      input_schema=obj({"question": string(2048, minLength=1)}, ["question"]),
      output_schema=orientation.CLASSIFY_SCHEMA)
def classify_operational_question(ctx, args):
    return orientation.classify(args["question"])


@tool(name="get_incident_playbook", title="Incident playbook", securable="Infrastructure", operation="Read",
      description="An exact-match playbook for a named scenario (steps, safety notes, first tool). found:false "
                  "lists the known scenarios.",
      input_schema=obj({"scenario": string(2048, minLength=1)}, ["scenario"]),
      output_schema=orientation.PLAYBOOK_SCHEMA)
def get_incident_playbook(ctx, args):
    return orientation.playbook(args["scenario"])


@tool(name="summarize_working_set", title="Summarize a working set", securable="Infrastructure", operation="Read",
      description="A bounded narrative of the fleet, one agent, or one execution, with resource links to read "
                  "next. kind=execution also needs Execution:Read.",
      input_schema=obj({"kind": enum(["fleet", "agent", "execution"]), "id": string(128),
                        "limit": integer(1, 100, "At most this many items (default 25)")}, ["kind"]),
      output_schema=orientation.SUMMARY_SCHEMA)
def summarize_working_set(ctx, args):
    return orientation.summarize(ctx.principal, args["kind"], args.get("id"), args.get("limit", 25))


@tool(name="discover_routes", title="Discover REST routes", securable="Infrastructure", operation="Read",
      description="The REST API route catalogue (method, path, summary) from the OpenAPI document. Use it to find "
                  "the REST twin of a tool.",
      input_schema=obj(),
      output_schema=obj({"routes": array(obj({"method": string(8), "path": string(256), "summary": string(512)},
                                             additional=True)), "count": integer(0)}, ["routes", "count"]))
def discover_routes(ctx, args):
    return orientation.routes()
