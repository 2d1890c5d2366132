"""The authorization matrix, generated from the registry and the URL resolver (issue 10, "the adversarial
suite"): every MCP tool of both catalogues × tier × role (global, and held on one management group) ×
target (in the caller's group, in another group, nonexistent), and every REST route × role, each compared
with the ONE rule table in tests/support/authz.py; then every tool and route again for a few service-scoped
callers (SERVICE_PAIRS), whose device targets add another service's device in the caller's own group. A tool or
route with no row fails the suite, so nothing new is left out; a mismatch prints a table of what was expected and
what was answered.

The MCP cells call ``mcp.server.handle`` — what the HTTP transport calls — with a real token and session,
each inside a transaction rolled back afterwards (so every cell sees the same world, and a write cell
leaves nothing behind); ``test_matrix_sample_through_http`` checks that the HTTP face answers the same."""

import json
import os
import re
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from mcp import modern
from mcp.registry import catalogue
from mcp.server import Continuation, Request, handle
from tests.support.authz import (
    ALLOW,
    APPROVAL,
    CALLERS,
    GHOST,
    HIDDEN,
    IN,
    OUT,
    RBAC,
    SCOPE,
    SERVICE_PAIRS,
    SVC,
    TIER,
    TIERS,
    Caller,
    Rule,
    _headers,
    build_world,
    csr_pem,
    expected,
    fleet_wide,
    fleet_wide_or_owner,
    fragment_yaml,
    open_session,
    policy_yaml,
    targets,
)
from tests.support.mcp_http import McpClient
from yuzu.models import RoleAssignment

pytestmark = pytest.mark.django_db


# --- the MCP tools: one row per tool (variants where a tool takes several kinds of target) ------------

class V:
    """One way of calling a tool: its rule (pair as the table states it) and its arguments per target."""

    def __init__(self, securable, operation, args, target=None, label="", **rule):
        self.rule = Rule(securable, operation, target=target, **rule)
        self.args = args
        self.label = label

    def targets(self, caller):
        return targets(self.rule, caller)


def agent(w, t):
    return w.agents[t]


def group(w, t):
    return w.groups[t]


ISO_TOMORROW = lambda: (timezone.now() + timedelta(days=1)).isoformat()  # noqa: E731
OWN = lambda w, t, c, tok: tok.pk if t == IN else (w.other_token if t == OUT else "0" * 24)  # noqa: E731
MG_WRITE_FLEET_WIDE = fleet_wide("ManagementGroup", "Write")
SEC_WRITE_FLEET_WIDE = fleet_wide("Security", "Write")
CODE_SIGNING_ARGS = {"csr_pem": csr_pem(), "signer_name": "matrix", "justification": "the matrix"}

V1 = {
    # agents, tags
    "list_agents": [V("Infrastructure", "Read", lambda w, t, c, tok: {})],
    "get_agent_details": [V("Infrastructure", "Read", lambda w, t, c, tok: {"agent_id": agent(w, t)}, "agent")],
    "get_tags": [V("Tag", "Read", lambda w, t, c, tok: {"agent_id": agent(w, t)}, "agent")],
    "search_agents_by_tag": [V("Tag", "Read", lambda w, t, c, tok: {"key": "owner"})],
    # the "confined" class (docs/tokens-and-rbac.md, scope_service): a service-scoped token is let in, and kept to
    # its service's devices
    "set_tag": [V("Tag", "Write", lambda w, t, c, tok: {"agent_id": agent(w, t), "key": "owner", "value": "x"}, "agent",
                  service="confined")],
    "delete_tag": [V("Tag", "Delete", lambda w, t, c, tok: {"agent_id": agent(w, t), "key": "owner"}, "agent",
                     service="confined")],
    # management groups
    "list_management_groups": [V("ManagementGroup", "Read", lambda w, t, c, tok: {})],
    "get_management_group": [V("ManagementGroup", "Read", lambda w, t, c, tok: {"group_id": group(w, t)}, "group")],
    "list_management_group_roles": [V("ManagementGroup", "Read", lambda w, t, c, tok: {"group_id": group(w, t)},
                                      "group", compound=fleet_wide_or_owner("Read"))],
    "create_management_group": [V("ManagementGroup", "Write", lambda w, t, c, tok: {"name": "new-group"},
                                  compound=MG_WRITE_FLEET_WIDE)],
    "update_management_group": [V("ManagementGroup", "Write", lambda w, t, c, tok: {"group_id": group(w, t),
                                                                                      "description": "changed"},
                                  "group", compound=MG_WRITE_FLEET_WIDE)],
    "add_management_group_member": [V("ManagementGroup", "Write",
                                      lambda w, t, c, tok: {"group_id": group(w, t), "agent_id": agent(w, IN)},
                                      "group", compound=MG_WRITE_FLEET_WIDE)],
    "assign_management_group_role": [V("ManagementGroup", "Write", lambda w, t, c, tok: {
        "group_id": group(w, t), "username": "zed", "role": "ITServiceOwner"}, "group", compound=fleet_wide_or_owner("Write"))],
    # orientation
    "get_fleet_posture_fast": [V("Infrastructure", "Read", lambda w, t, c, tok: {})],
    "classify_operational_question": [V("Infrastructure", "Read", lambda w, t, c, tok: {"question": "is disk full?"})],
    "get_incident_playbook": [V("Infrastructure", "Read", lambda w, t, c, tok: {"scenario": "disk full"})],
    "summarize_working_set": [
        V("Infrastructure", "Read", lambda w, t, c, tok: {"kind": "fleet"}, label="fleet"),
        V("Infrastructure", "Read", lambda w, t, c, tok: {"kind": "agent", "id": agent(w, t)}, "agent", "agent"),
        V("Infrastructure", "Read", lambda w, t, c, tok: {"kind": "execution", "id": w.executions[t]}, "execution",
          "execution", reach=("Execution", "Read"), also=(("Execution", "Read"),)),
    ],
    "discover_routes": [V("Infrastructure", "Read", lambda w, t, c, tok: {})],
    # executions
    "execute_instruction": [
        V("Execution", "Execute", lambda w, t, c, tok: {"plugin": "os", "action": "info", "agent_ids": [agent(w, t)]},
          "agent", "agent_ids", service="confined"),
        V("Execution", "Execute", lambda w, t, c, tok: {"plugin": "os", "action": "info"}, label="all",
          service="confined"),
    ],
    "get_execution_status": [V("Execution", "Read", lambda w, t, c, tok: {"execution_id": w.executions[t]},
                               "execution")],
    "list_executions": [V("Execution", "Read", lambda w, t, c, tok: {})],
    "query_responses": [V("Response", "Read", lambda w, t, c, tok: {"execution_id": w.executions[t]}, "execution")],
    "aggregate_responses": [V("Response", "Read", lambda w, t, c, tok: {"execution_id": w.executions[t],
                                                                         "group_by": "status"}, "execution")],
    "execute_bundle": [V("Execution", "Execute", lambda w, t, c, tok: {
        "agent_id": agent(w, t), "steps": [{"plugin": "os", "action": "info"}]}, "agent", service="confined")],
    "get_bundle_result": [V("Response", "Read", lambda w, t, c, tok: {"bundle_id": w.bundles[t]}, "dispatched",
                            reach=("Execution", "Read"))],
    # inventory, definitions, scope, quarantine
    "query_inventory": [V("Infrastructure", "Read", lambda w, t, c, tok: {})],
    "list_inventory_tables": [V("Infrastructure", "Read", lambda w, t, c, tok: {})],
    "get_agent_inventory": [V("Infrastructure", "Read", lambda w, t, c, tok: {"agent_id": agent(w, t)}, "agent")],
    "discover_plugins": [V("Infrastructure", "Read", lambda w, t, c, tok: {})],
    "discover_instructions": [V("InstructionDefinition", "Read", lambda w, t, c, tok: {})],
    "list_definitions": [V("InstructionDefinition", "Read", lambda w, t, c, tok: {})],
    "get_definition": [V("InstructionDefinition", "Read", lambda w, t, c, tok: {"id": "def-1"})],
    "validate_scope": [V("Infrastructure", "Read", lambda w, t, c, tok: {"expression": "ostype == linux"}, rbac=False)],
    "preview_scope_targets": [V("Infrastructure", "Read", lambda w, t, c, tok: {"expression": "ostype == linux"})],
    "discover_scope_kinds": [V("Infrastructure", "Read", lambda w, t, c, tok: {})],
    "quarantine_device": [V("Security", "Execute", lambda w, t, c, tok: {"agent_id": agent(w, t)}, "agent",
                            service="confined")],
    # an agent's own credential: fleet-wide, as a certificate's revocation
    "revoke_agent_credential": [V("Security", "Delete", lambda w, t, c, tok: {"agent_id": agent(w, IN),
                                                                             "reason": "matrix"},
                                  compound=fleet_wide("Security", "Delete"))],
    # the CA: fleet-wide, so a Security grant held on one group does not reach it
    "list_issued_certs": [V("Security", "Read", lambda w, t, c, tok: {}, compound=fleet_wide("Security", "Read"))],
    "revoke_certificate": [V("Security", "Delete", lambda w, t, c, tok: {"serial_hex": w.cert, "reason": "matrix"},
                             compound=fleet_wide("Security", "Delete"))],
    "issue_code_signing_cert": [V("Security", "Write", lambda w, t, c, tok: CODE_SIGNING_ARGS,
                                  compound=fleet_wide("Security", "Write"))],
    # audit, permissions, tokens, accounts
    "query_audit_log": [V("AuditLog", "Read", lambda w, t, c, tok: {})],
    "check_permission": [V("Infrastructure", "Read", lambda w, t, c, tok: {"securable_type": "Tag", "operation": "Read"},
                           rbac=False)],
    "discover_permissions": [V("Infrastructure", "Read", lambda w, t, c, tok: {})],
    "list_api_tokens": [V("ApiToken", "Read", lambda w, t, c, tok: {})],
    "create_api_token": [V("ApiToken", "Write", lambda w, t, c, tok: {"name": "new", "mcp_tier": "readonly",
                                                                      "expires_at": ISO_TOMORROW()})],
    "revoke_api_token": [V("ApiToken", "Delete", lambda w, t, c, tok: {"token_id": OWN(w, t, c, tok)}, "token_admin")],
    "rotate_api_token": [V("ApiToken", "Rotate", lambda w, t, c, tok: {"token_id": OWN(w, t, c, tok)}, "own")],
    "confirm_api_token_rotation": [V("ApiToken", "Rotate", lambda w, t, c, tok: {"token_id": OWN(w, t, c, tok)},
                                     "own")],
    "unlock_account": [V("UserManagement", "Write", lambda w, t, c, tok: {"username": "locked-user"})],
    # approvals
    "list_pending_approvals": [V("Approval", "Read", lambda w, t, c, tok: {}, rbac=False)],
    "get_approval": [V("Approval", "Read", lambda w, t, c, tok: {"approval_id": w.tickets[t]}, "ticket",
                       reach=("Approval", "Approve"), rbac=False)],
    "withdraw_approval": [V("Approval", "Write", lambda w, t, c, tok: {
        "approval_id": w.own_tickets[c.username] if t == IN else w.tickets[t]}, "own", rbac=False)],
    "approve_request": [V("Approval", "Write", lambda w, t, c, tok: {"approval_id": w.tickets[IN]}, human_only=True)],
    # compliance (not confined to management groups: a policy id that does not exist reads as not found)
    "list_policies": [V("Policy", "Read", lambda w, t, c, tok: {})],
    "get_compliance_summary": [V("Policy", "Read", lambda w, t, c, tok: {"policy_id": w.policies[t]}, "policy")],
    "get_fleet_compliance": [V("Policy", "Read", lambda w, t, c, tok: {})],
    "get_guardian_schemas": [V("GuaranteedState", "Read", lambda w, t, c, tok: {})],
    "reject_request": [V("Approval", "Write", lambda w, t, c, tok: {"approval_id": w.tickets[IN]}, human_only=True)],
    # the operator surface (operations/): the plugin store is fleet-wide; upload grants name an agent
    "get_plugin_config": [V("PluginConfig", "Read", lambda w, t, c, tok: {"plugin": "process", "key": "default_limit"},
                            compound=fleet_wide("PluginConfig", "Read"))],
    "list_plugin_config": [V("PluginConfig", "Read", lambda w, t, c, tok: {}, compound=fleet_wide("PluginConfig", "Read"))],
    "set_plugin_config": [V("PluginConfig", "Write", lambda w, t, c, tok: {"plugin": "process", "key": "default_limit",
                                                                             "value": "7"})],
    "delete_plugin_config": [V("PluginConfig", "Delete", lambda w, t, c, tok: {"plugin": "process",
                                                                               "key": "default_limit"})],
    "set_plugin_secret": [V("PluginSecret", "Write", lambda w, t, c, tok: {"plugin": "process", "key": "api_token",
                                                                             "value": "matrix-secret"})],
    "delete_plugin_secret": [V("PluginSecret", "Delete", lambda w, t, c, tok: {"plugin": "process",
                                                                               "key": "api_token"})],
    # a kill switch is fleet-wide (a fleet-wide grant) or one group's (a grant on that group or an ancestor)
    "get_plugin_kill_switch": [
        V("PluginConfig", "Read", lambda w, t, c, tok: {"plugin": "process"}, label="fleet",
          compound=fleet_wide("PluginConfig", "Read")),
        V("PluginConfig", "Read", lambda w, t, c, tok: {"plugin": "process", "group": group(w, t)}, "group",
          label="group")],
    "set_plugin_kill_switch": [
        V("PluginConfig", "Write", lambda w, t, c, tok: {"plugin": "process", "enabled": False, "reason": "matrix"},
          label="fleet", compound=fleet_wide("PluginConfig", "Write")),
        V("PluginConfig", "Write", lambda w, t, c, tok: {"plugin": "process", "enabled": False, "group": group(w, t)},
          "group", label="group")],
    "mint_upload_grant": [V("UploadGrant", "Write", lambda w, t, c, tok: {"agent_id": agent(w, t),
                                                                          "declared_max_size": 10}, "agent")],
    "list_upload_grants": [V("UploadGrant", "Read", lambda w, t, c, tok: {})],
    "revoke_upload_grant": [V("UploadGrant", "Delete", lambda w, t, c, tok: {"grant_id": w.grants[t]}, "agent")],
    "list_schedules": [V("Schedule", "Read", lambda w, t, c, tok: {})],
    "query_installed_software": [V("Inventory", "Read", lambda w, t, c, tok: {"name": "bash"}, service="confined")],
    # an unknown device, or another service's, answers count 0 (docs/operator.md)
    "query_software_licenses": [V("SoftwareLicensing", "Read", lambda w, t, c, tok: {"agent_id": agent(w, t)},
                                  "agent", empty_when_absent=True, service="confined")],
    # DEX (docs/dex.md): GuaranteedState:Read, a fleet-wide grant only; rows confined by Infrastructure:Read, and a
    # group the caller cannot read (or none) reads as absent. A service-scoped token reads its service's devices,
    # but the three marked no-SS (fleet-wide agent ids) refuse it.
    **{name: [V("GuaranteedState", "Read", lambda w, t, c, tok, a=args: dict(a), service=ss)] for name, args, ss in (
        ("list_dex_signals", {"window": "30d"}, "confined"), ("get_dex_signal_scope", {}, "confined"),
        ("get_dex_signal_detail", {"obs_type": "perf.cpu_sustained"}, "denied"),
        ("get_dex_perf_fleet", {}, "confined"), ("get_dex_perf_cohorts", {"key": "owner"}, "confined"),
        ("get_dex_perf_cohort_diff", {"key": "owner", "a": "payments", "b": ""}, "confined"),
        ("list_dex_perf_devices", {}, "denied"), ("list_dex_perf_apps", {}, "confined"),
        ("get_dex_app_perf", {"app": "java"}, "confined"), ("get_network_fleet", {}, "confined"),
        ("list_network_devices", {"metric": "throughput"}, "denied"))},
    "get_dex_group_app_perf": [V("GuaranteedState", "Read", lambda w, t, c, tok: {"group_id": group(w, t),
                                                                                   "app": "java"},
                                 "group", reach=("Infrastructure", "Read"), service="confined")],
    "compare_app_perf_versions": [V("GuaranteedState", "Read", lambda w, t, c, tok: {
        "app": "java", "group": group(w, t), "baseline": "1.0", "candidate": "2.0"}, "group",
        reach=("Infrastructure", "Read"), service="confined")],
    # governance: engine principals, access reviews and the KEK are the whole install's (no group reaches them)
    "create_engine_principal": [V("Security", "Write", lambda w, t, c, tok: {
        "principal_id": "engine:matrix-new", "display_name": "m", "owner_username": "zed", "justification": "m",
        "classification": "internal"}, compound=SEC_WRITE_FLEET_WIDE)],
    "list_engine_principals": [V("EnginePrincipal", "Read", lambda w, t, c, tok: {})],
    "get_engine_principal": [V("EnginePrincipal", "Read", lambda w, t, c, tok: {"principal_id": "engine:held"})],
    "revoke_engine_principal": [V("Security", "Write", lambda w, t, c, tok: {"principal_id": "engine:held"},
                                  compound=SEC_WRITE_FLEET_WIDE)],
    "mint_engine_credential": [V("Security", "Write", lambda w, t, c, tok: {"principal_id": "engine:fresh"},
                                 compound=SEC_WRITE_FLEET_WIDE)],
    "rotate_engine_credential": [V("Security", "Write", lambda w, t, c, tok: {"principal_id": "engine:held"},
                                   compound=SEC_WRITE_FLEET_WIDE)],
    "confirm_engine_rotation": [V("Security", "Write", lambda w, t, c, tok: {
        "principal_id": "engine:rot", "token_id": w.engine["successor"], "secret": w.engine["secret"]},
        compound=SEC_WRITE_FLEET_WIDE)],
    "transfer_engine_principal_owner": [V("Security", "Write", lambda w, t, c, tok: {
        "principal_id": "engine:held", "new_owner": c.username}, compound=SEC_WRITE_FLEET_WIDE)],
    "audit_engine_no_admin": [V("AuditLog", "Read", lambda w, t, c, tok: {})],
    "assign_engine_role": [V("Security", "Write", lambda w, t, c, tok: {"principal_id": "held", "role": "Approver"},
                             compound=SEC_WRITE_FLEET_WIDE)],
    "unassign_engine_role": [V("Security", "Write", lambda w, t, c, tok: {"principal_id": "held", "role": "Viewer"},
                               compound=SEC_WRITE_FLEET_WIDE)],
    "list_engine_roles": [V("EnginePrincipal", "Read", lambda w, t, c, tok: {"principal_id": "held"})],
    "export_access_review": [V("AccessReview", "Read", lambda w, t, c, tok: {})],
    "open_access_review": [V("AccessReview", "Attest", lambda w, t, c, tok: {"title": "matrix"})],
    "record_attestation": [V("AccessReview", "Attest", lambda w, t, c, tok: {
        "campaign_id": w.engine["campaign"], "principal_type": "user", "principal_id": "zed",
        "role_name": "Administrator", "decision": "attested"})],
    "get_access_review": [V("AccessReview", "Read", lambda w, t, c, tok: {"campaign_id": w.engine["campaign"]})],
    "list_access_reviews": [V("AccessReview", "Read", lambda w, t, c, tok: {})],
    "close_access_review": [V("AccessReview", "Attest", lambda w, t, c, tok: {"campaign_id": w.engine["campaign"]})],
    "rotate_kek": [V("Security", "Write", lambda w, t, c, tok: {}, compound=SEC_WRITE_FLEET_WIDE)],
    "rewrap_secrets": [V("Security", "Write", lambda w, t, c, tok: {}, compound=SEC_WRITE_FLEET_WIDE)],
    "get_kek_status": [V("Security", "Read", lambda w, t, c, tok: {}, compound=fleet_wide("Security", "Read"))],
}

BRIDGE = {
    "bridge_send": [V("Bridge", "Write", lambda w, t, c, tok: {"content": "hi", "wait": False, "autoSpawn": False})],
    "bridge_reply": [V("Bridge", "Write", lambda w, t, c, tok: {"content": "done"})],
    "bridge_ask": [V("Bridge", "Write", lambda w, t, c, tok: {"content": "which one?", "timeoutMs": 0})],
    "bridge_status": [V("Bridge", "Read", lambda w, t, c, tok: {})],
    "bridge_spawn": [V("Bridge", "Execute", lambda w, t, c, tok: {"profile": "no-such-profile"})],
    "bridge_list": [V("Bridge", "Read", lambda w, t, c, tok: {})],
    "bridge_stop": [V("Bridge", "Execute", lambda w, t, c, tok: {"paneId": "%999999"})],
    "bridge_poll": [V("Bridge", "Read", lambda w, t, c, tok: {})],
    "bridge_ack": [V("Bridge", "Write", lambda w, t, c, tok: {"ids": ["no-such-item"]})],
    "bridge_profiles": [V("Bridge", "Read", lambda w, t, c, tok: {})],
    "bridge_whoami": [V("Bridge", "Read", lambda w, t, c, tok: {})],
    "bridge_read": [V("Bridge", "Read", lambda w, t, c, tok: {})],
    "bridge_cancel": [V("Bridge", "Write", lambda w, t, c, tok: {})],
}
TABLES = {"v1": V1, "bridge": BRIDGE}


# --- calling and classifying -----------------------------------------------------------------------


MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def call(raw, sid, cat, name, args):
    """One tools/call through mcp.server.handle — or, with ``sid`` MODERN, as a 2026-07-28 request through
    mcp.modern.handle (the same pipeline, the other framing) — rolled back afterwards."""
    params = {"name": name, "arguments": args}
    if sid is MODERN:
        params["_meta"] = MODERN_META
    msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    with transaction.atomic():
        if sid is MODERN:
            out = modern.handle(Request("POST", _headers(raw), {}, cat, msg))
        else:
            out = handle(Request("POST", _headers(raw, sid), {}, cat, msg))
        transaction.set_rollback(True)
    return out


def classify(out, cat):
    """The answer as one of the table's outcomes, or a description of something else."""
    if isinstance(out, Continuation):
        return ALLOW, ""  # an async tool passed every check; the transport would now await its handler
    body = out.body or {}
    err = body.get("error")
    if err is None:
        result = body.get("result", {})
        structured = result.get("structuredContent") or {}
        if structured.get("status") == "no_agents_reached":
            return HIDDEN, "no_agents_reached"
        if result.get("isError") and cat == "v1":
            return f"tool failure: {structured.get('error', {}).get('message', '')[:80]}", ""
        return ALLOW, ""
    code, message = err["code"], err["message"]
    if code == -32603 and (err.get("data") or {}).get("failure") == "cooldown":
        return ALLOW, ""  # rotate_kek passed every check; the world's KEK is too young to rotate again
    if code == -32004:
        return TIER, message
    if code == -32003:
        return (SCOPE if "scope_service" in (err.get("data") or {}) else RBAC), message
    if code == -32006:
        return APPROVAL, message
    if code == -32602 and ("not found" in message or message.startswith("nothing to approve")):
        return HIDDEN, message
    return f"error {code}: {message[:80]}", message


def rule_for(tool, variant):
    """The table's rule, checked against the registry's classification of the tool."""
    r = variant.rule
    return r, (tool.securable, tool.operation) == (r.securable, r.operation)


def answer_of(out, w, target):
    """What a caller reads in a reply, the target's own ids (and what differs on every call) left out: another
    service's device must read exactly like one that does not exist."""
    if isinstance(out, Continuation):
        return "continuation"
    body = out.body or {}
    if "error" in body:
        err = body["error"]
        return err["code"], _normalise(err["message"], w, target)
    result = body.get("result", {})
    return result.get("isError"), _normalise(str(_stable(result.get("structuredContent"))), w, target)


VOLATILE = {"correlation_id", "execution_id", "command_id", "dispatched_at", "expires_at", "created_at", "timestamp"}


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


MODERN = object()  # the "session" of a 2026-07-28 caller: none, every request stands alone


def run_mcp_matrix(cat_name, callers=CALLERS, tiers=TIERS, era="legacy", pairs=SERVICE_PAIRS):
    """Every tool × (each caller × each tier, and the service-scoped ``pairs``) × its targets."""
    cat = catalogue(cat_name)
    table = TABLES[cat_name]
    missing = sorted(set(cat.tools) - set(table))
    stale = sorted(set(table) - set(cat.tools))
    w = build_world(callers, tiers, pairs)
    rows, cells = [], 0
    for name in missing:
        rows.append((name, "-", "-", "-", "a row in the table", "no row (add one to TABLES)"))
    for name in stale:
        rows.append((name, "-", "-", "-", "a registered tool", "not registered"))
    for name in sorted(set(cat.tools) & set(table)):
        classes = {v.rule.service for v in table[name]}
        if classes != {cat.tools[name].service_scope}:
            rows.append((name, "-", "-", "-", f"service scope {'/'.join(sorted(classes))}",
                         f"registry: {cat.tools[name].service_scope}"))
    for caller, tier in [(c, t) for c in callers for t in tiers] + list(pairs):
        token, raw = w.token_of(caller, tier)
        sid = open_session(raw, cat_name) if era == "legacy" else MODERN
        for name in sorted(set(cat.tools) & set(table)):
            tool = cat.tools[name]
            for variant in table[name]:
                rule, same_pair = rule_for(tool, variant)
                if not same_pair:
                    rows.append((name, str(caller), tier, "-", f"{rule.securable}:{rule.operation}",
                                 f"registry: {tool.securable}:{tool.operation}"))
                    continue
                answers, read = {}, {}
                for target in variant.targets(caller):
                    cells += 1
                    want = expected(rule, tier, caller, target)
                    out = call(raw, sid, cat_name, name, variant.args(w, target, caller, token))
                    got, message = answers[target] = classify(out, cat_name)
                    if got != want:
                        rows.append((f"{name}{':' + variant.label if variant.label else ''}", str(caller),
                                     tier or "untiered", target or "-", want, f"{got} {message[:90]}".strip()))
                    if caller.service:
                        read[target] = answer_of(out, w, target)
                        if target != SVC and w.agents[SVC] in str(read[target]):
                            rows.append((name, str(caller), tier or "untiered", target or "-",
                                         "nothing of another service's device", str(read[target])[:100]))
                # No oracle: an id in another group and an id that does not exist read alike.
                if GHOST in answers and answers[OUT][0] == answers[GHOST][0] == HIDDEN:
                    out_msg = answers[OUT][1].replace(str(variant.args(w, OUT, caller, token)), "<args>")
                    out_msg = _normalise(out_msg, w, OUT)
                    ghost_msg = _normalise(answers[GHOST][1], w, GHOST)
                    if out_msg != ghost_msg:
                        rows.append((name, str(caller), tier or "untiered", "out vs ghost",
                                     "the same answer", f"{out_msg[:60]!r} vs {ghost_msg[:60]!r}"))
                # Nor a service oracle: another service's device reads exactly like one that does not exist.
                if SVC in read and read[SVC] != read[GHOST]:
                    rows.append((name, str(caller), tier or "untiered", "svc vs ghost", "the same answer",
                                 f"{str(read[SVC])[:60]!r} vs {str(read[GHOST])[:60]!r}"))
    return rows, cells


def _normalise(message, w, target):
    for ids in (w.agents, w.groups, w.executions, w.bundles, w.tickets, w.policies, w.fragments, w.rules, w.grants):
        if target in ids:
            message = message.replace(str(ids[target]), "<id>")
    return message.replace(str(w.other_token), "<id>").replace("0" * 24, "<id>")


def mismatch_table(rows):
    header = ("tool", "caller", "tier", "target", "expected", "answered")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    widths[-1] = min(widths[-1], 100)
    fmt = " | ".join(f"{{:{w}.{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*map(str, r)) for r in rows])


@pytest.mark.parametrize("era", ["legacy", "modern"])
@pytest.mark.parametrize("cat_name", ["v1", "bridge"])
def test_mcp_matrix(cat_name, era):
    rows, cells = run_mcp_matrix(cat_name, era=era)
    assert cells > (800 if cat_name == "v1" else 100)
    if rows:
        pytest.fail(f"{len(rows)} of {cells} cells disagree with the rule table:\n" + mismatch_table(rows),
                    pytrace=False)


# --- the REST routes: one row per (route, method), derived from the URL resolver --------------------

class R:
    """One REST call: its rule, path and body per target, and the status an allowed call answers."""

    def __init__(self, securable, operation, path, body=None, target=None, ok=200, label="", **rule):
        self.rule = Rule(securable, operation, target=target, **rule)
        self.path, self.body, self.ok, self.label = path, body, ok, label

    def targets(self, caller):
        return targets(self.rule, caller)


A = lambda w, t: w.agents[t]  # noqa: E731
G = lambda w, t: w.groups[t]  # noqa: E731
E = lambda w, t: w.executions[t]  # noqa: E731
TOK = lambda w, t, tok: tok.pk if t == IN else (w.other_token if t == OUT else "0" * 24)  # noqa: E731
EX_BODY = lambda w, t, c, tok: {"plugin": "os", "action": "info", "agent_ids": [A(w, t)]}  # noqa: E731
#: anyone authenticated; the tier still applies (Read passes every tier)
OPEN = {"rbac": False}
#: anyone at all, with or without a credential (the API's own description): a service scope changes nothing
PUBLIC_DOC = {"rbac": False, "service": "open"}
#: the REST twin of a "confined" tool: a service-scoped token is let in, and kept to its service's devices
CONFINED = {"service": "confined"}

REST = {
    ("api/v1/tokens", "GET"): [R("ApiToken", "Read", lambda w, t, c, tok: "/api/v1/tokens")],
    ("api/v1/tokens", "POST"): [R("ApiToken", "Write", lambda w, t, c, tok: "/api/v1/tokens", ok=201,
                                  body=lambda w, t, c, tok: {"name": "new", "mcp_tier": "readonly",
                                                             "expires_at": ISO_TOMORROW()})],
    ("api/v1/tokens/<str:token_id>", "DELETE"): [R("ApiToken", "Delete", lambda w, t, c, tok: f"/api/v1/tokens/{TOK(w, t, tok)}",
                                                   target="token_admin")],
    ("api/v1/tokens/<str:token_id>/rotate", "POST"): [R("ApiToken", "Rotate", lambda w, t, c, tok: f"/api/v1/tokens/{TOK(w, t, tok)}/rotate",
                                                        target="own", ok=201)],
    ("api/v1/tokens/<str:token_id>/confirm", "POST"): [R("ApiToken", "Rotate", lambda w, t, c, tok: f"/api/v1/tokens/{TOK(w, t, tok)}/confirm",
                                                         target="own")],
    ("api/v1/rbac/check", "POST"): [R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/rbac/check",
                                      body=lambda w, t, c, tok: {"securable_type": "Tag", "operation": "Read"}, **OPEN)],
    ("api/v1/rbac/roles", "GET"): [R("UserManagement", "Read", lambda w, t, c, tok: "/api/v1/rbac/roles")],
    ("api/v1/rbac/roles/<str:name>/permissions", "GET"): [R("UserManagement", "Read",
                                                            lambda w, t, c, tok: "/api/v1/rbac/roles/Viewer/permissions")],
    ("api/v1/users/<str:username>/unlock", "POST"): [R("UserManagement", "Write",
                                                       lambda w, t, c, tok: "/api/v1/users/locked-user/unlock")],
    ("api/v1/audit", "GET"): [R("AuditLog", "Read", lambda w, t, c, tok: "/api/v1/audit")],
    ("api/v1/agents", "GET"): [R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/agents")],
    ("api/v1/agents/<str:agent_id>", "GET"): [R("Infrastructure", "Read", lambda w, t, c, tok: f"/api/v1/agents/{A(w, t)}",
                                                target="agent")],
    ("api/v1/management-groups", "GET"): [R("ManagementGroup", "Read", lambda w, t, c, tok: "/api/v1/management-groups")],
    ("api/v1/management-groups", "POST"): [R("ManagementGroup", "Write", lambda w, t, c, tok: "/api/v1/management-groups",
                                             body=lambda w, t, c, tok: {"name": "new-group"}, ok=201,
                                             compound=MG_WRITE_FLEET_WIDE)],
    ("api/v1/management-groups/<str:group_id>", "GET"): [R("ManagementGroup", "Read",
                                                           lambda w, t, c, tok: f"/api/v1/management-groups/{G(w, t)}",
                                                           target="group")],
    ("api/v1/management-groups/<str:group_id>", "PUT"): [R("ManagementGroup", "Write",
                                                           lambda w, t, c, tok: f"/api/v1/management-groups/{G(w, t)}",
                                                           body=lambda w, t, c, tok: {"description": "changed"},
                                                           target="group", compound=MG_WRITE_FLEET_WIDE)],
    ("api/v1/management-groups/<str:group_id>/members", "POST"): [R(
        "ManagementGroup", "Write", lambda w, t, c, tok: f"/api/v1/management-groups/{G(w, t)}/members",
        body=lambda w, t, c, tok: {"agent_id": A(w, IN)}, target="group", ok=201, compound=MG_WRITE_FLEET_WIDE)],
    ("api/v1/management-groups/<str:group_id>/roles", "GET"): [R(
        "ManagementGroup", "Read", lambda w, t, c, tok: f"/api/v1/management-groups/{G(w, t)}/roles", target="group",
        compound=fleet_wide_or_owner("Read"))],
    ("api/v1/management-groups/<str:group_id>/roles", "POST"): [R(
        "ManagementGroup", "Write", lambda w, t, c, tok: f"/api/v1/management-groups/{G(w, t)}/roles", target="group",
        body=lambda w, t, c, tok: {"username": "zed", "role": "ITServiceOwner"}, ok=201, compound=fleet_wide_or_owner("Write"))],
    ("api/v1/executions", "GET"): [R("Execution", "Read", lambda w, t, c, tok: "/api/v1/executions")],
    ("api/v1/executions", "POST"): [R("Execution", "Execute", lambda w, t, c, tok: "/api/v1/executions", body=EX_BODY,
                                      target="agent", ok=202, **CONFINED)],
    ("api/v1/executions/<str:execution_id>", "GET"): [R("Execution", "Read",
                                                        lambda w, t, c, tok: f"/api/v1/executions/{E(w, t)}",
                                                        target="execution")],
    ("api/v1/executions/<str:execution_id>/cancel", "POST"): [R(
        "Execution", "Execute", lambda w, t, c, tok: f"/api/v1/executions/{E(w, t)}/cancel", target="dispatched")],
    ("api/v1/executions/<str:execution_id>/responses", "GET"): [R(
        "Response", "Read", lambda w, t, c, tok: f"/api/v1/executions/{E(w, t)}/responses", target="execution")],
    ("api/v1/executions/<str:execution_id>/aggregate", "GET"): [R(
        "Response", "Read", lambda w, t, c, tok: f"/api/v1/executions/{E(w, t)}/aggregate", target="execution")],
    ("api/v1/bundles", "POST"): [R("Execution", "Execute", lambda w, t, c, tok: "/api/v1/bundles", target="agent", ok=202,
                                   body=lambda w, t, c, tok: {"agent_id": A(w, t),
                                                              "steps": [{"plugin": "os", "action": "info"}]},
                                   **CONFINED)],
    ("api/v1/bundles/<str:bundle_id>", "GET"): [R("Response", "Read",
                                                  lambda w, t, c, tok: f"/api/v1/bundles/{w.bundles[t]}",
                                                  target="dispatched", reach=("Execution", "Read"))],
    ("api/v1/bundles/<str:bundle_id>/cancel", "POST"): [R(
        "Execution", "Execute", lambda w, t, c, tok: f"/api/v1/bundles/{w.bundles[t]}/cancel", target="dispatched")],
    ("api/v1/tags", "GET"): [R("Tag", "Read", lambda w, t, c, tok: f"/api/v1/tags?agent_id={A(w, t)}", target="agent"),
                             R("Tag", "Read", lambda w, t, c, tok: "/api/v1/tags?key=owner", label="search")],
    ("api/v1/tags", "PUT"): [R("Tag", "Write", lambda w, t, c, tok: "/api/v1/tags", target="agent",
                               body=lambda w, t, c, tok: {"agent_id": A(w, t), "key": "owner", "value": "x"},
                               **CONFINED)],
    ("api/v1/tags/<str:agent_id>/<str:key>", "DELETE"): [R("Tag", "Delete",
                                                           lambda w, t, c, tok: f"/api/v1/tags/{A(w, t)}/owner",
                                                           target="agent", **CONFINED)],
    ("api/v1/inventory", "GET"): [R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/inventory")],
    ("api/v1/inventory/tables", "GET"): [R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/inventory/tables")],
    ("api/v1/agents/<str:agent_id>/inventory", "GET"): [R("Infrastructure", "Read",
                                                          lambda w, t, c, tok: f"/api/v1/agents/{A(w, t)}/inventory",
                                                          target="agent")],
    ("api/v1/scope/validate", "POST"): [R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/scope/validate",
                                          body=lambda w, t, c, tok: {"expression": "ostype == linux"})],
    ("api/v1/scope/preview", "POST"): [R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/scope/preview",
                                         body=lambda w, t, c, tok: {"expression": "ostype == linux"})],
    ("api/v1/discover/<str:kind>", "GET"): [
        R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/discover/plugins", label="plugins"),
        R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/discover/instructions", label="instructions",
          also=(("InstructionDefinition", "Read"),)),
        R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/discover/scope-kinds", label="scope-kinds"),
        R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/discover/routes", label="routes")],
    ("api/v1/quarantine", "POST"): [R("Security", "Execute", lambda w, t, c, tok: "/api/v1/quarantine", target="agent",
                                      body=lambda w, t, c, tok: {"agent_id": A(w, t)}, **CONFINED)],
    ("api/v1/agents/<str:agent_id>/revoke-credential", "POST"): [
        R("Security", "Delete", lambda w, t, c, tok: f"/api/v1/agents/{A(w, IN)}/revoke-credential",
          body=lambda w, t, c, tok: {"reason": "matrix"}, compound=fleet_wide("Security", "Delete"))],
    ("api/v1/ca/issued", "GET"): [R("Security", "Read", lambda w, t, c, tok: "/api/v1/ca/issued",
                                    compound=fleet_wide("Security", "Read"))],
    ("api/v1/ca/revoke", "POST"): [R("Security", "Delete", lambda w, t, c, tok: "/api/v1/ca/revoke",
                                     body=lambda w, t, c, tok: {"serial_hex": w.cert},
                                     compound=fleet_wide("Security", "Delete"))],
    ("api/v1/ca/issue", "POST"): [R("Security", "Write", lambda w, t, c, tok: "/api/v1/ca/issue", ok=201,
                                    body=lambda w, t, c, tok: CODE_SIGNING_ARGS,
                                    compound=fleet_wide("Security", "Write"))],
    ("api/v1/openapi.json", "GET"): [R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/openapi.json",
                                       **PUBLIC_DOC)],
    ("api/v1/openapi.yaml", "GET"): [R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/openapi.yaml",
                                       **PUBLIC_DOC)],
    ("api/v1/docs", "GET"): [R("Infrastructure", "Read", lambda w, t, c, tok: "/api/v1/docs", **PUBLIC_DOC)],
    ("api/v1/approvals", "GET"): [R("Approval", "Read", lambda w, t, c, tok: "/api/v1/approvals", rbac=False)],
    ("api/v1/approvals/pending/count", "GET"): [R("Approval", "Read", lambda w, t, c, tok: "/api/v1/approvals/pending/count")],
    ("api/v1/approvals/<str:approval_id>", "GET"): [R("Approval", "Read",
                                                      lambda w, t, c, tok: f"/api/v1/approvals/{w.tickets[t]}",
                                                      target="ticket", reach=("Approval", "Approve"), rbac=False)],
    ("api/v1/approvals/<str:approval_id>/approve", "POST"): [R(
        "Approval", "Write", lambda w, t, c, tok: f"/api/v1/approvals/{w.tickets[IN]}/approve", human_only=True)],
    ("api/v1/approvals/<str:approval_id>/reject", "POST"): [R(
        "Approval", "Write", lambda w, t, c, tok: f"/api/v1/approvals/{w.tickets[IN]}/reject", human_only=True)],
    ("api/v1/approvals/<str:approval_id>/revoke", "POST"): [R(
        "Approval", "Write", lambda w, t, c, tok: f"/api/v1/approvals/{w.tickets[IN]}/revoke", human_only=True)],
    ("api/v1/approvals/<str:approval_id>/withdraw", "POST"): [R(
        "Approval", "Write", lambda w, t, c, tok: "/api/v1/approvals/"
        + (w.own_tickets[c.username] if t == IN else w.tickets[t]) + "/withdraw", target="own", rbac=False)],
    ("api/v1/bridge/members", "GET"): [R("Bridge", "Read", lambda w, t, c, tok: "/api/v1/bridge/members")],
    # The world has no bridge profile: an allowed spawn gets as far as the profile lookup (404).
    ("api/v1/bridge/members", "POST"): [R("Bridge", "Execute", lambda w, t, c, tok: "/api/v1/bridge/members", ok=404,
                                          body=lambda w, t, c, tok: {"profile": "no-such-profile"})],
    ("api/v1/bridge/members/<str:pane_id>", "DELETE"): [R("Bridge", "Execute",
                                                          lambda w, t, c, tok: "/api/v1/bridge/members/%25999999")],
}
P = lambda w, t: w.policies[t]  # noqa: E731
NEW_FRAGMENT = lambda w, t, c, tok: {"yaml_source": fragment_yaml("new-fragment")}  # noqa: E731
NEW_POLICY = lambda w, t, c, tok: {"yaml_source": policy_yaml("new-policy", "authz-fragment")}  # noqa: E731
RULE = {"name": "new-rule", "spec": {"spark": {"type": "service-status-change"},
                                     "assertion": {"type": "service-running", "params": {"service_name": "cron"}},
                                     "remediation": {"type": "alert-only"}}}
REST.update({
    ("api/v1/policy-fragments", "GET"): [R("Policy", "Read", lambda w, t, c, tok: "/api/v1/policy-fragments")],
    ("api/v1/policy-fragments", "POST"): [R("Policy", "Write", lambda w, t, c, tok: "/api/v1/policy-fragments",
                                            body=NEW_FRAGMENT, ok=201)],
    ("api/v1/policy-fragments/<str:fragment_id>", "DELETE"): [R(
        "Policy", "Delete", lambda w, t, c, tok: f"/api/v1/policy-fragments/{w.fragments[t]}", target="policy")],
    ("api/v1/policies", "GET"): [R("Policy", "Read", lambda w, t, c, tok: "/api/v1/policies")],
    ("api/v1/policies", "POST"): [R("Policy", "Write", lambda w, t, c, tok: "/api/v1/policies", body=NEW_POLICY,
                                    ok=201)],
    ("api/v1/policies/invalidate-all", "POST"): [R("Policy", "Write",
                                                   lambda w, t, c, tok: "/api/v1/policies/invalidate-all")],
    ("api/v1/policies/<str:policy_id>", "GET"): [R("Policy", "Read", lambda w, t, c, tok: f"/api/v1/policies/{P(w, t)}",
                                                   target="policy")],
    ("api/v1/policies/<str:policy_id>", "DELETE"): [R("Policy", "Delete",
                                                      lambda w, t, c, tok: f"/api/v1/policies/{P(w, t)}",
                                                      target="policy")],
    **{(f"api/v1/policies/<str:policy_id>/{action}", "POST"): [R(
        "Policy", "Write", lambda w, t, c, tok, action=action: f"/api/v1/policies/{P(w, t)}/{action}",
        target="policy")] for action in ("enable", "disable", "invalidate")},
    ("api/v1/policies/<str:policy_id>/evaluate", "POST"): [R(
        "Policy", "Execute", lambda w, t, c, tok: f"/api/v1/policies/{P(w, t)}/evaluate", target="policy", ok=202)],
    ("api/v1/policies/<str:policy_id>/remediate", "POST"): [R(
        "Policy", "Execute", lambda w, t, c, tok: f"/api/v1/policies/{P(w, t)}/remediate", target="policy")],
    ("api/v1/compliance", "GET"): [R("Policy", "Read", lambda w, t, c, tok: "/api/v1/compliance")],
    ("api/v1/compliance/<str:policy_id>", "GET"): [R("Policy", "Read",
                                                     lambda w, t, c, tok: f"/api/v1/compliance/{P(w, t)}",
                                                     target="policy")],
    ("api/v1/compliance/<str:policy_id>/summary", "GET"): [R(
        "Policy", "Read", lambda w, t, c, tok: f"/api/v1/compliance/{P(w, t)}/summary", target="policy")],
    ("api/v1/guaranteed-state/rules", "GET"): [R("GuaranteedState", "Read",
                                                 lambda w, t, c, tok: "/api/v1/guaranteed-state/rules")],
    ("api/v1/guaranteed-state/rules", "POST"): [R("GuaranteedState", "Write",
                                                  lambda w, t, c, tok: "/api/v1/guaranteed-state/rules",
                                                  body=lambda w, t, c, tok: RULE, ok=201)],
    ("api/v1/guaranteed-state/rules/<str:rule_id>", "GET"): [R(
        "GuaranteedState", "Read", lambda w, t, c, tok: f"/api/v1/guaranteed-state/rules/{w.rules[t]}",
        target="rule")],
    ("api/v1/guaranteed-state/rules/<str:rule_id>", "PUT"): [R(
        "GuaranteedState", "Write", lambda w, t, c, tok: f"/api/v1/guaranteed-state/rules/{w.rules[t]}",
        body=lambda w, t, c, tok: {"severity": "high"}, target="rule")],
    ("api/v1/guaranteed-state/rules/<str:rule_id>", "DELETE"): [R(
        "GuaranteedState", "Delete", lambda w, t, c, tok: f"/api/v1/guaranteed-state/rules/{w.rules[t]}",
        target="rule")],
    ("api/v1/guaranteed-state/push", "POST"): [R("GuaranteedState", "Push",
                                                 lambda w, t, c, tok: "/api/v1/guaranteed-state/push", ok=202,
                                                 body=lambda w, t, c, tok: {"scope": "ostype == linux"})],
    ("api/v1/guaranteed-state/events", "GET"): [R("GuaranteedState", "Read",
                                                  lambda w, t, c, tok: "/api/v1/guaranteed-state/events")],
    ("api/v1/guaranteed-state/status", "GET"): [R("GuaranteedState", "Read",
                                                  lambda w, t, c, tok: "/api/v1/guaranteed-state/status")],
    ("api/v1/guaranteed-state/status/<str:agent_id>", "GET"): [R(
        "GuaranteedState", "Read", lambda w, t, c, tok: f"/api/v1/guaranteed-state/status/{A(w, t)}",
        target="agent")],
    ("api/v1/guaranteed-state/schemas", "GET"): [R("GuaranteedState", "Read",
                                                   lambda w, t, c, tok: "/api/v1/guaranteed-state/schemas")],
    # DEX (docs/dex.md): the twins of the tools, the three no-SS ones refusing a service-scoped token
    **{(route, "GET"): [R("GuaranteedState", "Read", lambda w, t, c, tok, p=path: p, service=ss)]
       for route, path, ss in (
        ("api/v1/dex/signals", "/api/v1/dex/signals?window=all", "confined"),
        ("api/v1/dex/scope", "/api/v1/dex/scope", "confined"),
        ("api/v1/dex/signals/<str:obs_type>", "/api/v1/dex/signals/perf.cpu_sustained", "denied"),
        ("api/v1/dex/perf/fleet", "/api/v1/dex/perf/fleet", "confined"),
        ("api/v1/dex/perf/cohorts", "/api/v1/dex/perf/cohorts", "confined"),
        ("api/v1/dex/perf/cohort-diff", "/api/v1/dex/perf/cohort-diff?a=payments&b=", "confined"),
        ("api/v1/dex/perf/devices", "/api/v1/dex/perf/devices", "denied"),
        ("api/v1/dex/perf/apps", "/api/v1/dex/perf/apps", "confined"),
        ("api/v1/dex/perf/app", "/api/v1/dex/perf/app?app=java", "confined"),
        ("api/v1/network/fleet", "/api/v1/network/fleet", "confined"),
        ("api/v1/network/devices", "/api/v1/network/devices", "denied"))},
    ("api/v1/dex/perf/group", "GET"): [R("GuaranteedState", "Read",
                                         lambda w, t, c, tok: f"/api/v1/dex/perf/group?group_id={G(w, t)}&app=java",
                                         target="group", reach=("Infrastructure", "Read"), **CONFINED)],
    ("api/v1/dex/perf/compare", "GET"): [R(
        "GuaranteedState", "Read",
        lambda w, t, c, tok: f"/api/v1/dex/perf/compare?app=java&group={G(w, t)}&baseline=1.0&candidate=2.0",
        target="group", reach=("Infrastructure", "Read"), **CONFINED)],
})
PC = "/api/v1/plugin-config"
SCHEDULE_BODY = {"name": "matrix", "definition_id": "def-1", "frequency_type": "interval", "interval_minutes": 60}
REST.update({
    ("api/v1/plugin-config", "GET"): [R("PluginConfig", "Read", lambda w, t, c, tok: PC,
                                        compound=fleet_wide("PluginConfig", "Read"))],
    ("api/v1/plugin-config/<str:plugin>/<str:key>", "GET"): [R(
        "PluginConfig", "Read", lambda w, t, c, tok: f"{PC}/process/default_limit",
        compound=fleet_wide("PluginConfig", "Read"))],
    ("api/v1/plugin-config/<str:plugin>/<str:key>", "PUT"): [R(
        "PluginConfig", "Write", lambda w, t, c, tok: f"{PC}/process/default_limit",
        body=lambda w, t, c, tok: {"value": "9"})],
    ("api/v1/plugin-config/<str:plugin>/<str:key>", "DELETE"): [R(
        "PluginConfig", "Delete", lambda w, t, c, tok: f"{PC}/process/default_limit")],
    ("api/v1/plugin-config/<str:plugin>/<str:key>/secret", "PUT"): [R(
        "PluginSecret", "Write", lambda w, t, c, tok: f"{PC}/process/api_token/secret",
        body=lambda w, t, c, tok: {"value": "matrix-secret"})],
    ("api/v1/plugin-config/<str:plugin>/<str:key>/secret", "DELETE"): [R(
        "PluginSecret", "Delete", lambda w, t, c, tok: f"{PC}/process/api_token/secret")],
    ("api/v1/plugin-config/<str:plugin>/kill-switch", "GET"): [
        R("PluginConfig", "Read", lambda w, t, c, tok: f"{PC}/process/kill-switch?action=list",
          compound=fleet_wide("PluginConfig", "Read")),
        R("PluginConfig", "Read", lambda w, t, c, tok: f"{PC}/process/kill-switch?group={G(w, t)}", target="group")],
    ("api/v1/plugin-config/<str:plugin>/kill-switch", "PUT"): [
        R("PluginConfig", "Write", lambda w, t, c, tok: f"{PC}/process/kill-switch",
          body=lambda w, t, c, tok: {"enabled": False, "reason": "matrix"}, compound=fleet_wide("PluginConfig", "Write")),
        R("PluginConfig", "Write", lambda w, t, c, tok: f"{PC}/process/kill-switch?group={G(w, t)}",
          body=lambda w, t, c, tok: {"enabled": False}, target="group")],
    ("api/v1/upload-grants", "GET"): [R("UploadGrant", "Read", lambda w, t, c, tok: "/api/v1/upload-grants")],
    ("api/v1/upload-grants", "POST"): [R("UploadGrant", "Write", lambda w, t, c, tok: "/api/v1/upload-grants",
                                         body=lambda w, t, c, tok: {"agent_id": A(w, t), "declared_max_size": 10},
                                         target="agent", ok=201)],
    ("api/v1/upload-grants/<str:grant_id>", "DELETE"): [R(
        "UploadGrant", "Delete", lambda w, t, c, tok: f"/api/v1/upload-grants/{w.grants[t]}", target="agent")],
    ("api/v1/schedules", "GET"): [R("Schedule", "Read", lambda w, t, c, tok: "/api/v1/schedules")],
    ("api/v1/schedules", "POST"): [R("Schedule", "Write", lambda w, t, c, tok: "/api/v1/schedules", ok=201,
                                     body=lambda w, t, c, tok: SCHEDULE_BODY, also=(("Execution", "Execute"),))],
    ("api/v1/schedules/<str:schedule_id>", "DELETE"): [R(
        "Schedule", "Delete", lambda w, t, c, tok: f"/api/v1/schedules/{w.schedule}")],
    ("api/v1/schedules/<str:schedule_id>/enable", "POST"): [R(
        "Schedule", "Write", lambda w, t, c, tok: f"/api/v1/schedules/{w.schedule}/enable",
        body=lambda w, t, c, tok: {"enabled": False})],
    ("api/v1/inventory/software", "GET"): [R("Inventory", "Read", lambda w, t, c, tok: "/api/v1/inventory/software",
                                             **CONFINED)],
    # an unknown device, or another service's, reads as no licences and erases nothing (docs/operator.md)
    ("api/v1/sle/agents/<str:agent_id>", "GET"): [R("SoftwareLicensing", "Read",
                                                    lambda w, t, c, tok: f"/api/v1/sle/agents/{A(w, t)}",
                                                    target="agent", empty_when_absent=True, **CONFINED)],
    ("api/v1/sle/agents/<str:agent_id>", "DELETE"): [R(
        "SoftwareLicensing", "Delete", lambda w, t, c, tok: f"/api/v1/sle/agents/{A(w, t)}", target="agent",
        empty_when_absent=True, also=(("Inventory", "Delete"), ("GuaranteedState", "Delete")), **CONFINED)],
})
EP = "/api/v1/engine-principals"
AR = "/api/v1/access-reviews"
REST.update({
    # governance (spec/governance.md): fleet-wide, so a Security grant held on one group does not reach it
    ("api/v1/engine-principals", "GET"): [R("EnginePrincipal", "Read", lambda w, t, c, tok: EP)],
    ("api/v1/engine-principals", "POST"): [R("Security", "Write", lambda w, t, c, tok: EP, ok=201, body=lambda w, t, c, tok: {
        "slug": "matrix-new", "display_name": "m", "owner_username": "zed", "justification": "m",
        "classification": "internal"}, compound=SEC_WRITE_FLEET_WIDE)],
    ("api/v1/engine-principals/audit/no-admin", "GET"): [R("AuditLog", "Read", lambda w, t, c, tok: f"{EP}/audit/no-admin")],
    ("api/v1/engine-principals/<str:principal_id>", "GET"): [R("EnginePrincipal", "Read",
                                                               lambda w, t, c, tok: f"{EP}/engine:held")],
    ("api/v1/engine-principals/<str:principal_id>", "DELETE"): [R("Security", "Write",
                                                                  lambda w, t, c, tok: f"{EP}/engine:held",
                                                                  compound=SEC_WRITE_FLEET_WIDE)],
    ("api/v1/engine-principals/<str:principal_id>/credentials", "POST"): [R(
        "Security", "Write", lambda w, t, c, tok: f"{EP}/engine:fresh/credentials", ok=201,
        compound=SEC_WRITE_FLEET_WIDE)],
    ("api/v1/engine-principals/<str:principal_id>/credentials/rotate", "POST"): [R(
        "Security", "Write", lambda w, t, c, tok: f"{EP}/engine:held/credentials/rotate", ok=201,
        compound=SEC_WRITE_FLEET_WIDE)],
    ("api/v1/engine-principals/<str:principal_id>/credentials/confirm", "POST"): [R(
        "Security", "Write", lambda w, t, c, tok: f"{EP}/engine:rot/credentials/confirm",
        body=lambda w, t, c, tok: {"token_id": w.engine["successor"], "secret": w.engine["secret"]},
        compound=SEC_WRITE_FLEET_WIDE)],
    ("api/v1/engine-principals/<str:principal_id>/transfer-owner", "POST"): [R(
        "Security", "Write", lambda w, t, c, tok: f"{EP}/engine:held/transfer-owner",
        body=lambda w, t, c, tok: {"new_owner": c.username}, compound=SEC_WRITE_FLEET_WIDE)],
    ("api/v1/engine-principals/<str:principal_id>/roles", "GET"): [R("EnginePrincipal", "Read",
                                                                     lambda w, t, c, tok: f"{EP}/engine:held/roles")],
    ("api/v1/engine-principals/<str:principal_id>/roles", "POST"): [R(
        "Security", "Write", lambda w, t, c, tok: f"{EP}/engine:held/roles", ok=201,
        body=lambda w, t, c, tok: {"role": "Approver"}, compound=SEC_WRITE_FLEET_WIDE)],
    ("api/v1/engine-principals/<str:principal_id>/roles/<str:role>", "DELETE"): [R(
        "Security", "Write", lambda w, t, c, tok: f"{EP}/engine:held/roles/Viewer", compound=SEC_WRITE_FLEET_WIDE)],
    ("api/v1/access-reviews/export", "GET"): [R("AccessReview", "Read", lambda w, t, c, tok: f"{AR}/export"),
                                              R("AccessReview", "Read", lambda w, t, c, tok: f"{AR}/export?format=csv",
                                                label="csv")],
    ("api/v1/access-reviews", "GET"): [R("AccessReview", "Read", lambda w, t, c, tok: AR)],
    ("api/v1/access-reviews", "POST"): [R("AccessReview", "Attest", lambda w, t, c, tok: AR, ok=201,
                                          body=lambda w, t, c, tok: {"title": "matrix"})],
    ("api/v1/access-reviews/<str:campaign_id>", "GET"): [R("AccessReview", "Read",
                                                          lambda w, t, c, tok: f"{AR}/{w.engine['campaign']}")],
    ("api/v1/access-reviews/<str:campaign_id>/attestations", "POST"): [R(
        "AccessReview", "Attest", lambda w, t, c, tok: f"{AR}/{w.engine['campaign']}/attestations",
        body=lambda w, t, c, tok: {"principal_type": "user", "principal_id": "zed", "role_name": "Administrator",
                                   "decision": "flagged_revoke"})],
    ("api/v1/access-reviews/<str:campaign_id>/close", "POST"): [R(
        "AccessReview", "Attest", lambda w, t, c, tok: f"{AR}/{w.engine['campaign']}/close")],
    # an allowed rotation meets the world's minutes-old KEK: 429 (the rotation interval), after every check
    ("api/v1/secrets/kek/rotate", "POST"): [R("Security", "Write", lambda w, t, c, tok: "/api/v1/secrets/kek/rotate",
                                              ok=429, compound=SEC_WRITE_FLEET_WIDE)],
    ("api/v1/secrets/kek/rewrap", "POST"): [R("Security", "Write", lambda w, t, c, tok: "/api/v1/secrets/kek/rewrap",
                                              compound=SEC_WRITE_FLEET_WIDE)],
    ("api/v1/secrets/kek/status", "GET"): [R("Security", "Read", lambda w, t, c, tok: "/api/v1/secrets/kek/status",
                                             compound=fleet_wide("Security", "Read"))],
})
#: routes anyone may call, with or without a credential (probes, metrics, and the API's own description)
PUBLIC = {("healthz", "GET"), ("readyz", "GET"), ("metrics", "GET"),
          ("api/v1/ca/root", "GET"), ("api/v1/ca/crl", "GET")}  # what agents and signers trust: public by design
ANONYMOUS_OK = PUBLIC | {("api/v1/openapi.json", "GET"), ("api/v1/openapi.yaml", "GET"), ("api/v1/docs", "GET")}
#: the OAuth 2.1 authorization server (oauth/): protocol endpoints whose answers to a bare GET the RFCs fix —
#: discovery documents are public, an authorize request without client_id is a 400, token / registration /
#: revocation are POST-only. An API token changes none of it (their rules: tests/test_oauth*.py).
OAUTH = {(".well-known/oauth-protected-resource", "GET"): 200,
         (".well-known/oauth-protected-resource/mcp/v1", "GET"): 200,
         (".well-known/oauth-protected-resource/mcp/v1/", "GET"): 200,
         (".well-known/oauth-protected-resource/mcp/bridge", "GET"): 200,
         (".well-known/oauth-protected-resource/mcp/bridge/", "GET"): 200,
         (".well-known/oauth-authorization-server", "GET"): 200,
         ("oauth/authorize", "GET"): 400, ("oauth/token", "GET"): 405, ("oauth/register", "GET"): 405,
         ("oauth/revoke", "GET"): 405}
#: the hook sink takes a bridge worker's own token only: every API token is refused as a credential (401)
WORKER_ONLY = {("api/v1/bridge/members/<str:pane_id>/events", "POST"): "/api/v1/bridge/members/%25999999/events"}
#: the agents' upload routes take an upload grant or session secret only (operations.api): an API token is no
#: credential there, and without one a GET answers as the protocol fixes (405 on the POST/PUT-only routes,
#: 401 session_unknown on the session's status); their own rules: tests/operations/test_uploads.py
UPLOAD_AGENT = {("api/v1/uploads", "GET"): 405, ("api/v1/uploads/<str:upload_id>", "GET"): 401,
                ("api/v1/uploads/<str:upload_id>/chunk", "GET"): 405,
                ("api/v1/uploads/<str:upload_id>/commit", "GET"): 405}
#: the admin is for people: an OTP-verified session. Its pages redirect anyone else to the login page;
#: only these answer without one (setting up one's authenticator asks for the password itself).
ADMIN_OPEN = {"admin/login/", "admin/logout/", "admin/jsi18n/", "admin/enrol/"}
EXPECTED_STATUS = {TIER: 403, RBAC: 403, APPROVAL: 403, HIDDEN: 404}
#: every caller with an untiered token, and the tiers with three callers (the most permissions, a group-scoped
#: one, a reader) — the tier check is one function for every route; YUZU_FUZZ=full (make fuzz) runs all 40; and
#: the service-scoped callers
REST_CALLERS = [(c, t) for c in CALLERS for t in TIERS
                if t == "" or os.environ.get("YUZU_FUZZ") == "full"
                or c in (Caller("Administrator"), Caller("ITServiceOwner", on_group=True), Caller("Viewer"))]
REST_PAIRS = REST_CALLERS + SERVICE_PAIRS


def url_routes():
    """Every (route, method) of the URLconf: the admin's patterns, and the REST and probe routes with the
    methods their views accept."""
    out = []

    def walk(patterns, prefix):
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                route = prefix + str(p.pattern)
                cls = getattr(p.callback, "cls", None)
                methods = [m.upper() for m in ("get", "post", "put", "patch", "delete") if hasattr(cls, m)] \
                    if cls is not None else ["GET"]
                out.extend((route, m) for m in methods)

    walk(get_resolver().url_patterns, "")
    return out


def admin_path(route):
    """A concrete path for an admin URL pattern (converters and the app-list/catch-all regexes filled in)."""
    route = re.sub(r"<[^>]+>", "1", route)
    route = re.sub(r"\(\?P<app_label>([^|)]+)[^)]*\)", r"\1", route)
    route = route.replace("(?P<url>.*)", "no-such-page/")
    return "/" + route.replace("^", "").replace("$", "")


def rest_call(client, method, path, body, raw):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {raw}"} if raw else {}
    with transaction.atomic():
        if method == "GET":
            r = client.get(path, **headers)
        else:
            r = getattr(client, method.lower())(path, body if body is not None else {}, content_type="application/json",
                                                **headers)
        transaction.set_rollback(True)
    return r


def _json(r):
    """The JSON body (an error envelope is JSON on the CSV export's path too), or {}."""
    if r.get("Content-Type", "").startswith("application/json") or r.content.startswith(b'{"error"'):
        return json.loads(r.content)
    return {}


def rest_outcome(r, row):
    if r.status_code == row.ok:
        body = _json(r)
        data = body.get("data") if isinstance(body, dict) else None
        if isinstance(data, dict) and data.get("status") == "no_agents_reached":
            return HIDDEN
        return ALLOW
    if r.status_code == 403 and "scope_service" in (_json(r).get("error") or {}):
        return SCOPE
    for outcome, status in EXPECTED_STATUS.items():
        if r.status_code == status:
            return "forbidden" if status == 403 else outcome
    return f"HTTP {r.status_code}"


def rest_answer(r, w, target):
    """What a caller reads in a REST answer, the target's own ids and what differs on every call left out."""
    return r.status_code, _normalise(str(_stable(_json(r))), w, target)


@pytest.mark.timeout(900)  # every route × 28 callers, and the OpenAPI document built per caller: minutes on a busy host
def test_rest_matrix():
    routes = url_routes()
    api = [(r, m) for r, m in routes if not r.startswith("admin/")]
    rows = [(f"{m} {r}", "-", "-", "-", "a row in REST / PUBLIC / WORKER_ONLY", "no row")
            for r, m in api if (r, m) not in REST and (r, m) not in PUBLIC and (r, m) not in WORKER_ONLY
            and (r, m) not in OAUTH and (r, m) not in UPLOAD_AGENT]
    rows += [(f"{m} {r}", "-", "-", "-", "a route", "no such route") for r, m in set(REST) - set(api)]
    w = build_world(pairs=SERVICE_PAIRS)
    client = Client()
    cells = 0
    for caller, tier in REST_PAIRS:
        token, raw = w.token_of(caller, tier)
        for (route, method), variants in sorted(REST.items()):
            for row in variants:
                if caller.service and row.rule.service == "open" and (caller, tier) != SERVICE_PAIRS[0]:
                    continue  # a route anyone may call looks at no token: one scoped caller shows it (and each
                    # call renders the whole API description, ~3 s of the matrix per caller)
                read = {}
                for target in row.targets(caller):
                    cells += 1
                    want = expected(row.rule, tier, caller, target, face="rest")
                    want = "forbidden" if want in (TIER, RBAC, APPROVAL) else want
                    body = row.body(w, target, caller, token) if row.body else None
                    r = rest_call(client, method, row.path(w, target, caller, token), body, raw)
                    got = rest_outcome(r, row)
                    if got != want:
                        rows.append((f"{method} {route}{' ' + row.label if row.label else ''}", str(caller),
                                     tier or "untiered", target or "-", want,
                                     f"{got} {r.content[:90].decode(errors='replace')}"))
                    if caller.service and row.rule.service != "open":
                        read[target] = rest_answer(r, w, target)
                        if target != SVC and w.agents[SVC] in str(read[target]):
                            rows.append((f"{method} {route}", str(caller), tier or "untiered", target or "-",
                                         "nothing of another service's device", str(read[target])[:100]))
                # another service's device reads exactly like one that does not exist
                if SVC in read and read[SVC] != read[GHOST]:
                    rows.append((f"{method} {route}", str(caller), tier or "untiered", "svc vs ghost",
                                 "the same answer", f"{str(read[SVC])[:60]!r} vs {str(read[GHOST])[:60]!r}"))
    # Without a credential: 401 everywhere but the probes; the hook sink refuses API tokens.
    token, raw = w.token_of(Caller("Administrator"), "")
    for route, method in api:
        path = REST[(route, method)][0].path(w, IN, Caller("Administrator"), token) if (route, method) in REST \
            else WORKER_ONLY.get((route, method), "/" + route)
        r = rest_call(client, method, path, None, None)
        cells += 1
        want = OAUTH.get((route, method)) or UPLOAD_AGENT.get((route, method)) or \
            (200 if (route, method) in ANONYMOUS_OK else 401)
        if r.status_code != want:
            rows.append((f"{method} {route}", "anonymous", "-", "-", want, r.status_code))
        if (route, method) in OAUTH or (route, method) in UPLOAD_AGENT:
            r = rest_call(client, method, path, None, raw)
            cells += 1
            if r.status_code != want:
                rows.append((f"{method} {route}", "Administrator's API token", "-", "-", want, r.status_code))
        if (route, method) in WORKER_ONLY:
            r = rest_call(client, method, path, {}, raw)
            cells += 1
            if r.status_code != 401:
                rows.append((f"{method} {route}", "API token", "-", "-", 401, r.status_code))
    # The admin is for people: without an OTP-verified session every page redirects to the login page.
    for route, _method in routes:
        if not route.startswith("admin/") or route in ADMIN_OPEN:
            continue
        cells += 1
        r = rest_call(client, "GET", admin_path(route), None, raw)
        if r.status_code != 302 or "/admin/login/" not in r.get("Location", ""):
            rows.append((f"GET {route}", "Administrator's token", "-", "-", "302 to /admin/login/", r.status_code))
    if rows:
        pytest.fail(f"{len(rows)} of {cells} REST cells disagree with the rule table:\n" + mismatch_table(rows),
                    pytrace=False)


@pytest.mark.django_db(transaction=True)
def test_matrix_sample_through_http():
    """The matrix calls mcp.server.handle; over HTTP (the ASGI app) a group-scoped caller's read cells and a
    tier refusal answer the same."""
    caller, tier = Caller("ITServiceOwner", on_group=True), "readonly"
    w = build_world([caller], [tier])
    token, raw = w.token_of(caller, tier)
    client = McpClient(raw)
    client.initialize()
    rows = []
    for name, variants in sorted(V1.items()):
        for variant in variants:
            if variant.rule.operation != "Read" and name != "set_tag":
                continue  # reads only (this test commits), plus one write the tier refuses
            for target in variant.targets(caller):
                want = expected(variant.rule, tier, caller, target)
                r = client.call(name, variant.args(w, target, caller, token))
                assert r.status == 200, r.body
                got = classify(type("Reply", (), {"body": r.json()})(), "v1")[0]
                if got != want:
                    rows.append((name, str(caller), tier, target or "-", want, got))
    assert not rows, mismatch_table(rows)


@pytest.mark.parametrize("shut_out", ["locked by an administrator", "deactivated"])
def test_a_shut_out_callers_token_is_refused_by_every_tool_and_route(shut_out):
    """The credential's rows: an Administrator's token (every cell allowed otherwise) whose owner an administrator
    locked (yuzu.accounts.lock_account) or deactivated is refused by every tool of both catalogues in both eras —
    with a session opened before — and by every REST route that takes a token: -32001 / 401, before anything runs.
    (Before, a lock left every one of them open.)"""
    from django.contrib.auth import get_user_model

    from yuzu.accounts import lock_account
    from yuzu.rbac import Principal

    caller = Caller("Administrator")
    w = build_world([caller], [""])
    token, raw = w.token_of(caller, "")
    sessions = {cat: open_session(raw, cat) for cat in TABLES}
    if shut_out == "deactivated":
        get_user_model().objects.filter(username=caller.username).update(is_active=False)
    else:
        zed = Principal(user=get_user_model().objects.get(username="zed"), via="session")
        lock_account(zed, caller.username, timezone.now() + timedelta(hours=1))
    rows, cells = [], 0
    for cat_name in TABLES:
        for sid in (sessions[cat_name], MODERN):
            for name in sorted(catalogue(cat_name).tools):
                cells += 1
                out = call(raw, sid, cat_name, name, {})
                err = (getattr(out, "body", None) or {}).get("error") or {}
                if err.get("code") != -32001 or out.status != 401:
                    rows.append((name, shut_out, cat_name, "modern" if sid is MODERN else "legacy", "-32001 / 401",
                                 f"{err.get('code')} {getattr(out, 'status', type(out).__name__)}"))
    client = Client()
    for (route, method), variants in sorted(REST.items()):
        if (route, method) in ANONYMOUS_OK or variants[0].rule.service == "open":
            continue
        cells += 1
        r = rest_call(client, method, variants[0].path(w, IN, caller, token), None, raw)
        if r.status_code != 401:
            rows.append((f"{method} {route}", shut_out, "rest", "-", 401, r.status_code))
    assert cells > 150
    assert not rows, mismatch_table(rows)


# --- what the matrix found, one story each (each failed before its fix) --------------------------------

def _mcp(w, caller, tier, cat="v1"):
    token, raw = w.token_of(caller, tier)
    return lambda name, args: classify(call(raw, open_session(raw, cat), cat, name, args), cat)


def test_a_group_owner_cannot_widen_its_own_group():
    """ITServiceOwner on one group held ManagementGroup:Write there, and the services never asked which
    group: it could point its group's scope at the whole fleet (or add another group's device to it) and
    so gain Execution:Execute everywhere. Changing membership now needs a fleet-wide grant."""
    owner = Caller("ITServiceOwner", on_group=True)
    w = build_world([owner], [""])
    mcp = _mcp(w, owner, "")
    widen = {"group_id": w.groups[IN], "membership_type": "dynamic", "scope_expression": "ostype == linux"}
    assert mcp("update_management_group", widen)[0] == RBAC
    assert mcp("add_management_group_member", {"group_id": w.groups[IN], "agent_id": w.agents[OUT]})[0] == RBAC
    assert mcp("create_management_group", {"name": "mine", "parent_id": w.groups[IN],
                                           "membership_type": "dynamic", "scope_expression": "__all__"})[0] == RBAC
    assert mcp("update_management_group", {"group_id": w.groups[OUT], "description": "x"})[0] == HIDDEN
    token, raw = w.token_of(owner, "")
    r = Client().put(f"/api/v1/management-groups/{w.groups[OUT]}", {"description": "x"},
                     content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 404  # the same answer as over MCP: another group reads as absent


def test_a_group_owner_grants_only_roles_within_its_own():
    """A probe: ITServiceOwner on one group granted itself Approver there — Approval:Read and Approval:Approve,
    which it never held — and then read other users' tickets. A grantor now passes on only the permissions it
    holds on that group itself."""
    owner = Caller("ITServiceOwner", on_group=True)
    w = build_world([owner], [""])
    mcp = _mcp(w, owner, "")
    token, raw = w.token_of(owner, "")
    me = token.owner.get_username()
    escalate = {"group_id": w.groups[IN], "username": me, "role": "Approver"}
    got, message = mcp("assign_management_group_role", escalate)
    assert got == RBAC and "Approval:" in message, message
    r = Client().post(f"/api/v1/management-groups/{w.groups[IN]}/roles", {"username": me, "role": "Approver"},
                      content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 403 and "you may grant there only roles" in r.json()["error"]["message"]
    assert not RoleAssignment.objects.filter(role__name="Approver").exists()
    # Viewer too: it reads approval tickets and plugin configuration, which an ITServiceOwner does not
    got, message = mcp("assign_management_group_role", {"group_id": w.groups[IN], "username": "zed", "role": "Viewer"})
    assert got == RBAC and "Approval:Read" in message, message
    assert mcp("assign_management_group_role", {"group_id": w.groups[IN], "username": "zed",
                                                "role": "ITServiceOwner"})[0] == ALLOW  # within its own


def test_a_role_held_only_on_a_group_is_named_when_its_permission_must_be_fleet_wide():
    """A probe: ITServiceOwner on one group asked a Policy read and was told "none of your roles grants it; built-in
    roles that do: …, ITServiceOwner" — the role it holds. The refusal now says the grant must be fleet-wide."""
    owner = Caller("ITServiceOwner", on_group=True)
    w = build_world([owner], [""])
    got, message = _mcp(w, owner, "")("list_policies", {})
    assert got == RBAC and message == ("permission denied: Policy:Read must be held fleet-wide; your role(s) "
                                       "ITServiceOwner carry it only on management groups, where it grants nothing")


def test_a_group_grant_gives_nothing_on_securables_that_are_no_groups():
    """A Viewer held on one group read the whole audit log (and listed its tokens) over MCP, while REST
    refused: a grant on a group now counts only for device-scoped securables, on both faces."""
    viewer = Caller("Viewer", on_group=True)
    w = build_world([viewer], ["readonly"])
    mcp = _mcp(w, viewer, "readonly")
    assert mcp("query_audit_log", {})[0] == RBAC
    assert mcp("list_api_tokens", {})[0] == RBAC
    assert mcp("list_agents", {})[0] == ALLOW
    token, raw = w.token_of(viewer, "readonly")
    sid = open_session(raw, "v1")
    read = handle(Request("POST", _headers(raw, sid), {}, "v1", {"jsonrpc": "2.0", "id": 2, "method": "resources/read",
                                                                  "params": {"uri": "yuzu://audit/recent"}}))
    assert read.body["error"]["code"] == -32003


def test_server_health_counts_only_the_agents_the_caller_reads():
    """yuzu://server/health counted every connected agent of the install for anyone holding Infrastructure:Read
    somewhere: a Viewer held on one group learned how many devices the other groups have connected (its
    get_fleet_posture_fast and list_agents count its own)."""
    viewer = Caller("Viewer", on_group=True)
    w = build_world([viewer], ["readonly"])
    token, raw = w.token_of(viewer, "readonly")
    sid = open_session(raw, "v1")
    read = handle(Request("POST", _headers(raw, sid), {}, "v1", {"jsonrpc": "2.0", "id": 2, "method": "resources/read",
                                                                  "params": {"uri": "yuzu://server/health"}}))
    health = json.loads(read.body["result"]["contents"][0]["text"])
    assert health == {"status": "ok", "agents_connected": 2}  # in-1 and in-2, never out-1


def test_an_execution_in_another_group_reads_as_absent_everywhere():
    """summarize_working_set(kind=execution) and query_responses named another group's execution by id:
    the summary showed its responses (agent ids, statuses, exit codes); the query its status."""
    viewer = Caller("Viewer", on_group=True)
    w = build_world([viewer], ["readonly"])
    mcp = _mcp(w, viewer, "readonly")
    for name, args in (("summarize_working_set", {"kind": "execution", "id": w.executions[OUT]}),
                       ("query_responses", {"execution_id": w.executions[OUT]}),
                       ("aggregate_responses", {"execution_id": w.executions[OUT], "group_by": "status"})):
        got, message = mcp(name, args)
        assert (got, message) == (HIDDEN, f"Execution not found: {w.executions[OUT]}"), name
    assert mcp("summarize_working_set", {"kind": "execution", "id": w.executions[IN]})[0] == ALLOW


def test_rest_honours_the_tier_where_a_view_had_no_rbac_gate():
    """POST …/management-groups/{id}/roles and POST …/approvals/{id}/withdraw skipped rbac.check, so the
    token's tier was never asked: a readonly (or supervised, skipping its approval) token granted roles."""
    admin = Caller("Administrator")
    w = build_world([admin], ["readonly", "supervised"])
    c = Client()
    for tier in ("readonly", "supervised"):
        raw = w.token_of(admin, tier)[1]
        r = c.post(f"/api/v1/management-groups/{w.groups[IN]}/roles", {"username": "zed", "role": "ITServiceOwner"},
                   content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
        assert r.status_code == 403, (tier, r.content)
    raw = w.token_of(admin, "readonly")[1]
    r = c.post(f"/api/v1/approvals/{w.own_tickets[admin.username]}/withdraw", {}, content_type="application/json",
               HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 403 and "tier" in r.json()["error"]["message"]
