"""Guardian's guard-authoring catalogue (spark, assertion and remediation block types with their JSON
Schemas) and the check of a rule's ``{spark, assertion, remediation}`` spec against it. One builder serves
get_guardian_schemas, yuzu://guardian/schemas and GET /api/v1/guaranteed-state/schemas, byte for byte."""

import json
from functools import lru_cache

from jsonschema import Draft202012Validator

from yuzu.schemas import NO_RETRIEVAL

SERVICE_NAME = {"type": "string", "pattern": "^[A-Za-z0-9._@-]{1,256}$"}
PATH = {"type": "string", "minLength": 1, "maxLength": 4096}
RESILIENCE = {"type": "object", "additionalProperties": False, "properties": {
    "mode": {"enum": ["persist", "backoff", "bounded"], "default": "persist"},
    "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100, "default": 5},
    "backoff_ms": {"type": "integer", "minimum": 100, "maximum": 600000, "default": 1000}}}


def _block(type_, params=None):
    return {"type": "object", "required": ["type"], "additionalProperties": False,
            "properties": {"type": {"const": type_},
                           "params": params or {"type": "object", "additionalProperties": False, "properties": {}}}}


def _params(properties, required=()):
    return {"type": "object", "additionalProperties": False, "properties": properties, "required": list(required)}


CATALOGUE = {
    "spark": {t: _block(t) for t in ("registry-change", "file-change", "service-status-change")},
    "assertion": {
        "registry-value-equals": _block("registry-value-equals", _params({
            "hive": {"enum": ["HKLM", "HKCU", "HKCR", "HKU"]}, "key": {"type": "string", "maxLength": 1024},
            "value_name": {"type": "string", "maxLength": 256},
            "value_type": {"enum": ["REG_DWORD", "REG_QWORD", "REG_SZ", "REG_EXPAND_SZ"]},
            "expected": {"type": ["string", "integer"]}}, ["hive", "key", "value_name", "value_type", "expected"])),
        "file-exists": _block("file-exists", _params({
            "path": PATH, "expected": {"enum": ["present", "absent"], "default": "present"}}, ["path"])),
        "file-hash-equals": _block("file-hash-equals", _params({
            "path": PATH, "expected_hash": {"type": "string", "pattern": "^([0-9a-fA-F]{64})?$",
                                            "description": "SHA-256; empty = the hash when the guard is armed"},
            "max_bytes": {"type": "integer", "minimum": 1, "maximum": 1 << 32, "default": 67108864},
            "settle_ms": {"type": "integer", "minimum": 0, "maximum": 60000, "default": 750}}, ["path"])),
        "service-running": _block("service-running", _params({"service_name": SERVICE_NAME}, ["service_name"])),
        "service-stopped": _block("service-stopped", _params({"service_name": SERVICE_NAME}, ["service_name"])),
    },
    "remediation": {t: _block(t, RESILIENCE) for t in ("alert-only", "enforce")},
}
SPARK_FOR = {"registry-value-equals": "registry-change", "file-exists": "file-change",
             "file-hash-equals": "file-change", "service-running": "service-status-change",
             "service-stopped": "service-status-change"}


def catalogue():
    return {"version": 1, "description": "Guardian guard-authoring catalogue: a guard is a spark (what wakes it), "
                                         "an assertion (what must hold) and a remediation (alert-only, or enforce "
                                         "the expected state where the agent's operator allows it).",
            "schemas": CATALOGUE}


@lru_cache(maxsize=1)
def catalogue_text():
    """The catalogue as the bytes every face sends, and its ETag (FNV-1a-64 of those bytes)."""
    text = json.dumps(catalogue(), sort_keys=True, separators=(",", ":"))
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return text, f'"{h:016x}"'


def check_spec(spec):
    """The error in a rule's spec ({spark, assertion, remediation}), or None."""
    if not isinstance(spec, dict) or set(spec) - {"spark", "assertion", "remediation"}:
        return "spec must be an object with spark, assertion and remediation"
    for category in ("spark", "assertion", "remediation"):
        block = spec.get(category)
        if not isinstance(block, dict) or block.get("type") not in CATALOGUE[category]:
            return f"spec.{category}.type must be one of {', '.join(CATALOGUE[category])}"
        error = next(iter(Draft202012Validator(CATALOGUE[category][block["type"]],
                                                registry=NO_RETRIEVAL).iter_errors(block)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            return f"spec.{category}{'/' + where if where else ''}: {error.message[:300]}"
    if SPARK_FOR[spec["assertion"]["type"]] != spec["spark"]["type"]:
        return (f"a {spec['assertion']['type']} assertion is woken by a {SPARK_FOR[spec['assertion']['type']]} "
                "spark")
    return None
