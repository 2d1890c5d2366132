"""Django-level error pages: JSON envelopes under /api/, plain text elsewhere; never a stack trace."""

from django.http import HttpResponse, JsonResponse

from yuzu.errors import correlation_id


def _resp(request, status, message):
    if request.path.startswith("/api/"):
        cid = getattr(request, "correlation_id", None) or correlation_id()
        r = JsonResponse({"error": {"code": status, "message": message, "correlation_id": cid, "retry_after_ms": None,
                                    "remediation": None}, "meta": {"api_version": "v1"}}, status=status)
        r["X-Correlation-Id"] = cid
        return r
    return HttpResponse(message, status=status, content_type="text/plain")


def not_found(request, exception=None):
    return _resp(request, 404, "not found")


def server_error(request):
    return _resp(request, 500, "internal error")


def bad_request(request, exception=None):
    return _resp(request, 400, "bad request")
