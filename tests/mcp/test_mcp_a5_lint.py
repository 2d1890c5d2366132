"""The A5 lint: what a model needs to read a tool right, checked on every tool of the served catalogues.

- every tool has an output schema (an object that declares its properties);
- every list tool (a Read tool whose result has a required array that may be empty) says in its
  description what an empty result means;
- every poll tool (tool.poll) states its retry rule (retry_after_ms, or "no faster than …");
- every free-text argument is bounded (maxLength, enum or const), however deep (the mcp.E009 check).
"""

import re

from jsonschema import Draft202012Validator

from mcp.apps import _free_text
from mcp.registry import Tool, catalogue
from mcp.schema import array, integer, obj, string

CATALOGUES = ("v1", "bridge")  # the served ones (test modules register scratch catalogues of their own)
EMPTY = re.compile(r"\bempty\b", re.I)
RETRY_RULE = re.compile(r"retry_after_ms|no faster than", re.I)


def possibly_empty_lists(tool):
    """The required top-level arrays of a Read tool's result that may be empty (no minItems ≥ 1)."""
    out = tool.output_schema or {}
    if tool.operation != "Read":
        return []
    props = out.get("properties") or {}
    return [name for name in out.get("required", [])
            if (props.get(name) or {}).get("type") == "array" and (props[name].get("minItems") or 0) < 1]


def a5_problems(tool):
    problems = []
    out = tool.output_schema
    if not isinstance(out, dict) or out.get("type") != "object" or not out.get("properties"):
        problems.append("no output schema declaring its properties")
    lists = possibly_empty_lists(tool)
    if lists and not EMPTY.search(tool.description):
        problems.append(f"list tool ({', '.join(lists)}) does not say what an empty result means")
    if tool.poll and not RETRY_RULE.search(tool.description):
        problems.append("poll tool does not state its retry rule")
    problems += [f"free-text argument '{name}' is unbounded" for name, _ in _free_text(tool.input_schema)]
    return problems


def served_tools():
    return [t for name in CATALOGUES for t in sorted(catalogue(name).tools.values(), key=lambda t: t.name)]


def test_every_served_tool_passes_the_a5_lint():
    tools = served_tools()
    assert len(tools) > 50 and {t.catalogue for t in tools} == set(CATALOGUES)
    failures = {f"{t.catalogue}/{t.name}": a5_problems(t) for t in tools if a5_problems(t)}
    assert failures == {}


def fake(**kw):
    spec = {"name": "x", "title": "X", "description": "Lists things.", "securable": "Infrastructure",
            "operation": "Read", "input_schema": obj(), "handler": None,
            "output_schema": obj({"items": array(string(8)), "count": integer(0)}, ["items", "count"])}
    return Tool(**{**spec, **kw})


def test_the_lint_catches_each_kind_of_gap():
    assert a5_problems(fake(description="Lists things. An empty list means none.")) == []
    assert a5_problems(fake()) == ["list tool (items) does not say what an empty result means"]
    # An array that can never be empty needs no sentence; a write's result is not a listing.
    assert a5_problems(fake(output_schema=obj({"items": array(string(8), min_items=1)}, ["items"]))) == []
    assert a5_problems(fake(operation="Write")) == []
    assert a5_problems(fake(output_schema=None)) == ["no output schema declaring its properties"]
    assert a5_problems(fake(output_schema={"type": "object"})) == ["no output schema declaring its properties"]
    poll = fake(description="One thing. Empty never.", poll=True)
    assert a5_problems(poll) == ["poll tool does not state its retry rule"]
    assert a5_problems(fake(description="Poll it; wait retry_after_ms. Empty: none.", poll=True)) == []
    unbounded = {"type": "object", "properties": {
        "q": {"type": "string"}, "tags": {"type": "array", "items": {"type": ["string", "null"]}},
        "params": {"type": "object", "additionalProperties": {"type": "string"}},
        "nested": obj({"deep": obj({"text": {"type": "string"}, "ok": string(10)})}),
        "mode": {"type": "string", "enum": ["a"]}}}
    assert list(a5_problems(fake(description="Empty: none.", input_schema=unbounded))) == [
        "free-text argument 'q' is unbounded", "free-text argument 'tags[]' is unbounded",
        "free-text argument 'params.*' is unbounded", "free-text argument 'nested.deep.text' is unbounded"]


def test_the_scope_catalogue_matches_its_output_schema():
    """discover_scope_kinds used to declare a bare {"type": "object"}; its schema now says what it returns."""
    from fleet.inventory import describe_scope

    schema = catalogue("v1").tools["discover_scope_kinds"].output_schema
    assert list(Draft202012Validator(schema).iter_errors(describe_scope())) == []
