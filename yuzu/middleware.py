import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase

from .api.handlers import bad_request_response  # the envelope of every other API error
from .errors import correlation_id
from .metrics import HTTP_LATENCY, HTTP_REQUESTS

GetResponse = Callable[[HttpRequest], HttpResponseBase]


def request_cid(request: HttpRequest) -> str:
    """The correlation id of this request: the one CorrelationMiddleware minted, else one minted now and kept on
    the request (a per-request attribute, as Django's own middleware set them)."""
    cid: str | None = getattr(request, "correlation_id", None)
    if cid is None:
        cid = correlation_id()
        setattr(request, "correlation_id", cid)  # noqa: B010 (HttpRequest declares no such attribute: mypy)
    return cid


class CorrelationMiddleware:
    """Mints the request's correlation id and stamps X-Correlation-Id. (Bodies are bounded before Django
    sees them, while they arrive: yuzu.bodylimit.)"""

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        cid = request_cid(request)
        response = self.get_response(request)
        if request.path.startswith("/api/"):
            response["X-Correlation-Id"] = cid
        return response


class NulGuardMiddleware:
    """A NUL character (U+0000) in a REST path or query — ``/api/v1/agents/a%00b``, ``?group=a%00b`` — is a 400
    here: PostgreSQL stores it in no text column, so the lookup it reached failed deep in the view (a 500 on
    PostgreSQL, its audit row lost). Bodies: yuzu.jsondata; MCP arguments: mcp.pipeline."""

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.path.startswith("/api/") and ("\x00" in request.path or any(
                "\x00" in k or any("\x00" in v for v in vs) for k, vs in request.GET.lists())):
            return bad_request_response(request, "the path or query holds a NUL character (%00)",
                                        "remove the %00 from the URL")
        return self.get_response(request)


class MetricsMiddleware:
    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        start = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None else "unmatched"
        HTTP_REQUESTS.labels(request.method, route, str(response.status_code)).inc()
        HTTP_LATENCY.labels(request.method, route).observe(time.perf_counter() - start)
        return response
