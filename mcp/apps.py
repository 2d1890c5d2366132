from collections.abc import Iterator, Sequence
from typing import Any

from django.apps import AppConfig
from django.core import checks
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from yuzu.jsondata import JsonObject
from yuzu.policy import requires_approval

from .registry import EFFECTS, RESOURCE_SCOPE_CLASSES, SERVICE_SCOPE_CLASSES, _catalogues, autodiscover


class McpConfig(AppConfig):
    name = "mcp"
    verbose_name = "MCP server"

    def ready(self) -> None:
        # deferred: apps.py is imported before any model can be, and listing's imports need models
        from .listing import connect_signals

        checks.register(registry_check, "mcp")
        connect_signals()  # a role change re-fits the listed sessions' catalogues (tools/list_changed)


def registry_check(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Registry drift fails `manage.py check` (and so every test run)."""
    # deferred: apps.py is imported before any model can be
    from yuzu.models import OPERATIONS, SECURABLES

    autodiscover()
    errors: list[checks.CheckMessage] = []

    def err(msg: str, obj: str, id_: str) -> None:
        errors.append(checks.Error(msg, obj=obj, id=id_))

    for cat in _catalogues.values():
        for name in cat.duplicates:
            err(f"tool '{name}' is declared twice", name, "mcp.E001")
        for name, t in cat.tools.items():
            if t.securable not in SECURABLES or t.operation not in OPERATIONS:
                err(f"tool '{name}' has no valid security row ({t.securable}:{t.operation})", name, "mcp.E002")
            for label, schema in (("input", t.input_schema), ("output", t.output_schema)):
                if schema is None:
                    continue
                try:
                    Draft202012Validator.check_schema(schema)
                except SchemaError as exc:
                    err(f"tool '{name}' {label} schema does not compile: {exc.message}", name, "mcp.E003")
                if schema.get("type") != "object":
                    err(f"tool '{name}' {label} schema root must be type object", name, "mcp.E004")
            gated = any(requires_approval(tier, t.securable, t.operation) for tier in ("operator", "supervised"))
            if gated and "approval_id" not in t.input_schema.get("properties", {}):
                err(f"approval-gated tool '{name}' does not declare approval_id", name, "mcp.E005")
            if t.effect not in EFFECTS or t.service_scope not in SERVICE_SCOPE_CLASSES:
                err(f"tool '{name}' has an invalid effect or service-scope class", name, "mcp.E006")
            if (t.effect == "read") != (t.operation == "Read"):
                err(f"tool '{name}': readOnlyHint must match operation Read", name, "mcp.E007")
            if not t.description or len(t.description) < 20:
                err(f"tool '{name}' needs a decision-grade description", name, "mcp.E008")
            for pname, _prop in _free_text(t.input_schema):
                err(f"tool '{name}' free-text argument '{pname}' needs maxLength", name, "mcp.E009")
            for pname in _unbounded_integers(t.input_schema):
                err(f"tool '{name}' integer argument '{pname}' needs minimum and maximum", name, "mcp.E010")
        for uri, r in cat.resources.items():
            if r.service_scope not in RESOURCE_SCOPE_CLASSES:
                err(f"resource '{uri}' has an invalid service-scope class", uri, "mcp.E011")
    return errors


def _is_string(schema: JsonObject) -> bool:
    t = schema.get("type")
    return t == "string" or (isinstance(t, list) and "string" in t)


def _free_text(schema: JsonObject, path: str = "") -> Iterator[tuple[str, JsonObject]]:
    """String schemas without maxLength/enum/const (bounded input schemas): properties, array items and
    additionalProperties, however deep."""
    children = [(f"{path}.{name}" if path else name, prop) for name, prop in (schema.get("properties") or {}).items()]
    if isinstance(schema.get("items"), dict):
        children.append((path + "[]", schema["items"]))
    if isinstance(schema.get("additionalProperties"), dict):
        children.append((f"{path}.*" if path else "*", schema["additionalProperties"]))
    for pname, prop in children:
        if not isinstance(prop, dict):
            continue
        if _is_string(prop) and not any(k in prop for k in ("maxLength", "enum", "const")):
            yield pname, prop
        yield from _free_text(prop, pname)


def _unbounded_integers(schema: JsonObject, prefix: str = "") -> Iterator[str]:
    """Integer properties without both bounds (an out-of-range number must be a -32602, never a crash)."""
    for pname, prop in (schema.get("properties") or {}).items():
        if not isinstance(prop, dict):
            continue
        if prop.get("type") == "integer" and not ("minimum" in prop and "maximum" in prop):
            yield prefix + pname
        if prop.get("type") == "object":
            yield from _unbounded_integers(prop, prefix + pname + ".")
        if prop.get("type") == "array" and isinstance(prop.get("items"), dict):
            yield from _unbounded_integers(prop["items"], prefix + pname + "[].")
