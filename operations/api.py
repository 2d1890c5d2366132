"""REST faces of the operator surface (spec/operator.md): the twins of the MCP tools (same schemas, same
service functions), schedule CRUD, the licence decommission, and the agents' upload routes (no MCP twins;
authenticated by the grant and session secrets, not by a bearer token)."""

from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.decorators import api_view

from mcp.schema import boolean, enum, integer, obj, string
from yuzu import jsondata, rbac
from yuzu.api.contract import contract, payload, tool_input, tool_output
from yuzu.api.envelope import cid_of, error_body, ok
from yuzu.api.views import int_param, principal_of
from yuzu.errors import YuzuError

from . import inventory, plugins, schedules, uploads
from .models import InstructionSchedule

VALUE = obj({"value": string(8192, "The value")}, ["value"])
SECRET = obj({"value": string(65536, "The secret", minLength=1)}, ["value"])
SWITCH = obj({"enabled": boolean(), "reason": string(512)}, ["enabled"])
MINT = tool_input("mint_upload_grant")
SCHEDULE = obj({"name": string(200, minLength=1), "definition_id": string(128, minLength=1),
                "frequency_type": enum(InstructionSchedule.Frequency.values),
                "interval_minutes": integer(1, 525600), "time_of_day": string(5, pattern="^([01][0-9]|2[0-3]):[0-5][0-9]$"),
                "time_zone": string(64), "day_of_week": integer(0, 6), "day_of_month": integer(1, 28),
                "start_at": string(40, "ISO 8601 with zone (a 'once' schedule's time)"),
                "scope_expression": string(8192), "parameters": {"type": "object", "maxProperties": 32,
                                                                 "additionalProperties": string(65536)},
                "requires_approval": boolean(), "enabled": boolean()}, ["name", "definition_id", "frequency_type"])
ENABLE = obj({"enabled": boolean()}, ["enabled"])


# --- plugin configuration ------------------------------------------------------------------------

@contract("GET", "Plugin configuration values (?plugin=)", response=tool_output("list_plugin_config"),
          query=[("plugin", str, "one plugin")])
@api_view(["GET"])
def config_list(request):
    p = principal_of(request)
    rbac.check(p, "PluginConfig", "Read", any_scope=True)
    return ok(plugins.list_plugin_config(p, request.query_params.get("plugin")))


@contract("GET", "One plugin configuration value", response=tool_output("get_plugin_config"))
@contract("PUT", "Set one plugin configuration value", body=VALUE, response=tool_output("set_plugin_config"))
@contract("DELETE", "Delete one plugin configuration value", response=tool_output("delete_plugin_config"))
@api_view(["GET", "PUT", "DELETE"])
def config_detail(request, plugin, key):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "PluginConfig", "Read", any_scope=True)
        return ok(plugins.get_plugin_config(p, plugin, key))
    if request.method == "PUT":
        rbac.check(p, "PluginConfig", "Write", any_scope=True)
        d = payload(request, VALUE)
        return ok(plugins.set_plugin_config(p, plugin, key, d["value"], cid=cid_of(request), surface="rest"))
    rbac.check(p, "PluginConfig", "Delete", any_scope=True)
    return ok(plugins.delete_plugin_config(p, plugin, key, cid=cid_of(request), surface="rest"))


@contract("PUT", "Store a plugin secret (write-only)", body=SECRET, response=tool_output("set_plugin_secret"))
@contract("DELETE", "Delete a plugin secret", response=tool_output("delete_plugin_secret"))
@api_view(["PUT", "DELETE"])
def secret_detail(request, plugin, key):
    p = principal_of(request)
    if request.method == "PUT":
        rbac.check(p, "PluginSecret", "Write", any_scope=True)
        d = payload(request, SECRET)
        return ok(plugins.set_plugin_secret(p, plugin, key, d["value"], cid=cid_of(request), surface="rest"))
    rbac.check(p, "PluginSecret", "Delete", any_scope=True)
    return ok(plugins.delete_plugin_secret(p, plugin, key, cid=cid_of(request), surface="rest"))


SWITCH_QUERY = [("action", str, "one action"), ("group", str, "a management group id or name (its own switch)")]


@contract("GET", "A plugin's kill switch (?action=&group=)", response=tool_output("get_plugin_kill_switch"),
          query=SWITCH_QUERY)
@contract("PUT", "Flip a plugin's kill switch (?action=&group=)", body=SWITCH,
          response=tool_output("set_plugin_kill_switch"), query=SWITCH_QUERY)
@api_view(["GET", "PUT"])
def kill_switch(request, plugin):
    p = principal_of(request)
    action, group = request.query_params.get("action", ""), request.query_params.get("group", "")
    if request.method == "GET":
        rbac.check(p, "PluginConfig", "Read", any_scope=True)
        return ok(plugins.get_plugin_kill_switch(p, plugin, action, group))
    rbac.check(p, "PluginConfig", "Write", any_scope=True)
    d = payload(request, SWITCH)
    return ok(plugins.set_plugin_kill_switch(p, plugin, d["enabled"], action, d.get("reason", ""), group,
                                             cid=cid_of(request), surface="rest"))


# --- upload grants (operator) --------------------------------------------------------------------

@contract("GET", "Upload grants (no secrets)", response=tool_output("list_upload_grants"))
@contract("POST", "Mint an upload grant", body=MINT, response=tool_output("mint_upload_grant"), status=201)
@api_view(["GET", "POST"])
def grants(request):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "UploadGrant", "Read", any_scope=True)
        return ok(uploads.list_upload_grants(p))
    rbac.check(p, "UploadGrant", "Write", any_scope=True)
    return ok(uploads.mint_upload_grant(p, cid=cid_of(request), **payload(request, MINT)), status=201)


@contract("DELETE", "Revoke an unredeemed upload grant", response=tool_output("revoke_upload_grant"))
@api_view(["DELETE"])
def grant_detail(request, grant_id):
    p = principal_of(request)
    rbac.check(p, "UploadGrant", "Delete", any_scope=True)
    return ok(uploads.revoke_upload_grant(p, grant_id, cid=cid_of(request)))


# --- the agents' upload routes -------------------------------------------------------------------

def _refused(request, exc):
    body = error_body(exc.status, exc.message, cid_of(request), reason=exc.reason, **exc.extra)
    return JsonResponse(body, status=exc.status)


def _tls(request):
    """TLS is required; plain HTTP only from the loopback interface when YUZU_UPLOAD_ALLOW_LOOPBACK_HTTP."""
    if request.is_secure():
        return None
    loopback = request.META.get("REMOTE_ADDR", "") in ("127.0.0.1", "::1")
    if loopback and getattr(settings, "YUZU_UPLOAD_ALLOW_LOOPBACK_HTTP", True):
        return None
    return uploads.Refused(400, "tls_required", "uploads need HTTPS")


def _agent_route(fn):
    def view(request, *args, **kwargs):
        try:
            refusal = _tls(request)
            if refusal is not None:
                raise refusal
            status, data = fn(request, *args, **kwargs)
        except uploads.Refused as exc:
            return _refused(request, exc)
        return JsonResponse({"data": data, **data, "meta": {"api_version": "v1"}}, status=status)
    view.__name__ = fn.__name__
    return csrf_exempt(view)


def _json_body(request):
    try:
        body = jsondata.loads(request.body or b"{}")
    except (ValueError, RecursionError):  # RecursionError: nested far deeper than the parser's stack
        raise uploads.Refused(400, "bad_request", "the body must be JSON") from None
    if not isinstance(body, dict):
        raise uploads.Refused(400, "bad_request", "the body must be a JSON object")
    return body


@_agent_route
def upload_open(request):
    if request.method != "POST":
        raise uploads.Refused(405, "method_not_allowed", "POST redeems a grant")
    return 201, uploads.redeem(request.headers.get("X-Yuzu-Upload-Grant"))


@_agent_route
def upload_session(request, upload_id):
    credential = request.headers.get("X-Yuzu-Upload-Session")
    if request.method == "GET":
        return 200, uploads.status(upload_id, credential)
    if request.method == "DELETE":
        return 200, uploads.cancel(upload_id, credential)
    raise uploads.Refused(405, "method_not_allowed", "GET or DELETE")


@_agent_route
def upload_chunk(request, upload_id):
    if request.method != "PUT":
        raise uploads.Refused(405, "method_not_allowed", "PUT a chunk")
    length = request.META.get("CONTENT_LENGTH") or "0"
    if not (length.isascii() and length.isdigit()):
        raise uploads.Refused(400, "bad_request", "Content-Length must be a number of bytes")
    if int(length) > uploads.CHUNK_MAX:
        raise uploads.Refused(413, "chunk_too_large", f"a chunk may carry at most {uploads.CHUNK_MAX} bytes")
    return 200, uploads.write_chunk(upload_id, request.headers.get("X-Yuzu-Upload-Session"),
                                    request.headers.get("Content-Range"), request.body)


@_agent_route
def upload_commit(request, upload_id):
    if request.method != "POST":
        raise uploads.Refused(405, "method_not_allowed", "POST commits")
    return 200, uploads.commit(upload_id, request.headers.get("X-Yuzu-Upload-Session"),
                               _json_body(request).get("sha256"))


# --- schedules -----------------------------------------------------------------------------------

@contract("GET", "Instruction schedules (?enabled_only=)", response=tool_output("list_schedules"),
          query=[("enabled_only", bool, "only enabled ones")])
@contract("POST", "Create an instruction schedule", body=SCHEDULE, status=201)
@api_view(["GET", "POST"])
def schedule_list(request):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "Schedule", "Read", any_scope=True)
        only = request.query_params.get("enabled_only", "").lower() in ("1", "true", "yes")
        return ok(schedules.list_schedules(p, enabled_only=only, full=True))
    rbac.check(p, "Schedule", "Write", any_scope=True)
    return ok(schedules.create_schedule(p, payload(request, SCHEDULE), cid=cid_of(request)), status=201)


@contract("DELETE", "Delete an instruction schedule")
@api_view(["DELETE"])
def schedule_detail(request, schedule_id):
    p = principal_of(request)
    rbac.check(p, "Schedule", "Delete", any_scope=True)
    return ok(schedules.delete_schedule(p, schedule_id, cid=cid_of(request)))


@contract("POST", "Enable or disable an instruction schedule", body=ENABLE)
@api_view(["POST"])
def schedule_enable(request, schedule_id):
    p = principal_of(request)
    rbac.check(p, "Schedule", "Write", any_scope=True)
    return ok(schedules.enable_schedule(p, schedule_id, payload(request, ENABLE)["enabled"], cid=cid_of(request)))


# --- software inventory and licences -------------------------------------------------------------

@contract("GET", "Installed software across devices (?name=&agent_id=&version=&version_op=&counts=)",
          response=tool_output("query_installed_software"),
          query=[("name", str, "exact"), ("agent_id", str, "exact"), ("version", str, ""), ("version_op", str, ""),
                 ("source", str, ""), ("counts", bool, ""), ("limit", int, "1-1000, default 100")])
@api_view(["GET"])
def software_view(request):
    p = principal_of(request)
    rbac.check(p, "Inventory", "Read", any_scope=True, confined=True)
    q = request.query_params
    op = q.get("version_op")
    if op is not None and op not in inventory.COMPARATORS:
        raise YuzuError(f"version_op must be one of {', '.join(inventory.COMPARATORS)}")
    if q.get("source") and q["source"] not in inventory.SOURCES:
        raise YuzuError(f"source must be one of {', '.join(inventory.SOURCES)}")
    return ok(inventory.query_installed_software(
        p, name=q.get("name"), agent_id=q.get("agent_id"), version=q.get("version"), version_op=op,
        source=q.get("source"), limit=int_param(request, "limit", 100, 1, 1000),
        counts=q.get("counts", "").lower() in ("1", "true"), cid=cid_of(request)))


@contract("GET", "Software licences detected on one device (user_ref included)",
          response=tool_output("query_software_licenses"))
@contract("DELETE", "Erase every per-agent inventory store of one device")
@api_view(["GET", "DELETE"])
def sle_agent(request, agent_id):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "SoftwareLicensing", "Read", any_scope=True, confined=True)
        return ok(inventory.query_software_licenses(p, agent_id, cid=cid_of(request), with_user=True,
                                                    surface="rest"))
    rbac.check(p, "SoftwareLicensing", "Delete", any_scope=True, confined=True)
    return ok(inventory.decommission_agent_inventory(p, agent_id, cid=cid_of(request)))
