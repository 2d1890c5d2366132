"""Tiny helpers for writing bounded JSON Schemas (Draft 2020-12) in tool declarations."""


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
