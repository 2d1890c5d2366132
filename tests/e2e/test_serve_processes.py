"""`manage.py serve` runs one daphne per core on one port when Redis is configured (one in embedded mode), each
daphne on a CPU of its own, and Ctrl-C stops every process it started."""

import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from bridge.testing.harness import start_redis
from yuzu.testing import free_port, server_env, spawn, wait_until


def children(pid):
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return {int(line.split(None, 1)[0]): line.split(None, 1)[1] for line in out.splitlines() if line.strip()}


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone, only not yet reaped
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.live
def test_serve_runs_several_daphnes_on_one_port_and_ctrl_c_stops_them_all(transactional_db, tmp_path):
    redis_url, redis = os.environ.get("YUZU_REDIS_URL"), None
    if not redis_url:
        if shutil.which("redis-server") is None:
            pytest.skip("neither YUZU_REDIS_URL nor redis-server (Debian package 'redis-server')")
        redis, redis_url = start_redis(tmp_path)
    port = free_port()
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    env = server_env(YUZU_BIND=f"127.0.0.1:{port}", YUZU_VAR_DIR=str(var), YUZU_REDIS_URL=redis_url)
    serve = spawn("serve", [sys.executable, "manage.py", "serve", "--no-agent", "--processes", "2"], env, tmp_path)
    try:
        wait_until(lambda: serve.proc.poll() is None and _healthy(port), 60, what=f"serve: {serve.log()}")
        kids = children(serve.proc.pid)
        daphnes = [pid for pid, args in kids.items() if "daphne" in args]
        assert len(daphnes) == 2 and all("--fd" in kids[p] for p in daphnes), kids
        assert all("-m yuzu.daphne_main" in kids[p] for p in daphnes), kids  # daphne on uvloop
        assert all("uvloop/loop" in Path(f"/proc/{p}/maps").read_text() for p in daphnes)
        # Whichever daphne accepts, it answers. The first answer above says only that one daphne is up: the other
        # may still be loading Django, and the kernel queues its share of connections on its socket until it
        # accepts them (CI, loaded, saw that take over a second). Queued, not lost: each is answered.
        for _ in range(20):
            assert _healthy(port, timeout=30)
        # Each daphne listens on a socket of its own (SO_REUSEPORT), so the kernel spreads connections over them.
        # (One socket adopted by both let whichever process woke first accept a burst: bench/mcp_calls' 16
        # clients all went to one daphne. This test's burst is not enough to show that reliably, so it checks
        # the sockets too.)
        assert len({_listening_socket(p, port) for p in daphnes}) == 2
        # 24 keep-alive clients held open at once, all on one process: odds of 2 ** -23.
        clients = [httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False) for _ in range(24)]
        try:
            with ThreadPoolExecutor(len(clients)) as pool:  # connecting at once, as a burst of clients does
                assert all(r.status_code == 200 for r in pool.map(lambda c: c.get("/healthz"), clients))
            served = {p: sum(1 for c in psutil.Process(p).net_connections("tcp")
                             if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port) for p in daphnes}
            assert sum(served.values()) == 24 and all(served.values()), served
        finally:
            for c in clients:
                c.close()
        # Each daphne, every thread of it (the worker threads that served the calls above too), on a CPU of its
        # own; the other processes (the Celery worker) where the kernel likes.
        whole = os.sched_getaffinity(0)
        if len(whole) > 1:
            pinned = [_cpus(p) for p in daphnes]
            assert all(len(cpus) == 1 for cpus in pinned) and pinned[0] != pinned[1], pinned
            assert all(_cpus(p) == {frozenset(whole)} for p, args in kids.items() if "celery" in args), kids
        serve.proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert serve.proc.wait(60) == 0, serve.log()
        wait_until(lambda: not any(alive(p) for p in kids), 10, what=f"every child to exit: {kids}")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1, trust_env=False)
    finally:
        serve.stop()
        if redis is not None:
            redis.stop()


@pytest.mark.live
@pytest.mark.parametrize("pin", [None, "0"])
def test_the_embedded_daphne_runs_on_one_cpu_unless_told_not_to(transactional_db, tmp_path, pin):
    whole = os.sched_getaffinity(0)
    if len(whole) < 2:
        pytest.skip("pinning needs a process allowed on two CPUs or more")
    port = free_port()
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    env = server_env(YUZU_BIND=f"127.0.0.1:{port}", YUZU_VAR_DIR=str(var))
    env.pop("YUZU_REDIS_URL", None)
    env.pop("YUZU_SERVE_PIN", None)
    if pin is not None:
        env["YUZU_SERVE_PIN"] = pin
    serve = spawn("serve", [sys.executable, "manage.py", "serve", "--no-agent"], env, tmp_path)
    try:
        wait_until(lambda: serve.proc.poll() is None and _healthy(port), 60, what=f"serve: {serve.log()}")
        (daphne,) = [pid for pid, args in children(serve.proc.pid).items() if "daphne" in args]
        with ThreadPoolExecutor(8) as pool:  # calls at once: the daphne starts its worker threads
            assert all(pool.map(lambda _: _healthy(port), range(16)))
        cpus = _cpus(daphne)
        assert cpus == {frozenset(whole) if pin == "0" else frozenset({min(whole)})}, cpus
        assert ("on CPU" in serve.log()) == (pin != "0")
    finally:
        serve.stop()


def _cpus(pid):
    """The CPU sets of a process's threads."""
    return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}


def _healthy(port, timeout=1.0):
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=timeout, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _listening_socket(pid, port):
    """The inode of the socket ``pid`` listens on ``port`` with."""
    fd = next(c.fd for c in psutil.Process(pid).net_connections("tcp")
              if c.status == psutil.CONN_LISTEN and c.laddr.port == port)
    return os.readlink(f"/proc/{pid}/fd/{fd}")
