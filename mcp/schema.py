"""Tiny helpers for writing bounded JSON Schemas (Draft 2020-12) in tool declarations, and the one strict
validator both faces check input with (MCP tool arguments, REST bodies)."""

from collections.abc import Iterable
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from yuzu.jsondata import JsonObject
from yuzu.schemas import NO_RETRIEVAL

#: a JSON Schema (Draft 2020-12) as a JSON object
Schema = JsonObject

# "integer" is strict: 1.0 is not an integer argument (a float where an id or a count belongs is a bug).
# (types-jsonschema leaves extend() unannotated: the class it returns is a Validator.)
StrictValidator: type[Validator] = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda checker, v: isinstance(v, int) and not isinstance(v, bool)),
)
_validators: dict[int, Validator] = {}


def first_error(schema: Schema, value: Any) -> ValidationError | None:
    """The first validation error of ``value`` against ``schema`` (deterministic: by path), or None.
    Validators are compiled once per schema object."""
    v = _validators.get(id(schema))
    if v is None or v.schema is not schema:
        v = _validators[id(schema)] = StrictValidator(schema, registry=NO_RETRIEVAL)
    errors = sorted(v.iter_errors(value), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    return errors[0] if errors else None


def error_path(error: ValidationError) -> str:
    return "/" + "/".join(str(p) for p in error.absolute_path)


def error_text(error: ValidationError) -> str:
    """What is wrong, without the submitted value: jsonschema's messages begin with the offending value
    (``'hunter2…' is too long``), and an argument may be a secret, or megabytes. The value is named as
    "the value" instead; the path (``error_path``) says which one. Property names (required, additional
    properties) are the caller's keys, not its values, and stay."""
    message = error.message
    shown = repr(error.instance)
    if message.startswith(shown):
        return "the value" + message[len(shown):]
    if error.validator in ("const", "enum", "required", "additionalProperties", "unevaluatedProperties",
                           "propertyNames", "dependentRequired"):
        return message if len(message) <= 512 else message[:509] + "..."
    return f"the value fails the schema's '{error.validator}' rule"


def without(schema: Schema, *names: str) -> Schema:
    """``schema`` (an object schema) without the properties ``names`` (e.g. a tool's input for REST, which
    has no approval_id)."""
    props = {k: v for k, v in schema.get("properties", {}).items() if k not in names}
    out = {**schema, "properties": props}
    if "required" in schema:
        out["required"] = [r for r in schema["required"] if r not in names]
    return out


def obj(properties: dict[str, Schema] | None = None, required: Iterable[str] = (), additional: bool = False,
        **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties or {}, "additionalProperties": additional}
    if required:
        schema["required"] = list(required)
    schema.update(extra)
    return schema


def string(max_length: int = 256, description: str | None = None, **extra: Any) -> Schema:
    s = {"type": "string", "maxLength": max_length, **extra}
    if description:
        s["description"] = description
    return s


def enum(values: Iterable[str], description: str | None = None, **extra: Any) -> Schema:
    s = {"type": "string", "enum": list(values), **extra}
    if description:
        s["description"] = description
    return s


def integer(minimum: int | None = None, maximum: int | None = None, description: str | None = None,
            **extra: Any) -> Schema:
    s: Schema = {"type": "integer", **extra}
    if minimum is not None:
        s["minimum"] = minimum
    if maximum is not None:
        s["maximum"] = maximum
    if description:
        s["description"] = description
    return s


def boolean(description: str | None = None, **extra: Any) -> Schema:
    s: Schema = {"type": "boolean", **extra}
    if description:
        s["description"] = description
    return s


def array(items: Schema, max_items: int | None = None, min_items: int | None = None, **extra: Any) -> Schema:
    s: Schema = {"type": "array", "items": items, **extra}
    if max_items is not None:
        s["maxItems"] = max_items
    if min_items is not None:
        s["minItems"] = min_items
    return s


def nullable(schema: Schema) -> Schema:
    t = schema.get("type")
    return {**schema, "type": [t, "null"]} if isinstance(t, str) else schema


APPROVAL_ID: Schema = {"type": "string", "pattern": "^[0-9a-f]{32}$", "maxLength": 32,
               "description": "The approval_id from a -32006 answer; re-call with the same arguments plus this id "
                              "once an admin has approved it."}
ANY_OBJECT: Schema = {"type": "object"}
