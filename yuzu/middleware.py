import time

from django.http import JsonResponse

from .errors import correlation_id
from .metrics import HTTP_LATENCY, HTTP_REQUESTS

MAX_BODY = 4 * 1024 * 1024


class CorrelationMiddleware:
    """Mints the request's correlation id, stamps X-Correlation-Id, and refuses oversized or
    length-less API bodies before any view reads them."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.correlation_id = correlation_id()
        if request.path.startswith("/api/") and request.method in ("POST", "PUT", "PATCH"):
            refusal = self._body_guard(request)
            if refusal is not None:
                refusal["X-Correlation-Id"] = request.correlation_id
                return refusal
        response = self.get_response(request)
        if request.path.startswith("/api/"):
            response["X-Correlation-Id"] = request.correlation_id
        return response

    def _body_guard(self, request):
        length = request.META.get("CONTENT_LENGTH")
        try:
            size = int(length) if length else None
        except ValueError:
            size = None
        if size is not None and size > MAX_BODY:
            return _err(413, "request body exceeds 4 MiB", request.correlation_id)
        return None


def _err(status, message, cid):
    return JsonResponse({"error": {"code": status, "message": message, "correlation_id": cid,
                                   "retry_after_ms": None, "remediation": None}, "meta": {"api_version": "v1"}},
                        status=status)


class MetricsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        start = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None else "unmatched"
        HTTP_REQUESTS.labels(request.method, route, str(response.status_code)).inc()
        HTTP_LATENCY.labels(request.method, route).observe(time.perf_counter() - start)
        return response
