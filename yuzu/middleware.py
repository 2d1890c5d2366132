import time

from .errors import correlation_id
from .metrics import HTTP_LATENCY, HTTP_REQUESTS


class CorrelationMiddleware:
    """Mints the request's correlation id and stamps X-Correlation-Id. (Bodies are bounded before Django
    sees them, while they arrive: yuzu.bodylimit.)"""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.correlation_id = correlation_id()
        response = self.get_response(request)
        if request.path.startswith("/api/"):
            response["X-Correlation-Id"] = request.correlation_id
        return response


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
