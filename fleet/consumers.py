"""The server end of the agent protocol: one WebSocket per agent at ``/agent/v1/ws`` (docs/agent-protocol.md).
It only speaks the protocol: validate each frame, hand it to the model layer, send frames back.

Every inbound message is validated before it touches the database; anything malformed closes the
socket with 4400 and a reason, logged (daphne does not send a close reason on; what was stored before stays stored). A refused identity closes with
4401. Each message costs one database hop: enrolment and register (fleet.identity), the connection state
(Agent.objects), inventory, run through ``database_sync_to_async``; answers and heartbeats go to the process's
batchers (fleet.responses, fleet.identity.heartbeat: a hop per batch, fleet.batching). Commands and pushes
reach the socket only through the channel layer group ``agent_group(agent_id)``, so any server process can
address any agent. The process's registered
connections are in fleet.liveness, which touches them every third of a heartbeat interval."""

import asyncio
import json
import logging
import re
import time

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.core.exceptions import ValidationError
from django.utils import timezone

from pki.ca import CertError, new_nonce
from yuzu import jsondata
from yuzu.metrics import (
    AGENT_ORIGIN_REFUSED,
    CA_REVOKED_CERT,
    FLEET_CATALOGUE_DROPPED,
    FLEET_COMMAND_SENDS,
    FLEET_COMMAND_UNSENT,
    FLEET_RESULT_QUERIES,
)
from yuzu.text import HIDDEN_RE

from . import catalogue, events, identity
from .identity import Refused, Superseded
from .liveness import connections
from .models import Agent, AgentInventory, Response, heartbeat_interval, normalise_tag
from .push import agent_group
from .responses import RECEIVED, record_forgotten, responses, running_commands
from .signals import agent_connected, agent_disconnected, agent_report, agent_telemetry

log = logging.getLogger("yuzu.fleet.agents")

CLOSE_MALFORMED, CLOSE_REFUSED, CLOSE_FORBIDDEN, CLOSE_HELLO_TIMEOUT, CLOSE_SUPERSEDED = 4400, 4401, 4403, 4408, 4409
MAX_FRAME_CHARS = 4 * 1024 * 1024
MAX_OUTPUT_BYTES = 1024 * 1024
MAX_ERROR_BYTES = 64 * 1024
MAX_ID_BYTES = 160
MAX_ATTRIBUTES = 64
MAX_TAGS = 64
MAX_CATALOGUE_BYTES = 256 * 1024
MAX_INVENTORY_BYTES = 256 * 1024  # one inventory frame's data, as JSON
MAX_INVENTORY_ROWS = 32  # inventory rows (plugins) per agent, the server's own (agent.plugins, plugin_state) included
HELLO_TIMEOUT_S = 30
AGENT_ID_RE = re.compile(r"[0-9a-f]{1,64}")  # enroll mints 32 lowercase hex characters
SECRET_RE = re.compile(r"[\x21-\x7e]+")  # device tokens and agent credentials: printable ASCII
ASCII_RE = re.compile(r"[\x20-\x7e]*")  # os, arch, agent_version
PEM_RE = re.compile(r"[\x20-\x7e\n\r]+")  # certificates and CSRs
PROOF_RE = re.compile(r"[A-Za-z0-9+/=]{1,512}")  # a base64 signature
MAX_PEM_BYTES = 8192
PRE_REGISTER = ("enroll", "challenge", "register")
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")  # json.loads joins surrogate pairs: any left is unpaired
ANSWERS = tuple(s.name for s in Response.STATES)  # a response frame's status
RESULT_QUERY_MAX = 100  # command ids per result.query frame (and per list of a result.answer)
RESULT_QUERY_TOTAL = 1000  # running commands asked about on one register (the newest; the rest time out as before)
RESULT_KINDS = ("kept", "running", "unknown")  # the lists of a result.answer frame
TOO_DEEP = f"frame nests deeper than {jsondata.MAX_DEPTH} levels"


class Malformed(Exception):
    """Close 4400: the message breaks the protocol."""


# --- validation (pure) -------------------------------------------------------------------------

def _storable(text):
    """Text the database can store: PostgreSQL refuses NUL characters and unpaired surrogates."""
    return not UNSTORABLE_RE.search(text)


def _text(msg, key, limit, *, optional=False, pattern=None, what="text without control characters"):
    """A string field of at most ``limit`` UTF-8 bytes, matching ``pattern`` (default: no control
    characters at all)."""
    value = msg.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value.encode(errors="surrogatepass")) > limit or (not optional and not value):
        raise Malformed(f"'{key}' must be a {'' if optional else 'non-empty '}string of at most {limit} bytes")
    if pattern is not None:
        valid = pattern.fullmatch(value)
    else:
        valid = _storable(value) and not CONTROL_RE.search(value)
    if not valid:
        raise Malformed(f"'{key}' must be {what}")
    return value


def _free_text(msg, key, limit):
    """Command output and errors: any text, made storable (NUL and unpaired surrogates become U+FFFD)."""
    value = msg.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Malformed(f"'{key}' must be a string or null")
    value = UNSTORABLE_RE.sub("\ufffd", value)
    if len(value.encode()) > limit:
        raise Malformed(f"'{key}' must be a string of at most {limit} bytes")
    return value


def _json(value, key):
    """Raise unless every string (key or value) in ``value`` is storable."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str) and not _storable(v):
            raise Malformed(f"'{key}' contains a NUL character or an unpaired surrogate")
    return value


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _object(msg, key, max_keys):
    value = msg.get(key, {})
    if not isinstance(value, dict) or len(value) > max_keys:
        raise Malformed(f"'{key}' must be an object of at most {max_keys} keys")
    return value


def _attributes(msg):
    attrs = _json(_object(msg, "attributes", MAX_ATTRIBUTES), "attributes")
    for k, v in attrs.items():
        scalar = v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 1024)
        if len(k) > 64 or not scalar:
            raise Malformed(f"attribute '{k[:64]}' must have a key of at most 64 characters and a scalar value")
    return attrs


def _tags(msg):
    try:
        return dict(normalise_tag(k, v) for k, v in _json(_object(msg, "tags", MAX_TAGS), "tags").items())
    except ValidationError as exc:
        raise Malformed(f"invalid tag: {exc.messages[0]}") from None


def _plugins(msg):
    plugins = _json(_object(msg, "plugins", 1024), "plugins")
    if len(json.dumps(plugins)) > MAX_CATALOGUE_BYTES:
        raise Malformed(f"'plugins' exceeds {MAX_CATALOGUE_BYTES} bytes")
    return plugins


def _drop_unusable(agent_id, plugins):
    """The catalogue without the actions whose schemas the server cannot apply (fleet.catalogue): each is
    left out — the agent keeps its other actions — logged and counted."""
    kept, dropped = catalogue.clean(plugins)
    for name, why in dropped.items():
        log.warning("agent %s declared %s with an unusable schema; it is left out of its catalogue: %s",
                    agent_id, name[:128], why)
    if dropped:
        FLEET_CATALOGUE_DROPPED.inc(len(dropped))
    return kept


def _hostname(msg):
    """No control characters, nor the bidirectional or invisible ones (yuzu.text): the hostname names the agent in
    every summary an approver reads and every list an operator picks a device from, and U+202E made ``db-1`` followed
    by reversed text, or U+200B made ``db-<U+200B>1``, read as another machine's name."""
    hostname = _text(msg, "hostname", 255)
    if HIDDEN_RE.search(hostname):
        raise Malformed("'hostname' must be text without control, bidirectional or invisible characters")
    return hostname


def _response(msg):
    frame = {"command_id": _text(msg, "command_id", MAX_ID_BYTES), "status": msg.get("status"),
             "output": _free_text(msg, "output", MAX_OUTPUT_BYTES) or "",
             "error": _free_text(msg, "error", MAX_ERROR_BYTES), "exit_code": msg.get("exit_code")}
    if frame["status"] not in ANSWERS:
        raise Malformed(f"'status' must be one of {', '.join(ANSWERS)}")
    code = frame["exit_code"]
    if code is not None and (not isinstance(code, int) or isinstance(code, bool) or not -2**31 <= code < 2**31):
        raise Malformed("'exit_code' must be a 32-bit integer or null")
    return frame


def _result_answer(msg, asked):
    """A ``result.answer`` frame's lists, each of at most RESULT_QUERY_MAX command ids; every id one the
    server asked about on this connection and not answered yet (``asked``), named once."""
    answers, named = {}, set()
    for kind in RESULT_KINDS:
        ids = msg.get(kind, [])
        if not isinstance(ids, list) or len(ids) > RESULT_QUERY_MAX:
            raise Malformed(f"'{kind}' must be a list of at most {RESULT_QUERY_MAX} command ids")
        for cid in ids:
            if not isinstance(cid, str) or cid not in asked or cid in named:
                raise Malformed(f"'{kind}' must list only command ids the server asked about, each once")
            named.add(cid)
        answers[kind] = ids
    return answers


def _register(agent_id, credential, fields, tags, plugins, opened_at, proof):
    """identity.register, then the commands to ask the agent about (running_commands): one database hop."""
    current, cert_serial = identity.register(agent_id, credential, fields, tags, plugins, opened_at, proof)
    return current, cert_serial, running_commands(agent_id, RESULT_QUERY_TOTAL)


# --- the consumer ------------------------------------------------------------------------------

class AgentConsumer(AsyncJsonWebsocketConsumer):
    TYPES = ("enroll", "challenge", "register", "heartbeat", "inventory", "response", "received", "report",
             "cert.enroll", "dex.observation", "dex.app_perf", "result.answer")  # handled by on_<type> ('.' → '_')
    # what disconnect() reads, for a consumer that ends before connect() set them
    agent_id = group = hello_timer = None
    superseded = disconnected = False

    async def connect(self):
        self.opened_at = timezone.now()  # orders the connections of one agent: the newest one wins
        self.agent_id = None  # set once registered
        self.group = None
        self.enrolled = False
        self.nonce = None  # the proof-of-possession challenge sent on this connection
        self.cert_serial = None  # the certificate this connection proved (or was issued)
        self.closing = False
        self.disconnected = False  # disconnect()'s bookkeeping ran (it runs once, however the consumer ended)
        self.superseded = False
        self.held = []  # group messages that arrive while the credential is being checked
        self.asked = set()  # command ids of result.query frames sent on this connection, not answered yet
        self.hello_timer = None
        self.handling = False  # these three are read by this process's touch (fleet.liveness)
        self.heard = self.idle_since = time.monotonic()
        client = self.scope.get("client") or ()
        self.source = str(client[0]) if client else "unknown"
        if any(name.lower() == b"origin" for name, _ in self.scope.get("headers", ())):
            # Only a browser sends Origin; agents never do. Refused at the handshake (HTTP 403), so no
            # web page can reach the agent protocol with its visitor's network position.
            AGENT_ORIGIN_REFUSED.inc()
            log.info("refused an agent WebSocket handshake from %s carrying an Origin header", self.source)
            self.closing = True
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.accept()
        self.expect_hello()

    def expect_hello(self):
        """Close 4408 unless the peer sends enroll or register within HELLO_TIMEOUT_S. The timer is
        stopped while the server works on one of them: a slow server is not a silent peer (closing
        those under a connect burst made the agents reconnect, and enrol again, while their first
        attempt was still being processed)."""
        self.hello_timer = asyncio.get_running_loop().call_later(
            HELLO_TIMEOUT_S, lambda: asyncio.ensure_future(self.refuse(CLOSE_HELLO_TIMEOUT, "register timeout")))

    async def dispatch(self, message):
        """AsyncConsumer.dispatch without its per-message hop to the database thread to close stale
        connections: every database call of this consumer goes through database_sync_to_async, which
        does that itself, and the hop (one per frame and per command relayed) serialises with them. Notes
        whether a message is being handled, and when the last frame was taken, for the touch."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        self.handling = True
        if message["type"] == "websocket.receive":
            self.heard = time.monotonic()
        try:
            await handler(message)
        except StopConsumer:
            raise
        except Exception:  # not CancelledError: a stopping server cancels every consumer, nothing abnormal
            # The consumer ends abnormally (daphne closes the socket 1011 and never sends websocket.disconnect
            # to a dead application): do the disconnect bookkeeping now, or the agent stays connected — counted
            # as reached by new executions, touched by fleet.liveness — until the silent-socket sweep.
            log.exception("agent socket %s ended abnormally", self.agent_id or "-")
            self.closing = True
            await asyncio.shield(self.disconnect(1011))
            raise
        finally:
            self.handling, self.idle_since = False, time.monotonic()

    async def disconnect(self, code):
        if self.disconnected:
            return
        self.disconnected = True
        connections.discard(self)
        if self.hello_timer is not None:
            self.hello_timer.cancel()
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.agent_id and not self.superseded:
            await database_sync_to_async(Agent.objects.disconnected)(self.agent_id, self.opened_at)
            await self._announce(agent_disconnected, agent_id=self.agent_id)

    async def refuse(self, code, reason):
        if not self.closing:
            self.closing = True
            log.info("closing agent socket %s (%s): %s", self.agent_id or "-", code, reason)
            await self.close(code=code, reason=reason.encode()[:120].decode(errors="ignore"))

    async def receive(self, text_data=None, bytes_data=None):
        if self.closing:
            return
        try:
            if text_data is None:
                raise Malformed("binary frames are not part of the protocol")
            if len(text_data) > MAX_FRAME_CHARS:
                raise Malformed("frame too large")
            try:
                msg = json.loads(text_data, parse_constant=_no_constant)
            except ValueError:
                raise Malformed("frame is not JSON (NaN and Infinity are not JSON either)") from None
            except RecursionError:  # far deeper than MAX_DEPTH: the parser ran out of stack
                raise Malformed(TOO_DEEP) from None
            if not jsondata.depth_ok(msg):
                raise Malformed(TOO_DEEP)
            if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
                raise Malformed("a JSON object with a string 'type' is expected")
            if msg["type"] not in self.TYPES:
                raise Malformed(f"unknown message type '{msg['type'][:40]}'")
            if (self.agent_id is None) != (msg["type"] in PRE_REGISTER):
                raise Malformed(f"'{msg['type']}' is not allowed " + ("before register" if self.agent_id is None
                                                                      else "after register"))
            await getattr(self, "on_" + msg["type"].replace(".", "_"))(msg)
        except Malformed as exc:
            await self.refuse(CLOSE_MALFORMED, str(exc))
        except Refused as exc:
            if exc.failure is not None:
                await identity.failures.record(self.source, exc.failure)
            await self.refuse(CLOSE_REFUSED, str(exc))
        except Superseded as exc:
            await self.refuse(CLOSE_SUPERSEDED, str(exc))

    async def on_enroll(self, msg):
        if self.enrolled:
            raise Malformed("already enrolled on this connection; send register")
        token = _text(msg, "token", 256, pattern=SECRET_RE, what="printable ASCII")
        hostname = _hostname(msg)
        self.hello_timer.cancel()
        agent_id, credential = await database_sync_to_async(identity.enroll)(token, hostname)
        self.enrolled = True
        await self.send_json({"type": "enrolled", "agent_id": agent_id, "credential": credential})
        self.expect_hello()  # now register

    async def on_challenge(self, msg):
        """Proof of possession, step 1: a fresh nonce for this connection, to sign in register."""
        if self.nonce is not None:
            raise Malformed("one challenge per connection")
        self.nonce = new_nonce()
        await self.send_json({"type": "challenge", "nonce": self.nonce})

    def _proof(self, msg):
        cert_pem = _text(msg, "cert_pem", MAX_PEM_BYTES, optional=True, pattern=PEM_RE, what="a PEM certificate")
        proof = _text(msg, "proof", 512, optional=True, pattern=PROOF_RE, what="base64")
        if cert_pem is None and proof is None:
            return None
        if cert_pem is None or proof is None or self.nonce is None:
            raise Malformed("'cert_pem' and 'proof' go together, after a challenge")
        return cert_pem, proof, self.nonce

    async def on_register(self, msg):
        agent_id = _text(msg, "agent_id", 64, pattern=AGENT_ID_RE, what="lowercase hex, as enroll issued it")
        credential = _text(msg, "credential", 256, pattern=SECRET_RE, what="printable ASCII")
        fields = {"hostname": _hostname(msg),
                  "os": _text(msg, "os", 64, optional=True, pattern=ASCII_RE, what="printable ASCII") or "",
                  "arch": _text(msg, "arch", 32, optional=True, pattern=ASCII_RE, what="printable ASCII") or "",
                  "agent_version": _text(msg, "agent_version", 32, optional=True, pattern=ASCII_RE,
                                         what="printable ASCII") or "",
                  "attributes": _attributes(msg)}
        tags, plugins, proof = _tags(msg), _drop_unusable(agent_id, _plugins(msg)), self._proof(msg)
        self.hello_timer.cancel()  # see expect_hello
        group = agent_group(agent_id)
        # Join before marking the agent connected so no command sent after that is missed; hold
        # what arrives until the credential is verified.
        await self.channel_layer.group_add(group, self.channel_name)
        self.group = group
        try:
            current, self.cert_serial, running = await database_sync_to_async(_register)(
                agent_id, credential, fields, tags, plugins, self.opened_at, proof)
        except (Refused, Superseded):
            await self.channel_layer.group_discard(group, self.channel_name)
            self.group, self.held = None, []
            raise
        self.agent_id = agent_id
        connections.add(self)
        await self.channel_layer.group_send(group, {"type": "agent.superseded", "channel": self.channel_name,
                                                    "opened_at": self.opened_at.timestamp()})
        await self.send_json({"type": "registered", "agent_id": agent_id, "heartbeat_interval": heartbeat_interval(),
                              "tags": current})
        for payload in self.held:
            await self.send_json(payload)
        self.held = []
        await self.ask_about(running)
        await self._announce(agent_connected, agent_id=agent_id)

    async def ask_about(self, command_ids):
        """Ask the agent about the commands the server holds as ``running`` for it (acknowledged, no terminal
        answer stored): a terminal answer sent into a connection that died on the way (a Redis outage closing
        the consumer, a dropped socket) is lost, and re-sending the command itself could run it twice on an
        agent that restarted. The agent answers each from its memory (on_result_answer)."""
        for i in range(0, len(command_ids), RESULT_QUERY_MAX):
            chunk = command_ids[i:i + RESULT_QUERY_MAX]
            self.asked.update(chunk)
            await self.send_json({"type": "result.query", "command_ids": chunk})
        if command_ids:
            FLEET_RESULT_QUERIES.labels("asked").inc(len(command_ids))

    async def _announce(self, signal, **kwargs):
        """Tell the apps listening (fleet.signals); a receiver's failure is logged, never the agent's."""
        for receiver, result in await signal.asend_robust(sender=AgentConsumer, **kwargs):
            if isinstance(result, Exception):
                log.error("%s failed for agent %s: %r", getattr(receiver, "__qualname__", receiver),
                          self.agent_id, result)

    async def on_heartbeat(self, msg):
        if not await identity.heartbeat.submit((self.agent_id, self.cert_serial)):
            await self.refuse(CLOSE_REFUSED, "agent credential or certificate revoked, or agent deleted")
            return
        if "dex" in msg:  # DEX facts (docs/dex.md): each value is validated, and dropped if bad, by the dex app
            await self._announce(agent_telemetry, agent_id=self.agent_id, kind="heartbeat", frame=msg)

    async def on_dex_observation(self, msg):
        """DEX signal observations, at most 100 per frame (their fields are validated by the dex app)."""
        items = msg.get("observations")
        if not isinstance(items, list) or len(items) > 100:
            raise Malformed("'observations' must be a list of at most 100 objects")
        await self._announce(agent_telemetry, agent_id=self.agent_id, kind="dex.observation", frame=msg)

    async def on_dex_app_perf(self, msg):
        """One UTC day's per-app performance summary, at most 500 rows (validated by the dex app)."""
        rows = msg.get("rows")
        if not isinstance(rows, list) or len(rows) > 500 or not isinstance(msg.get("day"), str):
            raise Malformed("'day' must be a string and 'rows' a list of at most 500 objects")
        await self._announce(agent_telemetry, agent_id=self.agent_id, kind="dex.app_perf", frame=msg)

    async def on_cert_enroll(self, msg):
        """The agent's CSR: its certificate (pki.ca), or a ``cert.refused`` frame saying why (the
        connection stays up: an agent without a certificate keeps working on its credential)."""
        csr_pem = _text(msg, "csr_pem", MAX_PEM_BYTES, pattern=PEM_RE, what="a PEM certificate signing request")
        try:
            row, chain = await database_sync_to_async(identity.enroll_certificate)(self.agent_id, csr_pem,
                                                                                  self.cert_serial)
        except CertError as exc:
            await self.send_json({"type": "cert.refused", "error": str(exc)})
            return
        self.cert_serial = row.serial_hex
        await self.send_json({"type": "cert.issued", "serial_hex": row.serial_hex, "cert_pem": row.cert_pem,
                              "chain_pem": chain})

    async def on_inventory(self, msg):
        plugin = _text(msg, "plugin", 128)
        data = msg.get("data")
        if not isinstance(data, dict):
            raise Malformed("'data' must be an object")
        _json(data, "data")
        if plugin == AgentInventory.CATALOGUE:  # the catalogue declared again: the register checks apply
            data = _drop_unusable(self.agent_id, _plugins({"plugins": data}))
        elif len(json.dumps(data)) > MAX_INVENTORY_BYTES:
            raise Malformed(f"inventory 'data' exceeds {MAX_INVENTORY_BYTES} bytes")
        if not await database_sync_to_async(AgentInventory.objects.store_reported)(self.agent_id, plugin, data,
                                                                                   MAX_INVENTORY_ROWS):
            raise Malformed(f"an agent reports at most {MAX_INVENTORY_ROWS} inventory plugins")

    async def on_response(self, msg):
        await responses.submit((self.agent_id, _response(msg)))

    async def on_result_answer(self, msg):
        """The agent's answer to a result.query: ``kept`` (it sent the terminal frames it kept just before, as
        ``response`` frames, stored like any answer), ``running`` (its terminal answer will come) and
        ``unknown`` (it no longer knows the command: TIMEOUT, never re-run — fleet.responses.record_forgotten)."""
        try:
            answers = _result_answer(msg, self.asked)
        except Malformed:
            FLEET_RESULT_QUERIES.labels("refused").inc()
            raise
        for kind, ids in answers.items():
            self.asked.difference_update(ids)
            if ids:
                FLEET_RESULT_QUERIES.labels(kind).inc(len(ids))
        if answers["unknown"]:
            log.info("agent %s no longer knew %d running command(s): timed out, not re-run", self.agent_id,
                     len(answers["unknown"]))
            _, changed = await database_sync_to_async(record_forgotten)(self.agent_id, answers["unknown"])
            await events.apublish(*changed)

    async def on_report(self, msg):
        """A report for another app (``kind``, e.g. guardian): passed on with the connection's agent_id."""
        _text(msg, "kind", 32, pattern=re.compile(r"[a-z_]{1,32}"), what="lowercase letters")
        _json(msg, "report")
        await self._announce(agent_report, agent_id=self.agent_id, frame=msg)

    async def on_received(self, msg):
        """The agent has the command (an acknowledgement; fleet.responses)."""
        await responses.submit((self.agent_id, {"command_id": _text(msg, "command_id", MAX_ID_BYTES),
                                                "status": RECEIVED}))

    # --- channel-layer handlers --------------------------------------------------------------

    async def relay(self, event):
        if self.closing:
            return
        if self.agent_id is None:
            if len(self.held) < 1000:
                self.held.append(event["payload"])
            return
        await self.send_json(event["payload"])

    async def agent_command(self, event):
        """A command for this agent. One that cannot be written (the connection is closing) is re-sent
        by the dispatcher unless the agent acknowledges it (fleet.tasks)."""
        if self.closing:
            FLEET_COMMAND_UNSENT.inc()
            return
        FLEET_COMMAND_SENDS.labels("resend" if event.get("resend") else "first").inc()
        await self.relay(event)

    agent_push = relay

    async def agent_revoked(self, event):
        """A certificate was revoked (pki.services.revoke_certificate): close this connection if it is the
        one it proved. The agent's next register is refused."""
        if self.cert_serial is not None and event.get("serial_hex") == self.cert_serial:
            CA_REVOKED_CERT.labels("live").inc()
            await self.refuse(CLOSE_REFUSED, "certificate revoked")

    async def agent_cut_off(self, event):
        """The agent's credential was revoked (fleet.services.revoke_agent_credential) or its Agent row deleted
        (fleet.apps): close its connection now. Its next register is refused."""
        if self.agent_id is not None:
            await self.refuse(CLOSE_REFUSED, event.get("why") or "agent cut off")

    async def agent_superseded(self, event):
        """Another connection registered as this agent: the newest one (by the time it was opened) wins."""
        if event["channel"] != self.channel_name and self.agent_id and \
                event.get("opened_at", float("inf")) >= self.opened_at.timestamp():
            self.superseded = True
            await self.refuse(CLOSE_SUPERSEDED, "superseded by a newer connection of this agent")
