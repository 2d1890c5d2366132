"""Approval tickets (spec/yuzu-mcp.md §3): one gated call, minted with what it will do, decided by a human,
redeemed once by its submitter for exactly those arguments and the targets pinned at mint time."""

import json
import secrets
from datetime import timedelta

from django.db import models
from django.utils import timezone

from yuzu.text import hidden_fields

APPROVAL_LIFETIME = timedelta(days=7)


def approval_id():
    return secrets.token_hex(16)


class ApprovalQuerySet(models.QuerySet):
    def pending(self, now=None):
        """Waiting for a reviewer: pending and still within the 7-day lifetime (an expired ticket leaves the
        queue on its own; the lazy sweep flips its status later)."""
        cutoff = (now or timezone.now()) - APPROVAL_LIFETIME
        return self.filter(status=Approval.PENDING, submitted_at__gt=cutoff)

    def expire_stale(self, now=None):
        """Lazy 7-day expiry of pending and approved-but-unconsumed tickets — not of a schedule's approved ticket,
        a standing approval its every run goes by (it is never consumed; operations.schedules)."""
        cutoff = (now or timezone.now()) - APPROVAL_LIFETIME
        lapsing = models.Q(status=Approval.PENDING) | (models.Q(status=Approval.APPROVED)
                                                       & ~models.Q(origin=Approval.ORIGIN_SCHEDULE))
        return self.filter(lapsing, consumed_at__isnull=True, submitted_at__lte=cutoff).update(status=Approval.EXPIRED)


class Approval(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"
        WITHDRAWN = "withdrawn"

    PENDING, APPROVED, REJECTED, EXPIRED, WITHDRAWN = Status.values
    STATUSES = tuple(Status.values)
    ORIGIN_MCP, ORIGIN_REST, ORIGIN_SCHEDULE = "mcp", "rest", "schedule"

    id = models.CharField(primary_key=True, max_length=32, default=approval_id, editable=False)
    definition_id = models.CharField(max_length=160, db_index=True)
    status = models.CharField(max_length=16, default=PENDING, choices=Status.choices, db_index=True)
    submitted_by = models.CharField(max_length=150, db_index=True)
    submitted_at = models.DateTimeField(default=timezone.now)
    reviewed_by = models.CharField(max_length=150, blank=True)
    reviewed_at = models.DateTimeField(null=True, blank=True)
    review_comment = models.CharField(max_length=1024, blank=True)
    scope_expression = models.TextField(help_text="Canonical JSON of the tool arguments")
    origin = models.CharField(
        max_length=16, default=ORIGIN_MCP,
        choices=[(ORIGIN_MCP, "mcp"), (ORIGIN_REST, "rest"), (ORIGIN_SCHEDULE, "schedule")],
    )
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by = models.CharField(max_length=150, blank=True)
    # What the approver decides on, worked out before the ticket existed (mcp.registry.Plan).
    summary = models.CharField(max_length=1024, blank=True, help_text="What the call will do, in words")
    risk = models.CharField(max_length=16, blank=True, help_text="read, write or destructive")
    pins = models.JSONField(default=dict, blank=True,
                            help_text="What the call resolved at mint time (e.g. agents); a recall acts on these only")
    facts = models.JSONField(default=dict, blank=True, help_text="Further facts for the approver")
    requester = models.JSONField(default=dict, blank=True,
                                 help_text="The submitting token (id, name, tier) and MCP client (name, version)")

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        ordering = ["-submitted_at"]

    def __str__(self):
        return f"{self.id} {self.definition_id} {self.status}"

    @property
    def tool(self):
        return self.definition_id.removeprefix("mcp.")

    @property
    def expires_at(self):
        return self.submitted_at + APPROVAL_LIFETIME

    def is_past_lifetime(self, now=None):
        return (now or timezone.now()) >= self.expires_at

    @property
    def current_status(self):
        """The status as of now: a pending or approved, unused ticket past its lifetime is expired, whether or not
        the lazy sweep (``expire_stale``) has written so yet — what every view of a ticket shows."""
        if self.lapses and self.is_past_lifetime():
            return self.EXPIRED
        return self.status

    @property
    def lapses(self):
        """Whether the 7-day lifetime still applies: pending, or approved and unused — but a schedule's approval
        stands (``expire_stale``)."""
        if self.consumed_at is not None:
            return False
        return self.status == self.PENDING or (self.status == self.APPROVED and self.origin != self.ORIGIN_SCHEDULE)

    @property
    def pinned_agents(self):
        """The agent ids this ticket is pinned to, or None when the call targets no agents."""
        agents = (self.pins or {}).get("agents")
        return list(agents) if isinstance(agents, list) else None

    #: the fields of to_dict a submitter or an agent controls (scope_expression checked parsed: \u001b counts)
    SUBMITTED_TEXT = ("summary", "submitted_by", "review_comment", "scope_expression", "requester")

    def to_dict(self):
        """The ticket as REST and MCP answer it: text exactly as submitted (a client compares the arguments with what
        it sent, and renders for its own medium), and ``hidden_characters`` naming the fields that hold control,
        bidi or invisible characters (yuzu.text) — the review page shows those by name."""
        out = {"id": self.id, "definition_id": self.definition_id, "tool": self.tool, "status": self.current_status,
               "summary": self.summary or None, "risk": self.risk or None, "submitted_by": self.submitted_by,
               "submitted_at": self.submitted_at.isoformat(), "reviewed_by": self.reviewed_by or None,
               "reviewed_at": self.reviewed_at.isoformat() if self.reviewed_at else None,
               "review_comment": self.review_comment or None, "scope_expression": self.scope_expression,
               "origin": self.origin, "consumed": self.consumed_at is not None,
               "expires_at": self.expires_at.isoformat(),
               "target_count": len(self.pinned_agents) if self.pinned_agents is not None else None,
               "requester": self.requester or {}}
        out["hidden_characters"] = hidden_fields({**out, "scope_expression": self.arguments()}, self.SUBMITTED_TEXT)
        return out

    def arguments(self):
        """The tool arguments parsed from ``scope_expression`` (the raw text when it is not JSON)."""
        try:
            return json.loads(self.scope_expression)
        except (TypeError, ValueError):
            return self.scope_expression
