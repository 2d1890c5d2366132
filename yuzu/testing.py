"""Real server processes for tests: free ports, an environment that shares the test database, and
daphne started and waited for. Used by tests/conftest.py and bridge/testing/harness.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import httpx
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.05,
               what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def server_env(**extra: object) -> dict[str, str]:
    """Environment for a server process on the test database (never the caller's ANTHROPIC_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        env["YUZU_SQLITE_PATH"] = str(db["NAME"])
        env.pop("YUZU_DATABASE_URL", None)
    else:
        user = db.get("USER") or "postgres"
        host = quote(db.get("HOST") or "127.0.0.1", safe="")  # a Unix socket's directory, URL-encoded
        env["YUZU_DATABASE_URL"] = f"postgres://{user}@{host}:{db.get('PORT') or 5432}/{db['NAME']}"
    env["DJANGO_SETTINGS_MODULE"] = "yuzu.settings"
    env["YUZU_KEK_DIR"] = str(settings.YUZU_KEK_DIR)  # the servers open the secrets the test sealed
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""


def spawn(name: str, argv: list[str], env: Mapping[str, str], log_dir: str | Path) -> Proc:
    log_path = Path(log_dir) / f"{name}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return Proc(name, proc, log_path)


def start_daphne(port: int, env: Mapping[str, str], log_dir: str | Path, name: str | None = None) -> Proc:
    p = spawn(name or f"daphne-{port}", [sys.executable, "-m", "yuzu.daphne_main", "-b", "127.0.0.1", "-p", str(port),
                                          "yuzu.asgi:application"], env, log_dir)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        if p.proc.poll() is not None:
            raise RuntimeError(f"daphne exited: {p.log()}")
        try:
            if httpx.get(base + "/healthz", timeout=1, trust_env=False).status_code == 200:
                return p
        except httpx.HTTPError:
            time.sleep(0.1)
    p.stop()
    raise RuntimeError("daphne did not become healthy")
