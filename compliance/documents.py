"""Policy documents: the YAML a person writes (``apiVersion: yuzu.io/v1alpha1``, ``kind: PolicyFragment`` or
``kind: Policy``), checked before anything is stored, and the CEL compliance expressions inside them.

Pure functions: ``parse(kind, text)`` returns the document's ``spec`` as plain data or raises
``DocumentError`` with a message a person can act on (the expected schema for a wrong ``kind``; the line and
column of a YAML or CEL syntax error). Expressions are CEL (cel-python), compiled on save and evaluated
with the check's JSON result bound as ``result`` — never Python ``eval``."""

import json
import math
import re
from functools import lru_cache

import celpy
import yaml
from celpy import celtypes
from jsonschema import Draft202012Validator

from yuzu.schemas import NO_RETRIEVAL

API_VERSION = "yuzu.io/v1alpha1"
MAX_DOCUMENT_BYTES = 64 * 1024
MAX_EXPRESSION_BYTES = 4096
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,127}$"
INSTRUCTION_RE = r"^[a-z0-9_.-]{1,64}$"
PLACEHOLDER_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
TRIGGER_TYPES = ("interval", "file_change", "service_status", "event_log", "registry", "startup")
SUPPORTED_TRIGGERS = ("interval", "startup")  # the rest are stored, and reported unsupported (docs/compliance.md)

_PARAMS = {"type": "object", "maxProperties": 32, "propertyNames": {"maxLength": 256},
           "additionalProperties": {"type": ["string", "number", "integer", "boolean"], "maxLength": 65536}}
_STEP = {"type": "object", "additionalProperties": False, "required": ["plugin", "action"],
         "properties": {"plugin": {"type": "string", "pattern": INSTRUCTION_RE},
                        "action": {"type": "string", "pattern": INSTRUCTION_RE},
                        "parameters": _PARAMS,
                        "compliance": {"type": "string", "maxLength": MAX_EXPRESSION_BYTES}}}
_METADATA = {"type": "object", "required": ["name"], "additionalProperties": False,
             "properties": {"name": {"type": "string", "pattern": NAME_RE},
                            "description": {"type": "string", "maxLength": 1024}}}


def _document(kind, spec):
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
            "properties": {"apiVersion": {"const": API_VERSION}, "kind": {"const": kind}, "metadata": _METADATA,
                           "spec": spec}}


SCHEMAS = {
    "PolicyFragment": _document("PolicyFragment", {
        "type": "object", "required": ["check"], "additionalProperties": False,
        "properties": {"check": {**_STEP, "required": ["plugin", "action", "compliance"]},
                       "fix": _STEP, "postCheck": _STEP}}),
    "Policy": _document("Policy", {
        "type": "object", "required": ["fragment"], "additionalProperties": False,
        "properties": {
            "fragment": {"type": "string", "minLength": 1, "maxLength": 128,
                         "description": "The fragment's name or id"},
            "scope": {"type": "string", "maxLength": 8192, "description": "Scope expression (ignored when "
                                                                          "managementGroups is given)"},
            "enabled": {"type": "boolean"},
            "triggers": {"type": "array", "maxItems": 16, "items": {
                "type": "object", "required": ["type"], "additionalProperties": False,
                "properties": {"type": {"enum": list(TRIGGER_TYPES)},
                               "interval": {"type": "integer", "minimum": 1, "maximum": 31_536_000},
                               "interval_seconds": {"type": "integer", "minimum": 1, "maximum": 31_536_000},
                               "path": {"type": "string", "maxLength": 4096},
                               "service": {"type": "string", "maxLength": 256}}}},
            "managementGroups": {"type": "array", "maxItems": 64, "items": {"type": "string", "minLength": 1,
                                                                            "maxLength": 128}},
            "inputs": {"type": "object", "maxProperties": 32,
                       "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$"},
                       "additionalProperties": {"type": ["string", "number", "integer", "boolean"],
                                                "maxLength": 65536}}}}),
}


class DocumentError(ValueError):
    """A document that cannot be stored; ``extra`` goes into the error body (line, column, expected_schema)."""

    def __init__(self, message, **extra):
        super().__init__(message)
        self.message = message
        self.extra = {k: v for k, v in extra.items() if v is not None}


class _NoAliases(yaml.SafeLoader):
    """YAML without anchors and aliases: a 64 KiB document cannot expand into a billion nodes."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise DocumentError("YAML aliases (*name) are not allowed in policy documents",
                                line=mark.line + 1, column=mark.column + 1)
        return super().compose_node(parent, index)

    def construct_yaml_float(self, node):
        """Finite numbers only: .inf, .nan and 1.0e+999 (which overflows to inf) pass the schemas' "number",
        and no JSON column stores them (PostgreSQL refuses 'Infinity', SQLite's JSON check fails the row)."""
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            mark = node.start_mark
            raise DocumentError(f"{node.value[:32]!r} at line {mark.line + 1} is not a finite number; numbers must "
                                "be finite (no .inf, .nan or values beyond the float range)",
                                line=mark.line + 1, column=mark.column + 1)
        return value


    def construct_yaml_int(self, node):
        """Integers within 64 bits: a decimal of over 4,300 digits makes int() raise ValueError, and a longer hex,
        octal or binary one is read but no JSON column writes it back (json refuses to print it)."""
        mark = node.start_mark
        try:
            value = super().construct_yaml_int(node)
        except ValueError:
            value = None
        if value is None or not -(2**63) <= value < 2**64:
            raise DocumentError(f"{node.value[:32]!r} at line {mark.line + 1} is not an integer within 64 bits",
                                line=mark.line + 1, column=mark.column + 1)
        return value


_NoAliases.add_constructor("tag:yaml.org,2002:float", _NoAliases.construct_yaml_float)
_NoAliases.add_constructor("tag:yaml.org,2002:int", _NoAliases.construct_yaml_int)


def load(text):
    """The YAML text as data (a mapping), or DocumentError."""
    if not isinstance(text, str) or not text.strip():
        raise DocumentError("the document is empty; send the YAML (apiVersion, kind, metadata, spec)")
    if len(text.encode(errors="surrogatepass")) > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"the document exceeds {MAX_DOCUMENT_BYTES} bytes")
    if "\x00" in text or re.search("[\ud800-\udfff]", text):
        raise DocumentError("the document contains a NUL character or an unpaired surrogate")
    try:
        data = yaml.load(text, Loader=_NoAliases)  # noqa: S506  # a SafeLoader subclass
    except DocumentError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise DocumentError(f"malformed YAML: {exc.problem or exc.context}",
                            line=mark.line + 1 if mark else None, column=mark.column + 1 if mark else None) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise DocumentError(f"malformed YAML: {str(exc)[:200]}") from None
    except ValueError as exc:  # a constructor's own: a timestamp such as 2020-13-45 is no date
        raise DocumentError(f"malformed YAML: a value cannot be read ({str(exc)[:200]})") from None
    if not isinstance(data, dict):
        raise DocumentError("the document must be a YAML mapping with apiVersion, kind, metadata and spec")
    return data


def parse(kind, text):
    """(metadata, spec) of a ``kind`` document, checked against its schema and its expressions compiled."""
    data = load(text)
    schema = SCHEMAS[kind]
    if data.get("kind") != kind:
        got = data.get("kind")
        raise DocumentError(f"kind must be '{kind}'" + (f", not '{str(got)[:64]}'" if got else " (it is missing)"),
                            expected_schema=schema)
    if data.get("apiVersion") != API_VERSION:
        raise DocumentError(f"apiVersion must be '{API_VERSION}'", expected_schema=schema)
    error = next(iter(sorted(Draft202012Validator(schema, registry=NO_RETRIEVAL).iter_errors(data), key=lambda e: list(map(str, e.path)))),
                 None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(document)"
        raise DocumentError(f"{kind} does not match its schema at '{where}': {error.message[:300]}",
                            expected_schema=schema)
    if kind == "PolicyFragment":
        for step in ("check", "fix", "postCheck"):
            expr = (data["spec"].get(step) or {}).get("compliance")
            if expr is not None and not expr.strip():
                raise DocumentError(f"spec.{step}.compliance is empty; an empty expression is never compliant")
            if expr is not None:
                compile_expression(expr, f"spec.{step}.compliance")
    return data["metadata"], data["spec"]


_env = celpy.Environment()


def compile_expression(expr, where="expression"):
    """The compiled CEL program (cached by its text), or DocumentError with the position of the syntax
    error."""
    return _compiled(expr, where)


@lru_cache(maxsize=512)
def _compiled(expr, where):
    if len(expr.encode()) > MAX_EXPRESSION_BYTES:
        raise DocumentError(f"{where} exceeds {MAX_EXPRESSION_BYTES} bytes")
    try:
        return _env.program(_env.compile(expr))
    except celpy.CELParseError as exc:
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        at = f" at line {line}, column {column}" if line else ""
        raise DocumentError(f"{where} is not valid CEL (syntax error{at})", line=line, column=column,
                            expression=expr[:512]) from None
    except Exception as exc:  # the parser's other failures (recursion on a pathological expression, …)
        raise DocumentError(f"{where} is not valid CEL: {type(exc).__name__}") from None


def substitute(params, inputs):
    """Fragment parameters with ``${name}`` replaced by the policy's inputs; every value a string (the agent
    protocol's). Raises DocumentError naming an input that is not bound."""
    out = {}
    for key, value in (params or {}).items():
        text = value if isinstance(value, str) else json.dumps(value)

        def bind(match, key=key):
            name = match.group(1)
            if name not in inputs:
                raise DocumentError(f"parameter '{key}' uses input '${{{name}}}', which the policy does not bind",
                                    remediation=f"add spec.inputs.{name} to the policy")
            v = inputs[name]
            return v if isinstance(v, str) else json.dumps(v)

        out[key] = PLACEHOLDER_RE.sub(bind, text)
    return out


def interval_of(triggers, default=3600, floor=60):
    """Seconds between evaluations: the first interval trigger's (at least ``floor``), else ``default``."""
    for t in triggers:
        if t.get("type") == "interval":
            seconds = t.get("interval_seconds") or t.get("interval")
            if seconds:
                return max(int(seconds), floor)
    return default


# --- evaluation ----------------------------------------------------------------------------------

def result_value(output):
    """What an agent answered, as the value bound to ``result``: its JSON, or the text itself."""
    try:
        return json.loads(output) if output else None
    except ValueError:
        return output


def evaluate(expr, result):
    """(True | False | None, detail): whether ``result`` satisfies ``expr``; None with the reason when it
    cannot be decided (an evaluation error, or a value that is not a boolean). An empty expression is never
    satisfied."""
    if not expr or not expr.strip():
        return None, "the compliance expression is empty"
    try:
        program = compile_expression(expr)
        value = program.evaluate({"result": celpy.json_to_cel(result)})
    except DocumentError as exc:
        return None, exc.message
    except Exception as exc:  # CELEvalError and what json_to_cel refuses
        return None, f"CEL evaluation failed: {str(exc)[:300]}"
    if isinstance(value, Exception):  # celpy may return its error value instead of raising it
        return None, f"CEL evaluation failed: {str(value)[:300]}"
    if not isinstance(value, celtypes.BoolType):
        return None, f"the compliance expression yielded {type(value).__name__}, not a boolean"
    return bool(value), ""
