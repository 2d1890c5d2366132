"""Transport security for the MCP endpoints: what a request must satisfy before its body is read as JSON-RPC,
its credential is looked at or a session is touched. It runs on every request, whatever the streaming mode.

- **Host** must be one of ``ALLOWED_HOSTS`` (421): a DNS-rebinding page reaches us under its own name.
- **Origin**, when a browser sends one, must be listed in ``YUZU_ALLOWED_ORIGINS`` or be this host itself
  (403, ``-32008``). With the admin session cookie also accepted, this check and the JSON-only body below are
  what keep another site's page — even one on another port of this host, which the browser treats as
  same-site — from calling tools with an admin's cookie.
- A POST's **Content-Type** must be ``application/json`` (415): it cannot be sent cross-origin without a CORS
  preflight, which yuzu never grants. Its **Content-Encoding** must be identity (415): a compressed body
  would escape the size bound.
- The **body's size** and declared length are bounded while the body arrives, before this code runs
  (4 MiB, ``Content-Length`` required; yuzu/bodylimit.py, which bounds every HTTP route of the project).
"""

from collections.abc import Mapping
from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host

from yuzu.errors import correlation_id
from yuzu.metrics import MCP_BODY_TOO_LARGE

from . import jsonrpc as rpc


def check(method: str, headers: Mapping[str, str]) -> rpc.RpcError | None:
    """The refusal a request earns by its method and headers (an ``RpcError`` carrying its HTTP status),
    or None. ``headers``: lower-case names."""
    host = headers.get("host", "")
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return rpc.RpcError(rpc.INVALID_REQUEST, "Misdirected Request: Host not allowed", http_status=421)
    origin = headers.get("origin")
    if origin is not None and not origin_allowed(origin, host):
        return rpc.RpcError(rpc.ORIGIN_REJECTED, "Origin not allowed",
                            {"correlation_id": correlation_id(), "retry_after_ms": None}, http_status=403)
    if method == "POST":
        media_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            return rpc.RpcError(rpc.INVALID_REQUEST, "Content-Type must be application/json", http_status=415)
        if headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
            MCP_BODY_TOO_LARGE.labels("encoding").inc()
            return rpc.RpcError(rpc.INVALID_REQUEST, "Content-Encoding must be identity", http_status=415)
    return None


def origin_allowed(origin: str, host: str) -> bool:
    if origin in settings.YUZU_ALLOWED_ORIGINS:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc == host
