"""The compliance capabilities, one function each, shared by the MCP tools and the REST views. Callers have
passed the capability's RBAC gate (Policy:* or GuaranteedState:*); these functions validate, act, write the
audit row and return ``to_dict()`` shapes. Every document is checked completely before anything is written,
so a refused one leaves nothing behind."""

from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.utils import timezone

from fleet.models import Agent
from fleet.push import send_to_agent
from fleet.scope import ScopeError, parse, to_q
from yuzu.audit import audit
from yuzu.errors import NotFound, StoreFault, YuzuError
from yuzu.metrics import GUARDIAN_POLICY_GENERATION

from . import engine, guardian
from .documents import MAX_DOCUMENT_BYTES, DocumentError
from .models import GuardianEvent, GuardRule, Policy, PolicyAgentStatus, PolicyFragment

FLEET_CACHE_KEY = "compliance:fleet"
MAX_POLICIES = 100


def invalid(message, **extra):
    remediation = extra.pop("remediation", None) or "fix the document and send it again"
    return YuzuError(message, status=400, rpc_code=-32602, remediation=remediation, extra=extra or None)


def document_error(exc):
    return invalid(exc.message, **exc.extra)


def yaml_of(body):
    """The YAML text of a create request: a raw YAML body, or JSON {"yaml_source": "..."}."""
    text = body.get("yaml_source") if isinstance(body, dict) else body
    if not isinstance(text, str):
        raise invalid("send the document as a YAML body, or as JSON {\"yaml_source\": \"<YAML>\"}")
    if len(text.encode(errors="surrogatepass")) > MAX_DOCUMENT_BYTES:
        raise invalid(f"the document exceeds {MAX_DOCUMENT_BYTES} bytes")
    return text


def _policy(policy_id):
    policy = Policy.objects.select_related("fragment").filter(pk=policy_id).first() \
        if isinstance(policy_id, str) and len(policy_id) <= 64 else None
    if policy is None:
        raise NotFound(f"policy not found: {str(policy_id)[:64]}")
    return policy


def _forget_fleet():
    cache.delete(FLEET_CACHE_KEY)


@contextmanager
def _document_write(what):
    """A policy's or fragment's document written: its DocumentError is the 400 that names the line and column, and
    a metadata.name another took meanwhile (the unique index) the 409."""
    try:
        yield
    except DocumentError as exc:
        raise document_error(exc) from None
    except IntegrityError:
        raise YuzuError(f"a {what} with that metadata.name exists already", status=409, rpc_code=-32602,
                        remediation=f"choose another metadata.name, or delete the existing {what}") from None


# --- fragments -------------------------------------------------------------------------------------

def create_fragment(principal, text, cid=""):
    try:
        fragment = PolicyFragment().apply_yaml(yaml_of(text))
    except DocumentError as exc:
        raise document_error(exc) from None
    try:
        with transaction.atomic():
            fragment.save(force_insert=True)
    except IntegrityError:
        raise YuzuError(f"a fragment named '{fragment.name}' exists already", status=409, rpc_code=-32602,
                        remediation="choose another metadata.name, or delete the existing fragment") from None
    audit(principal, "policy.fragment.create", "success", target_type="PolicyFragment", target_id=fragment.id,
          detail=f"name={fragment.name} check={fragment.check_instruction}", correlation_id=cid)
    return {"id": fragment.id, "status": "created"}


def update_fragment(principal, fragment_id, text, cid=""):
    """Replace a fragment's definition (the admin's fragment page is its face), under its row lock: the document
    checked completely, and every policy using the fragment must still bind each of its ${inputs}."""
    with _document_write("fragment"), transaction.atomic():
        fragment = PolicyFragment.objects.select_for_update().filter(pk=fragment_id).first()
        if fragment is None:
            raise NotFound(f"fragment not found: {str(fragment_id)[:64]}")
        fragment.apply_yaml(yaml_of(text))
        for policy in fragment.policies.all():
            try:
                fragment.check_inputs(policy.inputs())
            except DocumentError as exc:
                raise DocumentError(f"policy '{policy.name}': {exc.message}") from None
        fragment.save()
    audit(principal, "policy.fragment.update", "success", target_type="PolicyFragment", target_id=fragment.id,
          detail=f"name={fragment.name} check={fragment.check_instruction}", correlation_id=cid)
    _forget_fleet()
    return {"id": fragment.id, "status": "updated"}


def list_fragments():
    rows = [f.to_dict() for f in PolicyFragment.objects.all()[:1000]]
    return {"fragments": rows, "count": len(rows)}


def delete_fragment(principal, fragment_id, cid=""):
    fragment = PolicyFragment.objects.filter(pk=fragment_id).first()
    if fragment is None:
        raise NotFound(f"fragment not found: {str(fragment_id)[:64]}")
    try:
        fragment.delete()
    except ProtectedError:
        raise YuzuError("the fragment is used by policies; delete them first", status=409, rpc_code=-32602,
                        extra={"policies": list(fragment.policies.values_list("id", flat=True)[:50])}) from None
    audit(principal, "policy.fragment.delete", "success", target_type="PolicyFragment", target_id=fragment_id,
          detail=f"name={fragment.name}", correlation_id=cid)
    return {"id": fragment_id, "deleted": True}


# --- policies ------------------------------------------------------------------------------------

def create_policy(principal, text, cid=""):
    with _document_write("policy"), transaction.atomic():
        policy = Policy.from_yaml(yaml_of(text))
    audit(principal, "policy.create", "success", target_type="Policy", target_id=policy.id,
          detail=f"name={policy.name} fragment={policy.fragment.name}", correlation_id=cid)
    _forget_fleet()
    return {"id": policy.id, "status": "created"}


def update_policy(principal, policy_id, text, cid=""):
    """Replace a policy's definition — triggers, inputs, group bindings — under its row lock (the admin's policy
    page is its face)."""
    with _document_write("policy"), transaction.atomic():
        policy = Policy.objects.select_for_update().filter(pk=policy_id).first()
        if policy is None:
            raise NotFound(f"policy not found: {str(policy_id)[:64]}")
        policy = Policy.from_yaml(yaml_of(text), instance=policy)
    audit(principal, "policy.update", "success", target_type="Policy", target_id=policy.id,
          detail=f"name={policy.name} fragment={policy.fragment.name}", correlation_id=cid)
    _forget_fleet()
    return {"id": policy.id, "status": "updated"}


def list_policies(*, enabled=None, name=None, fragment_id=None, limit=MAX_POLICIES):
    """Policies sorted by name, at most ``limit`` (≤ 100). ``enabled``: True → enabled only, False → disabled
    only, None → all."""
    qs = Policy.objects.all()
    if enabled is not None:
        qs = qs.filter(enabled=enabled)
    if name:
        qs = qs.filter(name__icontains=name)
    if fragment_id:
        qs = qs.filter(fragment_id=fragment_id)
    try:
        rows = [p.to_dict() for p in qs.order_by("name")[:max(1, min(int(limit), MAX_POLICIES))]]
    except Exception as exc:
        raise StoreFault("Policy store unavailable") from exc
    return {"policies": rows, "count": len(rows)}


def get_policy(policy_id):
    return _policy(policy_id).to_dict(full=True)


def delete_policy(principal, policy_id, cid=""):
    policy = _policy(policy_id)
    policy.delete()
    audit(principal, "policy.delete", "success", target_type="Policy", target_id=policy_id,
          detail=f"name={policy.name}", correlation_id=cid)
    _forget_fleet()
    return {"id": policy_id, "deleted": True}


def set_enabled(principal, policy_id, enabled, cid=""):
    policy = _policy(policy_id)
    Policy.objects.filter(pk=policy.pk).update(enabled=enabled, updated_at=timezone.now())
    audit(principal, f"policy.{'enable' if enabled else 'disable'}", "success", target_type="Policy",
          target_id=policy.id, detail=f"name={policy.name}", correlation_id=cid)
    return {"id": policy.id, "enabled": enabled}


def evaluate_policy(principal, policy_id, cid=""):
    policy = _policy(policy_id)
    try:
        run = engine.evaluate_now(policy, principal, cid)
    except YuzuError as exc:
        audit(principal, "policy.evaluate", "failure", target_type="Policy", target_id=policy.id,
              detail=exc.message[:200], correlation_id=cid)
        raise
    audit(principal, "policy.evaluate", "success", target_type="Policy", target_id=policy.id,
          detail=f"execution_id={run.execution_id} agents={len(run.agent_ids)}", correlation_id=cid)
    return {"execution_id": run.execution_id, "agents": len(run.agent_ids)}


def remediate_policy(principal, policy_id, agent_ids=None, cid=""):
    policy = _policy(policy_id)
    try:
        run = engine.remediate(policy, agent_ids, principal, cid)
    except YuzuError as exc:
        audit(principal, "policy.remediate", "failure", target_type="Policy", target_id=policy.id,
              detail=exc.message[:200], correlation_id=cid)
        raise
    audit(principal, "policy.remediate", "success", target_type="Policy", target_id=policy.id,
          detail=f"execution_id={run.execution_id} agents={','.join(run.agent_ids)[:1000]}", correlation_id=cid)
    _forget_fleet()
    return {"execution_id": run.execution_id, "agent_ids": run.agent_ids}


def invalidate(principal, policy_id=None, cid=""):
    """Reset one policy's verdicts (or every policy's) to unknown; the next tick checks again."""
    policies = [_policy(policy_id)] if policy_id is not None else list(Policy.objects.all())
    reset = sum(p.invalidate() for p in policies)
    audit(principal, "policy.invalidate", "success", target_type="Policy", target_id=policy_id or "*",
          detail=f"policies={len(policies)} rows={reset}", correlation_id=cid)
    _forget_fleet()
    return {"policies": len(policies), "rows_reset": reset}


# --- compliance reads ------------------------------------------------------------------------------

def compliance_summary(policy_id):
    return _policy(policy_id).summary()


def fleet_compliance():
    """Counts over every (policy, agent) verdict, cached for YUZU_COMPLIANCE_CACHE_S (60 s)."""
    try:
        data = cache.get(FLEET_CACHE_KEY)
        if data is None:
            data = PolicyAgentStatus.fleet()
            cache.set(FLEET_CACHE_KEY, data, int(getattr(settings, "YUZU_COMPLIANCE_CACHE_S", 60)))
    except Exception as exc:
        raise StoreFault("Policy store unavailable") from exc
    return data


def policy_statuses(policy_id, limit=1000):
    policy = _policy(policy_id)
    rows = [s.to_dict() for s in policy.statuses.order_by("agent_id")[:max(1, min(int(limit), 10000))]]
    return {"policy_id": policy.id, "statuses": rows, "count": len(rows)}


# --- Guardian --------------------------------------------------------------------------------------

RULE_FIELDS = ("enabled", "enforcement_mode", "severity", "os_target", "scope_expr", "prerequisites")


def _rule(rule_id, *, lock=False):
    qs = GuardRule.objects.select_for_update() if lock else GuardRule.objects
    rule = qs.filter(pk=rule_id).first() if isinstance(rule_id, str) else None
    if rule is None:
        raise NotFound(f"guard rule not found: {str(rule_id)[:64]}")
    return rule


def _check_rule(data):
    if "spec" in data:
        error = guardian.check_spec(data["spec"])
        if error:
            raise invalid(error, remediation="see get_guardian_schemas (GET /api/v1/guaranteed-state/schemas)")
    if (data.get("scope_expr") or "").strip():
        try:
            parse(data["scope_expr"])
        except ScopeError as exc:
            raise invalid(f"scope_expr is not a valid scope expression: {exc}") from None


def create_rule(principal, data, cid=""):
    _check_rule(data)
    rule = GuardRule(name=data["name"], spec_json=data["spec"], created_by=principal.name, updated_by=principal.name,
                     **{k: data[k] for k in RULE_FIELDS if k in data})
    try:
        with transaction.atomic():
            rule.save(force_insert=True)
    except IntegrityError:
        raise YuzuError(f"a guard rule named '{rule.name}' exists already", status=409, rpc_code=-32602) from None
    audit(principal, "guaranteed_state.rule.create", "success", target_type="GuardRule", target_id=rule.rule_id,
          detail=f"name={rule.name} assertion={rule.spec_json['assertion']['type']}", correlation_id=cid)
    return rule.to_dict()


def update_rule(principal, rule_id, data, cid="", *, version=None):
    """Read, change and save the rule under its row lock: a concurrent edit neither loses this one's change nor
    shares its version, and a concurrent delete is never undone (save() would insert the row again). ``version``:
    the one the caller's edit started from (the admin's form); a rule changed since is refused, not overwritten
    with what the caller saw."""
    try:
        with transaction.atomic():
            rule = _rule(rule_id, lock=True)
            if version is not None and rule.version != version:
                raise YuzuError(f"guard rule '{rule.name}' was changed (it is at version {rule.version}, your edit "
                                f"started from version {version}); nothing was saved", status=409, rpc_code=-32602,
                                remediation="reload the rule and make your change again")
            _check_rule(data)
            for k in RULE_FIELDS:
                if k in data:
                    setattr(rule, k, data[k])
            if "spec" in data:
                rule.spec_json = data["spec"]
            if "name" in data:
                rule.name = data["name"]
            rule.save()
            rule.bump(principal.name)
    except IntegrityError:
        raise YuzuError(f"a guard rule named '{data.get('name')}' exists already", status=409,
                        rpc_code=-32602) from None
    audit(principal, "guaranteed_state.rule.update", "success", target_type="GuardRule", target_id=rule.rule_id,
          detail=f"name={rule.name} version={rule.version}", correlation_id=cid)
    return rule.to_dict()


def delete_rule(principal, rule_id, cid=""):
    rule = _rule(rule_id)
    rule.delete()
    audit(principal, "guaranteed_state.rule.delete", "success", target_type="GuardRule", target_id=rule_id,
          detail=f"name={rule.name}", correlation_id=cid)
    return {"rule_id": rule_id, "deleted": True}


def list_rules():
    rows = [r.to_dict() for r in GuardRule.objects.all()[:1000]]
    return {"rules": rows, "count": len(rows)}


def get_rule(rule_id):
    return _rule(rule_id).to_dict()


def applies(rule, agent):
    """Does an enabled rule apply to the agent (its OS target and scope)?"""
    if not rule.enabled or (rule.os_target and rule.os_target not in (agent.os or "").lower()):
        return False
    return not rule.scope_expr.strip() or Agent.objects.filter(to_q(rule.scope_expr), pk=agent.pk).exists()


def rules_for(agent):
    """The enabled rules that apply to one agent, as it receives them."""
    return [rule.wire() for rule in GuardRule.objects.filter(enabled=True) if applies(rule, agent)]


def push_rules_to(agent_id):
    """An agent that (re)connects gets its rule set (when any rule exists)."""
    agent = Agent.objects.filter(pk=agent_id).first()
    if agent is None or not GuardRule.objects.exists():
        return
    send_to_agent(agent_id, {"type": "agent.push", "payload": {"type": "guardian.rules", "full_sync": True,
                                                               "rules": rules_for(agent)}})


def push(principal, scope="", full_sync=True, cid=""):
    """Send each connected agent in ``scope`` (all when empty) its enabled rule set. The count is of agents
    sent to, not a delivery receipt."""
    agents = Agent.objects.filter(connected=True, quarantined=False)
    if scope.strip():
        try:
            agents = agents.filter(to_q(parse(scope)))
        except ScopeError as exc:
            raise invalid(f"scope is not a valid scope expression: {exc}") from None
    agents = list(agents)
    rules_total = GuardRule.objects.filter(enabled=True).count()
    for agent in agents:
        send_to_agent(agent.pk, {"type": "agent.push", "payload": {
            "type": "guardian.rules", "full_sync": bool(full_sync), "rules": rules_for(agent)}})
    GUARDIAN_POLICY_GENERATION.inc()
    audit(principal, "guaranteed_state.push", "success", target_type="GuaranteedState", target_id=scope or "*",
          detail=f'rules={rules_total} full_sync={str(bool(full_sync)).lower()} scope="{scope}" '
                 f"agents={len(agents)}", correlation_id=cid)
    return {"rules": rules_total, "agents": len(agents), "full_sync": bool(full_sync), "status": "accepted"}


def list_events(*, rule_id=None, agent_id=None, severity=None, limit=100, principal=None, cid=""):
    qs = GuardianEvent.objects.all()
    if rule_id:
        qs = qs.filter(rule_id=rule_id)
    if agent_id:
        qs = qs.filter(agent_id=agent_id)
        audit(principal, "dex.device.view", "success", target_type="Agent", target_id=agent_id,
              detail="guaranteed-state events", correlation_id=cid)
    if severity:
        qs = qs.filter(severity=severity)
    rows = [e.to_dict() for e in qs.order_by("-timestamp")[:max(1, min(int(limit), 1000))]]
    return {"events": rows, "count": len(rows)}


def _latest_per_rule(qs):
    latest = {}
    for rule_id, agent_id, event_type in qs.order_by("timestamp").values_list("rule_id", "agent_id", "event_type"):
        latest[(rule_id, agent_id)] = event_type
    return latest


def rule_state(event_type):
    if event_type in ("drift.detected", "remediation.failed"):
        return "drifted"
    if event_type in ("guard.unhealthy",):
        return "errored"
    return "compliant"


def guard_status(agent_id=None):
    """{total_rules, compliant_rules, drifted_rules, errored_rules}: each (agent, rule) pair by its latest event."""
    qs = GuardianEvent.objects.filter(rule__isnull=False)
    if agent_id is not None:
        if not Agent.objects.filter(pk=agent_id).exists():
            raise NotFound(f"Agent not found: {str(agent_id)[:128]}")
        qs = qs.filter(agent_id=agent_id)
    states = [rule_state(t) for t in _latest_per_rule(qs).values()]
    out = {"total_rules": GuardRule.objects.filter(enabled=True).count(),
           "compliant_rules": states.count("compliant"), "drifted_rules": states.count("drifted"),
           "errored_rules": states.count("errored")}
    if agent_id is not None:
        out["agent_id"] = agent_id
    return out


EVENT_TYPES = ("drift.detected", "drift.remediated", "remediation.failed", "guard.unhealthy", "guard.healthy",
               "guard.armed")


def record_event(agent_id, frame):
    """A Guardian report from an agent's authenticated connection (``agent_id`` is the connection's). Returns
    the stored event, or None when it names no rule that applies to that agent (an agent reports only on the
    rules it was sent)."""
    rule = GuardRule.objects.filter(pk=frame.get("rule_id")).first()
    agent = Agent.objects.filter(pk=agent_id).first()
    if rule is None or agent is None or not applies(rule, agent):
        return None
    return GuardianEvent.objects.create(
        rule=rule, rule_name=rule.name, agent_id=agent_id, event_type=frame["event_type"],
        severity=rule.severity, guard_type=frame.get("guard_type", "")[:64],
        guard_category=frame.get("guard_category", "")[:32], detected_value=frame.get("detected_value", "")[:4096],
        expected_value=frame.get("expected_value", "")[:4096], detail_json=frame.get("detail") or {},
        remediation_action=frame.get("remediation_action", "")[:64],
        detection_latency_us=frame.get("detection_latency_us"),
        remediation_latency_us=frame.get("remediation_latency_us"))


def reap_events(days=None):
    days = days if days is not None else int(getattr(settings, "YUZU_GUARDIAN_EVENT_RETENTION_DAYS", 30))
    n, _ = GuardianEvent.objects.filter(timestamp__lt=timezone.now() - timedelta(days=days)).delete()
    return n

