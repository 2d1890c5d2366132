"""Fuzzing (issue 10, "the adversarial suite"): generated JSON-RPC bodies against /mcp/v1/ and /mcp/bridge/
(tests/support/fuzz.py: valid-ish and hostile, from the real input schemas), and schemathesis against the REST API's
OpenAPI document — both in-process, with an Administrator's token (untiered and supervised) and a low-privilege
one. The properties: no 5xx, no stack trace in a body, every JSON answer parses, nothing logged at ERROR.

``make test`` runs a derandomized subset (seconds); ``make fuzz`` (YUZU_FUZZ=full) runs the full counts here
and the same generators against a real daphne (bench/fuzz/run.py). Figures: docs/security.md."""

import json
import logging
import os
from datetime import timedelta

import pytest
import schemathesis
from channels.layers import channel_layers
from django.core.wsgi import get_wsgi_application
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.agent.plugins import catalogue as plugin_catalogue
from fleet.models import Agent, AgentInventory, ManagementGroup, Tag
from tests.support.fuzz import bodies, modern_requests
from tests.support.mcp_http import McpClient, request
from yuzu.models import ApiToken

FULL = os.environ.get("YUZU_FUZZ") == "full"
#: bodies per endpoint: make test / make fuzz (two endpoints: at least 10,000 in the full run)
BODIES = 6000 if FULL else 150
COUNTS = {}
SESSION = st.sampled_from([True] * 9 + [False])  # mostly within the session, so calls get past the transport


class Errors(logging.Handler):
    """Everything logged at ERROR or above while the fuzz runs (a handler bug logs its stack trace there)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def report(self):
        return "\n".join(f"{r.name}: {r.getMessage()}\n{self.format(r) if r.exc_info else ''}" for r in self.records[:5])


@pytest.fixture
def error_log():
    handler = Errors()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


def fuzz_world(make_user, mint):
    """Two agents (one connected, with the plugin catalogue), a group, and three callers."""
    g = ManagementGroup.objects.create(name="fuzz")
    for agent_id, connected in (("fz-1", True), ("fz-2", False)):
        a = Agent.objects.create(agent_id=agent_id, hostname=f"{agent_id}.example", os="linux", connected=connected)
        AgentInventory.objects.create(agent=a, plugin=AgentInventory.CATALOGUE, data=plugin_catalogue())
        Tag.objects.create(agent=a, key="env", value="test")
        g.members.add(a)
    return {"admin": mint("fz-admin", role="Administrator", tier="", days=None),
            "supervised": mint("fz-admin", role="Administrator", tier="supervised"),
            "viewer": mint("fz-viewer", role="Viewer", tier="readonly")}


def check(resp, where):
    """The properties every answer must have."""
    assert resp.status < 500, f"{where}: HTTP {resp.status}: {resp.body[:300]!r}"
    assert b"Traceback" not in resp.body, f"{where}: a stack trace in the body"
    if resp.body and resp.headers.get("content-type", "").startswith("application/json"):
        json.loads(resp.body)


def run_bodies(path, cat, make_user, mint, error_log):
    tokens = fuzz_world(make_user, mint)
    clients = {}
    for who, raw in tokens.items():
        c = McpClient(raw, path=path)
        c.initialize()
        clients[who] = c

    @settings(max_examples=BODIES, derandomize=not FULL, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(body=bodies(cat, large=FULL), who=st.sampled_from(sorted(tokens)), session=SESSION)
    def one(body, who, session):
        # Every in-process request runs on a new event loop: an in-memory channel layer (and its queues) from
        # an earlier example would be bound to a loop that is gone (as tests/conftest.py does per test).
        channel_layers.backends.clear()
        c = clients[who]
        headers = c.headers() if session else {"authorization": f"Bearer {c.token}"}
        headers["accept"] = "application/json"  # a plain answer; streamed POSTs are tests/mcp/test_mcp_streams.py's
        resp = request(body=body, headers=headers, path=path)
        COUNTS[cat] = COUNTS.get(cat, 0) + 1
        check(resp, f"{path} {body[:200]!r}")

    one()
    assert not error_log.records, f"logged at ERROR while fuzzing {path}:\n{error_log.report()}"


@pytest.mark.django_db(transaction=True)
def test_mcp_v1_bodies(make_user, mint, error_log):
    run_bodies("/mcp/v1/", "v1", make_user, mint, error_log)
    assert COUNTS["v1"] >= BODIES


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path,cat", [("/mcp/v1/", "v1"), ("/mcp/bridge/", "bridge")])
def test_mcp_modern_requests(make_user, mint, error_log, path, cat):
    """2026-07-28 requests (issue 14): hostile envelopes and headers get a clear error, never a 500 or a trace."""
    tokens = fuzz_world(make_user, mint)

    @settings(max_examples=BODIES, derandomize=not FULL, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(req=modern_requests(cat), who=st.sampled_from(sorted(tokens)))
    def one(req, who):
        channel_layers.backends.clear()
        body, headers = req
        resp = request(body=body, headers={**headers, "authorization": f"Bearer {tokens[who]}",
                                           "accept": "application/json"}, path=path)
        COUNTS[f"modern-{cat}"] = COUNTS.get(f"modern-{cat}", 0) + 1
        check(resp, f"{path} {headers} {body[:200]!r}")
        assert "mcp-session-id" not in resp.headers

    one()
    assert not error_log.records, f"logged at ERROR while fuzzing {path}:\n{error_log.report()}"


@pytest.mark.django_db(transaction=True)
def test_mcp_bridge_bodies(make_user, mint, error_log):
    run_bodies("/mcp/bridge/", "bridge", make_user, mint, error_log)
    assert COUNTS["bridge"] >= BODIES


# --- the REST API: schemathesis over the OpenAPI document -----------------------------------------

REST_EXAMPLES = 25 if FULL else 2


@pytest.mark.django_db(transaction=True)  # the WSGI handler closes the connection after each request
@pytest.mark.parametrize("who", ["admin", "viewer"])
def test_rest_api_from_the_openapi_document(make_user, mint, error_log, who):
    tokens = fuzz_world(make_user, mint)
    ApiToken.objects.filter(name__startswith="fz-").update(expires_at=timezone.now() + timedelta(days=30))
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())
    failures, calls = [], 0
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(max_examples=REST_EXAMPLES, derandomize=not FULL, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def one(case):
            nonlocal calls
            calls += 1
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {tokens[who]}"}
            resp = case.call()
            if resp.status_code >= 500 or b"Traceback" in resp.content:
                failures.append(f"{case.method} {case.formatted_path} {case.body!r:.200} -> {resp.status_code}")

        one()
    assert calls > 50
    assert not failures, "\n".join(failures[:20])
    assert not error_log.records, f"logged at ERROR:\n{error_log.report()}"


# --- what the fuzz found (each failed before its fix) --------------------------------------------------

HOSTILE_JSON = [b'{"name":"\\ud800"}', b'{"name":"x","expires_at":NaN}', b'{"name":"x","expires_at":1e999}',
                b'{"name":"x","n":Infinity}']


@pytest.mark.django_db
@pytest.mark.parametrize("body", HOSTILE_JSON)
def test_rest_refuses_text_and_numbers_json_cannot_hold(mint, error_log, body):
    """A lone surrogate escape ("\\ud800") reached the database and answered 500 (and NaN / 1e999 went on as
    numbers): yuzu.jsondata refuses them at the parser, a 400 before anything runs."""
    raw = mint("fz-admin", role="Administrator", tier="", days=None)
    for method, path in (("POST", "/api/v1/tokens"), ("POST", "/api/v1/management-groups")):
        r = Client().generic(method, path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
        assert r.status_code == 400 and "JSON parse error" in r.json()["error"]["message"], (path, r.content)
    assert not error_log.records, error_log.report()


@pytest.mark.django_db
@pytest.mark.parametrize("body", [b"[]", b"null", b'""', b"0", b"false"])
def test_rest_refuses_a_body_that_is_no_object(mint, error_log, body):
    """A probe: any falsy JSON body (an empty array, null, "", 0, false) read as {}, so POST /api/v1/bridge/members
    with [] started a worker. A body is a JSON object (docs/rest-api.md), or absent."""
    raw = mint("fz-admin", role="Administrator", tier="", days=None)
    r = Client().post("/api/v1/management-groups", body, content_type="application/json",
                      HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("the body must be a JSON object, not ")
    assert not error_log.records, error_log.report()


@pytest.mark.django_db(transaction=True)
def test_mcp_refuses_a_lone_surrogate_before_it_reaches_the_audit_log(mint, error_log):
    """An unknown tool named "\\udfff\\ud800" was answered, but its audit row failed to write (an ERROR with a
    stack trace, and no row): the call went unaudited. Now the framing refuses the body (-32700, 400)."""
    c = McpClient(mint("fz-admin", role="Administrator", tier="", days=None))
    c.initialize()
    for body in (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\\udfff\\ud800"}}',
                 b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"set_tag","arguments":'
                 b'{"agent_id":"\\ud800","key":"k","value":"v"}}}',
                 b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":NaN}}'):
        r = request(body=body, headers=c.headers())
        assert r.status == 400 and r.error["code"] == -32700, r.body
    assert not error_log.records, error_log.report()


@pytest.mark.django_db
@pytest.mark.parametrize("expires_at, status", [(4102444800, 201), ("2100-01-01T00:00:00", 201), (1e20, 400),
                                                ("2100-13-01T00:00:00", 400), ("9999-12-31T23:59:59Z", 201),
                                                ("9999-12-31T23:59:59-14:00", 400), ("0001-01-01T00:00:00+01:00", 400)])
def test_token_expiry_in_epoch_seconds_or_without_a_zone(mint, error_log, expires_at, status):
    """schemathesis: an epoch-seconds or zone-less expires_at (both documented) answered 500 — the parser
    called django.utils.timezone.utc, which Django 5 no longer has; an epoch past year 9999 overflowed. A probe
    of the MCP tool: a time whose zone puts it past year 9999 (or before year 1) in UTC failed at the write, a
    500 (on PostgreSQL it was stored, and every later read of the token failed)."""
    raw = mint("fz-admin", role="Administrator", tier="", days=None)
    r = Client().post("/api/v1/tokens", {"name": "t", "expires_at": expires_at}, content_type="application/json",
                      HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == status, r.content
    assert not error_log.records, error_log.report()


@pytest.mark.django_db(transaction=True)
def test_a_tools_call_whose_name_is_not_a_string_is_no_500(mint, error_log):
    """Found by the fuzz (mcp/transport.py, McpConsumer.progress_mode: catalogue.tools.get(params.get("name"))
    with an unhashable name): TypeError, HTTP 500 and "MCP transport failure" logged with its stack trace.
    Left to the transport's owner (this branch does not edit mcp/transport.py): this test fails until then."""
    c = McpClient(mint("fz-admin", role="Administrator", tier="", days=None))
    c.initialize()
    for name in ({}, [], {"a": 1}):
        r = request(body={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name}},
                    headers=c.headers())
        assert r.status == 200 and r.error["code"] == -32602, (name, r.status, r.body)
    assert not error_log.records, error_log.report()


# --- schemas an agent declares (fleet.catalogue): checked or refused with BadSchema, never another exception ---

_KEYWORDS = ["type", "properties", "items", "pattern", "patternProperties", "$ref", "$dynamicRef", "$defs",
             "$id", "$anchor", "$dynamicAnchor", "allOf", "anyOf", "not", "enum", "const", "minLength", "required",
             "additionalProperties", "propertyNames", "if", "then", "$schema"]
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**20), st.floats(allow_nan=False),
                     st.sampled_from(["string", "object", "bogus", "(", "a+", "#", "#/$defs/a", "#/properties",
                                      "http://127.0.0.1:9/x", "urn:x", "#a", "", "^(a+)+$", "(?=a)", r"(a)\1",
                                      "a{2000}"]), st.text(max_size=8))
_SCHEMAS = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(_KEYWORDS + ["a", "b"]), inner, max_size=4)),
    max_leaves=12)
_HOSTILE = "a" * 64 + "!"  # against ^(a+)+$ a backtracking engine would take hours


@settings(max_examples=2000 if FULL else 200, derandomize=not FULL, database=None, deadline=None)
@given(schema=_SCHEMAS, instance=st.dictionaries(st.sampled_from(["a", "b", "name", _HOSTILE]),
                                                 st.text(max_size=4) | st.just(_HOSTILE)))
def test_a_declared_schema_is_checked_or_refused_never_a_crash(schema, instance):
    from fleet.catalogue import BadSchema, first_error, schema_problem

    problem = schema_problem(schema)
    assert problem is None or isinstance(problem, str)
    try:
        first_error(schema, instance)
    except BadSchema:
        pass


# patterns both engines read alike (no \d, \w, \b or $ before a newline, where Python's re and RE2 differ)
_SAME_PATTERNS = st.sampled_from(["a", "^a", "b$", "^[ab]+$", "a|_", "", "^(a+)+$"])
_PATTERN_SCHEMAS = st.recursive(
    st.one_of(st.booleans(), st.builds(lambda p: {"pattern": p}, _SAME_PATTERNS)),
    lambda inner: st.one_of(
        st.dictionaries(st.sampled_from(["additionalProperties", "unevaluatedProperties", "propertyNames", "not",
                                         "if", "then", "else"]), inner, max_size=3),
        st.dictionaries(st.sampled_from(["allOf", "anyOf", "oneOf"]), st.lists(inner, min_size=1, max_size=2),
                        max_size=2),
        st.dictionaries(st.sampled_from(["properties", "dependentSchemas"]),
                        st.dictionaries(_SAME_PATTERNS, inner, max_size=2), max_size=2)),
    max_leaves=8)


@settings(max_examples=1000 if FULL else 150, derandomize=not FULL, database=None, deadline=None)
@given(schema=_PATTERN_SCHEMAS, instance=st.dictionaries(st.text("ab_", max_size=3), st.text("ab_", max_size=3),
                                                         max_size=3))
def test_a_declared_schema_means_what_jsonschema_means(schema, instance):
    """RE2 changes how fast the patterns match, not what they accept (fleet.catalogue re-implements the one
    keyword that matches them in an agent's schema: pattern, also under propertyNames)."""
    from jsonschema import Draft202012Validator

    from fleet.catalogue import first_error, schema_problem
    from yuzu.schemas import NO_RETRIEVAL

    assert schema_problem(schema) is None
    expected = Draft202012Validator(schema, registry=NO_RETRIEVAL).is_valid(instance)
    assert (first_error(schema, instance) is None) is expected
