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
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bridge.terminal import TmuxBackend
from yuzu.testing import (  # noqa: F401  (re-exported)
    ROOT,
    free_port,
    server_env,
    spawn,
    start_daphne,
    wait_until,
)

PROTOCOL = "2025-11-25"


def start_poller(env, log_dir, name="poller"):
    return spawn(name, [sys.executable, str(ROOT / "manage.py"), "bridge_poller"], env, log_dir)


def start_redis(log_dir):
    exe = shutil.which("redis-server")
    if exe is None:
        return None, None
    port = free_port()
    p = spawn(f"redis-{port}", [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
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

    @property
    def pause_file(self):
        return Path(self.env["YUZU_BRIDGE_PAUSE_FILE"])

    def pause_poller(self, timeout=10):
        """Quiesce the poller (no connection, no writes) so the test database can be flushed safely."""
        ack = self.pause_file.with_name(self.pause_file.name + ".ack")
        ack.unlink(missing_ok=True)
        self.pause_file.touch()
        if any(p.name == "poller" and p.proc.poll() is None for p in self.procs):
            wait_until(ack.exists, timeout, what="the poller to pause")

    def resume_poller(self):
        self.pause_file.unlink(missing_ok=True)


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
                     YUZU_BRIDGE_PAUSE_FILE=str(Path(log_dir) / "poller.pause"), **DEFAULT_TIMING, **(extra_env or {}))
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
