"""Django-level error pages: JSON envelopes under /api/, plain text elsewhere; never a stack trace."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve

from yuzu.errors import correlation_id

MCP_ENDPOINTS = ("The MCP endpoints are /mcp/v1/ (the fleet) and /mcp/bridge/ (the bridge gateway): POST JSON-RPC "
                 "there with Authorization: Bearer yuzu_… (docs/mcp.md).")


def _resp(request: HttpRequest, status: int, message: str, remediation: str | None = None) -> HttpResponse:
    if request.path.startswith(("/api/", "/mcp")):
        cid = getattr(request, "correlation_id", None) or correlation_id()
        r = JsonResponse({"error": {"code": status, "message": message, "correlation_id": cid, "retry_after_ms": None,
                                    "remediation": remediation}, "meta": {"api_version": "v1"}}, status=status)
        r["X-Correlation-Id"] = cid
        return r
    return HttpResponse(f"{message}\n{remediation}" if remediation else message, status=status,
                        content_type="text/plain")


def _resolves(path: str) -> bool:
    try:
        resolve(path)
        return True
    except Resolver404:
        return False


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404, with the way to the right URL when there is one: the REST API has no trailing slashes, and
    anything under /mcp that is not an endpoint points at the endpoints."""
    path = request.path
    if path.startswith("/api/") and path.endswith("/") and _resolves(path.rstrip("/")):
        return _resp(request, 404, "not found", f"this API's paths have no trailing slash: use {path.rstrip('/')}")
    if path == "/mcp" or path.startswith("/mcp/"):
        return _resp(request, 404, "not an MCP endpoint", MCP_ENDPOINTS)
    if path.startswith("/api/"):
        return _resp(request, 404, "not found", "the routes are listed at /api/v1/openapi.json (reference: /api/v1/docs)")
    return _resp(request, 404, "not found")


def server_error(request: HttpRequest) -> HttpResponse:
    return _resp(request, 500, "internal error")


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _resp(request, 400, "bad request")


def nul_refused(request: HttpRequest) -> HttpResponse:
    """A URL or form holding a NUL character (yuzu.middleware.NulGuardMiddleware); OAuth's endpoints answer in
    OAuth's error shape (RFC 6749 §5.2), as their own check (oauth.views.refuse_nul) does."""
    if request.path.startswith("/oauth/"):
        return JsonResponse({"error": "invalid_request", "error_description": "a parameter contains a NUL character"},
                            status=400)
    return _resp(request, 400, "bad request: the URL or the form holds a NUL character (%00)",
                 "remove the NUL character and retry")
