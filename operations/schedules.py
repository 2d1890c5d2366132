"""Instruction schedules (spec/operator.md §3): a definition run on an interval, or at a time of day (daily,
weekly, monthly) in a time zone, or once. ``tick`` (Celery beat every 30 s; in embedded mode the server's
own loop) claims due schedules with ``select_for_update(skip_locked)`` and runs each through the normal
execution path (fleet.executions.launch) as ``schedule:<id>``, with the creator's rights as they stand
now. Runs missed while the server was down coalesce into one. A schedule created by a supervised MCP token
(or asked to) needs one approval, pinned to the targets it resolved at creation, before it ever fires."""

import logging
import re
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import DatabaseError, transaction
from django.utils import timezone

from approvals.models import Approval
from fleet.executions import Order, eligible_agents, launch
from fleet.models import InstructionDefinition
from fleet.scope import ScopeError, parse, to_q
from yuzu import rbac
from yuzu.audit import audit
from yuzu.errors import STORE_FAULT_RETRY_MS, YuzuError
from yuzu.jsondata import instant
from yuzu.plans import redact
from yuzu.rbac import Principal
from yuzu.secrets import SecretError

from .metrics import SCHEDULE_FIRES
from .models import InstructionSchedule

log = logging.getLogger("yuzu.operations")
TIME_RE = re.compile(r"([01]\d|2[0-3]):[0-5]\d")
BATCH = 50


def invalid(message, remediation=None):
    return YuzuError(message, status=400, rpc_code=-32602, remediation=remediation)


@dataclass
class SchedulePrincipal(Principal):
    """The creator's rights, under the schedule's name (executions say ``dispatched_by: schedule:<id>``)."""

    schedule_id: int = 0

    @property
    def name(self) -> str:
        return f"schedule:{self.schedule_id}"


# --- validation and CRUD -------------------------------------------------------------------------------

FIELDS = ("name", "definition_id", "frequency_type", "interval_minutes", "time_of_day", "time_zone", "day_of_week",
          "day_of_month", "start_at", "scope_expression", "parameters", "requires_approval", "enabled")


def validate(d):
    """The one validation of a schedule body (after its JSON Schema): meaning, not shape."""
    name = d.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise invalid("name must be 1-200 characters")
    definition = InstructionDefinition.objects.filter(pk=d.get("definition_id")).first()
    if definition is None:
        raise invalid(f"unknown definition: {d.get('definition_id')}", "list_definitions shows them")
    if not definition.enabled:
        raise invalid(f"definition {definition.id} is disabled")
    freq = d.get("frequency_type")
    if freq not in InstructionSchedule.Frequency.values:
        raise invalid(f"frequency_type must be one of {', '.join(InstructionSchedule.Frequency.values)}")
    minutes = d.get("interval_minutes", 60)
    if not isinstance(minutes, int) or isinstance(minutes, bool) or not 1 <= minutes <= 525600:
        raise invalid("interval_minutes must be 1-525600")
    tod = d.get("time_of_day", "")
    if freq in ("daily", "weekly", "monthly") and not TIME_RE.fullmatch(tod or ""):
        raise invalid("time_of_day must be HH:MM for a daily, weekly or monthly schedule")
    try:
        ZoneInfo(d.get("time_zone") or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise invalid(f"unknown time_zone: {d.get('time_zone')}") from None
    dow, dom = d.get("day_of_week", 0), d.get("day_of_month", 1)
    if not isinstance(dow, int) or not 0 <= dow <= 6:
        raise invalid("day_of_week must be 0-6 (0 = Sunday)")
    if not isinstance(dom, int) or not 1 <= dom <= 28:
        raise invalid("day_of_month must be 1-28")
    start_at = None
    if d.get("start_at") is not None:
        start_at = instant(d["start_at"])
        if start_at is None:
            raise invalid("start_at must be an ISO 8601 time with a zone, within years 1-9999 in UTC")
        if start_at <= timezone.now():
            raise invalid("start_at is in the past", "give a future time")
    if freq == "once" and start_at is None:
        raise invalid("a 'once' schedule needs start_at (a future time)")
    scope = d.get("scope_expression") or ""
    try:
        tree = parse(scope) if scope.strip() else None
    except ScopeError as exc:
        raise invalid(f"invalid scope expression: {exc}") from None
    params = d.get("parameters") or {}
    if not isinstance(params, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
        raise invalid("parameters must be an object of strings")
    return definition, tree, start_at


def _targets(principal, tree, pinned=None):
    qs = eligible_agents(principal)
    if tree is not None:
        qs = qs.filter(to_q(tree))
    if pinned is not None:
        qs = qs.filter(pk__in=pinned)
    return sorted(qs.values_list("agent_id", flat=True))


def check_may_create(principal):
    """Who may create a schedule: Schedule:Write, and Execution:Execute somewhere (its runs execute). RBAC only: a
    supervised token may create a schedule; its runs then wait for one approval (create_schedule)."""
    rbac.check(principal, "Schedule", "Write", any_scope=True)
    if not rbac.has_any(principal, "Execution", "Execute"):
        raise rbac.denial(principal, "Execution", "Execute")


def create_schedule(principal, d, *, cid=""):
    check_may_create(principal)
    definition, tree, start_at = validate(d)
    needs_approval = bool(d.get("requires_approval")) or principal.tier == "supervised"
    row = InstructionSchedule(
        name=d["name"].strip(), definition_id=definition.id, parameters=redact(d.get("parameters") or {}),
        frequency_type=d["frequency_type"], interval_minutes=d.get("interval_minutes", 60),
        time_of_day=d.get("time_of_day", ""), time_zone=d.get("time_zone") or "UTC",
        day_of_week=d.get("day_of_week", 0), day_of_month=d.get("day_of_month", 1), start_at=start_at,
        scope_expression=d.get("scope_expression") or "", requires_approval=needs_approval,
        enabled=d.get("enabled", True), created_by=principal.name, creator_key=principal.key)
    now = timezone.now()
    row.next_execution_at = start_at or (now if row.frequency_type == "interval" else row.next_after(now))
    with transaction.atomic():
        row.save()
        row.seal_parameters(d.get("parameters") or {})  # with its pk: the sealing is bound to the row
        row.save(update_fields=["parameters", "secrets_sealed"])
        if needs_approval:
            targets = _targets(principal, tree)
            ticket = Approval.objects.create(
                definition_id=f"schedule.{definition.id}"[:160], submitted_by=principal.name,
                scope_expression=f'{{"schedule_id":{row.id}}}', origin=Approval.ORIGIN_SCHEDULE,
                summary=f"Schedule '{row.name}': run {definition.plugin}.{definition.action} "
                        f"({row.frequency_type}) on {len(targets)} agent(s)"[:1024],
                risk=definition.type == "action" and "write" or "read", pins={"agents": targets},
                facts={"schedule_id": row.id, "frequency_type": row.frequency_type,
                       "scope": row.scope_expression}, requester={"tier": principal.tier or None})
            row.approval_id, row.approval_state, row.pinned_agents = ticket.id, "pending", targets
            row.save(update_fields=["approval_id", "approval_state", "pinned_agents"])
        audit(principal, "schedule.create", "success", target_type="InstructionSchedule", target_id=row.id,
              detail=f"definition={definition.id} frequency={row.frequency_type} approval={row.approval_id or '-'}",
              correlation_id=cid)
    return row.to_dict()


def list_schedules(principal, enabled_only=False, full=False):
    if principal.scope_service:
        raise rbac.denial(principal, "Schedule", "Read")
    if not rbac.has_any(principal, "Schedule", "Read"):
        raise rbac.denial(principal, "Schedule", "Read")
    qs = InstructionSchedule.objects.all()
    if enabled_only:
        qs = qs.filter(enabled=True)
    try:
        rows = list(qs.order_by("id")[:1000])
    except DatabaseError:
        raise YuzuError("schedule store unavailable", status=503, rpc_code=-32603,
                        retry_after_ms=STORE_FAULT_RETRY_MS) from None
    if full:
        return {"schedules": [r.to_dict() for r in rows]}
    return {"schedules": [{"id": r.id, "name": r.name, "definition_id": r.definition_id,
                           "frequency_type": r.frequency_type, "enabled": r.enabled,
                           "next_execution_at": r.next_execution_at.isoformat() if r.next_execution_at else None}
                          for r in rows]}


def _row(schedule_id, *, lock=False):
    qs = InstructionSchedule.objects.select_for_update() if lock else InstructionSchedule.objects
    row = qs.filter(pk=schedule_id).first() if str(schedule_id).isdecimal() else None
    if row is None:
        raise YuzuError(f"Schedule not found: {schedule_id}", status=404, rpc_code=-32602)
    return row


def enable_schedule(principal, schedule_id, enabled, *, cid=""):
    rbac.check(principal, "Schedule", "Write", any_scope=True)
    if not isinstance(enabled, bool):
        raise invalid("enabled must be true or false")
    with transaction.atomic():
        # Under the row lock (a tick skips it meanwhile): a tick that fired the schedule between a plain read and
        # this write had moved its next run on, and the write put it back — the next tick fired it again.
        row = _row(schedule_id, lock=True)
        row.enabled = enabled
        if enabled and row.next_execution_at is None and row.frequency_type != "once":
            row.next_execution_at = row.next_after(timezone.now())
        row.save(update_fields=["enabled", "next_execution_at"])
    audit(principal, "schedule.enable", "success", target_type="InstructionSchedule", target_id=row.id,
          detail=f"enabled={enabled}", correlation_id=cid)
    return row.to_dict()


def delete_schedule(principal, schedule_id, *, cid=""):
    rbac.check(principal, "Schedule", "Delete", any_scope=True)
    row = _row(schedule_id)
    row.delete()
    audit(principal, "schedule.delete", "success", target_type="InstructionSchedule", target_id=schedule_id,
          correlation_id=cid)
    return {"deleted": True}


# --- the scheduler -------------------------------------------------------------------------------------

def _approval_ready(row):
    """True when the schedule may fire; updates its approval state from the ticket."""
    if not row.requires_approval or row.approval_state == "approved":
        return True
    ticket = Approval.objects.filter(pk=row.approval_id).first()
    if ticket is not None and ticket.status == Approval.APPROVED:
        row.approval_state = "approved"
        return True
    if ticket is None or ticket.status in (Approval.REJECTED, Approval.EXPIRED, Approval.WITHDRAWN):
        row.approval_state, row.enabled = "refused", False
        row.last_error = "the schedule's approval was refused; it is disabled"
    return False


def fire(row, now):
    """One run of a due schedule (the row is locked by the caller). Returns the outcome label."""
    if not _approval_ready(row):
        return "awaiting_approval" if row.enabled else "approval_refused"
    creator = Principal.from_key(row.creator_key)
    definition = InstructionDefinition.objects.filter(pk=row.definition_id, enabled=True).first()
    outcome = "fired"
    if creator is None and Principal.locked_out(row.creator_key):  # no revocation: it runs again once unlocked
        row.last_error, outcome = "the creator's account is locked by an administrator: this run is skipped", "refused"
    elif creator is None or definition is None:
        row.enabled, outcome = False, "disabled"
        row.last_error = "the creator's token or account is gone" if creator is None else "definition missing or disabled"
    else:
        actor = SchedulePrincipal(user=creator.user, token=creator.token, schedule_id=row.id)
        try:
            tree = parse(row.scope_expression) if row.scope_expression.strip() else None
            targets = _targets(actor, tree, row.pinned_agents if row.requires_approval else None)
            receipt = launch(actor, Order(definition.plugin, definition.action, row.run_parameters(), targets,
                                          row.scope_expression), definition_id=definition.id)
            row.last_execution_id, row.last_error = receipt["execution_id"], ""
            row.execution_count += 1
        except (YuzuError, ScopeError) as exc:
            row.last_error, outcome = str(exc)[:1024], "refused"
        except SecretError as exc:  # the key its secrets were sealed under is gone: nothing is sent without them
            row.last_error, outcome = f"its secret parameters cannot be unsealed: {exc}"[:1024], "refused"
    row.last_executed_at = now
    row.next_execution_at = row.next_after(now)  # missed runs coalesce: the next one is after now
    return outcome


def tick(now=None):
    """Fire every due schedule once. Returns how many were evaluated."""
    now = now or timezone.now()
    done = 0
    with transaction.atomic():
        due = list(InstructionSchedule.objects.select_for_update(skip_locked=True)
                   .filter(enabled=True, next_execution_at__isnull=False, next_execution_at__lte=now)
                   .order_by("next_execution_at")[:BATCH])
        for row in due:
            outcome = fire(row, now)  # awaiting approval: stays due, checked again next tick
            row.save()
            SCHEDULE_FIRES.labels(outcome).inc()
            done += 1
    return done
