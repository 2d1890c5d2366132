"""REST views for tokens, RBAC, users and audit: thin wrappers over the service functions."""

from rest_framework import serializers
from rest_framework.decorators import api_view
from drf_spectacular.utils import extend_schema, inline_serializer

from yuzu import rbac, tokens
from yuzu.accounts import unlock_account
from yuzu.audit import EPOCH_MAX, query_audit
from yuzu.errors import YuzuError
from yuzu.models import Role
from yuzu.stepup import require_fresh_mfa

from .envelope import cid_of, ok


def principal_of(request):
    return request._request.principal


def body(request):
    data = request.data
    if not isinstance(data, dict):
        raise YuzuError("request body must be a JSON object", status=400)
    return data


def int_param(request, name, default, lo, hi):
    """A bounded integer query parameter (every numeric filter has bounds: out of range is a 400, never a 500)."""
    raw = request.query_params.get(name)
    if raw in (None, ""):
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


TokenCreate = inline_serializer("TokenCreate", {
    "name": serializers.CharField(max_length=256),
    "expires_at": serializers.CharField(required=False, help_text="ISO-8601 or epoch seconds"),
    "scope_service": serializers.CharField(required=False, max_length=256),
    "mcp_tier": serializers.ChoiceField(choices=["readonly", "operator", "supervised"], required=False),
})


@extend_schema(methods=["GET"], summary="List the caller's own API tokens")
@extend_schema(methods=["POST"], request=TokenCreate, summary="Create an API token (shown once)")
@api_view(["GET", "POST"])
def tokens_view(request):
    p = principal_of(request)
    if request.method == "GET":
        rbac.check(p, "ApiToken", "Read")
        return ok(tokens.list_tokens(p))
    rbac.check(p, "ApiToken", "Write")
    require_fresh_mfa(p)
    d = body(request)
    return ok(tokens.create_token(p, name=d.get("name", ""), expires_at=d.get("expires_at"),
                                  scope_service=d.get("scope_service") or "", mcp_tier=d.get("mcp_tier") or "",
                                  cid=cid_of(request)), status=201)


@extend_schema(summary="Revoke an API token")
@api_view(["DELETE"])
def token_detail(request, token_id):
    p = principal_of(request)
    rbac.check(p, "ApiToken", "Delete")
    require_fresh_mfa(p)
    return ok(tokens.revoke_token(p, token_id, cid=cid_of(request)))


@extend_schema(request=inline_serializer("TokenRotate", {"overlap_secs": serializers.IntegerField(required=False)}),
               summary="Rotate a token: mint a successor; the old one works for the overlap")
@api_view(["POST"])
def token_rotate(request, token_id):
    p = principal_of(request)
    rbac.check(p, "ApiToken", "Rotate")
    d = body(request) if request.body else {}
    return ok(tokens.rotate_token(p, token_id, overlap_secs=d.get("overlap_secs", 86400), cid=cid_of(request)), status=201)


@extend_schema(request=None, summary="Confirm a rotation: retire the predecessor")
@api_view(["POST"])
def token_confirm(request, token_id):
    p = principal_of(request)
    rbac.check(p, "ApiToken", "Rotate")
    return ok(tokens.confirm_rotation(p, token_id, cid=cid_of(request)))


def check_permission(principal, securable, operation):
    """A self-check: may the caller do securable:operation (tier ceiling included)?"""
    from yuzu.models import OPERATIONS, SECURABLES
    from yuzu.policy import tier_allows

    if securable not in SECURABLES or operation not in OPERATIONS:
        raise YuzuError(f"unknown permission {securable}:{operation}", status=400)
    rbac_ok = rbac.may(principal, securable, operation)
    tier_ok = tier_allows(principal.tier, securable, operation)
    return {"securable_type": securable, "operation": operation, "allowed": rbac_ok and tier_ok,
            "rbac_allowed": rbac_ok, "tier_allowed": tier_ok}


@extend_schema(request=inline_serializer("RbacCheck", {"securable_type": serializers.CharField(),
                                                        "operation": serializers.CharField()}),
               summary="May the caller do securable_type:operation?")
@api_view(["POST"])
def rbac_check(request):
    d = body(request)
    return ok(check_permission(principal_of(request), d.get("securable_type"), d.get("operation")))


def list_roles():
    return [{"name": r.name, "description": r.description, "builtin": r.builtin} for r in Role.objects.all()]


def role_permissions(name):
    from yuzu.errors import NotFound

    role = Role.objects.filter(name=name).first()
    if role is None:
        raise NotFound(f"role not found: {name}")
    return {"role": role.name, "permissions": [f"{p.securable}:{p.operation}" for p in role.permissions.all()]}


@extend_schema(summary="List roles")
@api_view(["GET"])
def roles_view(request):
    rbac.check(principal_of(request), "UserManagement", "Read")
    return ok(list_roles())


@extend_schema(summary="A role's permissions")
@api_view(["GET"])
def role_permissions_view(request, name):
    rbac.check(principal_of(request), "UserManagement", "Read")
    return ok(role_permissions(name))


@extend_schema(request=None, summary="Unlock a locked-out user account")
@api_view(["POST"])
def unlock_user(request, username):
    p = principal_of(request)
    rbac.check(p, "UserManagement", "Write")
    return ok(unlock_account(p, username, cid=cid_of(request)))


@extend_schema(summary="Query the audit log (newest first)")
@api_view(["GET"])
def audit_view(request):
    rbac.check(principal_of(request), "AuditLog", "Read")
    q = request.query_params
    rows = query_audit(principal=q.get("principal"), action=q.get("action"), target_type=q.get("target_type"),
                       since=int_param(request, "since", None, 0, EPOCH_MAX),
                       until=int_param(request, "until", None, 0, EPOCH_MAX),
                       limit=int_param(request, "limit", 50, 1, 500))
    return ok(rows, count=len(rows))
