"""The REST API's JSON parser: yuzu.jsondata's strict JSON (no NaN/Infinity, no lone surrogates)."""

import codecs
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from yuzu import jsondata


class StrictJSONParser(JSONParser):
    def parse(self, stream: IO[Any], media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            return jsondata.loads(codecs.getreader(encoding)(stream).read())
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
