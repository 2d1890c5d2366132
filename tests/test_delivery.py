"""Command delivery against the real agent consumer (Channels' WebsocketCommunicator over the project's
channel layer): the register race that lost commands under a connect burst, acknowledgements, bounded
re-sends, and counters that stay exact through duplicates (docs/fleet.md, "Delivery guarantees")."""

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from fleet import consumers
from fleet.executions import start_execution
from fleet.models import Agent

from .test_agent_protocol import closed_with, connect, eager_celery, enrolled_agent, mint_device_token  # noqa: F401
from .test_agent_protocol import register_msg, send

pytestmark = pytest.mark.django_db(transaction=True)
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
