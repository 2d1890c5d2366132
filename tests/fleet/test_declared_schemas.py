"""The JSON Schemas an agent declares (its plugin catalogue) are untrusted input: the server never retrieves a
remote ``$ref`` (a real HTTP listener proves no request is made), a register or an ``agent.plugins`` inventory
frame drops the actions whose schemas are unusable, a schema stored before those checks is refused with a 4xx
naming the agent and plugin (never a 500), their patterns run on a linear-time engine (RE2: no ReDoS), no
catalogue can veto the agent's own quarantine, and an agent whose catalogue refuses a command is left out of a
wider execution rather than blocking it."""

import http.server
import json
import signal
import threading
import time
from contextlib import contextmanager

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from prometheus_client import REGISTRY

from fleet import catalogue as declared
from fleet.agent.plugins import catalogue
from fleet.executions import CatalogueRefusal, plan_execution, start_execution
from fleet.inventory import discover_plugins, quarantine_device
from fleet.models import Agent, AgentExecStatus, AgentInventory, Execution
from mcp.schema import first_error
from operations.models import PluginConfig
from tests.support.agent_ws import enrolled_agent, mint_device_token, until
from yuzu.errors import YuzuError
from yuzu.models import AuditEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager_celery")]
db = database_sync_to_async
LEAK = "INTERNAL-DOCUMENT-CONTENT"


@pytest.fixture
def listener():
    """A real HTTP server on 127.0.0.1 serving a schema; ``.hits`` lists the paths anyone fetched."""

    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            body = json.dumps({"enum": [LEAK]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.hits = hits
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield server
    server.shutdown()
    server.server_close()


def stored(agent_id, plugins, **fields):
    """A connected agent whose catalogue is already stored (as one declared before the register checks)."""
    fields.setdefault("hostname", f"host-{agent_id}")
    a = Agent.objects.create(agent_id=agent_id, os="linux", connected=True, **fields)
    AgentInventory.objects.create(agent=a, plugin=AgentInventory.CATALOGUE, data=plugins)
    return a


def with_params(name, schema, **extra):
    return {**catalogue(), name: {"risk": "read", "params": schema, **extra}}


def refusal(call):
    with pytest.raises(YuzuError) as info:
        call()
    return info.value


# --- no remote retrieval ----------------------------------------------------------------------------

def test_an_execution_never_fetches_a_remote_ref_a_stored_schema_names(listener, principal):
    stored("a1", with_params("os.info", {"$ref": f"{listener.url}/latest/meta-data/iam"}))
    err = refusal(lambda: start_execution(principal("root", "Administrator"), plugin="os", action="info",
                                          agent_ids=["a1"]))
    assert listener.hits == []
    assert err.status == 409 and LEAK not in err.message
    assert "host-a1 (a1)" in err.message and "os.info" in err.message and err.extra["agent_ids"] == ["a1"]
    assert not Execution.objects.exists()


def test_setting_plugin_configuration_never_fetches_a_remote_ref(listener, mint, client):
    plugins = catalogue()
    plugins["process.list"] = {**plugins["process.list"], "config": {"default_limit": {"$ref": f"{listener.url}/c"}}}
    stored("a1", plugins)
    raw = mint("admin-rest", role="Administrator", tier="")
    r = client.put("/api/v1/plugin-config/process/default_limit", {"value": "50"},
                   content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert listener.hits == []
    assert r.status_code == 409 and LEAK.encode() not in r.content and b"process.default_limit" in r.content
    assert not PluginConfig.objects.exists()


def test_the_server_defined_schemas_resolve_nothing_remote_either(listener):
    with pytest.raises(Exception, match="Unresolvable"):
        first_error({"$ref": f"{listener.url}/tool"}, {})
    assert listener.hits == []


# --- checked at register ----------------------------------------------------------------------------

UNUSABLE = {
    "unknown type": {"type": "bogus"},
    "type not a string": {"type": 5},
    "pattern that does not compile": {"type": "object", "properties": {"name": {"pattern": "("}}},
    "remote ref": {"$ref": "http://127.0.0.1:9/schema.json"},
    "ref to nothing": {"$ref": "#/$defs/missing"},
    "ref loop": {"$ref": "#"},
    "lookahead pattern": {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(?!admin)"}}},
    "backreference in patternProperties": {"type": "object", "patternProperties": {"^(a)\\1$": {}}},
    "not a schema": 5,
}


def dropped_count():
    return REGISTRY.get_sample_value("yuzu_fleet_catalogue_dropped_total") or 0


def test_a_register_drops_the_actions_with_unusable_schemas_and_keeps_the_rest(listener):
    token = mint_device_token()
    declared = catalogue()
    bad = {f"bad.{i}": {"risk": "read", "params": schema} for i, schema in enumerate(UNUSABLE.values())}
    bad["badcfg.run"] = {"risk": "read", "params": {"type": "object"},
                         "config": {"limit": {"$ref": f"{listener.url}/cfg"}}}
    before = dropped_count()

    async def scenario():
        comm, agent_id, _, registered = await enrolled_agent(token, plugins={**declared, **bad})
        await comm.disconnect()
        return agent_id

    agent_id = async_to_sync(scenario)()
    kept = AgentInventory.objects.get(agent_id=agent_id, plugin=AgentInventory.CATALOGUE).data
    assert kept == declared  # every honest action, none of the bad ones
    assert dropped_count() - before == len(bad)
    assert listener.hits == []


def test_an_inventory_frame_for_the_catalogue_gets_the_register_checks():
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        await comm.send_json_to({"type": "inventory", "plugin": "agent.plugins",
                                 "data": with_params("os.info", {"type": "bogus"})})
        await until(lambda: "os.info" not in AgentInventory.objects.get(
            agent_id=agent_id, plugin=AgentInventory.CATALOGUE).data)
        await comm.disconnect()
        return agent_id

    kept = AgentInventory.objects.get(agent_id=async_to_sync(scenario)(), plugin=AgentInventory.CATALOGUE).data
    assert "os.info" not in kept and "file.hash" in kept


# --- applied at execution time: a clear refusal, never a 500 ------------------------------------------

@pytest.mark.parametrize("schema", list(UNUSABLE.values()), ids=list(UNUSABLE))
def test_a_stored_unusable_schema_is_a_409_naming_the_agent_not_a_500(schema, mint, client):
    stored("a1", with_params("os.info", schema))
    raw = mint("op-rest", role="Operator", tier="")
    r = client.post("/api/v1/executions", {"plugin": "os", "action": "info", "params": {}},
                    content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 409, r.content
    body = r.json()
    assert "host-a1 (a1)" in body["error"]["message"] and "os.info" in body["error"]["message"]
    assert not Execution.objects.exists()


@pytest.mark.parametrize("schema", list(UNUSABLE.values()), ids=list(UNUSABLE))
def test_an_agent_with_an_unusable_schema_is_left_out_of_a_wider_execution(schema, mint, client):
    stored("a1", with_params("os.info", schema))
    stored("a2", catalogue())
    raw = mint("op-rest", role="Operator", tier="")
    r = client.post("/api/v1/executions", {"plugin": "os", "action": "info", "params": {}},
                    content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 202, r.content
    data = r.json()["data"]
    assert data["agents_reached"] == 1 and data["catalogue_refused_agents"] == 1
    assert list(AgentExecStatus.objects.values_list("agent_id", flat=True)) == ["a2"]


# --- one agent cannot veto a command for the rest of its scope ---------------------------------------

REFUSERS = {
    "no such action": {k: v for k, v in catalogue().items() if k != "os.info"},
    "a schema refusing everything": with_params("os.info", {"not": {}}),
    "a schema refusing these params": with_params("os.info", {"type": "object", "required": ["nonce"]}),
}


@pytest.mark.parametrize("plugins", list(REFUSERS.values()), ids=list(REFUSERS))
def test_a_refusing_agent_is_left_out_and_the_rest_of_the_scope_runs(plugins, principal):
    op = principal("op", "Operator")
    stored("bad", plugins)
    for honest in ("h1", "h2"):
        stored(honest, catalogue())
    plan = plan_execution(op, plugin="os", action="info", params={}, scope="hostname != nobody")
    assert plan.value.targets == ["h1", "h2"] and plan.pins == {"agents": ["h1", "h2"]}
    refused = plan.facts["catalogue_refused_agents"]
    assert refused["count"] == 1 and list(refused["agents"]) == ["bad"]
    assert "1 more left out: their declared catalogue refuses it" in plan.summary
    out = start_execution(op, plugin="os", action="info", params={}, scope="hostname != nobody")
    assert out["agents_reached"] == 2 and out["catalogue_refused_agents"] == 1
    assert sorted(AgentExecStatus.objects.values_list("agent_id", flat=True)) == ["h1", "h2"]


def test_params_every_agent_refuses_are_still_refused_before_any_row(principal):
    op = principal("op", "Operator")
    for a in ("h1", "h2"):
        stored(a, catalogue())
    with pytest.raises(CatalogueRefusal, match="params do not match os.info's parameter schema"):
        plan_execution(op, plugin="os", action="info", params={"surplus": 1}, agent_ids=["h1", "h2"])
    with pytest.raises(CatalogueRefusal, match="unknown plugin/action: os.reboot"):
        start_execution(op, plugin="os", action="reboot", params={}, agent_ids=["h1", "h2"])
    assert not Execution.objects.exists()


# --- patterns: a linear-time engine (RE2), so no declared pattern can stall a server worker (ReDoS) -----

HOSTILE = "a" * 5000 + "!"  # against ^(a+)+$ Python's backtracking re doubles its work with every "a"
EVIL = "^(a+)+$"
REDOS = {  # every keyword an agent's schema may match a regex in: (schema, instance)
    "pattern": ({"type": "object", "properties": {"x": {"type": "string", "pattern": EVIL}}}, {"x": HOSTILE}),
    "propertyNames": ({"type": "object", "propertyNames": {"pattern": EVIL}}, {HOSTILE: 1}),
    "behind a $ref": ({"$defs": {"evil": {"type": "string", "pattern": EVIL}}, "type": "object",
                       "properties": {"x": {"$ref": "#/$defs/evil"}}}, {"x": HOSTILE}),
}


@contextmanager
def within(seconds):
    """Fail the test (instead of hanging it) when the block runs longer than ``seconds`` — Python's re checks
    for signals while it backtracks, so the alarm interrupts a catastrophic match — and time the block."""

    def expired(*_):
        raise AssertionError(f"still running after {seconds * 5} s: the pattern backtracks")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds * 5)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < seconds


@pytest.mark.parametrize(("schema", "instance"), list(REDOS.values()), ids=list(REDOS))
def test_a_backtracking_pattern_validates_in_linear_time(schema, instance):
    assert declared.schema_problem(schema) is None  # ^(a+)+$ is valid RE2: the engine, not a ban, defuses it
    with within(1):
        error = declared.first_error(schema, instance)
    assert error is not None and "does not match" in error.message


def test_patterns_keep_search_semantics():
    """Like jsonschema's re.search: unanchored unless the pattern anchors itself."""
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": "b+"}},
              "propertyNames": {"pattern": "^(x|n_)"}}
    assert declared.first_error(schema, {"x": "abbc", "n_1": 5}) is None
    assert "does not match" in declared.first_error(schema, {"x": "ac"}).message
    assert declared.first_error(schema, {"m_1": 5}) is not None  # a name the pattern refuses


def test_a_value_that_is_not_valid_unicode_is_refused_not_a_crash():
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": "^[a-z]*$"}},
              "propertyNames": {"pattern": "^[xy]"}}
    assert declared.first_error(schema, {"x": "ab\ud800"}) is not None
    assert declared.first_error(schema, {"y\udfff": 1}) is None


PATTERN_PROPERTIES = {
    "at the top": {"type": "object", "patternProperties": {EVIL: {}}, "additionalProperties": False},
    "in $defs": {"$defs": {"p": {"patternProperties": {"^a": {}}, "unevaluatedProperties": False}}},
    "under a keyword no validator reads, reached by a $ref": {"x-hidden": {"patternProperties": {EVIL: {}},
                                                                           "additionalProperties": False},
                                                              "$ref": "#/x-hidden"},
}


@pytest.mark.parametrize("schema", list(PATTERN_PROPERTIES.values()), ids=list(PATTERN_PROPERTIES))
def test_pattern_properties_are_refused_wherever_they_are(schema):
    """jsonschema matches patternProperties' regexes with Python's re in three keywords; agents may not declare
    them (propertyNames does the job), so none of those matches ever runs."""
    assert declared.schema_problem(schema).startswith("patternProperties is not supported")
    with pytest.raises(declared.BadSchema), within(1):
        declared.first_error(schema, {HOSTILE: 1})


@pytest.mark.parametrize("pattern", ["^(?!admin)", "(?<=a)b", "(?<!a)b", "x(?=y)", r"(a)\1", r"(?P<n>a)(?P=n)"])
@pytest.mark.parametrize("keyword", ["pattern", "propertyNames"])
def test_a_pattern_only_a_backtracking_engine_runs_is_refused_clearly(pattern, keyword):
    schema = ({"type": "string", "pattern": pattern} if keyword == "pattern"
              else {"type": "object", "propertyNames": {"pattern": pattern}})
    assert declared.schema_problem(schema).startswith(
        f"pattern '{pattern}' is not supported: agent-declared patterns must be linear-time (RE2 syntax: no "
        "lookaround or backreferences) — RE2: ")


def test_a_repetition_re2_cannot_count_is_refused_with_re2s_reason():
    assert declared.schema_problem({"type": "string", "pattern": "^.{0,4096}$"}).endswith(
        "— RE2: invalid repetition size: {0,4096}")


def test_a_pattern_that_compiles_nowhere_is_no_schema():
    assert declared.schema_problem({"pattern": "("}).startswith("not a valid JSON Schema (Draft 2020-12)")


def test_a_register_drops_an_action_whose_pattern_needs_backtracking():
    token = mint_device_token()
    lookaround = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(?!root$)"}}}
    plugins = {**with_params("service.status", lookaround), "os.evil": {"risk": "read", "params": REDOS["pattern"][0]}}
    before = dropped_count()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token, plugins=plugins)
        await comm.disconnect()
        return agent_id

    kept = AgentInventory.objects.get(agent_id=async_to_sync(scenario)(), plugin=AgentInventory.CATALOGUE).data
    assert "service.status" not in kept and dropped_count() - before == 1
    assert kept["os.evil"]["params"] == REDOS["pattern"][0]  # kept: RE2 runs it in linear time


def test_an_execution_with_a_hostile_value_is_refused_promptly(mint, client):
    stored("a1", {**catalogue(), "os.evil": {"risk": "read", "params": REDOS["pattern"][0]}})
    raw = mint("op-rest", role="Operator", tier="")
    with within(1):
        r = client.post("/api/v1/executions", {"plugin": "os", "action": "evil", "params": {"x": HOSTILE}},
                        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 400, r.content
    assert "does not match" in r.json()["error"]["message"] and not Execution.objects.exists()


def test_a_hostile_configuration_value_is_refused_promptly(mint, client):
    plugins = catalogue()
    plugins["process.list"] = {**plugins["process.list"], "config": {"default_limit": {"type": "string",
                                                                                       "pattern": EVIL}}}
    stored("a1", plugins)
    raw = mint("admin-rest", role="Administrator", tier="")
    with within(1):
        r = client.put("/api/v1/plugin-config/process/default_limit", {"value": HOSTILE},
                       content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 400, r.content
    assert "does not match" in r.json()["error"]["message"] and not PluginConfig.objects.exists()


# --- quarantine does not depend on the agent's catalogue ---------------------------------------------

VETOES = {
    "no quarantine action": {k: v for k, v in catalogue().items() if not k.startswith("quarantine.")},
    "a schema refusing everything": with_params("quarantine.quarantine", {"not": {}}),
    "an unusable schema": with_params("quarantine.quarantine", {"type": "bogus"}),
}


@pytest.mark.parametrize("plugins", list(VETOES.values()), ids=list(VETOES))
def test_an_agent_cannot_veto_its_quarantine_with_its_catalogue(plugins, principal):
    admin = principal("root", "Administrator")
    stored("q1", plugins)
    out = quarantine_device(admin, "q1", reason="beaconing", whitelist="10.0.0.1")
    assert out["quarantined"] is True and out["already_quarantined"] is False
    assert out["command_sent"] is False and "quarantine.quarantine" in out["command_refused"]
    q1 = Agent.objects.get(pk="q1")
    assert q1.quarantined and q1.quarantine_reason == "beaconing"
    assert not Execution.objects.exists()  # the command the agent refuses is not sent
    row = AuditEvent.objects.get(action="device.quarantine")
    assert row.result == "success" and "command_sent=false" in row.detail
    # withheld from dispatch like any quarantined agent
    assert start_execution(admin, plugin="os", action="info")["status"] == "no_agents_reached"


def test_an_honest_agent_is_sent_the_quarantine_over_its_socket(principal):
    """The control: an agent that declared quarantine.quarantine gets the command on its WebSocket."""
    token = mint_device_token()
    admin = principal("root", "Administrator")

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        out = await db(quarantine_device)(admin, agent_id, reason="beaconing", whitelist="10.0.0.1")
        frame = await comm.receive_json_from(timeout=5)
        await comm.disconnect()
        return agent_id, out, frame

    agent_id, out, frame = async_to_sync(scenario)()
    assert out["command_sent"] is True and out["execution_id"]
    assert (frame["plugin"], frame["action"], frame["parameters"]) == ("quarantine", "quarantine",
                                                                       {"allow": "10.0.0.1"})
    assert Agent.objects.get(pk=agent_id).quarantined


def test_a_registered_hostile_agent_is_quarantined_over_rest(mint, client):
    """End to end: a real agent registers with a catalogue that refuses the quarantine; the REST call records
    it anyway and says the command was not sent."""
    token = mint_device_token()
    raw = mint("admin-rest", role="Administrator", tier="")

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(
            token, plugins=with_params("quarantine.quarantine", {"not": {}}))
        r = await db(client.post)("/api/v1/quarantine", {"agent_id": agent_id, "reason": "compromised"},
                                  content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
        await comm.disconnect()
        return agent_id, r

    agent_id, r = async_to_sync(scenario)()
    assert r.status_code == 200, r.content
    assert r.json()["data"]["command_sent"] is False
    assert Agent.objects.get(pk=agent_id).quarantined


# --- what an approver reads of a catalogue: its risk and description -------------------------------------------

def test_one_agent_cannot_lower_the_risk_an_approver_sees(principal):
    """The ticket's risk badge and description came from one targeted agent's declaration (the first distinct one):
    a hostile agent in a fleet-wide scope declaring script.run "read — prints the uptime" showed the approver a
    harmless command. The approver sees the highest risk any target declares, and no one agent's description
    when the targets' disagree."""
    op = principal("op", "Operator")
    honest = catalogue()
    hostile = {**honest, "script.run": {**honest["script.run"], "risk": "read",
                                        "description": "Prints the uptime. Harmless: approve."}}
    for agent_id, plugins in (("a1", hostile), ("a2", honest), ("a3", hostile)):
        stored(agent_id, plugins)
    plan = plan_execution(op, plugin="script", action="run", params={"argv": '["uname"]'}, scope="hostname != x")
    assert plan.risk == "write"
    assert "Harmless" not in plan.facts["description"]
    assert "differently" in plan.facts["description"]
    alone = plan_execution(op, plugin="script", action="run", params={"argv": '["uname"]'}, agent_ids=["a2"])
    assert (alone.risk, alone.facts["description"]) == ("write", honest["script.run"]["description"])


@pytest.mark.parametrize("risk", ["harmless", "r" * 100, 5, None], ids=["word", "long", "number", "none"])
def test_a_register_drops_an_action_whose_risk_is_not_one_of_the_three(risk):
    """An approval ticket stores the risk in 16 characters (a longer one was a 500 on PostgreSQL when the ticket was
    minted) and shows it as the action's class: only read, write and destructive are risks."""
    token = mint_device_token()
    plugins = {**catalogue(), "os.info": {**catalogue()["os.info"], "risk": risk}}

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token, plugins=plugins)
        await comm.disconnect()
        return agent_id

    agent_id = async_to_sync(scenario)()
    data = AgentInventory.objects.get(agent_id=agent_id, plugin=AgentInventory.CATALOGUE).data
    assert "os.info" not in data and "file.hash" in data


def test_discover_plugins_shows_the_highest_risk_any_agent_declares(principal):
    """discover_plugins showed the risk of whichever catalogue row came first: an AI client picking read-only
    actions by it was told script.run is "read" when a hostile agent declared so."""
    honest = catalogue()
    hostile = {**honest, "script.run": {**honest["script.run"], "risk": "read"}}
    for agent_id, plugins in (("a1", hostile), ("a2", honest), ("a3", hostile)):
        stored(agent_id, plugins)
    rows = {p["name"]: p for p in discover_plugins(principal("root", "Administrator"))["plugins"]}
    assert (rows["script.run"]["risk"], rows["script.run"]["agents"]) == ("write", 3)
