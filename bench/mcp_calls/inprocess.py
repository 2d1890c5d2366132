"""In-process CPU per request of the two measured routes, without HTTP sockets: the whole ASGI application
(``yuzu.asgi.application``: BodyLimit, Channels' router, McpConsumer / Django's handler and its middleware)
driven by hand on one event loop, one request at a time, with ``time.process_time()`` (every thread of the
process) around each batch. On a busy machine that CPU time still moves with the load (caches, clock, thread
hand-offs): for A/B of one change, count instructions under callgrind instead (load-independent, though it
leaves out the cost of waking threads) and run both trees.

    .venv/bin/python bench/mcp_calls/inprocess.py [--calls 300] [--rounds 5] [--only mcp|rest]
    .venv/bin/python bench/mcp_calls/inprocess.py --profile-thread mcp|rest   # cProfile of the worker thread
    valgrind --tool=callgrind --instr-atstart=no .venv/bin/python bench/mcp_calls/inprocess.py --callgrind \
        --calls 200    # instructions of the calls only (one dump per route): load-independent

A fresh SQLite file under a temp dir (or --postgres URL), the same set-up as run.py (50 agents, an operator-tier
token).
"""

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from run import SETUP, call_body, rest_headers  # noqa: E402  (the bench's own set-up and body, after sys.path)

PROTOCOL = "2025-11-25"


def scope(method, path, headers, body=b""):
    hs = [(b"host", b"127.0.0.1:8000")] + [(k.encode(), v.encode()) for k, v in headers.items()]
    if method == "POST":
        hs.append((b"content-length", str(len(body)).encode()))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": hs,
            "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}


async def request(app, method, path, headers, body=b""):
    sent = []
    done = asyncio.Event()
    first = True

    async def receive():
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope(method, path, headers, body), receive, send)
    done.set()
    status = sent[0]["status"]
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    return status, dict(sent[0].get("headers", [])), payload


async def main_async(a, tokens, n_agents):
    from yuzu.asgi import application  # deferred: Django is set up only once main() has the database ready

    token = tokens[0]
    auth = {"authorization": f"Bearer {token}", "accept": "application/json, text/event-stream",
            "content-type": "application/json"}
    init = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}).encode()
    status, headers, _ = await request(application, "POST", "/mcp/v1/", auth, init)
    assert status == 200, status
    sid = headers[b"mcp-session-id"].decode()
    mcp_headers = {**auth, "mcp-session-id": sid, "mcp-protocol-version": PROTOCOL}
    status, _, _ = await request(application, "POST", "/mcp/v1/", mcp_headers,
                                 json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode())
    assert status == 202, status
    rest = rest_headers(token)
    counter = [0]

    async def mcp_call():
        counter[0] += 1
        status, _, body = await request(application, "POST", "/mcp/v1/", mcp_headers, call_body(counter[0]))
        reply = json.loads(body)
        assert status == 200 and "result" in reply and not reply["result"].get("isError"), body[:300]
        assert len(reply["result"]["structuredContent"]["agents"]) == n_agents

    async def rest_call():
        status, _, body = await request(application, "GET", "/api/v1/agents", rest)
        assert status == 200, body[:300]
        assert len(json.loads(body)["data"]) == n_agents

    cells = {k: v for k, v in {"mcp": mcp_call, "rest": rest_call}.items() if a.only in (None, k)}
    for fn in cells.values():  # warm-up
        for _ in range(50):
            await fn()
    if a.profile_thread:  # cProfile inside the worker thread: mcp.server.handle, or Django's sync get_response
        import mcp.transport  # deferred: (as above) after Django's set-up
        from yuzu.lanes import Chain

        prof = cProfile.Profile(time.thread_time)  # CPU of that thread: not the time it waited for the GIL

        def profiled(fn):
            def run(*args, **kwargs):
                prof.enable()
                try:
                    return fn(*args, **kwargs)
                finally:
                    prof.disable()
            return run

        mcp.transport.handle_in_thread = mcp.transport.hop(profiled(mcp.transport.handle))  # (built at import)
        Chain.get_response = profiled(Chain.get_response)
        for _ in range(a.calls):
            await cells[a.profile_thread]()
        pstats.Stats(prof).sort_stats(a.sort).print_stats(a.top)
        return
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.calls):
            await cells[a.profile]()
        prof.disable()
        pstats.Stats(prof).sort_stats(a.sort).print_stats(a.top)
        return
    if a.callgrind:  # under valgrind --tool=callgrind --instr-atstart=no: count only the calls of one route
        ctl = ["callgrind_control", str(os.getpid())]
        for name, fn in cells.items():
            subprocess.run(ctl[:1] + ["-i", "on"] + ctl[1:], check=True, capture_output=True)
            for _ in range(a.calls):
                await fn()
            subprocess.run(ctl[:1] + ["-i", "off"] + ctl[1:], check=True, capture_output=True)
            subprocess.run(ctl[:1] + ["-d", name] + ctl[1:], check=True, capture_output=True)
        return
    results = {k: [] for k in cells}
    for _ in range(a.rounds):
        for name, fn in cells.items():
            t0 = time.process_time()
            for _ in range(a.calls):
                await fn()
            results[name].append((time.process_time() - t0) * 1000 / a.calls)
    for name, xs in results.items():
        print(f"{name:5s} CPU ms/call: median {statistics.median(xs):.3f}  min {min(xs):.3f}  "
              f"rounds {' '.join(f'{x:.3f}' for x in xs)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--agents", type=int, default=50)
    ap.add_argument("--profile", choices=["mcp", "rest"])
    ap.add_argument("--postgres", metavar="URL", help="this (scratch) PostgreSQL database instead of a SQLite file")
    ap.add_argument("--profile-thread", choices=["mcp", "rest"])
    ap.add_argument("--only", choices=["mcp", "rest"], help="measure one route only")
    ap.add_argument("--callgrind", action="store_true", help="toggle callgrind's instrumentation around each route")
    ap.add_argument("--sort", default="tottime")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="yuzu-inproc-"))
    os.environ.update(DJANGO_SETTINGS_MODULE="yuzu.settings", YUZU_VAR_DIR=str(tmp), YUZU_LOG_LEVEL="WARNING",
                      YUZU_SQLITE_PATH=str(tmp / "bench.sqlite3"))
    os.environ.pop("YUZU_REDIS_URL", None)  # sessions in memory: one process
    if a.postgres:
        os.environ["YUZU_DATABASE_URL"] = a.postgres
    else:
        os.environ.pop("YUZU_DATABASE_URL", None)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, check=True)
    out = subprocess.run([sys.executable, "-c", SETUP, str(a.agents), "1"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    setup = json.loads(out.strip().splitlines()[-1])
    asyncio.run(main_async(a, setup["tokens"], setup["total_agents"]))


if __name__ == "__main__":
    main()
