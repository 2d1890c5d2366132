"""How many server processes `manage.py serve` runs (one per core with Redis, one in embedded mode), the
listening sockets it opens for them, and the CPU each runs on."""

import os
import socket
import subprocess
import sys
import time

import pytest
from django.core.management.base import CommandError

from yuzu.cpus import ENV, affinity, pinned_cpus, unpinned
from yuzu.management.commands.serve import listen, server_processes


def test_process_count(settings):
    settings.REDIS_URL, settings.YUZU_SERVE_PROCESSES = "", 0
    assert server_processes(None) == 1  # embedded: sessions and streams live in one process
    with pytest.raises(CommandError, match="need Redis"):
        server_processes(2)
    settings.REDIS_URL = "redis://127.0.0.1:6379/9"
    assert server_processes(None) == (os.cpu_count() or 1)
    settings.YUZU_SERVE_PROCESSES = 3
    assert server_processes(None) == 3 and server_processes(2) == 2


def test_each_daphne_gets_the_next_cpu_this_process_may_use(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5, 1, 3})  # a cpuset or taskset: not 0..n-1
    assert pinned_cpus(1) == [1]
    assert pinned_cpus(4) == [1, 3, 5, 1]  # more daphnes than CPUs: round again
    assert pinned_cpus(2, pin=False) == []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2})
    assert pinned_cpus(2) == []  # one CPU: nothing to pin to


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs a process allowed on two CPUs or more")
def test_a_process_started_within_affinity_runs_on_that_cpu_and_the_caller_gets_its_cpus_back():
    whole = os.sched_getaffinity(0)
    cpu = max(whole)
    with affinity({cpu}):
        child = subprocess.Popen(["sleep", "30"])
    try:
        assert os.sched_getaffinity(child.pid) == {cpu}
        assert os.sched_getaffinity(0) == whole
    finally:
        child.kill()
        child.wait()
    with affinity(None):
        assert os.sched_getaffinity(0) == whole
    with affinity({4096}):  # no such CPU here (a cpuset that changed under serve): started as it is, not refused
        assert os.sched_getaffinity(0) == whole
    assert os.sched_getaffinity(0) == whole


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs a process allowed on two CPUs or more")
def test_what_a_pinned_daphne_starts_runs_on_the_cpus_serve_had(monkeypatch):
    """The bridge's tmux server, started by a daphne's tmux client, and the worker sessions in its panes."""
    whole = os.sched_getaffinity(0)
    monkeypatch.setenv(ENV, ",".join(map(str, sorted(whole))))
    with affinity({min(whole)}):  # a daphne's worker thread
        with unpinned():
            child = subprocess.Popen(["sleep", "30"])
        assert os.sched_getaffinity(0) == {min(whole)}  # the thread itself stays pinned
    try:
        assert os.sched_getaffinity(child.pid) == whole
    finally:
        child.kill()
        child.wait()
    monkeypatch.delenv(ENV)
    with affinity({min(whole)}), unpinned():  # not under serve: nothing to give back
        assert os.sched_getaffinity(0) == {min(whole)}


def test_one_socket_per_daphne_on_one_port_and_a_port_in_use_is_refused():
    socks = listen("127.0.0.1", 0, 1)  # a free port, then two more sockets on it
    port = socks[0].getsockname()[1]
    socks[0].close()
    socks = listen("127.0.0.1", port, 2)
    try:
        assert [s.getsockname()[1] for s in socks] == [port, port] and socks[0].fileno() != socks[1].fileno()
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for s in socks)
        # Listened on already — by our own reuse-port sockets here, as by another server's: refused, never joined.
        with pytest.raises(CommandError, match=f"cannot listen on 127.0.0.1:{port}"):
            listen("127.0.0.1", port, 2)
    finally:
        for s in socks:
            s.close()
    with socket.create_server(("127.0.0.1", 0)) as plain:  # a plain listener (another program)
        with pytest.raises(CommandError, match="cannot listen"):
            listen("127.0.0.1", plain.getsockname()[1], 2)


def test_a_connect_burst_waits_in_the_accept_queue_while_the_server_is_busy():
    """Thousands of agents reconnect at once after a restart. Connections the busy daphne has not accepted yet
    wait in the kernel's accept queue; with Twisted's default backlog (50) the rest of the burst was dropped, and
    the agents' handshakes timed out (bench/fanout's 5,000-agent connect). 300 connects at once, then accepted: all
    there within 3 s (with a backlog of 50, 102 were: the rest were still re-sending their SYNs)."""
    (server,) = listen("127.0.0.1", 0, 1)
    clients = []
    try:
        address = server.getsockname()
        for _ in range(300):
            client = socket.socket()
            client.setblocking(False)
            client.connect_ex(address)
            clients.append(client)
        server.setblocking(False)
        queued, deadline = [], time.monotonic() + 3
        while len(queued) < 300 and time.monotonic() < deadline:
            try:
                queued.append(server.accept()[0])
            except BlockingIOError:
                time.sleep(0.01)
        for conn in queued:
            conn.close()
        assert len(queued) == 300
    finally:
        server.close()
        for client in clients:
            client.close()


def test_daphne_runs_twisted_on_uvloop():
    """serve, the tests and the benches start daphne as ``python -m yuzu.daphne_main``: Twisted's reactor on
    uvloop's event loop (the policy must be in place before daphne.server makes its loop)."""
    out = subprocess.run([sys.executable, "-c", "import yuzu.daphne_main, daphne.server as s; "
                          "from twisted.internet import reactor; "
                          "print(type(s.twisted_loop).__module__, reactor._asyncioEventloop is s.twisted_loop)"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["uvloop", "True"], out
