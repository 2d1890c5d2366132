"""The REST API's OpenAPI document (``/api/v1/openapi.json``, ``.yaml``; the MCP resource ``yuzu://openapi``),
built once per process.

The document is drf-spectacular's public one: every route, whoever asks — it is not filtered by the caller's
permissions, tier or grants — so nothing in it depends on the caller, the credential or the query string; only on
the code, which a restart reloads. It is built once and each rendering of it is kept: one YAML, and one JSON per
indentation a client may ask for (``Accept: application/json; indent=N``, N in 1-8). Building it costs seconds of
CPU (the YAML 2.5 MB), so it must not be built per request, per token or per query string.

(It was cached with Django's ``cache_page`` before, whose key is the URL with its query string, the ``Accept``
header and — for a request that bears one — the ``Authorization`` header: a new token, a ``?x=1`` or an
``Accept: */*; q=0.5`` built it again, and kept another 2.5 MB copy.)"""

import threading
from functools import cache

from django.http import HttpResponse
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.views import SpectacularAPIView, SpectacularJSONAPIView, SpectacularYAMLAPIView
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request

from yuzu.jsondata import JsonObject

_lock = threading.Lock()  # the lanes' first requests wait for one build instead of each building it


@cache
def _document() -> JsonObject:
    schema: JsonObject = SchemaGenerator().get_schema(request=None, public=True)
    return schema


_rendered: dict[tuple[str, int | None], bytes] = {}  # (format, JSON indent) → the document so written


def document() -> JsonObject:
    """The document (shared: not to be modified)."""
    with _lock:
        return _document()


def rendered(renderer: BaseRenderer, accepted_media_type: str) -> bytes:
    """The document as ``renderer`` writes it for ``accepted_media_type`` (of which only a JSON indent counts)."""
    indent = renderer.get_indent(accepted_media_type, {}) if isinstance(renderer, JSONRenderer) else None
    key = (renderer.format, indent)
    with _lock:
        if key not in _rendered:  # (the same bytes for each media type of a format: application/yaml, …)
            _rendered[key] = renderer.render(_document(), renderer_context={"indent": indent})
        return _rendered[key]


def forget() -> None:
    """Build the document again on its next use (tests)."""
    with _lock:
        _rendered.clear()
        _document.cache_clear()


class _Served(SpectacularAPIView):
    """drf-spectacular's view — its content negotiation (a 406 for an Accept it cannot meet), authentication (a bad
    token is a 401, as on every API route) and headers unchanged — answering from the kept renderings. A
    ``?version=`` is not taken (it only wrote the caller's text into ``info.version``)."""

    def _get_schema_response(self, request: Request) -> HttpResponse:
        renderer, media_type = request.accepted_renderer, request.accepted_media_type
        content_type = f"{renderer.media_type}; charset={renderer.charset}" if renderer.charset else renderer.media_type
        disposition = f'inline; filename="{spectacular_settings.TITLE}.{renderer.format}"'  # (drf-spectacular's)
        return HttpResponse(rendered(renderer, media_type), content_type=content_type,
                            headers={"Content-Disposition": disposition, "Cache-Control": "public, max-age=3600"})


class JSONView(_Served, SpectacularJSONAPIView):
    pass


class YAMLView(_Served, SpectacularYAMLAPIView):
    pass
