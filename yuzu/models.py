"""Cross-cutting models: RBAC (roles, permissions, assignments), API tokens, the audit log and the admins'
authenticators (TOTP devices)."""

import hashlib
import secrets
import time
from base64 import b32encode
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import quote, urlencode

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, models, transaction
from django.utils import timezone
from django_otp.models import Device, ThrottlingMixin, TimestampMixin
from django_otp.oath import TOTP

from .text import check_label

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from .secrets import Where

# The fixed securable catalogue and operations (spec/yuzu-mcp.md §1.1).
SECURABLES = (
    "Infrastructure", "UserManagement", "InstructionDefinition", "InstructionSet", "Execution", "Schedule",
    "Approval", "Tag", "AuditLog", "Response", "ManagementGroup", "ApiToken", "Security", "Policy",
    "DeviceToken", "SoftwareDeployment", "License", "FileRetrieval", "GuaranteedState", "Inventory",
    "AccessReview", "SoftwareLicensing", "EnginePrincipal", "PluginConfig", "PluginSecret", "UploadGrant",
    "Bridge",
)
OPERATIONS = ("Read", "Write", "Execute", "Delete", "Approve", "Push", "Attest", "Rotate")
MCP_TIERS = ("readonly", "operator", "supervised")
MCP_TOKEN_MAX_DAYS = 90
TOKEN_PREFIX = "yuzu_"


def new_hex_id(nbytes: int = 12) -> str:
    return secrets.token_hex(nbytes)


def hash_secret(raw: str) -> str:
    """Tokens are stored only as their SHA-256: they are 256-bit random, so no slow hash is needed."""
    return hashlib.sha256(raw.encode()).hexdigest()


class Role(models.Model):
    #: Roles held only globally. Administrator is "everything, on every device": held on a group it would confer only
    #: that group's device-scoped part (yuzu.rbac.GROUP_SCOPED) while every list of assignments reads "Administrator".
    GLOBAL_ONLY = frozenset({"Administrator"})

    name = models.CharField(max_length=64, unique=True)
    description = models.CharField(max_length=256, blank=True)
    builtin = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class RolePermission(models.Model):
    role = models.ForeignKey(Role, on_delete=models.CASCADE, related_name="permissions")
    securable = models.CharField(max_length=64, choices=[(s, s) for s in SECURABLES])
    operation = models.CharField(max_length=16, choices=[(o, o) for o in OPERATIONS])

    class Meta:
        unique_together = [("role", "securable", "operation")]
        ordering = ["securable", "operation"]

    def __str__(self) -> str:
        return f"{self.role}: {self.securable}:{self.operation}"


class RoleAssignment(models.Model):
    """A user holds a role globally (group is null) or on one management group."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="role_assignments")
    role = models.ForeignKey(Role, on_delete=models.CASCADE, related_name="assignments")
    group = models.ForeignKey(
        "fleet.ManagementGroup", null=True, blank=True, on_delete=models.CASCADE, related_name="role_assignments"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "role", "group"], name="uniq_role_assignment"),
            models.UniqueConstraint(
                fields=["user", "role"], condition=models.Q(group__isnull=True), name="uniq_global_role_assignment"
            ),
        ]

    def __str__(self) -> str:
        where = f"on {self.group}" if self.group_id else "globally"
        return f"{self.user} is {self.role} {where}"

    def clean(self) -> None:
        """The rules every grant keeps, whoever makes it: the admin's page (its form runs this) and the group-role
        service (fleet.services.plan_assign_group_role) alike."""
        if self.group_id is not None and self.role_id is not None and self.role.name in Role.GLOBAL_ONLY:
            raise ValidationError({"group": f"the {self.role.name} role is granted globally, not on a group"})


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def live(self, now: datetime | None = None) -> "ApiTokenQuerySet":
        now = now or timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        ).filter(models.Q(retire_at__isnull=True) | models.Q(retire_at__gt=now))


class ApiToken(models.Model):
    AUDIENCE_API = "api"
    AUDIENCE_BRIDGE = "bridge"
    NAME_LENGTH = 256

    id = models.CharField(primary_key=True, max_length=24, default=new_hex_id, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=NAME_LENGTH)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=16, editable=False, help_text="First characters, for recognising a token")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    mcp_tier = models.CharField(max_length=16, blank=True, default="", choices=[("", "(not an MCP token)")] + [(t, t) for t in MCP_TIERS])
    scope_service = models.CharField(max_length=256, blank=True, default="")
    audience = models.CharField(
        max_length=16, default=AUDIENCE_API, choices=[(AUDIENCE_API, "API and MCP"), (AUDIENCE_BRIDGE, "bridge worker only")]
    )
    rotated_from = models.OneToOneField("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="successor")
    retire_at = models.DateTimeField(null=True, blank=True, help_text="End of a rotation overlap")

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name, verbose_name_plural = "API token", "API tokens"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def clean(self) -> None:
        validate_token_fields(self.mcp_tier, self.expires_at, self.created_at or timezone.now())

    @classmethod
    def mint(cls, owner: "User", name: str, *, mcp_tier: str = "", expires_at: datetime | None = None,
             scope_service: str = "", audience: str = AUDIENCE_API,
             now: datetime | None = None) -> tuple["ApiToken", str]:
        """Create a token; returns (token, raw). The raw value is shown once and never stored. Every way a token
        is made (REST, MCP, OAuth, the bridge, governance, the admin command) passes its name through here:
        approvers and token lists show it, so it may not hide or reorder text (yuzu.text.check_label)."""
        now = now or timezone.now()
        check_label("name", name, cls.NAME_LENGTH)
        validate_token_fields(mcp_tier, expires_at, now)
        raw = TOKEN_PREFIX + secrets.token_hex(32)
        token = cls.objects.create(
            owner=owner, name=name, token_hash=hash_secret(raw), prefix=raw[:12], created_at=now,
            expires_at=expires_at, mcp_tier=mcp_tier, scope_service=scope_service, audience=audience,
        )
        return token, raw

    def is_live(self, now: datetime | None = None) -> bool:
        now = now or timezone.now()
        if self.revoked_at is not None:
            return False
        if self.expires_at is not None and self.expires_at <= now:
            return False
        if self.retire_at is not None and self.retire_at <= now:
            return False
        return True

    def renewable(self, now: datetime | None = None) -> bool:
        """An OAuth connection's access token whose connection may still refresh it (oauth.models.Authorization:
        not revoked, its consent not over): lapsed or not, the same principal again after its client's next refresh,
        which replaces the secret in this row. False for every other token."""
        if self.revoked_at is not None:
            return False
        connection = getattr(self, "oauth_authorization", None)  # the oauth app's reverse relation, when installed
        return connection is not None and connection.problem(now) is None


def validate_token_fields(mcp_tier: str, expires_at: datetime | None, now: datetime) -> None:
    if mcp_tier and mcp_tier not in MCP_TIERS:
        raise ValidationError({"mcp_tier": f"mcp_tier must be one of {', '.join(MCP_TIERS)}"})
    if expires_at is not None and expires_at <= now:
        raise ValidationError({"expires_at": "expires_at must be in the future"})
    if mcp_tier:
        if expires_at is None:
            raise ValidationError({"expires_at": "an MCP token must have an expiry"})
        if expires_at > now + timedelta(days=MCP_TOKEN_MAX_DAYS, minutes=1):
            raise ValidationError({"expires_at": f"an MCP token must expire within {MCP_TOKEN_MAX_DAYS} days"})


class AuditEvent(models.Model):
    """Append-only: rows are inserted, never updated or deleted through the ORM."""

    RESULTS = ("success", "failure", "denied", "pending", "approved")

    timestamp = models.DateTimeField(default=timezone.now, db_index=True)
    principal = models.CharField(max_length=150, db_index=True)
    action = models.CharField(max_length=128, db_index=True)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=256, blank=True)
    detail = models.TextField(blank=True)
    result = models.CharField(max_length=16, choices=[(r, r) for r in RESULTS])
    correlation_id = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["target_type", "target_id"])]

    def __str__(self) -> str:
        return f"{self.timestamp:%Y-%m-%d %H:%M:%S} {self.principal} {self.action} {self.result}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and not self._state.adding:
            raise ValidationError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ValidationError("audit events are append-only")


class AccountLockout(models.Model):
    """A lock refuses new sign-ins until ``locked_until``. One that failed sign-ins set (anyone may type a wrong
    password for a known name) leaves the account's live sessions alone; one an administrator set (``manual``) ends
    them too."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="lockout")
    failed_attempts = models.PositiveIntegerField(default=0)
    locked_until = models.DateTimeField(null=True, blank=True)
    manual = models.BooleanField("locked by an administrator", default=False, help_text=(
        "A lock set by an administrator also ends the account's live sessions; one from failed sign-ins only refuses "
        "new sign-ins."))

    def is_locked(self, now: datetime | None = None) -> bool:
        return self.locked_until is not None and self.locked_until > (now or timezone.now())

    def ends_sessions(self, now: datetime | None = None) -> bool:
        return self.manual and self.is_locked(now)

    @staticmethod
    def holds_out(user: "User", now: datetime | None = None) -> bool:
        """Whether an administrator's lock keeps ``user`` out now: then nothing authenticates as them — no admin
        session, API token or OAuth access token, no refresh — until it is lifted or runs out (it revokes
        nothing). Reads ``user.lockout`` (one query unless selected with the user). Moves the auth version
        (migration 0007) whenever it starts or ends by a write, so a cached principal is dropped at once."""
        lock = getattr(user, "lockout", None)
        return lock is not None and lock.ends_sessions(now)


class KekVersion(models.Model):
    """A key-encryption-key version of the secrets at rest (yuzu.secrets): only its check value lives here,
    never the key."""

    version = models.PositiveIntegerField(primary_key=True)
    kcv = models.CharField(max_length=64, help_text="SHA-256 of the key, hex")
    kcv_alg = models.CharField(max_length=16, default="sha256")
    created_at = models.DateTimeField(default=timezone.now)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["version"]

    def __str__(self) -> str:
        return f"secrets-kek-v{self.version}"


class AuthVersion(models.Model):
    """One row whose counter moves whenever something a cached principal depends on changes: a token's state
    (revoked, expired, retired, re-hashed, re-tiered, deleted), a user's (deactivated, renamed, promoted, locked
    or unlocked by an administrator), or a role's grants or assignments. Database triggers move it (migrations 0003,
    0007), so every write path counts —
    ``save()``, ``QuerySet.update()``, bulk operations, the admin, raw SQL — and it commits with the change.
    yuzu.auth reads it once per call to know whether its per-process principal cache is still good."""

    n = models.BigIntegerField(default=0)

    #: the counter, read without the ORM (also inside yuzu.audit's checked INSERT and yuzu.provisional)
    READ_SQL = "SELECT n FROM yuzu_authversion WHERE id = 1"

    @classmethod
    def current(cls) -> int:
        """The counter, in one round trip without the ORM's query building (this runs on every call)."""
        with connection.cursor() as cursor:
            cursor.execute(cls.READ_SQL)
            row = cursor.fetchone()
            if row is None:  # the migration creates the row; a flush (transactional tests) empties the table
                cursor.execute("INSERT INTO yuzu_authversion (id, n) VALUES (1, 0) ON CONFLICT DO NOTHING")
                cursor.execute(cls.READ_SQL)
                row = cursor.fetchone()
        return int(row[0]) if row else -1


class TOTPDevice(TimestampMixin, ThrottlingMixin, Device):  # type: ignore[misc]  # django-otp has no type information
    """An admin's authenticator: django-otp's TOTP device with its seed **sealed** (yuzu.secrets) instead of a hex
    column. The seed proves *that* approver (sign-in, step-up, approvals), so a database dump, backup or replica
    must not yield it: ``key_sealed`` opens only in this row, with the KEK, which lives outside the database.
    The seed is in memory only while a code is verified, or while it is shown once at enrolment.

    Verification is django-otp's ``TOTPDevice.verify_token``: ``tolerance`` steps either side, the drift it learns
    (``OTP_TOTP_SYNC``), a code accepted once is refused after (``last_t``), exponential back-off after wrong codes
    (``OTP_TOTP_THROTTLE_FACTOR``). ``TOTPDevice.objects.create(user=…, name=…)`` draws a new seed; so does
    ``reset()``."""

    SEED_BYTES = 20
    #: what a verification reads and changes: re-read under the row lock before each one
    STATE = ("last_t", "drift", "throttling_failure_timestamp", "throttling_failure_count")

    key_sealed: models.BinaryField[bytes | memoryview, bytes | memoryview] = models.BinaryField(
        editable=False, help_text="the TOTP seed, sealed with yuzu.secrets (bound to this row): a dump never shows it")
    # django-otp's TOTPDevice fields, as they are there
    step: models.PositiveSmallIntegerField[int, int] = models.PositiveSmallIntegerField(
        default=30, help_text="The time step in seconds.")
    t0: models.BigIntegerField[int, int] = models.BigIntegerField(
        default=0, help_text="The Unix time at which to begin counting steps.")
    digits: models.PositiveSmallIntegerField[int, int] = models.PositiveSmallIntegerField(
        choices=[(6, 6), (8, 8)], default=6, help_text="The number of digits to expect in a token.")
    tolerance: models.PositiveSmallIntegerField[int, int] = models.PositiveSmallIntegerField(
        default=1, help_text="The number of time steps in the past or future to allow.")
    drift: models.SmallIntegerField[int, int] = models.SmallIntegerField(
        default=0, help_text="The number of time steps the prover is known to deviate from our clock.")
    last_t: models.BigIntegerField[int, int] = models.BigIntegerField(default=-1, help_text=(
        "The t value of the latest verified token. The next token must be at a higher time step."))

    class Meta(Device.Meta):  # type: ignore[misc]  # as above
        verbose_name = "TOTP device"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._new_seed: bytes | None = None  # drawn, not yet sealed into the row

    def reset(self) -> None:
        """A new seed, unconfirmed until its user sets it up again (saved by ``save()``)."""
        self._new_seed = secrets.token_bytes(self.SEED_BYTES)
        self.confirmed, self.drift, self.last_t = False, 0, -1
        self.throttle_reset(commit=False)

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Seals a new seed (a new device draws one): the blob is bound to the row's pk, so a new row is inserted
        first and sealed in the same transaction."""
        if self._new_seed is None and not self.key_sealed:
            self._new_seed = secrets.token_bytes(self.SEED_BYTES)
        seed, self._new_seed = self._new_seed, None
        if seed is None:
            super().save(*args, **kwargs)
            return
        from .secrets import seal  # cycle: yuzu.secrets reads KekVersion from this module

        with transaction.atomic(using=kwargs.get("using")):
            if self.pk is None:
                self.key_sealed = b""
                super().save(*args, **kwargs)
                self.key_sealed = seal(seed, self.sealed_where())
                type(self)._default_manager.filter(pk=self.pk).update(key_sealed=self.key_sealed)
            else:
                self.key_sealed = seal(seed, self.sealed_where())
                if kwargs.get("update_fields") is not None:
                    kwargs["update_fields"] = {*kwargs["update_fields"], "key_sealed"}
                super().save(*args, **kwargs)

    @property
    def bin_key(self) -> bytes:
        """The seed, unsealed for the caller's use (never kept on the instance); SecretError when the blob does not
        open in this row (copied from another, tampered with, or its KEK is gone)."""
        if self._new_seed is not None:
            return self._new_seed
        from .secrets import unseal  # cycle: yuzu.secrets reads KekVersion from this module

        return unseal(bytes(self.key_sealed), self.sealed_where())

    def sealed_where(self) -> "Where":
        """Where this row's seed blob lives, the only place it opens."""
        from .secrets import AUTHENTICATOR_SEED  # cycle: yuzu.secrets reads KekVersion from this module

        return AUTHENTICATOR_SEED.where(int(self.pk))

    def verify_token(self, token: Any) -> bool:
        """django-otp's TOTP verification (django_otp.plugins.otp_totp), on the unsealed seed, under the row's lock:
        one code sent from several places at once is accepted once (each verification reads the ``last_t`` and
        throttling state the one before it left). A seed that does not open verifies nothing (audited
        ``secret.decrypt_failure`` by yuzu.secrets) and is no wrong code."""
        from .secrets import SecretError  # cycle: yuzu.secrets reads KekVersion from this module

        with transaction.atomic():
            if self.pk is not None:
                locked = type(self)._default_manager.select_for_update().filter(pk=self.pk).values(*self.STATE).first()
                for name, value in (locked or {}).items():
                    setattr(self, name, value)
            if not self.verify_is_allowed()[0]:
                return False
            try:
                code = int(token)
                key = self.bin_key
            except (TypeError, ValueError):
                verified = False
            except SecretError:
                return False
            else:
                totp = TOTP(key, self.step, self.t0, self.digits, self.drift)
                totp.time = time.time()
                verified = totp.verify(code, self.tolerance, self.last_t + 1)
                if verified:
                    self.last_t = totp.t()
                    if getattr(settings, "OTP_TOTP_SYNC", True):
                        self.drift = totp.drift
                    self.throttle_reset(commit=False)
                    self.set_last_used_timestamp(commit=False)
                    self.save()
            if not verified:
                self.throttle_increment(commit=True)
            return bool(verified)

    def was_used(self, token: str) -> bool:
        """True when ``token`` is a code this device already accepted (its time step is at or before the last
        accepted one): then "wrong code" would mislead — the person typed the right code a second time."""
        from .secrets import SecretError  # cycle: yuzu.secrets reads KekVersion from this module

        if self.last_t < 0:
            return False
        try:
            code = int(token)
            totp = TOTP(self.bin_key, self.step, self.t0, self.digits, self.drift)
        except (TypeError, ValueError, SecretError):
            return False
        totp.time = time.time()
        for offset in range(-self.tolerance, self.tolerance + 1):
            totp.drift = self.drift + offset
            if totp.t() <= self.last_t and totp.token() == code:
                return True
        return False

    def get_throttle_factor(self) -> int:
        return int(getattr(settings, "OTP_TOTP_THROTTLE_FACTOR", 1))

    @property
    def config_url(self) -> str:
        """The otpauth:// URI an authenticator app scans (it holds the seed: shown once, at enrolment)."""
        label = str(self.user.get_username())
        params = urlencode({"secret": b32encode(self.bin_key), "algorithm": "SHA1", "digits": self.digits,
                            "period": self.step})
        issuer = str(getattr(settings, "OTP_TOTP_ISSUER", "") or "").replace(":", "")
        if issuer:
            label = f"{issuer}:{label}"
            params += f"&issuer={quote(issuer)}"
        return f"otpauth://totp/{quote(label)}?{params}"
