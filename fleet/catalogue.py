"""The JSON Schemas an agent declares in its plugin catalogue (``register``'s ``plugins``: each action's
``params``, and its plugin's ``config`` keys), checked before the server stores them and again whenever it
validates against them: they come from the agent, so the server treats them as untrusted input.

A usable schema is a valid Draft 2020-12 schema (its ``pattern``s compile) whose ``$ref``/``$dynamicRef``s are
local (``#…``) and resolve within it. Validation never retrieves anything (yuzu.schemas.NO_RETRIEVAL) and a
schema that still cannot be applied (stored before these checks, or looping on itself) raises BadSchema, which
the callers turn into a refusal naming the agent and plugin — never a server error."""

import json
import re
from functools import lru_cache
from typing import TYPE_CHECKING

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012, Schema, SchemaResource

from yuzu.schemas import NO_RETRIEVAL

if TYPE_CHECKING:  # referencing exports Resolver only from its private core module
    from referencing._core import Resolver

REF_KEYWORDS = ("$ref", "$dynamicRef")
CACHED_SCHEMA_CHARS = 8192  # verdicts on schemas longer than this are not cached (bounds the cache's memory)


class BadSchema(Exception):
    """A schema an agent declared cannot be applied; the message says why."""


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
        Draft202012Validator.check_schema(schema)  # also compiles every pattern (the regex format)
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


def _references(resource: SchemaResource, resolver: "Resolver[Schema]") -> str | None:
    """The first ``$ref`` that points outside the schema or resolves to nothing in it (walking the schema's
    subschemas as jsonschema does, so an ``enum`` or ``const`` value holding a "$ref" key is data, not a ref)."""
    resolver = resolver.in_subresource(resource)
    contents = resource.contents
    if isinstance(contents, dict):
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
        return next(iter(Draft202012Validator(schema, registry=NO_RETRIEVAL).iter_errors(instance)), None)
    except Unresolvable as exc:
        raise BadSchema(f"a reference does not resolve within the schema: {_short(str(exc))}") from None
    except RecursionError:
        raise BadSchema("it refers to itself without end") from None
    except re.error as exc:
        raise BadSchema(f"a pattern does not compile: {exc}") from None


def first_error(schema, instance) -> ValidationError | None:
    """The first error of ``instance`` against an agent-declared ``schema``, or None; raises BadSchema when
    the schema cannot be applied."""
    problem = schema_problem(schema)
    if problem is not None:
        raise BadSchema(problem)
    return _first_error(schema, instance)


def entry_problems(spec) -> list[str]:
    """What is unusable in one catalogue entry (``{risk, params, config, …}``): its ``params`` schema and each
    of its ``config`` key schemas. An entry that is not an object carries no schema (the server ignores it)."""
    if not isinstance(spec, dict):
        return []
    problems = []
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
