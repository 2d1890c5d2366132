"""Strict JSON for request bodies, one parser for both faces (the REST parser and the MCP framing).

Python's json module accepts more than JSON: ``NaN``/``Infinity`` (and ``1e999``, which becomes infinity),
and lone UTF-16 surrogate escapes such as ``"\\ud800"``, which are no Unicode text at all. Neither can be
stored in a database column, written to a log or audit row, or sent back as UTF-8 — accepted, they failed
deep inside a request (a 500, an audit row lost). Refused here, they are a clear 400 before anything runs."""

import json
import math


class InvalidJSON(ValueError):
    pass


def _float(text):
    value = float(text)
    if not math.isfinite(value):
        raise InvalidJSON(f"number {text[:32]} is out of range")
    return value


def _constant(name):
    raise InvalidJSON(f"{name} is not JSON")


def loads(data):
    """Parse ``data`` (bytes or str); raises ValueError (InvalidJSON, JSONDecodeError, UnicodeDecodeError)."""
    value = json.loads(data, parse_float=_float, parse_constant=_constant)
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidJSON("a string holds a lone UTF-16 surrogate escape (not Unicode text)") from None
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return value
