"""The GET SSE channel and streamed POST, in-process: ring replay and Last-Event-ID resume, gaps,
takeover, admission caps, heartbeats, credential re-validation, close frames, and progress reporting
(0/N, strictly increasing, the result last; cancellation detaches without cancelling)."""

import asyncio
import json
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.urls import path

from mcp.registry import configure, tool
from mcp.schema import integer, obj
from mcp.streaming import admission, wake, watch
from mcp.streaming import ring as replay
from mcp.streaming.ring import ring_key, rings
from mcp.transport import McpConsumer
from tests.support.mcp_http import McpClient
from tests.support.sse_client import Stream, parse_events

pytestmark = pytest.mark.django_db(transaction=True)

# --- a progress-reporting tool in a test-only catalogue (the fleet's execute_instruction is exercised
# end to end elsewhere); its "work" is a counter the test advances.
WORK = {}


@tool(name="slow_job", title="Slow job", securable="Infrastructure", operation="Read", catalogue="streamtest",
      progress=True, description="Test tool: starts a job of `total` steps the test advances by hand.",
      input_schema=obj({"total": integer(1, 100)}, ["total"]), output_schema=obj({"job": integer(), "done": integer()}))
def slow_job(ctx, args):
    job = len(WORK) + 1
    WORK[job] = {"done": 0, "total": args["total"]}
    ctx.follow(f"job.{job}", snapshot=lambda: (WORK[job]["done"], WORK[job]["total"],
                                               WORK[job]["done"] >= WORK[job]["total"]),
               final=lambda: {"job": job, "done": WORK[job]["done"]}, meta={"yuzu.execution_id": str(job)})
    return {"job": job, "done": 0}


WAITS = {}


@tool(name="blocking_wait", title="Blocking wait", securable="Infrastructure", operation="Read", catalogue="streamtest",
      description="Test tool: an async call that blocks (as the bridge's waits do) until the test lets it go.",
      input_schema=obj({}), output_schema=obj({"waited": integer()}))
async def blocking_wait(ctx, args):
    WAITS["started"] = True
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        WAITS["cancelled"] = True
        raise
    return {"waited": 30}


configure("streamtest", audiences=("api",))


class StreamTestConsumer(McpConsumer):
    catalogue = "streamtest"


from channels.routing import URLRouter  # noqa: E402

from yuzu.asgi import application as real_app  # noqa: E402

APP = URLRouter([path("mcp/test/", StreamTestConsumer.as_asgi())])


async def advance(job, steps=1):
    WORK[job]["done"] += steps
    await get_channel_layer().group_send(f"job.{job}", {"type": "job.changed"})


@pytest.fixture(autouse=True)
def fresh_state():
    rings().clear()
    WORK.clear()
    WAITS.clear()
    yield
    rings().clear()


@pytest.fixture
def session(mint):
    c = McpClient(mint("alice", role="Operator", tier="operator"))
    c.initialize()
    return c


def get(client, app=real_app, path="/mcp/v1/", **extra):
    headers = {"host": "127.0.0.1:8000", "accept": "text/event-stream", **client.headers(), **extra}
    return Stream(app, "GET", path, headers)


def run(coro_fn):
    return async_to_sync(coro_fn)()


def ids(events):
    return [int(e["id"]) for e in events if e.get("id") and e.get("data")]


def key_of(client):
    from django.contrib.auth import get_user_model

    from yuzu.models import ApiToken
    from yuzu.rbac import Principal

    user = get_user_model().objects.get(username="alice")
    return ring_key(Principal(user=user, token=ApiToken.objects.filter(owner=user).first()).key, client.sid)


def test_get_needs_sse_accept_and_a_session(session):
    async def go():
        s = await get(session, accept="application/json").open()
        assert s.status == 406
        bare = McpClient(session.token)
        s = await Stream(real_app, "GET", "/mcp/v1/", {"host": "127.0.0.1:8000", "accept": "text/event-stream",
                                                       **bare.headers()}).open()
        assert s.status == 400
        s = await get(session, **{"mcp-session-id": "0" * 32}).open()
        assert s.status == 404
    run(go)


def test_frames_replay_resume_and_priming(session):
    key = key_of(session)
    for n in range(3):
        rings().append(key, {"jsonrpc": "2.0", "method": "notifications/message", "params": {"n": n}})

    async def go():
        s = await get(session).open()
        assert s.status == 200 and s.headers["content-type"] == "text/event-stream"
        assert s.headers["x-accel-buffering"] == "no" and s.headers["cache-control"] == "no-cache"
        events = await s.read_until(lambda ev: len(ids(ev)) == 3)
        assert events[0] == {"id": "0", "data": ""}  # priming event on 2025-11-25
        assert ids(events) == [1, 2, 3] and all(e["event"] == "message" for e in events if e.get("data"))
        await get_channel_layer().group_send(wake.wake_group(key), {"type": "mcp.wake"})
        rings().append(key, {"jsonrpc": "2.0", "method": "notifications/message", "params": {"n": 3}})
        await wake.awake(key)
        events = await s.read_until(lambda ev: 4 in ids(ev))
        assert ids(events) == [1, 2, 3, 4]
        await s.disconnect()
        # Resume after id 2: exactly what followed.
        r = await get(session, **{"last-event-id": "2"}).open()
        events = await r.read_until(lambda ev: len(ids(ev)) == 2)
        assert ids(events) == [3, 4]
        await r.disconnect()
    run(go)


def test_no_priming_for_2025_06_18(mint):
    c = McpClient(mint("bob", role="Operator", tier="operator"), version="2025-06-18")
    c.initialize()

    async def go():
        s = await get(c).open()
        with pytest.raises(AssertionError, match="timed out"):
            await s.read_until(lambda ev: False, timeout=0.5)
        assert s.buffer == ""  # no priming event for a 2025-06-18 client
        await s.disconnect()
    run(go)


def test_gap_terminates_the_session(session):
    key = key_of(session)
    for n in range(600):  # more than the ring keeps
        rings().append(key, {"jsonrpc": "2.0", "method": "notifications/message", "params": {"n": n}})

    async def go():
        s = await get(session, **{"last-event-id": "5"}).open()
        assert s.status == 404
        await s.read_body()
        body = json.loads(s.buffer)
        assert body["error"]["code"] == -32007 and body["error"]["message"] == "Replay window exceeded"
    run(go)
    assert session.rpc("ping").status == 404  # the session was terminated, not silently shortened
    session2 = McpClient(session.token)
    session2.initialize()

    async def future_cursor():
        s = await get(session2, **{"last-event-id": "99"}).open()  # never issued
        assert s.status == 404
    run(future_cursor)


@pytest.mark.parametrize("endpoint", ["/mcp/v1/", "/mcp/bridge/"])
def test_a_cursor_that_is_no_event_id_is_refused_and_changes_nothing(mint, endpoint):
    """A Last-Event-ID this server cannot have sent — not decimal digits — is a 400 before anything happens: never
    a replay from the start (the client would take it for the rest of its stream), never the end of the session (a
    never-issued *number* is the gap: 404, the session ended, above)."""
    c = McpClient(mint("alice", role="Operator", tier="operator"), path=endpoint)
    c.initialize()
    key = key_of(c)
    for n in range(3):
        rings().append(key, {"jsonrpc": "2.0", "method": "notifications/message", "params": {"n": n}})

    async def go():
        for cursor in ("garbage", "-1", "+2", "2 3", "1_0", "0x2", "\u0662", "9" * 40):
            s = await get(c, path=endpoint, **{"last-event-id": cursor}).open()
            assert s.status == 400, cursor
            await s.read_body()
            error = json.loads(s.buffer)["error"]
            assert error["code"] == -32600 and "Last-Event-ID" in error["message"], cursor
        r = await get(c, path=endpoint, **{"last-event-id": "2"}).open()  # the session and its ring are intact
        assert ids(await r.read_until(lambda ev: len(ids(ev)) == 1)) == [3]
        await r.disconnect()
    run(go)
    assert c.rpc("ping").status == 200


def test_takeover_and_handover(session):
    async def go():
        first = await get(session).open()
        second = await get(session).open()
        assert second.status == 200
        events = await first.read_until(lambda ev: any(e.get("json", {}).get("method") == "notifications/yuzu.stream_closed"
                                                        for e in ev))
        closed = [e["json"] for e in events if e.get("json", {}).get("method") == "notifications/yuzu.stream_closed"]
        assert closed[0]["params"]["reason"] == "superseded" and "id" not in events[-1]
        await first.read_until(lambda ev: False, timeout=2) if not first.finished else None
        assert first.finished
        await second.disconnect()
    run(go)


def test_per_principal_stream_cap(mint):
    token = mint("carol", role="Operator", tier="operator")
    clients = []
    for _ in range(5):
        c = McpClient(token)
        c.initialize()
        clients.append(c)

    async def go():
        opened = [await get(c).open() for c in clients[:4]]
        assert all(s.status == 200 for s in opened)
        refused = await get(clients[4]).open()
        await refused.read_body()
        assert refused.status == 429 and json.loads(refused.buffer)["error"]["code"] == -32012
        assert refused.headers["retry-after"] == "5"
        await opened[0].disconnect()
        await asyncio.sleep(0.1)
        again = await get(clients[4]).open()
        assert again.status == 200
        for s in opened[1:] + [again]:
            await s.disconnect()
    run(go)


def test_per_user_stream_cap(mint, monkeypatch):
    """A user's GET streams over all their tokens stop at GET_PER_USER, whatever each token's own 4: another token
    of theirs gets a 429; another user's stream is admitted; a closed stream gives its place back."""
    monkeypatch.setattr(admission, "GET_PER_USER", 5, raising=False)
    clients = []
    for token in (mint("carol", role="Operator", tier="operator"), mint("carol", tier="operator")):
        for _ in range(3):
            c = McpClient(token)
            c.initialize()
            clients.append(c)
    dave = McpClient(mint("dave", role="Operator", tier="operator"))
    dave.initialize()

    async def go():
        opened = [await get(c).open() for c in clients[:5]]  # 3 of the first token's, 2 of the second's
        assert all(s.status == 200 for s in opened)
        refused = await get(clients[5]).open()  # the second token's third: its own 3 of 4, carol's 6 of 5
        await refused.read_body()
        err = json.loads(refused.buffer)["error"]
        assert refused.status == 429 and err["code"] == -32012 and "per_user_cap" in err["message"]
        other = await get(dave).open()
        assert other.status == 200
        await opened[0].disconnect()
        await asyncio.sleep(0.1)
        again = await get(clients[5]).open()
        assert again.status == 200
        for s in opened[1:] + [again, other]:
            await s.disconnect()
        await asyncio.sleep(0.1)
        assert not admission.get_budget.per_user and not admission.get_budget.total
    run(go)


def test_heartbeat_revocation_and_delete(session, monkeypatch):
    monkeypatch.setattr(watch, "TICK_SECONDS", 0.2)

    async def go():
        s = await get(session).open()
        await s.read_until(lambda ev: any(e.get("comment") == "heartbeat" for e in ev), timeout=3)
        from channels.db import database_sync_to_async
        from django.utils import timezone

        from yuzu.models import ApiToken

        await database_sync_to_async(lambda: ApiToken.objects.filter(owner__username="alice").update(
            revoked_at=timezone.now()))()
        events = await s.read_until(lambda ev: any(e.get("json", {}).get("method") == "notifications/yuzu.stream_closed"
                                                   for e in ev), timeout=3)
        reason = [e["json"]["params"]["reason"] for e in events if e.get("json")][-1]
        assert reason == "credential_revoked"
    run(go)


def test_an_administrators_lock_closes_the_stream_within_a_tick(session, monkeypatch):
    """A lock on the token's owner ends the stream as a revocation does (docs/tokens-and-rbac.md)."""
    monkeypatch.setattr(watch, "TICK_SECONDS", 0.2)

    async def go():
        s = await get(session).open()
        await s.read_until(lambda ev: any(e.get("comment") == "heartbeat" for e in ev), timeout=3)
        from channels.db import database_sync_to_async
        from django.utils import timezone

        from yuzu.accounts import lock_account
        from yuzu.rbac import Principal

        def lock():
            admin = get_user_model().objects.create_superuser("root", "", "pw-root")
            lock_account(Principal(user=admin, via="session"), "alice", timezone.now() + timedelta(minutes=5))

        await database_sync_to_async(lock)()
        events = await s.read_until(lambda ev: any(e.get("json", {}).get("method") == "notifications/yuzu.stream_closed"
                                                   for e in ev), timeout=3)
        reason = [e["json"]["params"]["reason"] for e in events if e.get("json")][-1]
        assert reason == "credential_revoked"
    run(go)


def test_delete_closes_the_stream(session):
    async def go():
        s = await get(session).open()
        await asyncio.sleep(0.1)
        from channels.db import database_sync_to_async

        from tests.support.mcp_http import request

        r = await database_sync_to_async(request)("DELETE", headers=session.headers())
        assert r.status == 200
        events = await s.read_until(lambda ev: s.finished, timeout=3)
        assert s.finished and not any(e.get("json") for e in events)  # the client's own DELETE: EOF, no close frame
    run(go)


@override_settings(YUZU_MCP_NO_STREAMING=True)
def test_no_streaming_kill_switch_get_is_405(session):
    async def go():
        s = await get(session).open()
        assert s.status == 405
    run(go)


# --- streamed POST and progress reporting ----------------------------------------------------

def call_body(rid, total, token="tok-1"):
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                       "params": {"name": "slow_job", "arguments": {"total": total},
                                  "_meta": {"progressToken": token}}}).encode()


def post(client, body, accept="application/json, text/event-stream"):
    headers = {"host": "127.0.0.1:8000", "content-type": "application/json", "accept": accept, **client.headers()}
    return Stream(APP, "POST", "/mcp/test/", headers, body)


@pytest.fixture
def test_session(mint):
    c = McpClient(mint("alice", role="Operator", tier="operator"), path="/mcp/test/")
    from tests.support import mcp_http

    mcp_http_app = mcp_http.application
    mcp_http.application = APP
    try:
        c.initialize()
    finally:
        mcp_http.application = mcp_http_app
    return c


def progress_of(events):
    return [e["json"]["params"]["progress"] for e in events
            if e.get("json", {}).get("method") == "notifications/progress"]


def test_streamed_post_progress_then_result(test_session):
    async def go():
        s = await post(test_session, call_body(1, 3)).open()
        assert s.status == 200 and s.headers["content-type"] == "text/event-stream"
        await s.read_until(lambda ev: progress_of(ev) == [0])
        await advance(1)
        await advance(1)
        await s.read_until(lambda ev: progress_of(ev)[-1:] == [2])
        await advance(1, 0)  # a non-advancing snapshot is suppressed
        await advance(1)
        events = await s.read_until(lambda ev: s.finished, timeout=5)
        frames = [e["json"] for e in events if e.get("json")]
        prog = progress_of(events)
        assert prog[0] == 0 and prog == sorted(set(prog)) and prog[-1] == 3
        assert frames[-1]["id"] == 1 and frames[-1]["result"]["structuredContent"] == {"job": 1, "done": 3}
        meta = frames[0]["params"]["_meta"]
        assert meta == {"yuzu.execution_id": "1"} and frames[0]["params"]["total"] == 3
        assert all(e.get("id") for e in events if e.get("json"))  # committed to the ring, resumable
    run(go)


def test_token_without_sse_accept_gets_json_and_progress_on_get(test_session):
    async def go():
        g = await get(test_session, app=APP, path="/mcp/test/").open()
        s = await post(test_session, call_body(2, 2), accept="application/json").open()
        await s.read_until(lambda ev: s.finished)
        assert s.headers["content-type"] == "application/json"
        assert json.loads(s.buffer)["result"]["structuredContent"] == {"job": 1, "done": 0}
        await g.read_until(lambda ev: progress_of(ev) == [0])
        await advance(1)
        await advance(1)
        events = await g.read_until(lambda ev: progress_of(ev)[-1:] == [2])
        prog = progress_of(events)
        assert prog[0] == 0 and prog == sorted(set(prog))  # strictly increasing; latest-wins may skip
        assert not any("result" in e.get("json", {}) for e in events)  # no final on the GET channel
        await g.disconnect()
    run(go)


def test_sse_accept_without_token_is_plain_json(test_session):
    body = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                       "params": {"name": "slow_job", "arguments": {"total": 2}}}).encode()

    async def go():
        s = await post(test_session, body).open()
        assert s.headers["content-type"] == "application/json"
        assert json.loads(await s.read_body())["result"]["structuredContent"] == {"job": 1, "done": 0}
    run(go)


def test_duplicate_in_flight_request_id_is_409_and_cancel_detaches(test_session):
    async def go():
        s = await post(test_session, call_body(7, 5)).open()
        await s.read_until(lambda ev: progress_of(ev) == [0])
        dup = await post(test_session, call_body(7, 5)).open()
        await dup.read_until(lambda ev: dup.finished)
        assert dup.status == 409 and json.loads(dup.buffer)["error"]["code"] == -32600
        cancel = json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}).encode()
        c = await post(test_session, cancel).open()
        assert c.status == 202
        events = await s.read_until(lambda ev: s.finished, timeout=5)
        closed = [e["json"]["params"] for e in events if e.get("json", {}).get("method") == "notifications/yuzu.stream_closed"]
        assert closed and closed[0]["reason"] == "cancelled" and closed[0]["execution_id"] == "1"
        assert not any("result" in e.get("json", {}) for e in events)
        assert WORK[1]["done"] == 0  # the work itself was not touched
    run(go)


def test_streamed_post_closes_when_its_token_is_revoked(test_session, monkeypatch):
    monkeypatch.setattr(watch, "TICK_SECONDS", 0.2)

    async def go():
        from channels.db import database_sync_to_async
        from django.utils import timezone

        from yuzu.models import ApiToken

        s = await post(test_session, call_body(1, 3)).open()
        await s.read_until(lambda ev: progress_of(ev) == [0])
        await database_sync_to_async(lambda: ApiToken.objects.filter(owner__username="alice").update(
            revoked_at=timezone.now()))()
        events = await s.read_until(lambda ev: s.finished, timeout=5)
        closed = [e["json"]["params"] for e in events
                  if e.get("json", {}).get("method") == "notifications/yuzu.stream_closed"]
        assert closed and closed[0]["reason"] == "credential_revoked", events
        assert closed[0]["execution_id"] == "1" and closed[0]["partial"] is True
        assert closed[0]["remediation"] == "re-authenticate"
        await advance(1, 3)  # the work itself goes on; nothing more is reported for the revoked token
        await asyncio.sleep(0.3)
        assert not any("result" in e.get("json", {}) for e in parse_events(s.buffer))
        assert progress_of(parse_events(s.buffer)) == [0]
    run(go)


def test_streamed_post_admission_caps(test_session, monkeypatch):
    monkeypatch.setattr(admission, "POST_PER_PRINCIPAL", 1)

    async def go():
        s = await post(test_session, call_body(1, 5)).open()
        await s.read_until(lambda ev: progress_of(ev) == [0])
        refused = await post(test_session, call_body(2, 5)).open()
        await refused.read_until(lambda ev: refused.finished)
        assert refused.status == 429 and refused.headers["retry-after"] == "30"
        err = json.loads(refused.buffer)["error"]
        assert err["code"] == -32012 and err["data"]["retry_after_ms"] == 30000
        assert len(WORK) == 1  # refused before any work existed
        await advance(1, 5)
        await s.read_until(lambda ev: s.finished)
    run(go)


def test_one_token_cannot_take_every_progress_record(test_session, mint, monkeypatch):
    """The process's progress records are shared by every token: one token's calls reporting to its GET channel
    stop at its own share (they answer without progress, as at the process's cap), so another token's streamed
    call is still admitted."""
    monkeypatch.setattr(admission, "RECORD_CAP", 3)
    monkeypatch.setattr(admission, "RECORD_PER_PRINCIPAL", 2, raising=False)
    from tests.support import mcp_http

    bob = McpClient(mint("bob", role="Operator", tier="operator"), path="/mcp/test/")
    monkeypatch.setattr(mcp_http, "application", APP)
    bob.initialize()
    alice = key_of(test_session)

    async def go():
        for rid in (11, 12, 13):  # alice: progress to her GET channel, never finishing
            s = await post(test_session, call_body(rid, 5), accept="application/json").open()
            await s.read_until(lambda ev, s=s: s.finished)
            assert s.status == 200
        assert sum(1 for k, _ in admission._records if k == alice) == 2
        s = await post(bob, call_body(1, 1)).open()
        await s.read_until(lambda ev: progress_of(ev) == [0] or s.finished, timeout=5)
        assert s.status == 200 and s.headers["content-type"] == "text/event-stream", s.buffer
        for job in list(WORK):  # the followers settle
            await advance(job, WORK[job]["total"])
        await s.read_until(lambda ev: s.finished, timeout=5)
        await asyncio.sleep(0.3)
        assert not admission._records
    run(go)


def test_one_user_cannot_spread_streamed_calls_over_tokens(test_session, mint, monkeypatch):
    """The streamed POST slots and progress records a user holds over all their tokens stop at their user's share
    (POST_PER_USER, RECORD_PER_USER), whatever each token's own: another token of theirs is refused (429 -32012)
    before any work exists, another user's call is admitted, and every slot comes back when the calls end."""
    from tests.support import mcp_http

    monkeypatch.setattr(admission, "POST_PER_USER", 2, raising=False)
    monkeypatch.setattr(mcp_http, "application", APP)
    second = McpClient(mint("alice", tier="operator"), path="/mcp/test/")
    second.initialize()
    bob = McpClient(mint("bob", role="Operator", tier="operator"), path="/mcp/test/")
    bob.initialize()

    async def refused(client, rid, reason):
        r = await post(client, call_body(rid, 5)).open()
        await r.read_until(lambda ev: r.finished, timeout=5)
        err = json.loads(r.buffer)["error"]
        assert r.status == 429 and err["code"] == -32012 and reason in err["message"], r.buffer
        assert r.headers["retry-after"] == "30"

    async def go():
        held = []
        for client, rid in ((test_session, 1), (second, 2)):  # one held by each of alice's tokens
            s = await post(client, call_body(rid, 5)).open()
            await s.read_until(lambda ev, s=s: progress_of(ev) == [0])
            held.append(s)
        await refused(second, 3, "post_per_user_cap")
        assert len(WORK) == 2  # refused before any work existed
        monkeypatch.setattr(admission, "POST_PER_USER", 16, raising=False)
        monkeypatch.setattr(admission, "RECORD_PER_USER", 2, raising=False)
        await refused(second, 4, "post_record_per_user_cap")
        s = await post(bob, call_body(5, 1)).open()
        await s.read_until(lambda ev: progress_of(ev) == [0] or s.finished, timeout=5)
        assert s.status == 200 and s.headers["content-type"] == "text/event-stream", s.buffer
        held.append(s)
        for job in list(WORK):
            await advance(job, WORK[job]["total"])
        for s in held:
            await s.read_until(lambda ev, s=s: s.finished, timeout=5)
        await asyncio.sleep(0.3)
        assert not admission._records and not admission._held_by_user and not admission._held
        assert not admission.post_budget.per_user and not admission.post_budget.total
    run(go)


def test_a_huge_request_id_is_refused_before_it_reaches_the_ring(test_session):
    """A streamed call's request id travels with every frame of it — the stream tag beside each ring frame (which
    the ring's 64 KiB bound does not count), the result frame however much it is truncated, the follow record and
    its lease's key: a request id of megabytes multiplied the session's bound in the store many times over. Ids are
    bounded (512 bytes, as progress tokens are) and a longer one is refused before anything runs."""
    body = json.dumps({"jsonrpc": "2.0", "id": "x" * 100_000, "method": "tools/call",
                       "params": {"name": "slow_job", "arguments": {"total": 1},
                                  "_meta": {"progressToken": "tok-1"}}}).encode()

    async def go():
        s = await post(test_session, body).open()
        await s.read_until(lambda ev: s.finished, timeout=5)
        assert s.status == 400, s.buffer[:200]
        err = json.loads(s.buffer)["error"]
        assert err["code"] == -32600 and "512" in err["message"]
        assert not WORK and not admission._records
    run(go)
    assert rings().read(key_of(test_session), 0)[0] == []


def test_a_refused_streamed_call_gives_its_admission_back(test_session, monkeypatch):
    """A streamed call is admitted (a POST slot, a progress record) before the pipeline runs; one the pipeline then
    refuses (here its arguments) answers an error — and must give both back, or a few refused calls lock the token
    out of streamed calls for good and every refusal keeps one of the process's records."""
    monkeypatch.setattr(admission, "POST_PER_PRINCIPAL", 1)

    async def go():
        for rid in (1, 2, 3):
            s = await post(test_session, call_body(rid, 0)).open()  # total 0: below the schema's minimum
            await s.read_until(lambda ev, s=s: s.finished, timeout=5)
            assert json.loads(s.buffer)["error"]["code"] == -32602
        assert not admission._records and not admission.post_budget.per_principal
        s = await post(test_session, call_body(4, 1)).open()
        await s.read_until(lambda ev: progress_of(ev) == [0] or s.finished, timeout=5)
        assert s.status == 200 and s.headers["content-type"] == "text/event-stream", s.buffer
        await advance(1)
        await s.read_until(lambda ev: s.finished, timeout=5)
    run(go)


@pytest.mark.parametrize("era", ["handshake", "modern"])
def test_a_blocking_call_is_cut_off_when_its_token_is_revoked(test_session, monkeypatch, era):
    """An async tool holds its request open (the bridge's waits: up to an hour). A token revoked meanwhile ends it
    within a tick, as it ends a stream: the wait is cancelled and the answer is -32001 — the reply it waited for is
    never handed to the revoked token."""
    monkeypatch.setattr(watch, "TICK_SECONDS", 0.2)
    call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "blocking_wait", "arguments": {}}}
    headers = {"host": "127.0.0.1:8000", "content-type": "application/json", "accept": "application/json",
               **test_session.headers()}
    if era == "modern":
        headers = {"host": "127.0.0.1:8000", "content-type": "application/json", "accept": "application/json",
                   "authorization": f"Bearer {test_session.token}", "mcp-protocol-version": "2026-07-28",
                   "mcp-method": "tools/call", "mcp-name": "blocking_wait"}
        call["params"]["_meta"] = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                   "io.modelcontextprotocol/clientCapabilities": {}}
    s = Stream(APP, "POST", "/mcp/test/", headers, json.dumps(call).encode())

    async def go():
        from channels.db import database_sync_to_async
        from django.utils import timezone

        from yuzu.models import ApiToken

        await s.comm.send_input({"type": "http.request", "body": s.body, "more_body": False})
        for _ in range(100):
            if WAITS.get("started"):
                break
            await asyncio.sleep(0.05)
        assert WAITS.get("started")
        await database_sync_to_async(lambda: ApiToken.objects.filter(owner__username="alice").update(
            revoked_at=timezone.now()))()
        start = await s.comm.receive_output(5)
        body = await s.comm.receive_output(5)
        assert start["status"] == 401, body
        err = json.loads(body["body"])["error"]
        assert err["code"] == -32001 and json.loads(body["body"])["id"] == 9
        assert WAITS.get("cancelled")
    run(go)
    from yuzu.models import AuditEvent

    row = AuditEvent.objects.get(action="mcp.blocking_wait")
    assert row.result == "cancelled" and row.detail.startswith("credential_revoked")


def test_ring_bounds_and_pins():
    ring = replay.MemoryRing()
    pinned = ring.append("k", {"jsonrpc": "2.0", "id": 1, "result": {}}, "post:1", pin=True)
    for n in range(700):
        ring.append("k", {"jsonrpc": "2.0", "method": "m", "params": {"n": n}})
    frames, gap = ring.read("k", 0)
    assert not gap and len(frames) <= replay.RING_FRAMES + 1
    assert frames[0][0] == pinned  # a pinned final survives eviction
    assert sum(len(d) for _, _, d in frames) <= replay.RING_BYTES + 200
    big = ring.append("k", {"jsonrpc": "2.0", "method": "m", "params": {"blob": "x" * 100000}})
    data = {e: d for e, _, d in ring.read("k", big - 1)[0]}[big]
    assert len(data) < replay.FRAME_CAP and json.loads(data)["params"]["truncated"] is True
    assert ring.read("k", 10)[1] is True  # evicted cursor → gap
    assert ring.read("k", 10**6)[1] is True  # never issued → gap


def test_embedded_rings_end_with_their_sessions(monkeypatch):
    """Embedded mode keeps the replay rings in process memory, where nothing expires them: a session that expired
    left its ring behind for the life of the process (and a late unpin, read or pin count re-made a dropped ring).
    Now the memory session store drops a session's ring when it ends — DELETE, or the expiry sweep its own calls
    already run — and a live session's ring survives that sweep."""
    import time

    from mcp.streaming import sessions as session_store

    ring = replay.MemoryRing()
    monkeypatch.setattr(replay, "rings", lambda: ring)  # what the embedded store drops from
    monkeypatch.setattr(session_store, "IDLE_TTL", 0.4)
    sessions, p = session_store.MemorySessionStore(), "u1.tring"
    gone, idle, busy = (sessions.create(p, "v1", "2025-11-25") for _ in range(3))
    key = {s.id: ring_key(p, s.id) for s in (gone, idle, busy)}
    for s in (gone, idle, busy):
        ring.append(key[s.id], {"jsonrpc": "2.0", "method": "m"}, "post:1", pin=True)
    assert sessions.delete(gone.id, p, by_client=True)
    assert key[gone.id] not in ring._rings
    ring.unpin(key[gone.id], 1), ring.pinned(key[gone.id]), ring.read(key[gone.id], 1), ring.stream_of(key[gone.id], 1)
    assert key[gone.id] not in ring._rings  # what still runs for it (a follower's unpin, a tick) makes no ring again
    time.sleep(0.25)
    assert sessions.validate(busy.id, p) is not None  # used: its idle expiry slides, its ring's with it
    sessions.active()  # a sweep (also on every initialize): nothing has expired yet
    assert key[idle.id] in ring._rings and key[busy.id] in ring._rings
    time.sleep(0.25)
    fresh = sessions.create(p, "v1", "2025-11-25")  # the sweep on initialize: ``idle`` expired meanwhile
    assert key[idle.id] not in ring._rings and sessions.validate(idle.id, p) is None
    assert ring.read(key[busy.id], 0) == ([(1, "post:1", '{"jsonrpc":"2.0","method":"m"}')], False)
    assert ring.pinned(key[busy.id]) == [1]
    time.sleep(0.45)
    assert sessions.active() == 0 and not ring._rings  # both expired unused: nothing is kept
    assert sessions.validate(fresh.id, p) is None


@pytest.mark.skipif(not __import__("os").environ.get("YUZU_REDIS_URL"), reason="needs YUZU_REDIS_URL (CI sets it)")
def test_redis_ring_matches_memory_ring():
    from django.conf import settings

    ring = replay.RedisRing(settings.REDIS_URL)
    ring.drop("t")
    pinned = ring.append("t", {"jsonrpc": "2.0", "id": 1, "result": {}}, "post:1", pin=True)
    for n in range(600):
        ring.append("t", {"jsonrpc": "2.0", "method": "m", "params": {"n": n}})
    frames, gap = ring.read("t", 0)
    assert not gap and frames[0][0] == pinned and len(frames) <= replay.RING_FRAMES + 1
    assert ring.stream_of("t", pinned) == "post:1"
    assert ring.read("t", 10)[1] is True and ring.read("t", 10**6)[1] is True
    last = frames[-1][0]
    assert [e for e, _, _ in ring.read("t", last - 2)[0]] == [last - 1, last]
    ring.drop("t")





@pytest.mark.skipif(not __import__("os").environ.get("YUZU_REDIS_URL"), reason="needs YUZU_REDIS_URL (CI sets it)")
def test_a_session_in_use_keeps_its_redis_replay_ring(monkeypatch):
    """The Redis ring's expiry was slid only when a frame was appended, the session's on every use: a session kept
    busy past RING_TTL (35 min) with no new stream event lost its replay window — and its event-id counter, so ids
    began again at 1 and an old Last-Event-ID could replay the wrong frames. Now the session check (one script, the
    same round trip) slides the ring's expiry too. Here with RING_TTL 2 s on real Redis."""
    import time

    from django.conf import settings

    from mcp.streaming import sessions as session_store

    monkeypatch.setattr(replay, "RING_TTL", 2)
    monkeypatch.setattr(session_store, "RING_TTL", 2)
    monkeypatch.setattr(session_store, "RING_SLIDE", 0.5)
    sessions, ring = session_store.RedisSessionStore(settings.REDIS_URL), replay.RedisRing(settings.REDIS_URL)
    principal = "u1.t" + __import__("secrets").token_hex(4)
    s = sessions.create(principal, "v1", "2025-11-25")
    key = ring_key(principal, s.id)
    first = ring.append(key, {"jsonrpc": "2.0", "method": "m", "params": {"n": 1}})
    deadline = time.monotonic() + 4.5  # over twice the ring's TTL, used all along, no frame appended
    while time.monotonic() < deadline:
        assert sessions.validate(s.id, principal) is not None
        pending = sessions.begin_validate(s.id, principal)  # the path every MCP call takes (mcp.server)
        assert pending.result() is not None
        pending.close()
        time.sleep(0.4)
    frames, gap = ring.read(key, 0)
    assert not gap and [e for e, _, _ in frames] == [first]
    assert ring.append(key, {"jsonrpc": "2.0", "method": "m"}) == first + 1  # the ids go on, never from 1 again
    sessions.validate(s.id, "u2.tother")  # another principal's check of the id slides nothing
    time.sleep(3.2)  # unused for longer than its TTL: the ring is gone (nothing kept forever)
    assert ring.read(key, first)[1] is True and not sessions.redis.exists(ring._keys(key)[0])
    sessions.delete(s.id, principal)
