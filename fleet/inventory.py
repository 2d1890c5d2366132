"""Inventory, plugin and instruction-definition reads, scope tools, and quarantine: service functions
shared by the REST views and the MCP tools."""

from django.db import transaction
from django.db.models import Count

from yuzu import rbac
from yuzu.audit import audit
from yuzu.errors import STORE_FAULT_RETRY_MS, NotFound, YuzuError
from yuzu.plans import Plan

from .catalogue import RISKS
from .executions import CatalogueRefusal, launch, plan_execution
from .models import Agent, AgentInventory, InstructionDefinition
from .scope import ScopeError, describe, to_q, validate
from .services import agent_view, visible_agents

INVENTORY_CAP = 1000
RISK_RANK = {risk: i for i, risk in enumerate(RISKS)}


def _iso(dt):
    return dt.isoformat() if dt else None


def query_inventory(principal, *, agent_id=None, plugin=None, limit=100):
    qs = AgentInventory.objects.filter(agent__in=visible_agents(principal)).exclude(plugin=AgentInventory.CATALOGUE)
    if agent_id:
        qs = qs.filter(agent_id=agent_id)
    if plugin:
        qs = qs.filter(plugin=plugin)
    limit = max(1, min(int(limit), INVENTORY_CAP))
    rows = list(qs.order_by("agent_id", "plugin")[: limit + 1])
    return {"rows": [{"agent_id": r.agent_id, "plugin": r.plugin, "data": r.data, "collected_at": _iso(r.collected_at)}
                     for r in rows[:limit]], "count": min(len(rows), limit), "result_truncated_by_cap": len(rows) > limit}


def list_inventory_tables(principal):
    rows = (AgentInventory.objects.filter(agent__in=visible_agents(principal)).exclude(plugin=AgentInventory.CATALOGUE)
            .values("plugin").annotate(agents=Count("agent", distinct=True)).order_by("plugin"))
    return {"tables": [{"plugin": r["plugin"], "agents": r["agents"]} for r in rows]}


def agent_inventory(principal, agent_id):
    if not visible_agents(principal).filter(pk=agent_id).exists():
        raise NotFound(f"Agent not found: {agent_id}")
    rows = list(AgentInventory.objects.filter(agent_id=agent_id).exclude(plugin=AgentInventory.CATALOGUE)
                .order_by("plugin")[: INVENTORY_CAP + 1])
    return {"agent_id": agent_id, "inventory": {r.plugin: r.data for r in rows[:INVENTORY_CAP]},
            "result_truncated_by_cap": len(rows) > INVENTORY_CAP}


def discover_plugins(principal):
    """The plugin/action catalogue the connected agents reported; schemas need InstructionDefinition:Read."""
    with_schemas = rbac.has_any(principal, "InstructionDefinition", "Read")
    catalogue = {}
    rows = AgentInventory.objects.filter(plugin=AgentInventory.CATALOGUE, agent__in=visible_agents(principal))
    for row in rows.values_list("data", flat=True):
        for name, spec in (row or {}).items():
            entry = catalogue.setdefault(name, {"name": name, "risk": None, "agents": 0})
            entry["agents"] += 1
            risk = (spec or {}).get("risk") if isinstance(spec, dict) else None
            if entry["risk"] is None or RISK_RANK.get(risk, len(RISKS)) > RISK_RANK.get(entry["risk"], len(RISKS)):
                entry["risk"] = risk  # the highest any agent declares: one cannot lower it for the rest
            if with_schemas and "params" in (spec or {}):
                entry["params"] = spec["params"]
    return {"plugins": sorted(catalogue.values(), key=lambda e: e["name"]), "schemas_included": with_schemas}


def definition_view(d, full=False):
    data = {"id": d.id, "name": d.name, "version": d.version, "type": d.type, "plugin": d.plugin, "action": d.action,
            "description": d.description, "enabled": d.enabled, "approval_mode": d.approval_mode}
    if full:
        data.update(parameter_schema=d.parameter_schema, result_schema=d.result_schema, platforms=d.platforms,
                    instruction_set_id=d.instruction_set_id, yaml_source=d.yaml_source)
    return data


def list_definitions(principal, *, plugin=None, type=None, enabled=None):
    qs = InstructionDefinition.objects.all()
    if plugin:
        qs = qs.filter(plugin=plugin)
    if type:
        qs = qs.filter(type=type)
    if enabled is not None:
        qs = qs.filter(enabled=enabled)
    rows = [definition_view(d) for d in qs]
    return {"definitions": rows, "count": len(rows)}


def get_definition(principal, definition_id):
    d = InstructionDefinition.objects.filter(pk=definition_id).first()
    if d is None:
        raise NotFound(f"Definition not found: {definition_id}")
    return definition_view(d, full=True)


def discover_instructions(principal):
    rows = [{**definition_view(d), "parameter_schema": d.parameter_schema}
            for d in InstructionDefinition.objects.filter(enabled=True)]
    return {"instructions": rows, "count": len(rows)}


def scope_argument(args):
    """The scope expression of a scope tool's arguments: ``scope`` (the name execute_instruction uses) or its
    older alias ``expression``; both only if they agree."""
    scope, expression = args.get("scope"), args.get("expression")
    if scope is not None and expression is not None and scope != expression:
        raise YuzuError("pass scope or expression (the same argument by its older name), not two different ones",
                        status=400, rpc_code=-32602)
    value = scope if scope is not None else expression
    if not isinstance(value, str) or not value:
        raise YuzuError("scope is required", status=400, rpc_code=-32602)
    return value


def validate_scope(expression):
    return validate(expression)


def preview_scope_targets(principal, expression, limit=100):
    try:
        qs = visible_agents(principal).filter(to_q(expression)).distinct()
    except ScopeError as exc:
        raise YuzuError(f"invalid scope expression: {exc}", status=400, rpc_code=-32602,
                        extra={"position": exc.position}) from None
    total = qs.count()
    return {"expression": expression, "total": total, "agents": [agent_view(a) for a in qs.order_by("agent_id")[:limit]],
            "result_truncated_by_cap": total > limit}


def describe_scope():
    return describe()


def plan_quarantine(principal, agent_id, *, reason="", whitelist="", pinned=None):
    """The one validation of a quarantine: an agent the caller may quarantine, and the quarantine.quarantine
    command for it. The record (the agent withheld from every later dispatch) is the server's and does not
    depend on what the agent declared: when its catalogue refuses the command (no such action, a schema that
    refuses the allow-list or cannot be applied) the plan is to record without sending, and says why
    (``command_refused``). Pins the agent; an agent already quarantined pins nothing (there is nothing to do)."""
    agent = Agent.objects.filter(pk=agent_id).first()
    if agent is None or not rbac.may(principal, "Security", "Execute", agent=agent) or (
            pinned is not None and agent_id not in ((pinned or {}).get("agents") or [])):
        raise NotFound(f"Agent not found: {agent_id}")
    order, refused = None, None
    if not agent.quarantined:
        try:
            order = plan_execution(principal, plugin="quarantine", action="quarantine", params={"allow": whitelist},
                                   agent_ids=[agent_id]).value
        except CatalogueRefusal as exc:  # the agent's own declaration may not veto its quarantine
            refused = exc.message[:1024]
    where = f"{agent.hostname or agent_id} ({agent_id})"
    summary = (f"Quarantine {where}: cut it off the network except the yuzu server, DNS"
               + (f" and {whitelist}" if whitelist else "") + (f" — reason: {reason[:200]}" if reason else "")
               + (f" — its catalogue refuses quarantine.quarantine, so only the server's record is made: "
                  f"{refused[:300]}" if refused else ""))
    return Plan(summary=summary, value=(agent, reason, order, refused), risk="destructive",
                pins={"agents": [] if agent.quarantined else [agent_id]},
                facts={"plugin": "quarantine.quarantine", "reason": reason, "allow": whitelist,
                       "connected": agent.connected, "command_refused": refused})


def quarantine_device(principal, agent_id=None, *, reason="", whitelist="", cid="", plan=None):
    """Record the quarantine, then dispatch quarantine.quarantine to the device (the agent applies it only
    where its operator enabled enforcement). The record does not depend on the command: it is kept when the
    agent's catalogue refuses the command (not sent; ``command_refused`` says why), when the agent cannot be
    reached (a retryable error) and when the dispatch fails."""
    plan = plan or plan_quarantine(principal, agent_id, reason=reason, whitelist=whitelist)
    agent, reason, order, refused = plan.value
    agent_id = agent.agent_id
    if agent.quarantined:
        return {"agent_id": agent_id, "quarantined": True, "already_quarantined": True, "execution_id": None,
                "command_id": None}
    # The agent's plugin takes only the allow-list; the reason stays in the server's record.
    with transaction.atomic():
        Agent.objects.filter(pk=agent_id).update(quarantined=True, quarantine_reason=reason[:1024])
    if order is None:
        audit(principal, "device.quarantine", "success", target_type="Agent", target_id=agent_id,
              detail=f"command_sent=false refused={refused[:512]}", correlation_id=cid)
        return {"agent_id": agent_id, "quarantined": True, "already_quarantined": False, "execution_id": None,
                "command_id": None, "command_sent": False, "command_refused": refused}
    try:
        dispatched = launch(principal, order, cid=cid)
    except YuzuError as exc:
        audit(principal, "device.quarantine", "failure", target_type="Agent", target_id=agent_id,
              detail=f"recorded; command not dispatched: {exc.message[:512]}", correlation_id=cid)
        raise
    reached = bool(dispatched.get("agents_reached"))
    audit(principal, "device.quarantine", "success" if reached else "failure", target_type="Agent", target_id=agent_id,
          detail=f"reached={reached} execution_id={dispatched.get('execution_id')}", correlation_id=cid)
    if not reached:
        raise YuzuError("the quarantine is recorded but the agent could not be reached; it is withheld from "
                        "dispatch until released", status=503, rpc_code=-32603, retry_after_ms=STORE_FAULT_RETRY_MS,
                        remediation="check the agent is connected; the record stays in place")
    return {"agent_id": agent_id, "quarantined": True, "already_quarantined": False, "command_sent": True,
            "execution_id": dispatched["execution_id"], "command_id": dispatched["command_id"]}
