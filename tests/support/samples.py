"""Minimal arguments for a tool's input schema (test helper)."""


def sample(schema):
    """Minimal arguments satisfying a (bounded, simple) input schema."""
    t = schema.get("type")
    if "enum" in schema:
        return schema["enum"][0]
    if t == "object":
        props = schema.get("properties", {})
        required = list(schema.get("required", []))
        if schema.get("anyOf"):
            required += schema["anyOf"][0].get("required", [])
        return {k: sample(props[k]) for k in required}
    if t == "string":
        return "a" * max(1, schema.get("minLength", 1))
    if t == "integer":
        return schema.get("minimum", 1)
    if t == "boolean":
        return True
    if t == "array":
        return [sample(schema["items"]) for _ in range(schema.get("minItems", 0))]
    return None
