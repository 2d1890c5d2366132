"""Tiny helpers for writing bounded JSON Schemas (Draft 2020-12) in tool declarations, and the one strict
validator both faces check input with (MCP tool arguments, REST bodies)."""

import jsonschema
from jsonschema import Draft202012Validator

# "integer" is strict: 1.0 is not an integer argument (a float where an id or a count belongs is a bug).
StrictValidator = jsonschema.validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda checker, v: isinstance(v, int) and not isinstance(v, bool)),
)
_validators: dict = {}


def first_error(schema, value):
    """The first validation error of ``value`` against ``schema`` (deterministic: by path), or None.
    Validators are compiled once per schema object."""
    v = _validators.get(id(schema))
    if v is None or v.schema is not schema:
        v = _validators[id(schema)] = StrictValidator(schema)
    errors = sorted(v.iter_errors(value), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    return errors[0] if errors else None


def error_path(error):
    return "/" + "/".join(str(p) for p in error.absolute_path)


def without(schema, *names):
    """``schema`` (an object schema) without the properties ``names`` (e.g. a tool's input for REST, which
    has no approval_id)."""
    props = {k: v for k, v in schema.get("properties", {}).items() if k not in names}
    out = {**schema, "properties": props}
    if "required" in schema:
        out["required"] = [r for r in schema["required"] if r not in names]
    return out


def obj(properties=None, required=(), additional=False, **extra):
    schema = {"type": "object", "properties": properties or {}, "additionalProperties": additional}
    if required:
        schema["required"] = list(required)
    schema.update(extra)
    return schema


def string(max_length=256, description=None, **extra):
    s = {"type": "string", "maxLength": max_length, **extra}
    if description:
        s["description"] = description
    return s


def enum(values, description=None, **extra):
    s = {"type": "string", "enum": list(values), **extra}
    if description:
        s["description"] = description
    return s


def integer(minimum=None, maximum=None, description=None, **extra):
    s = {"type": "integer", **extra}
    if minimum is not None:
        s["minimum"] = minimum
    if maximum is not None:
        s["maximum"] = maximum
    if description:
        s["description"] = description
    return s


def boolean(description=None, **extra):
    s = {"type": "boolean", **extra}
    if description:
        s["description"] = description
    return s


def array(items, max_items=None, min_items=None, **extra):
    s = {"type": "array", "items": items, **extra}
    if max_items is not None:
        s["maxItems"] = max_items
    if min_items is not None:
        s["minItems"] = min_items
    return s


def nullable(schema):
    t = schema.get("type")
    return {**schema, "type": [t, "null"]} if isinstance(t, str) else schema


APPROVAL_ID = {"type": "string", "pattern": "^[0-9a-f]{32}$", "maxLength": 32,
               "description": "The approval_id from a -32006 answer; re-call with the same arguments plus this id "
                              "once an admin has approved it."}
ANY_OBJECT = {"type": "object"}
