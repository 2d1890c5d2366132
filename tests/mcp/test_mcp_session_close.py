"""How a session's streams end (issue 13): the client's own DELETE ends its GET channel and its streamed POSTs
with EOF and no close frame — the client asked, and as it shuts down it has stopped reading, so the official
Python SDK logged "Error parsing SSE message … ClosedResourceError" for the frame on every clean disconnect.
A termination the client did not ask for (here: the session ended server-side) keeps its session_terminated
frame."""

import json
import secrets
import subprocess

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth import get_user_model
from django.urls import path
from prometheus_client import REGISTRY

from mcp.registry import configure, tool
from mcp.schema import integer, obj
from mcp.streaming import watch
from mcp.streaming.sessions import MemorySessionStore, RedisSessionStore, store
from mcp.transport import McpConsumer
from tests.support import mcp_http
from tests.support.mcp_http import McpClient, request
from tests.support.official_client import DRIVE, MCP_PY, client_env
from tests.support.sse_client import Stream
from yuzu.models import ApiToken, AuditEvent
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = {}


@tool(name="held_job", title="Held job", securable="Infrastructure", operation="Read", catalogue="closetest",
      progress=True, description="Test tool: a job of `total` steps that only the test can advance.",
      input_schema=obj({"total": integer(1, 100)}, ["total"]), output_schema=obj({"job": integer()}))
def held_job(ctx, args):
    job = len(JOBS) + 1
    JOBS[job] = 0
    ctx.follow(f"closetest.{job}", snapshot=lambda: (JOBS[job], args["total"], JOBS[job] >= args["total"]),
               final=lambda: {"job": job}, meta={"yuzu.execution_id": str(job)})
    return {"job": job}


configure("closetest", audiences=("api",))


class CloseTestConsumer(McpConsumer):
    catalogue = "closetest"


from channels.routing import URLRouter  # noqa: E402

APP = URLRouter([path("mcp/closetest/", CloseTestConsumer.as_asgi())])


@pytest.fixture
def client(mint):
    c = McpClient(mint("closer", role="Operator", tier="operator"), path="/mcp/closetest/")
    real, mcp_http.application = mcp_http.application, APP
    try:
        c.initialize()
    finally:
        mcp_http.application = real
    JOBS.clear()
    return c


def open_get(client):
    headers = {"host": "127.0.0.1:8000", "accept": "text/event-stream", **client.headers()}
    return Stream(APP, "GET", "/mcp/closetest/", headers)


def open_streamed_call(client, rid=1):
    body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                       "params": {"name": "held_job", "arguments": {"total": 5}, "_meta": {"progressToken": "t"}}})
    headers = {"host": "127.0.0.1:8000", "content-type": "application/json",
               "accept": "application/json, text/event-stream", **client.headers()}
    return Stream(APP, "POST", "/mcp/closetest/", headers, body.encode())


def frames(events):
    return [e["json"] for e in events if e.get("json")]


def closes(events):
    return [f["params"] for f in frames(events) if f.get("method") == "notifications/yuzu.stream_closed"]


def closes_total(reason):
    return REGISTRY.get_sample_value("yuzu_mcp_stream_closes_total", {"reason": reason}) or 0.0


def delete(client):
    real, mcp_http.application = mcp_http.application, APP
    try:
        return request("DELETE", headers=client.headers(), path=client.path)
    finally:
        mcp_http.application = real


def test_own_delete_ends_the_streams_without_a_close_frame(client):
    before = closes_total("session_deleted")

    async def go():
        from channels.db import database_sync_to_async

        g = await open_get(client).open()
        p = await open_streamed_call(client).open()
        await p.read_until(lambda ev: any(f.get("method") == "notifications/progress" for f in frames(ev)))
        await g.read_until(lambda ev: bool(ev))  # the priming event: the GET stream is live
        r = await database_sync_to_async(delete)(client)
        assert r.status == 200
        get_events = await g.read_until(lambda ev: g.finished, timeout=5)
        post_events = await p.read_until(lambda ev: p.finished, timeout=5)
        assert g.finished and p.finished  # both responses ended (EOF)...
        assert closes(get_events) == [] and closes(post_events) == []  # ...with no close frame
        assert not any("result" in f for f in frames(post_events))
        assert JOBS[1] == 0  # ending the response touched no work
    async_to_sync(go)()
    assert closes_total("session_deleted") == before + 2
    assert delete(client).status == 404  # the session is gone


def test_a_termination_the_client_did_not_ask_for_keeps_its_frame(client, monkeypatch):
    """The session ends server-side (as an idle expiry or a resume past the replay window would end it): each
    stream's next tick closes it with session_terminated, saying what to do."""
    monkeypatch.setattr(watch, "TICK_SECONDS", 0.2)
    user = get_user_model().objects.get(username="closer")
    key = Principal(user=user, token=ApiToken.objects.get(owner=user)).key

    async def go():
        g = await open_get(client).open()
        p = await open_streamed_call(client).open()
        await p.read_until(lambda ev: any(f.get("method") == "notifications/progress" for f in frames(ev)))
        assert store().delete(client.sid, key)  # not the client's DELETE
        get_events = await g.read_until(lambda ev: g.finished, timeout=5)
        post_events = await p.read_until(lambda ev: p.finished, timeout=5)
        (get_close,), (post_close,) = closes(get_events), closes(post_events)
        assert get_close["reason"] == "session_terminated" and get_close["remediation"] == "re-initialize"
        assert post_close["reason"] == "session_terminated" and post_close["partial"] is True
        assert post_close["execution_id"] == "1"
    async_to_sync(go)()


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_client_delete_is_told_apart_from_other_endings(backend):
    """The store remembers a DELETE as the client's for a while, so that a stream whose tick finds the session
    gone before the close signal reached it still ends quietly."""
    if backend == "redis" and not settings.REDIS_URL:
        pytest.skip("needs YUZU_REDIS_URL (CI sets it)")
    sessions = MemorySessionStore() if backend == "memory" else RedisSessionStore(settings.REDIS_URL)
    mine, other = f"closer-{secrets.token_hex(4)}", f"other-{secrets.token_hex(4)}"
    a = sessions.create(mine, "v1", "2025-11-25")
    b = sessions.create(mine, "v1", "2025-11-25")
    assert sessions.delete(a.id, mine, by_client=True) and sessions.delete(b.id, mine)
    assert sessions.deleted_by_client(a.id, mine) and not sessions.deleted_by_client(b.id, mine)
    assert not sessions.deleted_by_client(a.id, other)  # another principal learns nothing
    assert not sessions.delete(a.id, mine, by_client=True)  # a second DELETE is a 404


@pytest.mark.live
def test_the_official_python_client_disconnects_cleanly(daphne, mint, tmp_path):
    """mcp 2.3.0 opens the GET stream after initialize and DELETEs the session on exit; its log (WARNING and
    above reach stderr) must not report the frame it could no longer deliver."""
    if not MCP_PY.exists():
        pytest.fail(f"{MCP_PY} is missing: run `make test`")
    server = daphne()
    token = mint("oc-closer", role="Operator", tier="operator")
    steps = json.dumps([{"op": "ping"}, {"op": "call", "tool": "list_agents", "args": {}}])
    for _attempt in range(3):  # the race it used to lose was lost every time; three runs make that certain
        proc = subprocess.run([str(MCP_PY), str(DRIVE), "--url", server.mcp, "--token", token, "--mode", "legacy",
                               "--steps", steps], cwd=tmp_path, env=client_env(), capture_output=True, text=True,
                              timeout=120)
        obs = json.loads(proc.stdout)
        assert "fatal" not in obs and obs["deleted"], obs
        assert "Error parsing SSE message" not in proc.stderr and "ClosedResourceError" not in proc.stderr, \
            proc.stderr[-3000:]
    attached = AuditEvent.objects.filter(principal="oc-closer", action="mcp.stream.attach").count()
    assert attached == 3  # every run had its GET stream open when it DELETEd
    assert AuditEvent.objects.filter(principal="oc-closer", action="mcp.session.close").count() == 3
