"""The fleet: agents and their tags and inventory, management groups, instruction definitions,
executions with per-agent status, and the responses agents send back (spec/yuzu-mcp.md §6)."""

import re
import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from yuzu.models import new_hex_id


def hex32():
    return secrets.token_hex(16)


CATEGORY_TAG_KEYS = ("role", "environment", "location", "service")
TAG_KEY_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


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


class Tag(models.Model):
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tags")
    key = models.CharField(max_length=64)
    value = models.CharField(max_length=256, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        unique_together = [("agent", "key")]
        ordering = ["agent_id", "key"]

    def __str__(self):
        return f"{self.agent_id} {self.key}={self.value}"

    def clean(self):
        self.key, self.value = normalise_tag(self.key, self.value)


class AgentInventory(models.Model):
    CATALOGUE = "agent.plugins"  # the row holding the plugin catalogue an agent declared on register

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="inventory")
    plugin = models.CharField(max_length=128)
    data = models.JSONField(default=dict)
    collected_at = models.DateTimeField(default=timezone.now)

    class Meta:
        unique_together = [("agent", "plugin")]
        verbose_name_plural = "agent inventory"


class ManagementGroup(models.Model):
    STATIC, DYNAMIC = "static", "dynamic"
    id = models.CharField(primary_key=True, max_length=32, default=hex32, editable=False)
    name = models.CharField(max_length=128, unique=True)
    description = models.CharField(max_length=1024, blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    membership_type = models.CharField(max_length=16, default=STATIC, choices=[(STATIC, STATIC), (DYNAMIC, DYNAMIC)])
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


class InstructionDefinition(models.Model):
    id = models.CharField(primary_key=True, max_length=128)
    name = models.CharField(max_length=256)
    version = models.CharField(max_length=32, default="1")
    type = models.CharField(max_length=16, default="question", choices=[("question", "question"), ("action", "action")])
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


class Execution(models.Model):
    RUNNING, SUCCEEDED, COMPLETED, CANCELLED = "running", "succeeded", "completed", "cancelled"
    TERMINAL = (SUCCEEDED, COMPLETED, CANCELLED)

    id = models.CharField(primary_key=True, max_length=32, default=hex32, editable=False)
    definition_id = models.CharField(max_length=128, blank=True)
    plugin = models.CharField(max_length=128)
    action = models.CharField(max_length=128)
    command_id = models.CharField(max_length=160, unique=True)
    status = models.CharField(max_length=16, default=RUNNING, db_index=True)
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


class AgentExecStatus(models.Model):
    """One target agent of an execution: ``pending`` → ``dispatched`` (sent, not acknowledged) →
    ``running`` (acknowledged: the agent has it) → a terminal state. ``attempts`` counts the sends."""

    STATES = ("pending", "dispatched", "running", "success", "failure", "timeout", "rejected")
    TERMINAL = ("success", "failure", "timeout", "rejected")
    execution = models.ForeignKey(Execution, on_delete=models.CASCADE, related_name="agent_statuses")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="exec_statuses")
    status = models.CharField(max_length=16, default="pending")
    attempts = models.PositiveSmallIntegerField(default=0)
    last_sent_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    error_detail = models.TextField(blank=True)
    first_response_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        unique_together = [("execution", "agent")]


class Response(models.Model):
    # Wire statuses of the agent protocol (CommandResponse).
    RUNNING, SUCCESS, FAILURE, TIMEOUT, REJECTED = 0, 1, 2, 3, 4
    STATUS_NAMES = {0: "RUNNING", 1: "SUCCESS", 2: "FAILURE", 3: "TIMEOUT", 4: "REJECTED"}

    execution = models.ForeignKey(Execution, on_delete=models.CASCADE, related_name="responses")
    instruction_id = models.CharField(max_length=160, db_index=True)
    agent_id = models.CharField(max_length=128, db_index=True)
    status = models.SmallIntegerField()
    output = models.TextField(blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    error_detail = models.TextField(blank=True)
    timestamp = models.DateTimeField(default=timezone.now)
    plugin = models.CharField(max_length=128, blank=True)

    class Meta:
        ordering = ["timestamp", "id"]
        unique_together = [("execution", "agent_id")]
