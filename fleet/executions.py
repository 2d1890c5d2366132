"""Executions: send one ``(plugin, action, parameters)`` command to a set of agents, collect their
responses, and read both back (spec/yuzu-mcp.md §2.4 and §6). The MCP tools and the REST views call
these functions; callers have passed the capability's generic RBAC gate.

Lifecycle: ``start_execution`` validates, resolves targets, creates the Execution row and one
AgentExecStatus row per target (pending) BEFORE anything is sent, then enqueues the Celery task
``fleet.tasks.dispatch_execution``. What the agents answer is stored by fleet.responses; cancelling is
``Execution.cancel``, and an execution's output shape ``Execution.to_dict``. These functions add what a
caller needs around them: the permission checks, the audit row and the event on the execution's
channel-layer group (fleet.events).
"""

import json
import logging
import secrets
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial

from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from yuzu import rbac
from yuzu.audit import audit
from yuzu.dbfuncs import insert_many
from yuzu.errors import RESULT_POLL_RETRY_MS, STORE_FAULT_RETRY_MS, NotFound, YuzuError
from yuzu.faults import store_fault
from yuzu.plans import SENSITIVE_KEY_RE, Plan, redact

from . import catalogue, events
from .catalogue import BadSchema
from .gates import dispatch_gate
from .models import (
    Agent,
    AgentExecStatus,
    AgentInventory,
    AgentState,
    Execution,
    Response,
)
from .scope import ScopeError, parse, to_q
from .services import visible_agents
from .tasks import dispatch_execution

log = logging.getLogger("yuzu.fleet")

MAX_NAME_BYTES = 128
MAX_SCOPE_BYTES = 8192
MAX_AGENT_IDS = 10000
MAX_AGENT_ID_BYTES = 128
MAX_PARAMS = 32
MAX_PARAM_KEY_BYTES = 256
MAX_PARAM_VALUE_BYTES = 64 * 1024
MAX_BUNDLE_STEPS = 32
MAX_EXPIRES_IN = 86400
REDACTED = "[redacted]"
GROUP_BY = ("status", "agent_id", "exit_code", "output")


def _gated(plugin, action, targets, principal=None):
    """(the targets that may receive plugin.action, how many were held back)."""
    held = dispatch_gate(plugin, action, targets, principal)
    return [t for t in targets if t not in held], len(held)


def gate(order, principal=None):
    """The order without the targets the dispatch gates hold back now (raises when they refuse it)."""
    targets, held = _gated(order.plugin, order.action, order.targets, principal)
    return replace(order, targets=targets, held=order.held + held) if held else order


def invalid(message, remediation=None, **extra):
    return YuzuError(message, status=400, rpc_code=-32602, remediation=remediation, extra=extra or None)


def _nbytes(text):
    return len(text.encode())


# --- validation (spec §2.4) --------------------------------------------------------------------

def _command(plugin, action, params):
    """Validate one command; returns (plugin, action, params as {str: str})."""
    names = []
    for field, value in (("plugin", plugin), ("action", action)):
        if not isinstance(value, str) or not value.strip():
            raise invalid(f"{field} is required", f"pass {field} as a non-empty string")
        if _nbytes(value) > MAX_NAME_BYTES:
            raise invalid(f"{field} exceeds {MAX_NAME_BYTES} bytes")
        names.append(value.lower())
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise invalid("params must be an object")
    if len(params) > MAX_PARAMS:
        raise invalid(f"params has {len(params)} keys; at most {MAX_PARAMS} are allowed")
    out = {}
    for key, value in params.items():
        if not isinstance(key, str) or not key or _nbytes(key) > MAX_PARAM_KEY_BYTES:
            raise invalid(f"params key '{str(key)[:64]}' must be 1-{MAX_PARAM_KEY_BYTES} bytes")
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        if _nbytes(text) > MAX_PARAM_VALUE_BYTES:
            raise invalid(f"params value of '{key[:64]}' exceeds {MAX_PARAM_VALUE_BYTES} bytes")
        out[key] = text
    return names[0], names[1], out


def _target(scope, agent_ids):
    """Check the target arguments; returns the parsed scope (or None) so it is parsed once."""
    if scope is not None and agent_ids is not None:
        raise invalid("scope and agent_ids are mutually exclusive", "pass either scope or agent_ids, not both")
    tree = None
    if scope is not None:
        if not isinstance(scope, str):
            raise invalid("scope must be a string")
        if not scope.strip():
            raise invalid("scope is empty", "omit scope (and agent_ids) to target all agents")
        if _nbytes(scope) > MAX_SCOPE_BYTES:
            raise invalid(f"scope exceeds {MAX_SCOPE_BYTES} bytes")
        try:
            tree = parse(scope)
        except ScopeError as exc:
            raise invalid(f"invalid scope expression: {exc}", "see discover_scope_kinds for the grammar",
                          position=exc.position) from None
    if agent_ids is not None:
        if not isinstance(agent_ids, list):
            raise invalid("agent_ids must be an array of strings")
        if not agent_ids:
            raise invalid("agent_ids is empty", "omit agent_ids (and scope) to target all agents")
        if len(agent_ids) > MAX_AGENT_IDS:
            raise invalid(f"agent_ids has {len(agent_ids)} entries; at most {MAX_AGENT_IDS} are allowed")
        for a in agent_ids:
            if not isinstance(a, str):
                raise invalid("agent_ids entries must be strings")
            if not a or _nbytes(a) > MAX_AGENT_ID_BYTES:
                raise invalid(f"an agent_ids entry must be 1-{MAX_AGENT_ID_BYTES} bytes")
    return tree


def eligible_agents(principal):
    """Agents a command may be sent to now: connected, unquarantined, and the caller's for Execution:Execute."""
    return visible_agents(principal, "Execution", "Execute").filter(connected=True, quarantined=False)


def _targets(principal, tree, agent_ids, pinned=None):
    """The eligible agents matched by the parsed scope or listed in agent_ids (all when neither), or — on an
    approved recall — the pinned agents that are still eligible, whatever the scope matches now."""
    qs = eligible_agents(principal)
    if pinned is not None:
        qs = qs.filter(pk__in=pinned)
    elif tree is not None:
        qs = qs.filter(to_q(tree))
    elif agent_ids is not None:
        qs = qs.filter(pk__in=agent_ids)
    return sorted(set(qs.values_list("agent_id", flat=True)))


class CatalogueRefusal(YuzuError):
    """The targeted agents' declared catalogue refuses the command: an action none of them declared, parameters
    a declared schema refuses, or a declared schema that cannot be applied (it came from an agent)."""


def _check_plugin(plugin, action, params, targets):
    """Which targets would take the command, by their declared catalogue (register): an agent whose catalogue
    lacks the action, or whose parameter schema refuses the parameters or cannot be applied, would REJECT it —
    it is left out, as a kill switch's held-back agent is, so one agent (a broken or a hostile one) cannot veto
    a command for the rest of the scope. Agents that reported no catalogue are kept (nothing to check against).
    → (the catalogue entry (risk, description) as catalogue.declared_entry shows it, or None, the targets kept,
    {agent_id: why} left out). Raises CatalogueRefusal when every target would refuse it: the reason of the first
    refusing schema."""
    name = f"{plugin}.{action}"
    rows = AgentInventory.objects.filter(agent_id__in=targets, plugin=AgentInventory.CATALOGUE)
    declared = list(rows.values_list(KeyTransform(name, "data"), flat=True).distinct()) if targets else []
    verdicts = {}  # schema text -> None (accepts) or the CatalogueRefusal its refusal raises
    for spec in declared:
        text = json.dumps(spec, sort_keys=True)
        if text not in verdicts:
            verdicts[text] = _verdict(name, spec, params, targets)
    accepting = [json.loads(t) for t, v in verdicts.items() if v is None]
    refusing = {t: v for t, v in verdicts.items() if v is not None}
    if not refusing:
        return catalogue.declared_entry(accepting), targets, {}
    left_out = {agent_id: refusing[text].message
                for agent_id, spec in rows.annotate(spec=KeyTransform(name, "data")).values_list("agent_id", "spec")
                if (text := json.dumps(spec, sort_keys=True)) in refusing}
    kept = [t for t in targets if t not in left_out]
    if kept:
        return catalogue.declared_entry(accepting), kept, left_out
    declared_refusals = [v for t, v in refusing.items() if t.startswith("{")]  # the action, refusing these params
    if declared_refusals:
        raise declared_refusals[0]
    raise CatalogueRefusal(f"unknown plugin/action: {name} (not in the catalogue of the targeted agents)",
                           remediation="see discover_plugins for the actions the agents support")


def _verdict(name, spec, params, targets):
    """None when an agent declaring ``spec`` for ``name`` would take ``params``, else the refusal."""
    if not isinstance(spec, dict):
        return CatalogueRefusal(f"{name} is not in the agent's catalogue")
    schema = spec.get("params") or {}
    try:
        error = catalogue.first_error(schema, params)
    except BadSchema as exc:
        return _unusable(name, schema, targets, exc)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "params"
    return CatalogueRefusal(f"params do not match {name}'s parameter schema at '{where}': {error.message}",
                            remediation="see discover_plugins (with InstructionDefinition:Read) for the "
                                        "parameter schema")


def _unusable(name, schema, targets, why):
    """The refusal for a declared parameter schema that cannot be applied (one stored before the register
    checks of fleet.catalogue, or that fails only on these parameters), naming the agents that declared it."""
    declaring, who = catalogue.declaring_agents(
        lambda data: isinstance(data.get(name), dict) and (data[name].get("params") or {}) == schema, targets)
    who = who or "a targeted agent"
    return CatalogueRefusal(f"{who} declared an unusable parameter schema for {name}: {why}", status=409,
                            remediation="leave that agent out of the target (agent_ids or a narrower scope) until it "
                                        "registers again: a register drops actions with unusable schemas",
                            extra={"plugin": name, "agent_ids": declaring})


@dataclass
class Order:
    """A validated execution: what ``launch`` sends, to whom."""

    plugin: str
    action: str
    params: dict
    targets: list
    scope: str = ""
    expires_in: int = 300
    held: int = 0  # targets a kill switch held back (left out)
    refused: int = 0  # targets whose declared catalogue refuses the command (left out)


def _describe(order, how):
    """``Run os.info with name=sshd on web-1, web-2`` (up to three agents by name) or ``… on 40 agents <how>``."""
    shown = redact(order.params)
    with_params = (" with " + ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))[:300]) if shown else ""
    n = len(order.targets)
    if 0 < n <= 3:
        names = dict(Agent.objects.filter(pk__in=order.targets).values_list("agent_id", "hostname"))
        where = ", ".join(names.get(a) or a for a in order.targets)
    else:
        where = f"{n} agent{'s' if n != 1 else ''} {how}"
    held = f" ({order.held} more held back by a kill switch)" if order.held else ""
    refused = (f" ({order.refused} more left out: their declared catalogue refuses it)" if order.refused else "")
    return f"Run {order.plugin}.{order.action}{with_params} on {where}{held}{refused}"


def plan_execution(principal, *, plugin, action, params=None, scope=None, agent_ids=None, expires_in=300,
                   pinned=None):
    """The one validation of an execution (spec §2.4 bounds, target, plugin catalogue, parameter schema);
    ``pinned`` (from an approval ticket) restricts the targets to those agents."""
    plugin, action, params = _command(plugin, action, params)
    tree = _target(scope, agent_ids)
    if not isinstance(expires_in, int) or isinstance(expires_in, bool) or not 1 <= expires_in <= MAX_EXPIRES_IN:
        raise invalid(f"expires_in must be an integer of 1-{MAX_EXPIRES_IN} seconds")
    pinned_ids = (pinned or {}).get("agents") if pinned is not None else None
    targets, held = _gated(plugin, action, _targets(principal, tree, agent_ids, pinned_ids), principal)
    spec, targets, refused = _check_plugin(plugin, action, params, targets)
    spec = spec or {}
    order = Order(plugin, action, params, targets, scope or "", expires_in, held, len(refused))
    how = (f"matching `{scope}`" if scope is not None else "listed by id" if agent_ids is not None
           else "(every connected agent you may execute on)")
    return Plan(summary=_describe(order, how), value=order, pins={"agents": order.targets},
                risk=spec.get("risk") or "", facts={"plugin": f"{plugin}.{action}",
                                                    "description": spec.get("description") or "",
                                                    "params": redact(params), "scope": scope,
                                                    "kill_switched_agents": held,
                                                    "catalogue_refused_agents": _sample(refused)})


def _sample(refused, shown=5):
    """{agent_id: why} for the first few agents left out (sorted), and how many there are."""
    return {"count": len(refused), "agents": {a: refused[a][:300] for a in sorted(refused)[:shown]}}


# --- start / dispatch --------------------------------------------------------------------------

def start_execution(principal, *, cid="", plan=None, definition_id="", **request):
    """Launch a planned execution (``plan`` from plan_execution, as the MCP face has it) or plan ``request``
    first (the REST face)."""
    return launch(principal, (plan or plan_execution(principal, **request)).value, cid=cid,
                  definition_id=definition_id)


def launch(principal, order, *, cid="", definition_id="", bundle_id="", bundle_step=None):
    """Create the rows, then enqueue dispatch. Sensitive parameter values are stored redacted and reach
    the dispatch task only through its message."""
    order = gate(order, principal)  # a switch may have been flipped since the plan
    plugin, action, params, targets = order.plugin, order.action, order.params, order.targets
    scope, expires_in, held, refused = order.scope, order.expires_in, order.held, order.refused
    sensitive = {k: v for k, v in params.items() if SENSITIVE_KEY_RE.search(k)}
    now = timezone.now()
    enqueue = {"tried": False}

    def dispatch(execution):
        enqueue["tried"] = True
        events.publish(execution)  # 0/N, before any response can move it
        _enqueue(execution.id, sensitive)

    try:
        # The execution, its per-agent rows and its execution.start audit row commit together (issue 22: a
        # database that fails between them must not leave an execution without its audit row). The dispatch
        # runs once they are committed: now, or when the caller's own transaction commits (then a failure
        # surfaces there, the execution already cancelled by _enqueue).
        with transaction.atomic():
            ex = Execution.objects.create(
                definition_id=definition_id, plugin=plugin, action=action,
                command_id=f"{plugin}-{secrets.token_hex(8)}",
                status=Execution.Status.RUNNING if targets else Execution.Status.CANCELLED, scope_expression=scope,
                parameter_values={k: REDACTED if k in sensitive else v for k, v in params.items()},
                dispatched_by=principal.name, dispatched_at=now, expires_at=now + timedelta(seconds=expires_in),
                completed_at=None if targets else now, agents_targeted=len(targets), bundle_id=bundle_id,
                bundle_step=bundle_step, last_error_detail="" if targets else "no agents reached",
            )
            insert_many(AgentExecStatus, ["execution_id", "agent_id"], [(ex.id, a) for a in targets])
            detail = (f"command_id={ex.command_id} execution_id={ex.id} plugin={plugin} action={action} "
                      f"agents={len(targets)}")
            audit(principal, "execution.start", "success", target_type="Execution", target_id=ex.id,
                  detail=detail + ("" if targets else " no_agents_reached"), correlation_id=cid)
            if targets:
                transaction.on_commit(partial(dispatch, ex))
    except Exception as exc:
        if not enqueue["tried"]:
            raise  # nothing was committed (a store fault is answered by the faces: 503 / -32603)
        audit(principal, "execution.start", "failure", target_type="Execution", target_id=ex.id,
              detail=detail + " dispatch_failed", correlation_id=cid)
        fault = store_fault(exc, what=f"dispatch of execution {ex.id}")
        if fault is not None:  # the task queue (Redis) is down: 503 / -32603 with a retry hint
            fault.message = f"dispatch refused, the execution was cancelled: {fault.message}"
            fault.extra["execution_id"] = ex.id
            raise fault from None
        raise YuzuError("dispatch failed; the execution was cancelled", status=500, rpc_code=-32603,
                        retry_after_ms=STORE_FAULT_RETRY_MS, remediation="retry shortly",
                        extra={"execution_id": ex.id}) from None
    base = {"execution_id": ex.id, "command_id": ex.command_id, "plugin": plugin, "action": action,
            "agents_reached": len(targets), **({"kill_switched_agents": held} if held else {}),
            **({"catalogue_refused_agents": refused} if refused else {})}
    if not targets:
        events.publish(ex)
        return {**base, "status": "no_agents_reached",
                "message": "No connected, unquarantined agent you may execute on matched the target; nothing was sent."}
    return {**base, "status": "running"}


def _enqueue(execution_id, sensitive):
    try:
        dispatch_execution.delay(execution_id, sensitive or None)
    except Exception as exc:
        log.exception("dispatch of execution %s failed", execution_id)
        ex = Execution.objects.get(pk=execution_id)
        # The reason is shown to readers of the execution (status_reason); the queue's own error (hosts, ports) is
        # the log's, above.
        ex.cancel(f"dispatch failed: the task queue did not take it ({type(exc).__name__})")
        events.publish(ex)
        raise


def cancel_execution(principal, execution_id, cid=""):
    ex = _execution(execution_id)
    if not _may_manage(principal, ex, "Execute"):
        raise NotFound(f"Execution not found: {execution_id}")
    cancelled, withheld = ex.cancel(f"cancelled by {principal.name}")
    audit(principal, "execution.cancel", "success" if cancelled else "failure", target_type="Execution",
          target_id=ex.id, detail=f"command_id={ex.command_id} status={ex.status} withheld={withheld}",
          correlation_id=cid)
    if cancelled:
        events.publish(ex)
    return {"execution_id": ex.id, "status": ex.status, "cancelled": bool(cancelled), "agents_withheld": withheld}


# --- reads -------------------------------------------------------------------------------------

def _execution(execution_id):
    ex = Execution.objects.filter(pk=execution_id).first() if isinstance(execution_id, str) else None
    if ex is None:
        raise NotFound(f"Execution not found: {execution_id}")
    return ex


def _may_manage(principal, ex, operation):
    """The dispatcher, or a holder of a fleet-wide Execution grant."""
    return ex.dispatched_by == principal.name or rbac.group_scope(principal, "Execution", operation) is None


def visible_executions(principal):
    """Executions the principal may read: all with a fleet-wide Execution:Read; otherwise the ones it
    dispatched and the ones whose every target lies in its Execution:Read groups (like response rows,
    confined to the caller's management groups — another group's execution, or one that spans groups,
    reads as absent)."""
    qs = Execution.objects.all()
    if rbac.group_scope(principal, "Execution", "Read") is None:
        return qs
    mine = visible_agents(principal, "Execution", "Read").values("agent_id")
    elsewhere = AgentExecStatus.objects.filter(execution=OuterRef("pk")).exclude(agent_id__in=mine)
    return qs.filter(Q(dispatched_by=principal.name) | (Q(agents_targeted__gt=0) & ~Exists(elsewhere)))


def execution_status(principal, execution_id):
    ex = visible_executions(principal).filter(pk=execution_id).first() if isinstance(execution_id, str) else None
    if ex is None:
        raise NotFound(f"Execution not found: {execution_id}")
    return ex.to_dict()


def list_executions(principal, *, definition_id=None, status=None, limit=50):
    qs = visible_executions(principal)
    if definition_id is not None:
        qs = qs.filter(definition_id=definition_id)
    if status is not None:
        qs = qs.filter(status=status)
    rows = [ex.to_dict() for ex in qs.order_by("-dispatched_at", "-id")[: max(1, min(int(limit), 500))]]
    return {"executions": rows, "count": len(rows)}


def _answer_state(status):
    """The AgentState a response ``status`` filter names (RUNNING … REJECTED, any case)."""
    name = status.upper() if isinstance(status, str) else None
    if name not in (s.name for s in Response.STATES):
        raise invalid(f"status must be one of {', '.join(s.name for s in Response.STATES)}")
    return AgentState[name]


def _responses(principal, execution_id, instruction_id):
    """(execution or None, Response queryset). The execution's status is read before any row, so a
    terminal status seen by the caller implies every row it then reads is final."""
    ex = None
    qs = Response.objects.all()
    confined = rbac.group_scope(principal, "Response", "Read") is not None
    mine = visible_agents(principal, "Response", "Read").values("agent_id")
    if execution_id:
        ex = _execution(execution_id)
        if confined and ex.dispatched_by != principal.name and not AgentExecStatus.objects.filter(
                execution_id=ex.id, agent_id__in=mine).exists():
            # None of its agents is the caller's: it reads as absent, status included (no oracle).
            raise NotFound(f"Execution not found: {execution_id}")
        qs = qs.filter(execution_id=ex.id)
    elif instruction_id:
        qs = qs.filter(instruction_id=instruction_id)
    if confined:
        qs = qs.filter(agent_id__in=mine)
    return ex, qs


def _poll_fields(ex):
    return {"execution_status": ex.status if ex else None,
            "retry_after_ms": RESULT_POLL_RETRY_MS if ex is not None and not ex.is_terminal else None}


def query_responses(principal, *, execution_id=None, instruction_id=None, agent_id=None, status=None, limit=100):
    limit = max(1, min(int(limit), 1000))
    ex, qs = _responses(principal, execution_id, instruction_id)
    if agent_id:
        qs = qs.filter(agent_id=agent_id)
    if status is not None:
        qs = qs.filter(status=_answer_state(status))
    rows = list(qs.order_by("timestamp", "id")[: limit + 1])
    responses = [r.to_dict() for r in rows[:limit]]
    return {"responses": responses, "count": len(responses), "result_truncated_by_cap": len(rows) > limit,
            **_poll_fields(ex)}


def aggregate_responses(principal, *, execution_id=None, instruction_id=None, group_by="status", aggregate="count"):
    if group_by not in GROUP_BY:
        raise invalid(f"group_by must be one of {', '.join(GROUP_BY)}")
    if aggregate != "count":
        raise invalid("aggregate must be 'count'")
    if not execution_id and not instruction_id:
        raise invalid("execution_id or instruction_id is required")
    ex, qs = _responses(principal, execution_id, instruction_id)
    rows = qs.order_by().values(group_by).annotate(count=Count("id")).order_by("-count", group_by)[:1000]
    if group_by == "status":  # equal counts in the protocol's order
        rows = sorted(rows, key=lambda r: (-r["count"], Response.STATES.index(r["status"])))
    groups = [{"key": AgentState(r[group_by]).name if group_by == "status" else r[group_by], "count": r["count"]}
              for r in rows]
    return {"group_by": group_by, "aggregate": aggregate, "groups": groups,
            "total": sum(g["count"] for g in groups), **_poll_fields(ex)}


# --- bundles: several steps on one device ------------------------------------------------------

def plan_bundle(principal, *, agent_id, steps, pinned=None):
    """The one validation of a bundle: 1-32 valid steps for one agent the caller may execute on."""
    if not isinstance(agent_id, str) or not agent_id or _nbytes(agent_id) > MAX_AGENT_ID_BYTES:
        raise invalid(f"agent_id is required (1-{MAX_AGENT_ID_BYTES} bytes)")
    if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_BUNDLE_STEPS:
        raise invalid(f"steps must be an array of 1-{MAX_BUNDLE_STEPS} steps")
    if not visible_agents(principal, "Execution", "Execute").filter(pk=agent_id).exists():
        raise NotFound(f"Agent not found: {agent_id}")
    pinned_ids = (pinned or {}).get("agents") if pinned is not None else None
    targets = _targets(principal, None, [agent_id], pinned_ids)
    orders, specs = [], []
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise invalid(f"steps[{i}] must be an object with plugin, action and optional params")
        try:
            plugin, action, params = _command(step.get("plugin"), step.get("action"), step.get("params"))
            _gated(plugin, action, targets, principal)  # the one agent held back by a group's kill switch refuses the bundle
            specs.append(_check_plugin(plugin, action, params, targets)[0] or {})  # its one agent refusing raises
        except YuzuError as exc:
            raise invalid(f"steps[{i}]: {exc.message}", exc.remediation) from None
        orders.append(Order(plugin, action, params, targets))
    risks = [s.get("risk") for s in specs if s.get("risk")]
    risk = next((r for r in ("destructive", "write", "read") if r in risks), "")
    summary = (f"Run {len(orders)} step{'s' if len(orders) != 1 else ''} on agent {agent_id}: "
               + "; ".join(f"{o.plugin}.{o.action}" for o in orders))[:1000]
    return Plan(summary=summary, value=(agent_id, orders), pins={"agents": targets}, risk=risk,
                facts={"steps": [{"plugin": f"{o.plugin}.{o.action}", "description": s.get("description") or "",
                                  "params": redact(o.params)} for o, s in zip(orders, specs, strict=True)]})


def start_bundle(principal, *, agent_id=None, steps=None, cid="", plan=None):
    agent_id, orders = (plan or plan_bundle(principal, agent_id=agent_id, steps=steps)).value
    bundle_id = f"bundle-{secrets.token_hex(8)}"
    started = [launch(principal, order, cid=cid, bundle_id=bundle_id, bundle_step=i) for i, order in enumerate(orders)]
    reached = bool(orders and orders[0].targets)
    audit(principal, "bundle.start", "success", target_type="Agent", target_id=agent_id,
          detail=f"bundle_id={bundle_id} steps={len(orders)} reached={reached}", correlation_id=cid)
    return {"bundle_id": bundle_id, "agent_id": agent_id, "expected": len(orders),
            "execution_ids": [s["execution_id"] for s in started],
            "status": "running" if reached else "no_agents_reached"}


def _bundle(principal, bundle_id, operation):
    """A bundle's executions (step order) for a caller who may ``operation`` on it; NotFound otherwise."""
    exs = list(Execution.objects.filter(bundle_id=bundle_id).order_by("bundle_step")) \
        if isinstance(bundle_id, str) and bundle_id else []
    if not exs or not _may_manage(principal, exs[0], operation):
        raise NotFound(f"Bundle not found: {bundle_id}")
    return exs


def bundle_executions(bundle_id):
    """The execution ids of a bundle, in step order (no access check: for following their events)."""
    return list(Execution.objects.filter(bundle_id=bundle_id).order_by("bundle_step").values_list("id", flat=True))


def cancel_bundle(principal, bundle_id, cid=""):
    """Cancel a bundle: every step still running stops dispatch (Execution.cancel: an agent that has not been
    sent its step never is; a step already sent runs on, and its answer is still recorded)."""
    exs = _bundle(principal, bundle_id, "Execute")
    cancelled, withheld = 0, 0
    for ex in exs:
        if ex.is_terminal:
            continue
        now, held = ex.cancel(f"bundle cancelled by {principal.name}")
        cancelled += now
        withheld += held
        if now:
            events.publish(ex)
    audit(principal, "bundle.cancel", "success" if cancelled else "failure", target_type="Bundle",
          target_id=bundle_id, detail=f"steps={len(exs)} cancelled={cancelled} withheld={withheld}",
          correlation_id=cid)
    return {"bundle_id": bundle_id, "cancelled": bool(cancelled), "steps_cancelled": cancelled,
            "agents_withheld": withheld, "execution_ids": [ex.id for ex in exs]}


def bundle_result(principal, bundle_id):
    exs = _bundle(principal, bundle_id, "Read")
    responses = {r.execution_id: r for r in Response.objects.filter(execution__in=exs)}
    agent = AgentExecStatus.objects.filter(execution__in=exs).values_list("agent_id", flat=True).first()
    steps = []
    for ex in exs:
        r = responses.get(ex.id)
        steps.append({"step": ex.bundle_step, "execution_id": ex.id, "plugin": ex.plugin, "action": ex.action,
                      "state": ex.status, "status": AgentState(r.status).name if r else None,
                      "output": r.output if r else "", "exit_code": r.exit_code if r else None,
                      "error": (r.error_detail or None) if r else None})
    complete = all(ex.is_terminal for ex in exs)
    return {"bundle_id": bundle_id, "agent_id": agent, "complete": complete,
            "received": sum(1 for s in steps if s["status"] not in (None, AgentState.RUNNING.name)),
            "succeeded": sum(1 for s in steps if s["status"] == AgentState.SUCCESS.name), "expected": len(exs), "steps": steps,
            "retry_after_ms": None if complete else RESULT_POLL_RETRY_MS}
