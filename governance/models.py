"""Identity governance (spec/governance.md §1-2): engine principals — the durable, non-human identities
autonomous modules run as — and access-review campaigns.

An engine principal acts through yuzu's ordinary principal machinery: it is backed by a **shadow account**
(a Django user named ``engine:<slug>``, with no usable password and no staff flag) that owns its credentials
(readonly-tier API tokens) and holds its role assignments. Authentication (yuzu.auth), the principal cache and
its invalidation triggers, RBAC and the tier ceiling therefore treat it exactly like any token's owner, and
revoking the principal deactivates the account, which every process refuses on its very next call. A human
username can never contain ``:`` (Django's username validator), so the prefix alone marks an engine caller
(the structural denial belt, ``is_engine``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from yuzu.secrets import sealed_column

if TYPE_CHECKING:
    from django.contrib.auth.models import User

ENGINE_PREFIX = "engine:"
SLUG_RE = re.compile(r"^[a-z0-9._-]+$")
PRINCIPAL_ID_RE = re.compile(r"^engine:[a-z0-9._-]+$")


def is_engine_user(user: User | Any) -> bool:
    return str(getattr(user, "username", "")).startswith(ENGINE_PREFIX)


def epoch(dt: Any) -> int | None:
    return int(dt.timestamp()) if dt else None


class EnginePrincipal(models.Model):
    class Classification(models.TextChoices):
        INTERNAL = "internal"
        EXTERNAL = "external"

    class State(models.TextChoices):
        ACTIVE = "active"
        REVOKED = "revoked"  # terminal; rows are never deleted

    principal_id = models.CharField(primary_key=True, max_length=128)
    account = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="engine_principal",
                                   help_text="the shadow account that owns the credentials and holds the roles")
    display_name = models.CharField(max_length=256)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="owned_engine_principals",
                              help_text="the accountable human (deleting them is refused while they own one)")
    justification = models.TextField(max_length=2048)
    classification = models.CharField(max_length=16, choices=Classification.choices)
    lifecycle_state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    superseded_by = models.CharField(max_length=128, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150)

    class Meta:
        ordering = ["principal_id"]

    def __str__(self) -> str:
        return self.principal_id

    @property
    def slug(self) -> str:
        return self.principal_id.removeprefix(ENGINE_PREFIX)

    @property
    def is_active(self) -> bool:
        return self.lifecycle_state == self.State.ACTIVE

    def credentials(self) -> Any:
        from yuzu.models import ApiToken  # deferred: keeps the import graph one-way at model load

        return ApiToken.objects.filter(owner_id=self.account_id)

    def active_credentials(self) -> Any:
        return self.credentials().live()

    def to_dict(self) -> dict[str, Any]:
        return {"principal_id": self.principal_id, "display_name": self.display_name,
                "owner_username": self.owner.get_username(), "justification": self.justification,
                "classification": self.classification, "lifecycle_state": self.lifecycle_state,
                "superseded_by": self.superseded_by or None, "created_at": epoch(self.created_at),
                "revoked_at": epoch(self.revoked_at), "created_by": self.created_by}


class EngineRotation(models.Model):
    """One overlap rotation of an engine principal's credential. The initiator binding is durable; the
    successor's raw secret is kept sealed (yuzu.secrets) only for the 120 s same-caller retry window, then
    cleared."""

    principal = models.ForeignKey(EnginePrincipal, on_delete=models.PROTECT, related_name="rotations")
    predecessor_id = models.CharField(max_length=24)
    successor_id = models.CharField(max_length=24, unique=True)
    initiated_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)
    overlap_expires_at = models.DateTimeField()
    reveal_until = models.DateTimeField()
    secret_sealed = models.BinaryField(null=True, blank=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    confirmed_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        ordering = ["-created_at"]


ROTATION_SECRET = sealed_column("governance", EngineRotation, "secret_sealed")


class AccessReviewCampaign(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        CLOSED = "closed"

    campaign_id = models.UUIDField(primary_key=True)
    title = models.CharField(max_length=256)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OPEN)
    created_by = models.CharField(max_length=150)
    created_at_ms = models.BigIntegerField()
    closed_by = models.CharField(max_length=150, blank=True, default="")
    closed_at_ms = models.BigIntegerField(null=True, blank=True)
    grant_count = models.PositiveIntegerField(default=0)
    revocations_applied = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at_ms"]
        verbose_name = "access review"

    def __str__(self) -> str:
        return f"{self.title} ({self.status})"

    def to_dict(self) -> dict[str, Any]:
        return {"campaign_id": str(self.campaign_id), "title": self.title, "status": self.status,
                "created_by": self.created_by, "created_at_ms": self.created_at_ms,
                "closed_by": self.closed_by or None, "closed_at_ms": self.closed_at_ms,
                "grant_count": self.grant_count, "revocations_applied": self.revocations_applied}


class AccessReviewAttestation(models.Model):
    class PrincipalType(models.TextChoices):
        USER = "user"
        GROUP = "group"
        ENGINE = "engine"

    class Decision(models.TextChoices):
        PENDING = "pending"
        ATTESTED = "attested"
        FLAGGED_REVOKE = "flagged_revoke"

    campaign = models.ForeignKey(AccessReviewCampaign, on_delete=models.PROTECT, related_name="attestations")
    principal_type = models.CharField(max_length=8, choices=PrincipalType.choices)
    principal_id = models.CharField(max_length=150)
    role_name = models.CharField(max_length=200, help_text="the role; 'Role@<group name>' for a grant held on a "
                                                           "management group")
    assignment_id = models.BigIntegerField(null=True, blank=True, help_text="the frozen RoleAssignment")
    decision = models.CharField(max_length=16, choices=Decision.choices, default=Decision.PENDING)
    reviewer = models.CharField(max_length=150, blank=True, default="")
    justification = models.TextField(max_length=2048, blank=True, default="")
    decided_at_ms = models.BigIntegerField(null=True, blank=True)
    display_name = models.CharField(max_length=256, blank=True, default="")
    classification = models.CharField(max_length=16, blank=True, default="")
    lifecycle_state = models.CharField(max_length=16, blank=True, default="")
    revoked_on_close = models.BooleanField(default=False)

    class Meta:
        ordering = ["principal_type", "principal_id", "role_name"]
        constraints = [models.UniqueConstraint(fields=["campaign", "principal_type", "principal_id", "role_name"],
                                               name="uniq_attestation_grant")]

    def to_dict(self) -> dict[str, Any]:
        return {"principal_type": self.principal_type, "principal_id": self.principal_id,
                "role_name": self.role_name, "decision": self.decision, "reviewer": self.reviewer or None,
                "justification": self.justification or None, "decided_at_ms": self.decided_at_ms,
                "display_name": self.display_name, "classification": self.classification or None,
                "lifecycle_state": self.lifecycle_state, "revoked_on_close": self.revoked_on_close}
