"""The scope (targeting) language for fleet agents: a tokenizer, a recursive-descent parser that builds
a small AST, and a compiler from that AST to a Django ``Q`` over ``fleet.models.Agent``.

Grammar (keywords are case-insensitive)::

    expr       := or
    or         := and ("OR" and)*
    and        := not ("AND" not)*
    not        := "NOT" not | primary
    primary    := "(" or ")"
                | "__all__" | "group:" (word | string)
                | "EXISTS" attr
                | "LEN" "(" attr ")" cmp integer
                | "STARTSWITH" "(" attr "," value ")"
                | attr ("==" | "!=" | "<" | ">" | "<=" | ">=" | "LIKE" | "CONTAINS") value
                | attr "IN" "(" value ("," value)* ")"
    attr       := ostype | hostname | arch | agent_version | tag:<key> | props.<key>
    value      := word | 'single' | "double"        (backslash escapes inside quotes)

Semantics, as compiled to SQL (the same on SQLite and PostgreSQL):

- ``==``, ``IN``, ``LIKE``, ``CONTAINS`` and ``STARTSWITH`` are case-insensitive (ASCII-only on SQLite).
- ``LIKE`` wildcards: ``*`` and ``%`` match any run of characters, ``?`` and ``_`` exactly one.
- ``<``, ``>``, ``<=``, ``>=`` compare numerically when both sides are plain decimal numbers, otherwise
  as strings (in the database's collation). For ``agent_version`` they compare dotted versions
  (``1.10.0 > 1.9``): the distinct versions in the fleet are read when the expression is compiled and
  compared in Python, so the query holds the list of matching versions.
- A condition on a tag or prop the agent does not have is false; ``!=`` is ``NOT ==``, so
  ``tag:env != prod`` and ``NOT tag:env == prod`` both match agents without an ``env`` tag.
- A prop that is not a JSON string compares by its JSON text (``8``, ``true``, ``null``).
- ``EXISTS tag:k`` / ``EXISTS props.k`` test presence; ``EXISTS hostname`` (a column) tests non-empty.
- ``group:<name|id>`` is a group's members; a dynamic group contributes its own scope expression
  (a group that refers back to itself is an error). Descendant groups are not included.
- Nesting depth counts each enclosing parenthesis and NOT (AND/OR can only nest through parentheses);
  more than ``MAX_DEPTH`` is an error, as is an expression over ``MAX_LENGTH`` UTF-8 bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import reduce
from operator import and_, or_

from django.db.models import (
    Case,
    Exists,
    F,
    FloatField,
    OuterRef,
    Q,
    TextField,
    Value,
    When,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Length
from django.db.models.lookups import (
    Exact,
    GreaterThan,
    GreaterThanOrEqual,
    IContains,
    IExact,
    IStartsWith,
    LessThan,
    LessThanOrEqual,
    Lookup,
    Regex,
)

from .models import CATEGORY_TAG_KEYS, TAG_KEY_RE, Agent, ManagementGroup, Tag

MAX_DEPTH = 10
MAX_LENGTH = 8192  # bytes, UTF-8

FIELDS = {"ostype": "os", "hostname": "hostname", "arch": "arch", "agent_version": "agent_version"}
PROPS_KEY_RE = re.compile(r"(?![0-9]+$)[A-Za-z0-9_]{1,64}")  # all-digit keys would be JSON array indexes
KEYWORDS = {"AND", "OR", "NOT", "LIKE", "IN", "CONTAINS", "EXISTS", "LEN", "STARTSWITH"}
COMPARISONS = ("==", "!=", "<", ">", "<=", ">=")
ORDERINGS = ("<", ">", "<=", ">=")
BINARY_OPERATORS = (*COMPARISONS, "LIKE", "CONTAINS")


class ScopeError(ValueError):
    """A malformed or unresolvable expression; ``position`` is a 0-based character offset."""

    def __init__(self, message, position=0):
        self.message, self.position = message, position
        super().__init__(f"{message} at position {position}")


# -- AST ------------------------------------------------------------------------------------------
# ``str(node)`` is the canonical form: values double-quoted, keywords upper-case, minimal parentheses.
# ``pos`` (offset in the source) is left out of equality so re-parsed canonical forms compare equal.


def _quote(text):
    escaped = text.translate({ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r"})
    return f'"{escaped}"'


@dataclass(frozen=True)
class Attr:
    kind: str  # "field", "tag" or "props"
    key: str
    pos: int = field(default=0, compare=False)

    def __str__(self):
        return {"field": "{}", "tag": "tag:{}", "props": "props.{}"}[self.kind].format(self.key)


@dataclass(frozen=True)
class All:
    pos: int = field(default=0, compare=False)

    def __str__(self):
        return "__all__"


@dataclass(frozen=True)
class Group:
    ref: str
    pos: int = field(default=0, compare=False)

    def __str__(self):
        return "group:" + (self.ref if re.fullmatch(r"[A-Za-z0-9_.:-]+", self.ref) else _quote(self.ref))


@dataclass(frozen=True)
class Compare:
    attr: Attr
    op: str  # one of BINARY_OPERATORS or "IN"
    value: str | tuple[str, ...]
    pos: int = field(default=0, compare=False)

    def __str__(self):
        if self.op == "IN":
            return f"{self.attr} IN ({', '.join(map(_quote, self.value))})"
        return f"{self.attr} {self.op} {_quote(self.value)}"


@dataclass(frozen=True)
class ExistsAttr:
    attr: Attr
    pos: int = field(default=0, compare=False)

    def __str__(self):
        return f"EXISTS {self.attr}"


@dataclass(frozen=True)
class Len:
    attr: Attr
    op: str  # one of COMPARISONS
    length: int
    pos: int = field(default=0, compare=False)

    def __str__(self):
        return f"LEN({self.attr}) {self.op} {self.length}"


@dataclass(frozen=True)
class StartsWith:
    attr: Attr
    prefix: str
    pos: int = field(default=0, compare=False)

    def __str__(self):
        return f"STARTSWITH({self.attr}, {_quote(self.prefix)})"


@dataclass(frozen=True)
class Not:
    operand: Node
    pos: int = field(default=0, compare=False)

    def __str__(self):
        inner = str(self.operand)
        return f"NOT ({inner})" if isinstance(self.operand, (And, Or)) else f"NOT {inner}"


@dataclass(frozen=True)
class And:
    operands: tuple[Node, ...]
    pos: int = field(default=0, compare=False)

    def __str__(self):
        return " AND ".join(f"({o})" if isinstance(o, Or) else str(o) for o in self.operands)


@dataclass(frozen=True)
class Or:
    operands: tuple[Node, ...]
    pos: int = field(default=0, compare=False)

    def __str__(self):
        return " OR ".join(map(str, self.operands))


Node = All | Group | Compare | ExistsAttr | Len | StartsWith | Not | And | Or


# -- Tokenizer ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    kind: str  # "word", "string", "keyword", "op", "(", ")", ",", "end"
    value: str  # decoded text (string contents; upper-case keyword)
    pos: int
    text: str  # as written in the source

    def describe(self):
        return "end of expression" if self.kind == "end" else f"'{self.text}'"


_TOKEN_RE = re.compile(r"(?P<op>==|!=|<=|>=|<|>)|(?P<punct>[(),])|(?P<word>[^\s()'\",=!<>]+)")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}


def _read_string(expr, start):
    """The decoded contents of the string literal whose opening quote is at ``start``, and its end."""
    quote, out, i = expr[start], [], start + 1
    while i < len(expr):
        c = expr[i]
        if c == quote:
            return "".join(out), i + 1
        if c == "\\" and i + 1 < len(expr):
            i += 1
            c = _ESCAPES.get(expr[i], expr[i])
        out.append(c)
        i += 1
    raise ScopeError("unterminated string", start)


def tokenize(expr):
    """The expression's tokens, ending with an "end" token."""
    tokens, i = [], 0
    while True:
        while i < len(expr) and expr[i].isspace():
            i += 1
        if i == len(expr):
            return [*tokens, Token("end", "", i, "")]
        if expr[i] in "'\"":
            value, end = _read_string(expr, i)
            tokens.append(Token("string", value, i, expr[i:end]))
            i = end
            continue
        m = _TOKEN_RE.match(expr, i)
        if not m:
            raise ScopeError(f"unexpected character '{expr[i]}' (use '==' or '!=')", i)
        text = m.group()
        if m.lastgroup == "word" and text.upper() in KEYWORDS:
            tokens.append(Token("keyword", text.upper(), i, text))
        else:
            tokens.append(Token(text if m.lastgroup == "punct" else m.lastgroup, text, i, text))
        i = m.end()


# -- Parser ---------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, expr):
        self.tokens = tokenize(expr)
        self.i = 0
        self.depth = 0

    # token helpers
    @property
    def tok(self):
        return self.tokens[self.i]

    def advance(self):
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def at(self, kind, value=None):
        return self.tok.kind == kind and (value is None or self.tok.value == value)

    def expect(self, kind, what, value=None):
        if not self.at(kind, value):
            raise ScopeError(f"expected {what}", self.tok.pos)
        return self.advance()

    def nested(self, tok, parse):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ScopeError(f"expression is nested deeper than {MAX_DEPTH} levels", tok.pos)
        node = parse()
        self.depth -= 1
        return node

    # grammar
    def parse(self):
        node = self.parse_or()
        if not self.at("end"):
            raise ScopeError(f"expected AND, OR or end of expression, not {self.tok.describe()}", self.tok.pos)
        return node

    def parse_or(self):
        return self.chain("OR", Or, self.parse_and)

    def parse_and(self):
        return self.chain("AND", And, self.parse_not)

    def chain(self, keyword, cls, parse_operand):
        first = parse_operand()
        operands = [first]
        while self.at("keyword", keyword):
            self.advance()
            operands.append(parse_operand())
        if len(operands) == 1:
            return first
        flat = [leaf for o in operands for leaf in (o.operands if isinstance(o, cls) else (o,))]
        return cls(tuple(flat), first.pos)

    def parse_not(self):
        if self.at("keyword", "NOT"):
            tok = self.advance()
            return Not(self.nested(tok, self.parse_not), tok.pos)
        return self.parse_primary()

    def parse_primary(self):
        tok = self.tok
        if tok.kind == "(":
            self.advance()
            node = self.nested(tok, self.parse_or)
            if self.at("end"):
                raise ScopeError("unclosed '('", tok.pos)
            self.expect(")", f"')' to close the '(' at position {tok.pos}, not {self.tok.describe()}")
            return node
        if tok.kind == "keyword" and tok.value in ("EXISTS", "LEN", "STARTSWITH"):
            self.advance()
            return getattr(self, f"parse_{tok.value.lower()}")(tok)
        if tok.kind == "word":
            if self.tokens[self.i + 1].kind == "(":
                raise ScopeError(f"unknown function '{tok.text}'", tok.pos)
            ground = self.parse_ground()
            if ground:
                return ground
            return self.parse_condition(self.parse_attr())
        raise ScopeError(f"expected a condition, not {tok.describe()}", tok.pos)

    def parse_ground(self):
        tok = self.tok
        if tok.value == "__all__":
            self.advance()
            return All(tok.pos)
        if not tok.value.lower().startswith("group:"):
            return None
        self.advance()
        ref = tok.value[len("group:") :]
        if not ref and self.at("string"):
            ref = self.advance().value
        if not ref:
            raise ScopeError("expected a group name or id after 'group:'", self.tok.pos)
        return Group(ref, tok.pos)

    def parse_attr(self, after=None):
        tok = self.tok
        if tok.kind != "word":
            raise ScopeError(f"expected an attribute after {after}" if after else "expected an attribute", tok.pos)
        self.advance()
        name, lower = tok.value, tok.value.lower()
        if lower in FIELDS:
            return Attr("field", lower, tok.pos)
        if lower.startswith("tag:"):
            key = name[4:]
            if not TAG_KEY_RE.match(key):
                raise ScopeError(f"invalid tag key '{key}' (1-64 characters of letters, digits and _.:-)", tok.pos)
            return Attr("tag", key.lower() if key.lower() in CATEGORY_TAG_KEYS else key, tok.pos)
        if lower.startswith("props."):
            key = name[6:]
            if not PROPS_KEY_RE.fullmatch(key):
                raise ScopeError(f"invalid props key '{key}' (1-64 characters of letters, digits and _)", tok.pos)
            return Attr("props", key, tok.pos)
        raise ScopeError(f"unknown attribute '{tok.text}'", tok.pos)

    def parse_value(self, after):
        if not self.at("word") and not self.at("string"):
            raise ScopeError(f"expected a value after {after}", self.tok.pos)
        return self.advance().value

    def parse_condition(self, attr):
        op = self.tok
        if op.kind in ("op", "keyword") and op.value in BINARY_OPERATORS:
            self.advance()
            return Compare(attr, op.value, self.parse_value(f"'{op.text}'"), attr.pos)
        if op.kind == "keyword" and op.value == "IN":
            self.advance()
            return Compare(attr, "IN", self.parse_in_list(), attr.pos)
        raise ScopeError(f"expected an operator after '{attr}'", op.pos)

    def parse_in_list(self):
        self.expect("(", "'(' after IN")
        values = [self.parse_value("'(' in the IN list")]
        while self.at(","):
            self.advance()
            values.append(self.parse_value("',' in the IN list"))
        self.expect(")", "',' or ')' in the IN list")
        return tuple(values)

    def parse_exists(self, tok):
        return ExistsAttr(self.parse_attr(after="EXISTS"), tok.pos)

    def parse_len(self, tok):
        self.expect("(", "'(' after LEN")
        attr = self.parse_attr(after="'LEN('")
        self.expect(")", "')' after the LEN attribute")
        op = self.expect("op", "a comparison operator after LEN(...)")
        if self.tok.kind not in ("word", "string") or not re.fullmatch(r"[0-9]+", self.tok.value):
            raise ScopeError(f"expected a non-negative integer after '{op.text}'", self.tok.pos)
        return Len(attr, op.value, int(self.advance().value), tok.pos)

    def parse_startswith(self, tok):
        self.expect("(", "'(' after STARTSWITH")
        attr = self.parse_attr(after="'STARTSWITH('")
        self.expect(",", "',' after the STARTSWITH attribute")
        prefix = self.parse_value("',' in STARTSWITH")
        self.expect(")", "')' to close STARTSWITH")
        return StartsWith(attr, prefix, tok.pos)


def parse(expr: str) -> Node:
    """Parse a scope expression into its AST; raise ScopeError (with a position) if it is malformed."""
    if not isinstance(expr, str):
        raise ScopeError("the scope expression must be a string", 0)
    encoded = expr.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_LENGTH:
        first_excess = len(encoded[:MAX_LENGTH].decode("utf-8", "ignore"))
        raise ScopeError(f"expression is longer than {MAX_LENGTH} bytes", first_excess)
    if not expr.strip():
        raise ScopeError("empty expression", 0)
    return _Parser(expr).parse()


def validate(expr) -> dict:
    """``{"valid": True, "expression": canonical}`` or ``{"valid": False, "error", "position"}``.
    Syntax only: group references are not looked up."""
    try:
        return {"valid": True, "expression": str(parse(expr))}
    except ScopeError as e:
        return {"valid": False, "error": str(e), "position": e.position}


# -- Compiler -------------------------------------------------------------------------------------

_NUMBER = r"[+-]?([0-9]+([.][0-9]*)?|[.][0-9]+)"  # the same in Python, SQLite (REGEXP) and PostgreSQL
_VERSION_RE = re.compile(r"[0-9]+(\.[0-9]+)*")
_ORDER_LOOKUPS = {"<": LessThan, ">": GreaterThan, "<=": LessThanOrEqual, ">=": GreaterThanOrEqual}
_COMPARE_LOOKUPS = {"==": Exact, **_ORDER_LOOKUPS}
_PY_ORDER = {"<": lambda c: c < 0, ">": lambda c: c > 0, "<=": lambda c: c <= 0, ">=": lambda c: c >= 0}


class _ILike(Lookup):
    """Case-insensitive SQL LIKE with a ready-made pattern (backslash escapes)."""

    lookup_name = "scope_ilike"

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"UPPER({lhs}) LIKE UPPER({rhs}) ESCAPE '\\'", [*lhs_params, *rhs_params]


def _like_pattern(glob):
    """The SQL LIKE pattern for a scope LIKE pattern: % and _ already are LIKE's wildcards."""
    translate = {"*": "%", "?": "_", "\\": "\\\\"}
    return "".join(translate.get(c, c) for c in glob)


def _ordered(expr, op, value):
    """``expr <op> value``: numeric when both sides are decimal numbers, else a string comparison.
    CASE keeps PostgreSQL from casting a non-numeric text."""
    lookup = _ORDER_LOOKUPS[op]
    if not re.fullmatch(_NUMBER, value):
        return lookup(expr, value)
    numeric = lookup(Cast(expr, FloatField()), float(value))
    return Case(When(Regex(expr, f"^{_NUMBER}$"), then=numeric), default=lookup(expr, value))


def _predicate(node):
    """A function from a text expression (the attribute's value) to the node's condition on it."""
    if isinstance(node, Compare):
        op, value = node.op, node.value
        if op == "IN":
            return lambda e: reduce(or_, (Q(IExact(e, v)) for v in value))
        if op in ORDERINGS:
            return lambda e: Q(_ordered(e, op, value))
        lookup = {"==": IExact, "LIKE": _ILike, "CONTAINS": IContains}[op]
        value = _like_pattern(value) if op == "LIKE" else value
        return lambda e: Q(lookup(e, value))
    if isinstance(node, Len):
        return lambda e: Q(_COMPARE_LOOKUPS[node.op](Length(e), node.length))
    if isinstance(node, StartsWith):
        return lambda e: Q(IStartsWith(e, node.prefix))
    raise TypeError(node)


def _on_attr(attr, predicate):
    """The agents that have ``attr`` and whose value satisfies ``predicate``."""
    if attr.kind == "field":
        return predicate(F(FIELDS[attr.key]))
    if attr.kind == "tag":
        tags = Tag.objects.filter(agent=OuterRef("pk"), key=attr.key)
        return Q(Exists(tags.filter(predicate(F("value")))))
    # A prop compares by its text; JSON null reads as "null" (as SQLite already renders it), never SQL NULL.
    value = Cast(KeyTextTransform(attr.key, "attributes"), TextField())
    text = Coalesce(value, Value("null"), output_field=TextField())
    return Q(attributes__has_key=attr.key) & predicate(text)


def _version_key(text):
    parts = [int(p) for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return parts


def _version_cmp(a, b):
    if _VERSION_RE.fullmatch(a) and _VERSION_RE.fullmatch(b):
        a, b = _version_key(a), _version_key(b)
    return (a > b) - (a < b)


def _agent_version_ordered(op, value):
    versions = Agent.objects.order_by().values_list("agent_version", flat=True).distinct()
    holds = _PY_ORDER[op]
    return Q(agent_version__in=[v for v in versions if holds(_version_cmp(v, value))])


class _Compiler:
    def __init__(self, expanding=()):
        self.expanding = frozenset(expanding)  # dynamic groups being expanded (recursion guard)

    def compile(self, node):
        if isinstance(node, All):
            return Q(pk__isnull=False)
        if isinstance(node, Group):
            return self.group(node)
        if isinstance(node, Not):
            return ~self.compile(node.operand)
        if isinstance(node, (And, Or)):
            return reduce(and_ if isinstance(node, And) else or_, map(self.compile, node.operands))
        if isinstance(node, ExistsAttr):
            return self.exists(node.attr)
        if getattr(node, "op", None) == "!=":  # a != b is NOT a == b, so it matches a missing tag/prop
            return ~self.compile(replace(node, op="=="))
        if isinstance(node, Compare) and node.op in ORDERINGS and node.attr == Attr("field", "agent_version"):
            return _agent_version_ordered(node.op, node.value)
        return _on_attr(node.attr, _predicate(node))

    def exists(self, attr):
        if attr.kind == "tag":
            return Q(Exists(Tag.objects.filter(agent=OuterRef("pk"), key=attr.key)))
        if attr.kind == "props":
            return Q(attributes__has_key=attr.key)
        return ~Q(Exact(F(FIELDS[attr.key]), ""))

    def group(self, node):
        groups = ManagementGroup.objects
        group = groups.filter(pk=node.ref).first() or groups.filter(name=node.ref).first()
        if group is None:
            raise ScopeError(f"unknown management group '{node.ref}'", node.pos)
        if group.membership_type != ManagementGroup.Membership.DYNAMIC or not group.scope_expression:
            return Q(pk__in=group.members.values("pk"))
        if group.pk in self.expanding:
            raise ScopeError(f"management group '{group.name}' refers to itself", node.pos)
        try:
            inner = parse(group.scope_expression)
        except ScopeError as e:
            raise ScopeError(f"management group '{group.name}' has an invalid scope: {e}", node.pos) from e
        return _Compiler(self.expanding | {group.pk}).compile(inner)


def to_q(expr_or_node) -> Q:
    """Compile a scope expression (or a parsed Node) to a Q over Agent. Raises ScopeError."""
    node = parse(expr_or_node) if isinstance(expr_or_node, str) else expr_or_node
    return _Compiler().compile(node)


def matching_agents(expr):
    """The agents an expression targets (a distinct queryset)."""
    return Agent.objects.filter(to_q(expr)).distinct()


# -- Catalogue ------------------------------------------------------------------------------------


def describe() -> dict:
    """A static description of the language, for discover_scope_kinds / yuzu://scope-dsl."""
    return {
        "ground_kinds": [
            {"kind": "__all__", "description": "every agent"},
            {
                "kind": "group:<name|id>",
                "description": "members of a management group, by name or 32-hex id (quote names with "
                'spaces: group:"Web Servers"); a dynamic group applies its own scope expression',
            },
        ],
        "attributes": [
            {"name": "ostype", "description": "operating system (Agent.os), e.g. linux, windows, darwin"},
            {"name": "hostname", "description": "the agent's hostname"},
            {"name": "arch", "description": "CPU architecture, e.g. x86_64, arm64"},
            {"name": "agent_version", "description": "agent version; <, >, <=, >= compare dotted versions"},
            {"name": "tag:<key>", "description": "value of the agent's tag <key> (false when the tag is absent)"},
            {"name": "props.<key>", "description": "self-reported attribute <key>; keys [A-Za-z0-9_]{1,64}"},
        ],
        "operators": [
            {"operator": "==", "description": "equal (case-insensitive)"},
            {"operator": "!=", "description": "not equal; same as NOT ==, so it matches a missing tag or prop"},
            {"operator": "LIKE", "description": "wildcards, case-insensitive: * or % any run, ? or _ one character"},
            {"operator": "<", "description": "less than: numeric when both sides are numbers, else string order"},
            {"operator": ">", "description": "greater than (numeric or string, as for <)"},
            {"operator": "<=", "description": "less than or equal (numeric or string, as for <)"},
            {"operator": ">=", "description": "greater than or equal (numeric or string, as for <)"},
            {"operator": "IN", "syntax": "<attr> IN (a, b, c)", "description": "equal to any listed value"},
            {"operator": "CONTAINS", "description": "substring, case-insensitive"},
            {"operator": "EXISTS", "syntax": "EXISTS <attr>", "description": "tag or prop present (column: non-empty)"},
        ],
        "boolean": ["AND", "OR", "NOT"],
        "precedence": "NOT binds tightest, then AND, then OR; parentheses group",
        "functions": [
            {"name": "LEN", "syntax": "LEN(<attr>) <op> <n>", "description": "value length; op: == != < > <= >="},
            {"name": "STARTSWITH", "syntax": 'STARTSWITH(<attr>, "prefix")', "description": "prefix, case-insensitive"},
        ],
        "values": "bare words, or 'single' or \"double\" quoted strings with backslash escapes",
        "keywords": "case-insensitive",
        "max_depth": MAX_DEPTH,
        "depth_rule": "each enclosing parenthesis or NOT is one level",
        "max_length_bytes": MAX_LENGTH,
        "examples": [
            "__all__",
            "ostype == linux AND tag:environment == prod",
            'hostname LIKE "web-*" OR group:"Web Servers"',
            "NOT EXISTS tag:owner",
            'STARTSWITH(props.kernel, "5.") OR LEN(hostname) > 12',
            "agent_version >= 1.10 AND arch IN (x86_64, arm64)",
        ],
    }
