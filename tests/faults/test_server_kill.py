"""A server process SIGKILLed with streams and a rendezvous open (issue 22; docs/operations.md "A server process
killed").

Two daphne processes (A and B) on a private Redis and a private PostgreSQL, a Celery worker, the bridge poller,
two real agents (connected to B) and a stand-in bridge worker (its MCP calls go to B). On A, an MCP client holds

- a streamed ``tools/call`` of ``execute_instruction`` (a handshake-era session, ``_meta.progressToken``, SSE
  ``Accept``) whose command runs SLOW_S seconds on both agents, and
- a ``bridge_send`` answering the worker's question (``turnId``) whose reply the worker sends SLOW_S later, and
- a new-turn ``bridge_send`` (no ``turnId``: its client never saw one) to a second worker, as slow.

A is SIGKILLed mid-flight: no close frame, no lease given back, no waiter released. Then, on B only:

- ``GET /mcp/v1/`` with the session and ``Last-Event-ID`` (the last id the dead stream carried) gets the rest of
  the call — progress above what was seen, then the result (``succeeded``, 2/2) — without re-sending the call:
  B adopts the follow A no longer renews (mcp.streaming.handover). Before the fix the resume waited forever;
- the same ``bridge_send`` re-sent with the same ``turnId`` (and the session, which lives in Redis) gets the
  worker's reply; the worker got the answer once;
- the new-turn ``bridge_send`` re-sent as it was finds its turn again (its waiter's lease ran out with A:
  bridge/waiters.py) and gets the reply: one turn, one message pasted. Before the fix it started a second turn;
- no answer from B is a 5xx; the execution ran once per agent (one response each, output intact, nothing
  re-dispatched) and every response stored before the kill is unchanged.
"""

import json
import re
import shutil
import sys
import threading
import time
import uuid

import httpx
import pytest

from bridge import waiters
from bridge.terminal import TmuxBackend
from bridge.testing.harness import DEFAULT_TIMING, Mcp
from yuzu.testing import free_port

from .conftest import needs_postgres, needs_redis
from .services import until

SLOW_S = 8
SLOW = ["sh", "-c", f"echo started; sleep {SLOW_S}; echo finished"]
PROTOCOL = "2025-11-25"
RESUME_BOUND_S = 45  # kill → result on B: the lease (10 s) + a tick (3 s) + what is left of SLOW_S, with slack

pytestmark = [needs_redis, needs_postgres,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (the bridge worker)")]


class Sse:
    """A held SSE response read in a thread: every event (id, parsed data) as it arrives, and how it ended."""

    def __init__(self, http, method, url, **kw):
        self.events: list[tuple[int | None, dict]] = []
        self.status: int | None = None
        self.ended: str | None = None
        self.thread = threading.Thread(target=self._run, args=(http, method, url), kwargs=kw, daemon=True)
        self.thread.start()

    def _run(self, http, method, url, **kw):
        try:
            with http.stream(method, url, **kw) as r:
                self.status = r.status_code
                eid, data = None, []
                for line in r.iter_lines():
                    if line.startswith("id:"):
                        eid = int(line[3:].strip())
                    elif line.startswith("data:"):
                        data.append(line[5:].strip())
                    elif line == "":
                        if data and "".join(data):
                            self.events.append((eid, json.loads("".join(data))))
                        eid, data = None, []
                self.ended = "eof"
        except httpx.HTTPError as exc:
            self.ended = type(exc).__name__

    def ids(self):
        return [eid for eid, _ in self.events if eid is not None]

    def result(self, request_id):
        return next((f for _, f in self.events if f.get("id") == request_id and "result" in f), None)

    def progress(self):
        return [f["params"]["progress"] for _, f in self.events if f.get("method") == "notifications/progress"]


@pytest.mark.timeout(420)
def test_server_killed_streams_resume_and_rendezvous_answer_on_the_other_process(pg, redis_server, cluster_on, http):
    port_a, port_b = free_port(), free_port()
    sock = f"yuzu-kill-{uuid.uuid4().hex[:8]}"
    c = cluster_on(database_url=pg.url, redis_url=redis_server.url, YUZU_BRIDGE_TMUX_SOCKET=sock,
                   YUZU_BRIDGE_URL=f"http://127.0.0.1:{port_b}/mcp/bridge/", **DEFAULT_TIMING)
    try:
        _scenario(c, pg, http, port_a, port_b)
    finally:
        c.close()
        TmuxBackend(sock).shutdown()  # the worker's pane lives in the test's own tmux server


def _scenario(c, pg, http, port_a, port_b):
    t_start = time.monotonic()
    c.prepare()
    c.manage("shell", "-c", "from bridge.profiles import seed_profiles; from bridge.models import Profile; "
                            "seed_profiles(); Profile.objects.filter(name='standin')"
                            ".update(env={'YUZU_STANDIN_BUSY_SECONDS': '0.3'})")
    mcp_token = c.token("kill-mcp", "Operator", tier="operator")
    primary_token = c.token("kill-primary", "Operator")
    device = c.device_token()
    a = c.daphne("daphne-A", port_a)
    b = c.daphne("daphne-B", port_b)
    c.celery()
    c.spawn("poller", [sys.executable, "manage.py", "bridge_poller"])
    states = [c.agent(b, device, name=f"agent-{i}", script_allow=[["sh", "-c", "*"]])[1] for i in range(2)]
    until(lambda: all((s / "state.json").exists() for s in states)
          and pg.query("SELECT count(*) FROM fleet_agent WHERE connected")[0][0] == 2, 60, "both agents to connect")
    agent_ids = [json.loads((s / "state.json").read_text())["agent_id"] for s in states]

    # An execution finished before the kill: its stored responses must come through unchanged.
    first = http.post(b + "/api/v1/executions", json={"plugin": "os", "action": "info", "agent_ids": agent_ids},
                      headers={"Authorization": f"Bearer {mcp_token}"})
    assert first.status_code == 202, first.text
    first_id = first.json()["data"]["execution_id"]
    until(lambda: pg.query("SELECT status FROM fleet_execution WHERE id = %s", first_id)[0][0] == "succeeded", 60,
          "the first execution")
    stored_before = pg.query("SELECT id, status, output, exit_code FROM fleet_response ORDER BY id")

    # The bridge: a stand-in worker (its calls go to B), a question open on a turn, asked through A.
    p = Mcp(a + "/mcp/bridge/", primary_token)
    w = p.call("bridge_spawn", {"profile": "standin"})
    assert w.rpc_error is None and not w.is_error, (w.structured, w.rpc_error, c.all_logs())
    sid = w["sessionId"]
    warm = p.call("bridge_send", {"content": "reply:warm", "sessionId": sid, "timeoutMs": 30000})
    assert warm.get("text") == "warm", (warm.structured, c.all_logs())
    q = p.call("bridge_send", {"content": "ask:which one?", "sessionId": sid, "timeoutMs": 30000})
    assert q["outcome"] == "question", q.structured
    turn_id = q["turnId"]
    answer = f"wait:{SLOW_S}:that one"
    # A second worker for a new-turn bridge_send (no turnId yet) that will be waiting on A too.
    w2 = p.call("bridge_spawn", {"profile": "standin"})
    assert w2.rpc_error is None and not w2.is_error, (w2.structured, w2.rpc_error)
    sid2 = w2["sessionId"]
    message = f"slow:{SLOW_S}:reply:late one"
    p2 = Mcp(a + "/mcp/bridge/", primary_token)

    # On A: an MCP session with a streamed execute_instruction, and the bridge answer waiting for the reply.
    init = http.post(a + "/mcp/v1/", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "faults-kill", "version": "1"}}},
        headers={"Authorization": f"Bearer {mcp_token}", "Accept": "application/json, text/event-stream"})
    assert init.status_code == 200, init.text
    session = init.headers["mcp-session-id"]
    headers = {"Authorization": f"Bearer {mcp_token}", "Mcp-Session-Id": session, "MCP-Protocol-Version": PROTOCOL,
               "Accept": "application/json, text/event-stream"}
    assert http.post(a + "/mcp/v1/", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                     headers=headers).status_code == 202
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "execute_instruction", "_meta": {"progressToken": "kill-1"},
        "arguments": {"plugin": "script", "action": "run", "agent_ids": agent_ids,
                      "params": {"argv": json.dumps(SLOW)}}}}
    stream_http = httpx.Client(trust_env=False, timeout=httpx.Timeout(30, read=None))
    post = Sse(stream_http, "POST", a + "/mcp/v1/", json=call, headers=headers)
    waiting = {}
    bridge_wait = threading.Thread(target=lambda: waiting.update(r=_call_or_error(
        p, "bridge_send", {"content": answer, "turnId": turn_id, "timeoutMs": 60000})), daemon=True)
    bridge_wait.start()
    new_turn_wait = threading.Thread(target=lambda: waiting.update(n=_call_or_error(
        p2, "bridge_send", {"content": message, "sessionId": sid2, "timeoutMs": 60000})), daemon=True)
    new_turn_wait.start()

    until(lambda: post.progress(), 30, "the streamed call's first progress frame on A")
    execution_id = next(f for _, f in post.events if f.get("method") == "notifications/progress")["params"]["_meta"][
        "yuzu.execution_id"]
    until(lambda: pg.query("SELECT answer_seq = ask_seq AND waiter_until IS NOT NULL FROM bridge_turn "
                           "WHERE turn_id = %s", turn_id)[0][0], 20, "A to hold the bridge answer's wait")
    until(lambda: pg.query("SELECT count(*) FROM bridge_turn t JOIN bridge_member m ON t.member_id = m.id "
                           "WHERE m.session_id = %s AND t.waiter_until IS NOT NULL", sid2)[0][0], 20,
          "A to hold the new turn's wait")
    time.sleep(waiters.RENEW_SECONDS)  # A's wait lease is taken (and renewed) before A dies
    until(lambda: pg.query("SELECT count(*) FROM fleet_agentexecstatus WHERE execution_id = %s AND status = 'running'",
                           execution_id)[0][0] == 2, 20, "both agents to start the slow command")
    assert post.result(7) is None, "the call finished before the kill: nothing was tested"

    c.kill("daphne-A")  # SIGKILL: no close frame, no lease given back, no waiter released
    killed = time.monotonic()
    post.thread.join(15)
    bridge_wait.join(15)
    new_turn_wait.join(15)
    assert post.ended and post.result(7) is None, (post.ended, post.events)
    assert "error" in waiting.get("r", {}) and "error" in waiting.get("n", {}), waiting  # A never answered
    seen = max(post.ids())
    seen_progress = max(post.progress())

    # On B: resume the stream by Last-Event-ID (the session and the ring are in Redis).
    b_statuses = []
    resume = Sse(stream_http, "GET", b + "/mcp/v1/", headers={**headers, "Accept": "text/event-stream",
                                                              "Last-Event-ID": str(seen)})
    # ... and re-send the bridge answer (same turnId, same text) on B: the same Redis session, another process.
    p.url = b + "/mcp/bridge/"
    r = p.call("bridge_send", {"content": answer, "turnId": turn_id, "timeoutMs": 60000})
    b_statuses.append(r.status)
    assert r.rpc_error is None and r.get("outcome") == "reply", (r.structured, r.rpc_error, c.log("daphne-B"))
    assert r["text"] == f"answered:{answer}" and r["turnId"] == turn_id, r.structured
    bridge_answered_s = time.monotonic() - killed
    # ... and the new-turn send (no turnId: its client never got one) re-sent as it was: the same turn, answered.
    p2.url = b + "/mcp/bridge/"
    r2 = p2.call("bridge_send", {"content": message, "sessionId": sid2, "timeoutMs": 60000})
    b_statuses.append(r2.status)
    assert r2.rpc_error is None and r2.get("outcome") == "reply" and r2["text"] == "late one", (
        r2.structured, r2.rpc_error, c.log("daphne-B"))
    new_turn_answered_s = time.monotonic() - killed

    until(lambda: resume.result(7) or resume.ended, RESUME_BOUND_S, "the streamed call's result on B")
    b_statuses.append(resume.status)
    final = resume.result(7)
    assert final is not None, (resume.ended, resume.events, c.log("daphne-B"))
    resumed_s = time.monotonic() - killed
    assert all(eid > seen for eid in resume.ids()), (seen, resume.ids())
    after = resume.progress()
    assert after and after == sorted(set(after)) and after[0] > seen_progress and after[-1] == 2, (seen_progress, after)
    out = final["result"]["structuredContent"]
    assert out["execution_id"] == execution_id and out["status"] == "succeeded", out
    assert out["agents_responded"] == 2 and out["agents_success"] == 2, out
    assert sum(1 for _, f in resume.events if f.get("id") == 7) == 1, resume.events
    assert "adopted the follow of streamed call post:7" in c.log("daphne-B", 200000)

    # Nothing lost, nothing run twice, no 5xx from B.
    r = http.get(f"{b}/api/v1/executions/{execution_id}/responses", headers={"Authorization": f"Bearer {mcp_token}"})
    b_statuses.append(r.status_code)
    rows = pg.query("SELECT agent_id, status, output FROM fleet_response WHERE execution_id = %s", execution_id)
    assert len(rows) == 2 and {row[0] for row in rows} == set(agent_ids), rows
    assert all(row[2].count("started") == 1 and row[2].count("finished") == 1 for row in rows), rows
    assert pg.query("SELECT count(*) FROM fleet_execution")[0][0] == 2  # the first one and this one: no re-send
    stored_after = {row[0]: row for row in pg.query("SELECT id, status, output, exit_code FROM fleet_response")}
    assert all(stored_after[row[0]] == row for row in stored_before), "a stored response changed across the kill"
    asked = pg.query("SELECT state, ask_seq, answer_seq, answer FROM bridge_turn WHERE turn_id = %s", turn_id)[0]
    assert asked == ("replied", 1, 1, answer), asked  # answered once: the re-send did not answer again
    assert pg.query("SELECT count(*) FROM bridge_turn t JOIN bridge_member m ON t.member_id = m.id "
                    "WHERE m.session_id = %s", sid)[0][0] == 2  # warm and the question: no turn started twice
    sent = pg.query("SELECT count(*) FROM bridge_turn t JOIN bridge_member m ON t.member_id = m.id "
                    "WHERE m.session_id = %s", sid2)[0][0], \
        pg.query("SELECT count(*) FROM bridge_message g JOIN bridge_member m ON g.member_id = m.id "
                 "WHERE m.session_id = %s", sid2)[0][0]
    assert sent == (1, 1), sent  # one turn, one message: the re-send was not pasted again
    fives = [s for s in b_statuses if s is None or s >= 500]
    logged = re.findall(r'"[A-Z]+ [^"]*" 5\d\d ', c.log("daphne-B", 200000))
    assert not fives and not logged, (b_statuses, logged)
    stream_http.close()
    p.close()
    p2.close()
    print(f"\nserver kill: the bridge answer came on B {bridge_answered_s:.1f} s after the kill, the new turn's "
          f"reply {new_turn_answered_s:.1f} s after, the streamed "
          f"call's result {resumed_s:.1f} s after (progress {seen_progress} seen on A, then {after} on B); "
          f"whole test {time.monotonic() - t_start:.0f} s")


def _call_or_error(p, name, args):
    try:
        r = p.call(name, args)
        return r.structured or {"error": r.rpc_error or r.status}
    except httpx.HTTPError as exc:
        return {"error": type(exc).__name__}
