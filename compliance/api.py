"""REST views of compliance (docs/compliance.md): thin wrappers over compliance.services, the same functions the
MCP tools call. A document is sent as a raw YAML body (Content-Type: application/yaml) or as JSON
{"yaml_source": "..."}; create answers 201 {id, status: created}."""

import codecs

from django.http import HttpResponse
from rest_framework.decorators import api_view, parser_classes
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from mcp.schema import array, boolean, enum, integer, obj, string
from yuzu import rbac
from yuzu.api.contract import contract, payload, tool_output
from yuzu.api.envelope import cid_of, ok
from yuzu.api.parsers import StrictJSONParser
from yuzu.api.views import int_param, principal_of

from . import guardian, services
from .documents import MAX_DOCUMENT_BYTES
from .models import GuardRule

DOCUMENT = obj({"yaml_source": string(MAX_DOCUMENT_BYTES, "The YAML document (apiVersion yuzu.io/v1alpha1)",
                                      minLength=1)}, ["yaml_source"])
CREATED = obj({"id": string(36), "status": enum(["created"])}, ["id", "status"])
ANY = {"type": "object", "additionalProperties": True}
REMEDIATE = obj({"agent_ids": array(string(128, minLength=1), max_items=10000, min_items=1)})
RULE_PROPS = {"name": string(128, minLength=1, pattern="^[A-Za-z0-9][A-Za-z0-9 ._-]{0,127}$"),
              "spec": obj({"spark": {"type": "object"}, "assertion": {"type": "object"},
                           "remediation": {"type": "object"}}, ["spark", "assertion", "remediation"]),
              "enabled": boolean(),
              "enforcement_mode": enum(GuardRule.Enforcement.values), "severity": enum(GuardRule.Severity.values),
              "os_target": enum(GuardRule.OsTarget.values), "scope_expr": string(8192),
              "prerequisites": array(string(256), max_items=32)}
RULE_CREATE = obj(RULE_PROPS, ["name", "spec"])
RULE_UPDATE = obj(RULE_PROPS, minProperties=1)
PUSH = obj({"scope": string(8192, "Scope expression; empty or absent: every connected agent"),
            "full_sync": boolean()})
STATUS = obj({"total_rules": integer(0), "compliant_rules": integer(0), "drifted_rules": integer(0),
              "errored_rules": integer(0)}, ["total_rules"], additional=True)


class YamlParser(BaseParser):
    """A raw YAML document as the request's data (text; compliance.documents parses it)."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read(MAX_DOCUMENT_BYTES + 1) if stream is not None else b""
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise ParseError(f"the document exceeds {MAX_DOCUMENT_BYTES} bytes")
        try:
            return codecs.decode(raw, "utf-8")
        except UnicodeDecodeError:
            raise ParseError("the YAML body is not UTF-8") from None


class TextYamlParser(YamlParser):
    media_type = "text/yaml"


def _document(request):
    """The YAML text of a create request (raw YAML, or the JSON body checked against DOCUMENT)."""
    if isinstance(request.data, str):
        return request.data
    if isinstance(request.data, dict) and isinstance(request.data.get("yaml_source"), str):
        services.yaml_of(request.data)  # an oversized document: a short message, not the schema's echo of it
    return payload(request, DOCUMENT)["yaml_source"]


# --- fragments and policies ------------------------------------------------------------------------

@contract("GET", "List policy fragments", response=ANY)
@contract("POST", "Create a policy fragment from its YAML", body=DOCUMENT, response=CREATED, status=201,
          description="The body is JSON {yaml_source} or a raw YAML document (Content-Type: application/yaml).")
@api_view(["GET", "POST"])
@parser_classes([StrictJSONParser, YamlParser, TextYamlParser])
def fragments_view(request):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "Policy", "Read")
        return ok(services.list_fragments())
    rbac.check(p, "Policy", "Write")
    return ok(services.create_fragment(p, _document(request), cid=cid_of(request)), status=201)


@contract("DELETE", "Delete a policy fragment (409 while a policy uses it)")
@api_view(["DELETE"])
def fragment_detail(request, fragment_id):
    p = principal_of(request)
    rbac.check(p, "Policy", "Delete")
    return ok(services.delete_fragment(p, fragment_id, cid=cid_of(request)))


@contract("GET", "List policies", response=tool_output("list_policies"),
          query=[("name", str, "name contains"), ("fragment_id", str, ""),
                 ("enabled_only", bool, "true: enabled policies only"), ("limit", int, "1-100, default 100")])
@contract("POST", "Create a policy from its YAML", body=DOCUMENT, response=CREATED, status=201,
          description="The body is JSON {yaml_source} or a raw YAML document (Content-Type: application/yaml).")
@api_view(["GET", "POST"])
@parser_classes([StrictJSONParser, YamlParser, TextYamlParser])
def policies_view(request):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "Policy", "Read")
        q = request.query_params
        enabled = {"true": True, "1": True, "false": False, "0": False}.get((q.get("enabled_only") or "").lower())
        return ok(services.list_policies(enabled=True if enabled else None, name=q.get("name"),
                                         fragment_id=q.get("fragment_id"),
                                         limit=int_param(request, "limit", 100, 1, 100)))
    rbac.check(p, "Policy", "Write")
    return ok(services.create_policy(p, _document(request), cid=cid_of(request)), status=201)


@contract("GET", "One policy with its triggers, inputs, summary and remediation_available", response=ANY)
@contract("DELETE", "Delete a policy and its verdicts")
@api_view(["GET", "DELETE"])
def policy_detail(request, policy_id):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "Policy", "Read")
        return ok(services.get_policy(policy_id))
    rbac.check(p, "Policy", "Delete")
    return ok(services.delete_policy(p, policy_id, cid=cid_of(request)))


@contract("POST", "Enable a policy")
@api_view(["POST"])
def policy_enable(request, policy_id):
    p = principal_of(request)
    rbac.check(p, "Policy", "Write")
    return ok(services.set_enabled(p, policy_id, True, cid=cid_of(request)))


@contract("POST", "Disable a policy (no more scheduled evaluation)")
@api_view(["POST"])
def policy_disable(request, policy_id):
    p = principal_of(request)
    rbac.check(p, "Policy", "Write")
    return ok(services.set_enabled(p, policy_id, False, cid=cid_of(request)))


@contract("POST", "Evaluate a policy now (202 {execution_id}; 409 when no target is reachable)", status=202,
          response=obj({"execution_id": string(32), "agents": integer(0)}, ["execution_id"]))
@api_view(["POST"])
def policy_evaluate(request, policy_id):
    p = principal_of(request)
    rbac.check(p, "Policy", "Execute")
    return ok(services.evaluate_policy(p, policy_id, cid=cid_of(request)), status=202)


@contract("POST", "Remediate: run the fix on non-compliant agents, then verify", body=REMEDIATE,
          response=obj({"execution_id": string(32), "agent_ids": array(string(128))}, ["execution_id"]),
          description="Only on request, never automatic. agent_ids (optional) is intersected with the policy's "
                      "non-compliant targets. 409 when the fragment has no fix, a fix is in flight, or every "
                      "target has reached the retry cap (3).")
@api_view(["POST"])
def policy_remediate(request, policy_id):
    p = principal_of(request)
    rbac.check(p, "Policy", "Execute")
    body = payload(request, REMEDIATE)
    return ok(services.remediate_policy(p, policy_id, body.get("agent_ids"), cid=cid_of(request)))


@contract("POST", "Reset a policy's verdicts to unknown (re-checked at the next tick)")
@api_view(["POST"])
def policy_invalidate(request, policy_id):
    p = principal_of(request)
    rbac.check(p, "Policy", "Write")
    return ok(services.invalidate(p, policy_id, cid=cid_of(request)))


@contract("POST", "Reset every policy's verdicts to unknown")
@api_view(["POST"])
def policies_invalidate_all(request):
    p = principal_of(request)
    rbac.check(p, "Policy", "Write")
    return ok(services.invalidate(p, cid=cid_of(request)))


@contract("GET", "Fleet-wide compliance (the same object as get_fleet_compliance)",
          response=tool_output("get_fleet_compliance"))
@api_view(["GET"])
def compliance_view(request):
    rbac.check(principal_of(request), "Policy", "Read")
    return ok(services.fleet_compliance())


@contract("GET", "One policy's per-agent verdicts", response=ANY, query=[("limit", int, "1-10000, default 1000")])
@api_view(["GET"])
def compliance_detail(request, policy_id):
    rbac.check(principal_of(request), "Policy", "Read")
    return ok(services.policy_statuses(policy_id, limit=int_param(request, "limit", 1000, 1, 10000)))


@contract("GET", "One policy's verdict counts (the same object as get_compliance_summary)",
          response=tool_output("get_compliance_summary"))
@api_view(["GET"])
def compliance_summary(request, policy_id):
    rbac.check(principal_of(request), "Policy", "Read")
    return ok(services.compliance_summary(policy_id))


# --- Guardian ------------------------------------------------------------------------------------

@contract("GET", "List guard rules", response=ANY)
@contract("POST", "Create a guard rule", body=RULE_CREATE, response=ANY, status=201)
@api_view(["GET", "POST"])
def rules_view(request):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "GuaranteedState", "Read")
        return ok(services.list_rules())
    rbac.check(p, "GuaranteedState", "Write")
    return ok(services.create_rule(p, payload(request, RULE_CREATE), cid=cid_of(request)), status=201)


@contract("GET", "One guard rule", response=ANY)
@contract("PUT", "Change a guard rule (its version goes up by one)", body=RULE_UPDATE, response=ANY)
@contract("DELETE", "Delete a guard rule")
@api_view(["GET", "PUT", "DELETE"])
def rule_detail(request, rule_id):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "GuaranteedState", "Read")
        return ok(services.get_rule(rule_id))
    if request.method == "PUT":
        rbac.check(p, "GuaranteedState", "Write")
        return ok(services.update_rule(p, rule_id, payload(request, RULE_UPDATE), cid=cid_of(request)))
    rbac.check(p, "GuaranteedState", "Delete")
    return ok(services.delete_rule(p, rule_id, cid=cid_of(request)))


@contract("POST", "Push the enabled rule set to the agents in scope (202)", body=PUSH, response=ANY, status=202)
@api_view(["POST"])
def rules_push(request):
    p = principal_of(request)
    rbac.check(p, "GuaranteedState", "Push")
    body = payload(request, PUSH)
    return ok(services.push(p, body.get("scope") or "", body.get("full_sync", True), cid=cid_of(request)),
              status=202)


@contract("GET", "Guardian events, newest first", response=ANY,
          query=[("rule_id", str, ""), ("agent_id", str, "audited as dex.device.view"),
                 ("severity", str, "|".join(GuardRule.Severity.values)), ("limit", int, "1-1000, default 100")])
@api_view(["GET"])
def events_view(request):
    p = principal_of(request)
    rbac.check(p, "GuaranteedState", "Read")
    q = request.query_params
    return ok(services.list_events(rule_id=q.get("rule_id"), agent_id=q.get("agent_id"), severity=q.get("severity"),
                                   limit=int_param(request, "limit", 100, 1, 1000), principal=p,
                                   cid=cid_of(request)))


@contract("GET", "Guard states across the fleet", response=STATUS)
@api_view(["GET"])
def status_view(request):
    rbac.check(principal_of(request), "GuaranteedState", "Read")
    return ok(services.guard_status())


@contract("GET", "Guard states on one agent", response=STATUS)
@api_view(["GET"])
def agent_status_view(request, agent_id):
    rbac.check(principal_of(request), "GuaranteedState", "Read")
    return ok(services.guard_status(agent_id))


@contract("GET", "The Guardian guard-authoring catalogue (with an ETag)", response=tool_output("get_guardian_schemas"))
@api_view(["GET"])
def schemas_view(request):
    rbac.check(principal_of(request), "GuaranteedState", "Read")
    text, etag = guardian.catalogue_text()
    if request.headers.get("If-None-Match") == etag:
        return HttpResponse(status=304, headers={"ETag": etag})
    return HttpResponse(text, content_type="application/json", headers={"ETag": etag})
