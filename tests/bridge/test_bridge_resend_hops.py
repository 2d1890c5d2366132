"""A bridge_send that must tell a live wait from a dead one watches the earlier wait's lease for a lease's length
(bridge/waiters.py). That watch may not hold one of the threads every server call shares (mcp.pipeline._HOPS, a
handful: cpu count + 4): a primary sending the same text again while its first wait lives — a handful of such calls
at once — stalled every other user's MCP calls on that process for ten seconds at a time."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from bridge import mcp_tools, turns, waiters
from bridge.identity import PRIMARY, Caller
from bridge.models import Member, Message
from mcp import pipeline
from mcp.context import ToolContext

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def short_leases(monkeypatch):
    monkeypatch.setattr(waiters, "LEASE_SECONDS", 1.5)
    waiters.leases().clear()
    yield
    waiters.leases().clear()


def test_watching_a_lease_holds_no_shared_thread(principal, monkeypatch):
    monkeypatch.setattr(pipeline, "_HOPS", ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-hop"))
    alice = principal("alice")
    primary = Caller(alice, PRIMARY)
    member = Member.objects.create(name="w", profile_name="standin", socket_name="s", owner=alice.user,
                                   owner_key=primary.world_key, pane_id="%1")
    first = turns.prepare_send(primary, "run the tests", session=member.session_id, timeout_ms=60000)
    stop = threading.Event()

    def renew():  # the first call's wait is alive: it renews its lease (rendezvous.wait_turn)
        while not stop.is_set():
            waiters.leases().hold(first.turn_pk, first.lease)
            stop.wait(0.1)

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()

    async def scenario():
        ctx = ToolContext(principal=alice, cid="c1", tool="bridge_send", catalogue="bridge")
        again = asyncio.ensure_future(mcp_tools.bridge_send(
            ctx, {"content": "run the tests", "sessionId": member.session_id, "wait": False}))
        await asyncio.sleep(0.3)  # the second send is watching the first wait's lease now
        started = time.monotonic()
        await pipeline.hop(lambda: None)()  # any other call's hop
        other = time.monotonic() - started
        return other, await again

    try:
        other, result = asyncio.run(scenario())
    finally:
        stop.set()
        renewer.join()
    assert result["outcome"] == "dispatched" and result["turnId"] != first.turn_id  # a live wait: a second message
    assert Message.objects.filter(member=member).count() == 2
    assert other < 0.5, f"another call waited {other:.2f}s for a thread while a send watched a lease"
