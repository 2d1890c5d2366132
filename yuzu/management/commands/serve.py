"""Run everything `make run` needs in the foreground: daphne, the background workers and a local
agent. Ctrl-C (or SIGTERM) stops everything it started.

With Redis (YUZU_REDIS_URL) it runs one daphne per core on one port: sessions, stream rings, the bridge's
rendezvous and the channel layer are shared through Redis, so any process can answer any request. The parent
opens one listening socket per daphne on the port (``SO_REUSEPORT``) and each daphne adopts its own (``--fd``),
so the kernel spreads new connections over the processes. (One socket adopted by all let whichever daphne woke
first accept a whole burst: 16 keep-alive clients all on one process, the other idle.) In embedded mode that
state lives in one process, so there is one daphne — on a socket the parent opens the same way.

Each daphne runs on one CPU of its own (yuzu.cpus), its threads with it: a daphne is one event loop and a
few worker threads under one GIL, and on a CPU of its own a thread that lets the GIL go around a short C call
(a SQLite step, a socket send) takes it back without a hand-off. Free to run on every core, its threads
trade the GIL across CPUs instead — embedded, at 16 concurrent calls, 31 context switches per call against 1.4
pinned, and 1.5× the CPU per call (bench/mcp_calls, eleventh round). ``--no-pin`` (YUZU_SERVE_PIN=0) leaves
the kernel free to place them."""

import os
import signal
import socket
import subprocess
import sys
import time
from argparse import ArgumentParser
from pathlib import Path
from types import FrameType

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from yuzu.cpus import ENV as CPUS_ENV
from yuzu.cpus import affinity, pinned_cpus

# Connections the kernel completes and queues for a daphne that has not accepted them yet. Twisted's default
# (daphne -b/-p) is 50: thousands of agents reconnecting at once (a server restart, bench/fanout's swarms)
# overflowed it while daphne was busy registering the ones before; the dropped handshakes then timed out on
# the agents' side (15 s) and came back as retries. Capped by net.core.somaxconn (4096 on current kernels).
BACKLOG = 2048


class Command(BaseCommand):
    help = "Serve yuzu: daphne + workers (+ a local agent)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--no-agent", action="store_true", help="do not start the local agent")
        parser.add_argument("--no-beat", action="store_true",
                            help="do not start celery beat (on every host but one, when several hosts serve)")
        parser.add_argument("--processes", type=int, default=None,
                            help="server (daphne) processes on the one port; default: YUZU_SERVE_PROCESSES, else "
                                 "the number of cores with Redis, 1 in embedded mode")
        parser.add_argument("--no-pin", action="store_true",
                            help="do not pin each daphne to a CPU of its own (also YUZU_SERVE_PIN=0)")

    def handle(self, *args: str, no_agent: bool, no_beat: bool, no_pin: bool, processes: int | None,
               **opts: object) -> None:
        # The checks that need the database too (e.g. yuzu.E010: the secrets' key files match it): refuse to
        # serve with keys that cannot open what is stored.
        self.check(databases=["default"], display_num_errors=True)
        host, _, port = settings.YUZU_BIND.rpartition(":")
        py = sys.executable
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        n = server_processes(processes)
        daphne = [py, "-m", "yuzu.daphne_main", "--application-close-timeout", "35", "yuzu.asgi:application"]
        socks = listen(host.strip("[]") or "127.0.0.1", int(port), n)
        listeners = {"daphne": socks[0]} if n == 1 else {f"daphne-{i + 1}": s for i, s in enumerate(socks)}
        procs = {name: daphne[:3] + ["--fd", str(s.fileno())] + daphne[3:] for name, s in listeners.items()}
        cpus = dict(zip(listeners, pinned_cpus(n, not no_pin and settings.YUZU_SERVE_PIN), strict=False))
        if cpus:  # what a daphne starts that must not stay on its CPU gets these back (yuzu.cpus.unpinned)
            os.environ[CPUS_ENV] = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        if settings.REDIS_URL:
            procs["celery-worker"] = [py, "-m", "celery", "-A", "yuzu", "worker", "-l", "warning", "--concurrency", "2"]
            if not no_beat:
                procs["celery-beat"] = [py, "-m", "celery", "-A", "yuzu", "beat", "-l", "warning",
                                        "-s", str(settings.VAR_DIR / "celerybeat-schedule")]
        else:
            procs["sweeper"] = [py, manage, "run_periodic"]
        for name, argv in self.extra_processes(no_agent, py, manage, host, port).items():
            procs[name] = argv
        base = f"http://{settings.YUZU_BIND}"
        self.stdout.write(f"yuzu serving on {base}/ ({', '.join(procs)}); Ctrl-C stops it.\n"
                          f"  admin and approvals: {base}/admin/   MCP: {base}/mcp/v1/\n"
                          f"  REST API reference:  {base}/api/v1/docs   (OpenAPI: {base}/api/v1/openapi.json)")
        # celery beat writes its schedule under var/ and starts nothing else: it alone runs with a private
        # umask (the others keep the caller's, which bridge workers and agent commands inherit).
        running = {}
        for name, argv in procs.items():
            with affinity({cpus[name]} if name in cpus else None):
                running[name] = subprocess.Popen(argv, start_new_session=True,
                                                 umask=0o077 if name == "celery-beat" else -1,
                                                 pass_fds=(listeners[name].fileno(),) if name in listeners else ())
        for sock in listeners.values():
            sock.close()  # its daphne holds it now
        if cpus:  # what each got (a CPU the kernel refused leaves that daphne free to run anywhere)
            try:
                placed = {name: sorted(os.sched_getaffinity(running[name].pid)) for name in cpus}
                self.stdout.write("  " + ", ".join(f"{name} on CPU {','.join(map(str, c))}" for name, c in placed.items())
                                  + " (--no-pin: anywhere)")
            except OSError:  # one has exited already: the loop below says so
                pass
        stop = {"now": False}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop["now"] = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        code = 0
        try:
            while not stop["now"]:
                for name, p in running.items():
                    if p.poll() is not None:
                        self.stderr.write(f"{name} exited with {p.returncode}; stopping.")
                        code = p.returncode or 1
                        stop["now"] = True
                        break
                time.sleep(0.5)
        finally:
            for p in running.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            deadline = time.time() + 40
            for p in running.values():
                try:
                    p.wait(max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
        sys.exit(code)

    def extra_processes(self, no_agent: bool, py: str, manage: str, host: str, port: str) -> dict[str, list[str]]:
        """The local agent and the bridge's status poller, where those features are installed."""
        extra = {}
        if not no_agent and (Path(settings.BASE_DIR) / "fleet" / "agent" / "__main__.py").exists():
            extra["agent"] = [py, manage, "runagent", "--local", "--server", f"ws://{host or '127.0.0.1'}:{port}"]
        if (Path(settings.BASE_DIR) / "bridge" / "management" / "commands" / "bridge_poller.py").exists():
            extra["bridge-poller"] = [py, manage, "bridge_poller"]
        return extra




def server_processes(requested: int | None) -> int:
    """How many daphnes: asked for, else YUZU_SERVE_PROCESSES, else one per core with Redis and 1 without."""
    n = requested or settings.YUZU_SERVE_PROCESSES or ((os.cpu_count() or 1) if settings.REDIS_URL else 1)
    if n < 1:
        raise CommandError("--processes must be at least 1")
    if n > 1 and not settings.REDIS_URL:
        raise CommandError(f"{n} server processes need Redis (YUZU_REDIS_URL): in embedded mode MCP sessions, "
                           "streams and the channel layer live inside one process. Set YUZU_REDIS_URL, or serve "
                           "with --processes 1.")
    return n


def listen(host: str, port: int, n: int) -> list[socket.socket]:
    """``n`` listening sockets on one port (``SO_REUSEPORT``), one for each daphne, each with a BACKLOG-deep accept
    queue. A port someone already listens on is refused first: a plain bind there fails, where a reuse-port bind
    could join another server's port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    socks = [socket.create_server((host, port), family=family, backlog=BACKLOG, reuse_port=True) for _ in range(n)]
    for sock in socks:
        sock.set_inheritable(True)
    return socks
