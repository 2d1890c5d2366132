"""The policy engine and Guardian (docs/compliance.md): fragments and policies authored as YAML, a verdict per
(policy, agent), the runs that produced them, and Guardian's guard rules and drift events.

A document's YAML is its source of truth: ``PolicyFragment.from_yaml`` / ``Policy.from_yaml`` parse and check it
(compliance.documents) and fill the columns derived from it, so the stored row and its YAML never disagree."""

import secrets
import uuid
from datetime import timedelta

import yaml
from django.db import models, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from fleet.groups import agents_in_groups
from fleet.models import Agent, Execution, ManagementGroup
from fleet.scope import ScopeError, parse, to_q

from . import documents
from .documents import DocumentError

MAX_FIX_ATTEMPTS = 3
STALE_AFTER = timedelta(hours=24)


def uuid_str():
    return str(uuid.uuid4())


def hex32():
    return secrets.token_hex(16)


def epoch(dt):
    return int(dt.timestamp()) if dt else None


def instruction(step):
    return f"{step['plugin']}.{step['action']}" if step else ""


class PolicyFragment(models.Model):
    """What to check (a plugin.action and a CEL expression over its result), and optionally how to fix it and
    how to verify the fix."""

    id = models.CharField(primary_key=True, max_length=36, default=uuid_str, editable=False)
    name = models.CharField(max_length=128, unique=True)
    description = models.CharField(max_length=1024, blank=True)
    yaml_source = models.TextField()
    check_instruction = models.CharField(max_length=130)
    check_compliance = models.TextField()
    check_parameters = models.JSONField(default=dict, blank=True)
    fix_instruction = models.CharField(max_length=130, blank=True)
    fix_parameters = models.JSONField(default=dict, blank=True)
    post_check_instruction = models.CharField(max_length=130, blank=True)
    post_check_compliance = models.TextField(blank=True)
    post_check_parameters = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def apply_yaml(self, text):
        """Check ``text`` and set every column from it (not saved). Raises DocumentError."""
        meta, spec = documents.parse("PolicyFragment", text)
        check, fix, post = spec["check"], spec.get("fix") or {}, spec.get("postCheck") or {}
        self.name, self.description, self.yaml_source = meta["name"], meta.get("description", ""), text
        self.check_instruction, self.check_compliance = instruction(check), check["compliance"]
        self.check_parameters = check.get("parameters") or {}
        self.fix_instruction, self.fix_parameters = instruction(fix), fix.get("parameters") or {}
        self.post_check_instruction, self.post_check_compliance = instruction(post), post.get("compliance", "")
        self.post_check_parameters = post.get("parameters") or {}
        self.updated_at = timezone.now()
        return self

    @property
    def remediation_available(self):
        return bool(self.fix_instruction)

    def step(self, phase, inputs):
        """(plugin, action, parameters, compliance expression) of ``phase`` (check | fix | verify), parameters
        bound to ``inputs``. verify is the post-check, falling back to the check."""
        if phase == "fix":
            name, params, expr = self.fix_instruction, self.fix_parameters, ""
        elif phase == "verify" and self.post_check_instruction:
            name, params = self.post_check_instruction, self.post_check_parameters
            expr = self.post_check_compliance or self.check_compliance
        else:
            name, params, expr = self.check_instruction, self.check_parameters, self.check_compliance
        plugin, action = name.split(".", 1)
        return plugin, action, documents.substitute(params, inputs), expr

    def check_inputs(self, inputs):
        """Raise DocumentError unless ``inputs`` bind every ${input} of every step."""
        for phase in ("check", "fix", "verify"):
            if phase == "check" or (phase == "fix" and self.fix_instruction) or \
                    (phase == "verify" and self.post_check_instruction):
                self.step(phase, inputs)

    def to_dict(self):
        return {"id": self.id, "name": self.name, "description": self.description, "yaml_source": self.yaml_source,
                "check_instruction": self.check_instruction, "check_compliance": self.check_compliance,
                "check_parameters": self.check_parameters, "fix_instruction": self.fix_instruction or None,
                "fix_parameters": self.fix_parameters, "post_check_instruction": self.post_check_instruction or None,
                "post_check_compliance": self.post_check_compliance or None,
                "post_check_parameters": self.post_check_parameters,
                "remediation_available": self.remediation_available,
                "created_at": epoch(self.created_at), "updated_at": epoch(self.updated_at)}


class PolicyQuerySet(models.QuerySet):
    def due(self, now):
        """Enabled policies whose interval has elapsed since their last dispatch (or never dispatched)."""
        return self.filter(Q(last_dispatch_at__isnull=True) | Q(next_due_at__lte=now), enabled=True)


class Policy(models.Model):
    """A fragment bound to targets, triggers and inputs. ``last_dispatch_at``/``next_due_at`` are the policy's
    clock: stored, so a restart keeps it, and claimed with a row lock so two evaluators never both dispatch
    one interval."""

    id = models.CharField(primary_key=True, max_length=36, default=uuid_str, editable=False)
    name = models.CharField(max_length=128, unique=True)
    description = models.CharField(max_length=1024, blank=True)
    yaml_source = models.TextField()
    fragment = models.ForeignKey(PolicyFragment, on_delete=models.PROTECT, related_name="policies")
    scope_expression = models.CharField(max_length=8192, blank=True)
    enabled = models.BooleanField(default=True)
    interval_seconds = models.PositiveIntegerField(default=3600)
    last_dispatch_at = models.DateTimeField(null=True, blank=True)
    next_due_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = PolicyQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "policies"

    def __str__(self):
        return self.name

    @classmethod
    def plan_yaml(cls, text):
        """Check a Policy document completely before anything is written: (metadata, spec, fragment, groups,
        inputs). Raises DocumentError."""
        meta, spec = documents.parse("Policy", text)
        ref = spec["fragment"]
        fragment = PolicyFragment.objects.filter(Q(pk=ref) | Q(name=ref)).first()
        if fragment is None:
            raise DocumentError(f"unknown fragment '{ref}' (spec.fragment names a fragment by name or id)",
                                remediation="create the PolicyFragment first, or fix the name")
        groups = []
        for ref in spec.get("managementGroups") or []:
            group = ManagementGroup.objects.filter(Q(pk=ref) | Q(name=ref)).first()
            if group is None:
                raise DocumentError(f"unknown management group '{ref}' in spec.managementGroups")
            groups.append(group)
        scope = spec.get("scope") or ""
        if scope.strip():
            try:
                parse(scope)
            except ScopeError as exc:
                raise DocumentError(f"spec.scope is not a valid scope expression: {exc}",
                                    position=getattr(exc, "position", None)) from None
        inputs = spec.get("inputs") or {}
        fragment.check_inputs(inputs)
        return meta, spec, fragment, groups, inputs

    @classmethod
    def from_yaml(cls, text, instance=None):
        """Create the policy (or replace ``instance``'s definition) with its triggers, inputs and group
        bindings, in one transaction. Raises DocumentError before anything is written."""
        meta, spec, fragment, groups, inputs = cls.plan_yaml(text)
        triggers = spec.get("triggers") or []
        fields = {"name": meta["name"], "description": meta.get("description", ""), "yaml_source": text,
                  "fragment": fragment, "scope_expression": spec.get("scope") or "",
                  "enabled": spec.get("enabled", True), "interval_seconds": documents.interval_of(triggers),
                  "updated_at": timezone.now()}
        with transaction.atomic():
            if instance is None:
                policy = cls.objects.create(**fields)
            else:
                policy = instance
                for k, v in fields.items():
                    setattr(policy, k, v)
                policy.save()
                policy.triggers.all().delete()
                policy.policy_inputs.all().delete()
                policy.group_bindings.all().delete()
            PolicyTrigger.objects.bulk_create([
                PolicyTrigger(policy=policy, trigger_type=t["type"],
                              config_json={k: v for k, v in t.items() if k != "type"}) for t in triggers])
            PolicyInput.objects.bulk_create([
                PolicyInput(policy=policy, key=k, value=v if isinstance(v, str) else str(v).lower()
                            if isinstance(v, bool) else str(v)) for k, v in inputs.items()])
            PolicyGroupBinding.objects.bulk_create([PolicyGroupBinding(policy=policy, group=g) for g in groups])
        return policy

    def inputs(self):
        return dict(self.policy_inputs.values_list("key", "value"))

    def targets(self):
        """Agents the policy applies to: its management groups (and their descendants) when bound, else its
        scope expression, else every agent."""
        group_ids = list(self.group_bindings.values_list("group_id", flat=True))
        if group_ids:
            return agents_in_groups(group_ids)
        if self.scope_expression.strip():
            return Agent.objects.filter(to_q(self.scope_expression))
        return Agent.objects.all()

    def reachable_targets(self):
        """Targets a command can be sent to now: connected and not quarantined."""
        return sorted(self.targets().filter(connected=True, quarantined=False).values_list("agent_id", flat=True))

    def claim(self, now, force=False):
        """Take this interval's dispatch: one conditional UPDATE, so of two evaluators (or a tick and an
        on-demand call) racing for a due policy exactly one wins. Returns whether this caller won."""
        qs = Policy.objects.filter(pk=self.pk)
        if not force:
            qs = qs.filter(Q(last_dispatch_at__isnull=True) | Q(next_due_at__lte=now), enabled=True)
        won = bool(qs.update(last_dispatch_at=now, next_due_at=now + timedelta(seconds=self.interval_seconds)))
        if won:
            self.last_dispatch_at, self.next_due_at = now, now + timedelta(seconds=self.interval_seconds)
        return won

    def invalidate(self):
        """Every verdict of the policy goes back to ``unknown`` and the policy is due now."""
        with transaction.atomic():
            n = self.statuses.update(status=PolicyAgentStatus.Status.UNKNOWN)
            Policy.objects.filter(pk=self.pk).update(next_due_at=timezone.now())
        return n

    def unsupported_triggers(self):
        return sorted({t for t in self.triggers.values_list("trigger_type", flat=True)
                       if t not in documents.SUPPORTED_TRIGGERS})

    def summary(self):
        """Raw per-status counts of this policy's rows (no staleness rule)."""
        counts = dict(self.statuses.order_by().values_list("status").annotate(n=Count("id")))
        out = {s: counts.get(s, 0) for s in PolicyAgentStatus.Status.values}
        return {"policy_id": self.id, **out, "total": sum(out.values())}

    def to_dict(self, full=False):
        out = {"id": self.id, "name": self.name, "description": self.description, "enabled": self.enabled,
               "scope_expression": self.scope_expression}
        if full:
            out.update({
                "fragment_id": self.fragment_id, "fragment": self.fragment.name, "yaml_source": self.yaml_source,
                "interval_seconds": self.interval_seconds,
                "triggers": [{"type": t.trigger_type, **t.config_json,
                              "supported": t.trigger_type in documents.SUPPORTED_TRIGGERS}
                             for t in self.triggers.all()],
                "unsupported_triggers": self.unsupported_triggers(), "inputs": self.inputs(),
                "management_groups": list(self.group_bindings.values_list("group_id", flat=True)),
                "remediation_available": self.fragment.remediation_available,
                "last_dispatch_at": epoch(self.last_dispatch_at), "next_due_at": epoch(self.next_due_at),
                "created_at": epoch(self.created_at), "updated_at": epoch(self.updated_at),
                "summary": self.summary()})
        return out


class PolicyTrigger(models.Model):
    class Type(models.TextChoices):
        INTERVAL = "interval"
        FILE_CHANGE = "file_change"
        SERVICE_STATUS = "service_status"
        EVENT_LOG = "event_log"
        REGISTRY = "registry"
        STARTUP = "startup"

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="triggers")
    trigger_type = models.CharField(max_length=16, choices=Type.choices)
    config_json = models.JSONField(default=dict, blank=True)


class PolicyInput(models.Model):
    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="policy_inputs")
    key = models.CharField(max_length=64)
    value = models.TextField(blank=True)

    class Meta:
        unique_together = [("policy", "key")]


class PolicyGroupBinding(models.Model):
    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="group_bindings")
    group = models.ForeignKey(ManagementGroup, on_delete=models.CASCADE, related_name="policy_bindings")

    class Meta:
        unique_together = [("policy", "group")]


class PolicyAgentStatus(models.Model):
    """The latest verdict of one policy on one agent."""

    class Status(models.TextChoices):
        COMPLIANT = "compliant"
        NON_COMPLIANT = "non_compliant"
        UNKNOWN = "unknown"
        FIXING = "fixing"
        ERROR = "error"

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="statuses")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="policy_statuses")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.UNKNOWN, db_index=True)
    last_check_at = models.DateTimeField(null=True, blank=True)
    last_fix_at = models.DateTimeField(null=True, blank=True)
    check_result = models.JSONField(default=dict, blank=True)
    fix_attempts = models.PositiveSmallIntegerField(default=0)

    class Meta:
        unique_together = [("policy", "agent")]
        verbose_name = "verdict"
        verbose_name_plural = "verdicts"

    def __str__(self):
        return f"{self.policy} on {self.agent_id}: {self.status}"

    def to_dict(self):
        return {"policy_id": self.policy_id, "agent_id": self.agent_id, "status": self.status,
                "last_check_at": epoch(self.last_check_at), "last_fix_at": epoch(self.last_fix_at),
                "check_result": self.check_result, "fix_attempts": self.fix_attempts}

    @classmethod
    def fleet(cls, now=None):
        """Counts over every (policy, agent) row; a row not checked for 24 h counts as unknown."""
        stale = (now or timezone.now()) - STALE_AFTER
        fresh = dict(cls.objects.filter(last_check_at__gte=stale).order_by().values_list("status")
                     .annotate(n=Count("id")))
        total = cls.objects.count()
        out = {s: fresh.get(s, 0) for s in cls.Status.values}
        out["unknown"] += total - sum(fresh.values())
        return {"total_checks": total, **out,
                "compliance_pct": round(100.0 * out["compliant"] / total, 2) if total else 0.0}


class PolicyRun(models.Model):
    """One dispatch of a policy's check, fix or verify instruction: the Execution it created and, once read,
    when. ``collect`` claims a run with one conditional UPDATE, so its verdicts are written once."""

    class Phase(models.TextChoices):
        CHECK = "check"
        FIX = "fix"
        VERIFY = "verify"

    id = models.CharField(primary_key=True, max_length=32, default=hex32, editable=False)
    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="runs")
    phase = models.CharField(max_length=8, choices=Phase.choices)
    execution = models.ForeignKey(Execution, null=True, on_delete=models.SET_NULL, related_name="+")
    agent_ids = models.JSONField(default=list)
    expression = models.TextField(blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    collected_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["-started_at"]

    def claim_collection(self, now):
        won = bool(PolicyRun.objects.filter(pk=self.pk, collected_at__isnull=True).update(collected_at=now))
        if won:
            self.collected_at = now
        return won


# --- Guardian ------------------------------------------------------------------------------------

class GuardRule(models.Model):
    class Enforcement(models.TextChoices):
        ENFORCE = "enforce"
        AUDIT = "audit"

    class Severity(models.TextChoices):
        CRITICAL = "critical"
        HIGH = "high"
        MEDIUM = "medium"
        LOW = "low"

    class OsTarget(models.TextChoices):
        ALL = "", "all"
        WINDOWS = "windows"
        LINUX = "linux"
        MACOS = "macos"

    rule_id = models.CharField(primary_key=True, max_length=36, default=uuid_str, editable=False)
    name = models.CharField(max_length=128, unique=True)
    yaml_source = models.TextField(blank=True)
    spec_json = models.JSONField(default=dict)
    prerequisites = models.JSONField(default=list, blank=True)
    version = models.PositiveIntegerField(default=1)
    enabled = models.BooleanField(default=True)
    enforcement_mode = models.CharField(max_length=8, choices=Enforcement.choices, default=Enforcement.AUDIT)
    severity = models.CharField(max_length=8, choices=Severity.choices, default=Severity.MEDIUM)
    os_target = models.CharField(max_length=8, choices=OsTarget.choices, default="", blank=True)
    scope_expr = models.CharField(max_length=8192, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=150, blank=True)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "guard rule"

    def __str__(self):
        return self.name

    def bump(self, by):
        """An update: the version goes up by one (one UPDATE, so concurrent edits never share a version)."""
        GuardRule.objects.filter(pk=self.pk).update(version=F("version") + 1, updated_at=timezone.now(),
                                                    updated_by=by)
        self.refresh_from_db()

    def render_yaml(self):
        """The rule as a YAML document (its yaml_source), rendered from the columns."""
        return yaml.safe_dump({"apiVersion": documents.API_VERSION, "kind": "GuaranteedStateRule",
                               "metadata": {"name": self.name},
                               "spec": {**self.spec_json, "enforcementMode": str(self.enforcement_mode),
                                        "severity": str(self.severity), "osTarget": str(self.os_target),
                                        "scope": self.scope_expr, "enabled": bool(self.enabled)}}, sort_keys=False)

    def save(self, *args, **kwargs):
        self.yaml_source = self.render_yaml()
        super().save(*args, **kwargs)

    def wire(self):
        """The rule as an agent receives it."""
        return {"rule_id": self.rule_id, "name": self.name, "version": self.version, "spec": self.spec_json,
                "enforcement_mode": self.enforcement_mode, "severity": self.severity}

    def to_dict(self):
        return {"rule_id": self.rule_id, "name": self.name, "yaml_source": self.yaml_source, "spec": self.spec_json,
                "prerequisites": self.prerequisites, "version": self.version, "enabled": self.enabled,
                "enforcement_mode": self.enforcement_mode, "severity": self.severity, "os_target": self.os_target,
                "scope_expr": self.scope_expr, "created_at": self.created_at.isoformat(),
                "updated_at": self.updated_at.isoformat(), "created_by": self.created_by,
                "updated_by": self.updated_by}


class GuardianEvent(models.Model):
    """What an agent's guard reported. ``agent`` is the authenticated connection's, never the frame's."""

    event_id = models.CharField(primary_key=True, max_length=32, default=hex32, editable=False)
    rule = models.ForeignKey(GuardRule, null=True, on_delete=models.SET_NULL, related_name="events")
    rule_name = models.CharField(max_length=128, blank=True)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="guardian_events")
    event_type = models.CharField(max_length=64)
    severity = models.CharField(max_length=8, blank=True)
    guard_type = models.CharField(max_length=64, blank=True)
    guard_category = models.CharField(max_length=32, blank=True)
    detected_value = models.TextField(blank=True)
    expected_value = models.TextField(blank=True)
    detail_json = models.JSONField(default=dict, blank=True)
    remediation_action = models.CharField(max_length=64, blank=True)
    detection_latency_us = models.BigIntegerField(null=True, blank=True)
    remediation_latency_us = models.BigIntegerField(null=True, blank=True)
    timestamp = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-timestamp"]
        verbose_name = "drift event"

    def __str__(self):
        return f"{self.event_type} {self.rule_name} on {self.agent_id}"

    def to_dict(self):
        return {"event_id": self.event_id, "rule_id": self.rule_id, "rule_name": self.rule_name,
                "agent_id": self.agent_id, "event_type": self.event_type, "severity": self.severity,
                "guard_type": self.guard_type, "guard_category": self.guard_category,
                "detected_value": self.detected_value, "expected_value": self.expected_value,
                "detail": self.detail_json, "remediation_action": self.remediation_action,
                "detection_latency_us": self.detection_latency_us,
                "remediation_latency_us": self.remediation_latency_us, "timestamp": self.timestamp.isoformat()}
