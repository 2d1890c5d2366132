"""End-to-end harness for the bridge's tests: a real daphne (or several), the poller process, an
optional private redis-server, and a small raw JSON-RPC MCP client over httpx.

Used by tests/test_bridge_*.py. The processes share the test database (SQLite file or PostgreSQL),
so the tests that drive them must commit their data (pytest-django ``transactional_db``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent.parent
PROTOCOL = "2025-11-25"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout=10.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def server_env(**extra):
    """Environment for a server process on the test database (never the caller's ANTHROPIC_*)."""
    from django.db import connection

    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        env["YUZU_SQLITE_PATH"] = str(db["NAME"])
        env.pop("YUZU_DATABASE_URL", None)
    else:
        user = db.get("USER") or "postgres"
        env["YUZU_DATABASE_URL"] = f"postgres://{user}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"
    env["DJANGO_SETTINGS_MODULE"] = "yuzu.settings"
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen
    log_path: Path

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log(self, tail=4000):
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""


def _spawn(name, argv, env, log_dir):
    log_path = Path(log_dir) / f"{name}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return Proc(name, proc, log_path)


def start_daphne(port, env, log_dir, name=None):
    p = _spawn(name or f"daphne-{port}", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
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


def start_poller(env, log_dir, name="poller"):
    return _spawn(name, [sys.executable, str(ROOT / "manage.py"), "bridge_poller"], env, log_dir)


def start_redis(log_dir):
    exe = shutil.which("redis-server")
    if exe is None:
        return None, None
    port = free_port()
    p = _spawn(f"redis-{port}", [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                 "--dir", str(log_dir)], dict(os.environ), log_dir)
    url = f"redis://127.0.0.1:{port}/0"

    def ready():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    wait_until(ready, 10, what="redis-server")
    return p, url


@dataclass
class BridgeStack:
    """daphne (+ more daphnes) + poller on one private tmux socket."""

    base: str
    socket_name: str
    env: dict
    log_dir: Path
    procs: list = field(default_factory=list)

    @property
    def bridge_url(self):
        return self.base + "/mcp/bridge/"

    @property
    def api(self):
        return self.base + "/api/v1"

    def backend(self):
        from bridge.terminal import TmuxBackend

        return TmuxBackend(self.socket_name)

    def logs(self):
        return "\n".join(f"--- {p.name} ---\n{p.log()}" for p in self.procs)

    def close_panes(self):
        b = self.backend()
        for pane in b.list_panes():
            b.close(pane.pane_id)

    def stop(self):
        for p in reversed(self.procs):
            p.stop()
        self.backend().shutdown()


DEFAULT_TIMING = {
    "YUZU_BRIDGE_POLL_INTERVAL": "0.15",
    "YUZU_BRIDGE_RECHECK_SECONDS": "0.25",
    "YUZU_BRIDGE_PICKUP_GRACE_POLLS": "4",
}


def start_stack(log_dir, *, poller=True, extra_env=None):
    port = free_port()
    sock = f"yuzu-bt-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    base = f"http://127.0.0.1:{port}"
    env = server_env(YUZU_BRIDGE_URL=base + "/mcp/bridge/", YUZU_BRIDGE_TMUX_SOCKET=sock,
                     **DEFAULT_TIMING, **(extra_env or {}))
    stack = BridgeStack(base=base, socket_name=sock, env=env, log_dir=Path(log_dir))
    try:
        stack.procs.append(start_daphne(port, env, log_dir))
        if poller:
            stack.procs.append(start_poller(env, log_dir))
    except Exception:
        stack.stop()
        raise
    return stack


# -- a raw JSON-RPC MCP client -------------------------------------------------------------------


@dataclass
class CallResult:
    structured: dict | None = None
    is_error: bool = False
    rpc_error: dict | None = None
    status: int = 200

    @property
    def error_code(self):
        if self.is_error and self.structured:
            return (self.structured.get("error") or {}).get("code")
        return None

    def __getitem__(self, key):
        return self.structured[key]

    def get(self, key, default=None):
        return (self.structured or {}).get(key, default)


class Mcp:
    """Just enough MCP over Streamable HTTP: initialize, then tools/call with session headers."""

    def __init__(self, url, token):
        self.url, self.token = url, token
        self.sid = None
        self._id = 0
        self.http = httpx.Client(trust_env=False, timeout=httpx.Timeout(30.0, read=None))

    def close(self):
        self.http.close()

    def headers(self):
        h = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
             "Accept": "application/json, text/event-stream"}
        if self.sid:
            h["Mcp-Session-Id"] = self.sid
            h["MCP-Protocol-Version"] = PROTOCOL
        return h

    def post(self, msg, timeout=60.0):
        r = self.http.post(self.url, content=json.dumps(msg), headers=self.headers(),
                           timeout=httpx.Timeout(30.0, read=timeout))
        return r

    def initialize(self):
        r = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                       "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                                  "clientInfo": {"name": "bridge-test", "version": "0"}}})
        if r.status_code != 200:
            return r
        self.sid = r.headers.get("mcp-session-id")
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return r

    def rpc(self, method, params=None, timeout=60.0):
        if self.sid is None:
            r = self.initialize()
            if r.status_code != 200:
                return r
        self._id += 1
        msg = {"jsonrpc": "2.0", "id": self._id, "method": method}
        if params is not None:
            msg["params"] = params
        return self.post(msg, timeout)

    def call(self, name, args=None, timeout=60.0):
        r = self.rpc("tools/call", {"name": name, "arguments": args or {}}, timeout)
        if r.status_code != 200:
            return CallResult(status=r.status_code, rpc_error=(r.json() if r.content else {}).get("error"))
        body = r.json()
        if "error" in body:
            return CallResult(rpc_error=body["error"])
        res = body["result"]
        return CallResult(structured=res.get("structuredContent"), is_error=bool(res.get("isError")))

    def tools(self):
        r = self.rpc("tools/list")
        return r.json()["result"]["tools"]
