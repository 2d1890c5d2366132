"""JSON-RPC 2.0 framing: parsing with the body and nesting bounds, and error objects.

Every error object carries ``data.correlation_id`` (docs/mcp.md, "Errors"); the transport echoes it in
the X-Correlation-Id header (``correlation_of``)."""

from typing import Any

import orjson

from yuzu import jsondata
from yuzu.errors import correlation_id
from yuzu.jsondata import JsonObject

#: a request id as the client sent it (a string or an integer), or None where there is none to echo
RequestId = str | int | None
#: the longest string id a request may carry (a progress token's bound): a streamed call's id travels with every
#: frame of it (its ring frames' stream tag, its follow record), which the ring's byte bound does not count
MAX_ID_BYTES = 512

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603
UNAUTHORIZED, RESOURCE_NOT_FOUND = -32001, -32002
PERMISSION_DENIED, TIER_DENIED, MCP_DISABLED, APPROVAL_REQUIRED = -32003, -32004, -32005, -32006
UNKNOWN_SESSION, ORIGIN_REJECTED, BAD_PROTOCOL_VERSION, SESSION_CAP = -32007, -32008, -32009, -32010
NOT_ACCEPTABLE, STREAM_CAP, STREAM_POISONED, TERMINAL_UNAVAILABLE = -32011, -32012, -32013, -32014
#: the 2026-07-28 revision's own codes (modern requests only: mcp.modern)
HEADER_MISMATCH, MISSING_CAPABILITY, UNSUPPORTED_VERSION = -32020, -32021, -32022


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: JsonObject | str | None = None, *, http_status: int = 200,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status
        self.headers = headers or {}

    def to_dict(self) -> JsonObject:
        if not isinstance(self.data, dict):
            self.data = {} if self.data is None else {"detail": self.data}
        self.data.setdefault("correlation_id", correlation_id())
        return {"code": self.code, "message": self.message, "data": self.data}


def error_response(req_id: RequestId, err: RpcError) -> JsonObject:
    return {"jsonrpc": "2.0", "id": req_id, "error": err.to_dict()}


def correlation_of(body: object) -> str | None:
    """The correlation id of a response body's error, stamping one into an error that has none; None for a
    body that is not an error. The transport sends it as the X-Correlation-Id header."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return None
    data = err.get("data")
    if not isinstance(data, dict):
        data = err["data"] = {} if data is None else {"detail": data}
    cid: str = data.setdefault("correlation_id", correlation_id())
    return cid


def result_response(req_id: RequestId, result: object) -> JsonObject:
    return {"jsonrpc": "2.0", "id": req_id, "result": result}


def parse_message(body: bytes | str) -> JsonObject:
    """Bytes → one JSON-RPC message dict, or RpcError (HTTP 400) for the framing failures."""
    try:
        msg = jsondata.loads(body)
    except jsondata.InvalidJSON as exc:
        raise RpcError(PARSE_ERROR, f"Parse error: {exc}", http_status=400) from None
    except (ValueError, UnicodeDecodeError):
        raise RpcError(PARSE_ERROR, "Parse error: body is not valid JSON", http_status=400) from None
    except RecursionError:
        raise RpcError(PARSE_ERROR, "Parse error: JSON nested deeper than 32 levels", http_status=400) from None
    if not jsondata.depth_ok(msg):
        raise RpcError(PARSE_ERROR, "Parse error: JSON nested deeper than 32 levels", http_status=400)
    if isinstance(msg, list):
        raise RpcError(INVALID_REQUEST, "Invalid Request: batches are not supported", http_status=400)
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, "Invalid Request: expected a JSON-RPC 2.0 object", http_status=400)
    if "method" in msg:
        if not isinstance(msg["method"], str):
            raise RpcError(INVALID_REQUEST, "Invalid Request: method must be a string", http_status=400)
        if "id" in msg and (msg["id"] is None or isinstance(msg["id"], bool) or not isinstance(msg["id"], (str, int))):
            raise RpcError(INVALID_REQUEST, "Invalid Request: id must be a string or an integer", http_status=400)
        if isinstance(msg.get("id"), str) and len(msg["id"].encode()) > MAX_ID_BYTES:
            raise RpcError(INVALID_REQUEST, f"Invalid Request: a string id must be at most {MAX_ID_BYTES} bytes",
                           http_status=400)
        if "params" in msg and not isinstance(msg["params"], dict):
            raise RpcError(INVALID_REQUEST, "Invalid Request: params must be an object", http_status=400)
    elif not ("id" in msg and ("result" in msg or "error" in msg)):
        raise RpcError(INVALID_REQUEST, "Invalid Request: neither a request, a notification nor a response",
                       http_status=400)
    return msg


class Result(dict[str, Any]):
    """A result one of whose values is already encoded: a tool's ``structuredContent``, which mcp.pipeline encodes
    once for the text block beside it. ``dumps`` writes those bytes rather than encode the value a second time
    (about a third of a 50-agent reply's encoding), as long as the result still holds that very value."""

    __slots__ = ("key", "value", "encoded")

    def __init__(self, fields: JsonObject, key: str, encoded: bytes) -> None:
        super().__init__(fields)
        self.key, self.value, self.encoded = key, fields[key], encoded


def dumps(obj: object) -> bytes:
    if isinstance(obj, dict) and isinstance(result := obj.get("result"), Result) and \
            result.get(result.key) is result.value:
        obj = {**obj, "result": {**result, result.key: orjson.Fragment(result.encoded)}}
    return jsondata.dumps(obj)
