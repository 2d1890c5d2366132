"""Run everything `make run` needs in the foreground: daphne, the background workers and a local
agent. Ctrl-C (or SIGTERM) stops everything it started."""

import os
import signal
import subprocess
import sys
import time
from argparse import ArgumentParser
from pathlib import Path
from types import FrameType

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve yuzu: daphne + workers (+ a local agent)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--no-agent", action="store_true", help="do not start the local agent")

    def handle(self, *args: str, no_agent: bool, **opts: object) -> None:
        # The checks that need the database too (e.g. yuzu.E010: the secrets' key files match it): refuse to
        # serve with keys that cannot open what is stored.
        self.check(databases=["default"], display_num_errors=True)
        host, _, port = settings.YUZU_BIND.rpartition(":")
        py = sys.executable
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        procs = {"daphne": [py, "-m", "daphne", "-b", host.strip("[]") or "127.0.0.1", "-p", port,
                            "--application-close-timeout", "35", "yuzu.asgi:application"]}
        if settings.REDIS_URL:
            procs["celery-worker"] = [py, "-m", "celery", "-A", "yuzu", "worker", "-l", "warning", "--concurrency", "2"]
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
        running = {name: subprocess.Popen(argv, start_new_session=True, umask=0o077 if name == "celery-beat" else -1)
                   for name, argv in procs.items()}
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


