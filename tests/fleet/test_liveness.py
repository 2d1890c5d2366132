"""Agent liveness against the real agent consumer: the sweep tells an agent whose frames are not yet read
(its server is behind) from one whose server process died or whose socket is silent (docs/fleet.md,
"Liveness")."""

import asyncio
import time
from dataclasses import dataclass
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.executions import start_execution
from fleet.liveness import Connections
from fleet.models import Agent, Execution
from fleet.tasks import sweep_overdue
from tests.support.agent_ws import enrolled_agent, mint_device_token, until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager_celery")]
db = database_sync_to_async
LONG_AGO = timedelta(hours=1)


@pytest.fixture
def quick_heartbeats(settings):
    """A heartbeat interval (so a touch) of one second: silent after three."""
    settings.YUZU_AGENT_HEARTBEAT_S = 1


def connected():
    return dict(Agent.objects.values_list("agent_id", "connected"))


def test_an_agent_whose_frames_are_not_yet_read_stays_connected_but_one_whose_process_died_does_not(
        principal, quick_heartbeats, held_heartbeats):
    """The soak's finding: under CPU saturation heartbeats were processed after the backlog of command
    traffic, so the sweep marked agents with open sockets disconnected (silent for three intervals) and an
    execution started then left them out (949 of 1,000). Here the agent's heartbeat is stuck behind a
    database hop, its last_seen an hour old: its server process's touch keeps it connected and targeted.
    An agent whose server process died without closing its socket — its row says connected, and no process
    touches it any more — is still marked disconnected."""
    token = mint_device_token()
    op = principal("olive", "Operator")
    Agent.objects.create(agent_id="dead", hostname="gone", connected=True, connected_since=timezone.now())

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        await comm.send_json_to({"type": "heartbeat"})  # not yet read: the server is behind
        await db(Agent.objects.update)(last_seen=timezone.now() - LONG_AGO)
        await until(lambda: Agent.objects.get(pk=agent_id).last_seen > timezone.now() - timedelta(minutes=1))
        await db(sweep_overdue)()
        assert await db(connected)() == {agent_id: True, "dead": False}
        out = await db(start_execution)(op, plugin="os", action="info", agent_ids=[agent_id, "dead"])
        held_heartbeats.set()
        command = await comm.receive_json_from(timeout=5)
        assert command["command_id"] == out["command_id"]
        await comm.disconnect()
        return out["execution_id"]

    eid = async_to_sync(scenario)()
    assert Execution.objects.get(pk=eid).agents_targeted == 1


def test_a_silent_socket_is_marked_disconnected_until_its_agent_speaks_again(quick_heartbeats):
    """An open socket whose agent sends nothing for three intervals, its consumer idle (nothing waiting to be
    read): the touch leaves it out, so the sweep marks the agent disconnected, as before the touch; the
    socket stays open, and the agent's next heartbeat marks it connected again."""
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        await asyncio.sleep(3.5)  # silent for three intervals
        await db(Agent.objects.update)(last_seen=timezone.now() - LONG_AGO)
        await asyncio.sleep(1.5)  # a touch, which leaves it out
        await db(sweep_overdue)()
        assert await db(connected)() == {agent_id: False}
        await comm.send_json_to({"type": "heartbeat"})
        await until(lambda: Agent.objects.get(pk=agent_id).connected)
        await comm.disconnect()

    async_to_sync(scenario)()


@dataclass(eq=False)
class Conn:  # what the touch reads of a consumer
    agent_id: str | None
    handling: bool = False
    heard: float = 0.0
    idle_since: float = 0.0
    closing: bool = False
    superseded: bool = False


def test_the_touch_reads_each_connection_s_state_in_memory(settings):
    """Alive: registered, not closing or superseded, and busy or heard from within three intervals;
    caught up: alive and idle for CAUGHT_UP_IDLE_S."""
    settings.YUZU_AGENT_HEARTBEAT_S = 30
    now = time.monotonic()
    conns = Connections()
    conns.open = {
        Conn("busy", handling=True, heard=now - 3600, idle_since=now - 3600),  # frames not yet read
        Conn("idle", heard=now - 60, idle_since=now - 5),  # heartbeats flowing
        Conn("just-done", heard=now - 60, idle_since=now - 0.1),  # an acknowledgement may be on its way
        Conn("silent", heard=now - 91, idle_since=now - 91),
        Conn("closing", closing=True, heard=now, idle_since=now - 5),
        Conn("superseded", superseded=True, heard=now, idle_since=now - 5),
        Conn(None, heard=now, idle_since=now - 5),  # not registered yet
    }
    alive, caught_up = conns.state(now)
    assert sorted(alive) == ["busy", "idle", "just-done"] and caught_up == ["idle"]


def test_one_touch_is_one_statement_for_a_thousand_agents():
    ids = [f"a{i:04d}" for i in range(1000)]
    before = timezone.now() - LONG_AGO
    Agent.objects.bulk_create([Agent(agent_id=a, connected=a != "a0002", last_seen=before) for a in ids])
    with CaptureQueriesContext(connection) as queries:
        assert Agent.objects.touch(ids, ids[:10]) == 999  # a disconnected agent keeps its close time
    assert len(queries) == 1
    rows = {a: (seen, caught) for a, seen, caught in Agent.objects.values_list("agent_id", "last_seen", "caught_up_at")}
    assert rows["a0001"][0] > before and rows["a0001"][1] is not None
    assert rows["a0500"][0] > before and rows["a0500"][1] is None
    assert rows["a0002"] == (before, None)
