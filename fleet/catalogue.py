"""The JSON Schemas an agent declares in its plugin catalogue (``register``'s ``plugins``: each action's
``params``, and its plugin's ``config`` keys), checked before the server stores them and again whenever it
validates against them: they come from the agent, so the server treats them as untrusted input.

A usable schema is a valid Draft 2020-12 schema whose ``$ref``/``$dynamicRef``s are local (``#…``) and resolve
within it, whose ``pattern``s RE2 compiles, and that holds no ``patternProperties``. Validation never retrieves
anything (yuzu.schemas.NO_RETRIEVAL) and matches patterns with RE2 (``AgentSchemaValidator``), whose time is
linear in the text: Python's backtracking ``re``, which plain jsonschema uses, lets one pattern such as
``^(a+)+$`` hold a server worker for hours on a 40-character value (ReDoS). RE2 has no lookaround or
backreferences, so a pattern using them is refused; ``patternProperties`` is refused outright, because
jsonschema matches its regexes in three keywords (itself, ``additionalProperties``, ``unevaluatedProperties``)
with Python's re. A schema that still cannot be applied (stored before these
checks, or looping on itself) raises BadSchema, which the callers turn into a refusal naming the agent and
plugin — never a server error. The server's own (trusted) schemas keep plain jsonschema."""

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import re2
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012, Schema, SchemaResource

from yuzu.schemas import NO_RETRIEVAL

from .models import Agent, AgentInventory

if TYPE_CHECKING:  # referencing exports Resolver only from its private core module
    from referencing._core import Resolver

REF_KEYWORDS = ("$ref", "$dynamicRef")
RISKS = ("read", "write", "destructive")  # an action's class, lowest first
CACHED_SCHEMA_CHARS = 8192  # verdicts on schemas longer than this are not cached (bounds the cache's memory)


class BadSchema(Exception):
    """A schema an agent declared cannot be applied; the message says why."""


# --- patterns: RE2 -----------------------------------------------------------------------------------

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is an answer to the agent, not a line in the server's log
_RE2_OPTIONS.max_mem = 1 << 20  # per compiled pattern (program and match cache); a larger one does not compile


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> tuple[Any, str]:
    """(``pattern`` compiled by RE2, "") or (None, why RE2 cannot compile it)."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS), ""
    except re2.error as exc:
        why = exc.args[0] if exc.args else ""
        return None, why.decode(errors="replace") if isinstance(why, bytes) else str(why)
    except UnicodeEncodeError:  # RE2 reads UTF-8, which has no lone surrogates
        return None, "a lone surrogate is not Unicode text"


def pattern_problem(pattern: str) -> str | None:
    """Why RE2 cannot run ``pattern``, or None."""
    compiled, why = _compiled(pattern)
    if compiled is not None:
        return None
    return (f"pattern '{_short(pattern)}' is not supported: agent-declared patterns must be linear-time (RE2 "
            f"syntax: no lookaround or backreferences) — RE2: {why}")


def _search(pattern: str, text: str) -> bool:
    """``re.search(pattern, text)`` as jsonschema does it, in RE2 (time linear in ``text``)."""
    compiled, _ = _compiled(pattern)
    if compiled is None:  # only via a $ref into a part of the schema the checks do not read as a schema
        raise BadSchema(pattern_problem(pattern) or "a pattern does not compile")
    try:
        return compiled.search(text) is not None
    except UnicodeEncodeError:  # a lone surrogate (JSON's "\ud800"): RE2 reads UTF-8, so it is matched as U+FFFD
        return compiled.search(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")) is not None


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


#: Draft 2020-12 with ``pattern`` matched by RE2 — for agent-declared schemas only. ``patternProperties`` (whose
#: regexes jsonschema also runs, with Python's re, for additionalProperties and unevaluatedProperties) is not
#: allowed in them at all (``_problem``): ``propertyNames`` with a ``pattern`` constrains names instead.
AgentSchemaValidator = validators.extend(Draft202012Validator, {"pattern": _pattern})


def schema_problem(schema) -> str | None:
    """Why ``schema`` cannot be used, or None. Honest agents declare the same schemas, so the verdicts are
    cached by the schema's text (a register storm checks each distinct schema once)."""
    if not isinstance(schema, (dict, bool)):
        return "a schema must be a JSON object or a boolean"
    text = json.dumps(schema, sort_keys=True)
    return (_cached_problem if len(text) <= CACHED_SCHEMA_CHARS else _problem)(text)


def _problem(text: str) -> str | None:
    schema = json.loads(text)
    try:
        AgentSchemaValidator.check_schema(schema)
        if _holds_key(schema, "patternProperties"):  # anywhere: a $ref can point into any part of the document
            return ("patternProperties is not supported in agent-declared schemas (its regexes would run on a "
                    "backtracking engine): constrain names with propertyNames and a pattern")
        root = DRAFT202012.create_resource(schema)
        problem = _references(root, NO_RETRIEVAL.resolver_with_root(root))
        if problem is None:
            _first_error(schema, {})  # a $ref loop that never consumes the instance (`{"$ref": "#"}`)
        return problem
    except SchemaError as exc:
        return f"not a valid JSON Schema (Draft 2020-12): {_short(exc.message)}"
    except BadSchema as exc:
        return str(exc)
    except RecursionError:
        return "nested too deeply"


_cached_problem = lru_cache(maxsize=1024)(_problem)


def _holds_key(document, key: str) -> bool:
    """Whether any object in the JSON ``document`` has ``key`` (iterative: a deep document is no recursion)."""
    todo = [document]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if key in node:
                return True
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return False


def _references(resource: SchemaResource, resolver: "Resolver[Schema]") -> str | None:
    """The first ``$ref`` that points outside the schema or resolves to nothing in it, or pattern RE2 cannot
    run (walking the schema's subschemas as jsonschema does, so an ``enum`` or ``const`` value holding a "$ref"
    or "pattern" key is data, not a ref or pattern)."""
    resolver = resolver.in_subresource(resource)
    contents = resource.contents
    if isinstance(contents, dict):
        if isinstance(contents.get("pattern"), str) and (problem := pattern_problem(contents["pattern"])):
            return problem
        for keyword in REF_KEYWORDS:
            ref = contents.get(keyword)
            if not isinstance(ref, str):
                continue
            if not ref.startswith("#"):
                return f"{keyword} '{_short(ref)}' points outside the schema (only local references, '#…', are allowed)"
            try:
                resolver.lookup(ref)
            except Unresolvable:
                return f"{keyword} '{_short(ref)}' does not resolve within the schema"
    for sub in resource.subresources():
        problem = _references(sub, resolver)
        if problem is not None:
            return problem
    return None


def _short(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."


def _first_error(schema, instance) -> ValidationError | None:
    try:
        return next(iter(AgentSchemaValidator(schema, registry=NO_RETRIEVAL).iter_errors(instance)), None)
    except Unresolvable as exc:
        raise BadSchema(f"a reference does not resolve within the schema: {_short(str(exc))}") from None
    except RecursionError:
        raise BadSchema("it refers to itself without end") from None


def first_error(schema, instance) -> ValidationError | None:
    """The first error of ``instance`` against an agent-declared ``schema``, or None; raises BadSchema when
    the schema cannot be applied."""
    problem = schema_problem(schema)
    if problem is not None:
        raise BadSchema(problem)
    return _first_error(schema, instance)


def entry_problems(spec) -> list[str]:
    """What is unusable in one catalogue entry (``{risk, params, config, …}``): a risk that is not one of RISKS,
    its ``params`` schema and each of its ``config`` key schemas. An entry that is not an object carries no schema
    (the server ignores it)."""
    if not isinstance(spec, dict):
        return []
    problems = []
    if spec.get("risk") not in RISKS:  # what an approver is shown as the action's class (Approval.risk: 16 chars)
        problems.append(f"risk: must be one of {', '.join(RISKS)}")
    if spec.get("params") is not None and (why := schema_problem(spec["params"])):
        problems.append(f"params: {why}")
    config = spec.get("config")
    if isinstance(config, dict):
        problems.extend(f"config.{key}: {why}" for key, value in config.items()
                        if isinstance(value, dict) and (why := schema_problem(value)))
    return problems


def clean(plugins: dict) -> tuple[dict, dict[str, str]]:
    """(the catalogue without its unusable entries, {dropped "plugin.action": why})."""
    kept, dropped = {}, {}
    for name, spec in plugins.items():
        problems = entry_problems(spec)
        if problems:
            dropped[name] = "; ".join(problems)
        else:
            kept[name] = spec
    return kept, dropped


def declared_entry(specs):
    """What an approver is shown of an action the targets declare alike or not (``specs``: their distinct catalogue
    entries for it, each agent's own words): the highest risk any declares — one agent cannot lower a wider
    command's class; a risk outside RISKS (stored before the register checked it) counts as destructive — and the
    description only when they all give the same one. None when there is none."""
    if not specs:
        return None
    rank = {risk: i for i, risk in enumerate(RISKS)}
    top = max(specs, key=lambda s: rank.get(s.get("risk"), len(RISKS)))
    descriptions = {s.get("description") or "" for s in specs}
    return {**top, "risk": top.get("risk") if top.get("risk") in rank else RISKS[-1],
            "description": descriptions.pop() if len(descriptions) == 1 else
            "(the targeted agents describe this action differently)"}


def declaring_agents(declares, agent_ids=None, limit=3) -> tuple[list[str], str]:
    """The first ``limit`` agents (by id; all, or those in ``agent_ids``) whose stored catalogue ``declares``
    (a predicate on the catalogue), and "hostname (id), …" naming them — for a refusal caused by a schema."""
    rows = AgentInventory.objects.filter(plugin=AgentInventory.CATALOGUE)
    if agent_ids is not None:
        rows = rows.filter(agent_id__in=agent_ids)
    found: list[str] = []
    for agent_id, data in rows.order_by("agent_id").values_list("agent_id", "data").iterator():
        if isinstance(data, dict) and declares(data):
            found.append(agent_id)
            if len(found) == limit:
                break
    hosts = dict(Agent.objects.filter(pk__in=found).values_list("agent_id", "hostname"))
    return found, ", ".join(f"{hosts.get(a) or a} ({a})" for a in found)
