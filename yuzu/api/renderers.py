"""The REST API's JSON renderer: DRF's, written by orjson (yuzu.jsondata.dumps) instead of the json module.

A 50-agent ``GET /api/v1/agents`` reply spent about a third of the request's instructions in the json module's
encoder (callgrind; bench/mcp_calls). The output is DRF's: compact UTF-8, U+2028/U+2029 escaped; datetimes,
decimals and whatever else orjson does not write natively go through DRF's own encoder, so their format is
unchanged. An indented reply (``Accept: application/json; indent=4``) is rare: DRF writes it as before."""

from collections.abc import Mapping
from typing import Any

import orjson
from rest_framework import renderers
from rest_framework.utils.encoders import JSONEncoder

from yuzu import jsondata

_drf_default = JSONEncoder().default


class JSONRenderer(renderers.JSONRenderer):
    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Mapping[str, Any] | None = None) -> bytes:
        if data is None or self.get_indent(accepted_media_type or "", renderer_context or {}) is not None:
            drf: bytes = super().render(data, accepted_media_type, renderer_context)
            return drf
        out = jsondata.dumps(data, default=_drf_default, option=orjson.OPT_PASSTHROUGH_DATETIME)
        if b"\xe2\x80\xa8" in out or b"\xe2\x80\xa9" in out:  # as DRF: JSON that is also a JavaScript literal
            out = out.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
        return out
