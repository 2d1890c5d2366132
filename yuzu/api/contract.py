"""A REST route's contract, stated once.

The JSON Schema that validates a route's body is also its OpenAPI request body; for a capability with an MCP
twin it is the tool's own input schema (``tool_input("execute_instruction")``, without ``approval_id``), so
the REST face, the MCP face and the documentation cannot drift. Bodies are checked with the same strict
validator as tool arguments and refused with one 400 shape. Services keep only the checks that need meaning.

    @contract("POST", "Dispatch plugin.action to agents", body=tool_input("execute_instruction"),
              response=tool_output("execute_instruction"), status=202)
    @api_view(["POST"])
    def executions_view(request): ...
        data = payload(request)       # the validated body
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request

from mcp.registry import catalogue
from mcp.schema import (
    Schema,
    array,
    error_path,
    error_text,
    first_error,
    integer,
    nullable,
    obj,
    string,
    without,
)
from yuzu.errors import YuzuError
from yuzu.jsondata import JsonObject

V = TypeVar("V", bound=Callable[..., Any])
#: a query parameter: (name, its type, its description)
QueryParam = tuple[str, type, str]

ANY = {"type": "object", "additionalProperties": True}
META = obj({"api_version": string(8), "count": integer(0, 1_000_000)}, ["api_version"], additional=True)
ERROR = obj({"error": obj({"code": integer(100, 599), "message": string(4096),
                           "correlation_id": string(64), "retry_after_ms": nullable(integer(0, 86_400_000)),
                           "remediation": nullable(string(1024)), "permission": string(96)},
                          ["code", "message", "correlation_id"], additional=True),
             "meta": META}, ["error", "meta"])
ERRORS = dict.fromkeys((400, 401, 403, 404, 409, 413, 415, 429, 503), ERROR)


def tool_input(name: str, catalogue_name: str = "v1") -> Schema:
    """The MCP tool's input schema as a REST body (no approval_id: approvals are an MCP affair)."""
    return without(catalogue(catalogue_name).tools[name].input_schema, "approval_id")


def tool_output(name: str, catalogue_name: str = "v1") -> Schema:
    return catalogue(catalogue_name).tools[name].output_schema or ANY


def items_of(schema: Schema, key: str) -> Schema:
    """A list route's data: the items of ``schema[key]`` (the MCP twin wraps them in an object)."""
    return array(schema["properties"][key]["items"])


def envelope(data: Schema) -> Schema:
    return obj({"data": data, "meta": META}, ["data", "meta"])


def contract(method: str, summary: str, *, body: Schema | None = None, response: Schema | None = None,
             status: int = 200, query: Iterable[QueryParam] = (), description: str | None = None,
             also: Mapping[str, Schema] | None = None) -> Callable[[V], V]:
    """The OpenAPI description of one method of a route: body schema, query parameters, the envelope
    around ``response`` on ``status`` (and ``also``: other media types of that success, e.g. a CSV export's
    ``{"text/csv": …}``), the error envelope (JSON) on every refusal."""
    params = [OpenApiParameter(name, type=kind, location=OpenApiParameter.QUERY, required=False, description=text)
              for name, kind, text in query]

    def decorate(view: V) -> V:
        name = getattr(view, "cls", view).__name__  # the view function's name (DRF's api_view keeps it)
        described: V = extend_schema(methods=[method], summary=summary, description=description,
                                     parameters=params or None, operation_id=f"{name}_{method.lower()}",
                                     request={"application/json": body} if body is not None else None,
                                     responses={(status, "application/json"): envelope(response or ANY),
                                                **{(status, media): schema for media, schema in (also or {}).items()},
                                                **ERRORS})(view)
        return described

    return decorate


def payload(request: Request, schema: Schema) -> JsonObject:
    """The request's JSON body, checked against ``schema`` with the strict validator tool arguments use."""
    data = request.data  # no body at all reads as {} (DRF); a JSON null, [], "" or 0 is no object
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
        raise YuzuError(f"the body must be a JSON object, not {kind.get(type(data), 'null')}", status=400,
                        remediation="send an object ({} when nothing is asked); see /api/v1/openapi.json")
    error = first_error(schema, data)
    if error is not None:
        raise YuzuError(f"body does not match the schema at '{error_path(error)}': {error_text(error)}", status=400,
                        remediation="fix the field named in the message; see /api/v1/openapi.json")
    body: JsonObject = data  # a body schema is an object schema
    return body


class BearerScheme(OpenApiAuthenticationExtension):
    target_class = "yuzu.api.auth.YuzuAuthentication"
    name = "bearer"

    def get_security_definition(self, auto_schema: AutoSchema) -> JsonObject:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "yuzu_<64 hex>",
                "description": "An API token (`yuzu_…`), from `manage.py mint_token`, POST /api/v1/tokens or "
                               "bootstrap. X-Yuzu-Token is accepted too. The admin session cookie works for the "
                               "admin's own pages."}


class BridgeWorkerScheme(OpenApiAuthenticationExtension):
    target_class = "bridge.api.WorkerTokenAuthentication"
    name = "bridgeWorker"

    def get_security_definition(self, auto_schema: AutoSchema) -> JsonObject:
        return {"type": "http", "scheme": "bearer", "description": "A bridge worker's own token (audience bridge)."}
