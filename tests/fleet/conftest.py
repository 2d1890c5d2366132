import asyncio

import pytest

from fleet import consumers


@pytest.fixture
def held_heartbeats(monkeypatch):
    """Every agent heartbeat waits, before it is handled, until the test sets the event this returns: what a
    saturated server does to a connection whose frames queue behind its database hops."""
    gate, real = asyncio.Event(), consumers.AgentConsumer.on_heartbeat

    async def held(self, msg):
        await gate.wait()
        await real(self, msg)

    monkeypatch.setattr(consumers.AgentConsumer, "on_heartbeat", held)
    return gate
