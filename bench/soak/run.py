"""Soak: mixed load for a while on PostgreSQL + Redis with two server processes, sampled over time (issue 22).

    .venv/bin/python bench/soak/run.py [--minutes 60] [--agents 1000] [--streams 500] [--mcp-clients 4]
                                       [--exec-every 60] [--mcp-pause 0.2]
                                       [--bridge-workers 2] [--bridge-every 2] [--drain 330] [--sample-every 30]
                                       [--json FILE]

Starts its own services (tests/faults/services.py: a private PostgreSQL 15 cluster and a private redis-server
on free ports — never the shared ones), two daphne processes on two ports, one Celery worker (+ beat for the
sweep), and `manage.py agent_swarm` agents split over the two servers. Then, until the time is up:

- MCP clients: 2026-07-28 `tools/call` (list_agents, list_executions; a page of 50 rows each) in a loop with
  --mcp-pause between calls, alternating servers; every latency and status recorded;
- an execution (os.info) to every agent every --exec-every seconds after --warmup, alternating servers (REST);
- --streams handshake-era sessions, each holding a GET stream open (re-opened when closed), alternating servers;
- bridge turns (--bridge-workers > 0): a primary on daphne-1's /mcp/bridge/ spawns that many `standin` workers
  (bridge/testing/standin.py, real tmux panes on a private tmux socket, a `bridge_poller` process) whose
  YUZU_BRIDGE_URL is daphne-2 — so every turn's rendezvous crosses processes through the Redis channel layer —
  and sends `reply:<n>` turns round-robin (`bridge_send`, blocking), one every --bridge-every seconds; each
  turn's latency and outcome are recorded (a turn is good when its reply text is the one asked for).

Every --sample-every seconds, per daphne: RSS (MiB) and open file descriptors; the cluster: PostgreSQL
connections to the database, Redis channel-layer groups (`asgi:group:*` keys) and connected clients; the
interval's MCP latency percentiles, request count and 5xx/transport errors; executions by status; the
interval's bridge turns (count, bad, p50/max). The table is printed as it goes and written to --json.

At the end the load stops and the driver waits (up to --drain seconds) for every execution to reach a terminal
status, then accounts for each one it started: its final status, its time to terminal (completed_at −
dispatched_at), its per-agent outcomes (AgentExecStatus: success/failure/timeout/rejected/still pending,
dispatched or running) and whether every target's terminal state has its stored Response. "Lost" is an
execution the driver got a 202 for that is not in the database, a target row still not terminal after the
drain, or a terminal target row without its Response. Then: memory growth per process (last sample vs the
first one after warm-up), the connection/FD/group drift, and the 5xx count.
"""

import argparse
import json
import logging
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

from bridge.terminal import TmuxBackend  # noqa: E402
from bridge.testing.harness import Mcp  # noqa: E402
from tests.faults.services import (  # noqa: E402
    Cluster,
    mcp_initialize,
    mcp_tool,
    private_postgres,
    private_redis,
    until,
)
from yuzu.testing import free_port  # noqa: E402


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.lat, self.requests, self.errors, self.five = [], 0, [], 0
        self.exec_started, self.streams_open, self.stream_reopens = [], 0, 0
        self.turns, self.turn_lat, self.turn_bad = 0, [], []  # this interval's bridge turns
        self.turns_total, self.turns_bad_total, self.turn_lat_all = 0, [], []

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

    def turn(self, took, ok, what):
        with self.lock:
            self.turns += 1
            self.turns_total += 1
            self.turn_lat.append(took)
            self.turn_lat_all.append(took)
            if not ok:
                self.turn_bad.append(what)
                self.turns_bad_total.append(what)

    def take_turns(self):
        with self.lock:
            out = (self.turns, self.turn_lat, self.turn_bad)
            self.turns, self.turn_lat, self.turn_bad = 0, [], []
        return out

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


def mcp_loop(stop, stats, bases, token, k, pause):
    # A page of 50 rows, as a client pages a large fleet: the whole fleet (1,000 agents) per call is ~450 KB
    # of JSON, and four clients asking for it back to back saturated both daphnes on the 2-core machine so
    # that agents' heartbeats were not processed (agents marked disconnected, executions stuck).
    tools = [("list_agents", {"limit": 50}), ("list_executions", {"limit": 50})]
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
            stop.wait(pause)


def exec_loop(stop, stats, bases, token, every, first):
    """The first execution after ``first`` s (the warm-up: 1,000 agents registering and 500 streams opening
    are a backlog of their own; an execution into it was re-sent 4× per agent and took 200 s), then one every
    ``every`` s."""
    with httpx.Client(trust_env=False, timeout=120, headers={"Authorization": f"Bearer {token}"}) as http:
        i = 0
        wait = first
        while not stop.wait(wait):
            wait = every
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
                else:
                    stats.error("POST executions", f"HTTP {r.status_code} {r.text[:150]}")
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


def bridge_loop(stop, stats, url, token, workers, every, sessions):
    """A primary sending `reply:<n>` turns round-robin to its stand-in workers, one at a time (bridge_send
    blocks for the outcome). The workers' sessions are appended to ``sessions`` (stopped by main at the end)."""
    p = Mcp(url, token)
    try:
        for _ in range(workers):
            w = p.call("bridge_spawn", {"profile": "standin"})
            if w.structured is None or w.is_error:
                stats.turn(0, False, f"bridge_spawn: {w.status} {w.rpc_error or w.structured}")
                continue
            sessions.append(w["sessionId"])
        i = 0
        while sessions and not stop.is_set():
            sid = sessions[i % len(sessions)]
            i += 1
            t = time.monotonic()
            try:
                r = p.call("bridge_send", {"content": f"reply:turn {i}", "sessionId": sid, "timeoutMs": 60000},
                           timeout=90)
                took = time.monotonic() - t
                if r.status >= 500:
                    stats.record(took, r.status, "bridge_send")
                ok = r.get("outcome") == "reply" and r.get("text") == f"turn {i}"
                stats.turn(took, ok, "" if ok else f"turn {i}: {r.status} {r.rpc_error or r.structured}"[:200])
            except httpx.HTTPError as exc:
                stats.turn(time.monotonic() - t, False, f"turn {i}: {exc!r}"[:200])
            stop.wait(every)
    finally:
        p.close()


def account(pg, started, by_start):
    """Every execution the driver started: final status, time to terminal, per-agent outcomes, losses."""
    rows = {r[0]: r for r in pg.query(
        "SELECT id, status, EXTRACT(EPOCH FROM completed_at - dispatched_at), agents_targeted, agents_responded, "
        "agents_success, agents_failure, resent FROM fleet_execution WHERE id = ANY(%s)", started)}
    aes = {}
    for ex_id, status, n in pg.query("SELECT execution_id, status, count(*) FROM fleet_agentexecstatus "
                                     "WHERE execution_id = ANY(%s) GROUP BY 1, 2", started):
        aes.setdefault(ex_id, {})[status] = n
    # a terminal target row whose stored Response is missing or disagrees: an answer lost in storage
    unmatched = dict(pg.query(
        "SELECT a.execution_id, count(*) FROM fleet_agentexecstatus a "
        "LEFT JOIN fleet_response r ON r.execution_id = a.execution_id AND r.agent_id = a.agent_id "
        "AND r.status = a.status WHERE a.execution_id = ANY(%s) "
        "AND a.status IN ('success', 'failure', 'timeout', 'rejected') AND r.id IS NULL GROUP BY 1", started))
    per_exec, finals, outcomes, ttt = [], {}, {}, []
    for ex_id in started:
        r = rows.get(ex_id)
        if r is None:
            per_exec.append({"id": ex_id, "status": "MISSING"})
            finals["MISSING"] = finals.get("MISSING", 0) + 1
            continue
        _, status, secs, targeted, responded, succ, fail, resent = r
        counts = aes.get(ex_id, {})
        for k, v in counts.items():
            outcomes[k] = outcomes.get(k, 0) + v
        finals[status] = finals.get(status, 0) + 1
        if secs is not None:
            ttt.append(float(secs))
        per_exec.append({"id": ex_id, "started_at_s": by_start.get(ex_id), "status": status,
                         "time_to_terminal_s": None if secs is None else round(float(secs), 1),
                         "targeted": targeted, "responded": responded, "success": succ, "failure": fail,
                         "resent": resent, "agents": counts, "terminal_without_response": unmatched.get(ex_id, 0)})
    not_terminal = sum(outcomes.get(k, 0) for k in ("pending", "dispatched", "running"))
    lost = {"missing_executions": finals.get("MISSING", 0), "targets_not_terminal": not_terminal,
            "terminal_without_response": sum(unmatched.values()),
            "target_rows_vs_targeted": sum(sum(e.get("agents", {}).values()) for e in per_exec)
            - sum(e.get("targeted", 0) for e in per_exec)}
    return {"executions": len(started), "final_status": finals, "agent_outcomes": outcomes, "lost": lost,
            "time_to_terminal_s": {"p50": round(statistics.median(ttt), 1) if ttt else None,
                                   "p95": round(pct([t / 1000 for t in ttt], 95), 1) if ttt else None,
                                   "max": round(max(ttt), 1) if ttt else None},
            "per_execution": per_exec}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--mcp-clients", type=int, default=4)
    ap.add_argument("--mcp-pause", type=float, default=0.2, help="pause of each MCP client between calls (s)")
    ap.add_argument("--exec-every", type=float, default=60)
    ap.add_argument("--sample-every", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=60, help="seconds after which the memory baseline is taken and the first execution started")
    ap.add_argument("--bridge-workers", type=int, default=2, help="standin workers driven with bridge turns (0: none)")
    ap.add_argument("--bridge-every", type=float, default=2, help="pause between bridge turns (s)")
    ap.add_argument("--drain", type=float, default=330,
                    help="seconds to wait after the load for every execution to end (os.info expires in 300 s)")
    ap.add_argument("--json")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Django's logging config has it log every request
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * (a.agents + a.streams) + 1024)), hard))
    tmp = Path(tempfile.mkdtemp(prefix="yuzu-soak-"))
    print(f"soak: {a.minutes} min, {a.agents} agents, {a.streams} GET streams, {a.mcp_clients} MCP clients, "
          f"an execution every {a.exec_every} s, {a.bridge_workers} bridge workers; logs in {tmp}; "
          f"load average {os.getloadavg()}", flush=True)
    samples, stop, threads, sessions, accounting = [], threading.Event(), [], [], {}
    tmux_socket = f"yuzu-soak-{os.getpid()}"
    ports = [free_port(), free_port()]
    with private_postgres(tmp) as pg, private_redis(tmp) as rd:
        # the bridge: primaries on daphne-1, workers told daphne-2 (their turns' rendezvous crosses processes)
        c = Cluster(tmp, database_url=pg.url, redis_url=rd.url, YUZU_LOG_LEVEL="WARNING",
                    YUZU_BRIDGE_URL=f"http://127.0.0.1:{ports[1]}/mcp/bridge/", YUZU_BRIDGE_TMUX_SOCKET=tmux_socket,
                    YUZU_BRIDGE_PAUSE_FILE=str(tmp / "poller.pause"))  # the bridge's default timing
        try:
            c.prepare()
            rest = c.token("soak-rest", "Operator")
            mcp = c.token("soak-mcp", "Operator", tier="operator")
            stream_tokens = c.tokens(max(1, (a.streams + 3) // 4)) if a.streams else []  # 4 GET streams per token
            bases = [c.daphne("daphne-1", ports[0]), c.daphne("daphne-2", ports[1])]
            if a.bridge_workers:
                c.manage("shell", "-c", "from bridge.profiles import seed_profiles; seed_profiles()")
                c.spawn("bridge-poller", [sys.executable, "manage.py", "bridge_poller"])
                primary = c.token("soak-primary", "Operator")
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
            threads += [threading.Thread(target=mcp_loop, args=(stop, stats, bases, mcp, k, a.mcp_pause), daemon=True)
                        for k in range(a.mcp_clients)]
            threads.append(threading.Thread(target=exec_loop, args=(stop, stats, bases, rest, a.exec_every, a.warmup), daemon=True))
            if a.bridge_workers:
                threads.append(threading.Thread(target=bridge_loop, daemon=True, args=(
                    stop, stats, bases[0] + "/mcp/bridge/", primary, a.bridge_workers, a.bridge_every, sessions)))
            n_joined = len(threads)
            # a token's streams on one process (the budget is 4 per principal per process)
            threads += [threading.Thread(target=stream_loop, args=(stop, stats, bases[(k // 4) % 2], stream_tokens[k // 4]),
                                         daemon=True) for k in range(a.streams)]
            for t in threads:
                t.start()
                if len(threads) > 50:
                    time.sleep(0.01)
            daphnes = {name: psutil.Process(c.procs[name].pid) for name in ("daphne-1", "daphne-2")}
            t0 = time.monotonic()
            starts = {}  # execution id → seconds after t0 when the driver got its 202
            header = (f"{'t_s':>6} {'rss1':>6} {'rss2':>6} {'fd1':>5} {'fd2':>5} {'pg_conn':>7} {'groups':>6} "
                      f"{'redis_cl':>8} {'streams':>7} {'req':>6} {'p50ms':>7} {'p99ms':>7} {'5xx':>4} {'err':>4} "
                      f"{'exec':>4} {'run':>4} {'ok':>4} {'turns':>5} {'bad':>3} {'t_p50':>6} {'t_max':>6}")
            print(header, flush=True)
            while time.monotonic() - t0 < a.minutes * 60:
                time.sleep(a.sample_every)
                lat, reqs, errors, five = stats.take()
                turns, turn_lat, turn_bad = stats.take_turns()
                with stats.lock:
                    started = list(stats.exec_started)
                    streams = stats.streams_open
                now_s = round(time.monotonic() - t0)
                for ex_id in started:
                    starts.setdefault(ex_id, now_s)  # to within a sample interval
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
                     "executions_by_status": by_status, "running": by_status.get("running", 0),
                     "bridge_turns": turns, "bridge_bad": len(turn_bad), "bridge_bad_samples": turn_bad[:3],
                     "bridge_p50_ms": pct(turn_lat, 50), "bridge_max_ms": pct(turn_lat, 100),
                     "loadavg": os.getloadavg()}
                samples.append(s)
                print(f"{s['t_s']:>6} {s['rss_daphne-1']:>6} {s['rss_daphne-2']:>6} {s['fds_daphne-1']:>5} "
                      f"{s['fds_daphne-2']:>5} {s['pg_connections']:>7} {s['layer_groups']:>6} {s['redis_clients']:>8} "
                      f"{streams:>7} {reqs:>6} {s['p50_ms'] or 0:>7.1f} {s['p99_ms'] or 0:>7.1f} {five:>4} "
                      f"{s['errors']:>4} {len(started):>4} {s['running']:>4} {ok:>4} {turns:>5} {len(turn_bad):>3} "
                      f"{s['bridge_p50_ms'] or 0:>6.0f} {s['bridge_max_ms'] or 0:>6.0f}", flush=True)
                if errors or turn_bad:
                    print("   errors:", errors[:3], turn_bad[:3], flush=True)
                for name, p in c.procs.items():
                    if p.poll() is not None:
                        raise SystemExit(f"{name} exited during the soak:\n{c.log(name)}")
            stop.set()
            for t in threads[:n_joined]:
                t.join(100)
            with stats.lock:
                started = list(stats.exec_started)
            for ex_id in started:
                starts.setdefault(ex_id, round(time.monotonic() - t0))
            print(f"load stopped at {round(time.monotonic() - t0)} s (load average {os.getloadavg()}); draining up to "
                  f"{a.drain} s for {len(started)} executions", flush=True)
            t_drain = time.monotonic()
            while time.monotonic() - t_drain < a.drain and pg.query(
                    "SELECT count(*) FROM fleet_execution WHERE status = 'running'")[0][0]:
                time.sleep(5)
            print(f"drained in {time.monotonic() - t_drain:.0f} s", flush=True)
            accounting = account(pg, started, starts)
            accounting["drain_s"] = round(time.monotonic() - t_drain)
            print("executions:", json.dumps({k: v for k, v in accounting.items() if k != "per_execution"}), flush=True)
            with stats.lock:
                accounting["bridge"] = {"turns": stats.turns_total, "bad": len(stats.turns_bad_total),
                                        "bad_samples": stats.turns_bad_total[:10], "workers": len(sessions),
                                        "p50_ms": pct(stats.turn_lat_all, 50), "p99_ms": pct(stats.turn_lat_all, 99),
                                        "max_ms": pct(stats.turn_lat_all, 100)}
            print("bridge:", json.dumps(accounting["bridge"]), flush=True)
        finally:
            stop.set()
            if sessions:
                try:
                    p = Mcp(bases[0] + "/mcp/bridge/", primary)
                    for sid in sessions:
                        p.call("bridge_stop", {"paneId": sid}, timeout=20)
                    p.close()
                except Exception as exc:  # best effort: the tmux server is shut down below anyway
                    print("bridge_stop failed:", repr(exc), flush=True)
            c.close()
            TmuxBackend(tmux_socket).shutdown()
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
            "p99_ms_max": max([s["p99_ms"] for s in samples if s["p99_ms"] is not None] or [0]),
            "requests": sum(s["requests"] for s in samples),
            "loadavg": {"start": samples[0]["loadavg"], "middle": samples[len(samples) // 2]["loadavg"],
                        "end": samples[-1]["loadavg"]},
        }
        print("summary:", json.dumps(summary), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "samples": samples, "summary": summary,
                                            "accounting": accounting}, indent=1, default=str))


if __name__ == "__main__":
    main()
