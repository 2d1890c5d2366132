"""Command delivery against the real agent consumer (Channels' WebsocketCommunicator over the project's
channel layer): the register race that lost commands under a connect burst, acknowledgements, bounded
re-sends on evidence of loss only, and counters that stay exact through duplicates (docs/fleet.md,
"Delivery guarantees")."""

import asyncio
import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.test import Client
from django.utils import timezone
from jsonschema import Draft202012Validator
from prometheus_client import REGISTRY

from fleet import consumers, identity, liveness, tasks
from fleet.executions import start_execution
from fleet.models import Agent, AgentExecStatus, Execution, Response
from fleet.responses import record_responses
from fleet.tasks import sweep_overdue
from mcp.registry import catalogue
from tests.support.agent_ws import (
    closed_with,
    connect,
    enrolled_agent,
    mint_device_token,
    register_msg,
    send,
    until,
)
from tests.support.mcp_http import McpClient

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager_celery")]
db = database_sync_to_async


async def eventually(check, timeout=10.0):
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


def test_a_register_that_completes_late_on_an_abandoned_connection_does_not_take_the_agent_over(
        principal, monkeypatch):
    """The 1,000-agent loss (issue 23): under the connect burst the server took longer than the hello
    timeout to register some agents (here: its group_add stalls, as a Redis call did), closed them 4408
    and they reconnected. The old connection's register then completed and announced itself as the
    newest, so the agent's live connection was closed 4409 — and the commands sent in that window went
    only to closing connections, which drop them."""
    monkeypatch.setattr(consumers, "HELLO_TIMEOUT_S", 0.3)
    token = mint_device_token()
    op = principal("olive", "Operator")

    async def scenario():
        first, agent_id, credential, _ = await enrolled_agent(token)
        await first.disconnect()

        layer, gate, stalled, handled = get_channel_layer(), asyncio.Event(), [], []
        real_group_add, real_on_register = layer.group_add, consumers.AgentConsumer.on_register

        async def stalling_group_add(group, channel):
            if not stalled:
                stalled.append(channel)
                await gate.wait()
            await real_group_add(group, channel)

        async def on_register(self, msg):
            try:
                await real_on_register(self, msg)
            finally:
                handled.append(self.channel_name)

        monkeypatch.setattr(layer, "group_add", stalling_group_add)
        monkeypatch.setattr(consumers.AgentConsumer, "on_register", on_register)

        old = await connect()
        await old.send_json_to(register_msg(agent_id, credential))
        await eventually(lambda: stalled)
        await asyncio.sleep(consumers.HELLO_TIMEOUT_S * 2)  # past the hello timeout, as in the burst
        new = await connect()  # the agent reconnects ...
        assert (await send(new, register_msg(agent_id, credential)))["type"] == "registered"
        gate.set()  # ... and only now does the old connection's register get through
        await eventually(lambda: len(handled) == 2)

        out = await db(start_execution)(op, plugin="os", action="info", agent_ids=[agent_id])
        command = await new.receive_json_from(timeout=5)
        assert command["type"] == "command" and command["command_id"] == out["command_id"]
        assert await closed_with(old, 4409)  # the abandoned connection is the one that goes
        assert (await db(Agent.objects.get)(pk=agent_id)).connected  # and its close changes nothing
        await new.disconnect()

    async_to_sync(scenario)()


# --- acknowledgements and re-sends -------------------------------------------------------------

def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def reply(cid, status, output="", exit_code=None):
    return {"type": "response", "command_id": cid, "status": status, "output": output, "exit_code": exit_code,
            "error": None}


@pytest.fixture
def quick_resends(monkeypatch, settings):
    """Short windows, and a touch (fleet.liveness) every second: the evidence re-sends wait for."""
    monkeypatch.setattr(tasks, "ACK_WINDOW_S", 0.3)
    monkeypatch.setattr(tasks, "ACK_QUIET_S", 0.1)
    monkeypatch.setattr(liveness, "CAUGHT_UP_IDLE_S", 0.2)
    settings.YUZU_AGENT_HEARTBEAT_S = 1


def test_a_command_lost_on_its_way_is_sent_again_until_acknowledged(principal, quick_resends, mint):
    """The agent's connection is idle and caught up well after the send (its server process's touch), and
    still no acknowledgement: the command was lost on its way, so it is sent again."""
    token = mint_device_token()
    op = principal("olive", "Operator")
    resends, acks = sample("yuzu_fleet_command_sends_total", attempt="resend"), \
        sample("yuzu_fleet_command_ack_seconds_count")

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        out = await db(start_execution)(op, plugin="os", action="info", agent_ids=[agent_id])
        lost = await comm.receive_json_from(timeout=5)  # the agent never sees this one
        again = await comm.receive_json_from(timeout=5)  # no acknowledgement within the window: sent again
        assert lost == again and again["command_id"] == out["command_id"]
        await comm.send_json_to(reply(again["command_id"], "RUNNING", "part"))  # the acknowledgement
        await comm.send_json_to(reply(again["command_id"], "SUCCESS", "done", 0))
        await until(lambda: Execution.objects.get(pk=out["execution_id"]).status == "succeeded")
        assert await comm.receive_nothing(timeout=1)  # acknowledged: no more sends
        await comm.disconnect()
        return out["execution_id"]

    eid = async_to_sync(scenario)()
    ex, row = Execution.objects.get(pk=eid), AgentExecStatus.objects.get(execution_id=eid)
    assert (ex.status, ex.agents_responded, ex.agents_success, ex.resent) == ("succeeded", 1, 1, 1)
    assert (row.status, row.attempts) == ("success", 2) and row.acknowledged_at >= row.last_sent_at
    assert Response.objects.get(execution_id=eid).output == "done"
    assert sample("yuzu_fleet_command_sends_total", attempt="resend") == resends + 1
    assert sample("yuzu_fleet_command_ack_seconds_count") == acks + 1

    # The re-send count is visible to the dispatcher: MCP get_execution_status (valid against its
    # output schema) and its REST twin.
    mcp = McpClient(mint("olive", role="Operator", tier="operator"))
    mcp.initialize()
    result = mcp.call("get_execution_status", {"execution_id": eid}).json()["result"]
    schema = catalogue("v1").tools["get_execution_status"].output_schema
    assert not list(Draft202012Validator(schema).iter_errors(result["structuredContent"]))
    assert (result["structuredContent"]["resent"], result["structuredContent"]["status"]) == (1, "succeeded")
    rest = Client(headers={"Authorization": f"Bearer {mint('olive', role='Operator')}"})
    assert rest.get(f"/api/v1/executions/{eid}").json()["data"]["resent"] == 1


def test_re_sends_are_bounded_and_an_agent_that_never_acknowledges_still_ends_in_timeout(principal, quick_resends,
                                                                                         monkeypatch):
    """An agent heard from (heartbeats), its connection caught up, that never acknowledges: MAX_SENDS sends."""
    monkeypatch.setattr(tasks, "MAX_SENDS", 3)
    token = mint_device_token()
    op = principal("olive", "Operator")

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        out = await db(start_execution)(op, plugin="os", action="info", agent_ids=[agent_id])
        sends = []
        for _ in range(3):  # the first at once, then each after its window and a touch that found the agent caught up
            sends.append(await comm.receive_json_from(timeout=5))
            await comm.send_json_to({"type": "heartbeat"})
        assert {s["command_id"] for s in sends} == {out["command_id"]}
        assert await comm.receive_nothing(timeout=2)  # three sends in all, then silence
        await comm.disconnect()
        return out["execution_id"]

    eid = async_to_sync(scenario)()
    row = AgentExecStatus.objects.get(execution_id=eid)
    assert (row.status, row.attempts, row.acknowledged_at) == ("dispatched", 3, None)
    assert Execution.objects.get(pk=eid).resent == 2
    Execution.objects.filter(pk=eid).update(expires_at=timezone.now() - timedelta(seconds=10))
    assert sweep_overdue() == 1
    row.refresh_from_db()
    assert (row.status, row.acknowledged_at) == ("timeout", None)  # a TIMEOUT is not an acknowledgement


def test_an_agent_whose_acknowledgement_is_not_yet_read_is_not_sent_the_command_again(principal, quick_resends,
                                                                                    held_heartbeats):
    """The soak's finding: when the server is behind, acknowledgements are merely not yet read, and each
    re-send (up to 4 per agent) added a send and a duplicate answer to that backlog. Here the agent's
    connection is busy — a heartbeat's database hop is stuck — so the command, and anything the agent
    sends, waits behind it: past three windows and touches the command is held (the connection is alive
    but never caught up, and it has not changed); once the backlog clears it arrives once."""
    token = mint_device_token()
    op = principal("olive", "Operator")

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        await comm.send_json_to({"type": "heartbeat"})  # the server is behind from here on
        out = await db(start_execution)(op, plugin="os", action="info", agent_ids=[agent_id])
        await asyncio.sleep(3)  # windows of 0.3, 0.6 and 1.2 s; a touch every second
        row = await db(AgentExecStatus.objects.get)(execution_id=out["execution_id"])
        assert (row.status, row.attempts) == ("dispatched", 1)
        held_heartbeats.set()
        command = await comm.receive_json_from(timeout=5)
        assert command["command_id"] == out["command_id"]
        await comm.send_json_to(reply(command["command_id"], "SUCCESS", "ok", 0))
        await until(lambda: Execution.objects.get(pk=out["execution_id"]).status == "succeeded")
        assert await comm.receive_nothing(timeout=1.5)  # no copy was queued behind it
        await comm.disconnect()
        return out["execution_id"]

    eid = async_to_sync(scenario)()
    assert Execution.objects.get(pk=eid).resent == 0
    assert AgentExecStatus.objects.get(execution_id=eid).attempts == 1


def test_an_agent_that_reconnected_since_the_send_is_sent_the_command_again(principal, quick_resends, monkeypatch):
    """The command reached a connection that dropped before the agent read it; the agent's new connection
    (opened after the send) is the evidence, so it is sent again there (a caught-up connection is not needed:
    none ever is here)."""
    monkeypatch.setattr(liveness, "CAUGHT_UP_IDLE_S", 3600)
    token = mint_device_token()
    op = principal("olive", "Operator")

    async def scenario():
        old, agent_id, credential, _ = await enrolled_agent(token)
        out = await db(start_execution)(op, plugin="os", action="info", agent_ids=[agent_id])
        assert (await old.receive_json_from(timeout=5))["command_id"] == out["command_id"]  # never read
        await old.disconnect()
        new = await connect()
        assert (await send(new, register_msg(agent_id, credential)))["type"] == "registered"
        again = await new.receive_json_from(timeout=5)
        assert again["command_id"] == out["command_id"]
        await new.send_json_to(reply(again["command_id"], "SUCCESS", "ok", 0))
        await until(lambda: Execution.objects.get(pk=out["execution_id"]).status == "succeeded")
        await new.disconnect()
        return out["execution_id"]

    eid = async_to_sync(scenario)()
    assert Execution.objects.get(pk=eid).resent == 1


def test_received_acknowledges_without_a_response_and_duplicates_never_count_twice(principal):
    """The frames an agent sends for a re-sent command — ``received`` while it runs, its kept terminal
    frame once done — in one batch and across batches: the counters and rows stay exact."""
    op = principal("olive", "Operator")
    Agent.objects.bulk_create([Agent(agent_id=a, connected=True) for a in ("a1", "a2", "a3")])
    out = start_execution(op, plugin="os", action="info", agent_ids=["a1", "a2", "a3"])
    cid, eid = out["command_id"], out["execution_id"]

    def frame(status, output="", exit_code=None):
        return {"command_id": cid, "status": status, "output": output, "exit_code": exit_code, "error": None}

    received = {"command_id": cid, "status": "RECEIVED"}
    record_responses([("a1", received)])
    row = AgentExecStatus.objects.get(execution_id=eid, agent_id="a1")
    assert row.status == "running" and row.acknowledged_at and row.first_response_at is None
    assert not Response.objects.exists()  # an acknowledgement is not a response
    record_responses([("a1", frame("RUNNING", "part")), ("a1", received), ("a2", frame("SUCCESS", "ok", 0)),
                      ("a2", frame("SUCCESS", "ok", 0)), ("a2", received), ("a1", frame("SUCCESS", "all", 0))])
    record_responses([("a1", frame("SUCCESS", "all", 0)), ("a1", received), ("a2", frame("FAILURE", "late", 1))])
    ex = Execution.objects.get(pk=eid)
    assert (ex.status, ex.agents_responded, ex.agents_success, ex.agents_failure) == ("running", 2, 2, 0)
    assert dict(Response.objects.values_list("agent_id", "output")) == {"a1": "all", "a2": "ok"}
    record_responses([("a3", frame("RUNNING", "half")), ("a3", received)])  # received after RUNNING: no-op
    assert Response.objects.get(agent_id="a3").output == "half"
    record_responses([("a3", frame("FAILURE", "boom", 2)), ("a3", frame("FAILURE", "boom", 2))])
    ex.refresh_from_db()
    assert (ex.status, ex.agents_responded, ex.agents_success, ex.agents_failure) == ("completed", 3, 2, 1)
    assert Response.objects.count() == 3


def test_a_slow_enrolment_is_not_closed_4408_but_silence_after_it_is(monkeypatch):
    """Under a connect burst the server took longer than the hello timeout to enrol agents: they were
    closed 4408 while their enrolment went through, enrolled again on the next connection (an orphan
    agent and a device-token use each time) and added to the burst. The timer now pauses while the
    server works and restarts once it has answered."""
    monkeypatch.setattr(consumers, "HELLO_TIMEOUT_S", 0.3)
    real_enroll = identity.enroll

    def slow_enroll(token, hostname):
        time.sleep(1)  # the database thread is busy
        return real_enroll(token, hostname)

    monkeypatch.setattr(identity, "enroll", slow_enroll)
    token = mint_device_token()

    async def scenario():
        comm = await connect()
        reply = await send(comm, {"type": "enroll", "token": token, "hostname": "web-1"})
        assert reply["type"] == "enrolled"
        assert await closed_with(comm, 4408) == "register timeout"  # ... but it must register in time

    async_to_sync(scenario)()
    assert Agent.objects.count() == 1
