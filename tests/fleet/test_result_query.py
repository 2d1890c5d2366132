"""The result query against the real consumer (Channels' WebsocketCommunicator over the project's channel
layer): after a register, the server asks the agent about every command it holds as ``running`` for it, and
stores the answers — the kept terminal frame like any answer, ``running`` as nothing, ``unknown`` as an honest
TIMEOUT that is never re-sent — while a hostile ``result.answer`` is refused 4400, counted, and stores nothing.
The same with real agent processes and a real dropped connection: tests/e2e/test_result_recovery.py."""

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from prometheus_client import REGISTRY

from fleet import consumers
from fleet.executions import start_execution
from fleet.models import AgentExecStatus, Execution, Response
from fleet.responses import FORGOTTEN
from tests.support.agent_ws import closed_with, connect, enrolled_agent, mint_device_token, register_msg, send, until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager_celery")]
db = database_sync_to_async


def sample(outcome):
    return REGISTRY.get_sample_value("yuzu_fleet_result_queries_total", {"outcome": outcome}) or 0.0


def frame(cid, status, output="", exit_code=None):
    return {"type": "response", "command_id": cid, "status": status, "output": output, "exit_code": exit_code,
            "error": None}


async def running_commands(op, comm, agent_id, n):
    """Start ``n`` executions on the agent and acknowledge each with a RUNNING frame; returns their
    (command_id, execution_id) in start order."""
    out = []
    for i in range(n):
        ex = await db(start_execution)(op, plugin="os", action="info", agent_ids=[agent_id])
        command = await comm.receive_json_from(timeout=5)
        assert command["command_id"] == ex["command_id"]
        await comm.send_json_to(frame(ex["command_id"], "RUNNING", f"part {i}"))
        out.append((ex["command_id"], ex["execution_id"]))
    eids = [e for _, e in out]
    await until(lambda: AgentExecStatus.objects.filter(execution_id__in=eids, status="running").count() == n)
    return out


async def reconnect(agent_id, credential):
    """A new connection of the agent; returns it and the result.query frames after ``registered``."""
    comm = await connect()
    assert (await send(comm, register_msg(agent_id, credential)))["type"] == "registered"
    return comm


def test_a_re_registering_agent_is_asked_and_each_answer_is_stored_as_what_it_is(principal):
    token = mint_device_token()
    op = principal("olive", "Operator")
    asked, kept, running, unknown = sample("asked"), sample("kept"), sample("running"), sample("unknown")

    async def scenario():
        comm, agent_id, credential, _ = await enrolled_agent(token)
        (c_kept, e_kept), (c_run, e_run), (c_gone, e_gone) = await running_commands(op, comm, agent_id, 3)
        done = await db(start_execution)(op, plugin="os", action="info", agent_ids=[agent_id])
        await comm.receive_json_from(timeout=5)
        await comm.send_json_to(frame(done["command_id"], "SUCCESS", "done", 0))  # terminal: not asked about
        await until(lambda: Execution.objects.get(pk=done["execution_id"]).status == "succeeded")
        await comm.disconnect()  # the terminal answers the agent sent next were lost with this connection

        comm = await reconnect(agent_id, credential)
        query = await comm.receive_json_from(timeout=5)
        assert query == {"type": "result.query", "command_ids": [c_gone, c_run, c_kept]}  # newest first
        await comm.send_json_to(frame(c_kept, "SUCCESS", "the real output", 0))  # the kept frame, again
        await comm.send_json_to({"type": "result.answer", "kept": [c_kept], "running": [c_run], "unknown": [c_gone]})
        await until(lambda: Execution.objects.get(pk=e_gone).status == "completed")
        assert await comm.receive_nothing(timeout=0.5)  # nothing re-sent: the unknown command never runs again
        await comm.send_json_to(frame(c_run, "FAILURE", "later", 3))  # the running one's answer comes later
        await until(lambda: Execution.objects.get(pk=e_run).status == "completed")
        await comm.disconnect()

        comm = await reconnect(agent_id, credential)  # nothing running any more: no query
        assert await comm.receive_nothing(timeout=0.5)
        await comm.disconnect()
        return e_kept, e_run, e_gone

    e_kept, e_run, e_gone = async_to_sync(scenario)()
    r = Response.objects.get(execution_id=e_kept)
    assert (r.status, r.output, r.exit_code) == ("success", "the real output", 0)
    assert Execution.objects.get(pk=e_kept).status == "succeeded"
    r = Response.objects.get(execution_id=e_run)
    assert (r.status, r.output, r.exit_code) == ("failure", "later", 3)
    r, row = Response.objects.get(execution_id=e_gone), AgentExecStatus.objects.get(execution_id=e_gone)
    assert (r.status, r.output, r.error_detail) == ("timeout", "part 2", FORGOTTEN)  # partial output kept
    assert (row.status, row.attempts, row.error_detail) == ("timeout", 1, FORGOTTEN)  # sent once, never again
    ex = Execution.objects.get(pk=e_gone)
    assert (ex.agents_responded, ex.agents_failure, ex.resent) == (1, 1, 0)
    assert (sample("asked") - asked, sample("kept") - kept, sample("running") - running,
            sample("unknown") - unknown) == (3, 1, 1, 1)


def test_a_long_list_is_asked_in_bounded_frames(principal, monkeypatch):
    monkeypatch.setattr(consumers, "RESULT_QUERY_MAX", 2)
    token = mint_device_token()
    op = principal("olive", "Operator")

    async def scenario():
        comm, agent_id, credential, _ = await enrolled_agent(token)
        cmds = await running_commands(op, comm, agent_id, 5)
        await comm.disconnect()
        comm = await reconnect(agent_id, credential)
        queries = [await comm.receive_json_from(timeout=5) for _ in range(3)]
        assert [q["command_ids"] for q in queries] == [[cmds[4][0], cmds[3][0]], [cmds[2][0], cmds[1][0]],
                                                       [cmds[0][0]]]
        await comm.send_json_to({"type": "result.answer", "unknown": [cmds[4][0], cmds[3][0]]})
        await comm.send_json_to({"type": "result.answer", "unknown": [cmds[2][0]], "running": [cmds[1][0]]})
        await until(lambda: AgentExecStatus.objects.filter(status="timeout").count() == 3)
        await comm.disconnect()

    async_to_sync(scenario)()
    assert AgentExecStatus.objects.filter(status="running").count() == 2


HOSTILE = {
    "not asked": lambda c, other: {"unknown": [other]},
    "named twice": lambda c, other: {"kept": [c], "unknown": [c]},
    "not a list": lambda c, other: {"unknown": c},
    "not strings": lambda c, other: {"unknown": [c, 7]},
    "too many": lambda c, other: {"unknown": [c] * (consumers.RESULT_QUERY_MAX + 1)},
    "oversized id": lambda c, other: {"unknown": ["x" * 100_000]},
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_result_answer_is_refused_4400_counted_and_stores_nothing(principal, case):
    """Every id must be one the server asked about on this connection, once: an agent cannot time out a
    command it was never asked about (here: one still ``dispatched``, the re-send's to deliver)."""
    token = mint_device_token()
    op = principal("olive", "Operator")
    refused = sample("refused")

    async def scenario():
        comm, agent_id, credential, _ = await enrolled_agent(token)
        [(cid, eid)] = await running_commands(op, comm, agent_id, 1)
        other = await db(start_execution)(op, plugin="os", action="info", agent_ids=[agent_id])
        await comm.receive_json_from(timeout=5)  # never acknowledged: dispatched
        await comm.disconnect()
        comm = await reconnect(agent_id, credential)
        assert (await comm.receive_json_from(timeout=5))["command_ids"] == [cid]
        await comm.send_json_to({"type": "result.answer", **HOSTILE[case](cid, other["command_id"])})
        assert "command ids" in await closed_with(comm, 4400)
        return eid, other["execution_id"]

    eid, other = async_to_sync(scenario)()
    assert sample("refused") == refused + 1
    assert dict(AgentExecStatus.objects.values_list("execution_id", "status")) == {eid: "running", other: "dispatched"}
    assert Response.objects.get(execution_id=eid).status == "running"
    assert Execution.objects.filter(status="running").count() == 2


def test_answers_are_only_accepted_once_and_only_after_register(principal):
    token = mint_device_token()
    op = principal("olive", "Operator")

    async def scenario():
        comm, agent_id, credential, _ = await enrolled_agent(token)
        [(cid, eid)] = await running_commands(op, comm, agent_id, 1)
        await comm.send_json_to({"type": "result.answer", "unknown": [cid]})  # never asked on this connection
        assert "command ids" in await closed_with(comm, 4400)
        comm = await reconnect(agent_id, credential)
        await comm.receive_json_from(timeout=5)
        await comm.send_json_to({"type": "result.answer", "running": [cid]})
        await comm.send_json_to({"type": "result.answer", "unknown": [cid]})  # answered already
        assert "command ids" in await closed_with(comm, 4400)
        comm = await connect()
        await comm.send_json_to({"type": "result.answer", "unknown": [cid]})
        assert "before register" in await closed_with(comm, 4400)
        return eid

    eid = async_to_sync(scenario)()
    assert AgentExecStatus.objects.get(execution_id=eid).status == "running"
