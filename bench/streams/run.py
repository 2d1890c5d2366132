"""Benchmark yuzu's held-open streams on ONE daphne process. See README.md beside this file.

    .venv/bin/python bench/streams/run.py [--levels 100 1000 5000] [--hold 30] [--agents 100] [--runs 20]
                                          [--load-streams 1000] [--json out.json]

Part 1, GET channel capacity. For each level N a fresh daphne process gets N MCP sessions, then N
concurrent GET streams (4 per token: the per-principal cap). With the streams idle it measures the daphne
process's RSS growth per stream, its CPU, and heartbeat lateness: every gap between two heartbeats on a
stream, minus the 3 s tick. Then it sends SIGTERM with every stream still open and measures how many
streams got the session_terminated close frame, how fast, and how long the process took to exit.

Part 2, progress latency. A daphne process and `manage.py agent_swarm --count A`. A streaming client runs
execute_instruction (os.info on every agent) as a streamed POST, R times; each agent response's latency
is (arrival of the first progress frame that counts it) - (the server's timestamp on that response, from
query_responses). Measured idle (the reference) and again with --load-streams GET streams held open.

Everything runs on 127.0.0.1 on a fresh SQLite file under a temp dir (YUZU_DATABASE_URL/YUZU_REDIS_URL,
when set, are passed through). The load generator is a single asyncio process with one raw socket per
stream; it shares the machine's CPUs with daphne.
"""

import argparse
import asyncio
import itertools
import json
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from yuzu.cpus import affinity, pinned_cpus  # noqa: E402  (after sys.path)

PY = sys.executable
PROTOCOL = "2025-11-25"
TICK = 3.0
HEARTBEAT = b": heartbeat"
CLOSED = b"terminated"  # the session_terminated close frame

SETUP = r"""
import json, sys
from datetime import timedelta
import django
django.setup()
from django.contrib.auth import get_user_model
from django.utils import timezone
from fleet.management.commands.mint_device_token import mint_device_token
from yuzu.models import ApiToken
from yuzu.rbac import assign_role, seed_builtin_roles

n_tokens = int(sys.argv[1])
seed_builtin_roles()
User = get_user_model()
expires = timezone.now() + timedelta(days=1)


# token i on a user of its own: thousands of streams are thousands of clients, and one user's share of a
# process's sessions and streams is capped (mcp.streaming: PER_USER_CAP, GET_PER_USER)
def client(i):
    user = User.objects.filter(username=f"bench-streams-{i}").first() or User.objects.create_user(f"bench-streams-{i}")
    assign_role(user, "Operator")
    return ApiToken.mint(user, f"bench-{i}", mcp_tier="operator", expires_at=expires)[1]


tokens = [client(i) for i in range(n_tokens)]
print(json.dumps({"tokens": tokens, "device_token": mint_device_token("bench swarm", max_uses=None)}))
"""

# daphne, with the session registry's global cap (mcp.streaming.sessions.GLOBAL_CAP, 1024) raised for the
# 5,000 case: the bench needs one session per stream (and with Redis, the earlier levels' are still live).
# The stream cap itself is YUZU_MCP_MAX_STREAMS.
DAPHNE = ("import sys, yuzu.daphne_main, django; django.setup(); "
          "import mcp.streaming.sessions as s; s.GLOBAL_CAP = int(sys.argv[1]); "
          "sys.argv = ['daphne'] + sys.argv[2:]; "
          "from daphne.cli import CommandLineInterface; CommandLineInterface.entrypoint()")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1] if q < 100 else values[-1]


class Env:
    def __init__(self, var_dir):
        self.var_dir = var_dir
        self.session_cap = 1024  # the daphnes' global session cap (GLOBAL_CAP), set for the run by main_async
        self.cpus = None  # the daphne's CPU (set by main: serve's first, or none with --no-pin)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        self.env.update({"YUZU_VAR_DIR": str(var_dir), "DJANGO_SETTINGS_MODULE": "yuzu.settings",
                         "PYTHONUNBUFFERED": "1", "YUZU_LOG_LEVEL": "WARNING"})

    def run(self, argv, **extra):
        out = subprocess.run(argv, cwd=ROOT, env={**self.env, **extra}, capture_output=True, text=True, timeout=600)
        if out.returncode:
            raise RuntimeError(f"{argv[:3]} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        return out.stdout


class Server:
    def __init__(self, env, cap, name):
        self.port = free_port()
        self.log = open(env.var_dir / f"daphne-{name}.log", "w")
        with affinity(env.cpus):  # on one CPU, as `manage.py serve` runs a daphne (unless --no-pin)
            self.proc = subprocess.Popen(
                [PY, "-c", DAPHNE, str(env.session_cap), "-b", "127.0.0.1", "-p", str(self.port),
                 "--access-log", os.devnull, "yuzu.asgi:application"],
                cwd=ROOT, env={**env.env, "YUZU_MCP_MAX_STREAMS": str(cap)}, stdout=self.log,
                stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.proc.pid)
        self.url = f"http://127.0.0.1:{self.port}/mcp/v1/"
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne exited: {Path(self.log.name).read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("daphne did not become healthy")

    def rss(self):
        return self.ps.memory_info().rss

    def cpu(self):
        t = self.ps.cpu_times()
        return t.user + t.system

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def headers(token, sid=None, **extra):
    h = {"authorization": f"Bearer {token}", "content-type": "application/json",
         "accept": "application/json, text/event-stream"}
    if sid:
        h.update({"mcp-session-id": sid, "mcp-protocol-version": PROTOCOL})
    h.update(extra)
    return h


async def open_sessions(url, tokens, n, concurrency=32):
    """n sessions, four per token (the per-principal GET stream cap is 4)."""
    sem = asyncio.Semaphore(concurrency)
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                       "clientInfo": {"name": "bench", "version": "0"}}}

    async def one(client, i):
        token = tokens[i // 4]
        async with sem:
            r = await client.post(url, json=init, headers=headers(token))
            r.raise_for_status()
            sid = r.headers["mcp-session-id"]
            r = await client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                                  headers=headers(token, sid))
            assert r.status_code == 202, r.status_code
            return token, sid

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        return await asyncio.gather(*(one(client, i) for i in range(n)))


class Held:
    """One GET stream on its own socket: records when each heartbeat and the close frame arrive."""

    def __init__(self):
        self.status = None
        self.beats = []
        self.closed_at = None
        self.eof_at = None
        self.writer = None
        self.task = None

    async def open(self, port, token, sid):
        reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        request = (f"GET /mcp/v1/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
                   f"Accept: text/event-stream\r\nMcp-Session-Id: {sid}\r\nMcp-Protocol-Version: {PROTOCOL}\r\n\r\n")
        self.writer.write(request.encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 120)
        self.status = int(head.split(b" ", 2)[1])
        self.task = asyncio.ensure_future(self._read(reader))

    async def _read(self, reader):
        tail = b""  # shorter than either marker, so a marker split across reads is counted exactly once
        try:
            while True:
                data = await reader.read(65536)
                now = time.monotonic()
                if not data:
                    self.eof_at = now
                    return
                buf = tail + data
                self.beats.extend([now] * buf.count(HEARTBEAT))
                if self.closed_at is None and CLOSED in buf:
                    self.closed_at = now
                tail = buf[-(len(HEARTBEAT) - 1):]
        except (ConnectionError, asyncio.CancelledError):
            self.eof_at = self.eof_at or time.monotonic()

    def close(self):
        if self.task:
            self.task.cancel()
        if self.writer:
            self.writer.close()


async def open_streams(port, sessions, open_timeout, concurrency=64):
    """Open one stream per session, at most `concurrency` at a time; none is started after open_timeout."""
    sem = asyncio.Semaphore(concurrency)
    streams = [Held() for _ in sessions]
    deadline = time.monotonic() + open_timeout

    async def one(stream, token, sid):
        async with sem:
            if time.monotonic() > deadline:
                stream.status = 0  # not attempted: the server could not keep up
                return
            try:
                await stream.open(port, token, sid)
            except (TimeoutError, OSError, asyncio.IncompleteReadError):
                stream.status = -1

    await asyncio.gather(*(one(s, t, sid) for s, (t, sid) in zip(streams, sessions, strict=True)))
    return streams


async def stream_level(env, tokens, n, hold, open_timeout):
    server = Server(env, max(n, 1024), f"get-{n}")
    try:
        t0 = time.monotonic()
        sessions = await open_sessions(server.url, tokens, n)
        t_sessions = time.monotonic() - t0
        await asyncio.sleep(2)
        rss0 = server.rss()
        t0 = time.monotonic()
        streams = await open_streams(server.port, sessions, open_timeout)
        t_open = time.monotonic() - t0
        opened = [s for s in streams if s.status == 200]
        await asyncio.sleep(TICK + 1)  # every stream has had its first tick
        start, cpu0 = time.monotonic(), server.cpu()
        await asyncio.sleep(hold)
        end, cpu1 = time.monotonic(), server.cpu()
        rss1 = server.rss()
        gaps, silent = [], 0
        for s in opened:
            beats = [b for b in s.beats if start <= b <= end]
            if not beats:
                silent += 1
            gaps += [b - a - TICK for a, b in itertools.pairwise(beats)]
        # SIGTERM with every stream live: each should get its session_terminated close frame.
        killed = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        while server.proc.poll() is None and time.monotonic() - killed < 60:
            await asyncio.sleep(0.01)  # the readers keep stamping arrivals meanwhile
        exit_s = time.monotonic() - killed
        await asyncio.sleep(0.5)
        closes = [s.closed_at - killed for s in opened if s.closed_at]
        result = {
            "streams": n, "opened": len(opened), "failed": sum(1 for s in streams if s.status not in (0, 200)),
            "not_attempted": sum(1 for s in streams if s.status == 0),
            "sessions_s": round(t_sessions, 2), "open_s": round(t_open, 2),
            "rss_before_mib": round(rss0 / 2**20, 1), "rss_after_mib": round(rss1 / 2**20, 1),
            "kib_per_stream": round((rss1 - rss0) / max(len(opened), 1) / 1024, 1),
            "cpu_pct": round(100 * (cpu1 - cpu0) / (end - start), 1),
            "heartbeat_gaps": len(gaps), "silent_streams": silent,
            "late_p50_ms": round(1000 * pct(gaps, 50), 1) if gaps else None,
            "late_p99_ms": round(1000 * pct(gaps, 99), 1) if gaps else None,
            "late_max_ms": round(1000 * max(gaps), 1) if gaps else None,
            "shutdown_close_frames": len(closes),
            "shutdown_close_p99_ms": round(1000 * pct(closes, 99), 1) if closes else None,
            "shutdown_exit_s": round(exit_s, 2),
        }
        for s in streams:
            s.close()
        return result
    finally:
        server.stop()


# --- part 2: progress latency -------------------------------------------------------------------

def sse_frames(text):
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: ") and len(line) > 6:
                yield json.loads(line[6:])


async def streamed_call(client, url, token, sid, rid):
    body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
            "params": {"name": "execute_instruction", "arguments": {"plugin": "os", "action": "info"},
                       "_meta": {"progressToken": f"b{rid}"}}}
    arrivals, final, buf = [], None, ""
    async with client.stream("POST", url, json=body, headers=headers(token, sid)) as r:
        assert r.headers["content-type"] == "text/event-stream", r.headers
        async for chunk in r.aiter_text():
            now = time.time()
            buf += chunk
            *blocks, buf = buf.split("\n\n")
            for frame in sse_frames("\n\n".join(blocks)):
                if frame.get("method") == "notifications/progress":
                    arrivals.append((frame["params"]["progress"], frame["params"]["total"], now))
                elif frame.get("id") == rid:
                    final = frame
    return arrivals, final


async def call_json(client, url, token, sid, rid, name, arguments):
    body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    r = await client.post(url, json=body, headers=headers(token, sid, accept="application/json"))
    return r.json()["result"]["structuredContent"]


async def latency_runs(url, token, runs, agents):
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=150)) as client:
        (_, sid), = await open_sessions(url, [token], 1)
        latencies, totals, rid = [], [], 1000
        for i in range(runs + 2):
            rid += 1
            arrivals, final = await streamed_call(client, url, token, sid, rid)
            eid = final["result"]["structuredContent"]["execution_id"]
            assert final["result"]["structuredContent"]["agents_responded"] == agents, final
            rid += 1
            rows = (await call_json(client, url, token, sid, rid, "query_responses",
                                    {"execution_id": eid, "limit": 1000}))["responses"]
            stamps = sorted(datetime.fromisoformat(r["timestamp"]).timestamp() for r in rows)
            if i < 2:
                continue  # warm-up
            values = [p for p, _, _ in arrivals]
            assert values == sorted(set(values)) and values[-1] == agents, values
            for k, stamp in enumerate(stamps, start=1):
                seen = next(at for p, _, at in arrivals if p >= k)
                latencies.append(seen - stamp)
            totals.append(len(arrivals))
        return latencies, totals


async def wait_connected(url, token, count, timeout=120):
    async with httpx.AsyncClient(timeout=30) as client:
        (_, sid), = await open_sessions(url, [token], 1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = await call_json(client, url, token, sid, 1, "list_agents", {"connected": True, "limit": 1000})
            if got["count"] >= count:
                return
            await asyncio.sleep(0.5)
    raise RuntimeError(f"only {got['count']} of {count} agents connected")


async def latency_part(env, tokens, device_token, agents, runs, load_streams):
    server = Server(env, max(load_streams, 1024), "latency")
    swarm_log = open(env.var_dir / "swarm.log", "w")
    swarm = subprocess.Popen([PY, "manage.py", "agent_swarm", "--count", str(agents), "--server",
                              f"ws://127.0.0.1:{server.port}", "--token", device_token,
                              "--state-dir", str(env.var_dir / "swarm")], cwd=ROOT, env=env.env, stdout=swarm_log,
                             stderr=subprocess.STDOUT)
    # With Redis an execution is dispatched by a Celery worker (embedded: eagerly, inside daphne), as under `serve`.
    worker = subprocess.Popen([PY, "-m", "celery", "-A", "yuzu", "worker", "-l", "warning", "--concurrency", "2"],
                              cwd=ROOT, env=env.env, stdout=open(env.var_dir / "celery.log", "w"),
                              stderr=subprocess.STDOUT) if env.env.get("YUZU_REDIS_URL") else None
    held = []
    try:
        await wait_connected(server.url, tokens[0], agents)
        idle, idle_frames = await latency_runs(server.url, tokens[0], runs, agents)
        sessions = await open_sessions(server.url, tokens[1:], load_streams)
        held = await open_streams(server.port, sessions, 600)
        opened = sum(1 for s in held if s.status == 200)
        await asyncio.sleep(TICK + 1)
        loaded, loaded_frames = await latency_runs(server.url, tokens[0], runs, agents)
        return {"agents": agents, "runs": runs, "load_streams": opened,
                "idle": summarize(idle, idle_frames), "loaded": summarize(loaded, loaded_frames)}
    finally:
        for s in held:
            s.close()
        for p in (swarm, worker):
            if p is not None:
                p.terminate()
                p.wait(20)
        server.stop()


def summarize(latencies, frames):
    return {"responses": len(latencies), "p50_ms": round(1000 * pct(latencies, 50), 1),
            "p99_ms": round(1000 * pct(latencies, 99), 1), "max_ms": round(1000 * max(latencies), 1),
            "frames_per_call": round(statistics.mean(frames), 1)}


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ratio(a, b):
    return round(a / b, 2) if a is not None and b else None


def report(machine, levels, latency):
    base = levels[0]
    lines = [f"machine: {machine}", "",
             "| streams | opened | KiB/stream | CPU % | heartbeat late p50 / p99 / max (ms) | silent | "
             "KiB ratio | p99 ratio | SIGTERM: close frames, p99, exit |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for lv in levels:
        kib_ratio = ratio(lv["kib_per_stream"], base["kib_per_stream"])
        late_ratio = ratio(lv["late_p99_ms"], base["late_p99_ms"])
        lines.append(
            f"| {lv['streams']} | {lv['opened']} | {lv['kib_per_stream']} | {lv['cpu_pct']} | "
            f"{lv['late_p50_ms']} / {lv['late_p99_ms']} / {lv['late_max_ms']} | {lv['silent_streams']} | "
            f"{kib_ratio}x | {late_ratio}x | {lv['shutdown_close_frames']}/{lv['opened']}, "
            f"{lv['shutdown_close_p99_ms']} ms, {lv['shutdown_exit_s']} s |")
    if latency:
        idle, held = latency["idle"], latency["loaded"]

        def row(label, x):
            return (f"| {label} | {x['responses']} | {x['p50_ms']} | {x['p99_ms']} | {x['max_ms']} | "
                    f"{x['frames_per_call']} |")

        lines += ["", f"progress latency, {latency['agents']} swarm agents, {latency['runs']} calls each:",
                  "| | responses | p50 ms | p99 ms | max ms | frames/call |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |",
                  row("idle (reference)", idle), row(f"{latency['load_streams']} GET streams held", held),
                  f"| ratio held / idle | | {ratio(held['p50_ms'], idle['p50_ms'])}x | "
                  f"{ratio(held['p99_ms'], idle['p99_ms'])}x | | |"]
    return "\n".join(lines)


async def main_async(a, env):
    # Every level, and the latency part, gets tokens of its own: with Redis the sessions outlive the daphne that
    # opened them (they are shared, by design), and a principal may hold 8 (PER_PRINCIPAL_CAP).
    per_level = [(n + 3) // 4 for n in a.levels]
    for_latency = 1 + (a.load_streams + 3) // 4
    setup = json.loads(env.run([PY, "-c", SETUP, str(sum(per_level) + for_latency)]))
    env.session_cap = sum(a.levels) + a.load_streams + 64  # every session the run opens may still be live in Redis
    tokens = iter(setup["tokens"])

    def take(k):
        return [next(tokens) for _ in range(k)]

    levels = []
    for n, k in zip(a.levels, per_level, strict=True):
        print(f"GET streams: {n} …", file=sys.stderr, flush=True)
        levels.append(await stream_level(env, take(k), n, a.hold, a.open_timeout))
        print(json.dumps(levels[-1]), file=sys.stderr, flush=True)
    latency = None
    if a.runs:
        print("progress latency …", file=sys.stderr, flush=True)
        latency = await latency_part(env, take(for_latency), setup["device_token"], a.agents, a.runs,
                                     a.load_streams)
        print(json.dumps(latency), file=sys.stderr, flush=True)
    return levels, latency


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", type=int, nargs="+", default=[100, 1000, 5000])
    ap.add_argument("--hold", type=float, default=30, help="seconds of idle streams measured per level")
    ap.add_argument("--open-timeout", type=float, default=240,
                    help="seconds allowed for opening a level's streams; the rest are reported as not attempted")
    ap.add_argument("--agents", type=int, default=100, help="swarm agents for the latency part")
    ap.add_argument("--runs", type=int, default=20,
                    help="streamed execute_instruction calls per latency phase (0: skip)")
    ap.add_argument("--load-streams", type=int, default=1000, help="GET streams held during the loaded latency phase")
    ap.add_argument("--no-pin", action="store_true",
                    help="let the daphne run on any CPU (`manage.py serve` pins it to one: docs/running.md)")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (database, daphne logs)")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * max(a.levels + [a.load_streams]) + 1024
    if soft < need:  # daphne inherits it: one socket per stream on each side
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(need, soft), hard), hard))
    var_dir = Path(tempfile.mkdtemp(prefix="yuzu-bench-streams-"))
    env = Env(var_dir)
    env.cpus = set(pinned_cpus(1, not a.no_pin)) or None
    machine = (f"{cpu_model()}, {psutil.cpu_count()} CPUs, "
               f"{round(psutil.virtual_memory().total / 2**30)} GiB RAM, Linux {platform.release()}, "
               f"Python {platform.python_version()}, "
               f"{'PostgreSQL' if os.environ.get('YUZU_DATABASE_URL') else 'SQLite'}, "
               f"{'Redis layer' if os.environ.get('YUZU_REDIS_URL') else 'in-process layer'}, "
               f"RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}, "
               f"{f'daphne on CPU {min(env.cpus)}' if env.cpus else 'daphne on any CPU'}")
    try:
        env.run([PY, "manage.py", "migrate", "--noinput", "-v0"])
        levels, latency = asyncio.run(main_async(a, env))
    finally:
        if not a.keep:
            import shutil

            shutil.rmtree(var_dir, ignore_errors=True)
        else:
            print(f"kept {var_dir}", file=sys.stderr)
    print(report(machine, levels, latency))
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": machine, "levels": levels, "latency": latency}, indent=1))


if __name__ == "__main__":
    main()
