"""Benchmark `tools/call list_agents` (50 agents) on yuzu's daphne against the official Python SDK's
reference server (`MCPServer`, mcp 2.3.0) in the same run. See README.md beside this file.

    .venv/bin/python bench/mcp_calls/run.py [--duration 9] [--rounds 3] [--agents 50] [--concurrency 1 16]

Ours runs the real path: bearer-token auth, session check, the tools/call pipeline (tier, schema, RBAC),
the ORM query, and one audit row per call. The reference serves the same 50 rows from memory. Both get
byte-identical JSON-RPC bodies (only the id differs) over HTTP/1.1 keep-alive, one connection per worker,
each worker with its own session opened by an initialize handshake. The load comes from wrk (C, one thread
per connection; `--generator wrk`, the default) or from this process (asyncio + httpx, `--generator httpx`),
which costs about as much CPU per request as the reference server itself.

The database is a fresh SQLite file under a temp dir (migrate + a bootstrap-like set-up), or the
database named by YUZU_DATABASE_URL when that is set. Every loop is bounded by time and by count.
"""

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MCP_PY = ROOT / ".venv-mcp" / "bin" / "python"
PROTOCOL = "2025-11-25"
ACCEPT = "application/json, text/event-stream"

SETUP = r"""
import json, sys
from datetime import timedelta
import django
django.setup()
from django.contrib.auth import get_user_model
from django.utils import timezone
from fleet.models import Agent
from fleet.services import agent_view
from yuzu.models import ApiToken
from yuzu.rbac import assign_role, seed_builtin_roles

n_agents, n_tokens = int(sys.argv[1]), int(sys.argv[2])
seed_builtin_roles()
User = get_user_model()
user = User.objects.filter(username="bench-operator").first() or User.objects.create_user("bench-operator")
assign_role(user, "Operator")
oses = ["linux", "windows", "darwin"]
for i in range(n_agents):
    Agent.objects.update_or_create(agent_id=f"bench-agent-{i:03d}", defaults=dict(
        hostname=f"bench-host-{i:03d}.example.test", os=oses[i % 3], arch="x86_64", agent_version="1.4.2",
        connected=i % 4 != 0, last_seen=timezone.now(), quarantined=i % 17 == 0))
tokens = [ApiToken.mint(user, f"bench-{i}", mcp_tier="operator", expires_at=timezone.now() + timedelta(days=1))[1]
          for i in range(n_tokens)]
agents = [agent_view(a) for a in Agent.objects.order_by("agent_id")]
print(json.dumps({"tokens": tokens, "agents": agents, "total_agents": len(agents)}, default=str))
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Every call's JSON-RPC body; only the id differs (wrk's script formats the same text).
CALL_BODY = '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"list_agents","arguments":{}}}'


def call_body(n):
    return (CALL_BODY % n).encode()


def rest_headers(token):
    return {"authorization": f"Bearer {token}", "accept": "application/json"}


def headers(token=None, sid=None):
    h = {"content-type": "application/json", "accept": ACCEPT}
    if token:
        h["authorization"] = f"Bearer {token}"
    if sid:
        h["mcp-session-id"] = sid
        h["mcp-protocol-version"] = PROTOCOL
    return h


async def open_session(client, url, token):
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}
    r = await client.post(url, json=init, headers=headers(token))
    r.raise_for_status()
    sid = r.headers["mcp-session-id"]
    r = await client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers(token, sid))
    assert r.status_code == 202, r.status_code
    return sid


class Cell:
    """One measurement: a server at a concurrency level, over every slice (round) it was given."""

    def __init__(self):
        self.latencies = []
        self.errors = 0
        self.issued = 0
        self.checked = None
        self.elapsed = 0.0
        self.served = 0  # every answered request, warm-up included (for CPU per request)
        self.cpu = 0.0  # the server's CPU seconds over its slices
        self.switches = 0  # the server's threads' context switches over its slices
        self.services = 0.0  # PostgreSQL's and Redis's CPU seconds over its slices
        self.generator = 0.0  # this process's CPU seconds over its slices (the load generator's own)
        self.rounds = []  # req/s of each slice
        self.histogram = {}  # wrk: latency in µs -> responses (each slice's quantiles, weighted by its responses)

    def answered(self):
        """Responses counted as answered: every measured response but the errors."""
        return round(sum(self.histogram.values())) - self.errors if self.histogram else len(self.latencies)

    def quantile(self, q):
        """Seconds; from the latencies (httpx) or wrk's histogram."""
        if not self.histogram:
            lat = sorted(self.latencies)
            return (statistics.quantiles(lat, n=100) if len(lat) >= 2 else lat * 99)[round(q * 100) - 1]
        rank, seen = q * sum(self.histogram.values()), 0
        for us in sorted(self.histogram):
            seen += self.histogram[us]
            if seen >= rank:
                return us / 1e6
        return 0.0

    def summary(self):
        n = self.answered()
        per_req = 1000 / max(1, self.served)
        return {"requests": n, "errors": self.errors, "seconds": round(self.elapsed, 3),
                "rps": n / self.elapsed if self.elapsed else 0.0, "p50_ms": self.quantile(0.50) * 1000,
                "p99_ms": self.quantile(0.99) * 1000, "agents_in_result": self.checked,
                "cpu_ms_per_req": self.cpu * per_req, "switches_per_req": self.switches * per_req / 1000,
                "services_ms_per_req": self.services * per_req, "generator_ms_per_req": self.generator * per_req,
                "rounds_rps": self.rounds}


async def worker(url, token, cell, deadline, max_requests, warmup_until, counter):
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
        sid = await open_session(client, url, token)
        h = headers(token, sid)
        try:
            while time.perf_counter() < deadline and cell.issued < max_requests:
                counter[0] += 1
                body = call_body(counter[0])
                t0 = time.perf_counter()
                r = await client.post(url, content=body, headers=h)
                dt = time.perf_counter() - t0
                cell.served += 1
                ok = r.status_code == 200 and b'"result"' in r.content and b'"isError":true' not in r.content
                if ok and cell.checked is None:
                    cell.checked = len(r.json()["result"]["structuredContent"]["agents"])
                if t0 < warmup_until:
                    continue
                cell.issued += 1
                if ok:
                    cell.latencies.append(dt)
                else:
                    cell.errors += 1
        finally:
            await client.delete(url, headers=h)


async def rest_worker(url, token, cell, deadline, max_requests, warmup_until, counter):
    """GET /api/v1/agents: the REST face of the same capability (same service function, same checks but the
    MCP session and the audit row: a read through REST is not audited)."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    h = rest_headers(token)
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
        while time.perf_counter() < deadline and cell.issued < max_requests:
            t0 = time.perf_counter()
            r = await client.get(url, headers=h)
            dt = time.perf_counter() - t0
            cell.served += 1
            ok = r.status_code == 200 and b'"agent_id"' in r.content
            if ok and cell.checked is None:
                cell.checked = len(r.json()["data"])
            if t0 < warmup_until:
                continue
            cell.issued += 1
            if ok:
                cell.latencies.append(dt)
            else:
                cell.errors += 1


async def measure(cell, url, tokens, concurrency, duration, warmup, max_requests):
    """One slice: ``warmup`` seconds not counted, then ``duration`` seconds counted into ``cell``."""
    start = time.perf_counter()
    warmup_until = start + warmup
    deadline = warmup_until + duration
    counter = [0]
    work = rest_worker if is_rest(url) else worker
    before = len(cell.latencies)
    await asyncio.gather(*(work(url, tokens[i % len(tokens)], cell, deadline, max_requests, warmup_until, counter)
                           for i in range(concurrency)))
    elapsed = min(time.perf_counter(), deadline) - warmup_until
    cell.elapsed += elapsed
    cell.rounds.append((len(cell.latencies) - before) / elapsed if elapsed > 0 else 0.0)


# wrk's script: one thread per connection, each with its own token and (MCP) session; every response is checked as
# the httpx workers check it; done() prints the counts and the latency (µs) at every 0.1 % of the distribution.
WRK_LUA = r"""
local conns = {%(conns)s}
local threads, n = {}, 0
function setup(thread)
  n = n + 1
  thread:set("token", conns[n][1]); thread:set("sid", conns[n][2])
  table.insert(threads, thread)
end
local mcp = %(mcp)s
errors, counter = 0, 0
function request()
  local h = {["Accept"] = mcp and "%(accept)s" or "application/json", ["Authorization"] = "Bearer " .. token}
  if not mcp then return wrk.format("GET", nil, h) end
  counter = counter + 1
  h["Content-Type"] = "application/json"; h["Mcp-Session-Id"] = sid; h["Mcp-Protocol-Version"] = "%(protocol)s"
  return wrk.format("POST", nil, h, string.format('%(body)s', counter))
end
function response(status, headers, body)
  local ok
  if mcp then ok = body:find('"result"', 1, true) and not body:find('"isError":true', 1, true)
  else ok = body:find('"agent_id"', 1, true) end
  if status ~= 200 or not ok then errors = errors + 1 end
end
function done(summary, latency, requests)
  local errs = summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  for _, t in ipairs(threads) do errs = errs + t:get("errors") end
  local q = {}
  for i = 0, 999 do q[#q + 1] = latency:percentile(i / 10 + 0.05) end
  io.write(string.format("WRK %%d %%d %%d %%s\n", summary.requests, summary.duration, errs, table.concat(q, ",")))
end
"""


def run_wrk(url, conns, seconds, script):
    """One wrk run of ``seconds`` (whole seconds: wrk takes no fraction); (requests, seconds, errors, histogram)."""
    seconds = max(1, round(seconds))
    script.write_text(WRK_LUA % {
        "conns": ", ".join(f'{{"{token}", "{sid}"}}' for token, sid in conns), "mcp": "false" if is_rest(url) else "true",
        "accept": ACCEPT, "protocol": PROTOCOL, "body": CALL_BODY})
    c = str(len(conns))
    out = subprocess.run(["wrk", "-t", c, "-c", c, "-d", f"{seconds}s", "--timeout", "30s", "-s", str(script), url],
                         capture_output=True, text=True, timeout=seconds + 60)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("WRK ")), None)
    if line is None:
        raise SystemExit(f"wrk gave no result:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    _, requests, micros, errors, quantiles = line.split(" ")
    histogram = {}  # each of the 1,000 quantiles stands for a thousandth of the run's responses
    for us in quantiles.split(","):
        histogram[int(float(us))] = histogram.get(int(float(us)), 0) + int(requests) / 1000
    return int(requests), int(micros) / 1e6, int(errors), histogram


async def wrk_connections(url, tokens, concurrency, cell):
    """(token, session id) per connection, every session opened by an initialize handshake (no session for REST);
    one checked request shows how many agents a result carries."""
    conns = []
    async with httpx.AsyncClient(timeout=30.0) as client:
        for i in range(concurrency):
            token = tokens[i % len(tokens)]
            conns.append((token, "" if is_rest(url) else await open_session(client, url, token)))
        if cell.checked is None:
            token, sid = conns[0]
            if is_rest(url):
                r = await client.get(url, headers=rest_headers(token))
                cell.checked = len(r.json()["data"])
            else:
                r = await client.post(url, content=call_body(1 << 30), headers=headers(token, sid))
                cell.checked = len(r.json()["result"]["structuredContent"]["agents"])
    return conns


async def close_sessions(url, conns):
    async with httpx.AsyncClient(timeout=30.0) as client:
        for token, sid in conns:
            if sid:
                await client.delete(url, headers=headers(token, sid))


def measure_wrk(cell, url, tokens, concurrency, duration, warmup, script):
    """One slice driven by wrk: ``warmup`` seconds (a run of its own, not counted), then ``duration`` seconds."""
    conns = asyncio.run(wrk_connections(url, tokens, concurrency, cell))
    try:
        if warmup > 0:
            cell.served += run_wrk(url, conns, warmup, script)[0]
        requests, seconds, errors, histogram = run_wrk(url, conns, duration, script)
    finally:
        asyncio.run(close_sessions(url, conns))
    cell.served += requests
    cell.errors += errors
    for us, count in histogram.items():
        cell.histogram[us] = cell.histogram.get(us, 0) + count
    cell.elapsed += seconds
    cell.rounds.append((requests - errors) / seconds if seconds > 0 else 0.0)


def is_rest(url):
    return url.endswith("/api/v1/agents")


def measured(proc, only=None):
    """A process and its descendants (``only``: those whose command line has it — serve's daphnes, not its idle
    background workers)."""
    try:
        root = psutil.Process(proc.pid)
        family = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in family:
        try:
            if not only or only in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def cpu_seconds(proc, only=None):
    """User + system CPU of the ``measured`` processes."""
    total = 0.0
    for p in measured(proc, only):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def switches(proc, only=None):
    """Context switches (voluntary and not) of every thread of the ``measured`` processes: a thread that lets the
    GIL go while another waits for it costs two. Linux counts them per thread (/proc/PID/task/TID/status)."""
    total = 0
    for p in measured(proc, only):
        try:
            for tid in os.listdir(f"/proc/{p.pid}/task"):
                with open(f"/proc/{p.pid}/task/{tid}/status") as f:
                    total += sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
        except OSError:  # the process or thread has gone
            pass
    return total


def generator_cpu():
    """This process's CPU seconds and its finished children's (wrk's runs)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def service_cpu(names):
    """User + system CPU seconds, by pid, of every process on the machine named in ``names`` (``postgres``,
    ``redis-server``: the services our side is configured with): what they spend on our requests. The
    reference uses neither; its rows show what the services spend meanwhile on nothing of ours."""
    cpu = {}
    for p in psutil.process_iter(["name", "cpu_times"]):
        t = p.info["cpu_times"]
        if p.info["name"] in names and t is not None:
            cpu[p.pid] = t.user + t.system
    return cpu


def server_env(var_dir):
    """The environment a measured server runs in: this one's, with its var dir (and its SQLite file, when no
    YUZU_DATABASE_URL names PostgreSQL) under ``var_dir``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(DJANGO_SETTINGS_MODULE="yuzu.settings", YUZU_VAR_DIR=str(var_dir), YUZU_LOG_LEVEL="WARNING",
               PYTHONUNBUFFERED="1")
    if not env.get("YUZU_DATABASE_URL"):
        env["YUZU_SQLITE_PATH"] = str(Path(var_dir) / "bench.sqlite3")
    return env


def reference_command(port, agents):
    """The SDK's reference server (.venv-mcp) on ``port``, serving the list_agents rows in the file ``agents``."""
    return [str(MCP_PY), str(HERE / "reference_server.py"), "--port", str(port), "--agents", str(agents)]


def reference_env(env):
    """The reference server's environment: ``env`` without Django's and yuzu's settings."""
    return {k: v for k, v in env.items() if not k.startswith(("DJANGO_", "YUZU_", "ANTHROPIC_"))}


def check_base(ap, rev):
    """--base REV: refused at once, before any set-up, unless REV names a commit of this repository."""
    if rev and subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=ROOT,
                              capture_output=True).returncode:
        ap.error(f"--base {rev}: not a commit of this repository")


def add_worktree(rev, path):
    subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT, check=True, capture_output=True)


def remove_worktree(path):
    if Path(path).exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, capture_output=True)


def wait_ready(proc, probe, what, log, timeout=120):  # a loaded machine starts slowly
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited early:\n{Path(log).read_text()[-3000:]}")
        try:
            if probe():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not become ready in {timeout}s")


def stop(proc):
    if proc is not None and proc.poll() is None:
        proc.terminate()  # serve stops everything it started
        try:
            proc.wait(45)
        except subprocess.TimeoutExpired:
            proc.kill()


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")).split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{cpu}, {os.cpu_count()} CPUs{mem}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def ratio(o, r):
    """Cell ``o`` against cell ``r``: each figure's ratio (None where ``r`` has none)."""
    def div(a, b):
        return a / b if b else None

    return {"rps": div(o["rps"], r["rps"]),
            "rps_rounds": [div(ours, ref) for ours, ref in zip(o["rounds_rps"], r["rounds_rps"], strict=True)],
            "p50": div(o["p50_ms"], r["p50_ms"]), "p99": div(o["p99_ms"], r["p99_ms"]),
            "cpu": div(o["cpu_ms_per_req"], r["cpu_ms_per_req"]),
            "cpu_services": div(o["cpu_ms_per_req"] + o["services_ms_per_req"],
                                r["cpu_ms_per_req"] + r["services_ms_per_req"])}


def main():
    ap = argparse.ArgumentParser(description="tools/call list_agents: yuzu vs the mcp 2.3.0 reference server")
    ap.add_argument("--agents", type=int, default=50)
    ap.add_argument("--duration", type=float, default=9.0,
                    help="measured seconds per cell (after warm-up; with wrk, each slice a whole number of seconds)")
    ap.add_argument("--rounds", type=int, default=3, help="slices per cell, the servers taking turns")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds per slice not counted")
    ap.add_argument("--max-requests", type=int, default=200_000, help="hard cap per cell")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--processes", type=int, help="server processes (serve --processes); default: serve's own")
    ap.add_argument("--generator", choices=["wrk", "httpx"], default="wrk",
                    help="the load: wrk (C, `apt-get install wrk`) or this process (asyncio + httpx)")
    ap.add_argument("--base", metavar="REV",
                    help="also serve the tree at git revision REV (a worktree; same database, same tokens) and take "
                         "turns with it: this tree's tools/call against REV's in one run, for an A/B of a change")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    check_base(ap, a.base)
    if a.generator == "wrk" and not shutil.which("wrk"):
        raise SystemExit("wrk is not installed: `apt-get install wrk` (Debian), or run with --generator httpx")
    if not MCP_PY.exists():
        raise SystemExit(f"{MCP_PY} is missing: run `make test-deps` (it builds .venv-mcp with mcp==2.3.0)")

    tmp = Path(tempfile.mkdtemp(prefix="yuzu-bench-"))
    env = server_env(tmp)
    database = "PostgreSQL (YUZU_DATABASE_URL)" if env.get("YUZU_DATABASE_URL") else "SQLite (temp file, WAL)"
    database += ", Redis (YUZU_REDIS_URL)" if env.get("YUZU_REDIS_URL") else ", in-process layer"
    services = {"postgres"} if env.get("YUZU_DATABASE_URL") else set()
    services |= {"redis-server"} if env.get("YUZU_REDIS_URL") else set()
    ours = ref = base = None
    base_tree = tmp / "base-tree"
    load_before = f"{os.getloadavg()[0]:.2f}"
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
        n_tokens = max(a.concurrency)
        out = subprocess.run([sys.executable, "-c", SETUP, str(a.agents), str(n_tokens)], cwd=ROOT, env=env,
                             check=True, capture_output=True, text=True).stdout
        setup = json.loads(out.strip().splitlines()[-1])
        tokens, agents = setup["tokens"], setup["agents"]
        (tmp / "agents.json").write_text(json.dumps(agents))

        p_ours, p_ref = free_port(), free_port()
        ours_url = f"http://127.0.0.1:{p_ours}/mcp/v1/"
        rest_url = f"http://127.0.0.1:{p_ours}/api/v1/agents"
        ref_url = f"http://127.0.0.1:{p_ref}/mcp"
        log_ours, log_ref = tmp / "daphne.log", tmp / "reference.log"
        # the server as `make run` starts it: `manage.py serve` (one daphne per core with Redis, one embedded,
        # plus the background workers), without the local agent
        processes = ["--processes", str(a.processes)] if a.processes else []
        serve = [sys.executable, "manage.py", "serve", "--no-agent"] + processes
        ours = subprocess.Popen(serve, cwd=ROOT, env={**env, "YUZU_BIND": f"127.0.0.1:{p_ours}"},
                                stdout=open(log_ours, "w"), stderr=subprocess.STDOUT)
        ref = subprocess.Popen(reference_command(p_ref, tmp / "agents.json"), cwd=tmp, env=reference_env(env),
                               stdout=open(log_ref, "w"), stderr=subprocess.STDOUT)
        if a.base:  # the same serve from REV's tree, with no second celery beat writing the same schedule file
            add_worktree(a.base, base_tree)
            p_base = free_port()
            base = subprocess.Popen(serve + ["--no-beat"],
                                    cwd=base_tree, env={**env, "YUZU_BIND": f"127.0.0.1:{p_base}"},
                                    stdout=open(tmp / "base.log", "w"), stderr=subprocess.STDOUT)
            wait_ready(base, lambda: httpx.get(f"http://127.0.0.1:{p_base}/healthz", timeout=1).status_code == 200,
                       f"daphne ({a.base})", tmp / "base.log")
        wait_ready(ours, lambda: httpx.get(f"http://127.0.0.1:{p_ours}/healthz", timeout=1).status_code == 200,
                   "daphne", log_ours)
        wait_ready(ref, lambda: httpx.get(ref_url, timeout=1).status_code < 500, "reference server", log_ref)

        # Each cell is measured in --rounds slices, the servers taking turns (the order rotating every round),
        # so that a machine whose speed drifts within minutes (a shared VM) slows both sides alike.
        # With --base, REV's tree serves the REST cell too: a daphne that has just served REST answers the next
        # tools/call slice slower (the same tree against itself read 0.91x when only one side served REST, 0.99x
        # with neither), so both trees serve the same mix.
        names = ("yuzu", "reference", "yuzu-rest") + (("base", "base-rest") if a.base else ())
        cells = {(name, c): Cell() for c in a.concurrency for name in names}
        urls = {"yuzu": ours_url, "reference": ref_url, "yuzu-rest": rest_url}
        if a.base:
            urls["base"] = f"http://127.0.0.1:{p_base}/mcp/v1/"
            urls["base-rest"] = f"http://127.0.0.1:{p_base}/api/v1/agents"
        procs = {"reference": (ref, None), "base": (base, "daphne"), "base-rest": (base, "daphne")}
        for c in a.concurrency:
            for k in range(a.rounds):
                for name in names[k % len(names):] + names[:k % len(names)]:
                    cell = cells[(name, c)]
                    proc, only = procs.get(name, (ours, "daphne"))
                    cpu0, svc0, sw0 = cpu_seconds(proc, only), service_cpu(services), switches(proc, only)
                    gen0 = generator_cpu()
                    if a.generator == "wrk":
                        measure_wrk(cell, urls[name], tokens, c, a.duration / a.rounds, a.warmup, tmp / "wrk.lua")
                    else:
                        asyncio.run(measure(cell, urls[name], tokens, c, a.duration / a.rounds, a.warmup,
                                            a.max_requests))
                    # server CPU per answered request, warm-up included on both counts: on a shared machine
                    # this ratio moves far less than req/s does
                    cell.cpu += cpu_seconds(proc, only) - cpu0
                    cell.switches += switches(proc, only) - sw0
                    cell.services += sum(t - svc0.get(pid, 0.0) for pid, t in service_cpu(services).items())
                    cell.generator += generator_cpu() - gen0
        results = {key: cell.summary() for key, cell in cells.items()}
    finally:
        stop(ours)
        stop(ref)
        stop(base)
        remove_worktree(base_tree)
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"tools/call list_agents — {setup['total_agents']} agents in the database ({database}); "
          f"{a.duration:g}s per cell in {a.rounds} slice(s), the servers taking turns, each after {a.warmup:g}s "
          f"of warm-up; load from {a.generator}")
    print(f"machine: {machine()}; load average before: {load_before}, after: {os.getloadavg()[0]:.2f}")
    print(f"server: {' '.join(serve[1:])}" + (f"; base: the same at {a.base} (without celery beat)" if a.base else ""))
    print(f"{'server':<10} {'conns':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'requests':>9} {'errors':>6} "
          f"{'agents':>6} {'CPU ms/req':>10} {'+db+redis':>10} {'cs/req':>7}")
    for (name, c), r in results.items():
        print(f"{name:<10} {c:>5} {r['rps']:>9.1f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['requests']:>9} "
              f"{r['errors']:>6} {r['agents_in_result']!s:>6} {r['cpu_ms_per_req']:>10.2f} "
              f"{r['cpu_ms_per_req'] + r['services_ms_per_req']:>10.2f} {r['switches_per_req']:>7.1f}")
    print("the load generator's own CPU ms/req: " + ", ".join(
        f"{name} {r['generator_ms_per_req']:.2f} ({c})" for (name, c), r in results.items()))
    print("\nratio ours/reference (req/s: higher is better for us; latency and CPU: lower is better for us);"
          "\nreq/s of each round's slices in brackets; CPU+: with PostgreSQL's and Redis's CPU on both sides")
    ratios = {}
    comparisons = [(f"{name}@{c}", f"  {name:<9} {c:>2} conn", results[(name, c)], results[("reference", c)])
                   for c in a.concurrency for name in ("yuzu", "yuzu-rest")]
    comparisons += [(f"{ours}-vs-base@{c}", f"  {ours} vs base ({a.base}) {c:>2} conn", results[(ours, c)],
                     results[(base_name, c)]) for c in (a.concurrency if a.base else ())
                    for ours, base_name in (("yuzu", "base"), ("yuzu-rest", "base-rest"))]
    for key, label, o, r in comparisons:
        ratios[key] = x = ratio(o, r)
        spread = " ".join(f"{v:.2f}" for v in x["rps_rounds"] if v is not None)
        print(f"{label}: req/s x{x['rps']:.2f} [{spread}]   p50 x{x['p50']:.2f}   p99 x{x['p99']:.2f}   "
              f"CPU/req x{x['cpu']:.2f}   CPU+ x{x['cpu_services']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": machine(), "database": database, "agents": setup["total_agents"],
                                            "results": {f"{n}@{c}": r for (n, c), r in results.items()},
                                            "ratios": ratios,
                                            "server": serve[1:], "generator": a.generator,
                                            "load": [load_before, os.getloadavg()[0]]}, indent=2))
    bad = [k for k, r in results.items() if r["errors"] or not r["requests"]]
    if bad:
        print(f"\nerrors in: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
