"""The agent WebSocket protocol against the real consumer (Channels' WebsocketCommunicator over the
project's channel layer): enrolment, register, heartbeat, inventory, commands and response frames,
the 4400 / 4401 / 4403 / 4408 / 4409 closes, and what a hostile peer gets (browser Origins, malformed
identities, floods of refused enrolments)."""

import asyncio
import json
from datetime import timedelta

import pytest
import websockets
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone
from prometheus_client import REGISTRY

from fleet import consumers, identity, services
from fleet.executions import start_execution
from fleet.models import (
    Agent,
    AgentExecStatus,
    AgentInventory,
    AgentState,
    DeviceToken,
    Execution,
    ManagementGroup,
    Response,
    Tag,
)
from fleet.push import push_tags
from fleet.scope import matching_agents
from tests.support.agent_ws import (
    agent_endpoint,
    closed_with,
    connect,
    enrolled_agent,
    mint_device_token,
    register_msg,
    send,
    until,
)
from yuzu.models import AuditEvent, hash_secret

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager_celery")]
db = database_sync_to_async


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- enrolment and register --------------------------------------------------------------------

def test_enrol_register_heartbeat_inventory_and_reconnect():
    token = mint_device_token("--max-uses", "2")
    assert token.startswith("yzd_") and len(token) == 4 + 64
    assert DeviceToken.objects.get().token_hash == hash_secret(token)

    async def scenario():
        comm = await connect()
        reply = await send(comm, {"type": "enroll", "token": token, "hostname": "web-1"})
        agent_id, credential = reply["agent_id"], reply["credential"]
        agent = await db(Agent.objects.get)(pk=agent_id)
        assert agent.credential_hash == hash_secret(credential) and credential not in agent.credential_hash
        await db(Tag.objects.create)(agent=agent, key="owner", value="ops")  # set on the server
        registered = await send(comm, register_msg(agent_id, credential, tags={"Role": "Web", "rack": "r1"},
                                                   attributes={"kernel": "6.1", "simulated": False}))
        assert registered == {"type": "registered", "agent_id": agent_id, "heartbeat_interval": 30,
                              "tags": {"owner": "ops", "role": "web", "rack": "r1"}}
        await comm.send_json_to({"type": "inventory", "plugin": "os", "data": {"distribution": "Debian"}})
        await db(Agent.objects.filter(pk=agent_id).update)(last_seen=timezone.now() - timedelta(hours=1))
        await comm.send_json_to({"type": "heartbeat"})
        await until(lambda: Agent.objects.get(pk=agent_id).last_seen > timezone.now() - timedelta(minutes=1))
        await until(lambda: AgentInventory.objects.filter(agent_id=agent_id, plugin="os").exists())
        await comm.disconnect()
        return agent_id, credential

    agent_id, credential = async_to_sync(scenario)()
    agent = Agent.objects.get(pk=agent_id)
    assert (agent.hostname, agent.os, agent.arch, agent.agent_version) == ("web-1", "linux", "x86_64", "0.1.0")
    assert agent.attributes == {"kernel": "6.1", "simulated": False} and agent.connected is False
    assert AgentInventory.objects.get(agent=agent, plugin="os").data == {"distribution": "Debian"}
    assert AgentInventory.objects.get(agent=agent, plugin="agent.plugins").data["file.hash"]["risk"] == "read"
    assert DeviceToken.objects.get().uses == 1
    assert AuditEvent.objects.filter(action="agent.enroll", result="success", target_id=agent_id).exists()

    async def reconnect():  # later runs register with the saved credential, no token needed
        comm = await connect()
        registered = await send(comm, register_msg(agent_id, credential))
        assert registered["type"] == "registered"
        assert (await db(Agent.objects.get)(pk=agent_id)).connected
        await comm.disconnect()

    async_to_sync(reconnect)()
    assert DeviceToken.objects.get().uses == 1


@pytest.mark.parametrize("case", ["revoked", "expired", "used_up", "unknown"])
def test_refused_device_token_closes_4401_and_creates_nothing(case):
    token = mint_device_token("--max-uses", "1")
    dt = DeviceToken.objects.get()
    if case == "revoked":
        dt.revoked_at = timezone.now()
    elif case == "expired":
        dt.expires_at = timezone.now() - timedelta(seconds=1)
    elif case == "used_up":
        dt.uses = 1
    elif case == "unknown":
        token = "yzd_" + "0" * 64
    dt.save()

    async def scenario():
        comm = await connect()
        await comm.send_json_to({"type": "enroll", "token": token, "hostname": "web-1"})
        return await closed_with(comm, 4401)

    assert "enrolment refused" in async_to_sync(scenario)()
    assert not Agent.objects.exists()
    assert AuditEvent.objects.filter(action="agent.enroll", result="failure").exists()


def test_wrong_credential_closes_4401():
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        await comm.disconnect()
        comm = await connect()
        await comm.send_json_to(register_msg(agent_id, "yza_" + "f" * 64))
        assert "invalid agent credential" in await closed_with(comm, 4401)
        comm = await connect()
        await comm.send_json_to(register_msg("0" * 32, "yza_" + "f" * 64))  # no such agent
        await closed_with(comm, 4401)

    async_to_sync(scenario)()
    assert not Agent.objects.get().connected


def test_a_silent_connection_is_closed_4408(monkeypatch):
    monkeypatch.setattr(consumers, "HELLO_TIMEOUT_S", 0.2)

    async def scenario():
        assert await closed_with(await connect(), 4408) == "register timeout"

    async_to_sync(scenario)()


# --- malformed input ---------------------------------------------------------------------------

BAD_FRAMES = {
    "not json": "{nope",
    "not an object": "[1, 2]",
    "no type": json.dumps({"command_id": "x"}),
    "unknown type": json.dumps({"type": "launch"}),
    "enrol after register": json.dumps({"type": "enroll", "token": "t", "hostname": "h"}),
    "command_id not a string": json.dumps({"type": "response", "command_id": 7, "status": "SUCCESS"}),
    "command_id too long": json.dumps({"type": "response", "command_id": "c" * 161, "status": "SUCCESS"}),
    "unknown status": json.dumps({"type": "response", "command_id": "c", "status": "DONE"}),
    "exit_code bool": json.dumps({"type": "response", "command_id": "c", "status": "SUCCESS", "exit_code": True}),
    "output over 1 MiB": json.dumps({"type": "response", "command_id": "c", "status": "SUCCESS",
                                     "output": "x" * (1024 * 1024 + 1)}),
    "inventory data not an object": json.dumps({"type": "inventory", "plugin": "os", "data": [1]}),
    "inventory data with NUL": json.dumps({"type": "inventory", "plugin": "os", "data": {"k": ["a\x00"]}}),
    "inventory NaN": '{"type": "inventory", "plugin": "os", "data": {"load": NaN}}',
    "inventory plugin with a newline": json.dumps({"type": "inventory", "plugin": "os\nx", "data": {}}),
    "inventory data over 256 KiB": json.dumps({"type": "inventory", "plugin": "os",
                                               "data": {"blob": "x" * (256 * 1024)}}),
    "command_id with NUL": json.dumps({"type": "response", "command_id": "os-\x00", "status": "SUCCESS"}),
    "received without command_id": json.dumps({"type": "received"}),
    "received command_id too long": json.dumps({"type": "received", "command_id": "c" * 161}),
}


@pytest.mark.parametrize("name", list(BAD_FRAMES))
def test_malformed_input_closes_4400_and_keeps_what_was_stored(name):
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token, tags={"role": "web"})
        await comm.send_json_to({"type": "inventory", "plugin": "os", "data": {"kernel": "6.1"}})
        await comm.send_to(text_data=BAD_FRAMES[name])
        reason = await closed_with(comm, 4400)
        assert reason
        return agent_id

    agent_id = async_to_sync(scenario)()
    agent = Agent.objects.get(pk=agent_id)
    assert agent.connected is False and agent.hostname == "web-1"
    assert AgentInventory.objects.get(agent=agent, plugin="os").data == {"kernel": "6.1"}
    assert Tag.objects.get(agent=agent).value == "web"


def test_an_agent_cannot_fill_the_store_with_inventory_rows():
    """Each inventory plugin is a row of its own that every inventory read returns: an agent naming new plugins
    without end (each frame up to 4 MiB) filled the database and made get_agent_inventory load gigabytes. The
    rows an agent may report are bounded; past the bound a new plugin closes 4400 and nothing is stored, while
    the plugins it already has can still be replaced."""
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        held = await db(AgentInventory.objects.filter(agent_id=agent_id).count)()  # agent.plugins
        for i in range(consumers.MAX_INVENTORY_ROWS - held):
            await comm.send_json_to({"type": "inventory", "plugin": f"p{i}", "data": {"i": i}})
        await comm.send_json_to({"type": "inventory", "plugin": "p0", "data": {"i": "again"}})
        await until(lambda: AgentInventory.objects.filter(agent_id=agent_id, plugin="p0").values_list(
            "data", flat=True).first() == {"i": "again"})
        await comm.send_json_to({"type": "inventory", "plugin": "one-too-many", "data": {}})
        assert "inventory" in await closed_with(comm, 4400)
        return agent_id

    agent_id = async_to_sync(scenario)()
    assert AgentInventory.objects.filter(agent_id=agent_id).count() == consumers.MAX_INVENTORY_ROWS
    assert not AgentInventory.objects.filter(agent_id=agent_id, plugin="one-too-many").exists()


@pytest.mark.parametrize("depth", [33, 50_000])
def test_a_deeply_nested_frame_closes_4400_and_the_agent_is_disconnected_at_once(depth, caplog):
    """33 levels is one over the bound every JSON face shares (yuzu.jsondata.MAX_DEPTH); 50,000 makes the json
    module itself raise RecursionError, which once escaped the consumer (daphne: 1011, no disconnect())."""
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        await comm.send_to(text_data='{"type": "heartbeat", "x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}")
        reason = await closed_with(comm, 4400)
        return agent_id, reason

    agent_id, reason = async_to_sync(scenario)()
    assert reason == "frame nests deeper than 32 levels"
    assert Agent.objects.get(pk=agent_id).connected is False
    assert not consumers.connections.open
    assert "Traceback" not in caplog.text


def test_a_frame_nested_32_levels_is_accepted():
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        # the frame (1), data (2), then 30 nested lists: 32 levels in all
        await comm.send_json_to({"type": "inventory", "plugin": "os", "data": {"k": _nested(30)}})
        await until(lambda: AgentInventory.objects.filter(agent_id=agent_id, plugin="os").exists())
        await comm.disconnect()

    async_to_sync(scenario)()


def _nested(levels):
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_a_consumer_that_fails_unexpectedly_still_marks_its_agent_disconnected(monkeypatch):
    """Whatever ends the consumer abnormally (a bug, an unforeseen exception), its disconnect bookkeeping runs:
    daphne sends no websocket.disconnect to an application that died."""
    token = mint_device_token()

    async def boom(self, msg):
        raise RuntimeError("a bug")

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        assert await db(Agent.objects.get)(pk=agent_id)
        assert consumers.connections.open
        monkeypatch.setattr(consumers.AgentConsumer, "on_heartbeat", boom)
        await comm.send_json_to({"type": "heartbeat"})
        with pytest.raises(RuntimeError, match="a bug"):
            await comm.receive_output(timeout=5)
        return agent_id

    agent_id = async_to_sync(scenario)()
    assert Agent.objects.get(pk=agent_id).connected is False
    assert not consumers.connections.open


@pytest.mark.parametrize("frame,why", [
    ({"type": "heartbeat"}, "before register"),
    ({"type": "enroll", "token": 5, "hostname": "h"}, "'token'"),
    ({"type": "register", "agent_id": "a", "credential": "c", "hostname": "h", "tags": {"role": "Not Valid!"}},
     "invalid tag"),
    ({"type": "register", "agent_id": "a", "credential": "c", "hostname": "h", "attributes": {"k": [1]}}, "attribute"),
])
def test_malformed_before_register_closes_4400(frame, why):
    async def scenario():
        comm = await connect()
        await comm.send_json_to(frame)
        return await closed_with(comm, 4400)

    assert why in async_to_sync(scenario)()


# --- hostile peers: browsers, malformed identities, refusal floods ----------------------------------

def test_a_handshake_with_an_origin_header_is_refused_4403():
    """Only a browser sends Origin; the agent program never does. A web page must not reach the agent
    protocol through its visitor's browser."""
    before = sample("yuzu_agent_origin_refused_total")

    async def scenario():
        comm = WebsocketCommunicator(agent_endpoint(), "/agent/v1/ws",
                                     headers=[(b"origin", b"https://evil.example")])
        assert await comm.connect() == (False, 4403)

    async_to_sync(scenario)()
    assert sample("yuzu_agent_origin_refused_total") == before + 1
    assert not AuditEvent.objects.exists()


@pytest.mark.live
def test_daphne_answers_a_browser_handshake_403_and_an_agent_handshake_101(daphne, tmp_path):
    server = daphne()
    url = f"ws://127.0.0.1:{server.port}/agent/v1/ws"

    async def scenario():
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(url, origin="http://127.0.0.1:8000", open_timeout=10):
                pass
        assert refused.value.response.status_code == 403
        async with websockets.connect(url, open_timeout=10) as ws:  # no Origin: an agent
            await ws.send(json.dumps({"type": "heartbeat"}))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd.code == 4400
            # What docs/agent-protocol.md (Close codes) says an agent gets under daphne: the code, no reason, and
            # no frame before it. Should daphne start passing reasons on, this fails and the doc wants updating.
            assert closed.value.rcvd.reason == ""

    asyncio.run(scenario())


def test_a_refusal_names_its_reason_in_the_servers_log(caplog):
    """The agent gets the close code; the reason is in the server's log (docs/agent-protocol.md, Close codes)."""
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        await comm.send_json_to({"type": "response", "command_id": 7, "status": "SUCCESS"})
        await closed_with(comm, 4400)
        return agent_id

    with caplog.at_level("INFO", logger="yuzu.fleet.agents"):
        agent_id = async_to_sync(scenario)()
    assert f"closing agent socket {agent_id} (4400): 'command_id' must be a non-empty string" in caplog.text


BAD_IDENTITIES = {
    "non-ASCII agent_id": {"agent_id": "é" * 10},
    "60-character non-hex agent_id": {"agent_id": "g" * 60},
    "over-long agent_id": {"agent_id": "a" * 65},
    "upper-case agent_id": {"agent_id": "ABCDEF"},
    "agent_id with NUL": {"agent_id": "ab\x00cd"},
    "hostname with NUL": {"hostname": "web-1\x00"},
    "hostname with a newline": {"hostname": "web-1\nrole=admin"},
    "hostname with an unpaired surrogate": {"hostname": "web-\ud800"},
    "hostname with a bidi override": {"hostname": "db-1\u202etsohlacol"},  # shown as "db-1localhost" reversed
    "hostname with a bidi isolate": {"hostname": "web-1\u2066"},
    "hostname with a zero-width space": {"hostname": "db-\u200b1"},  # reads as db-1, another machine's name
    "hostname with a tag character": {"hostname": "db-1\U000e0041"},
    "non-ASCII os": {"os": "lïnux"},
    "arch with a control character": {"arch": "x86\x1b[2J"},
    "non-ASCII credential": {"credential": "yza_é"},
    "attribute value with NUL": {"attributes": {"kernel": "6.1\x00"}},
    "tag value with NUL": {"tags": {"owner": "ops\x00"}},
    "plugin catalogue with NUL": {"plugins": {"os.info": {"risk": "read\x00", "params": {}}}},
}


@pytest.mark.parametrize("name", list(BAD_IDENTITIES))
def test_a_malformed_identity_closes_4400_without_a_traceback(name, caplog):
    token = mint_device_token()

    async def scenario():
        comm = await connect()
        reply = await send(comm, {"type": "enroll", "token": token, "hostname": "web-1"})
        await comm.send_json_to({**register_msg(reply["agent_id"], reply["credential"]), **BAD_IDENTITIES[name]})
        return await closed_with(comm, 4400)

    reason = async_to_sync(scenario)()
    field = next(iter(BAD_IDENTITIES[name]))
    assert field in reason, reason
    assert not Agent.objects.filter(connected=True).exists()
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("frame", [
    '{"type": "enroll", "token": "yzd_\\u00e9", "hostname": "web-1"}',
    '{"type": "enroll", "token": "yzd_x", "hostname": "web\\u0000"}',
    '{"type": "register", "agent_id": "ab", "credential": "c", "hostname": "h", "attributes": {"load": NaN}}',
    '{"type": "register", "agent_id": "ab", "credential": "c", "hostname": "h", "attributes": {"k": Infinity}}',
])
def test_malformed_enrolments_and_json_constants_close_4400(frame):
    async def scenario():
        comm = await connect()
        await comm.send_to(text_data=frame)
        return await closed_with(comm, 4400)

    assert async_to_sync(scenario)()
    assert not Agent.objects.exists() and not AuditEvent.objects.exists()


def test_command_output_with_nul_is_stored_not_a_crash(principal):
    """Output is data, not identity: a NUL (which PostgreSQL cannot store) becomes U+FFFD."""
    token = mint_device_token()
    op = principal("olive", "Operator")

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        out = await db(start_execution)(op, plugin="os", action="info", agent_ids=[agent_id])
        await comm.receive_json_from(timeout=5)
        await comm.send_json_to({"type": "response", "command_id": out["command_id"], "status": "SUCCESS",
                                 "output": "a\x00b", "exit_code": 0, "error": "e\udc80"})
        await until(lambda: Execution.objects.get(pk=out["execution_id"]).status == "succeeded")
        await comm.disconnect()
        return out["execution_id"]

    r = Response.objects.get(execution_id=async_to_sync(scenario)())
    assert (r.output, r.error_detail) == ("a\ufffdb", "e\ufffd")


def failure_rows(action):
    return list(AuditEvent.objects.filter(action=action, result="failure").order_by("id").values_list("detail",
                                                                                                       flat=True))


@pytest.mark.parametrize("action", ["enroll", "register"])
def test_refusals_cost_one_audit_row_per_source_per_window_carrying_the_count(action):
    """An unauthenticated peer cannot flood the audit log: 25 refusals from one address write one row at
    once and one row with the count when the window (60 s) ends; another address gets its own row."""
    token = mint_device_token()
    before = sample("yuzu_agent_auth_failures_total", action=action)

    async def scenario():
        if action == "register":
            comm, agent_id, _, _ = await enrolled_agent(token)
            await comm.disconnect()
            bad = register_msg(agent_id, "yza_" + "0" * 64)
        else:
            bad = {"type": "enroll", "token": "yzd_" + "0" * 64, "hostname": "guess"}

        async def refused(client):
            comm = await connect(client)
            await comm.send_json_to(bad)
            await closed_with(comm, 4401)

        for _ in range(25):
            await refused(("203.0.113.7", 50000))
        assert len(await db(failure_rows)(f"agent.{action}")) == 1
        await refused(("198.51.100.9", 50000))
        assert len(await db(failure_rows)(f"agent.{action}")) == 2
        await identity.failures.close(("203.0.113.7", f"agent.{action}"))  # the window ends
        return await db(failure_rows)(f"agent.{action}")

    first, other, count = async_to_sync(scenario)()
    assert "source=203.0.113.7" in first and "source=198.51.100.9" in other
    assert count.startswith("source=203.0.113.7 failures=24 in the last 60 s; last: ")
    assert sample("yuzu_agent_auth_failures_total", action=action) == before + 26


def test_the_audit_window_closes_by_itself(monkeypatch):
    monkeypatch.setattr(identity, "AUDIT_WINDOW_S", 2)

    async def scenario():
        for _ in range(2):
            comm = await connect(("203.0.113.7", 50000))
            await comm.send_json_to({"type": "enroll", "token": "yzd_" + "0" * 64, "hostname": "guess"})
            await closed_with(comm, 4401)
        await until(lambda: len(failure_rows("agent.enroll")) == 2, timeout=15)

    async_to_sync(scenario)()
    assert "failures=1 in the last 2 s" in failure_rows("agent.enroll")[1]


# --- commands and responses --------------------------------------------------------------------

def test_commands_reach_the_agent_and_response_frames_update_rows_and_counters(principal):
    token = mint_device_token()
    op = principal("olive", "Operator")

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        out = await db(start_execution)(op, plugin="process", action="list", params={"name": "python"},
                                        agent_ids=[agent_id])
        assert out["status"] == "running" and out["agents_reached"] == 1
        command = await comm.receive_json_from(timeout=5)
        assert command["type"] == "command" and command["command_id"] == out["command_id"]
        assert (command["plugin"], command["action"], command["parameters"]) == ("process", "list", {"name": "python"})
        assert command["expires_at"] > timezone.now().timestamp()
        cid, eid = out["command_id"], out["execution_id"]

        def frame(status, output, exit_code=None):
            return {"type": "response", "command_id": cid, "status": status, "output": output,
                    "exit_code": exit_code, "error": None}

        await comm.send_json_to(frame("RUNNING", "par"))
        await until(lambda: Response.objects.filter(execution_id=eid, status=AgentState.RUNNING).exists())
        assert (await db(AgentExecStatus.objects.get)(execution_id=eid)).status == "running"
        await comm.send_json_to(frame("SUCCESS", "partial then full", 0))
        await until(lambda: Execution.objects.get(pk=eid).status == "succeeded")
        await comm.send_json_to(frame("SUCCESS", "duplicate", 0))
        await comm.send_json_to({"type": "heartbeat"})  # processed after the duplicate
        await until(lambda: Agent.objects.get(pk=agent_id).last_seen is not None)
        await comm.disconnect()
        return agent_id, eid

    agent_id, eid = async_to_sync(scenario)()
    ex = Execution.objects.get(pk=eid)
    assert (ex.agents_targeted, ex.agents_responded, ex.agents_success, ex.agents_failure) == (1, 1, 1, 0)
    r = Response.objects.get(execution_id=eid)
    assert (r.agent_id, r.status, r.output, r.exit_code) == (agent_id, AgentState.SUCCESS, "partial then full", 0)


def test_an_agent_cannot_choose_its_service_tag():
    """The service tag decides which service-scoped tokens reach a device (their executions, quarantines and
    reads): a compromised agent reporting service=<another> at register left its own service's responders' reach
    and entered another's. The agent's other tags are stored as before; a reported service tag is not."""
    token = mint_device_token()

    async def scenario():
        comm, agent_id, credential, _ = await enrolled_agent(token, tags={"service": "hr", "role": "web"})
        await comm.disconnect()
        assert not await db(Tag.objects.filter(agent_id=agent_id, key="service").exists)()
        await db(Tag.objects.create)(agent_id=agent_id, key="service", value="payments")  # set on the server
        comm = await connect()
        registered = await send(comm, register_msg(agent_id, credential, tags={"Service": "HR", "role": "db"}))
        assert registered["tags"] == {"service": "payments", "role": "db"}
        await comm.disconnect()
        return agent_id

    agent_id = async_to_sync(scenario)()
    assert dict(Tag.objects.filter(agent_id=agent_id).values_list("key", "value")) == {"service": "payments",
                                                                                       "role": "db"}


def test_a_register_cannot_overwrite_an_admin_set_tag_to_enter_a_dynamic_group(principal):
    """Tags decide dynamic groups (and so Guardian, compliance and target scopes): a compromised agent reporting
    environment=prod over the staging an administrator set (set_tag) entered the Prod group, and every policy and
    command aimed at it. A tag set on the server wins; the agent's report of that key is ignored."""
    admin = principal("root", role="Administrator", tier="")
    ManagementGroup.objects.create(name="Prod", membership_type=ManagementGroup.Membership.DYNAMIC,
                                   scope_expression="tag:environment == prod")
    token = mint_device_token()

    async def enrol():
        comm, agent_id, credential, _ = await enrolled_agent(token, tags={"owner": "ops"})
        await comm.disconnect()
        return agent_id, credential

    agent_id, credential = async_to_sync(enrol)()
    services.set_tag(admin, agent_id, "environment", "staging")

    async def hostile():
        comm = await connect()
        registered = await send(comm, register_msg(agent_id, credential,
                                                   tags={"environment": "prod", "owner": "ops"}))
        await comm.disconnect()
        return registered["tags"]

    assert async_to_sync(hostile)() == {"environment": "staging", "owner": "ops"}
    assert Tag.objects.get(agent_id=agent_id, key="environment").value == "staging"
    assert agent_id not in matching_agents("group:Prod").values_list("agent_id", flat=True)


def test_a_register_omitting_an_admin_set_tag_does_not_remove_it(principal):
    """A register reporting no tags at all, or none of the server's, leaves every tag set on the server as it was:
    an agent cannot leave a group (and the policies aimed at it) by staying silent about its role."""
    admin = principal("root", role="Administrator", tier="")
    ManagementGroup.objects.create(name="Databases", membership_type=ManagementGroup.Membership.DYNAMIC,
                                   scope_expression="tag:role == db")
    token = mint_device_token()

    async def enrol():
        comm, agent_id, credential, _ = await enrolled_agent(token, tags={"role": "web", "owner": "ops"})
        await comm.disconnect()
        return agent_id, credential

    agent_id, credential = async_to_sync(enrol)()
    services.set_tag(admin, agent_id, "role", "db")

    async def silent():
        comm = await connect()
        registered = await send(comm, register_msg(agent_id, credential, tags={}))
        await comm.disconnect()
        return registered["tags"]

    assert async_to_sync(silent)() == {"role": "db"}
    assert dict(Tag.objects.filter(agent_id=agent_id).values_list("key", "value")) == {"role": "db"}
    assert list(matching_agents("group:Databases").values_list("agent_id", flat=True)) == [agent_id]


def test_reported_tags_follow_the_agent_for_keys_the_server_did_not_set(principal):
    """A key nobody set on the server is the agent's: its report updates it, and a register that stops reporting
    it removes it. Once set on the server it is the server's (the origin says so); deleted there, the agent's
    report applies again."""
    admin = principal("root", role="Administrator", tier="")
    token = mint_device_token()

    async def enrol():
        comm, agent_id, credential, _ = await enrolled_agent(token, tags={"role": "web", "owner": "ops"})
        await comm.disconnect()
        return agent_id, credential

    agent_id, credential = async_to_sync(enrol)()

    async def report(tags):
        comm = await connect()
        registered = await send(comm, register_msg(agent_id, credential, tags=tags))
        await comm.disconnect()
        return registered["tags"]

    def origins():
        return {t["key"]: (t["value"], t["origin"]) for t in services.get_tags(admin, agent_id)["tags"]}

    assert origins() == {"role": ("web", "agent"), "owner": ("ops", "agent")}
    assert async_to_sync(report)({"role": "cache"}) == {"role": "cache"}
    services.set_tag(admin, agent_id, "role", "cache")
    assert origins() == {"role": ("cache", "server")}
    assert async_to_sync(report)({"role": "web"}) == {"role": "cache"}
    services.delete_tag(admin, agent_id, "role")
    assert async_to_sync(report)({"role": "web"}) == {"role": "web"}
    assert origins() == {"role": ("web", "agent")}
    assert services.agent_details(admin, agent_id)["tag_origins"] == {"role": "agent"}


def test_tag_pushes_reach_the_agent_and_a_newer_connection_supersedes():
    token = mint_device_token()

    async def scenario():
        first, agent_id, credential, _ = await enrolled_agent(token)
        await db(Tag.objects.create)(agent_id=agent_id, key="role", value="db")
        await db(push_tags)(agent_id)
        assert await first.receive_json_from(timeout=5) == {"type": "tags", "tags": {"role": "db"}}
        second = await connect()
        assert (await send(second, register_msg(agent_id, credential)))["type"] == "registered"
        assert "superseded" in await closed_with(first, 4409)
        assert (await db(Agent.objects.get)(pk=agent_id)).connected  # the old socket's close changed nothing
        await db(push_tags)(agent_id)
        assert (await second.receive_json_from(timeout=5))["type"] == "tags"
        await second.disconnect()

    async_to_sync(scenario)()


def test_runagent_local_enrols_once_and_again_after_a_database_reset(tmp_path):
    from fleet.management.commands.runagent import Command

    token = Command().local_token(tmp_path)
    assert token.startswith("yzd_") and DeviceToken.objects.get().max_uses == 1
    (tmp_path / "state.json").write_text(json.dumps({"agent_id": "local-1", "credential": "yza_x"}))
    Agent.objects.create(agent_id="local-1")
    assert Command().local_token(tmp_path) is None  # known identity: no new token
    Agent.objects.all().delete()
    assert Command().local_token(tmp_path).startswith("yzd_") and not (tmp_path / "state.json").exists()
