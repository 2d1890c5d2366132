"""Instructions per call through a real daphne, counted by callgrind: Twisted's HTTP, daphne, the ASGI application
and the worker thread, one request at a time on one keep-alive connection. Unlike req/s and CPU time, the count
does not move with what else the machine is doing (±0.3 % between runs here), so it can tell a change of 2 % on
a VM whose speed drifts by half within the hour. It leaves out what waking threads and processes costs, and the
database's and Redis's own work: it says whether a change makes our process do less, and run.py whether that
shows under load.

    .venv/bin/python bench/mcp_calls/instructions.py                  # this tree: tools/call and REST GET
    .venv/bin/python bench/mcp_calls/instructions.py --base main      # and REV's tree, with the ratio
    .venv/bin/python bench/mcp_calls/instructions.py --reference      # and the SDK's reference server
    YUZU_DATABASE_URL=postgres://… YUZU_REDIS_URL=redis://… .venv/bin/python bench/mcp_calls/instructions.py

Needs valgrind (callgrind and callgrind_control). A fresh SQLite file per tree (or the database and Redis the
environment names, shared by both trees), run.py's set-up (50 agents, an operator-tier token). Each route gets
50 calls of warm-up, then --calls counted ones; the event loop's thread (daphne's main thread) and the others
(the worker threads) are counted apart. About a minute per tree.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from run import (  # noqa: E402  (after sys.path)
    PROTOCOL,
    SETUP,
    add_worktree,
    call_body,
    check_base,
    free_port,
    headers,
    reference_command,
    reference_env,
    remove_worktree,
    rest_headers,
    server_env,
)


def under_callgrind(argv: list[str], cwd: Path, env: dict[str, str], tmp: Path) -> subprocess.Popen[bytes]:
    """``argv`` run by callgrind, counting nothing until told (``counted``); one dump file per thread."""
    (tmp / "callgrind").mkdir()
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
         f"--callgrind-out-file={tmp}/callgrind/cg.%p"] + argv,
        cwd=cwd, env=env, stdout=open(tmp / "server.log", "w"), stderr=subprocess.STDOUT)


def wait_up(server: subprocess.Popen[bytes], client: httpx.Client, url: str, tmp: Path) -> None:
    for _ in range(600):  # a Python under valgrind takes a minute to start
        if server.poll() is not None:
            raise SystemExit(f"the server under valgrind exited: see {tmp / 'server.log'}")
        try:
            client.get(url)
            return
        except httpx.TransportError:
            time.sleep(0.5)
    server.terminate()
    raise SystemExit(f"the server under valgrind did not answer {url} in 300 s: see {tmp / 'server.log'}")


def mcp_session(client: httpx.Client, url: str, token: str | None) -> dict[str, str]:
    """The headers of an initialized session's calls."""
    r = client.post(url, headers=headers(token), json={
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}})
    session = headers(token, r.headers["mcp-session-id"])
    client.post(url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return session


def tools_caller(client: httpx.Client, url: str, token: str | None) -> Callable[[], None]:
    """One checked `tools/call list_agents` per call, in a session of its own (ids unique within it)."""
    session, n = mcp_session(client, url, token), iter(range(1, 10**9))

    def tools_call() -> None:
        r = client.post(url, headers=session, content=call_body(next(n)))
        assert r.status_code == 200 and not r.json()["result"].get("isError"), r.text[:300]

    return tools_call


def counted(server: subprocess.Popen[bytes], routes: dict[str, Callable[[], None]], calls: int,
            tmp: Path) -> dict[str, dict[str, float]]:
    """{route: {"total", "loop", "workers"}}: instructions per call of each route — 50 calls of warm-up, then
    ``calls`` counted ones; the server's main thread (the event loop) apart from its other threads. Stops it."""
    control = ["callgrind_control", str(server.pid)]  # valgrind runs python in its own pid
    try:
        for route, call in routes.items():
            for _ in range(50):
                call()
            subprocess.run(control[:1] + ["-i", "on"] + control[1:], check=True, capture_output=True)
            for _ in range(calls):
                call()
            subprocess.run(control[:1] + ["-i", "off"] + control[1:], check=True, capture_output=True)
            subprocess.run(control[:1] + ["-d", route.replace("/", "-")] + control[1:], check=True,
                           capture_output=True)
    finally:
        server.terminate()
        server.wait(120)
    results: dict[str, dict[str, float]] = {}
    for path in (tmp / "callgrind").iterdir():  # cg.<pid>.<dump>-<thread>: one file per thread per dump
        head = dict(line.rstrip("\n").split(": ", 1) for line in open(path) if line.startswith(("desc: Trigger", "totals")))
        trigger = head.get("desc", "").removeprefix("Trigger: dump ")
        if trigger.replace("-", "/") not in routes:
            continue
        counts = results.setdefault(trigger.replace("-", "/"), {"total": 0.0, "loop": 0.0, "workers": 0.0})
        per_call = int(head.get("totals", 0)) / calls
        counts["total"] += per_call
        counts["loop" if path.name.endswith("-01") else "workers"] += per_call
    return results


def count(tree: Path, env: dict[str, str], calls: int, tmp: Path) -> dict[str, dict[str, float]]:
    """Instructions per call of the daphne serving ``tree``: tools/call and the REST GET. Leaves the agents it
    lists in tmp/agents.json."""
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=tree, env=env, check=True)
    out = subprocess.run([sys.executable, "-c", SETUP, "50", "1"], cwd=tree, env=env, check=True,
                         capture_output=True, text=True).stdout
    setup = json.loads(out.strip().splitlines()[-1])
    token = setup["tokens"][0]
    (tmp / "agents.json").write_text(json.dumps(setup["agents"]))
    port = free_port()
    daphne = under_callgrind([sys.executable, "-m", "yuzu.daphne_main", "-b", "127.0.0.1", "-p", str(port),
                              "yuzu.asgi:application"], tree, env, tmp)
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=120) as client:
        wait_up(daphne, client, url + "/healthz", tmp)

        def rest_get() -> None:
            r = client.get(url + "/api/v1/agents", headers=rest_headers(token))
            assert r.status_code == 200, r.text[:300]

        return counted(daphne, {"tools/call": tools_caller(client, url + "/mcp/v1/", token), "rest": rest_get},
                       calls, tmp)


def count_reference(agents: Path, calls: int, tmp: Path) -> dict[str, dict[str, float]]:
    """The same for the SDK's reference server (uvicorn; .venv-mcp), serving ``agents`` from memory."""
    port = free_port()
    server = under_callgrind(reference_command(port, agents), tmp, reference_env(dict(os.environ)), tmp)
    url = f"http://127.0.0.1:{port}/mcp"
    with httpx.Client(timeout=120) as client:
        wait_up(server, client, url, tmp)
        return counted(server, {"tools/call": tools_caller(client, url, None)}, calls, tmp)


def main() -> None:
    ap = argparse.ArgumentParser(description="instructions per call through a real daphne (callgrind)")
    ap.add_argument("--calls", type=int, default=200, help="counted calls per route")
    ap.add_argument("--base", metavar="REV", help="also count the tree at git revision REV (a worktree)")
    ap.add_argument("--reference", action="store_true",
                    help="also count the SDK's reference server (run.py's, on this tree's 50 agents)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    for tool in ("valgrind", "callgrind_control"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed: `apt-get install valgrind`")
    check_base(ap, a.base)
    tmp = Path(tempfile.mkdtemp(prefix="yuzu-instr-"))
    trees = {"yuzu": ROOT}
    try:
        if a.base:
            trees["base"] = tmp / "base-tree"
            add_worktree(a.base, trees["base"])
        results = {}
        for name, tree in trees.items():
            work = tmp / name
            work.mkdir(mode=0o700)  # private, as serve expects its var dir
            results[name] = count(tree, server_env(work), a.calls, work)
        if a.reference:
            work = tmp / "reference"
            work.mkdir(mode=0o700)
            results["ref"] = count_reference(tmp / "yuzu" / "agents.json", a.calls, work)
    finally:
        if a.base:
            remove_worktree(trees["base"])
        shutil.rmtree(tmp, ignore_errors=True)

    database = "PostgreSQL" if os.environ.get("YUZU_DATABASE_URL") else "SQLite"
    database += " + Redis" if os.environ.get("YUZU_REDIS_URL") else ""
    print(f"instructions per call (callgrind), {a.calls} calls per route through daphne, {database}"
          + (f"; base: {a.base}" if a.base else ""))
    print(f"{'tree':<6} {'route':<11} {'total':>11} {'event loop':>11} {'workers':>11}")
    for name, routes in results.items():
        for route, r in sorted(routes.items(), reverse=True):
            print(f"{name:<6} {route:<11} {r['total']:>11,.0f} {r['loop']:>11,.0f} {r['workers']:>11,.0f}")
    if a.base:
        for route in sorted(results["yuzu"], reverse=True):
            ours, base = results["yuzu"][route], results["base"][route]
            print(f"yuzu vs base ({a.base}) {route}: total x{ours['total'] / base['total']:.3f}   "
                  f"event loop x{ours['loop'] / base['loop']:.3f}   workers x{ours['workers'] / base['workers']:.3f}")
    if a.reference:
        print(f"yuzu vs ref tools/call: total x{results['yuzu']['tools/call']['total'] / results['ref']['tools/call']['total']:.3f}"
              "   (ref's event loop: uvicorn's thread; its workers: anyio's, running the sync tool)")
    if a.json:
        Path(a.json).write_text(json.dumps({"calls": a.calls, "database": database, "base": a.base,
                                            "results": results}, indent=2))


if __name__ == "__main__":
    main()
