"""Private services the fault tests may kill: a redis-server and a PostgreSQL cluster of their own, on free
ports in a temp dir, never the shared ones (six other sessions use 5432 and 6379).

Everything here is plain processes and files: the fault tests drive real daphne, Celery and agent
processes against these services over HTTP and WebSockets, and read the database directly (psycopg) to
prove what was stored. Nothing in the test process itself is configured for these services."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg

from yuzu.testing import ROOT, free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class PrivateRedis:
    """A redis-server on a free port, no persistence; stop() and start() keep the port."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.dir = tmp / f"redis-{self.port}"
        self.dir.mkdir()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrivateRedis:
        log = open(self.dir / "redis.log", "a")
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(self.dir)],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        until(self.ping, 10, "the private redis-server")
        return self

    def ping(self) -> bool:
        r = subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True)
        return r.stdout.strip() == "PONG"

    def stop(self) -> None:
        """SIGKILL: Redis gone at once, as a crashed or partitioned server looks to its clients."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def cli(self, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True).stdout


class PrivatePostgres:
    """A PostgreSQL 15 cluster in a temp dir (trust auth, unix socket in the dir) on a free TCP port."""

    def __init__(self, tmp: Path, name: str = "yuzu_faults"):
        self.port = free_port()
        # Its own dir under /tmp (pytest's tmp dirs are private to root, and postgres runs as nobody under root).
        self.dir = Path(tempfile.mkdtemp(prefix=f"yuzu-faults-pg-{self.port}-"))
        if os.geteuid() == 0:
            shutil.chown(self.dir, "nobody", "nogroup")
        self.data = self.dir / "data"
        self.name = name
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/{name}"
        self.dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname={name}"
        subprocess.run([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True, **_as_postgres())

    def start(self) -> PrivatePostgres:
        # fsync=off is safe for what these scenarios do (processes killed, never the machine: the OS keeps what
        # was written). synchronous_commit stays on, as in production: off, a commit is acknowledged before its
        # WAL is written, and an immediate stop (a crash) loses the last ones — a recall answered 200 whose
        # ticket and execution then vanished, which read as a product bug (issue 22).
        subprocess.run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "pg.log"), "-w", "-t", "30",
                        "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                              "-c max_connections=300", "start"],
                       check=True, capture_output=True, **_as_postgres())
        return self

    def create_database(self) -> None:
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{self.name}"')

    def stop(self, mode: str = "immediate") -> None:
        """``immediate``: the postmaster kills every backend at once (a crash, a failover's old primary)."""
        subprocess.run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop"],
                       capture_output=True, **_as_postgres())

    def query(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            cur = c.execute(sql, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description is not None else []

    def connections(self) -> int:
        return self.query("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", self.name)[0][0]


def _as_postgres() -> dict[str, Any]:
    """initdb and postgres refuse to run as root: run them as the owner of the temp dir's parent (root → nobody)."""
    if os.geteuid() != 0:
        return {}
    import pwd

    nobody = pwd.getpwnam("nobody")
    return {"user": nobody.pw_uid, "group": nobody.pw_gid}


class Cluster:
    """Server processes (daphne, Celery, agents) against the private services; everything logs to tmp."""

    def __init__(self, tmp: Path, *, database_url: str = "", redis_url: str = "", sqlite_path: str = "", **extra: str):
        self.tmp = tmp
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "YUZU_"))}
        self.env.update(DJANGO_SETTINGS_MODULE="yuzu.settings", PYTHONUNBUFFERED="1", YUZU_VAR_DIR=str(tmp / "var"),
                        YUZU_KEK_DIR=str(tmp / "keys"), YUZU_LOG_LEVEL="INFO")
        (tmp / "keys").mkdir(exist_ok=True, mode=0o700)
        (tmp / "var").mkdir(exist_ok=True)
        if database_url:
            self.env["YUZU_DATABASE_URL"] = database_url
        if sqlite_path:
            self.env["YUZU_SQLITE_PATH"] = sqlite_path
        if redis_url:
            self.env["YUZU_REDIS_URL"] = redis_url
        self.env.update(extra)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def manage(self, *args: str, timeout: float = 180) -> str:
        r = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True,
                           text=True, timeout=timeout)
        if r.returncode:
            raise AssertionError(f"manage.py {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def prepare(self) -> None:
        self.manage("migrate", "--noinput", "-v0")
        self.manage("shell", "-c", "from yuzu.rbac import seed_builtin_roles; seed_builtin_roles()")

    def token(self, user: str = "fault-op", role: str = "Operator", tier: str = "") -> str:
        args = ["mint_token", "--user", user, "--name", f"{user}-{time.monotonic_ns()}", "--role", role]
        if tier:
            args += ["--tier", tier]
        return self.manage(*args).strip().splitlines()[-1]

    def tokens(self, count: int, user: str = "fault-streams", role: str = "Operator", tier: str = "operator") -> list[str]:
        """``count`` MCP tokens of one user, minted in one process (a GET stream budget is per token)."""
        code = ("from datetime import timedelta; from django.utils import timezone; "
                "from django.contrib.auth import get_user_model; from yuzu.models import ApiToken; "
                "from yuzu.rbac import assign_role; "
                f"u = get_user_model().objects.get_or_create(username={user!r})[0]; assign_role(u, {role!r}); "
                f"print('\\n'.join(ApiToken.mint(u, f'{user}-{{i}}', mcp_tier={tier!r}, "
                f"expires_at=timezone.now() + timedelta(days=30))[1] for i in range({count})))")
        return self.manage("shell", "-c", code).split()[-count:]

    def device_token(self, uses: int = 10) -> str:
        return self.manage("mint_device_token", "--name", "faults", "--max-uses", str(uses)).strip().splitlines()[-1]

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log_path = self.tmp / f"{name}.log"
        log = open(log_path, "a")
        p = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[name], self.logs[name] = p, log_path
        return p

    def daphne(self, name: str = "daphne", port: int | None = None) -> str:
        port = port or free_port()
        p = self.spawn(name, [sys.executable, "-m", "yuzu.daphne_main", "-b", "127.0.0.1", "-p", str(port),
                              "--application-close-timeout", "10", "yuzu.asgi:application"])
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            if p.poll() is not None:
                raise AssertionError(f"{name} exited:\n{self.log(name)}")
            try:
                return httpx.get(base + "/healthz", timeout=1, trust_env=False).status_code == 200
            except httpx.HTTPError:
                return False

        until(healthy, 40, name)
        return base

    def celery(self, name: str = "celery-worker") -> subprocess.Popen[bytes]:
        return self.spawn(name, [sys.executable, "-m", "celery", "-A", "yuzu", "worker", "-l", "info", "--concurrency",
                                 "2", "--without-gossip", "--without-mingle", "-n", f"{name}-{time.monotonic_ns()}@%h"])

    def beat(self, name: str = "celery-beat") -> subprocess.Popen[bytes]:
        """Celery beat: the periodic tasks, among them the sweep that ends a silent agent's command in TIMEOUT."""
        return self.spawn(name, [sys.executable, "-m", "celery", "-A", "yuzu", "beat", "-l", "info",
                                 "--schedule", str(self.tmp / f"{name}-schedule")])

    def agent(self, base: str, device_token: str, name: str = "agent",
              script_allow: list[list[str]] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
        state = self.tmp / f"state-{name}"
        state.mkdir()
        (state / "config.json").write_text(json.dumps({"script_allow": script_allow or [],
                                                       "tags": {"environment": "faults"}}))
        p = self.spawn(name, [sys.executable, "-m", "fleet.agent", "--server", base.replace("http", "ws", 1),
                              "--token", device_token, "--state-dir", str(state)])
        return p, state

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs.get(name)
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    def log(self, name: str, tail: int = 4000) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace")[-tail:] if path and path.exists() else ""

    def all_logs(self, tail: int = 2500) -> str:
        return "\n".join(f"--- {n} ---\n{self.log(n, tail)}" for n in self.logs)

    def close(self) -> None:
        for name in reversed(list(self.procs)):
            self.kill(name, signal.SIGTERM)


@contextmanager
def private_postgres(tmp: Path) -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres(tmp)
    pg.start()
    try:
        pg.create_database()
        yield pg
    finally:
        pg.stop("immediate")
        shutil.rmtree(pg.dir, ignore_errors=True)


@contextmanager
def private_redis(tmp: Path) -> Iterator[PrivateRedis]:
    r = PrivateRedis(tmp).start()
    try:
        yield r
    finally:
        r.stop()


MODERN = "2026-07-28"


def mcp_modern(client: httpx.Client, base: str, token: str, method: str, params: dict[str, Any] | None = None,
               timeout: float = 30) -> httpx.Response:
    """One MCP 2026-07-28 request: no session, authenticated on its own (what a DB-only read needs)."""
    params = dict(params or {})
    params["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                       "io.modelcontextprotocol/clientCapabilities": {},
                       "io.modelcontextprotocol/clientInfo": {"name": "yuzu-faults", "version": "1"}}
    headers = {"Authorization": f"Bearer {token}", "MCP-Protocol-Version": MODERN, "Mcp-Method": method,
               "Accept": "application/json, text/event-stream"}
    if method == "tools/call":
        headers["Mcp-Name"] = params["name"]
    return client.post(base + "/mcp/v1/", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                       headers=headers, timeout=timeout)


def mcp_tool(client: httpx.Client, base: str, token: str, name: str, timeout: float = 30,
             **arguments: Any) -> httpx.Response:
    return mcp_modern(client, base, token, "tools/call", {"name": name, "arguments": arguments}, timeout=timeout)


def mcp_initialize(client: httpx.Client, base: str, token: str, timeout: float = 30) -> httpx.Response:
    """The handshake era's initialize: it mints a session (in Redis when Redis is configured)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "yuzu-faults", "version": "1"}}}
    return client.post(base + "/mcp/v1/", json=body, timeout=timeout,
                       headers={"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"})


def timed(fn: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    t = time.monotonic()
    r = fn()
    return r, time.monotonic() - t
