"""The scope language (fleet/scope.py): parser, errors with positions, and the compiled queries."""

import pytest

from fleet import scope
from fleet.groups import group_agents
from fleet.models import Agent, ManagementGroup, Tag
from fleet.scope import (
    All,
    And,
    Attr,
    Compare,
    ExistsAttr,
    Group,
    Len,
    Not,
    Or,
    ScopeError,
    StartsWith,
    matching_agents,
    parse,
    to_q,
    validate,
)

HOSTNAME, OSTYPE = Attr("field", "hostname"), Attr("field", "ostype")


def cond(attr, op, value):
    return Compare(Attr("field", attr), op, value)


# -- parser ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["==", "!=", "<", ">", "<=", ">=", "LIKE", "CONTAINS", "like", "Contains"])
def test_every_binary_operator_parses(op):
    assert parse(f"hostname {op} web") == Compare(HOSTNAME, op.upper(), "web")


def test_operators_need_no_spaces():
    assert parse("hostname!=web") == Compare(HOSTNAME, "!=", "web")
    assert parse("LEN(hostname)>=3") == Len(HOSTNAME, ">=", 3)


def test_in_list():
    assert parse("arch IN (x86_64, 'arm 64', \"s390x\")") == cond("arch", "IN", ("x86_64", "arm 64", "s390x"))
    assert parse("arch in (x86_64)") == cond("arch", "IN", ("x86_64",))


def test_exists_len_startswith():
    assert parse("EXISTS tag:env") == ExistsAttr(Attr("tag", "env"))
    assert parse("exists props.site") == ExistsAttr(Attr("props", "site"))
    assert parse('STARTSWITH(props.kernel, "5.")') == StartsWith(Attr("props", "kernel"), "5.")
    assert parse("startswith(hostname, web)") == StartsWith(HOSTNAME, "web")


@pytest.mark.parametrize("op", ["==", "!=", "<", ">", "<=", ">="])
def test_len_takes_every_comparison(op):
    assert parse(f"len(tag:role) {op} 12") == Len(Attr("tag", "role"), op, 12)


def test_attributes_and_ground_kinds():
    assert parse("OSTYPE == linux") == Compare(OSTYPE, "==", "linux")
    assert parse("agent_version >= 1.2.3") == cond("agent_version", ">=", "1.2.3")
    # category tag keys are normalised to lower case, like stored tags; other keys keep their case
    assert parse("tag:Role == web") == Compare(Attr("tag", "role"), "==", "web")
    assert parse("tag:Owner.Team == x") == Compare(Attr("tag", "Owner.Team"), "==", "x")
    assert parse("props.Cpu_Count > 2") == Compare(Attr("props", "Cpu_Count"), ">", "2")
    assert parse("__all__") == All()
    assert parse("group:web-servers") == Group("web-servers")
    assert parse('group:"Web Servers"') == Group("Web Servers")
    assert parse("group:0123456789abcdef0123456789abcdef") == Group("0123456789abcdef0123456789abcdef")


def test_string_literals_and_bare_words():
    assert parse(r"hostname == 'it\'s'").value == "it's"
    assert parse(r'hostname == "a \"b\" \\ c\td"').value == 'a "b" \\ c\td'
    assert parse("hostname == web-*.example.com").value == "web-*.example.com"
    assert parse("props.n > -1.5").value == "-1.5"
    assert parse("hostname == 'AND'").value == "AND"  # a quoted keyword is a value


def test_precedence_not_and_or():
    a, b, c = (cond("hostname", "==", v) for v in "abc")
    assert parse("hostname == a OR hostname == b AND hostname == c") == Or((a, And((b, c))))
    assert parse("(hostname == a OR hostname == b) AND hostname == c") == And((Or((a, b)), c))
    assert parse("NOT hostname == a AND hostname == b") == And((Not(a), b))
    assert parse("not (hostname == a and hostname == b)") == Not(And((a, b)))
    assert parse("(hostname == a AND hostname == b) AND hostname == c") == And((a, b, c))


@pytest.mark.parametrize(
    "expr, canonical",
    [
        ("ostype==linux", 'ostype == "linux"'),
        ("not tag:env == prod and (hostname like 'web*' or arch in (a,b))",
         'NOT tag:env == "prod" AND (hostname LIKE "web*" OR arch IN ("a", "b"))'),
        ("NOT (ostype == a OR ostype == b)", 'NOT (ostype == "a" OR ostype == "b")'),
        ("((ostype == a))", 'ostype == "a"'),
        ("exists TAG:env OR len(hostname) > 3", "EXISTS tag:env OR LEN(hostname) > 3"),
        (r"startswith(hostname, 'say \"hi\"')", r'STARTSWITH(hostname, "say \"hi\"")'),
        ('group:"Web Servers" or group:abc or __all__', 'group:"Web Servers" OR group:abc OR __all__'),
    ],
)
def test_validate_returns_canonical_form_that_reparses_to_the_same_tree(expr, canonical):
    assert validate(expr) == {"valid": True, "expression": canonical}
    assert parse(canonical) == parse(expr)


def test_validate_reports_error_and_position():
    assert validate("hostname == ") == {
        "valid": False,
        "error": "expected a value after '==' at position 12",
        "position": 12,
    }


def test_scope_error_shape():
    with pytest.raises(ScopeError) as info:
        parse("hostname == ")
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.message, err.position) == ("expected a value after '=='", 12)
    assert str(err) == "expected a value after '==' at position 12"


DEEP_PARENS = "(" * 11 + "ostype == linux" + ")" * 11
DEEP_NOTS = "NOT " * 11 + "ostype == linux"


@pytest.mark.parametrize(
    "expr, message, position",
    [
        ("", "empty expression", 0),
        ("   ", "empty expression", 0),
        ("(ostype == linux", "unclosed '('", 0),
        ("ostype == a AND (ostype == b", "unclosed '('", 16),
        ("(ostype == a ostype == b)", "expected ')' to close the '(' at position 0, not 'ostype'", 13),
        ("ostype == linux)", "expected AND, OR or end of expression, not ')'", 15),
        ("ostype == linux windows", "expected AND, OR or end of expression, not 'windows'", 16),
        ("hostname == 'it''s'", "expected AND, OR or end of expression, not ''s''", 16),
        ("foo == bar", "unknown attribute 'foo'", 0),
        ("ostype == a OR platform == b", "unknown attribute 'platform'", 15),
        ("ostype linux", "expected an operator after 'ostype'", 7),
        ("hostname", "expected an operator after 'hostname'", 8),
        ("ostype ==", "expected a value after '=='", 9),
        ("ostype == AND", "expected a value after '=='", 10),
        ("ostype LIKE )", "expected a value after 'LIKE'", 12),
        ("ostype == 'linux", "unterminated string", 10),
        ('hostname == "a\\"', "unterminated string", 12),
        ("ostype = linux", "unexpected character '=' (use '==' or '!=')", 7),
        ("ostype ! linux", "unexpected character '!' (use '==' or '!=')", 7),
        ("ostype == linux AND", "expected a condition, not end of expression", 19),
        ("AND ostype == linux", "expected a condition, not 'AND'", 0),
        ("()", "expected a condition, not ')'", 1),
        ("'linux' == ostype", "expected a condition, not ''linux''", 0),
        ("LOWER(hostname) == web", "unknown function 'LOWER'", 0),
        ("ostype == a OR regex(hostname, x)", "unknown function 'regex'", 15),
        ("ostype IN linux", "expected '(' after IN", 10),
        ("ostype IN ()", "expected a value after '(' in the IN list", 11),
        ("ostype IN (a b)", "expected ',' or ')' in the IN list", 13),
        ("ostype IN (a,)", "expected a value after ',' in the IN list", 13),
        ("ostype IN (a", "expected ',' or ')' in the IN list", 12),
        ("EXISTS", "expected an attribute after EXISTS", 6),
        ("EXISTS == x", "expected an attribute after EXISTS", 7),
        ("EXISTS nope", "unknown attribute 'nope'", 7),
        ("LEN hostname > 3", "expected '(' after LEN", 4),
        ("LEN(nope) > 1", "unknown attribute 'nope'", 4),
        ("LEN(hostname > 1", "expected ')' after the LEN attribute", 13),
        ("LEN(hostname) LIKE 3", "expected a comparison operator after LEN(...)", 14),
        ("LEN(hostname) > x", "expected a non-negative integer after '>'", 16),
        ("LEN(hostname) > -1", "expected a non-negative integer after '>'", 16),
        ("STARTSWITH hostname", "expected '(' after STARTSWITH", 11),
        ("STARTSWITH(hostname web)", "expected ',' after the STARTSWITH attribute", 20),
        ("STARTSWITH(hostname,)", "expected a value after ',' in STARTSWITH", 20),
        ("STARTSWITH(hostname, web", "expected ')' to close STARTSWITH", 24),
        ("tag: == x", "invalid tag key ''", 0),
        ("tag:a/b == x", "invalid tag key 'a/b'", 0),
        ("props.a-b == 1", "invalid props key 'a-b'", 0),
        ("props.123 == 1", "invalid props key '123'", 0),
        ("props." + "k" * 65 + " == 1", "invalid props key", 0),
        ("group:", "expected a group name or id after 'group:'", 6),
        ("__all__ == x", "expected AND, OR or end of expression, not '=='", 8),
        (DEEP_PARENS, "expression is nested deeper than 10 levels", 10),
        (DEEP_NOTS, "expression is nested deeper than 10 levels", 40),
        ("NOT " * 5 + "(" * 6 + "ostype == linux" + ")" * 6, "expression is nested deeper than 10 levels", 25),
    ],
)
def test_errors_have_a_message_and_position(expr, message, position):
    with pytest.raises(ScopeError) as info:
        parse(expr)
    assert info.value.message.startswith(message)
    assert info.value.position == position
    assert validate(expr) == {"valid": False, "error": str(info.value), "position": position}


def test_depth_ten_is_allowed():
    assert parse("(" * 10 + "ostype == linux" + ")" * 10) == Compare(OSTYPE, "==", "linux")
    assert parse("NOT " * 10 + "ostype == linux") is not None
    assert parse("NOT " * 4 + "(" * 6 + "ostype == linux" + ")" * 6) is not None


def test_length_limit_in_bytes():
    assert validate("hostname == '" + "a" * (8192 - 14) + "'")["valid"]  # exactly 8192 bytes
    with pytest.raises(ScopeError) as info:
        parse("hostname == '" + "a" * (8192 - 13) + "'")
    assert info.value.message == "expression is longer than 8192 bytes"
    assert info.value.position == 8192
    # 'é' is two bytes: the first character past the limit is reported, not a byte offset
    with pytest.raises(ScopeError) as info:
        parse("hostname == '" + "é" * 5000 + "'")
    assert info.value.position == 13 + (8192 - 13) // 2


def test_non_string_is_an_error():
    with pytest.raises(ScopeError):
        parse(None)


def test_describe_lists_every_operator_and_function_the_parser_accepts():
    catalogue = scope.describe()
    assert catalogue["max_depth"] == 10 and catalogue["max_length_bytes"] == 8192
    assert [k["kind"] for k in catalogue["ground_kinds"]] == ["__all__", "group:<name|id>"]
    assert [a["name"] for a in catalogue["attributes"]] == [
        "ostype", "hostname", "arch", "agent_version", "tag:<key>", "props.<key>"]
    operators = [o["operator"] for o in catalogue["operators"]]
    assert operators == ["==", "!=", "LIKE", "<", ">", "<=", ">=", "IN", "CONTAINS", "EXISTS"]
    for op in operators:
        expr = {"IN": "hostname IN (a)", "EXISTS": "EXISTS hostname"}.get(op, f"hostname {op} a")
        assert validate(expr)["valid"], expr
    assert [f["name"] for f in catalogue["functions"]] == ["LEN", "STARTSWITH"]
    for example in catalogue["examples"]:
        assert validate(example)["valid"], example


# -- compiled queries -----------------------------------------------------------------------------

AGENTS = {
    # agent_id: (hostname, os, arch, agent_version, attributes, tags)
    "a1": ("web-01", "linux", "x86_64", "1.9.0",
           {"cpu_count": "8", "kernel": "5.15.0", "site": "London", "slot": "10", "owner": "alice", "cores": 8},
           {"env": "prod", "role": "web"}),
    "a2": ("web-02", "linux", "arm64", "1.10.2",
           {"cpu_count": "16", "kernel": "6.1", "slot": "9", "cores": 2},
           {"env": "staging", "role": "web"}),
    "a3": ("db-01", "windows", "x86_64", "2.0",
           {"cpu_count": "4", "site": "Paris", "slot": "x"},
           {"env": "prod", "role": "db"}),
    "a4": ("MacBook_Pro", "darwin", "arm64", "1.2", {"owner": None}, {}),
}


@pytest.fixture
def fleet(db):
    for agent_id, (hostname, os, arch, version, attributes, tags) in AGENTS.items():
        agent = Agent.objects.create(agent_id=agent_id, hostname=hostname, os=os, arch=arch,
                                     agent_version=version, attributes=attributes)
        for key, value in tags.items():
            Tag.objects.create(agent=agent, key=key, value=value)
    web = ManagementGroup.objects.create(name="Web Servers")
    web.members.add("a1", "a2")
    dynamic = {
        "Prod": "tag:env == prod",
        "Prod Linux": "group:Prod AND ostype == linux",
        "Loop A": 'group:"Loop B"',
        "Loop B": 'group:"Loop A"',
        "Broken": "ostype ==",
    }
    for name, expr in dynamic.items():
        ManagementGroup.objects.create(name=name, membership_type=ManagementGroup.Membership.DYNAMIC, scope_expression=expr)
    return web


def ids(expr):
    agents = list(matching_agents(expr).values_list("agent_id", flat=True))
    assert len(agents) == len(set(agents))
    return sorted(agents)


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("__all__", ["a1", "a2", "a3", "a4"]),
        ("NOT __all__", []),
        ("__all__ OR ostype == nothing", ["a1", "a2", "a3", "a4"]),
        # == and != (case-insensitive)
        ("ostype == LINUX", ["a1", "a2"]),
        ("ostype != linux", ["a3", "a4"]),
        ("hostname == 'macbook_pro'", ["a4"]),
        ("hostname == 'web'", []),
        ("tag:env == prod", ["a1", "a3"]),
        ("tag:role == WEB", ["a1", "a2"]),
        ("tag:Role == web", ["a1", "a2"]),
        # a missing tag/prop never satisfies a comparison, so its negation does
        ("tag:env != prod", ["a2", "a4"]),
        ("NOT tag:env == prod", ["a2", "a4"]),
        ("props.site == london", ["a1"]),
        ("props.site != paris", ["a1", "a2", "a4"]),
        ("NOT props.site == london", ["a2", "a3", "a4"]),
        ("NOT props.owner == alice", ["a2", "a3", "a4"]),  # a4 has owner: null
        ("props.owner == null", ["a4"]),  # JSON null reads as "null" on every database
        ("props.cores == 8", ["a1"]),
        # ordering: numeric when both sides are numbers ("16" > "4" only numerically), else strings
        ("props.cpu_count > 4", ["a1", "a2"]),
        ("props.cpu_count >= 4", ["a1", "a2", "a3"]),
        ("props.cpu_count < 8", ["a3"]),
        ("props.cpu_count <= 8", ["a1", "a3"]),
        ("props.cores > 4", ["a1"]),  # a JSON number, compared by its text
        ("props.slot > 9", ["a1", "a3"]),  # 10 > 9 numerically; "x" > "9" as strings
        ("hostname >= w", ["a1", "a2"]),
        ("hostname < 'web-02'", ["a1", "a3", "a4"]),
        ("tag:env > prod", ["a2"]),
        # agent_version orders dotted versions: 1.10.2 > 1.9 (both lexically and as numbers it would not)
        ("agent_version > 1.9", ["a2", "a3"]),
        ("agent_version >= 1.10", ["a2", "a3"]),
        ("agent_version <= 1.9", ["a1", "a4"]),
        ("agent_version < 1.9.0", ["a4"]),
        ("agent_version == 1.9.0", ["a1"]),
        ("NOT agent_version > 1.9", ["a1", "a4"]),
        ("agent_version > 99", []),
        # IN
        ("arch IN (ARM64, sparc)", ["a2", "a4"]),
        ("tag:role IN (db, 'x')", ["a3"]),
        ("NOT tag:role IN (web)", ["a3", "a4"]),
        ("props.site IN (paris, berlin)", ["a3"]),
        # LIKE: * and % any run, ? and _ one character, anchored, case-insensitive
        ("hostname LIKE web-*", ["a1", "a2"]),
        ("hostname LIKE 'WEB-0?'", ["a1", "a2"]),
        ("hostname LIKE 'db%'", ["a3"]),
        ("hostname LIKE web_01", ["a1"]),
        ("hostname LIKE '?b-01'", ["a3"]),
        ("hostname LIKE '*book*'", ["a4"]),
        ("hostname LIKE 'macbook?pro'", ["a4"]),
        ("hostname LIKE web", []),
        ("hostname LIKE 'web-0'", []),
        ("hostname LIKE 'eb-01'", []),
        ("tag:env LIKE 'p*'", ["a1", "a3"]),
        ("NOT tag:env LIKE 'p*'", ["a2", "a4"]),
        ("props.kernel LIKE '5.*'", ["a1"]),
        # CONTAINS: substring, case-insensitive, no wildcards
        ("hostname CONTAINS EB", ["a1", "a2"]),
        ("hostname CONTAINS '_'", ["a4"]),
        ("hostname CONTAINS '%'", []),
        ("tag:env CONTAINS TAG", ["a2"]),
        ("props.site CONTAINS ari", ["a3"]),
        # EXISTS
        ("EXISTS tag:env", ["a1", "a2", "a3"]),
        ("NOT EXISTS tag:env", ["a4"]),
        ("EXISTS props.site", ["a1", "a3"]),
        ("NOT EXISTS props.site", ["a2", "a4"]),
        ("EXISTS props.owner", ["a1", "a4"]),
        ("EXISTS hostname", ["a1", "a2", "a3", "a4"]),
        # LEN
        ("LEN(hostname) == 6", ["a1", "a2"]),
        ("LEN(hostname) != 6", ["a3", "a4"]),
        ("LEN(hostname) > 6", ["a4"]),
        ("LEN(hostname) <= 5", ["a3"]),
        ("LEN(tag:role) < 3", ["a3"]),
        ("NOT LEN(tag:role) >= 3", ["a3", "a4"]),
        ("LEN(props.kernel) >= 6", ["a1"]),
        # STARTSWITH: case-insensitive prefix, no wildcards
        ("STARTSWITH(hostname, WEB)", ["a1", "a2"]),
        ("STARTSWITH(props.kernel, '5.')", ["a1"]),
        ("STARTSWITH(tag:env, st)", ["a2"]),
        ("STARTSWITH(hostname, 'w%')", []),
        ("NOT STARTSWITH(tag:env, st)", ["a1", "a3", "a4"]),
        # precedence: NOT binds tighter than AND, AND tighter than OR
        ("ostype == windows OR ostype == linux AND arch == arm64", ["a2", "a3"]),
        ("(ostype == windows OR ostype == linux) AND arch == arm64", ["a2"]),
        ("NOT ostype == linux AND arch == arm64", ["a4"]),
        ("NOT (ostype == linux AND arch == arm64)", ["a1", "a3", "a4"]),
        ("tag:env == prod and not tag:role == db or hostname like mac*", ["a1", "a4"]),
        # values that look like SQL are just values
        ("hostname == \"x' OR '1'='1\"", []),
    ],
)
def test_matching_agents(fleet, expr, expected):
    assert ids(expr) == expected


def test_group_by_name_and_id(fleet):
    assert ids('group:"Web Servers"') == ["a1", "a2"]
    assert ids(f"group:{fleet.id}") == ["a1", "a2"]
    assert ids('NOT group:"Web Servers"') == ["a3", "a4"]
    assert ids('group:"Web Servers" AND arch == arm64') == ["a2"]
    # a member matched twice (group and tag) is still one row
    assert ids('group:"Web Servers" OR tag:role == web OR ostype == linux') == ["a1", "a2"]


def test_dynamic_groups(fleet):
    assert ids("group:Prod") == ["a1", "a3"]
    assert ids('group:"Prod Linux"') == ["a1"]  # a dynamic group that refers to another one
    assert ids('group:Prod AND NOT group:"Web Servers"') == ["a3"]
    prod = ManagementGroup.objects.get(name="Prod")
    assert ids(f"group:{prod.id}") == ["a1", "a3"]
    assert sorted(group_agents(prod).values_list("agent_id", flat=True)) == ["a1", "a3"]


def test_dynamic_group_follows_tag_changes(fleet):
    Tag.objects.filter(agent_id="a2", key="env").update(value="prod")
    assert ids("group:Prod") == ["a1", "a2", "a3"]


@pytest.mark.parametrize(
    "expr, message, position",
    [
        ("ostype == linux OR group:nope", "unknown management group 'nope'", 19),
        ('group:"Loop A"', "management group 'Loop A' refers to itself", 0),
        ("hostname == x OR group:Broken", "management group 'Broken' has an invalid scope", 17),
    ],
)
def test_group_errors(fleet, expr, message, position):
    with pytest.raises(ScopeError) as info:
        to_q(expr)
    assert info.value.message.startswith(message)
    assert info.value.position == position


def test_self_referencing_group(db):
    ManagementGroup.objects.create(name="Self", membership_type="dynamic", scope_expression="group:Self")
    with pytest.raises(ScopeError, match="refers to itself"):
        to_q("group:Self")


def test_to_q_accepts_a_parsed_node_and_returns_a_q(fleet):
    node = parse("tag:env == prod AND arch == x86_64")
    q = to_q(node)
    assert sorted(Agent.objects.filter(q).values_list("agent_id", flat=True)) == ["a1", "a3"]
    assert sorted(Agent.objects.exclude(q).values_list("agent_id", flat=True)) == ["a2", "a4"]


def test_depth_ten_compiles_and_eleven_is_rejected(fleet):
    assert ids("(" * 10 + "ostype == windows" + ")" * 10) == ["a3"]
    assert ids("NOT " * 10 + "ostype == windows") == ["a3"]
    with pytest.raises(ScopeError, match="nested deeper than 10 levels"):
        to_q("(" * 11 + "ostype == windows" + ")" * 11)
    with pytest.raises(ScopeError, match="nested deeper than 10 levels"):
        matching_agents("NOT " * 11 + "ostype == windows")
