"""Embedded mode's in-process channel layer (yuzu.channel_layer): Channels' layer semantics, and a fan-out that
costs O(N) where Channels' InMemoryChannelLayer costs O(N²)."""

import asyncio
import gc
import time

import pytest
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer

from yuzu import channel_layer as mod
from yuzu.channel_layer import LocalChannelLayer


def run(coro):
    return asyncio.run(coro)


def test_settings_use_it_in_embedded_mode(settings):
    if settings.REDIS_URL:
        pytest.skip("YUZU_REDIS_URL is set: the Redis layer is configured")
    assert isinstance(get_channel_layer(), LocalChannelLayer)


def test_send_receive_groups_and_capacity():
    async def go():
        layer = LocalChannelLayer(capacity=2)
        a, b = await layer.new_channel(), await layer.new_channel()
        assert "!" in a  # process-local
        await layer.group_add("g", a)
        await layer.group_add("g", b)
        await layer.group_send("g", {"type": "x", "n": 1})
        assert await layer.receive(a) == {"type": "x", "n": 1} and await layer.receive(b) == {"type": "x", "n": 1}
        await layer.send(a, {"type": "y"})
        await layer.send(a, {"type": "y"})
        with pytest.raises(ChannelFull):
            await layer.send(a, {"type": "y"})
        await layer.group_send("g", {"type": "z"})  # a full member is skipped, the others still get it
        assert (await layer.receive(b))["type"] == "z"
        await layer.group_discard("g", b)
        await layer.group_send("g", {"type": "w"})
        assert b not in layer.channels and layer.groups["g"].keys() == {a}
        # a waiting receiver gets the message at once, as a copy
        msg = {"type": "v", "data": [1]}
        waiting = asyncio.ensure_future(layer.receive(b))
        await asyncio.sleep(0)
        await layer.send(b, msg)
        got = await waiting
        assert got == msg and got is not msg

    run(go())


def test_expired_messages_are_dropped_and_their_channel_leaves_its_groups(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(mod.time, "time", lambda: now[0])

    async def go():
        layer = LocalChannelLayer(expiry=10, group_expiry=100)
        await layer.group_add("g", "dead")
        await layer.group_add("h", "dead")
        await layer.group_add("g", "live")
        await layer.group_send("g", {"type": "m"})
        assert await layer.receive("live") == {"type": "m"}  # "live" reads its copy; "dead" never does
        now[0] += 11  # the message to "dead" expired unread; the sweep is due
        await layer.send("live", {"type": "n"})
        assert "dead" not in layer.channels and layer.groups == {"g": {"live": 1000.0}}
        now[0] += 200  # group membership expires too
        await layer.group_send("g", {"type": "o"})
        assert layer.groups == {} and layer.memberships == {}

    run(go())


def test_a_receiver_cancelled_as_its_message_arrives_loses_nothing():
    async def go():
        layer = LocalChannelLayer()
        waiting = asyncio.ensure_future(layer.receive("c"))
        await asyncio.sleep(0)
        await layer.send("c", {"type": "m"})  # handed to the waiter ...
        waiting.cancel()  # ... which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await layer.receive("c") == {"type": "m"}

    run(go())


def fan_out_seconds(n):
    async def go():
        layer = LocalChannelLayer(capacity=10)
        channels = [f"agent{i}.inmemory!x" for i in range(n)]
        for i, c in enumerate(channels):
            await layer.group_add(f"agent.{i}", c)
        receivers = [asyncio.ensure_future(layer.receive(c)) for c in channels]
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        for i in range(n):
            await layer.group_send(f"agent.{i}", {"type": "agent.command", "payload": {"command_id": "c"}})
        await asyncio.gather(*receivers)
        return time.perf_counter() - t0

    gc.disable()  # a full collection scans the whole test process's heap: noise, not the layer's cost
    try:
        return run(go())
    finally:
        gc.enable()


def test_fan_out_is_linear_in_the_number_of_agents():
    small, large = min(fan_out_seconds(1000) for _ in range(5)), min(fan_out_seconds(5000) for _ in range(5))
    # linear: ×5; Channels' InMemoryChannelLayer sweeps the whole layer per send: ×25
    assert large / small < 12, (small, large)
    assert large < 5, large


# --- group_send_many: one fan-out call (fleet.push.send_to_agents) ------------------------------------------

def test_group_send_many_reaches_every_member_of_every_group_once():
    async def go():
        layer = LocalChannelLayer()
        chans = [await layer.new_channel() for _ in range(4)]
        for i, c in enumerate(chans[:3]):
            await layer.group_add(f"agent.a{i}", c)
        await layer.group_add("agent.a0", chans[3])  # an agent with two connections: both get it
        await layer.group_send_many(["agent.a0", "agent.a1", "agent.a2", "agent.nobody"], {"type": "x", "n": 1})
        got = [await asyncio.wait_for(layer.receive(c), 1) for c in chans]
        assert got == [{"type": "x", "n": 1}] * 4
        assert all(not layer.channels.get(c) or not layer.channels[c].messages for c in chans)  # nothing twice

    run(go())


def redis_url():
    from django.conf import settings

    if not settings.REDIS_URL:
        pytest.skip("needs YUZU_REDIS_URL (a Redis this test may write keys to)")
    return settings.REDIS_URL


def test_redis_group_send_many_stores_one_message_per_receiving_process():
    """Two layers stand for two server processes with 3 and 2 agent connections; a third (the dispatcher)
    fans out to all five groups: each process's key holds one message, and every connection receives it."""
    url = redis_url()

    async def go():
        prefix = f"yuzu-test-{time.time_ns()}"
        make = lambda: mod.RedisChannelLayer(hosts=[url], prefix=prefix)  # noqa: E731
        p1, p2, sender = make(), make(), make()
        try:
            c1 = [await p1.new_channel() for _ in range(3)]
            c2 = [await p2.new_channel() for _ in range(2)]
            groups = [f"agent.g{i}" for i in range(5)]
            for g, c in zip(groups, c1 + c2, strict=True):
                await p1.group_add(g, c)
            await sender.group_send_many(groups + ["agent.nobody"], {"type": "agent.command", "payload": {"n": 1}})
            conn = sender.connection(0)
            for chans in (c1, c2):
                assert await conn.zcard(sender.prefix + sender.non_local_name(chans[0])) == 1
            got = [await asyncio.wait_for(p1.receive(c), 5) for c in c1] + \
                  [await asyncio.wait_for(p2.receive(c), 5) for c in c2]
            assert got == [{"type": "agent.command", "payload": {"n": 1}}] * 5
            for g, c in zip(groups, c1 + c2, strict=True):
                await p1.group_discard(g, c)
        finally:
            for layer in (p1, p2, sender):
                await layer.flush()
                await layer.close_pools()

    run(go())
