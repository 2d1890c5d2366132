"""Where a client finds yuzu's authorization server: protected resource metadata for each MCP endpoint (RFC 9728)
and the authorization server metadata (RFC 8414), listing exactly what yuzu supports."""

from urllib.parse import urlsplit

from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.http import require_safe

from yuzu.auth import OAUTH_RESOURCES, tier_scope
from yuzu.models import MCP_TIERS

SCOPES = [tier_scope(t) for t in MCP_TIERS]
NAMES = {"mcp-v1": "yuzu MCP: fleet, approvals, audit", "mcp-bridge": "yuzu MCP bridge: delegate to worker sessions"}
AUTH_METHODS = ["none", "client_secret_post", "client_secret_basic"]


def issuer(request):
    """YUZU_PUBLIC_URL when it is set, else the origin this request reached (its host passed ALLOWED_HOSTS)."""
    return settings.YUZU_OAUTH_ISSUER or f"{request.scheme}://{request.get_host()}"


def normalize(uri):
    """A resource indicator compared as scheme://host:port/path, case-insensitive origin, no trailing slash;
    None when it is not an absolute http(s) URI without fragment, query or credentials."""
    try:
        parts = urlsplit(uri)
        port = parts.port
    except (ValueError, AttributeError):
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or parts.username or parts.password \
            or parts.fragment or parts.query or "#" in uri:
        return None
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    if port and port != {"http": 80, "https": 443}[parts.scheme.lower()]:
        host += f":{port}"
    return f"{parts.scheme.lower()}://{host}{parts.path.rstrip('/')}"


def audience_for(resource, base):
    """The MCP endpoint (token audience) a resource indicator names on this server, or None."""
    wanted = normalize(resource)
    return next((aud for aud, path in OAUTH_RESOURCES.items() if wanted and wanted == normalize(base + path)), None)


def _json(data):
    response = JsonResponse(data)
    response["Access-Control-Allow-Origin"] = "*"  # public documents; browser-based clients read them too
    response["Cache-Control"] = "max-age=300"
    return response


@require_safe
def protected_resource(request, audience="mcp-v1"):
    """RFC 9728 for /mcp/v1 (also at the root well-known URI) or /mcp/bridge."""
    base = issuer(request)
    return _json({"resource": base + OAUTH_RESOURCES[audience], "authorization_servers": [base],
                  "scopes_supported": SCOPES, "bearer_methods_supported": ["header"],
                  "resource_name": NAMES[audience]})


@require_safe
def authorization_server(request):
    base = issuer(request)
    return _json({
        "issuer": base,
        "authorization_endpoint": f"{base}/oauth/authorize",
        "token_endpoint": f"{base}/oauth/token",
        "registration_endpoint": f"{base}/oauth/register",
        "revocation_endpoint": f"{base}/oauth/revoke",
        "scopes_supported": SCOPES,
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_methods_supported": AUTH_METHODS,
        "revocation_endpoint_auth_methods_supported": AUTH_METHODS,
        "code_challenge_methods_supported": ["S256"],
        "client_id_metadata_document_supported": True,
        "authorization_response_iss_parameter_supported": True,
    })
