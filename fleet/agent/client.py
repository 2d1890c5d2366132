"""The agent's connection loop: enrol once, register on every connect, heartbeat, report inventory, and
run the commands the server sends (docs/agent-protocol.md).

Reconnects with exponential backoff and jitter. Plugins run in a thread pool so heartbeats keep
flowing; a terminal response that could not be sent is kept and re-sent after the next register.
The server re-sends a command it has no acknowledgement for: the agent runs each command_id once (it
remembers recent ones across reconnects) and answers a repeat with the result it kept, or with a
``received`` frame while the command still runs. After each register the server asks about the commands it
holds as running (``result.query``): a terminal frame sent into a connection that died on the way counted as
sent here, so only the kept copy can answer it."""

import asyncio
import base64
import json
import logging
import os
import platform
import random
import socket
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import websockets
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from websockets.exceptions import ConnectionClosed, WebSocketException

from . import __version__, signing, write_private
from .control import PluginControl
from .dex import Telemetry
from .guardian import Guardian
from .inventory_sync import InventorySync
from .plugins import PLUGINS, Context, Result, catalogue, execute, os_facts

log = logging.getLogger("yuzu.agent")

WS_PATH = "/agent/v1/ws"
MAX_OUTPUT = 1024 * 1024  # the server's per-frame output limit
MAX_SEND = 1024 * 1024 - 1024  # daphne's default limit on an incoming message is 1 MiB
MAX_ERROR = 64 * 1024
MAX_FRAME = 8 * 1024 * 1024  # a command carries up to 32 parameters of 64 KiB
CLOSE_MALFORMED, CLOSE_REFUSED, CLOSE_SUPERSEDED = 4400, 4401, 4409
BACKOFF_CAP_S = 60.0
REPLY_TIMEOUT_S = 30.0
OUTBOX_MAX = 1000
SEEN_MAX = 4096  # command ids remembered, so a re-sent command is not run again
RESULTS_MAX_BYTES = 16 * 1024 * 1024  # terminal frames kept to answer a re-sent command with
RESULT_QUERY_MAX = 100  # command ids the server may ask about in one result.query frame
MAX_ID_BYTES = 160  # a command_id


class Refused(Exception):
    """This agent has no usable identity (token or credential refused, or none given): retrying cannot help."""


def proof(key_pem, nonce, agent_id):
    """The connection's proof of possession: the agent key's signature over the server's nonce
    (the message pki.ca.proof_message builds on the server)."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    message = b"yuzu-agent-proof-v1\n" + nonce.encode() + b"\n" + agent_id.encode()
    return base64.b64encode(key.sign(message, ec.ECDSA(hashes.SHA256()))).decode()


def renewal_due(cert_pem, now=None):
    """After two thirds of the certificate's life (spec/pki.md §1)."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    start, end = cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()
    return (now or time.time()) >= start + (end - start) * 2 / 3


def default_state_dir():
    if os.geteuid() == 0:
        return "/var/lib/yuzu-agent"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "yuzu-agent")


def load_config(path):
    """The agent's config: a JSON file (optional), then environment overrides.

    Keys: ``tags`` {key: value}, ``script_allow`` [[argv…]…], ``script_timeout_max`` s,
    ``script_output_cap`` bytes, ``dex_disable`` bool, ``procperf_enabled`` bool (fleet.agent.dex),
    ``quarantine_enforce`` bool, ``guardian_enforce`` bool (Guardian may write
    the expected state back), ``guardian_poll_s`` (override the guards' poll intervals), ``trust_bundle`` (CA
    PEM path), ``require_signature`` bool, ``crl_max_age`` s (fleet.agent.signing)."""
    config = {}
    if path and os.path.exists(path):
        with open(path) as f:
            config = json.load(f)
    if os.environ.get("YUZU_AGENT_SCRIPT_ALLOW"):
        config["script_allow"] = json.loads(os.environ["YUZU_AGENT_SCRIPT_ALLOW"])
    if os.environ.get("YUZU_AGENT_QUARANTINE_ENFORCE"):
        config["quarantine_enforce"] = os.environ["YUZU_AGENT_QUARANTINE_ENFORCE"].lower() in ("1", "true", "yes", "on")
    if os.environ.get("YUZU_AGENT_TRUST_BUNDLE"):
        config["trust_bundle"] = os.environ["YUZU_AGENT_TRUST_BUNDLE"]
    if os.environ.get("YUZU_AGENT_REQUIRE_SIGNATURE"):
        config["require_signature"] = os.environ["YUZU_AGENT_REQUIRE_SIGNATURE"].lower() in ("1", "true", "yes", "on")
    if os.environ.get("YUZU_AGENT_DEX_DISABLE"):
        config["dex_disable"] = os.environ["YUZU_AGENT_DEX_DISABLE"].lower() in ("1", "true", "yes", "on")
    if os.environ.get("YUZU_AGENT_TAGS"):
        config["tags"] = dict(kv.split("=", 1) for kv in os.environ["YUZU_AGENT_TAGS"].split(",") if "=" in kv)
    return config


def ws_url(server):
    server = server.rstrip("/")
    return server if server.endswith(WS_PATH) else server + WS_PATH


def clip(text, limit):
    raw = (text or "").encode()
    return text if len(raw) <= limit else raw[:limit].decode(errors="ignore")


def kept_size(frame):
    return len(frame["output"] or "") + len(frame["error"] or "")


def encode(frame):
    """JSON text of a frame, trimming a response's output until the whole frame fits MAX_SEND."""
    text = json.dumps(frame, ensure_ascii=False)
    while len(text.encode()) > MAX_SEND and frame.get("output"):
        excess = len(text.encode()) - MAX_SEND
        frame["output"] = clip(frame["output"], max(len(frame["output"].encode()) - excess, 0))
        text = json.dumps(frame, ensure_ascii=False)
    return text


class AgentClient:
    def __init__(self, server, token=None, state_dir=None, config=None, *, plugins=PLUGINS, hostname=None,
                 attributes=None, inventory=None, pool=None):
        self.url = ws_url(server)
        self.token = token
        self.state_dir = Path(state_dir or default_state_dir())
        self.config = config if config is not None else load_config(self.state_dir / "config.json")
        self.plugins = plugins
        self.hostname = hostname or socket.gethostname()
        self.attributes = attributes if attributes is not None else {
            "kernel": platform.release(), "python": platform.python_version()}
        self.inventory = inventory or os_facts
        self.pool = pool or ThreadPoolExecutor(max_workers=4, thread_name_prefix="yuzu-plugin")
        self.tags = {}
        self.ws = None
        self.registered = False
        self.outbox = deque(maxlen=OUTBOX_MAX)
        self.seen = OrderedDict()  # command_id → its terminal frame once known (None while running)
        self.kept_bytes = 0  # of the terminal frames kept in self.seen
        self.refused_frames = 0  # server frames ignored as malformed (a result.query out of bounds)
        self.tasks = set()
        self._send_lock = None
        self.guardian = Guardian(self.send, self.config)
        self.verifier = None
        if self.config.get("trust_bundle"):
            with open(self.config["trust_bundle"], "rb") as f:
                self.verifier = signing.Verifier(f.read(), self.url, self.config.get("crl_max_age", 3600))
        elif self.config.get("require_signature"):
            raise Refused("require_signature is set but no trust_bundle is configured: refusing to start")
        self.pending_key = None  # the key of a cert.enroll awaiting its certificate
        self.control = PluginControl()  # pushed plugin configuration and kill switches (fleet.agent.control)
        self.software = None  # the daily software-inventory sync (fleet.agent.inventory_sync)
        # DEX telemetry (fleet.agent.dex, docs/dex.md): off with --dex-disable / dex_disable
        self.dex = None if self.config.get("dex_disable") else Telemetry(self.config)

    # --- identity ----------------------------------------------------------------------------

    @property
    def state_path(self):
        return self.state_dir / "state.json"

    def load_state(self):
        try:
            return json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return None

    def save_state(self, state):
        self._write(self.state_path, json.dumps(state).encode())

    def _write(self, path, data):
        """Owner-only (0600) in a 0700 directory, written to a temporary file and renamed over."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(path, data)

    @property
    def key_path(self):
        return self.state_dir / "agent-key.pem"

    def csr(self):
        """A fresh P-256 key (kept until its certificate arrives) and its CSR; the server sets the subject."""
        key = ec.generate_private_key(ec.SECP256R1())
        self.pending_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption())
        req = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
        return req.public_bytes(serialization.Encoding.PEM).decode()

    def on_certificate(self, msg):
        """cert.issued: the key and certificate become this agent's; the next connection proves them."""
        if self.pending_key is None or not isinstance(msg.get("cert_pem"), str):
            return
        self._write(self.key_path, self.pending_key)
        state = self.load_state() or {}
        state["cert_pem"] = msg["cert_pem"]
        self.save_state(state)
        self.pending_key = None
        log.info("%s: certificate %s issued", self.hostname, msg.get("serial_hex"))

    # --- the connection loop -----------------------------------------------------------------

    async def run(self):
        """Connect forever; returns only by raising Refused (or being cancelled)."""
        if not self.token and self.load_state() is None:
            raise Refused(f"not enrolled ({self.state_path} missing) and no enrolment token given")
        self._send_lock = asyncio.Lock()
        attempt = 0
        while True:
            self.registered = False
            try:
                async with websockets.connect(self.url, max_size=MAX_FRAME, open_timeout=15) as ws:
                    await self.session(ws)
            except ConnectionClosed as exc:
                code, reason = (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd else (None, "")
                if code == CLOSE_REFUSED:
                    raise Refused(f"{reason or 'refused'} (state file {self.state_path})") from None
                log.warning("%s: connection closed (%s %s)", self.hostname, code, reason)
            except (TimeoutError, OSError, WebSocketException) as exc:
                log.warning("%s: cannot reach %s: %s", self.hostname, self.url, exc)
            finally:
                self.ws = None
            attempt = 0 if self.registered else attempt + 1
            await asyncio.sleep(random.uniform(0.5, 1.0) * min(BACKOFF_CAP_S, 2.0 ** attempt))

    async def session(self, ws):
        self.ws = ws
        state = self.load_state()
        if state is None:
            await self.send({"type": "enroll", "token": self.token, "hostname": self.hostname})
            reply = await self.expect(ws, "enrolled", "agent_id", "credential")
            state = {"agent_id": reply["agent_id"], "credential": reply["credential"], "server": self.url}
            self.save_state(state)
            log.info("%s: enrolled as %s", self.hostname, state["agent_id"])
        register = {
            "type": "register", "agent_id": state["agent_id"], "credential": state["credential"],
            "hostname": self.hostname, "os": platform.system().lower(), "arch": platform.machine(),
            "agent_version": __version__, "attributes": self.attributes, "tags": self.config.get("tags", {}),
            "plugins": catalogue(self.plugins),
        }
        if state.get("cert_pem") and self.key_path.exists():
            await self.send({"type": "challenge"})
            nonce = (await self.expect(ws, "challenge", "nonce"))["nonce"]
            register["cert_pem"] = state["cert_pem"]
            register["proof"] = proof(self.key_path.read_bytes(), nonce, state["agent_id"])
        await self.send(register)
        reply = await self.expect(ws, "registered")
        self.registered = True
        self.tags = reply.get("tags") or {}
        log.info("%s: registered as %s with %s", self.hostname, state["agent_id"], self.url)
        loop = asyncio.get_running_loop()
        inventory = await loop.run_in_executor(self.pool, self.inventory)
        await self.send({"type": "inventory", "plugin": "os", "data": inventory})
        for frame in [self.outbox.popleft() for _ in range(len(self.outbox))]:
            await self.send(frame, keep=True)
        if not state.get("cert_pem") or renewal_due(state["cert_pem"]):
            await self.send({"type": "cert.enroll", "csr_pem": self.csr()})
        heartbeat = asyncio.create_task(self.heartbeat(float(reply.get("heartbeat_interval") or 30)))
        sync = None
        if not self.config.get("inventory_disable"):
            self.software = InventorySync(self.send, self.state_dir / "software-sync.json", state["agent_id"],
                                          self.config)
            sync = asyncio.create_task(self.software.run(self.pool))
        try:
            async for raw in ws:
                self.handle(raw)
        finally:
            heartbeat.cancel()
            if sync is not None:
                sync.cancel()

    async def expect(self, ws, kind, *fields):
        raw = await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
        try:
            reply = json.loads(raw)
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or reply.get("type") != kind or \
                not all(isinstance(reply.get(f), str) for f in fields):
            raise WebSocketException(f"expected '{kind}', got {str(raw)[:200]}")
        return reply

    async def heartbeat(self, interval):
        reading = None  # the DEX readings run in a worker thread and never hold a heartbeat back: each heartbeat
        if self.dex is not None:  # carries the last finished reading, then starts the next one
            self.dex.last = None  # a new session: the first reading only sets the delta baselines
        while True:
            await asyncio.sleep(interval)
            frame, extra = {"type": "heartbeat"}, []
            if reading is not None and reading.done():
                frame["dex"], extra = reading.result()
                reading = None
            if self.dex is not None and reading is None:
                reading = asyncio.get_running_loop().run_in_executor(self.pool, self.dex.tick)
            await self.send(frame)
            for telemetry in extra:
                await self.send(telemetry)

    async def send(self, frame, keep=False):
        """Send one frame; a ``keep`` frame that cannot be sent now waits in the outbox."""
        try:
            if self.ws is None:
                raise ConnectionError("not connected")
            async with self._send_lock:
                await self.ws.send(encode(frame))
        except (ConnectionClosed, ConnectionError):
            if keep:
                self.outbox.append(frame)

    # --- commands ----------------------------------------------------------------------------

    def handle(self, raw):
        try:
            msg = json.loads(raw)
        except ValueError:
            log.warning("%s: ignoring a non-JSON frame", self.hostname)
            return
        kind = msg.get("type") if isinstance(msg, dict) else None
        if kind == "command":
            task = asyncio.create_task(self.on_command(msg))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif kind == "result.query":
            task = asyncio.create_task(self.on_result_query(msg))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif kind == "cert.issued":
            self.on_certificate(msg)
        elif kind == "cert.refused":
            log.warning("%s: certificate refused: %s", self.hostname, msg.get("error"))
            self.pending_key = None
        elif kind == "tags" and isinstance(msg.get("tags"), dict):
            self.tags = msg["tags"]
            log.info("%s: tags now %s", self.hostname, self.tags)
        elif kind in ("plugin.config", "plugin.kill"):
            report = (self.control.apply_config if kind == "plugin.config" else self.control.apply_kill)(msg)
            if report is not None:
                task = asyncio.create_task(self.send(report))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        elif kind == "software.resync" and self.software is not None:
            self.software.resync()
        elif kind == "guardian.rules" and isinstance(msg.get("rules"), list):
            self.guardian.apply(msg["rules"], full_sync=msg.get("full_sync", True) is not False)

    async def on_command(self, msg):
        """Run a new command_id; answer a repeat (the server re-sends what it has no acknowledgement
        for) with the terminal frame kept for it, or ``received`` while it runs or once it is forgotten."""
        cid = msg.get("command_id")
        if not isinstance(cid, str) or not cid:
            return
        if cid in self.seen:
            kept = self.seen[cid]
            await self.send(dict(kept) if kept else {"type": "received", "command_id": cid}, keep=bool(kept))
            return
        self.seen[cid] = None
        while len(self.seen) > SEEN_MAX:
            self.forget()
        result = await self.run_command(cid, msg)
        frame = self.response(cid, result)
        if cid in self.seen:
            self.seen[cid] = frame
            self.kept_bytes += kept_size(frame)
            while self.kept_bytes > RESULTS_MAX_BYTES and len(self.seen) > 1:
                self.forget()
        await self.send(frame, keep=True)

    async def on_result_query(self, msg):
        """The server asks about commands it holds as running for this agent. Answer each from ``seen``: the
        kept terminal frame is sent again (a ``response`` frame, as when it finished), then one
        ``result.answer`` lists the ids as kept, running (the terminal frame will follow when done) or unknown
        (this process never ran it, or forgot it: the server times it out and never re-sends it). A query out
        of bounds is ignored and counted: the server's rows then wait for their expiry, as before."""
        ids = msg.get("command_ids")
        if not (isinstance(ids, list) and 0 < len(ids) <= RESULT_QUERY_MAX and all(
                isinstance(c, str) and 0 < len(c.encode(errors="surrogatepass")) <= MAX_ID_BYTES for c in ids)):
            self.refused_frames += 1
            log.warning("%s: ignoring a malformed result.query", self.hostname)
            return
        answer = {"type": "result.answer", "kept": [], "running": [], "unknown": []}
        for cid in dict.fromkeys(ids):  # each once
            if cid not in self.seen:
                answer["unknown"].append(cid)
            elif self.seen[cid] is None:
                answer["running"].append(cid)
            else:
                await self.send(dict(self.seen[cid]), keep=True)
                answer["kept"].append(cid)
        await self.send(answer)

    def forget(self):
        _, kept = self.seen.popitem(last=False)
        if kept:
            self.kept_bytes -= kept_size(kept)

    async def run_command(self, cid, msg):
        """Validate and run one command (its first delivery); returns its Result. Sends RUNNING first,
        which tells the server the command arrived."""
        plugin, action, params = msg.get("plugin"), msg.get("action"), msg.get("parameters") or {}
        expires_at = msg.get("expires_at")
        if not (isinstance(plugin, str) and isinstance(action, str) and isinstance(params, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in params.items())):
            return Result("REJECTED", error="malformed command: plugin, action and string parameters expected")
        if isinstance(expires_at, (int, float)) and time.time() > expires_at:
            return Result("TIMEOUT", error="the command expired before it started")
        if f"{plugin}.{action}" not in self.plugins:
            return Result("REJECTED", error=f"unknown plugin/action: {plugin}.{action}")
        if refusal := self.control.refusal(plugin, action):
            return Result("REJECTED", error=refusal)
        await self.send(self.response(cid, Result("RUNNING")))
        loop = asyncio.get_running_loop()

        def progress(output):
            frame = self.response(cid, Result("RUNNING", output))
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.send(frame)))

        ctx = Context(config={**self.config, "hostname": self.hostname, "plugin_config": self.control.snapshot()},
                      server=self.url, progress=progress, stop=self.control.stop_event(plugin))
        return await loop.run_in_executor(self.pool, self.execute, plugin, action, params, ctx)

    def execute(self, plugin, action, params, ctx):
        """Run a plugin action (in the thread pool), after the signing rules (fleet.agent.signing)."""
        try:
            signing.check_command(self.verifier, self.config.get("require_signature"), f"{plugin}.{action}", params)
        except signing.SignatureError as exc:
            log.warning("%s: refused %s.%s: %s", self.hostname, plugin, action, exc)
            return Result("REJECTED", error=str(exc))
        return execute(self.plugins, plugin, action, params, ctx)

    @staticmethod
    def response(cid, result):
        return {"type": "response", "command_id": cid, "status": result.status,
                "output": clip(result.output, MAX_OUTPUT), "exit_code": result.exit_code,
                "error": clip(result.error, MAX_ERROR) if result.error is not None else None}
