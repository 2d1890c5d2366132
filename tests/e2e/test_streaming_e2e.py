"""Streaming end to end, against real processes: daphne, a Celery worker on Redis (when YUZU_REDIS_URL
is set; in-process Celery and the in-memory layer otherwise), and real agents — a small
`manage.py agent_swarm` enrolled with a token from `manage.py mint_device_token`, plus real
`python -m fleet.agent` processes whose `script.run` sleeps a per-agent delay, so that progress
arrives in steps.

- The official clients: the MCP Python SDK (tests/mcp_client/progress_drive.py, in .venv-mcp) and the
  TypeScript SDK (tests/ts-client/progress.mjs) call execute_instruction with a progress handler and see
  0/N, strictly increasing progress ending at N, then the result.
- Raw HTTP (a socket per exchange, so a stream is read as it arrives and can be dropped mid-stream):
  the opt-in table, the admission table, the close reasons, SIGTERM, and — two daphne processes on one
  Redis — a streamed POST dropped on one process and resumed by GET with Last-Event-ID on the other.

The in-process rules (ring bounds, takeover bookkeeping, …) are tests/mcp/test_mcp_streams.py's.
"""

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from io import StringIO

import httpx
import pytest
from django.core.management import call_command

from fleet.models import Agent, AgentState, Execution, Response
from mcp.streaming.ring import ring_key, rings
from mcp.streaming.sessions import store
from tests.support.servers import Daphne
from tests.support.sse_client import parse_events
from yuzu.models import ApiToken, hash_secret
from yuzu.rbac import Principal, seed_builtin_roles
from yuzu.testing import ROOT, Proc, free_port, server_env, wait_until

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

REDIS = os.environ.get("YUZU_REDIS_URL", "")
MCP_PY = ROOT / ".venv-mcp" / "bin" / "python"
PROGRESS_DRIVE = ROOT / "tests" / "mcp_client" / "progress_drive.py"
TS_DIR = ROOT / "tests" / "ts-client"
VERSION = "2025-11-25"
SSE_ACCEPT = "application/json, text/event-stream"
SCRIPT_ALLOW = json.dumps([["sh", "-c", "*"]])


def sleep_args(command='sleep "$YUZU_E2E_DELAY"'):
    """execute_instruction arguments: script.run of ``sh -c COMMAND`` (swarm agents answer it at once)."""
    return {"plugin": "script", "action": "run", "params": {"argv": json.dumps(["sh", "-c", command])}}


# --- processes --------------------------------------------------------------------------------

class Fleet:
    """The processes a test starts besides daphne: a Celery worker (Redis mode), agents, a swarm."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.procs = []
        self.servers = []
        self._device_token = None
        self.expected = 0

    def device_token(self):
        if self._device_token is None:
            out = StringIO()
            call_command("mint_device_token", "--name", "e2e", "--unlimited-uses", stdout=out)  # a swarm enrols on it
            self._device_token = out.getvalue().strip()
        return self._device_token

    def _spawn(self, name, argv, **env):
        log = open(self.tmp / f"{name}.log", "w")
        proc = subprocess.Popen(argv, cwd=ROOT, env=server_env(**env), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def server(self, *daphne_args, **env):
        """A daphne process on the test database (like conftest.start_daphne, with daphne options)."""
        port = free_port()
        log_path = self.tmp / f"daphne-{port}.log"
        log = open(log_path, "w")
        proc = subprocess.Popen([sys.executable, "-m", "yuzu.daphne_main", "-b", "127.0.0.1", "-p", str(port), *daphne_args,
                                 "yuzu.asgi:application"], cwd=ROOT, env=server_env(**env), stdout=log,
                                stderr=subprocess.STDOUT)
        log.close()
        server = Daphne(port, Proc(f"daphne-{port}", proc, log_path))  # tests/support/servers.Daphne takes a Proc
        self.servers.append(server)
        deadline = time.time() + 30
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"daphne exited: {log_path.read_text()[-2000:]}")
            try:
                if httpx.get(server.base + "/healthz", timeout=1).status_code == 200:
                    return server
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("daphne did not become healthy")

    def worker(self):
        """Redis mode: a real Celery worker consumes dispatch tasks (embedded mode runs them in daphne)."""
        if not REDIS:
            return
        from yuzu.celery import app

        app.control.purge()  # stale dispatches of earlier runs name executions this database never had
        self._spawn("celery", [sys.executable, "-m", "celery", "-A", "yuzu", "worker", "-l", "warning",
                               "--concurrency", "2", "-n", f"e2e-{free_port()}@%h"])
        deadline = time.time() + 30
        while time.time() < deadline:
            if app.control.ping(timeout=0.5):
                return
        raise RuntimeError("the Celery worker did not answer a ping")

    def swarm(self, server, count=5, prefix="sim"):
        self._spawn(f"swarm-{prefix}", [sys.executable, "manage.py", "agent_swarm", "--count", str(count),
                                        "--server", f"ws://127.0.0.1:{server.port}", "--token",
                                        self.device_token(), "--state-dir", str(self.tmp / f"swarm-{prefix}"),
                                        "--prefix", prefix])
        self.expected += count

    def agents(self, server, delays):
        """Real agent processes; each one's script.run sees its own YUZU_E2E_DELAY."""
        for i, delay in enumerate(delays):
            name = f"agent-{len(self.procs)}-{i}"
            self._spawn(name, [sys.executable, "-m", "fleet.agent", "--server", f"ws://127.0.0.1:{server.port}",
                               "--token", self.device_token(), "--state-dir", str(self.tmp / name)],
                        YUZU_E2E_DELAY=delay, YUZU_AGENT_SCRIPT_ALLOW=SCRIPT_ALLOW, YUZU_LOG_LEVEL="WARNING")
        self.expected += len(delays)

    def wait_connected(self, timeout=40):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if Agent.objects.filter(connected=True).count() >= self.expected:
                return
            time.sleep(0.2)
        raise AssertionError(f"{Agent.objects.filter(connected=True).count()} of {self.expected} agents connected")

    def stop(self):
        # Agents and workers first, then let daphne finish recording what they last sent: a response still
        # being recorded when daphne stops can keep it from exiting (see the report in docs/streaming.md).
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()  # the leader only: a Celery worker shuts its pool down itself
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.5)
        for server in self.servers:
            server.stop()


@pytest.fixture
def fleet(transactional_db, tmp_path):
    seed_builtin_roles()
    if REDIS:  # sessions and rings of earlier runs live on in Redis under recycled principal keys
        store().clear()
        rings().clear()
    f = Fleet(tmp_path)
    yield f
    f.stop()


# --- raw HTTP ---------------------------------------------------------------------------------

class Http:
    """One HTTP/1.1 exchange on its own socket. The response body is decoded as it arrives, a read that
    times out does not break the stream, and the connection can be dropped mid-stream."""

    def __init__(self, port, method, path="/mcp/v1/", headers=None, body=b""):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
        hdrs = {k.lower(): v for k, v in (headers or {}).items() if v is not None}
        if method in ("POST", "PUT", "PATCH"):
            hdrs.setdefault("content-type", "application/json")
            hdrs["content-length"] = str(len(body))
        lines += [f"{k}: {v}" for k, v in hdrs.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        self.raw = b""
        self.body = b""
        self.eof = False
        self.sent_at = time.monotonic()
        while b"\r\n\r\n" not in self.raw:
            self._recv(10, must=True)
        head, self.raw = self.raw.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {}
        for line in header_lines:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        self.chunked = self.headers.get("transfer-encoding", "").lower() == "chunked"
        self.length = int(self.headers["content-length"]) if "content-length" in self.headers else None
        self._decode()

    def _recv(self, timeout, must=False):
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            if must:
                raise AssertionError("no response") from None
            return False
        except OSError:
            data = b""
        if not data:
            self.eof = True
            if must:
                raise AssertionError("connection closed before a response")
            return False
        self.raw += data
        return True

    def _decode(self):
        if not self.chunked:
            self.body += self.raw
            self.raw = b""
            if self.length is not None and len(self.body) >= self.length:
                self.eof = True
            return
        while True:
            head, sep, rest = self.raw.partition(b"\r\n")
            if not sep:
                return
            size = int(head.split(b";")[0], 16)
            if len(rest) < size + 2:
                return
            self.body += rest[:size]
            self.raw = rest[size + 2:]
            if size == 0:
                self.eof = True
                return

    def pump(self, timeout):
        if self.eof:
            return False
        got = self._recv(timeout)
        self._decode()
        return got

    @property
    def is_sse(self):
        return self.headers.get("content-type", "").startswith("text/event-stream")

    def events(self):
        return parse_events(self.body.decode())

    def frames(self):
        return [e["json"] for e in self.events() if e.get("json")]

    def until(self, predicate, timeout=15):
        """Read until predicate(frames) holds; returns the frames. EOF without it is a failure."""
        deadline = time.monotonic() + timeout
        while True:
            frames = self.frames()
            if predicate(frames):
                return frames
            if self.eof:
                raise AssertionError(f"stream ended first: {frames}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout}s: {frames}")
            self.pump(min(left, 0.5))

    def to_eof(self, timeout=15):
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no EOF after {timeout}s: {self.body[-500:]!r}")
            self.pump(min(left, 0.5))
        return self.body

    def json(self):
        self.to_eof()
        return json.loads(self.body)

    def drop(self):
        """The client goes away mid-stream."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.eof = True


class Session:
    """An MCP session over raw HTTP."""

    def __init__(self, port, token, version=VERSION):
        self.port, self.token, self.version = port, token, version
        r = Http(port, "POST", headers={"authorization": f"Bearer {token}", "accept": SSE_ACCEPT},
                 body={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                       "params": {"protocolVersion": version, "capabilities": {},
                                  "clientInfo": {"name": "e2e", "version": "0"}}})
        assert r.status == 200, r.json()
        r.to_eof()
        self.sid = r.headers.get("mcp-session-id")
        self.notify("notifications/initialized")

    def headers(self, extra=None):
        h = {"authorization": f"Bearer {self.token}", "mcp-protocol-version": self.version}
        if self.sid:
            h["mcp-session-id"] = self.sid
        h.update(extra or {})
        return h

    def post(self, msg, accept=SSE_ACCEPT, **extra):
        return Http(self.port, "POST", headers=self.headers({"accept": accept, **extra}), body=msg)

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method, **({"params": params} if params is not None else {})}
        r = self.post(msg)
        r.to_eof()
        assert r.status == 202, r.body
        return r

    def call(self, rid, name, arguments, progress_token=None, accept=SSE_ACCEPT, **extra):
        params = {"name": name, "arguments": arguments}
        if progress_token is not None:
            params["_meta"] = {"progressToken": progress_token}
        return self.post({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}, accept, **extra)

    def result(self, rid, name, arguments):
        r = self.call(rid, name, arguments, accept="application/json")
        body = r.json()
        assert r.status == 200 and "result" in body, body
        return body["result"]["structuredContent"]

    def get(self, last_event_id=None):
        extra = {"accept": "text/event-stream"}
        if last_event_id is not None:
            extra["last-event-id"] = str(last_event_id)
        return Http(self.port, "GET", headers=self.headers(extra))

    def delete(self):
        return Http(self.port, "DELETE", headers=self.headers())


def progress_of(frames):
    return [f["params"]["progress"] for f in frames if f.get("method") == "notifications/progress"]


def closes_of(frames):
    return [f["params"] for f in frames if f.get("method") == "notifications/yuzu.stream_closed"]


def response_of(frames, rid):
    return next((f for f in frames if f.get("id") == rid and ("result" in f or "error" in f)), None)


def ids_of(http):
    return [int(e["id"]) for e in http.events() if e.get("id") and e.get("data")]


def principal_key(raw):
    token = ApiToken.objects.select_related("owner").get(token_hash=hash_secret(raw))
    return Principal(user=token.owner, token=token).key


def metric(server, name, **labels):
    text = httpx.get(server.base + "/metrics", timeout=5).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + ("{" + want + "}" if want else " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def assert_progress(values, total):
    """0 first, strictly increasing, ending at total."""
    assert values and values[0] == 0, values
    assert all(a < b for a, b in itertools.pairwise(values)), values
    assert values[-1] == total, values


# --- the official clients ---------------------------------------------------------------------

def client_env(**extra):
    """The SDKs' processes must see none of the project: no PYTHONPATH, no Django settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "DJANGO_", "PYTHON", "YUZU_")) and k != "VIRTUAL_ENV"}
    env.update(extra)
    return env


def progress_stack(fleet):
    """daphne (+ a worker), a swarm of 5 answering at once, and two real agents sleeping 1 s and 2 s: 7
    targets, progress in at least three steps."""
    server = fleet.server()
    fleet.worker()
    fleet.swarm(server, 5)
    fleet.agents(server, [1, 2])
    fleet.wait_connected()
    return server


def assert_official_progress(obs, total):
    assert "fatal" not in obs, obs["fatal"]
    call = obs["call"]
    assert "error" not in call and call["is_error"] is False, call
    values = [p["progress"] for p in obs["progress"]]
    assert_progress(values, total)
    assert total - 1 in values, values  # the 2 s agent's answer was its own step
    assert {p["total"] for p in obs["progress"]} == {total}
    assert call["at"] >= obs["progress"][-1]["at"]  # the result came after the last progress
    result = call["structured"]
    assert result["status"] == "succeeded" and result["agents_responded"] == total, result
    assert obs["status"]["status"] == "succeeded" and obs["status"]["id"] == result["execution_id"]
    streamed = [e for e in obs["http"] if e["rpc"] == "tools/call" and e["progress_token"]]
    assert len(streamed) == 1 and streamed[0]["content_type"] == "text/event-stream", obs["http"]
    assert "text/event-stream" in streamed[0]["accept"]
    return result


def test_python_sdk_progress(fleet, mint, tmp_path):
    if not MCP_PY.exists():
        pytest.fail(f"{MCP_PY} is missing: run `make test` (its test-deps target builds .venv-mcp)")
    server = progress_stack(fleet)
    token = mint("e2e-py", role="Operator", tier="operator")
    proc = subprocess.run([str(MCP_PY), str(PROGRESS_DRIVE), "--url", server.mcp, "--token", token,
                           "--args", json.dumps(sleep_args())], cwd=tmp_path, env=client_env(),
                          capture_output=True, text=True, timeout=150)
    try:
        obs = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"progress_drive.py printed no JSON (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                    f"{proc.stderr[-4000:]}")
    result = assert_official_progress(obs, 7)
    assert Response.objects.filter(execution_id=result["execution_id"], status=AgentState.SUCCESS).count() == 7


def test_typescript_sdk_progress(fleet, mint):
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: run `make test` (tests/support/system_deps.py installs Debian's nodejs)")
    if not (TS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        pytest.fail("tests/ts-client/node_modules is missing: run `make test` (its test-deps target runs npm ci)")
    server = progress_stack(fleet)
    token = mint("e2e-ts", role="Operator", tier="operator")
    env = client_env(MCP_URL=server.mcp, MCP_TOKEN=token, MCP_ARGS=json.dumps(sleep_args()))
    proc = subprocess.run([node, str(TS_DIR / "progress.mjs")], cwd=TS_DIR, env=env, capture_output=True,
                          text=True, timeout=150)
    try:
        obs = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"progress.mjs printed no JSON (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                    f"{proc.stderr[-4000:]}")
    result = assert_official_progress(obs, 7)
    assert Execution.objects.get(pk=result["execution_id"]).status == "succeeded"


# --- the opt-in table -------------------------------------------------------------------------

IDS = re.compile(rb"\b[0-9a-f]{32}\b|\b[a-z]+-[0-9a-f]{16}\b")


def normalized(body):
    return IDS.sub(b"<id>", body)


def test_opt_in_table(fleet, mint):
    server = fleet.server()
    fleet.worker()
    fleet.swarm(server, 3)
    fleet.wait_connected()
    s = Session(server.port, mint("e2e-optin", role="Operator", tier="operator"))
    args = {"plugin": "os", "action": "info"}

    # token + SSE Accept → the POST response is the SSE stream: progress, the result last, then EOF.
    r = s.call(1, "execute_instruction", args, progress_token="t-sse")
    assert r.status == 200 and r.is_sse, (r.status, r.headers)
    assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"
    r.to_eof()
    frames = r.frames()
    assert_progress(progress_of(frames), 3)
    assert frames[-1]["id"] == 1 and frames[-1]["result"]["structuredContent"]["status"] == "succeeded"
    assert all(f["params"]["progressToken"] == "t-sse" for f in frames[:-1])
    assert r.events()[0] == {"id": "0", "data": ""}  # the priming event (2025-11-25)

    # token without an SSE Accept → plain JSON now, progress on the session's GET channel (no result there).
    g = s.get()
    assert g.status == 200 and g.is_sse
    r = s.call(2, "execute_instruction", args, progress_token="t-get", accept="application/json")
    assert r.status == 200 and r.headers["content-type"] == "application/json"
    with_token = r.to_eof()
    receipt = json.loads(with_token)["result"]["structuredContent"]
    on_get = g.until(lambda f: progress_of(f)[-1:] == [3])
    assert_progress(progress_of(on_get), 3)
    assert {f["params"]["progressToken"] for f in on_get} == {"t-get"}
    assert {f["params"]["_meta"]["yuzu.execution_id"] for f in on_get} == {receipt["execution_id"]}
    assert response_of(on_get, 2) is None and response_of(on_get, 1) is None
    g.drop()

    # SSE Accept without a token → plain JSON (the token is the opt-in); neither → plain JSON, byte-identical
    # (modulo ids) to a request that sends no Accept at all.
    sse_no_token = s.call(3, "execute_instruction", args)
    assert sse_no_token.headers["content-type"] == "application/json"
    neither = s.call(3, "execute_instruction", args, accept="application/json")
    no_accept = s.call(3, "execute_instruction", args, accept=None)
    bodies = [normalized(x.to_eof()) for x in (sse_no_token, neither, no_accept)]
    assert bodies[0] == bodies[1] == bodies[2], bodies
    assert normalized(with_token).replace(b'"id":2', b'"id":3') == bodies[0]  # the same answer, progress aside
    assert {x.headers["content-type"] for x in (sse_no_token, neither, no_accept)} == {"application/json"}
    assert json.loads(bodies[0])["result"]["structuredContent"]["status"] == "running"


# --- the admission table ----------------------------------------------------------------------

def test_admission_table(fleet, mint):
    server = fleet.server()
    fleet.worker()
    fleet.agents(server, [0])
    fleet.wait_connected()
    long = sleep_args("sleep 20")
    token = mint("e2e-cap", role="Operator", tier="operator")
    s1, s2, s3 = Session(server.port, token), Session(server.port, token), Session(server.port, token)
    held = [s.call(rid, "execute_instruction", long, progress_token=f"p{rid}") for s in (s1, s2) for rid in (1, 2)]
    for h in held:
        assert h.status == 200 and h.is_sse
        h.until(lambda f: progress_of(f) == [0])
    assert Execution.objects.count() == 4

    # A fifth streamed call of the same principal (another session): 429 -32012, Retry-After 30, nothing run.
    refused = s3.call(1, "execute_instruction", long, progress_token="p5")
    body = refused.json()
    assert refused.status == 429 and refused.headers["retry-after"] == "30", (refused.status, body)
    assert body["error"]["code"] == -32012 and body["error"]["data"]["retry_after_ms"] == 30000
    assert "post_per_principal_cap" in body["error"]["message"]
    assert Execution.objects.count() == 4
    assert metric(server, "yuzu_mcp_stream_rejects_total", reason="post_per_principal_cap") == 1

    # The same request id while the first is still in flight: 409 -32600 (another principal, under its cap).
    other = Session(server.port, mint("e2e-dup", role="Operator", tier="operator"))
    first = other.call(7, "execute_instruction", long, progress_token="d")
    first.until(lambda f: progress_of(f) == [0])
    dup = other.call(7, "execute_instruction", long, progress_token="d")
    body = dup.json()
    assert dup.status == 409 and body["error"]["code"] == -32600 and body["id"] == 7, body
    assert Execution.objects.count() == 5

    # An unknown session: 404 -32007 (re-initialize).
    ghost = Http(server.port, "POST", headers={**s1.headers({"mcp-session-id": "0" * 32}), "accept": SSE_ACCEPT},
                 body={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "execute_instruction", "arguments": long, "_meta": {"progressToken": 1}}})
    body = ghost.json()
    assert ghost.status == 404 and body["error"]["code"] == -32007, body

    # A held response whose client goes away gives its slot back at once (http.disconnect), not when the
    # work ends: the refused call is admitted on retry.
    held[0].drop()
    retry = wait_until(lambda: (lambda r: r if r.status == 200 else r.to_eof() and None)(
        s3.call(2, "execute_instruction", long, progress_token="p6")), 5, interval=0.2, what="the slot to come back")
    assert retry.is_sse
    retry.until(lambda f: progress_of(f) == [0])
    assert metric(server, "yuzu_mcp_post_streams_active") == 5  # 3 of the first four, the retry, the dup's first
    for h in held[1:] + [first, retry]:
        h.drop()


def test_streamed_post_disabled_answers_plain_json(fleet, mint):
    server = fleet.server(YUZU_MCP_STREAMED_POST="0")
    fleet.worker()
    fleet.swarm(server, 2)
    fleet.wait_connected()
    s = Session(server.port, mint("e2e-nopost", role="Operator", tier="operator"))
    g = s.get()
    r = s.call(1, "execute_instruction", {"plugin": "os", "action": "info"}, progress_token="x")
    assert r.status == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["result"]["structuredContent"]["agents_reached"] == 2
    assert_progress(progress_of(g.until(lambda f: progress_of(f)[-1:] == [2])), 2)  # still reported, on GET
    g.drop()


def test_no_streaming_answers_plain_json_and_405(fleet, mint):
    server = fleet.server(YUZU_MCP_NO_STREAMING="1")
    fleet.worker()
    fleet.swarm(server, 2)
    fleet.wait_connected()
    s = Session(server.port, mint("e2e-nostream", role="Operator", tier="operator"))
    assert s.sid is None  # no session minted
    r = s.call(1, "execute_instruction", {"plugin": "os", "action": "info"}, progress_token="x")
    assert r.status == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["result"]["structuredContent"]["status"] == "running"
    for http in (s.get(), s.delete()):
        http.to_eof()
        assert http.status == 405, http.status


# --- close reasons ----------------------------------------------------------------------------

def closed_with(http, reason, timeout=10):
    frames = http.until(lambda f: bool(closes_of(f)), timeout)
    close = closes_of(frames)[-1]
    assert close["reason"] == reason, close
    assert close["correlation_id"] and close["remediation"]
    http.to_eof(5)
    last = [e for e in http.events() if e.get("data")][-1]
    assert "id" not in last  # off-ring: a close frame carries no event id
    return close


def test_get_close_reasons(fleet, mint):
    from yuzu import tokens

    server = fleet.server()
    token = mint("e2e-close", role="Operator", tier="operator")
    s = Session(server.port, token)

    # superseded: a second GET on the session takes the stream over.
    first = s.get()
    first.until(lambda f: True)
    second = s.get()
    assert second.status == 200
    closed_with(first, "superseded")

    # The client's own DELETE ends the session and its live stream: EOF, no close frame (issue 13).
    d = s.delete()
    d.to_eof()
    assert d.status == 200
    second.to_eof(10)
    assert closes_of(second.frames()) == []
    gone = s.call(9, "list_agents", {}, accept="application/json")
    assert gone.status == 404 and gone.json()["error"]["code"] == -32007

    # session_terminated: the server ends a session its client did not DELETE — a resume past the replay
    # window ends it (404) — and its live stream closes with the frame at its next tick.
    s3 = Session(server.port, token)
    live = s3.get()
    live.until(lambda f: True)
    past = s3.get(last_event_id=10**6)
    past.to_eof()
    assert past.status == 404
    closed_with(live, "session_terminated")

    # credential_revoked: the token is revoked while its stream is live; the next tick (3 s) closes it.
    raw = mint("e2e-revoked", role="Operator", tier="operator")
    s2 = Session(server.port, raw)
    g = s2.get()
    g.until(lambda f: True)
    t0 = time.monotonic()
    owner = ApiToken.objects.get(token_hash=hash_secret(raw))
    tokens.revoke_token(Principal(user=owner.owner), owner.pk)
    closed_with(g, "credential_revoked", timeout=8)
    assert time.monotonic() - t0 < 6.0  # the next tick (3 s), with slack for a loaded machine
    assert metric(server, "yuzu_mcp_stream_closes_total", reason="credential_revoked") == 1
    assert metric(server, "yuzu_mcp_stream_closes_total", reason="superseded") == 1
    assert metric(server, "yuzu_mcp_stream_closes_total", reason="session_deleted") == 1
    assert metric(server, "yuzu_mcp_stream_closes_total", reason="session_terminated") == 1


def test_streamed_post_closes_when_its_token_is_revoked(fleet, mint):
    """A streamed POST re-validates its credential on the GET stream's tick: revoked mid-call, the response
    closes with credential_revoked within a tick instead of reporting progress until the 120 s cap."""
    from yuzu import tokens

    server = fleet.server()
    fleet.worker()
    fleet.agents(server, [0])
    fleet.wait_connected()
    raw = mint("e2e-post-revoked", role="Operator", tier="operator")
    r = Session(server.port, raw).call(1, "execute_instruction", sleep_args("sleep 30"), progress_token="r")
    r.until(lambda f: progress_of(f) == [0])
    t0 = time.monotonic()
    owner = ApiToken.objects.get(token_hash=hash_secret(raw))
    tokens.revoke_token(Principal(user=owner.owner), owner.pk)
    close = closed_with(r, "credential_revoked", timeout=8)
    assert time.monotonic() - t0 < 6.0  # the next tick (3 s), with slack for a loaded machine
    assert close["execution_id"] and close["partial"] is True
    assert response_of(r.frames(), 1) is None
    assert metric(server, "yuzu_mcp_stream_closes_total", reason="credential_revoked") == 1


def test_cancelled_detaches_and_the_execution_completes(fleet, mint):
    server = fleet.server()
    fleet.worker()
    fleet.agents(server, [1, 3])
    fleet.wait_connected()
    s = Session(server.port, mint("e2e-cancel", role="Operator", tier="operator"))
    r = s.call(5, "execute_instruction", sleep_args(), progress_token="c")
    r.until(lambda f: progress_of(f) == [0])
    s.notify("notifications/cancelled", {"requestId": 5, "reason": "user gave up"})
    close = closed_with(r, "cancelled")
    assert close["partial"] is True and close["execution_id"]
    assert response_of(r.frames(), 5) is None  # detached: no result on this response
    eid = close["execution_id"]

    # Closing a response never cancels the work: it completes and is fetchable by execution_id.
    status = wait_until(lambda: (lambda st: st if st["status"] != "running" else None)(
        s.result(10, "get_execution_status", {"execution_id": eid})), 20, interval=0.5, what="the execution to finish")
    assert status["status"] == "succeeded" and status["agents_responded"] == 2
    responses = s.result(11, "query_responses", {"execution_id": eid})
    assert responses["count"] == 2 and {x["status"] for x in responses["responses"]} == {"SUCCESS"}
    assert metric(server, "yuzu_mcp_cancel_notifications_total", outcome="detached") == 1


# --- shutdown ---------------------------------------------------------------------------------

def test_sigterm_closes_live_streams_with_session_terminated(fleet, mint):
    server = fleet.server()
    fleet.worker()
    fleet.agents(server, [0])
    fleet.wait_connected()
    token = mint("e2e-term", role="Operator", tier="operator")
    g = Session(server.port, token).get()
    g.until(lambda f: True)
    post = Session(server.port, token).call(1, "execute_instruction", sleep_args("sleep 20"), progress_token="s")
    post.until(lambda f: progress_of(f) == [0])
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    close = closed_with(g, "session_terminated", timeout=5)
    assert time.monotonic() - t0 < 3.0, "a live GET stream closes within one tick of SIGTERM"
    assert "stopping" in close["remediation"]
    post_close = closed_with(post, "session_terminated", timeout=5)
    assert post_close["execution_id"] and post_close["partial"] is True
    assert server.proc.wait(15) is not None
    assert time.monotonic() - t0 < 10


# --- two processes on one Redis ---------------------------------------------------------------

@pytest.mark.skipif(not REDIS, reason="needs YUZU_REDIS_URL: CI runs it")
def test_streamed_post_dropped_on_one_process_resumes_on_the_other(fleet, mint):
    # A is told to cancel a disconnected application after 2 s (daphne's default is 10): the streamed
    # POST's reporting must outlive its connection, or the result arriving later is never committed.
    a = fleet.server("--application-close-timeout", "2")
    b = fleet.server()
    fleet.worker()
    fleet.agents(a, [0.5, 5])
    fleet.wait_connected()
    raw = mint("e2e-resume", role="Operator", tier="operator")
    on_a = Session(a.port, raw)
    on_b = Session(b.port, raw)
    on_b.sid = on_a.sid  # the same session, served by the other process
    key = ring_key(principal_key(raw), on_a.sid)

    # 1. Dropped mid-stream; the result lands (pinned) after A would have killed a request-bound follower;
    #    a GET resume on B with Last-Event-ID delivers the rest of that stream and the pinned result.
    r = on_a.call(1, "execute_instruction", sleep_args(), progress_token="r1")
    r.until(lambda f: progress_of(f) == [0, 1])
    seen = ids_of(r)
    r.drop()
    dropped_at = time.monotonic()
    eid = r.frames()[0]["params"]["_meta"]["yuzu.execution_id"]
    wait_until(lambda: Execution.objects.get(pk=eid).status == "succeeded", 15, what="the execution to finish")
    assert time.monotonic() - dropped_at > 3  # later than A's application-close-timeout
    final_id = wait_until(lambda: [p for p in rings().pinned(key) if p > seen[-1]], 5, what="the pinned result")[0]
    assert metric(a, "yuzu_mcp_stream_closes_total", reason="client_disconnect") >= 1
    g = on_b.get(last_event_id=seen[-1])
    frames = g.until(lambda f: response_of(f, 1) is not None)
    assert progress_of(frames) == [2]
    final = response_of(frames, 1)
    assert final["result"]["structuredContent"]["status"] == "succeeded"
    assert final["result"]["structuredContent"]["execution_id"] == eid
    assert ids_of(g)[-1] == final_id and all(i > seen[-1] for i in ids_of(g))
    wait_until(lambda: final_id not in rings().pinned(key), 5, what="the delivered result to be unpinned")
    g.drop()

    # 2. Resumed on B before the result exists: B's stream carries the POST's stream on to its result.
    r = on_a.call(2, "execute_instruction", sleep_args(), progress_token="r2")
    r.until(lambda f: progress_of(f) == [0, 1])
    seen = ids_of(r)
    r.drop()
    g = on_b.get(last_event_id=seen[-1])
    frames = g.until(lambda f: response_of(f, 2) is not None, timeout=15)
    assert progress_of(frames) == [2] and response_of(frames, 2)["result"]["structuredContent"]["status"] == "succeeded"
    g.drop()

    # 3. notifications/cancelled sent to B detaches the stream held by A; the work still completes.
    r = on_a.call(3, "execute_instruction", sleep_args(), progress_token="r3")
    r.until(lambda f: progress_of(f) == [0])
    on_b.notify("notifications/cancelled", {"requestId": 3})
    close = closed_with(r, "cancelled")
    wait_until(lambda: Execution.objects.get(pk=close["execution_id"]).status == "succeeded", 15, what="completion")
    assert metric(b, "yuzu_mcp_cancel_notifications_total", outcome="accepted") == 1
