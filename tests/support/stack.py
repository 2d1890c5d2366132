"""A real stack: daphne, background workers and real agents, all on the test database."""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from fleet.models import Agent
from yuzu.testing import ROOT, server_env

REDIS = bool(settings.REDIS_URL)


def wait_for(check, timeout, what, logs=lambda: ""):
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout} s waiting for {what}\n{logs()}")


class Proc:
    """A child process in its own session (so its whole group can be signalled), logging to a file."""

    def __init__(self, name, argv, tmp_path, env):
        self.name = name
        self.state = None  # an agent's state directory (Stack.agent)
        self.log_path = tmp_path / f"{name}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def tail(self, n=3000):
        return f"--- {self.name} ({self.log_path}) ---\n" + self.log_path.read_text(errors="replace")[-n:]

    def kill(self):
        """SIGKILL the whole process group at once (no shutdown handlers run)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
            except ProcessLookupError:
                pass
        self._log.close()


class Stack:
    """daphne + background workers + real agents, all sharing the test database."""

    def __init__(self, server, tmp_path):
        self.server, self.tmp_path = server, tmp_path
        self.env = server_env()
        self.procs, self.orphans = [], set()
        self.worker = None
        if REDIS:
            from yuzu.celery import app

            app.control.purge()  # what an earlier run left in the broker, before anything is queued
            self.worker = self.start_worker()
            self.spawn("celery-beat", [sys.executable, "-m", "celery", "-A", "yuzu", "beat", "-l", "info",
                                       "-s", str(tmp_path / "celerybeat-schedule")])
        else:
            self.spawn("run_periodic", [sys.executable, "manage.py", "run_periodic"])

    def spawn(self, name, argv):
        p = Proc(name, argv, self.tmp_path, self.env)
        self.procs.append(p)
        return p

    def start_worker(self):
        """The worker `serve` starts, minus the start-up chatter with other workers."""
        return self.spawn("celery-worker", [sys.executable, "-m", "celery", "-A", "yuzu", "worker", "-l", "info",
                                            "--concurrency", "2", "--without-gossip", "--without-mingle",
                                            "-n", f"fleet-e2e-{time.monotonic_ns()}@%h"])

    def logs(self):
        daphne_log = Path(self.server.log)
        return "\n".join([f"--- daphne ({daphne_log}) ---\n" + daphne_log.read_text(errors="replace")[-3000:]]
                          + [p.tail() for p in self.procs])

    def agent(self, script_allow=None, server=None, state=None):
        """Start a real agent enrolled with a fresh device token (or, given the ``state`` directory of one that
        ran before — its Proc's ``state`` — that agent again: a restart); returns (Proc, agent_id) once connected. ``server``: the
        ws:// URL it connects to (default this daphne)."""
        argv = [sys.executable, "-m", "fleet.agent", "--server", server or f"ws://127.0.0.1:{self.server.port}"]
        if state is None:
            out = io.StringIO()
            call_command("mint_device_token", "--name", "fleet e2e", "--max-uses", "1", stdout=out)
            state = self.tmp_path / f"agent-{len(self.procs)}"
            state.mkdir()
            (state / "config.json").write_text(json.dumps({"script_allow": script_allow or [],
                                                           "tags": {"environment": "e2e"}}))
            argv += ["--token", out.getvalue().strip()]
        proc = self.spawn("agent", argv + ["--state-dir", str(state)])
        proc.state = state

        def connected():
            if proc.proc.poll() is not None:
                pytest.fail(f"the agent exited with {proc.proc.returncode}\n{self.logs()}")
            if not (state / "state.json").exists():
                return None
            agent_id = json.loads((state / "state.json").read_text())["agent_id"]
            return agent_id if Agent.objects.filter(pk=agent_id, connected=True).exists() else None

        return proc, wait_for(connected, 20, "the agent to enrol and connect", self.logs)

    def close(self):
        for p in reversed(self.procs):
            p.stop()
        for pid in self.orphans:  # plugin processes of a SIGKILLed agent (they run in their own session)
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
