"""Compliance MCP tools, resources and prompt: reads over the policy engine's verdicts and Guardian's
authoring catalogue. Each is a thin handler over the compliance.services function its REST twin calls."""

import json

from mcp.jsonrpc import INTERNAL_ERROR, RpcError
from mcp.registry import prompt, resource, tool
from mcp.schema import array, boolean, integer, obj, string
from yuzu.errors import StoreFault

from . import guardian, services

POLICY = obj({"id": string(36), "name": string(128), "description": string(1024), "enabled": boolean(),
              "scope_expression": string(8192)}, ["id", "name", "enabled"], additional=True)
COUNTS = {"compliant": integer(0), "non_compliant": integer(0), "unknown": integer(0), "fixing": integer(0),
          "error": integer(0)}
SUMMARY = obj({"policy_id": string(36), **COUNTS, "total": integer(0)},
              ["policy_id", "compliant", "non_compliant", "unknown", "fixing", "error", "total"])
FLEET = obj({"total_checks": integer(0), **COUNTS, "compliance_pct": {"type": "number", "minimum": 0,
                                                                      "maximum": 100}},
            ["total_checks", "compliant", "non_compliant", "unknown", "compliance_pct"])
SCHEMAS = obj({"version": integer(1), "description": string(1024),
               "schemas": obj({"spark": {"type": "object"}, "assertion": {"type": "object"},
                               "remediation": {"type": "object"}}, ["spark", "assertion", "remediation"])},
              ["version", "schemas"])


@tool(name="list_policies", title="List compliance policies", securable="Policy", operation="Read",
      description="List the compliance policies defined on the server, optionally only the enabled ones "
                  "(enabled:true) or only the disabled ones (enabled:false): id, name, description, enabled, "
                  "scope_expression, sorted by name, at most 100. An empty list means no policy is defined (or "
                  "none matches the filter) — not that the fleet is compliant. Verdicts: get_compliance_summary "
                  "(one policy) or get_fleet_compliance (all).",
      input_schema=obj({"enabled": boolean("true: enabled policies only; false: disabled only; omit for all")}),
      output_schema=obj({"policies": array(POLICY, max_items=100), "count": integer(0)}, ["policies", "count"]))
def list_policies(ctx, args):
    return services.list_policies(enabled=args.get("enabled"))


@tool(name="get_compliance_summary", title="Compliance summary of a policy", securable="Policy", operation="Read",
      description="Break down one policy's per-agent verdicts into compliant / non-compliant / unknown / fixing / "
                  "error counts (current stored verdicts, however old). total:0 means the policy has not been "
                  "evaluated on any agent yet (none targeted or none answered) — not that it passes. An unknown "
                  "policy_id is an error (-32602 'policy not found'); list_policies gives the ids.",
      input_schema=obj({"policy_id": string(36, "The policy's id, as list_policies returns it", minLength=1)},
                       ["policy_id"]),
      output_schema=SUMMARY)
def get_compliance_summary(ctx, args):
    ctx.note(f"policy_id={args['policy_id']}")
    return services.compliance_summary(args["policy_id"])


@tool(name="get_fleet_compliance", title="Fleet compliance", securable="Policy", operation="Read",
      description="Fleet-wide compliance across every policy: total checks (one per policy × agent evaluated), "
                  "status counts and compliance percentage (compliant / total_checks × 100). A verdict older than "
                  "24 h counts as unknown. total_checks:0 with compliance_pct:0 means nothing has been evaluated "
                  "yet (no policy, or no agent answered) — not a failing fleet. Cached for up to 60 s.",
      input_schema=obj(), output_schema=FLEET)
def get_fleet_compliance(ctx, args):
    return services.fleet_compliance()


@tool(name="get_guardian_schemas", title="Guardian authoring schemas", securable="GuaranteedState",
      operation="Read",
      description="Return the Guardian guard-authoring catalogue (trigger, assertion and remediation types with "
                  "their JSON Schemas): schemas.spark, schemas.assertion and schemas.remediation, each keyed by "
                  "type. Never empty; it describes what a guard rule may contain, not which rules exist.",
      input_schema=obj(), output_schema=SCHEMAS)
def get_guardian_schemas(ctx, args):
    return json.loads(guardian.catalogue_text()[0])


@resource(uri="yuzu://compliance/fleet", name="Fleet compliance", securable="Policy",
          description="The same object as get_fleet_compliance: total_checks, status counts, compliance_pct.")
def fleet_resource(ctx):
    try:
        return services.fleet_compliance()
    except StoreFault as exc:  # -32603 (project decision), not upstream's -32602 "unknown URI"
        raise RpcError(INTERNAL_ERROR, exc.message, {"retry_after_ms": exc.retry_after_ms}) from None


@resource(uri="yuzu://guardian/schemas", name="Guardian authoring schemas", securable="GuaranteedState",
          description="The Guardian guard-authoring catalogue, byte-identical to GET "
                      "/api/v1/guaranteed-state/schemas.")
def guardian_resource(ctx):
    return guardian.catalogue_text()[0]


@prompt(name="compliance_report", description="A compliance report: fleet-wide, or for one policy.",
        arguments=[{"name": "policy_id", "description": "Report on this policy only (its id from list_policies)",
                    "required": False}])
def compliance_report(values):
    policy_id = values.get("policy_id")
    if policy_id:
        return ("Write a compliance report for one policy.\n"
                f"{policy_id}\n"
                "Call get_compliance_summary with that policy_id. Report the compliant, non-compliant, unknown, "
                "fixing and error counts and what share of the evaluated agents is compliant. If total is 0, say "
                "that the policy has not been evaluated yet rather than calling it compliant. Say which next "
                "step would help (evaluating it again, or remediation by an operator for non-compliant agents).")
    return ("Write a fleet-wide compliance report.\n"
            "1. Call get_fleet_compliance: report total_checks, the status counts and compliance_pct. If "
            "total_checks is 0, say nothing has been evaluated yet (that is not a compliant fleet).\n"
            "2. Call list_policies, then get_compliance_summary for each policy, and give a per-policy breakdown, "
            "worst first (most non-compliant and error verdicts).\n"
            "3. End with the policies that need attention and why.")


