"""DEX ingest: the server's CPU while N swarm agents send DEX heartbeat facts at the default heartbeat interval.

    .venv/bin/python bench/dex/run.py [--count 5000] [--window 90] [--chunk 1000] [--json FILE] [--keep]

Three phases against one real daphne, each measuring daphne's CPU time (user + system, from /proc) over the same
``--window`` of wall time: (1) idle, no agent; (2) N simulated agents (`manage.py agent_swarm`) connected and
heartbeating without DEX; (3) the same N agents again with ``--dex`` (each heartbeat carries the six DEX facts,
validated and stored by the server). The figures: cores used in each phase (CPU seconds per wall second), the
ratio of (3) to the idle server (1), and what DEX adds, (3) − (2). The issue's bar: (3) under one core at
N = 5,000 and the default 30 s heartbeat.

Embedded by default (a temp SQLite file, the in-process channel layer); YUZU_DATABASE_URL / YUZU_REDIS_URL as in
bench/fanout. The swarm's facts are generated values (docs/dex.md: simulated agents never read the host)."""

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TMP = Path(tempfile.mkdtemp(prefix="yuzu-dexbench-"))
ENV = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
ENV.update(DJANGO_SETTINGS_MODULE="yuzu.settings", YUZU_VAR_DIR=str(TMP), YUZU_LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1")
if not ENV.get("YUZU_DATABASE_URL"):
    ENV["YUZU_SQLITE_PATH"] = str(TMP / "bench.sqlite3")
os.environ.update(ENV)
sys.path.insert(0, str(ROOT))

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402

from dex.models import DeviceFacts  # noqa: E402
from fleet.management.commands.mint_device_token import mint_device_token  # noqa: E402
from fleet.models import Agent  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(name, argv):
    log = open(TMP / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait(check, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what} (logs in {TMP})")


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(pid, window):
    t0, c0 = time.monotonic(), cpu_seconds(pid)
    time.sleep(window)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def main():
    ap = argparse.ArgumentParser(description="DEX ingest: server CPU with N agents sending DEX facts")
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--window", type=float, default=90.0, help="seconds measured per phase (default 3 heartbeats)")
    ap.add_argument("--chunk", type=int, default=1000, help="agents per agent_swarm process")
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * a.count + 512)), hard))
    daphne, swarms = None, []
    try:
        call_command("migrate", "--noinput", "-v0")
        token = mint_device_token("bench dex", max_uses=a.count + 10, via="bench/dex")
        port = free_port()
        daphne = spawn("daphne", [sys.executable, "-m", "yuzu.daphne_main", "-b", "127.0.0.1", "-p", str(port),
                                  "yuzu.asgi:application"])

        def healthy():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1, trust_env=False).status_code == 200
            except httpx.HTTPError:
                return False

        wait(healthy, 60, "daphne")
        time.sleep(5)
        idle = measure(daphne.pid, a.window)
        print(f"idle: {idle:.3f} cores", flush=True)

        def start_swarm(dex):
            """Into ``swarms`` as each starts, so that a connect timeout still stops the ones already running."""
            for k, start in enumerate(range(0, a.count, a.chunk)):
                n = min(a.chunk, a.count - start)
                swarms.append(spawn(f"swarm-{'dex' if dex else 'plain'}-{k}", [
                    sys.executable, "manage.py", "agent_swarm", "--count", str(n), "--server",
                    f"ws://127.0.0.1:{port}", "--token", token, "--state-dir", str(TMP / "swarm"),
                    "--prefix", f"dex-{k}", *(["--dex"] if dex else [])]))
                # a fresh agent enrols before it registers: allow ~2 agents/s for a loaded machine
                wait(lambda s=start + n: Agent.objects.filter(connected=True).count() >= s, 120 + n / 2,
                     f"{start + n} agents to connect")

        start_swarm(False)
        time.sleep(35)  # the connect burst's inventory writes settle; a first full heartbeat round
        plain = measure(daphne.pid, a.window)
        print(f"{a.count} agents, heartbeats only: {plain:.3f} cores", flush=True)
        for p in swarms:
            stop(p)
        swarms.clear()
        time.sleep(5)
        start_swarm(True)
        since = timezone.now()
        wait(lambda: DeviceFacts.objects.filter(updated_at__gte=since).count() >= 0.95 * a.count, 120,
             "the DEX facts of 95 % of the agents")
        time.sleep(5)
        with_dex = measure(daphne.pid, a.window)
        stored = DeviceFacts.objects.filter(updated_at__gte=since).count()
        print(f"{a.count} agents with DEX facts: {with_dex:.3f} cores ({stored} agents' facts stored)", flush=True)
        out = {"count": a.count, "window_s": a.window, "idle_cores": round(idle, 4),
               "heartbeat_cores": round(plain, 4), "dex_cores": round(with_dex, 4),
               "dex_over_idle": round(with_dex / idle, 1) if idle else None,
               "dex_added_cores": round(with_dex - plain, 4), "under_one_core": with_dex < 1.0,
               "facts_stored": stored}
        print(json.dumps(out), flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=2))
    finally:
        for p in swarms:
            stop(p)
        stop(daphne)
        if not a.keep:
            shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
