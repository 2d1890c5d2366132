"""REST views for tokens, RBAC, users and audit: thin wrappers over the service functions. Each route's
body and response contract is stated once (yuzu.api.contract), shared with its MCP twin where it has one."""

from typing import TypeVar

from rest_framework import exceptions
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from mcp.schema import array, boolean, integer, obj, string
from yuzu import rbac, tokens
from yuzu.accounts import unlock_account
from yuzu.audit import EPOCH_MAX, query_audit
from yuzu.errors import YuzuError
from yuzu.stepup import require_fresh_mfa

from .contract import contract, items_of, payload, tool_input, tool_output
from .envelope import cid_of, ok


def principal_of(request: Request) -> rbac.Principal:
    """The caller: DRF's ``request.auth``, the Principal the authentication class found (yuzu.api.auth)."""
    principal = request.auth
    if not isinstance(principal, rbac.Principal):
        raise exceptions.NotAuthenticated()
    return principal


D = TypeVar("D", bound=int | None)


def int_param(request: Request, name: str, default: D, lo: int, hi: int) -> int | D:
    """A bounded integer query parameter (every numeric filter has bounds: out of range is a 400, never a 500)."""
    raw = request.query_params.get(name)
    if not raw:
        return default
    try:
        value = int(raw) if len(raw) <= 20 else None
    except ValueError:
        value = None
    if value is None:
        raise YuzuError(f"{name} must be an integer", status=400)
    if not lo <= value <= hi:
        raise YuzuError(f"{name} must be between {lo} and {hi}", status=400)
    return value


TOKEN_CREATE = tool_input("create_api_token")
TOKEN_ROTATE = obj({"overlap_secs": integer(0, tokens.MAX_OVERLAP_SECS, "How long the old token keeps working "
                                                                       "(default 86400)")})
TOKEN = tool_output("list_api_tokens")["properties"]["tokens"]["items"]


@contract("GET", "List the caller's own API tokens", response=array(TOKEN))
@contract("POST", "Create an API token (the secret is shown once)", body=TOKEN_CREATE,
          response=tool_output("create_api_token"), status=201)
@api_view(["GET", "POST"])
def tokens_view(request: Request) -> Response:
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "ApiToken", "Read")
        return ok(tokens.list_tokens(p))
    rbac.check(p, "ApiToken", "Write")
    require_fresh_mfa(p)
    return ok(tokens.create_token(p, cid=cid_of(request), **payload(request, TOKEN_CREATE)), status=201)


@contract("DELETE", "Revoke an API token", response=tool_output("revoke_api_token"))
@api_view(["DELETE"])
def token_detail(request: Request, token_id: str) -> Response:
    p = principal_of(request)
    rbac.check(p, "ApiToken", "Delete")
    require_fresh_mfa(p)
    return ok(tokens.revoke_token(p, token_id, cid=cid_of(request)))


@contract("POST", "Rotate a token: mint a successor; the old one works for the overlap", body=TOKEN_ROTATE,
          response=tool_output("rotate_api_token"), status=201)
@api_view(["POST"])
def token_rotate(request: Request, token_id: str) -> Response:
    p = principal_of(request)
    rbac.check(p, "ApiToken", "Rotate")
    overlap = payload(request, TOKEN_ROTATE).get("overlap_secs", 86400)
    return ok(tokens.rotate_token(p, token_id, overlap_secs=overlap, cid=cid_of(request)), status=201)


@contract("POST", "Confirm a rotation: retire the predecessor", response=tool_output("confirm_api_token_rotation"))
@api_view(["POST"])
def token_confirm(request: Request, token_id: str) -> Response:
    p = principal_of(request)
    rbac.check(p, "ApiToken", "Rotate")
    return ok(tokens.confirm_rotation(p, token_id, cid=cid_of(request)))


RBAC_CHECK = tool_input("check_permission")


@contract("POST", "May the caller do securable_type:operation?", body=RBAC_CHECK,
          response=tool_output("check_permission"))
@api_view(["POST"])
def rbac_check(request: Request) -> Response:
    p = principal_of(request)
    rbac.check_tier(p, "Infrastructure", "Read")  # a self-check: no RBAC gate of its own (check_permission)
    d = payload(request, RBAC_CHECK)
    return ok(rbac.self_check(p, d["securable_type"], d["operation"]))


ROLE = obj({"name": string(64), "description": string(256), "builtin": boolean()}, ["name"])


@contract("GET", "List roles", response=array(ROLE))
@api_view(["GET"])
def roles_view(request: Request) -> Response:
    rbac.check(principal_of(request), "UserManagement", "Read")
    return ok(rbac.list_roles())


@contract("GET", "A role's permissions", response=obj({"role": string(64), "permissions": array(string(96))},
                                                    ["role", "permissions"]))
@api_view(["GET"])
def role_permissions_view(request: Request, name: str) -> Response:
    rbac.check(principal_of(request), "UserManagement", "Read")
    return ok(rbac.role_permissions(name))


@contract("POST", "Unlock a locked-out user account", response=tool_output("unlock_account"))
@api_view(["POST"])
def unlock_user(request: Request, username: str) -> Response:
    p = principal_of(request)
    rbac.check(p, "UserManagement", "Write")
    return ok(unlock_account(p, username, cid=cid_of(request)))


@contract("GET", "Query the audit log (newest first)", response=items_of(tool_output("query_audit_log"), "events"),
          query=[("principal", str, "exact username"), ("action", str, "prefix, e.g. mcp."),
                 ("target_type", str, "e.g. Approval"), ("since", int, "epoch seconds"),
                 ("until", int, "epoch seconds"), ("limit", int, "1-500, default 50")])
@api_view(["GET"])
def audit_view(request: Request) -> Response:
    rbac.check(principal_of(request), "AuditLog", "Read")
    q = request.query_params
    rows = query_audit(principal=q.get("principal"), action=q.get("action"), target_type=q.get("target_type"),
                       since=int_param(request, "since", None, 0, EPOCH_MAX),
                       until=int_param(request, "until", None, 0, EPOCH_MAX),
                       limit=int_param(request, "limit", 50, 1, 500))
    return ok(rows, count=len(rows))
