"""The REST API's JSON parser: yuzu.jsondata's strict JSON (no NaN/Infinity, no lone surrogates), and no NUL
character in any string."""

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
            value = jsondata.loads(codecs.getreader(encoding)(stream).read())
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        nul = jsondata.nul_at(value)
        if nul is not None:  # PostgreSQL stores it in no text column: every write or lookup of one was a 500
            where = nul[0][:64].replace("\x00", "\\u0000")
            raise ParseError(f"JSON parse error - a string holds a NUL character (\\u0000) at '{where}', which no "
                             "text column can store")
        return value
