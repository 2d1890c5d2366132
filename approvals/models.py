import secrets
from datetime import timedelta

from django.db import models
from django.utils import timezone

APPROVAL_LIFETIME = timedelta(days=7)


def approval_id():
    return secrets.token_hex(16)


class Approval(models.Model):
    PENDING, APPROVED, REJECTED, EXPIRED = "pending", "approved", "rejected", "expired"
    STATUSES = (PENDING, APPROVED, REJECTED, EXPIRED)
    ORIGIN_MCP, ORIGIN_REST, ORIGIN_SCHEDULE = "mcp", "rest", "schedule"

    id = models.CharField(primary_key=True, max_length=32, default=approval_id, editable=False)
    definition_id = models.CharField(max_length=160, db_index=True)
    status = models.CharField(max_length=16, default=PENDING, choices=[(s, s) for s in STATUSES], db_index=True)
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
