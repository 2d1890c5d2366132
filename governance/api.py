"""REST twins of the governance tools (spec/governance.md): the same schemas validate the bodies and the same
service functions act. Writes are refused to an MCP token whose tier would gate them (rbac.check, surface
"rest"), and a browser session needs a fresh authenticator code (the services' step-up)."""

import time

from django.http import HttpResponse
from rest_framework.decorators import api_view
from rest_framework.negotiation import DefaultContentNegotiation

from mcp.schema import obj, string
from yuzu import rbac
from yuzu.api.contract import contract, payload, tool_input, tool_output
from yuzu.api.envelope import cid_of, ok
from yuzu.api.views import principal_of
from yuzu.errors import YuzuError
from yuzu.metrics import (
    ACCESS_REVIEW_ATTESTATIONS,
    ACCESS_REVIEW_CAMPAIGNS_OPENED,
    ACCESS_REVIEW_EXPORT,
    ACCESS_REVIEW_EXPORT_SECONDS,
)

from . import engines, kek, reviews
from .models import ENGINE_PREFIX

CREATE = obj({"slug": string(120, "The id without 'engine:' (the server adds it)", minLength=1,
                             pattern="^[a-z0-9._-]+$"),
              **{k: v for k, v in tool_input("create_engine_principal")["properties"].items() if k != "principal_id"}},
             ["slug", "display_name", "owner_username", "justification", "classification"])
MINT = obj({k: v for k, v in tool_input("mint_engine_credential")["properties"].items() if k != "principal_id"})
ROTATE = obj({k: v for k, v in tool_input("rotate_engine_credential")["properties"].items() if k != "principal_id"})
CONFIRM = obj({k: v for k, v in tool_input("confirm_engine_rotation")["properties"].items() if k != "principal_id"},
              ["token_id", "secret"])
TRANSFER = obj({"new_owner": tool_input("transfer_engine_principal_owner")["properties"]["new_owner"]}, ["new_owner"])
REVOKE = obj({k: v for k, v in tool_input("revoke_engine_principal")["properties"].items() if k != "principal_id"})
ASSIGN = obj({"role": tool_input("assign_engine_role")["properties"]["role"]}, ["role"])
OPEN = tool_input("open_access_review")
ATTEST = obj({k: v for k, v in tool_input("record_attestation")["properties"].items() if k != "campaign_id"},
             ["principal_type", "principal_id", "role_name", "decision"])


def _check(request, securable, operation):
    p = principal_of(request)
    rbac.check(p, securable, operation, any_scope=securable == "Security")
    return p


def _slug(principal_id):
    if not principal_id.startswith(ENGINE_PREFIX):
        raise YuzuError(f"engine principal not found: {principal_id}", status=404)
    return principal_id.removeprefix(ENGINE_PREFIX)


# --- engine principals ------------------------------------------------------------------------------

@contract("GET", "Engine principals with their active credential counts", response=tool_output("list_engine_principals"))
@contract("POST", "Register an engine principal", body=CREATE, response=tool_output("create_engine_principal"),
          status=201)
@api_view(["GET", "POST"])
def engine_principals_view(request):
    if request.method == "GET":
        p = _check(request, "EnginePrincipal", "Read")
        include = request.query_params.get("include_revoked", "true").lower() != "false"
        return ok(engines.list_engine_principals(p, include))
    p = _check(request, "Security", "Write")
    d = payload(request, CREATE)
    args = {**{k: v for k, v in d.items() if k != "slug"}, "principal_id": ENGINE_PREFIX + d["slug"]}
    plan = engines.plan_create_engine_principal(p, args)
    return ok(engines.create_engine_principal(p, cid=cid_of(request), plan=plan), status=201)


@contract("GET", "One engine principal (active_credentials is an array here)",
          response=tool_output("get_engine_principal"))
@contract("DELETE", "Revoke an engine principal and all its credentials (irreversible)", body=REVOKE,
          response=tool_output("revoke_engine_principal"))
@api_view(["GET", "DELETE"])
def engine_principal_detail(request, principal_id):
    if request.method == "GET":
        p = _check(request, "EnginePrincipal", "Read")
        return ok(engines.get_engine_principal(p, principal_id, rest=True))
    p = _check(request, "Security", "Write")
    d = payload(request, REVOKE)
    plan = engines.plan_revoke_engine_principal(p, principal_id, d.get("reason", ""), d.get("superseded_by", ""))
    return ok(engines.revoke_engine_principal(p, cid=cid_of(request), plan=plan))


@contract("POST", "Mint an engine principal's first credential (shown once)", body=MINT,
          response=tool_output("mint_engine_credential"), status=201)
@api_view(["POST"])
def engine_credentials_view(request, principal_id):
    p = _check(request, "Security", "Write")
    d = payload(request, MINT)
    plan = engines.plan_mint_engine_credential(p, principal_id, d.get("name", ""), d.get("ttl_days", 90))
    return ok(engines.mint_engine_credential(p, cid=cid_of(request), plan=plan), status=201)


@contract("POST", "Start an overlap rotation of an engine credential", body=ROTATE,
          response=tool_output("rotate_engine_credential"), status=201)
@api_view(["POST"])
def engine_rotate_view(request, principal_id):
    p = _check(request, "Security", "Write")
    d = payload(request, ROTATE)
    plan = engines.plan_rotate_engine_credential(p, principal_id, d.get("overlap_days", 7))
    return ok(engines.rotate_engine_credential(p, cid=cid_of(request), plan=plan), status=201)


@contract("POST", "Confirm a rotation (revokes the predecessor)", body=CONFIRM,
          response=tool_output("confirm_engine_rotation"))
@api_view(["POST"])
def engine_confirm_view(request, principal_id):
    p = _check(request, "Security", "Write")
    d = payload(request, CONFIRM)
    plan = engines.plan_confirm_engine_rotation(p, principal_id, d["token_id"], d["secret"])
    return ok(engines.confirm_engine_rotation(p, cid=cid_of(request), plan=plan))


@contract("POST", "Transfer an engine principal to another owner", body=TRANSFER,
          response=tool_output("transfer_engine_principal_owner"))
@api_view(["POST"])
def engine_transfer_view(request, principal_id):
    p = _check(request, "Security", "Write")
    d = payload(request, TRANSFER)
    plan = engines.plan_transfer_engine_principal_owner(p, principal_id, d["new_owner"])
    return ok(engines.transfer_engine_principal_owner(p, cid=cid_of(request), plan=plan))


@contract("GET", "Prove no engine principal holds admin", response=tool_output("audit_engine_no_admin"))
@api_view(["GET"])
def engine_no_admin_view(request):
    p = _check(request, "AuditLog", "Read")
    include = request.query_params.get("include_revoked", "true").lower() != "false"
    return ok(engines.audit_engine_no_admin(p, include))


@contract("GET", "An engine principal's roles", response=tool_output("list_engine_roles"))
@contract("POST", "Grant a non-admin role fleet-wide", body=ASSIGN, response=tool_output("assign_engine_role"),
          status=201)
@api_view(["GET", "POST"])
def engine_roles_view(request, principal_id):
    if request.method == "GET":
        p = _check(request, "EnginePrincipal", "Read")
        return ok(engines.list_engine_roles(p, _slug(principal_id)))
    p = _check(request, "Security", "Write")
    d = payload(request, ASSIGN)
    plan = engines.plan_assign_engine_role(p, _slug(principal_id), d["role"])
    return ok(engines.assign_engine_role(p, cid=cid_of(request), plan=plan), status=201)


@contract("DELETE", "Remove a role from an engine principal", response=tool_output("unassign_engine_role"))
@api_view(["DELETE"])
def engine_role_detail(request, principal_id, role):
    p = _check(request, "Security", "Write")
    plan = engines.plan_unassign_engine_role(p, _slug(principal_id), role)
    return ok(engines.unassign_engine_role(p, cid=cid_of(request), plan=plan))


# --- access reviews ---------------------------------------------------------------------------------

class FormatIsOurs(DefaultContentNegotiation):
    """``?format=`` is the export's own parameter (json | csv, a 400 otherwise), not DRF's renderer switch: every
    response DRF renders here — the JSON export and any error — is JSON; the view writes the CSV itself."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


@contract("GET", "Access-review evidence: every principal's direct grants (or a campaign's rows), with sha256",
          response=tool_output("export_access_review"),
          query=[("format", str, "json (default) or csv"), ("campaign_id", str, "a campaign's frozen rows")],
          also={"text/csv": {"type": "string", "description": "with ?format=csv: the rows, then # sha256=…"}})
@api_view(["GET"])
def access_review_export_view(request):
    p = _check(request, "AccessReview", "Read")
    fmt = request.query_params.get("format", "json")
    if fmt not in ("json", "csv"):
        raise YuzuError("format must be json or csv")
    started = time.perf_counter()
    doc = reviews.export_access_review(p, request.query_params.get("campaign_id") or None, cid=cid_of(request),
                                       fmt=fmt)
    ACCESS_REVIEW_EXPORT.labels(fmt).inc()
    ACCESS_REVIEW_EXPORT_SECONDS.observe(time.perf_counter() - started)
    if fmt == "csv":
        resp = HttpResponse(reviews.to_csv(doc), content_type="text/csv; charset=utf-8")
        resp["Content-Disposition"] = 'attachment; filename="access-review.csv"'
        resp["X-Content-SHA256"] = doc["sha256"]
        return resp
    return ok(doc)


access_review_export_view.cls.content_negotiation_class = FormatIsOurs


@contract("GET", "Access-review campaigns, newest first", response=tool_output("list_access_reviews"))
@contract("POST", "Open a campaign (freezes the grant population)", body=OPEN,
          response=tool_output("open_access_review"), status=201)
@api_view(["GET", "POST"])
def access_reviews_view(request):
    if request.method == "GET":
        p = _check(request, "AccessReview", "Read")
        return ok(reviews.list_access_reviews(p, cid=cid_of(request)))
    p = _check(request, "AccessReview", "Attest")
    d = payload(request, OPEN)
    out = reviews.open_access_review(p, d["title"], cid=cid_of(request))
    ACCESS_REVIEW_CAMPAIGNS_OPENED.inc()
    return ok(out, status=201)


@contract("GET", "A campaign with its attestation rows", response=tool_output("get_access_review"))
@api_view(["GET"])
def access_review_detail(request, campaign_id):
    p = _check(request, "AccessReview", "Read")
    return ok(reviews.get_access_review(p, campaign_id, cid=cid_of(request)))


@contract("POST", "Record an attest / flag-for-revoke decision", body=ATTEST,
          response=tool_output("record_attestation"))
@api_view(["POST"])
def access_review_attest_view(request, campaign_id):
    p = _check(request, "AccessReview", "Attest")
    d = payload(request, ATTEST)
    out = reviews.record_attestation(p, campaign_id, d["principal_type"], d["principal_id"], d["role_name"],
                                     d["decision"], d.get("justification", ""), cid=cid_of(request))
    ACCESS_REVIEW_ATTESTATIONS.labels(d["decision"]).inc()
    return ok(out)


@contract("POST", "Close a campaign and apply its flagged revocations", response=tool_output("close_access_review"))
@api_view(["POST"])
def access_review_close_view(request, campaign_id):
    p = _check(request, "AccessReview", "Attest")
    return ok(reviews.close_access_review(p, campaign_id, cid=cid_of(request)))


# --- the KEK ----------------------------------------------------------------------------------------

EMPTY = obj({})


@contract("POST", "Rotate the secrets KEK (empty body)", body=EMPTY, response=tool_output("rotate_kek"))
@api_view(["POST"])
def kek_rotate(request):
    p = _check(request, "Security", "Write")
    payload(request, EMPTY)
    return ok(kek.rotate_kek(p, cid=cid_of(request)))


@contract("POST", "Re-wrap secrets still on older KEK versions (empty body)", body=EMPTY,
          response=tool_output("rewrap_secrets"))
@api_view(["POST"])
def kek_rewrap(request):
    p = _check(request, "Security", "Write")
    payload(request, EMPTY)
    return ok(kek.rewrap_secrets(p, cid=cid_of(request)))


@contract("GET", "KEK status", response=tool_output("get_kek_status"))
@api_view(["GET"])
def kek_status(request):
    p = _check(request, "Security", "Read")
    return ok(kek.get_kek_status(p))
