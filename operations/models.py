"""The operator surface's records (spec/operator.md): plugin configuration, write-only plugin secrets and
kill switches (one store); upload grants and their sessions; instruction schedules; the typed software
inventory and the detected licences each agent reports."""

import hashlib
import json
import re
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from django.db import models
from django.utils import timezone

from yuzu.plans import SENSITIVE_KEY_RE, redact
from yuzu.secrets import seal, sealed_column, unseal

PLUGIN_RE = re.compile(r"[a-z0-9_][a-z0-9_-]{0,63}")
RESERVED_PLUGIN_RE = re.compile(r"__[a-z0-9_]{1,64}__")  # kill-switch tools only
KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
ACTION_RE = re.compile(r"[a-z0-9_][a-z0-9_-]{0,63}")
MAX_VALUE_BYTES = 8192
MAX_SECRET_BYTES = 65536
MAX_REASON = 512


def now_ms():
    return int(time.time() * 1000)


# --- plugin configuration, secrets, kill switches --------------------------------------------------

class PluginConfig(models.Model):
    plugin = models.CharField(max_length=64)
    key = models.CharField(max_length=128)
    value = models.TextField(max_length=MAX_VALUE_BYTES)
    updated_at_ms = models.BigIntegerField(default=now_ms)
    updated_by = models.CharField(max_length=150)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["plugin", "key"], name="plugin_config_unique")]
        ordering = ["plugin", "key"]
        verbose_name = "plugin configuration value"

    def __str__(self):
        return f"{self.plugin}.{self.key}"

    def to_dict(self):
        return {"plugin": self.plugin, "key": self.key, "value": self.value, "updated_at_ms": self.updated_at_ms,
                "updated_by": self.updated_by}


class PluginSecret(models.Model):
    """Write-only: nothing reads ``sealed_value`` back except a KEK rotation's re-wrap (yuzu.secrets)."""

    scope_key = models.CharField(primary_key=True, max_length=200, help_text="<plugin>.<key>; the sealing's row id")
    plugin = models.CharField(max_length=64)
    key = models.CharField(max_length=128)
    sealed_value = models.BinaryField(help_text="envelope-encrypted (yuzu.secrets); never returned by any API")
    updated_at_ms = models.BigIntegerField(default=now_ms)
    updated_by = models.CharField(max_length=150)

    class Meta:
        ordering = ["scope_key"]
        verbose_name = "plugin secret"

    def __str__(self):
        return self.scope_key

    def to_dict(self):
        """Metadata only."""
        return {"plugin": self.plugin, "key": self.key, "updated_at_ms": self.updated_at_ms,
                "updated_by": self.updated_by}


SECRET_VALUE = sealed_column("operations", PluginSecret, "sealed_value")


class PluginKillSwitch(models.Model):
    """A row exists only once someone flipped the switch; no row means enabled. ``group`` empty: fleet-wide;
    otherwise the switch applies to that management group's agents (and its subgroups') only. Deleting the
    group deletes its switches."""

    scope_key = models.CharField(primary_key=True, max_length=200,
                                 help_text="<plugin>[.<action>], then @<group id> for a group's switch")
    plugin = models.CharField(max_length=68)
    action = models.CharField(max_length=64, blank=True, default="")
    group = models.ForeignKey("fleet.ManagementGroup", null=True, blank=True, on_delete=models.CASCADE,
                              related_name="+", help_text="empty: fleet-wide")
    enabled = models.BooleanField(default=True)
    reason = models.CharField(max_length=MAX_REASON, blank=True, default="")
    set_by = models.CharField(max_length=150)
    updated_at_ms = models.BigIntegerField(default=now_ms)

    class Meta:
        ordering = ["scope_key"]
        verbose_name = "plugin kill switch"
        verbose_name_plural = "plugin kill switches"

    def __str__(self):
        return f"{self.switch} ({self.where}): {'on' if self.enabled else 'OFF'}"

    @property
    def where(self):
        return f"group {self.group.name}" if self.group_id else "fleet-wide"

    @staticmethod
    def key_of(plugin, action="", group_id=""):
        key = f"{plugin}.{action}" if action else plugin
        return f"{key}@{group_id}" if group_id else key

    @property
    def switch(self):
        """``<plugin>`` or ``<plugin>.<action>``: what it switches, wherever it applies."""
        return self.key_of(self.plugin, self.action)

    def to_dict(self):
        return {"plugin": self.plugin, "action": self.action, "group": self.group_id or "", "enabled": self.enabled,
                "reason": self.reason, "set_by": self.set_by, "updated_at_ms": self.updated_at_ms}


# --- typed software inventory and detected licences ------------------------------------------------

class InstalledSoftware(models.Model):
    agent = models.ForeignKey("fleet.Agent", on_delete=models.CASCADE, db_constraint=False, related_name="+")
    name = models.CharField(max_length=256)
    version = models.CharField(max_length=128, blank=True, default="")
    publisher = models.CharField(max_length=256, blank=True, default="")
    install_date = models.CharField(max_length=32, blank=True, default="", help_text="ISO date, or empty")
    source = models.CharField(max_length=16, help_text="dpkg, rpm, pacman, pip, npm")

    class Meta:
        indexes = [models.Index(fields=["name", "version"]), models.Index(fields=["agent", "name"])]
        ordering = ["agent_id", "name"]
        verbose_name_plural = "installed software"

    def __str__(self):
        return f"{self.name} {self.version} on {self.agent_id}"

    def to_dict(self):
        return {"agent_id": self.agent_id, "name": self.name, "version": self.version, "publisher": self.publisher,
                "install_date": self.install_date, "source": self.source}


class InventoryState(models.Model):
    """When the server last received an agent's list of one source, and its content hash (hash-skip)."""

    agent = models.ForeignKey("fleet.Agent", on_delete=models.CASCADE, db_constraint=False, related_name="+")
    source = models.CharField(max_length=32, help_text="software or license_scan")
    content_hash = models.CharField(max_length=64)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    rows = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "source"], name="inventory_state_unique")]


class DetectedLicense(models.Model):
    TYPES = ("perpetual", "subscription", "trial", "volume", "oem", "retail", "open_source", "freeware", "unknown")
    STATES = ("licensed", "subscription_active", "trial", "grace", "expired", "unlicensed", "unknown")
    DETECTORS = ("os_licensing_api", "entitlement_cert", "registry_probe", "license_file", "package_metadata",
                 "app_receipt", "heuristic")
    CONFIDENCES = ("authoritative", "probable", "heuristic")

    agent = models.ForeignKey("fleet.Agent", on_delete=models.CASCADE, db_constraint=False, related_name="+")
    product = models.CharField(max_length=256)
    vendor = models.CharField(max_length=256, blank=True, default="")
    version = models.CharField(max_length=128, blank=True, default="")
    license_type = models.CharField(max_length=16, choices=[(t, t) for t in TYPES], default="unknown")
    state = models.CharField(max_length=24, choices=[(s, s) for s in STATES], default="unknown")
    channel = models.CharField(max_length=64, blank=True, default="")
    expiry_at = models.BigIntegerField(default=0, help_text="UTC-midnight epoch seconds; 0 = none")
    detector = models.CharField(max_length=24, choices=[(d, d) for d in DETECTORS])
    confidence = models.CharField(max_length=16, choices=[(c, c) for c in CONFIDENCES])
    key_hint = models.CharField(max_length=32, blank=True, default="", help_text="redacted; never a full key")
    exe_hints = models.JSONField(default=list, blank=True)
    user_scope = models.CharField(max_length=16, blank=True, default="")
    user_ref = models.CharField(max_length=256, blank=True, default="")

    class Meta:
        ordering = ["agent_id", "product"]

    def __str__(self):
        return f"{self.product} ({self.state}) on {self.agent_id}"

    def to_dict(self, with_user=False):
        out = {"product": self.product, "vendor": self.vendor, "version": self.version,
               "license_type": self.license_type, "state": self.state, "expiry_at": self.expiry_at,
               "channel": self.channel, "key_hint": self.key_hint, "detector": self.detector,
               "confidence": self.confidence, "exe_hints": list(self.exe_hints or [])}
        if with_user:
            out["user_scope"], out["user_ref"] = self.user_scope, self.user_ref
        return out


# --- upload grants ---------------------------------------------------------------------------------

def sha256_hex(text):
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


class UploadGrant(models.Model):
    class State(models.TextChoices):
        MINTED = "minted"
        REDEEMED = "redeemed"
        REVOKED = "revoked"

    RETENTION = ("standard", "extended", "transient")
    TTL_DEFAULT_S = 900

    grant_id = models.CharField(primary_key=True, max_length=32)
    secret_sha256 = models.CharField(max_length=64, help_text="SHA-256 of the grant secret; the secret is not kept")
    agent_id = models.CharField(max_length=256, db_index=True)
    source_path = models.CharField(max_length=4096, blank=True, default="")
    declared_max_size = models.BigIntegerField()
    expected_sha256 = models.CharField(max_length=64, blank=True, default="")
    retention_class = models.CharField(max_length=16, choices=[(r, r) for r in RETENTION], default="standard")
    state = models.CharField(max_length=16, choices=State.choices, default=State.MINTED)
    minted_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"upload grant {self.grant_id} for {self.agent_id} ({self.state})"

    @property
    def destination_key(self):
        return f"{self.retention_class}/{self.grant_id}"

    def to_dict(self):
        return {"grant_id": self.grant_id, "agent_id": self.agent_id, "source_path": self.source_path,
                "declared_max_size": self.declared_max_size, "expected_sha256": self.expected_sha256,
                "retention_class": self.retention_class, "destination_key": self.destination_key,
                "state": self.state, "minted_by": self.minted_by, "created_at": self.created_at.isoformat(),
                "expires_at": self.expires_at.isoformat()}


class UploadSession(models.Model):
    class State(models.TextChoices):
        OPEN = "open"
        COMMITTED = "committed"
        CANCELLED = "cancelled"
        FAILED = "failed"

    CHUNK_MAX = 8 * 1024 * 1024

    upload_id = models.CharField(primary_key=True, max_length=32)
    grant = models.OneToOneField(UploadGrant, on_delete=models.CASCADE, related_name="session")
    session_sha256 = models.CharField(max_length=64)
    offset = models.BigIntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN)
    sha256 = models.CharField(max_length=64, blank=True, default="")
    actual_size = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    committed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"upload {self.upload_id} ({self.state})"

    def to_dict(self):
        return {"upload_id": self.upload_id, "grant_id": self.grant_id, "state": self.state, "offset": self.offset,
                "expires_at": self.expires_at.isoformat(), "sha256": self.sha256, "actual_size": self.actual_size,
                "destination_key": self.grant.destination_key}


# --- instruction schedules -------------------------------------------------------------------------

class InstructionSchedule(models.Model):
    class Frequency(models.TextChoices):
        ONCE = "once"
        INTERVAL = "interval"
        DAILY = "daily"
        WEEKLY = "weekly"
        MONTHLY = "monthly"

    class Approval(models.TextChoices):
        NOT_NEEDED = "not_needed"
        PENDING = "pending"
        APPROVED = "approved"
        REFUSED = "refused"

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200)
    definition_id = models.CharField(max_length=128)
    parameters = models.JSONField(default=dict, blank=True, help_text="a secret's value is [redacted] here")
    secrets_sealed = models.BinaryField(null=True, blank=True, editable=False,
                                        help_text="the secret parameters, envelope-encrypted (yuzu.secrets)")
    frequency_type = models.CharField(max_length=16, choices=Frequency.choices)
    interval_minutes = models.PositiveIntegerField(default=60)
    time_of_day = models.CharField(max_length=5, blank=True, default="", help_text="HH:MM")
    time_zone = models.CharField(max_length=64, default="UTC")
    day_of_week = models.PositiveSmallIntegerField(default=0, help_text="0 = Sunday")
    day_of_month = models.PositiveSmallIntegerField(default=1)
    start_at = models.DateTimeField(null=True, blank=True, help_text="a 'once' schedule's time")
    scope_expression = models.TextField(blank=True, default="")
    requires_approval = models.BooleanField(default=False)
    approval_id = models.CharField(max_length=32, blank=True, default="")
    approval_state = models.CharField(max_length=16, choices=Approval.choices, default=Approval.NOT_NEEDED)
    pinned_agents = models.JSONField(default=list, blank=True, help_text="the targets the approval was for")
    enabled = models.BooleanField(default=True)
    next_execution_at = models.DateTimeField(null=True, blank=True, db_index=True)
    last_executed_at = models.DateTimeField(null=True, blank=True)
    last_execution_id = models.CharField(max_length=64, blank=True, default="")
    last_error = models.CharField(max_length=1024, blank=True, default="")
    execution_count = models.PositiveIntegerField(default=0)
    created_by = models.CharField(max_length=150)
    creator_key = models.CharField(max_length=64, help_text="the creating principal (yuzu.rbac.Principal.key)")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"schedule {self.id} {self.name}"

    def next_after(self, moment):
        """The first run strictly after ``moment`` (UTC), or None when a 'once' schedule is done. Time of day,
        weekday and day of month are read in the schedule's time zone; an interval counts from the last fire."""
        f = self.Frequency
        if self.frequency_type == f.ONCE:
            return None
        if self.frequency_type == f.INTERVAL:
            return moment + timedelta(minutes=self.interval_minutes)
        tz = ZoneInfo(self.time_zone or "UTC")
        hh, mm = (int(x) for x in (self.time_of_day or "00:00").split(":"))
        local = moment.astimezone(tz)
        day = local.date()
        for _ in range(400):
            candidate = datetime(day.year, day.month, day.day, hh, mm, tzinfo=tz)
            if candidate > local and (
                    self.frequency_type == f.DAILY
                    or (self.frequency_type == f.WEEKLY and (candidate.weekday() + 1) % 7 == self.day_of_week)
                    or (self.frequency_type == f.MONTHLY and candidate.day == self.day_of_month)):
                return candidate.astimezone(UTC)
            day += timedelta(days=1)
        return None

    def seal_parameters(self, params):
        """Keep ``params`` for the runs (the row needs its pk): each value whose name marks a secret is
        [redacted] in ``parameters`` and sealed, bound to this row, in ``secrets_sealed`` — no secret lies in a
        column in clear (docs/governance.md, secrets at rest)."""
        hidden = {k: v for k, v in params.items() if SENSITIVE_KEY_RE.search(k)}
        self.parameters = redact(params)
        self.secrets_sealed = seal(json.dumps(hidden), SCHEDULE_SECRETS.where(self.pk)) if hidden else None

    def run_parameters(self):
        """The parameters a run sends, the sealed secrets opened (yuzu.secrets.SecretError when they cannot be)."""
        params = dict(self.parameters or {})
        if self.secrets_sealed:
            params.update(json.loads(unseal(bytes(self.secrets_sealed), SCHEDULE_SECRETS.where(self.pk))))
        return params

    def shown_parameters(self):
        """The parameters as every reader sees them (REST, the admin): a value whose name marks a secret is
        [redacted], as an execution's is."""
        return redact(self.parameters or {})

    def to_dict(self):
        return {"id": self.id, "name": self.name, "definition_id": self.definition_id,
                "frequency_type": self.frequency_type, "interval_minutes": self.interval_minutes,
                "time_of_day": self.time_of_day, "time_zone": self.time_zone, "day_of_week": self.day_of_week,
                "day_of_month": self.day_of_month, "scope_expression": self.scope_expression,
                "parameters": self.shown_parameters(), "requires_approval": self.requires_approval,
                "approval_id": self.approval_id, "approval_state": self.approval_state, "enabled": self.enabled,
                "next_execution_at": self.next_execution_at.isoformat() if self.next_execution_at else None,
                "last_executed_at": self.last_executed_at.isoformat() if self.last_executed_at else None,
                "last_execution_id": self.last_execution_id, "last_error": self.last_error,
                "execution_count": self.execution_count, "created_by": self.created_by,
                "created_at": self.created_at.isoformat()}


SCHEDULE_SECRETS = sealed_column("operations", InstructionSchedule, "secrets_sealed")
