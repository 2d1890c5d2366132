import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase
from django.http.multipartparser import MultiPartParserError

from .api.handlers import nul_refused
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


FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def holds_nul(request: HttpRequest) -> bool:
    """True when the path, a query parameter or a form field (name or value) holds a NUL character. No URL or
    form of yuzu's means one, and PostgreSQL refuses it in text: looked up, it made a 500 of every admin page
    and REST route that reads a text key."""
    if "\x00" in request.path or _nul_in(request.GET):
        return True
    if request.method != "POST" or request.content_type not in FORM_TYPES or request.path.startswith(("/api/", "/mcp")):
        return False  # the API and MCP take JSON only (their parser refuses NUL): a form there is theirs to refuse
    _ = request.body  # read whole (bounded: yuzu.bodylimit) before the form parser, so a view can still read it
    try:
        return _nul_in(request.POST)
    except MultiPartParserError:  # not a form the parser reads: the view answers it as it would anyway
        return False


def _nul_in(data: object) -> bool:
    lists = getattr(data, "lists", None)
    return lists is not None and any("\x00" in key or any("\x00" in str(v) for v in values) for key, values in lists())


class NulGuardMiddleware:
    """400 for a request whose URL or form holds a NUL character (`holds_nul`), before any view reads it."""

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if holds_nul(request):
            return nul_refused(request)
        return self.get_response(request)


#: the methods counted by name; any other a client sends is counted as "other" (/metrics is public, and a label
#: value per invented method grew every process's series, and every scrape, for good)
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str | None) -> str:
    return method if method in HTTP_METHODS else "other"


class MetricsMiddleware:
    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        start = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None else "unmatched"
        method = method_label(request.method)
        HTTP_REQUESTS.labels(method, route, str(response.status_code)).inc()
        HTTP_LATENCY.labels(method, route).observe(time.perf_counter() - start)
        return response
