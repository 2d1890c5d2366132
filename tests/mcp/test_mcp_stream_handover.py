"""A streamed call's follow outlives its process (mcp.streaming.handover), in-process: a follower that stops
renewing its lease (its process was SIGKILLed) is adopted by the GET stream that resumed the call, which then
gets the rest — progress above what it saw, and the result — instead of waiting forever; a follower that finds
its lease taken by another (it stalled) stops with ``handed_over``. The real two-process case, with daphne
SIGKILLed, is tests/faults/test_server_kill.py."""

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.urls import path

from mcp.context import FollowSpec, follow_recipe
from mcp.registry import configure, tool
from mcp.schema import integer, obj
from mcp.streaming import admission, follower, handover, watch
from mcp.streaming.handover import handovers
from mcp.streaming.ring import ring_key, rings
from mcp.transport import McpConsumer
from tests.support import mcp_http
from tests.support.mcp_http import McpClient
from tests.support.sse_client import Stream
from yuzu.models import ApiToken
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = {}


@follow_recipe("test.handover_job")
def _follow_job(args):
    job = args["job"]
    return FollowSpec(group=f"handover.{job}", snapshot=lambda: (JOBS[job], 3, JOBS[job] >= 3),
                      final=lambda: {"job": job, "done": JOBS[job]}, meta={"yuzu.execution_id": str(job)})


@tool(name="handover_job", title="Handover job", securable="Infrastructure", operation="Read",
      catalogue="handovertest", progress=True, description="Test tool: a job of 3 steps the test advances by hand.",
      input_schema=obj({"n": integer(0, 10)}), output_schema=obj({"job": integer(), "done": integer()}))
def handover_job(ctx, args):
    job = len(JOBS) + 1
    JOBS[job] = 0
    ctx.follow_spec(_follow_job({"job": job}))
    return {"job": job, "done": 0}


configure("handovertest", audiences=("api",))


class HandoverConsumer(McpConsumer):
    catalogue = "handovertest"


from channels.routing import URLRouter  # noqa: E402

APP = URLRouter([path("mcp/handover/", HandoverConsumer.as_asgi())])
BODY = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                   "params": {"name": "handover_job", "arguments": {}, "_meta": {"progressToken": "h"}}}).encode()


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(watch, "TICK_SECONDS", 0.2)
    monkeypatch.setattr(handover, "LEASE_SECONDS", 0.5)
    JOBS.clear()
    rings().clear()
    yield
    rings().clear()


@pytest.fixture
def client(mint):
    c = McpClient(mint("alice", role="Operator", tier="operator"), path="/mcp/handover/")
    saved, mcp_http.application = mcp_http.application, APP
    try:
        c.initialize()
    finally:
        mcp_http.application = saved
    return c


def _key(c):
    user = get_user_model().objects.get(username="alice")
    return ring_key(Principal(user=user, token=ApiToken.objects.filter(owner=user).first()).key, c.sid)


def _open(c, method, body=b"", **extra):
    headers = {"host": "127.0.0.1:8000", "accept": "application/json, text/event-stream", **c.headers(), **extra}
    if body:
        headers["content-type"] = "application/json"
    return Stream(APP, method, "/mcp/handover/", headers, body)


def _progress(events):
    return [e["json"]["params"]["progress"] for e in events if e.get("json", {}).get("method") == "notifications/progress"]


async def _advance(job):
    JOBS[job] += 1
    await get_channel_layer().group_send(f"handover.{job}", {"type": "job.changed"})


def _kill_follower(key):
    """What a SIGKILL leaves: the follower stops reporting, its lease is never given back (it runs out), its
    record stays."""
    f = admission.follower_of(key, 5)
    assert f is not None and f.lease_owner is not None and handovers().record_of(key, "post:5") is not None
    f.lease_owner = None  # no renewal, no release, no forgetting the record: it just stops
    f.detach("cancelled")


def test_a_dead_followers_call_is_adopted_by_the_resuming_get_and_delivers_its_result(client):
    key = _key(client)

    async def go():
        s = await _open(client, "POST", BODY).open()
        events = await s.read_until(lambda ev: _progress(ev) == [0])
        await _advance(1)
        events = await s.read_until(lambda ev: _progress(ev)[-1:] == [1])
        seen = max(int(e["id"]) for e in events if e.get("id"))
        _kill_follower(key)
        await s.disconnect()
        await _advance(1)  # work moves on while nobody follows it
        await _advance(1)
        assert handovers().record_of(key, "post:5") is not None
        g = await _open(client, "GET", **{"accept": "text/event-stream", "last-event-id": str(seen)}).open()
        assert g.status == 200
        got = await g.read_until(lambda ev: any("result" in e.get("json", {}) for e in ev), timeout=10)
        frames = [e["json"] for e in got if e.get("json")]
        assert _progress(got) == [3]  # above what the dead stream carried, never 0 or 1 again
        result = [f for f in frames if f.get("id") == 5]
        assert len(result) == 1 and result[0]["result"]["structuredContent"] == {"job": 1, "done": 3}
        assert all(int(e["id"]) > seen for e in got if e.get("json"))
        await g.disconnect()
        # settled: nothing left to adopt. The adopter forgets the record after it has written the result (a
        # crash in between must leave it adoptable), so the forgetting may land just after the frame is read.
        for _ in range(50):
            if handovers().record_of(key, "post:5") is None:
                break
            await asyncio.sleep(0.05)
        assert handovers().record_of(key, "post:5") is None
    async_to_sync(go)()


def test_a_live_follower_is_not_adopted_and_one_that_lost_its_lease_stops_handed_over(client, monkeypatch):
    key = _key(client)
    monkeypatch.setattr(handover, "LEASE_SECONDS", 30.0)  # the adopter's lease outlives the follower's next renewal

    async def go():
        s = await _open(client, "POST", BODY).open()
        await s.read_until(lambda ev: _progress(ev) == [0])
        assert await follower.adopt(key, "post:5", "u0.t0") is False  # its follower renews the lease
        handovers().release(key, "post:5", admission.follower_of(key, 5).lease_owner)
        handovers().claim(key, "post:5", "a-process-that-adopted-it")  # as if this one had stalled past its lease
        await _advance(1)
        events = await s.read_until(lambda ev: s.finished, timeout=10)
        closed = [e["json"]["params"] for e in events if e.get("json", {}).get("method") == "notifications/yuzu.stream_closed"]
        assert closed and closed[0]["reason"] == "handed_over", events
        assert not any("result" in e.get("json", {}) for e in events)  # the adopter reports it, not both
        assert handovers().record_of(key, "post:5") is not None  # still the adopter's to settle
    async_to_sync(go)()


RECORD = {"recipe": "test.handover_job", "args": {"job": 1}, "request_id": 5, "token": "h", "deadline": 0.0}


@pytest.mark.skipif(not __import__("os").environ.get("YUZU_REDIS_URL"), reason="needs YUZU_REDIS_URL (CI sets it)")
def test_a_follow_record_lives_as_long_as_its_sessions_redis_ring(monkeypatch):
    """A follow's record is what lets a resume adopt a call whose process died — up to its result, which the adopter
    writes even past the 120 s cap (one last look at the work). It was written once with RING_TTL (35 min) and never
    renewed, while the ring holding the call's frames now lives as long as its session is used: a resume of such a
    call after 35 minutes found its frames but no record, and waited for a result no process would write. The record
    is now a field of the ring (its ``:follows`` part): slid by the same session check, dropped with the ring. Here
    with RING_TTL 2 s on real Redis."""
    import secrets
    import time

    from django.conf import settings

    from mcp.streaming import ring as replay
    from mcp.streaming import sessions as session_store

    for module in (replay, session_store, handover):
        monkeypatch.setattr(module, "RING_TTL", 2)
    monkeypatch.setattr(session_store, "RING_SLIDE", 0.5)
    sessions, ring = session_store.RedisSessionStore(settings.REDIS_URL), replay.RedisRing(settings.REDIS_URL)
    follows = handover.RedisHandover(settings.REDIS_URL)
    principal = "u1.t" + secrets.token_hex(4)
    s = sessions.create(principal, "v1", "2025-11-25")
    key = ring_key(principal, s.id)
    ring.append(key, {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}, "post:5")
    follows.record(key, "post:5", RECORD)
    follows.record(key, "post:6", {**RECORD, "request_id": 6})
    follows.forget(key, "post:6")  # settled
    deadline = time.monotonic() + 4.5  # over twice RING_TTL, the session used all along, nothing written
    while time.monotonic() < deadline:
        pending = sessions.begin_validate(s.id, principal)  # the path every MCP call takes (mcp.server)
        assert pending.result() is not None
        pending.close()
        time.sleep(0.4)
    assert follows.record_of(key, "post:5") == RECORD and follows.record_of(key, "post:6") is None
    assert ring.read(key, 0, "post:5")[0]  # the frames it goes with
    time.sleep(3.2)  # unused for longer than its TTL: gone with the ring
    assert follows.record_of(key, "post:5") is None and ring.read(key, 1)[1] is True
    follows.record(key, "post:5", RECORD)
    ring.drop(key)  # the session's DELETE (close_session_streams)
    assert follows.record_of(key, "post:5") is None
    sessions.delete(s.id, principal)


def test_an_embedded_follow_record_lives_as_long_as_its_session(monkeypatch):
    """In process memory the record expired RING_TTL after it was written whatever its session did, and otherwise
    stayed until the next record pruned it: now it lives exactly as long as its session, like the ring."""
    import time

    from mcp.streaming import ring as replay
    from mcp.streaming import sessions as session_store

    ring, follows = replay.MemoryRing(), handover.MemoryHandover()
    monkeypatch.setattr(replay, "rings", lambda: ring)
    monkeypatch.setattr(handover, "handovers", lambda: follows)
    monkeypatch.setattr(handover, "RING_TTL", 0.3)
    sessions, p = session_store.MemorySessionStore(), "u1.tfollow"
    live, ended = sessions.create(p, "v1", "2025-11-25"), sessions.create(p, "v1", "2025-11-25")
    for s in (live, ended):
        follows.record(ring_key(p, s.id), "post:5", RECORD)
    time.sleep(0.4)  # past the old RING_TTL, the session live
    assert follows.record_of(ring_key(p, live.id), "post:5") == RECORD
    sessions.delete(ended.id, p, by_client=True)
    assert follows.record_of(ring_key(p, ended.id), "post:5") is None
    assert list(follows._records) == [ring_key(p, live.id)]  # nothing kept of the ended session
