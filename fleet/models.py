"""The fleet: agents and their tags and inventory, management groups, instruction definitions,
executions with per-agent status, and the responses agents send back (spec/yuzu-mcp.md §6)."""

import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from yuzu.errors import RESULT_POLL_RETRY_MS
from yuzu.models import new_hex_id


def hex32():
    return secrets.token_hex(16)


CATEGORY_TAG_KEYS = ("role", "environment", "location", "service")
#: tags only the server sets (set_tag): ``service`` confines service-scoped tokens to the devices carrying it, so a
#: device may not choose it itself (an agent's register reports other tags)
SERVER_TAG_KEYS = ("service",)
TAG_KEY_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def heartbeat_interval():
    """Seconds between an agent's heartbeats (the server tells each agent on register)."""
    return int(getattr(settings, "YUZU_AGENT_HEARTBEAT_S", 30))


SILENT_INTERVALS = 3  # heartbeat intervals without a sign of life after which an agent is not connected


def touch_interval():
    """Seconds between a server process's touches of its agent connections (AgentQuerySet.touch): a third
    of the heartbeat interval, so a late touch or two never lets the sweep mark a live agent disconnected,
    and re-sends waiting for evidence of loss do not wait long for it."""
    return heartbeat_interval() / 3


class AgentQuerySet(models.QuerySet):
    """How agents connect and go away, as their sockets (fleet.consumers), their server process
    (fleet.liveness) and the sweep (fleet.tasks) change it. Each is one conditional UPDATE: the newest
    connection of an agent wins, whatever order the server processes finish their work in.

    ``last_seen`` is when the server last knew the agent alive: its register, a heartbeat processed, its
    close, or its server process's touch (``touch``) while the socket is open and not silent. So an agent
    whose frames are not yet read (its server is behind) stays connected, and the sweep only finds agents
    whose process stopped touching them (it died) or whose socket is silent."""

    def connect(self, agent_id, opened_at, **fields):
        """Mark the agent connected as of the connection opened at ``opened_at`` and store what it reports
        (``fields``). Returns False, changing nothing, if a connection opened later has registered already
        (this one is stale: its agent has reconnected since)."""
        return bool(self.filter(Q(connected_since__isnull=True) | Q(connected_since__lte=opened_at), pk=agent_id)
                    .update(connected=True, connected_since=opened_at, last_seen=timezone.now(), **fields))

    def seen(self, agent_ids):
        """Heartbeats: these agents are alive, so connected."""
        self.filter(pk__in=agent_ids).update(connected=True, last_seen=timezone.now())

    def touch(self, alive, caught_up, now=None):
        """A server process's touch, once per touch_interval(): ``alive`` are the agents whose open
        connections it holds and that are not silent; ``caught_up`` those of them whose connection it has
        read and handled everything from (and relayed everything to) and that have been idle a moment since.
        One UPDATE: their ``last_seen`` (connected agents only, so a closed one keeps its close time) and the
        caught-up ones' ``caught_up_at``, the evidence fleet.tasks re-sends on."""
        now = now or timezone.now()
        fields = {"last_seen": now}
        if caught_up:
            fields["caught_up_at"] = Case(When(pk__in=caught_up, then=Value(now)), default=F("caught_up_at"))
        return self.filter(pk__in=alive, connected=True).update(**fields)

    def disconnected(self, agent_id, opened_at):
        """The connection opened at ``opened_at`` closed: the agent is disconnected unless a newer
        connection of it has registered since."""
        self.filter(pk=agent_id, connected_since=opened_at).update(connected=False, last_seen=timezone.now())

    def mark_silent_disconnected(self, now=None):
        """Agents with no sign of life for SILENT_INTERVALS heartbeat intervals are not connected, whatever
        the flag says: their server process died without closing their sockets (it stopped touching them),
        or their socket is open but silent. Run by the sweep; returns how many."""
        cutoff = (now or timezone.now()) - timedelta(seconds=SILENT_INTERVALS * heartbeat_interval())
        return self.filter(connected=True, last_seen__lt=cutoff).update(connected=False)


class Agent(models.Model):
    agent_id = models.CharField(primary_key=True, max_length=128)
    hostname = models.CharField(max_length=255, blank=True)
    os = models.CharField(max_length=64, blank=True)
    arch = models.CharField(max_length=32, blank=True)
    agent_version = models.CharField(max_length=32, blank=True)
    connected = models.BooleanField(default=False, db_index=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    enrolled_at = models.DateTimeField(default=timezone.now)
    attributes = models.JSONField(default=dict, blank=True, help_text="Self-reported attributes (props.<key>)")
    credential_hash = models.CharField(max_length=64, blank=True, editable=False)
    simulated = models.BooleanField(default=False)
    quarantined = models.BooleanField(default=False)
    quarantine_reason = models.CharField(max_length=1024, blank=True)
    # When the agent's current connection was opened: the newest connection to register wins, so a
    # register that completes late on an older, abandoned connection cannot take the agent over.
    connected_since = models.DateTimeField(null=True, blank=True, editable=False)
    # When the agent's server process last found its connection caught up: every frame it had sent read
    # and handled (so any acknowledgement stored), every command for it relayed, and idle since
    # (AgentQuerySet.touch). An unacknowledged command sent well before that may be lost (fleet.tasks).
    caught_up_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = AgentQuerySet.as_manager()

    class Meta:
        ordering = ["agent_id"]

    def __str__(self):
        return f"{self.agent_id} ({self.hostname})"


def normalise_tag(key, value):
    """Category keys are lower-cased and validated; other keys keep their case."""
    if not isinstance(key, str) or not TAG_KEY_RE.match(key):
        raise ValidationError("tag key must be 1-64 characters of letters, digits and _.:-")
    if not isinstance(value, str) or len(value) > 256:
        raise ValidationError("tag value must be a string of at most 256 characters")
    if key.lower() in CATEGORY_TAG_KEYS:
        key, value = key.lower(), value.strip().lower()
        if not re.match(r"^[a-z0-9_.-]{1,64}$", value):
            raise ValidationError(f"a '{key}' tag value must be 1-64 characters of a-z, 0-9 and _.-")
    return key, value


class TagQuerySet(models.QuerySet):
    def report(self, agent_id, tags, now):
        """An agent's register: its reported ``tags`` become its AGENT tags — updated, added, and the ones it no
        longer reports removed — except for the keys set on the server (SERVER rows are never written here, even
        by a register racing a set_tag: every write is conditional on the row being the agent's). Returns the
        reported keys ignored because the server set them or only the server may ({key: the reported value})."""
        ignored = {key: value for key, value in tags.items() if key in SERVER_TAG_KEYS}  # never the agent's
        tags = {key: value for key, value in tags.items() if key not in SERVER_TAG_KEYS}
        for key, value in tags.items():
            if self.filter(agent_id=agent_id, key=key, origin=Tag.Origin.AGENT).update(value=value, updated_at=now):
                continue
            tag, created = self.get_or_create(agent_id=agent_id, key=key,
                                              defaults={"value": value, "origin": Tag.Origin.AGENT})
            if not created and tag.origin == Tag.Origin.SERVER and tag.value != value:
                ignored[key] = value
        self.filter(agent_id=agent_id, origin=Tag.Origin.AGENT).exclude(key__in=list(tags)).delete()
        return ignored


class Tag(models.Model):
    """One key=value of an agent. Its origin says who owns it: a tag set on the server (fleet.services.set_tag —
    REST, MCP, the admin) wins and a register never changes or removes it; a key nobody set on the server is the
    agent's, which each register reports afresh (Tag.objects.report)."""

    class Origin(models.TextChoices):
        SERVER = "server"  # set through the server's services: tags decide groups and scopes, so the agent can't
        AGENT = "agent"  # reported by the agent at register, for a key the server did not set

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tags")
    key = models.CharField(max_length=64)
    value = models.CharField(max_length=256, blank=True)
    # rows stored before origins were: the server's (it cannot tell which an administrator set, so it keeps them)
    origin = models.CharField(max_length=8, choices=Origin.choices, default=Origin.SERVER)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TagQuerySet.as_manager()

    class Meta:
        unique_together = [("agent", "key")]
        ordering = ["agent_id", "key"]

    def __str__(self):
        return f"{self.agent_id} {self.key}={self.value}"

    def clean(self):
        self.key, self.value = normalise_tag(self.key, self.value)


class AgentInventoryQuerySet(models.QuerySet):
    def store(self, agent_id, plugin, data, at=None):
        """The agent's latest ``plugin`` data replaces what was there."""
        self.update_or_create(agent_id=agent_id, plugin=plugin,
                              defaults={"data": data, "collected_at": at or timezone.now()})

    def store_reported(self, agent_id, plugin, data, max_rows):
        """An ``inventory`` frame's data: stored as ``store`` does, unless ``plugin`` would be a new row of an agent
        that has ``max_rows`` already (each row is returned by every inventory read: an agent naming new plugins
        without end filled the store). Returns whether it was stored."""
        with transaction.atomic():
            if not self.filter(agent_id=agent_id, plugin=plugin).exists() and \
                    self.filter(agent_id=agent_id).count() >= max_rows:
                return False
            self.store(agent_id, plugin, data)
        return True


class AgentInventory(models.Model):
    CATALOGUE = "agent.plugins"  # the row holding the plugin catalogue an agent declared on register

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="inventory")
    plugin = models.CharField(max_length=128)
    data = models.JSONField(default=dict)
    collected_at = models.DateTimeField(default=timezone.now)

    objects = AgentInventoryQuerySet.as_manager()

    class Meta:
        unique_together = [("agent", "plugin")]
        verbose_name_plural = "agent inventory"


class ManagementGroup(models.Model):
    class Membership(models.TextChoices):
        STATIC = "static"  # members added one by one
        DYNAMIC = "dynamic"  # every agent its scope expression matches

    id = models.CharField(primary_key=True, max_length=32, default=hex32, editable=False)
    name = models.CharField(max_length=128, unique=True)
    description = models.CharField(max_length=1024, blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    membership_type = models.CharField(max_length=16, default=Membership.STATIC, choices=Membership.choices)
    scope_expression = models.CharField(max_length=8192, blank=True)
    members = models.ManyToManyField(Agent, blank=True, related_name="groups")
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class DeviceToken(models.Model):
    """An enrolment token an admin mints; an agent trades it for its own credential."""

    id = models.CharField(primary_key=True, max_length=24, default=new_hex_id, editable=False)
    name = models.CharField(max_length=256)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    max_uses = models.PositiveIntegerField(null=True, blank=True)
    uses = models.PositiveIntegerField(default=0)

    def __str__(self):
        return self.name

    def claim(self, now):
        """Use one of the token's uses if it is live (not revoked, not expired, uses left). One conditional
        UPDATE, so concurrent enrolments cannot exceed ``max_uses``. Returns whether it did."""
        return bool(DeviceToken.objects.filter(
            Q(pk=self.pk, revoked_at__isnull=True), Q(expires_at__isnull=True) | Q(expires_at__gt=now),
            Q(max_uses__isnull=True) | Q(uses__lt=F("max_uses")),
        ).update(uses=F("uses") + 1))

    def refusal(self, now):
        """Why the token is not live (as a claim refused it)."""
        return ("revoked" if self.revoked_at else "expired" if self.expires_at and self.expires_at <= now
                else "no uses left")


class InstructionDefinition(models.Model):
    class Type(models.TextChoices):
        QUESTION = "question"  # reads
        ACTION = "action"  # changes something

    id = models.CharField(primary_key=True, max_length=128)
    name = models.CharField(max_length=256)
    version = models.CharField(max_length=32, default="1")
    type = models.CharField(max_length=16, default=Type.QUESTION, choices=Type.choices)
    plugin = models.CharField(max_length=128)
    action = models.CharField(max_length=128)
    description = models.TextField(blank=True)
    parameter_schema = models.JSONField(default=dict, blank=True)
    result_schema = models.JSONField(default=dict, blank=True)
    approval_mode = models.CharField(max_length=32, default="auto")
    platforms = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    instruction_set_id = models.CharField(max_length=128, blank=True)
    yaml_source = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return self.id


class AgentState(models.TextChoices):
    """Where one target agent is with one execution: the one vocabulary of the per-agent row
    (AgentExecStatus), the stored answer (Response) and the wire. A member's NAME is its spelling in the
    agent protocol and the API (a response frame's ``status``: RUNNING … REJECTED); its value is the stored
    one. ``pending`` → ``dispatched`` (sent, not acknowledged) → ``running`` (acknowledged: the agent has it)
    → a terminal state (Response.TERMINAL), reached once."""

    PENDING = "pending"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    SUCCESS = "success"
    FAILURE = "failure"
    TIMEOUT = "timeout"
    REJECTED = "rejected"


class Execution(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"  # every target answered, none failed
        COMPLETED = "completed"  # every target answered, some failed
        CANCELLED = "cancelled"  # cancelled, or nothing was sent

    TERMINAL = (Status.SUCCEEDED, Status.COMPLETED, Status.CANCELLED)

    id = models.CharField(primary_key=True, max_length=32, default=hex32, editable=False)
    definition_id = models.CharField(max_length=128, blank=True)
    plugin = models.CharField(max_length=128)
    action = models.CharField(max_length=128)
    command_id = models.CharField(max_length=160, unique=True)
    status = models.CharField(max_length=16, default=Status.RUNNING, choices=Status.choices, db_index=True)
    scope_expression = models.CharField(max_length=8192, blank=True)
    parameter_values = models.JSONField(default=dict, blank=True)
    dispatched_by = models.CharField(max_length=150)
    dispatched_at = models.DateTimeField(default=timezone.now, db_index=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    agents_targeted = models.PositiveIntegerField(default=0)
    agents_responded = models.PositiveIntegerField(default=0)
    agents_success = models.PositiveIntegerField(default=0)
    agents_failure = models.PositiveIntegerField(default=0)
    resent = models.PositiveIntegerField(default=0, help_text="Sends to agents that had not acknowledged the command")
    parent_id = models.CharField(max_length=32, blank=True)
    rerun_of = models.CharField(max_length=32, blank=True)
    bundle_id = models.CharField(max_length=64, blank=True, db_index=True)
    bundle_step = models.PositiveIntegerField(null=True, blank=True)
    last_error_detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-dispatched_at"]

    def __str__(self):
        return f"{self.id} {self.plugin}.{self.action} {self.status}"

    @property
    def is_terminal(self):
        return self.status in self.TERMINAL

    @property
    def progress_pct(self):
        if not self.agents_targeted:
            return 100.0 if self.is_terminal else 0.0
        return round(100.0 * self.agents_responded / self.agents_targeted, 1)

    def to_dict(self):
        """The execution as the API shows it (MCP and REST)."""
        return {
            "id": self.id, "definition_id": self.definition_id, "plugin": self.plugin, "action": self.action,
            "command_id": self.command_id, "status": self.status, "scope_expression": self.scope_expression,
            "dispatched_by": self.dispatched_by, "dispatched_at": _iso(self.dispatched_at),
            "expires_at": _iso(self.expires_at), "completed_at": _iso(self.completed_at),
            "agents_targeted": self.agents_targeted, "agents_responded": self.agents_responded,
            "agents_success": self.agents_success, "agents_failure": self.agents_failure,
            "progress_pct": self.progress_pct, "resent": self.resent,
            "retry_after_ms": None if self.is_terminal else RESULT_POLL_RETRY_MS, "bundle_id": self.bundle_id or None,
            "status_reason": self.last_error_detail or None,
        }

    def cancel(self, reason):
        """Stop dispatch: a running execution becomes cancelled (one conditional UPDATE, so it races neither
        another cancel nor the last answer), with ``reason`` as its error detail. Agents still pending are
        never sent the command: their rows keep ``pending`` with error_detail "cancelled before dispatch" and
        are not counted; agents already sent it keep running, and their answers are still recorded.
        Reloads the instance. Returns (whether it was cancelled now, how many agents were withheld)."""
        with transaction.atomic():
            cancelled = Execution.objects.filter(pk=self.pk, status=self.Status.RUNNING).update(
                status=self.Status.CANCELLED, completed_at=timezone.now(), last_error_detail=reason)
            withheld = self.agent_statuses.filter(status=AgentState.PENDING).update(
                error_detail="cancelled before dispatch") if cancelled else 0
        self.refresh_from_db()
        return bool(cancelled), withheld


class AgentExecStatus(models.Model):
    """One target agent of an execution, in an AgentState. ``attempts`` counts the sends."""

    execution = models.ForeignKey(Execution, on_delete=models.CASCADE, related_name="agent_statuses")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="exec_statuses")
    status = models.CharField(max_length=16, default=AgentState.PENDING, choices=AgentState.choices)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_sent_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    error_detail = models.TextField(blank=True)
    first_response_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        unique_together = [("execution", "agent")]
        verbose_name_plural = "agent exec statuses"  # Django's default adds an "s": "agent exec statuss"


class Response(models.Model):
    """The one answer of one agent to one execution: the latest RUNNING frame (output so far, updated in
    place), then the terminal one."""

    # The states an agent answers with — a response frame's status is one of their names — in the
    # protocol's order; all but RUNNING are terminal.
    STATES = (AgentState.RUNNING, AgentState.SUCCESS, AgentState.FAILURE, AgentState.TIMEOUT, AgentState.REJECTED)
    TERMINAL = STATES[1:]

    execution = models.ForeignKey(Execution, on_delete=models.CASCADE, related_name="responses")
    instruction_id = models.CharField(max_length=160, db_index=True)
    agent_id = models.CharField(max_length=128, db_index=True)
    status = models.CharField(max_length=16, choices=[(s.value, s.label) for s in STATES])
    output = models.TextField(blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    error_detail = models.TextField(blank=True)
    timestamp = models.DateTimeField(default=timezone.now)
    plugin = models.CharField(max_length=128, blank=True)

    class Meta:
        ordering = ["timestamp", "id"]
        unique_together = [("execution", "agent_id")]

    def to_dict(self):
        return {"agent_id": self.agent_id, "execution_id": self.execution_id, "status": AgentState(self.status).name,
                "output": self.output, "exit_code": self.exit_code, "error": self.error_detail or None,
                "timestamp": _iso(self.timestamp)}


def _iso(dt):
    return dt.isoformat() if dt else None
