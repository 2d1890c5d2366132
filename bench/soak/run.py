"""Soak: mixed load for a while on PostgreSQL + Redis with two server processes, sampled over time (issue 22).

    .venv/bin/python bench/soak/run.py [--minutes 60] [--agents 1000] [--streams 500] [--mcp-clients 4]
                                       [--exec-every 20] [--sample-every 30] [--json FILE]

Starts its own services (tests/faults/services.py: a private PostgreSQL 15 cluster and a private redis-server
on free ports — never the shared ones), two daphne processes on two ports, one Celery worker (+ beat for the
sweep), and `manage.py agent_swarm` agents split over the two servers. Then, until the time is up:

- MCP clients: 2026-07-28 `tools/call` (list_agents, list_executions, query_responses) in a loop, alternating
  servers; every latency and status recorded;
- an execution (os.info) to every agent every --exec-every seconds, alternating servers (REST);
- --streams handshake-era sessions, each holding a GET stream open (re-opened when closed), alternating servers.

Every --sample-every seconds, per daphne: RSS (MiB) and open file descriptors; the cluster: PostgreSQL
connections to the database, Redis channel-layer groups (`asgi:group:*` keys) and connected clients; the
interval's MCP latency percentiles, request count and 5xx/transport errors; executions started / succeeded.
The table is printed as it goes and written to --json. At the end: memory growth per process (last sample vs the
first one after warm-up), the connection/FD/group drift, and the 5xx count.

Not driven yet: bridge turns (the issue's soak lists them).
"""

import argparse
import json
import os
import resource
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yuzu.settings")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
import psutil  # noqa: E402

from tests.faults.services import (  # noqa: E402
    Cluster,
    mcp_initialize,
    mcp_tool,
    private_postgres,
    private_redis,
    until,
)


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.lat, self.requests, self.errors, self.five = [], 0, [], 0
        self.exec_started, self.streams_open, self.stream_reopens = [], 0, 0

    def record(self, took, status, what):
        with self.lock:
            self.requests += 1
            self.lat.append(took)
            if status >= 500:
                self.five += 1
                self.errors.append((what, status))

    def error(self, what, exc):
        with self.lock:
            self.errors.append((what, repr(exc)[:200]))

    def take(self):
        with self.lock:
            out = (self.lat, self.requests, self.errors, self.five)
            self.lat, self.requests, self.errors, self.five = [], 0, [], 0
        return out


def pct(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] * 1000


def mcp_loop(stop, stats, bases, token, k):
    tools = [("list_agents", {}), ("list_executions", {})]
    with httpx.Client(trust_env=False, timeout=60) as http:
        i = k
        while not stop.is_set():
            base = bases[i % len(bases)]
            name, args = tools[i % len(tools)]
            i += 1
            t = time.monotonic()
            try:
                r = mcp_tool(http, base, token, name, timeout=60, **args)
                stats.record(time.monotonic() - t, r.status_code, name)
            except httpx.HTTPError as exc:
                stats.error(name, exc)
            time.sleep(0.05)


def exec_loop(stop, stats, bases, token, every):
    with httpx.Client(trust_env=False, timeout=120, headers={"Authorization": f"Bearer {token}"}) as http:
        i = 0
        while not stop.wait(every):
            base = bases[i % len(bases)]
            i += 1
            t = time.monotonic()
            try:
                r = http.post(base + "/api/v1/executions", json={"plugin": "os", "action": "info",
                                                                 "scope": 'hostname LIKE "soak*"'})
                stats.record(time.monotonic() - t, r.status_code, "POST executions")
                if r.status_code == 202:
                    with stats.lock:
                        stats.exec_started.append(r.json()["data"]["execution_id"])
            except httpx.HTTPError as exc:
                stats.error("POST executions", exc)


def stream_loop(stop, stats, base, token):
    """One handshake-era session holding a GET stream open; re-opened when the server closes it."""
    with httpx.Client(trust_env=False, timeout=httpx.Timeout(60, read=None)) as http:
        while not stop.is_set():
            try:
                r = mcp_initialize(http, base, token)
                if r.status_code != 200:
                    stats.record(0, r.status_code, "initialize")
                    stop.wait(5)
                    continue
                sid = r.headers["mcp-session-id"]
                h = {"Authorization": f"Bearer {token}", "Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-06-18"}
                http.post(base + "/mcp/v1/", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                          headers={**h, "Accept": "application/json, text/event-stream"})
                with http.stream("GET", base + "/mcp/v1/", headers={**h, "Accept": "text/event-stream"}) as s:
                    if s.status_code != 200:
                        stats.record(0, s.status_code, "GET stream")
                        stop.wait(5)
                        continue
                    with stats.lock:
                        stats.streams_open += 1
                    try:
                        for _ in s.iter_raw():
                            if stop.is_set():
                                break
                    finally:
                        with stats.lock:
                            stats.streams_open -= 1
                            stats.stream_reopens += 1
            except httpx.HTTPError as exc:
                if not stop.is_set():
                    stats.error("GET stream", exc)
                    stop.wait(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--mcp-clients", type=int, default=4)
    ap.add_argument("--exec-every", type=float, default=20)
    ap.add_argument("--sample-every", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=60, help="seconds after which the memory baseline is taken")
    ap.add_argument("--json")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * (a.agents + a.streams) + 1024)), hard))
    tmp = Path(tempfile.mkdtemp(prefix="yuzu-soak-"))
    print(f"soak: {a.minutes} min, {a.agents} agents, {a.streams} GET streams, {a.mcp_clients} MCP clients, "
          f"an execution every {a.exec_every} s; logs in {tmp}", flush=True)
    samples, stop, threads = [], threading.Event(), []
    with private_postgres(tmp) as pg, private_redis(tmp) as rd:
        c = Cluster(tmp, database_url=pg.url, redis_url=rd.url, YUZU_LOG_LEVEL="WARNING")
        try:
            c.prepare()
            rest = c.token("soak-rest", "Operator")
            mcp = c.token("soak-mcp", "Operator", tier="operator")
            stream_tokens = c.tokens(max(1, (a.streams + 3) // 4)) if a.streams else []  # 4 GET streams per token
            bases = [c.daphne("daphne-1"), c.daphne("daphne-2")]
            c.celery()
            c.spawn("celery-beat", [sys.executable, "-m", "celery", "-A", "yuzu", "beat", "-l", "warning",
                                    "-s", str(tmp / "celerybeat-schedule")])
            device = c.device_token(a.agents + 10)
            per = max(1, a.agents // 2)
            for k, base in enumerate(bases):
                n = per if k == 0 else a.agents - per
                if n:
                    c.spawn(f"swarm-{k}", [sys.executable, "manage.py", "agent_swarm", "--count", str(n), "--server",
                                           base.replace("http", "ws", 1), "--token", device, "--state-dir",
                                           str(tmp / "swarm"), "--prefix", f"soak{k}"])
            until(lambda: pg.query("SELECT count(*) FROM fleet_agent WHERE connected")[0][0] >= a.agents,
                  120 + a.agents / 5, f"{a.agents} agents to connect", interval=1)
            print(f"{a.agents} agents connected", flush=True)
            stats = Stats()
            threads += [threading.Thread(target=mcp_loop, args=(stop, stats, bases, mcp, k), daemon=True)
                        for k in range(a.mcp_clients)]
            threads.append(threading.Thread(target=exec_loop, args=(stop, stats, bases, rest, a.exec_every), daemon=True))
            # a token's streams on one process (the budget is 4 per principal per process)
            threads += [threading.Thread(target=stream_loop, args=(stop, stats, bases[(k // 4) % 2], stream_tokens[k // 4]),
                                         daemon=True) for k in range(a.streams)]
            for t in threads:
                t.start()
                if len(threads) > 50:
                    time.sleep(0.01)
            daphnes = {name: psutil.Process(c.procs[name].pid) for name in ("daphne-1", "daphne-2")}
            t0 = time.monotonic()
            header = (f"{'t_s':>6} {'rss1':>6} {'rss2':>6} {'fd1':>5} {'fd2':>5} {'pg_conn':>7} {'groups':>6} "
                      f"{'redis_cl':>8} {'streams':>7} {'req':>6} {'p50ms':>7} {'p99ms':>7} {'5xx':>4} {'err':>4} "
                      f"{'exec':>4} {'ok':>4}")
            print(header, flush=True)
            while time.monotonic() - t0 < a.minutes * 60:
                time.sleep(a.sample_every)
                lat, reqs, errors, five = stats.take()
                with stats.lock:
                    started = list(stats.exec_started)
                    streams = stats.streams_open
                by_status = dict(pg.query("SELECT status, count(*) FROM fleet_execution GROUP BY status"))
                ok = by_status.get("succeeded", 0)
                s = {"t_s": round(time.monotonic() - t0),
                     **{f"rss_{n}": round(p.memory_info().rss / 2**20, 1) for n, p in daphnes.items()},
                     **{f"fds_{n}": p.num_fds() for n, p in daphnes.items()},
                     "pg_connections": pg.connections(),
                     "layer_groups": int(rd.cli("eval", "return #redis.call('keys', 'asgi:group:*')", "0").strip() or 0),
                     "redis_clients": int(next((ln.split(":")[1] for ln in rd.cli("info", "clients").splitlines()
                                                if ln.startswith("connected_clients:")), "0")),
                     "streams_open": streams, "requests": reqs, "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95),
                     "p99_ms": pct(lat, 99), "five_xx": five, "errors": len(errors) - five,
                     "error_samples": errors[:3], "executions": len(started), "succeeded": ok,
                     "executions_by_status": by_status}
                samples.append(s)
                print(f"{s['t_s']:>6} {s['rss_daphne-1']:>6} {s['rss_daphne-2']:>6} {s['fds_daphne-1']:>5} "
                      f"{s['fds_daphne-2']:>5} {s['pg_connections']:>7} {s['layer_groups']:>6} {s['redis_clients']:>8} "
                      f"{streams:>7} {reqs:>6} {s['p50_ms'] or 0:>7.1f} {s['p99_ms'] or 0:>7.1f} {five:>4} "
                      f"{s['errors']:>4} {len(started):>4} {ok:>4}", flush=True)
                for name, p in c.procs.items():
                    if p.poll() is not None:
                        raise SystemExit(f"{name} exited during the soak:\n{c.log(name)}")
        finally:
            stop.set()
            for t in threads[: a.mcp_clients + 1]:
                t.join(10)
            c.close()
    base = [s for s in samples if s["t_s"] >= a.warmup] or samples
    summary = {}
    if base:
        first, last = base[0], samples[-1]
        summary = {
            "minutes": a.minutes, "agents": a.agents, "streams": a.streams,
            "rss_growth_pct": {n: round(100 * (last[f"rss_{n}"] / first[f"rss_{n}"] - 1), 1) for n in ("daphne-1", "daphne-2")},
            "fds": {n: (first[f"fds_{n}"], last[f"fds_{n}"]) for n in ("daphne-1", "daphne-2")},
            "pg_connections": (first["pg_connections"], last["pg_connections"]),
            "layer_groups": (first["layer_groups"], last["layer_groups"]),
            "five_xx": sum(s["five_xx"] for s in samples), "transport_errors": sum(s["errors"] for s in samples),
            "p99_ms_median": statistics.median([s["p99_ms"] for s in samples if s["p99_ms"] is not None] or [0]),
        }
        print("summary:", json.dumps(summary), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"samples": samples, "summary": summary}, indent=1, default=str))


if __name__ == "__main__":
    main()
