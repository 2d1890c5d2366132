"""Fan-out: how long one execution takes from the REST call to terminal, for N simulated agents.

    .venv/bin/python bench/fanout/run.py [--counts 100 1000 5000] [--reps 3] [--json FILE] [--keep]

For each N it starts `manage.py agent_swarm --count N` (N real WebSockets through the normal enrol and
register protocol) against the server as `make run` starts it (`manage.py serve`), waits until all N are
connected, then `--reps` times (after one warm-up run that is not counted): POST /api/v1/executions {plugin:
os, action: info, scope: the N agents} and waits for the execution row to turn terminal. "Time to terminal"
is the row's completed_at minus the wall clock just before the POST (same machine, same clock); the bench
reads the row every 10 ms, which does not affect the figure.

Reference, measured in the same run: the 100-agent time (growth), and a bare channel-layer round trip
of N messages (N group_send + N receive on the configured layer, in this process): the messaging floor
with no database, no WebSocket and no agent.

Embedded by default: a fresh SQLite file under a temp dir, one daphne, the in-process channel layer
(yuzu.channel_layer), dispatch run by Celery eagerly inside daphne. With YUZU_REDIS_URL: one daphne per core
(--processes to choose), the Redis layer, serve's Celery worker and beat. With YUZU_DATABASE_URL: that
database, which must be a scratch one (agents are added).
Every wait is bounded.
"""

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TMP = Path(tempfile.mkdtemp(prefix="yuzu-fanout-"))
ENV = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
ENV.update(DJANGO_SETTINGS_MODULE=ENV.get("DJANGO_SETTINGS_MODULE", "yuzu.settings"), YUZU_VAR_DIR=str(TMP), YUZU_LOG_LEVEL="WARNING",
           PYTHONUNBUFFERED="1")
if not ENV.get("YUZU_DATABASE_URL"):
    ENV["YUZU_SQLITE_PATH"] = str(TMP / "bench.sqlite3")
os.environ.update(ENV)
sys.path.insert(0, str(ROOT))

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
import psutil  # noqa: E402
from channels.layers import get_channel_layer  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db.models import Count, Max, Min  # noqa: E402

from fleet.management.commands.mint_device_token import mint_device_token  # noqa: E402
from fleet.models import Agent, AgentExecStatus, AgentInventory, AgentState, Execution, Response  # noqa: E402
from pki.models import IssuedCert  # noqa: E402
from yuzu.models import ApiToken  # noqa: E402
from yuzu.rbac import assign_role, seed_builtin_roles  # noqa: E402

TERMINAL = ("succeeded", "completed", "cancelled")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(check, timeout, what, proc=None, log=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what}: the process exited ({proc.returncode})\n{log.read_text()[-3000:] if log else ''}")
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}\n{log.read_text()[-3000:] if log else ''}")


def spawn(name, argv):
    log = TMP / f"{name}.log"
    proc = subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, log


def stop(proc, sig=signal.SIGTERM, timeout=30):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        kb = int(next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")).split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        mem = ""
    return f"{cpu}, {os.cpu_count()} CPUs{mem}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def connected(prefix):
    return Agent.objects.filter(hostname__startswith=prefix + "-", connected=True).count()


def settled(prefix):
    """Agents that have sent their inventory and been issued their certificate: what each does right after it
    registers, written on the server's database thread (certificates are signed there too)."""
    agents = Agent.objects.filter(hostname__startswith=prefix + "-")
    return min(AgentInventory.objects.filter(agent__in=agents, plugin="os").count(),
               IssuedCert.objects.filter(agent_id__in=agents.values("agent_id"), status=IssuedCert.ACTIVE).count())


def cpu_by_group(server, swarms):
    """CPU seconds (user + system) used so far by each group of processes a fan-out runs on: the server's daphnes
    and Celery worker (with its pool), the swarm agents, PostgreSQL, Redis and this bench (which polls)."""
    groups = {"daphne": [], "celery": [], "agents": [psutil.Process(s.pid) for s in swarms], "postgres": [],
              "redis": [], "bench": [psutil.Process()]}
    for proc in psutil.Process(server.pid).children(recursive=True):
        args = " ".join(proc.cmdline())
        if "daphne" in args:
            groups["daphne"].append(proc)
        elif "celery" in args and " beat" not in args:
            groups["celery"].append(proc)
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in ("postgres", "redis-server"):
            groups["postgres" if proc.info["name"] == "postgres" else "redis"].append(proc)

    def seconds(proc):
        try:
            t = proc.cpu_times()
            return t.user + t.system
        except psutil.NoSuchProcess:
            return 0.0

    return {group: sum(map(seconds, procs)) for group, procs in groups.items()}


def run_once(client, prefix, n, timeout, cpu):
    """POST one execution to the swarm `prefix`; returns its timings (seconds from just before the POST) and the
    CPU seconds each group of processes used until it was seen terminal (``cpu()``: cpu_by_group)."""
    cpu_before = cpu()
    t0 = time.time()
    r = client.post("/api/v1/executions", json={"plugin": "os", "action": "info", "scope": f'hostname LIKE "{prefix}-*"'})
    accepted = time.time() - t0
    if r.status_code != 202:
        raise SystemExit(f"POST /api/v1/executions answered {r.status_code}: {r.text}")
    data = r.json()["data"]
    if data["agents_reached"] != n:
        raise SystemExit(f"reached {data['agents_reached']} agents, expected {n}")
    eid = data["execution_id"]
    deadline = time.monotonic() + timeout
    while True:
        status, completed_at = Execution.objects.filter(pk=eid).values_list("status", "completed_at").get()
        if status in TERMINAL:
            break
        if time.monotonic() > deadline:
            states = dict(AgentExecStatus.objects.filter(execution_id=eid).values_list("status").annotate(n=Count("id")))
            lost = Agent.objects.filter(hostname__startswith=prefix + "-", connected=False).count()
            resent = Execution.objects.get(pk=eid).resent
            return {"error": f"not terminal after {timeout:.0f} s; agents by state {states}; {lost} of the swarm "
                             f"are disconnected now; {resent} re-sends"}
        time.sleep(0.01)
    cpu_used = {group: used - cpu_before[group] for group, used in cpu().items()}
    ex = Execution.objects.get(pk=eid)
    span = AgentExecStatus.objects.filter(execution_id=eid).aggregate(first=Min("first_response_at"),
                                                                       last=Max("completed_at"))
    stored = Response.objects.filter(execution_id=eid, status=AgentState.SUCCESS).count()
    if ex.status != "succeeded" or ex.agents_success != n or stored != n:
        return {"error": f"{ex.status}, {ex.agents_success}/{n} succeeded, {stored} rows stored"}
    terminal = completed_at.timestamp() - t0
    first = span["first"].timestamp() - t0
    return {"accepted_s": accepted, "first_response_s": first, "terminal_s": terminal,
            "responses_per_s": n / terminal, "record_window_s": span["last"].timestamp() - span["first"].timestamp(),
            "resent": ex.resent, "cpu_s": cpu_used}


async def layer_floor(n, batched=False):
    """N group_send (``batched``: one group_send_many) + N receive on the configured channel layer, each agent
    on its own group: the messaging alone."""
    layer = get_channel_layer()
    channels = [await layer.new_channel() for _ in range(n)]
    groups = [f"bench.floor.{i}" for i in range(n)]
    for g, c in zip(groups, channels, strict=True):
        await layer.group_add(g, c)
    message = {"type": "agent.command", "payload": {"type": "command", "command_id": "os-0123456789abcdef",
                                                    "plugin": "os", "action": "info", "parameters": {},
                                                    "expires_at": time.time() + 300}}
    t0 = time.perf_counter()
    if batched:  # what dispatch does (fleet.push.send_to_agents): one group_send_many for all N groups
        await layer.group_send_many(groups, message)
    else:
        await asyncio.gather(*(layer.group_send(g, message) for g in groups))
    await asyncio.gather(*(layer.receive(c) for c in channels))
    elapsed = time.perf_counter() - t0
    for g, c in zip(groups, channels, strict=True):
        await layer.group_discard(g, c)
    return elapsed


def main():
    ap = argparse.ArgumentParser(description="fan-out: REST execute → terminal for N simulated agents")
    ap.add_argument("--counts", type=int, nargs="+", default=[100, 1000, 5000])
    ap.add_argument("--reps", type=int, default=3, help="measured executions per count (after one warm-up)")
    ap.add_argument("--chunk", type=int, default=1000, help="agents per agent_swarm process (started one by one)")
    ap.add_argument("--processes", type=int, help="server (daphne) processes; default: serve's (one per core with "
                                                   "Redis, 1 embedded)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the children (finally below)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * max(a.counts) + 512
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, need), hard))  # inherited by daphne and the swarm
    redis = bool(settings.REDIS_URL)
    database = "PostgreSQL" if settings.DATABASE_IS_POSTGRES else "SQLite (temp file, WAL)"
    daphnes = a.processes or "one per core"
    mode = (f"`manage.py serve`: Redis channel layer, daphnes: {daphnes}, its Celery worker" if redis else
            "embedded `manage.py serve`: one daphne, in-process channel layer, Celery eager inside daphne")
    server = None
    swarms = []
    results, floors, batched_floors, failures = {}, {}, {}, {}
    try:
        call_command("migrate", "--noinput", "-v0")
        seed_builtin_roles()
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.get_or_create(username="bench-fanout")[0]
        assign_role(user, "Operator")
        _, token = ApiToken.mint(user, "bench-fanout")
        # twice the agents: one whose enrol reply is lost under load (a timeout) enrols again
        device_token = mint_device_token("bench fanout", max_uses=2 * sum(a.counts), via="bench/fanout")

        port = free_port()
        if redis:
            from yuzu.celery import app

            app.control.purge()
        # The server as `make run` starts it: its daphnes (one, or with Redis one per core unless --processes
        # says), its Celery worker and beat (Redis) or its sweeper (embedded).
        ENV["YUZU_BIND"] = f"127.0.0.1:{port}"
        server, server_log = spawn("serve", [sys.executable, "manage.py", "serve", "--no-agent"]
                                   + (["--processes", str(a.processes)] if a.processes else []))
        wait(lambda: _healthy(port), 60, "serve", server, server_log)
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"},
                              timeout=120, trust_env=False)
        for n in a.counts:
            prefix = f"fan{n}"
            t = time.monotonic()
            # One swarm per chunk, each started once the previous one is connected: one swarm connects
            # 200 agents/s (its fixed 5 ms stagger), and a burst of thousands is more than one daphne
            # process registers before the agents' handshake timeouts (15 s) start retry storms.
            for k, start in enumerate(range(0, n, a.chunk)):
                count = min(a.chunk, n - start)
                swarm, swarm_log = spawn(f"swarm-{n}-{k}", [
                    sys.executable, "manage.py", "agent_swarm", "--count", str(count), "--server",
                    f"ws://127.0.0.1:{port}", "--token", device_token, "--state-dir", str(TMP / "swarm"),
                    "--prefix", f"{prefix}-{k}"])
                swarms.append(swarm)
                wait(lambda: connected(prefix) >= start + count, 300 + count / 5,  # a loaded machine registers slowly
                     f"{start + count} of {n} agents to connect", swarm, swarm_log)
                # Let each burst settle before the next: every agent reports its inventory and asks for its
                # certificate after it registered, and the server handles those one by one on its database
                # thread (unsettled, the first measured runs of 5,000 met a 74 s backlog of certificates).
                wait(lambda: settled(prefix) >= start + count, 120 + count / 10,
                     f"the inventory and certificates of {start + count} agents", swarm, swarm_log)
            print(f"{n} agents connected in {time.monotonic() - t:.1f} s ({len(swarms)} swarm processes)", flush=True)
            time.sleep(2)
            runs = []
            for i in range(a.reps + 1):  # the first is a warm-up
                r = run_once(client, prefix, n, 60 + n / 25, lambda: cpu_by_group(server, swarms))
                if "error" in r:
                    failures[n] = r["error"]
                    print(f"{n}: run {i} failed: {r['error']}", flush=True)
                    break
                runs.append(r)
            floors[n] = min(asyncio.run(layer_floor(n)) for _ in range(3))
            batched_floors[n] = (min(asyncio.run(layer_floor(n, batched=True)) for _ in range(3))
                                 if hasattr(get_channel_layer(), "group_send_many") else float("nan"))
            if n not in failures:
                results[n] = runs[1:]
                print(f"{n}: terminal in " + ", ".join(f"{r['terminal_s']:.3f}" for r in runs[1:]) + " s; re-sends "
                      + ", ".join(str(r["resent"]) for r in runs) + f" (warm-up first); layer floor "
                      f"{floors[n] * 1000:.1f} ms (batched {batched_floors[n] * 1000:.1f} ms)", flush=True)
            for swarm in swarms:
                stop(swarm)
            swarms = []
            # The next count waits for this one's sockets to be closed. daphne gives each connection's
            # disconnect handler 35 s (serve's application-close timeout) and kills the slow ones, whose
            # agents then stay marked connected until the sweep notices the missing heartbeats: after a
            # few thousand disconnects at once that is most of them, so do not insist on the flag.
            deadline = time.monotonic() + 30 + n / 100
            while connected(prefix) and time.monotonic() < deadline:
                time.sleep(1)
            if connected(prefix):
                print(f"{n}: {connected(prefix)} agents still marked connected after their swarms stopped "
                      "(disconnect handlers killed by daphne's close timeout)", flush=True)
        client.close()
    finally:
        for swarm in swarms:
            stop(swarm)
        stop(server, timeout=90)  # serve stops its children (thousands of sockets to close) before it exits
        if not a.keep:
            shutil.rmtree(TMP, ignore_errors=True)

    def med(n, key):
        return statistics.median(r[key] for r in results[n])

    if not results:
        raise SystemExit(f"no count finished: {failures}")
    ref = min(results)
    print(f"\nfan-out: POST /api/v1/executions (os.info, scope = the swarm) → execution terminal; "
          f"median of {a.reps} after a warm-up")
    print(f"machine: {machine()}")
    print(f"database: {database}; {mode}")
    print(f"{'agents':>6} {'accepted ms':>11} {'first resp ms':>13} {'terminal ms':>11} {'vs ' + str(ref):>7} "
          f"{'per agent µs':>12} {'responses/s':>11} {'layer floor ms':>14} {'vs floor':>8} {'batched floor ms':>16} "
          f"{'re-sends':>8}")
    summary = {}
    for n in results:
        term = med(n, "terminal_s")
        summary[n] = {"accepted_ms": med(n, "accepted_s") * 1000, "first_response_ms": med(n, "first_response_s") * 1000,
                      "terminal_ms": term * 1000, "ratio_vs_ref": term / med(ref, "terminal_s"),
                      "per_agent_us": term / n * 1e6, "responses_per_s": n / term, "layer_floor_ms": floors[n] * 1000,
                      "batched_floor_ms": batched_floors[n] * 1000, "ratio_vs_floor": term / floors[n], "resent": sum(r["resent"] for r in results[n]),
                      "runs": results[n]}
        s = summary[n]
        print(f"{n:>6} {s['accepted_ms']:>11.1f} {s['first_response_ms']:>13.1f} {s['terminal_ms']:>11.1f} "
              f"{s['ratio_vs_ref']:>6.2f}× {s['per_agent_us']:>12.0f} {s['responses_per_s']:>11.0f} "
              f"{s['layer_floor_ms']:>14.1f} {s['ratio_vs_floor']:>7.1f}× {s['batched_floor_ms']:>16.1f} {s['resent']:>8}")
    print(f"CPU seconds per run until terminal, median (the machine has {os.cpu_count()} cores):")
    for n in results:
        cpu = {group: statistics.median(r["cpu_s"][group] for r in results[n]) for group in results[n][0]["cpu_s"]}
        summary[n]["cpu_s"] = cpu
        print(f"{n:>6} " + ", ".join(f"{group} {used:.2f}" for group, used in cpu.items())
              + f"; all {sum(cpu.values()):.2f} in {summary[n]['terminal_ms'] / 1000:.2f} s")
    for n, error in failures.items():
        print(f"{n:>6} did not finish: {error} (layer floor {floors[n] * 1000:.1f} ms)")
    print(f"(linear growth would be {', '.join(f'{n / ref:g}×' for n in results)})")
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": machine(), "database": database, "mode": mode,
                                            "reference_agents": ref, "results": summary, "failures": failures,
                                            "layer_floor_ms": {n: f * 1000 for n, f in floors.items()}},
                                           indent=2, default=str))
    if failures:
        sys.exit(1)


def _healthy(port):
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
