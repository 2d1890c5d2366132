"""The server end of the agent protocol: one WebSocket per agent at ``/agent/v1/ws`` (docs/agent-protocol.md).

Every inbound message is validated before it touches the database; anything malformed closes the
socket with 4400 and a reason (what was stored before stays stored). A refused identity closes with
4401. Each message costs one database hop: a sync service function below, run through
``database_sync_to_async``. Commands and pushes reach the socket only through the channel layer group
``agent_group(agent_id)``, so any server process can address any agent."""

import asyncio
import contextvars
import hmac
import json
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.consumer import get_handler_name
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from yuzu.audit import audit
from yuzu.metrics import AGENT_AUTH_FAILURES, AGENT_ORIGIN_REFUSED, FLEET_COMMAND_SENDS, FLEET_COMMAND_UNSENT
from yuzu.models import hash_secret, new_hex_id

from . import events
from .executions import STATUS_CODES, record_response, record_responses
from .models import Agent, AgentInventory, DeviceToken, Tag, normalise_tag
from .push import agent_group

log = logging.getLogger("yuzu.fleet.agents")

CLOSE_MALFORMED, CLOSE_REFUSED, CLOSE_FORBIDDEN, CLOSE_HELLO_TIMEOUT, CLOSE_SUPERSEDED = 4400, 4401, 4403, 4408, 4409
MAX_FRAME_CHARS = 4 * 1024 * 1024
MAX_OUTPUT_BYTES = 1024 * 1024
MAX_ERROR_BYTES = 64 * 1024
MAX_ID_BYTES = 160
MAX_ATTRIBUTES = 64
MAX_TAGS = 64
MAX_CATALOGUE_BYTES = 256 * 1024
HELLO_TIMEOUT_S = 30
AUDIT_WINDOW_S = 60  # refused enrolments/registers: at most one audit row per source address per window
MAX_AUDIT_SOURCES = 10000  # source addresses tracked at once; beyond that they share one window
AGENT_ID_RE = re.compile(r"[0-9a-f]{1,64}")  # enroll mints 32 lowercase hex characters
SECRET_RE = re.compile(r"[\x21-\x7e]+")  # device tokens and agent credentials: printable ASCII
ASCII_RE = re.compile(r"[\x20-\x7e]*")  # os, arch, agent_version
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")  # json.loads joins surrogate pairs: any left is unpaired
PLUGINS_INVENTORY = "agent.plugins"  # the AgentInventory row holding the agent's plugin catalogue
_DUMMY_HASH = hash_secret("no such agent")


def heartbeat_interval():
    return int(getattr(settings, "YUZU_AGENT_HEARTBEAT_S", 30))


class Malformed(Exception):
    """Close 4400: the message breaks the protocol."""


@dataclass(frozen=True)
class Failure:
    """The audit row of a refused enrolment or register (written by FailureAudit)."""

    action: str
    principal: str
    target_type: str
    target_id: str
    detail: str


class Refused(Exception):
    """Close 4401: the token or credential is not accepted."""

    def __init__(self, message, failure=None):
        super().__init__(message)
        self.failure = failure


class Superseded(Exception):
    """Close 4409: a newer connection of this agent has registered."""


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


def _hostname(msg):
    return _text(msg, "hostname", 255)


def _response(msg):
    frame = {"command_id": _text(msg, "command_id", MAX_ID_BYTES), "status": msg.get("status"),
             "output": _free_text(msg, "output", MAX_OUTPUT_BYTES) or "",
             "error": _free_text(msg, "error", MAX_ERROR_BYTES), "exit_code": msg.get("exit_code")}
    if frame["status"] not in STATUS_CODES:
        raise Malformed(f"'status' must be one of {', '.join(STATUS_CODES)}")
    code = frame["exit_code"]
    if code is not None and (not isinstance(code, int) or isinstance(code, bool) or not -2**31 <= code < 2**31):
        raise Malformed("'exit_code' must be a 32-bit integer or null")
    return frame


# --- services: one database hop per message ----------------------------------------------------

def enroll(token, hostname):
    """Trade a device enrolment token for a new agent identity: returns (agent_id, credential)."""
    now = timezone.now()
    dt = DeviceToken.objects.filter(token_hash=hash_secret(token)).first()
    agent_id, credential = new_hex_id(16), "yza_" + secrets.token_hex(32)
    with transaction.atomic():
        # One conditional UPDATE claims a use, so concurrent enrolments cannot exceed max_uses.
        claimed = dt is not None and DeviceToken.objects.filter(
            Q(pk=dt.pk, revoked_at__isnull=True), Q(expires_at__isnull=True) | Q(expires_at__gt=now),
            Q(max_uses__isnull=True) | Q(uses__lt=F("max_uses")),
        ).update(uses=F("uses") + 1)
        if claimed:
            Agent.objects.create(agent_id=agent_id, hostname=hostname, credential_hash=hash_secret(credential),
                                 enrolled_at=now)
    who = f"device_token:{dt.name}" if dt else "device_token:unknown"
    if not claimed:
        reason = ("unknown token" if dt is None else "revoked" if dt.revoked_at else
                  "expired" if dt.expires_at and dt.expires_at <= now else "no uses left")
        raise Refused("enrolment refused: the device token is not valid",
                      Failure("agent.enroll", who, "DeviceToken", dt.id if dt else "",
                              f"hostname={hostname} reason={reason}"))
    audit(who, "agent.enroll", "success", target_type="Agent", target_id=agent_id,
          detail=f"hostname={hostname} device_token={dt.id}")
    return agent_id, credential


def register(agent_id, credential, fields, tags, plugins, opened_at):
    """Verify the credential (constant time), refresh what the agent reports, mark it connected as of
    the connection opened at ``opened_at``. Returns the agent's current tags. The newest connection
    wins: if one opened later has registered already, this one is stale (its agent has reconnected
    since) and is refused with Superseded, changing nothing."""
    agent = Agent.objects.filter(pk=agent_id).first()
    stored = agent.credential_hash if agent and agent.credential_hash else _DUMMY_HASH
    if not hmac.compare_digest(stored, hash_secret(credential)) or agent is None:
        raise Refused("invalid agent credential",
                      Failure("agent.register", f"agent:{agent_id}", "Agent", agent_id, "invalid credential"))
    now = timezone.now()
    with transaction.atomic():
        if not Agent.objects.filter(Q(connected_since__isnull=True) | Q(connected_since__lte=opened_at),
                                    pk=agent_id).update(
                connected=True, connected_since=opened_at, last_seen=now,
                simulated=bool(fields["attributes"].get("simulated")), **fields):
            raise Superseded("a newer connection of this agent has registered")
        for key, value in tags.items():
            Tag.objects.update_or_create(agent_id=agent_id, key=key, defaults={"value": value})
        AgentInventory.objects.update_or_create(agent_id=agent_id, plugin=PLUGINS_INVENTORY,
                                                defaults={"data": plugins, "collected_at": now})
    return dict(Tag.objects.filter(agent_id=agent_id).values_list("key", "value"))


def seen(agent_id):
    Agent.objects.filter(pk=agent_id).update(connected=True, last_seen=timezone.now())


def store_inventory(agent_id, plugin, data):
    AgentInventory.objects.update_or_create(agent_id=agent_id, plugin=plugin,
                                            defaults={"data": data, "collected_at": timezone.now()})


def disconnected(agent_id, opened_at):
    """The connection opened at ``opened_at`` closed: the agent is disconnected unless a newer
    connection of it has registered since."""
    Agent.objects.filter(pk=agent_id, connected_since=opened_at).update(connected=False, last_seen=timezone.now())


def mark_silent_disconnected(now=None):
    """Agents silent for three heartbeat intervals are not connected, whatever the flag says (their
    server process died without closing their sockets). Run by the sweep."""
    cutoff = (now or timezone.now()) - timedelta(seconds=3 * heartbeat_interval())
    return Agent.objects.filter(connected=True, last_seen__lt=cutoff).update(connected=False)


# --- response frames, batched across the connections of this process ---------------------------

MAX_BATCH = 1000


class ResponseBatcher:
    """Stores the response frames of every agent connection of this server process, a batch per
    database hop: while one batch is being written, the frames that arrive meanwhile queue up and go
    together in the next (``fleet.executions.record_responses``: one transaction, a handful of queries
    and one event per execution, whatever the batch size). A lone frame is written at once. The events
    are published from the event loop, so the database thread never waits on the channel layer.

    ``record`` returns once the frame is stored, so each connection keeps its order (its next message
    is handled after its previous frame is in the database). A batch that fails is retried frame by
    frame, so one bad frame fails only its own connection."""

    def __init__(self):
        self.loop, self.queue, self.task = None, [], None

    async def record(self, agent_id, frame):
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # a new event loop (tests): nothing queued on the old one survives it
            self.loop, self.queue, self.task = loop, [], None
        done = loop.create_future()
        self.queue.append((agent_id, frame, done))
        if self.task is None:
            self.task = loop.create_task(self.drain())
        await done

    async def drain(self):
        try:
            while self.queue:
                batch, self.queue = self.queue[:MAX_BATCH], self.queue[MAX_BATCH:]
                try:
                    changed = await database_sync_to_async(record_responses)([(a, f) for a, f, _ in batch],
                                                                             publish=False)
                except Exception:
                    log.warning("storing a batch of %d responses failed; retrying one by one", len(batch),
                                exc_info=True)
                    for agent_id, frame, done in batch:
                        try:
                            await database_sync_to_async(record_response)(agent_id, frame)
                        except Exception as exc:
                            _settle(done, exc)
                else:
                    await _publish(changed)
                for *_, done in batch:
                    _settle(done)
        finally:
            self.task = None


async def _publish(executions):
    """fleet.events.publish, from the event loop: best effort (the rows are the truth)."""
    layer = get_channel_layer()
    for ex in executions if layer is not None else ():
        try:
            await layer.group_send(events.execution_group(ex.id), events.event(ex))
        except Exception:
            log.warning("publishing an event for execution %s failed", ex.id, exc_info=True)


def _settle(future, exc=None):
    if not future.done():
        future.set_exception(exc) if exc is not None else future.set_result(None)


responses = ResponseBatcher()


# --- refused enrolments and registers: audited, but not one row each ---------------------------

def _audit_failure(source, failure, count=None):
    """One audit row: a first failure (``count`` None), or the ``count`` failures of a closed window."""
    detail = (f"{failure.detail} source={source}" if count is None else
              f"source={source} failures={count} in the last {AUDIT_WINDOW_S} s; last: {failure.detail}")
    audit(failure.principal, failure.action, "failure", target_type=failure.target_type,
          target_id=failure.target_id, detail=detail)


class FailureAudit:
    """Refused enrolments and registers, audited without letting an unauthenticated peer flood the
    audit log: the first failure of a source address (per action) is written at once; the ones after it
    within AUDIT_WINDOW_S are counted, and written as one row carrying the count when the window ends
    (which opens the next window). So a source costs at most one row per window. Every failure counts
    in yuzu_agent_auth_failures_total. Per server process (per event loop, like ResponseBatcher)."""

    def __init__(self):
        self.loop, self.windows = None, {}

    async def record(self, source, failure):
        AGENT_AUTH_FAILURES.labels(failure.action.removeprefix("agent.")).inc()
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            self.loop, self.windows = loop, {}
        if (source, failure.action) not in self.windows and len(self.windows) >= MAX_AUDIT_SOURCES:
            source = "(many sources)"
        window = self.windows.get((source, failure.action))
        if window is not None:
            window["count"] += 1
            window["last"] = failure
            return
        self.open((source, failure.action))
        await database_sync_to_async(_audit_failure)(source, failure)

    def open(self, key):
        self.windows[key] = {"count": 0, "last": None}
        self.loop.call_later(AUDIT_WINDOW_S, lambda: self.loop.create_task(self.close(key)),
                             context=contextvars.Context())

    async def close(self, key):
        window = self.windows.pop(key, None)
        if window and window["count"]:
            self.open(key)
            await database_sync_to_async(_audit_failure)(key[0], window["last"], window["count"])


failures = FailureAudit()


# --- the consumer ------------------------------------------------------------------------------

class AgentConsumer(AsyncJsonWebsocketConsumer):
    TYPES = ("enroll", "register", "heartbeat", "inventory", "response", "received")  # handled by on_<type>

    async def connect(self):
        self.opened_at = timezone.now()  # orders the connections of one agent: the newest one wins
        self.agent_id = None  # set once registered
        self.group = None
        self.enrolled = False
        self.closing = False
        self.superseded = False
        self.held = []  # group messages that arrive while the credential is being checked
        self.hello_timer = None
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
        does that itself, and the hop (one per frame and per command relayed) serialises with them."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def disconnect(self, code):
        if self.hello_timer is not None:
            self.hello_timer.cancel()
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.agent_id and not self.superseded:
            await database_sync_to_async(disconnected)(self.agent_id, self.opened_at)

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
            if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
                raise Malformed("a JSON object with a string 'type' is expected")
            if msg["type"] not in self.TYPES:
                raise Malformed(f"unknown message type '{msg['type'][:40]}'")
            if (self.agent_id is None) != (msg["type"] in ("enroll", "register")):
                raise Malformed(f"'{msg['type']}' is not allowed " + ("before register" if self.agent_id is None
                                                                      else "after register"))
            await getattr(self, "on_" + msg["type"])(msg)
        except Malformed as exc:
            await self.refuse(CLOSE_MALFORMED, str(exc))
        except Refused as exc:
            if exc.failure is not None:
                await failures.record(self.source, exc.failure)
            await self.refuse(CLOSE_REFUSED, str(exc))
        except Superseded as exc:
            await self.refuse(CLOSE_SUPERSEDED, str(exc))

    async def on_enroll(self, msg):
        if self.enrolled:
            raise Malformed("already enrolled on this connection; send register")
        token = _text(msg, "token", 256, pattern=SECRET_RE, what="printable ASCII")
        hostname = _hostname(msg)
        self.hello_timer.cancel()
        agent_id, credential = await database_sync_to_async(enroll)(token, hostname)
        self.enrolled = True
        await self.send_json({"type": "enrolled", "agent_id": agent_id, "credential": credential})
        self.expect_hello()  # now register

    async def on_register(self, msg):
        agent_id = _text(msg, "agent_id", 64, pattern=AGENT_ID_RE, what="lowercase hex, as enroll issued it")
        credential = _text(msg, "credential", 256, pattern=SECRET_RE, what="printable ASCII")
        fields = {"hostname": _hostname(msg),
                  "os": _text(msg, "os", 64, optional=True, pattern=ASCII_RE, what="printable ASCII") or "",
                  "arch": _text(msg, "arch", 32, optional=True, pattern=ASCII_RE, what="printable ASCII") or "",
                  "agent_version": _text(msg, "agent_version", 32, optional=True, pattern=ASCII_RE,
                                         what="printable ASCII") or "",
                  "attributes": _attributes(msg)}
        tags, plugins = _tags(msg), _plugins(msg)
        self.hello_timer.cancel()  # see expect_hello
        group = agent_group(agent_id)
        # Join before marking the agent connected so no command sent after that is missed; hold
        # what arrives until the credential is verified.
        await self.channel_layer.group_add(group, self.channel_name)
        self.group = group
        try:
            current = await database_sync_to_async(register)(agent_id, credential, fields, tags, plugins,
                                                             self.opened_at)
        except (Refused, Superseded):
            await self.channel_layer.group_discard(group, self.channel_name)
            self.group, self.held = None, []
            raise
        self.agent_id = agent_id
        await self.channel_layer.group_send(group, {"type": "agent.superseded", "channel": self.channel_name,
                                                    "opened_at": self.opened_at.timestamp()})
        await self.send_json({"type": "registered", "agent_id": agent_id, "heartbeat_interval": heartbeat_interval(),
                              "tags": current})
        for payload in self.held:
            await self.send_json(payload)
        self.held = []

    async def on_heartbeat(self, msg):
        await database_sync_to_async(seen)(self.agent_id)

    async def on_inventory(self, msg):
        plugin = _text(msg, "plugin", 128)
        data = msg.get("data")
        if not isinstance(data, dict):
            raise Malformed("'data' must be an object")
        _json(data, "data")
        await database_sync_to_async(store_inventory)(self.agent_id, plugin, data)

    async def on_response(self, msg):
        await responses.record(self.agent_id, _response(msg))

    async def on_received(self, msg):
        """The agent has the command (an acknowledgement; fleet.executions._apply)."""
        await responses.record(self.agent_id, {"command_id": _text(msg, "command_id", MAX_ID_BYTES),
                                               "status": "RECEIVED"})

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

    async def agent_superseded(self, event):
        """Another connection registered as this agent: the newest one (by the time it was opened) wins."""
        if event["channel"] != self.channel_name and self.agent_id and \
                event.get("opened_at", float("inf")) >= self.opened_at.timestamp():
            self.superseded = True
            await self.refuse(CLOSE_SUPERSEDED, "superseded by a newer connection of this agent")
