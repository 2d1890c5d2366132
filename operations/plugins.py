"""Plugin configuration, write-only plugin secrets and kill switches: one store (spec/operator.md §1).

Every capability is one function shared by the MCP tools (operations.mcp_tools), the REST views
(operations.api) and the admin. Each validates first (identifiers, bounds, the plugin's declared
configuration schema), audits before it mutates (a REST caller gets 503 and no write when the audit row
cannot be stored; an MCP caller proceeds with ``audit_persisted: false``), then writes and pushes the new
state to the connected agents (configuration and kill switches; secrets never leave the server)."""

import json
import logging

from django.db import DatabaseError, transaction

from fleet.catalogue import BadSchema, declaring_agents
from fleet.catalogue import first_error as declared_schema_error
from fleet.gates import EveryTargetHeld
from fleet.groups import agents_in_groups
from fleet.models import Agent, AgentInventory, ManagementGroup
from fleet.push import send_to_agent
from yuzu import rbac
from yuzu import secrets as sealed
from yuzu.audit import audit
from yuzu.errors import STORE_FAULT_SHORT_RETRY_MS, YuzuError
from yuzu.plans import Plan

from .metrics import KILL_SWITCH_REFUSALS, PLUGIN_STORE_WRITES
from .models import (
    ACTION_RE,
    KEY_RE,
    MAX_REASON,
    MAX_SECRET_BYTES,
    MAX_VALUE_BYTES,
    PLUGIN_RE,
    RESERVED_PLUGIN_RE,
    SECRET_VALUE,
    PluginConfig,
    PluginKillSwitch,
    PluginSecret,
    now_ms,
)

log = logging.getLogger("yuzu.operations")
LIST_CAP = 5000


def invalid(message, remediation=None, **extra):
    return YuzuError(message, status=400, rpc_code=-32602, remediation=remediation, extra=extra or None)


def not_found(message):
    return YuzuError(message, status=404, rpc_code=-32602, remediation="nothing was changed")


def store_fault():
    return YuzuError("plugin configuration store unavailable", status=503, rpc_code=-32603,
                     retry_after_ms=STORE_FAULT_SHORT_RETRY_MS, remediation="retry shortly")


def audit_fault():
    return YuzuError("the audit row could not be stored; nothing was changed", status=503, rpc_code=-32603,
                     retry_after_ms=STORE_FAULT_SHORT_RETRY_MS, remediation="retry shortly")


# --- validation ------------------------------------------------------------------------------------

def check_plugin(plugin, *, reserved=False):
    if not isinstance(plugin, str) or not (PLUGIN_RE.fullmatch(plugin)
                                           or (reserved and RESERVED_PLUGIN_RE.fullmatch(plugin))):
        raise invalid("plugin must match ^[a-z0-9_][a-z0-9_-]{0,63}$" + (" (or the reserved form __name__)"
                                                                         if reserved else ""))
    return plugin


def check_key(key):
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise invalid("key must match ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ (dots mark a nested path)")
    return key


def check_action(action):
    if action in (None, ""):
        return ""
    if not isinstance(action, str) or not ACTION_RE.fullmatch(action):
        raise invalid("action must match ^[a-z0-9_][a-z0-9_-]{0,63}$")
    return action


def declared_plugins():
    """{plugin: {key: [JSON Schema, …]}} from the catalogues the agents declared on register (the ``config`` of
    each plugin's actions), the plugins without configuration included with {}. Agents may declare different
    schemas for one key (versions, or a hostile agent): every distinct one is kept, ordered by its text, so
    the answer does not depend on the order the database returns the catalogues in and no agent can replace
    the schema another declared."""
    out = {}
    rows = AgentInventory.objects.filter(plugin=AgentInventory.CATALOGUE).values_list("data", flat=True)
    for catalogue in rows.distinct()[:256]:
        for name, spec in (catalogue or {}).items():
            if not isinstance(name, str) or "." not in name:
                continue
            keys = out.setdefault(name.split(".", 1)[0], {})
            config = (spec or {}).get("config") if isinstance(spec, dict) else None
            if isinstance(config, dict):
                for key, schema in config.items():
                    if isinstance(schema, dict):
                        keys.setdefault(key, {})[json.dumps(schema, sort_keys=True)] = schema
    return {plugin: {key: [schemas[text] for text in sorted(schemas)] for key, schemas in keys.items()}
            for plugin, keys in out.items()}


def declared_config(plugin):
    """{key: [every distinct JSON Schema the agents declared for it]} for ``plugin``; unknown plugin: 400."""
    plugins = declared_plugins()
    if plugin not in plugins:
        raise invalid(f"unknown plugin: {plugin} (no agent declared it)",
                      "discover_plugins lists the plugins the agents declared")
    return plugins[plugin]


def config_schema(plugin):
    """{key: JSON Schema} for ``plugin``: the schema the agents declared for a key, or, when they declared
    different ones, their ``allOf`` (what a value must satisfy)."""
    return {key: schemas[0] if len(schemas) == 1 else {"allOf": schemas}
            for key, schemas in declared_config(plugin).items()}


def _declaring(plugin, key, schema):
    """The agents that declared ``schema`` for ``plugin``.``key`` (the first three), and their names."""
    def declares(catalogue):
        return any(isinstance(spec, dict) and isinstance(spec.get("config"), dict)
                   and spec["config"].get(key) == schema
                   for name, spec in catalogue.items() if isinstance(name, str) and name.startswith(f"{plugin}."))
    agent_ids, who = declaring_agents(declares)
    return agent_ids, who or "an agent"


def check_value(plugin, key, value):
    if not isinstance(value, str):
        raise invalid("value must be a string")
    if len(value.encode(errors="surrogatepass")) > MAX_VALUE_BYTES:
        raise invalid(f"value exceeds {MAX_VALUE_BYTES} bytes")
    if "\x00" in value:
        raise invalid("value must not contain NUL characters")
    config = declared_config(plugin)
    if key not in config:
        declared = ", ".join(sorted(config)) or "none"
        raise invalid(f"plugin {plugin} declares no configuration key '{key}' (declared: {declared})",
                      "get the plugin's configuration keys from discover_plugins (config)")
    for schema in config[key]:  # every schema any agent declared for the key: none may refuse the value
        try:
            error = declared_schema_error(schema, value)
        except BadSchema as exc:
            agent_ids, who = _declaring(plugin, key, schema)
            raise YuzuError(f"the schema {who} declared for {plugin}.{key} cannot be applied: {exc}", status=409,
                            rpc_code=-32602, remediation="nothing was changed; the agent that declared it must "
                                                         "register again (a register drops unusable schemas)",
                            extra={"plugin": plugin, "key": key, "agent_ids": agent_ids}) from None
        if error is not None:
            agent_ids, who = _declaring(plugin, key, schema)
            of = f" (one of {len(config[key])} different schemas agents declared for it)" if len(config[key]) > 1 else ""
            raise invalid(f"value for {plugin}.{key} does not match the plugin's schema as {who} declared it{of}: "
                          f"{error.message}",
                          agent_ids=agent_ids, schema=schema)
    return value


def _fleet_wide(principal, securable, operation):
    """The plugin store is the whole install's: neither a grant confined to management groups nor a
    service-scoped token reaches it."""
    rbac.refuse_service_scoped(principal, securable, operation)
    if rbac.group_scope(principal, securable, operation) is not None:
        raise rbac.denial(principal, securable, operation)


def _audit_first(principal, action, target, detail, surface, cid):
    """Audit before mutate: False when the row could not be stored (REST refuses with 503 then)."""
    persisted = audit(principal, action, "success", target_type="PluginConfig", target_id=target, detail=detail,
                      correlation_id=cid)
    if not persisted and surface == "rest":
        raise audit_fault()
    return persisted


def _with_audit(out, persisted):
    return out if persisted else {**out, "audit_persisted": False}


# --- configuration ---------------------------------------------------------------------------------

def get_plugin_config(principal, plugin, key):
    _fleet_wide(principal, "PluginConfig", "Read")
    check_plugin(plugin), check_key(key)
    try:
        row = PluginConfig.objects.filter(plugin=plugin, key=key).first()
    except DatabaseError:
        raise store_fault() from None
    if row is None:
        raise not_found(f"not_found: configuration value {plugin}.{key} not found")
    return row.to_dict()


def list_plugin_config(principal, plugin=None):
    """A management-group-confined grant is denied, never filtered (spec)."""
    _fleet_wide(principal, "PluginConfig", "Read")
    qs = PluginConfig.objects.all()
    if plugin:
        qs = qs.filter(plugin=check_plugin(plugin))
    try:
        rows = list(qs.order_by("plugin", "key")[:LIST_CAP + 1])
    except DatabaseError:
        raise store_fault() from None
    return {"data": [r.to_dict() for r in rows[:LIST_CAP]], "truncated": len(rows) > LIST_CAP}


def plan_set_plugin_config(principal, plugin, key, value):
    _fleet_wide(principal, "PluginConfig", "Write")
    check_plugin(plugin), check_key(key)
    check_value(plugin, key, value)
    return Plan(summary=f"Set {plugin}.{key}", value=(plugin, key, value), risk="write")


def set_plugin_config(principal, plugin, key, value, *, cid="", surface="mcp"):
    plugin, key, value = plan_set_plugin_config(principal, plugin, key, value).value
    persisted = _audit_first(principal, "plugin_config.set", f"{plugin}.{key}",
                             f"plugin={plugin} key={key} bytes={len(value.encode())}", surface, cid)
    try:
        with transaction.atomic():
            row, _ = PluginConfig.objects.update_or_create(
                plugin=plugin, key=key, defaults={"value": value, "updated_at_ms": now_ms(),
                                                  "updated_by": principal.name})
    except DatabaseError:
        raise store_fault() from None
    PLUGIN_STORE_WRITES.labels("config_set").inc()
    push_config(plugin)
    return _with_audit(row.to_dict(), persisted)


def plan_delete_plugin_config(principal, plugin, key, pinned=None):
    _fleet_wide(principal, "PluginConfig", "Delete")
    check_plugin(plugin), check_key(key)
    if not PluginConfig.objects.filter(plugin=plugin, key=key).exists():
        audit(principal, "plugin_config.delete", "failure", target_type="PluginConfig", target_id=f"{plugin}.{key}",
              detail="not_found")
        raise not_found(f"not_found: configuration value {plugin}.{key} not found")
    return Plan(summary=f"Delete plugin configuration value {plugin}.{key}", value=(plugin, key),
                pins={"config": f"{plugin}.{key}"}, risk="destructive", facts={"plugin": plugin, "key": key})


def delete_plugin_config(principal, plugin=None, key=None, *, cid="", plan=None, surface="mcp"):
    plugin, key = (plan or plan_delete_plugin_config(principal, plugin, key)).value
    persisted = _audit_first(principal, "plugin_config.delete", f"{plugin}.{key}", f"plugin={plugin} key={key}",
                             surface, cid)
    deleted, _ = PluginConfig.objects.filter(plugin=plugin, key=key).delete()
    if not deleted:
        raise not_found(f"not_found: configuration value {plugin}.{key} not found")
    PLUGIN_STORE_WRITES.labels("config_delete").inc()
    push_config(plugin)
    return _with_audit({"deleted": True}, persisted)


# --- secrets (write-only) --------------------------------------------------------------------------

def plan_set_plugin_secret(principal, plugin, key, value):
    _fleet_wide(principal, "PluginSecret", "Write")
    check_plugin(plugin), check_key(key)
    config_schema(plugin)  # the plugin must be one an agent declared
    if not isinstance(value, str) or not value:
        raise invalid("value must be a non-empty string")
    if len(value.encode(errors="surrogatepass")) > MAX_SECRET_BYTES:
        raise invalid(f"value exceeds {MAX_SECRET_BYTES} bytes")
    if "\x00" in value:
        raise invalid("value must not contain NUL characters")
    return Plan(summary=f"Store secret {plugin}.{key}", value=(plugin, key, value), risk="write")


def set_plugin_secret(principal, plugin, key, value, *, cid="", surface="mcp"):
    """Seals the value under a fresh data key bound to this row; returns metadata only."""
    plugin, key, value = plan_set_plugin_secret(principal, plugin, key, value).value
    scope_key = f"{plugin}.{key}"
    persisted = _audit_first(principal, "plugin_secret.set", scope_key, f"plugin={plugin} key={key}", surface, cid)
    try:
        blob = sealed.seal(value, SECRET_VALUE.where(scope_key))
        with transaction.atomic():
            row, _ = PluginSecret.objects.update_or_create(
                scope_key=scope_key, defaults={"plugin": plugin, "key": key, "sealed_value": blob,
                                               "updated_at_ms": now_ms(), "updated_by": principal.name})
    except (DatabaseError, sealed.SecretError) as exc:
        log.error("plugin secret %s not stored: %s", scope_key, type(exc).__name__)
        raise store_fault() from None
    PLUGIN_STORE_WRITES.labels("secret_set").inc()
    return _with_audit(row.to_dict(), persisted)


def plan_delete_plugin_secret(principal, plugin, key, pinned=None):
    _fleet_wide(principal, "PluginSecret", "Delete")
    check_plugin(plugin), check_key(key)
    scope_key = f"{plugin}.{key}"
    if not PluginSecret.objects.filter(pk=scope_key).exists():
        audit(principal, "plugin_secret.delete", "failure", target_type="PluginSecret", target_id=scope_key,
              detail="not_found")
        raise not_found(f"not_found: secret {scope_key} not found")
    return Plan(summary=f"Delete plugin secret {scope_key}", value=(plugin, key), pins={"secret": scope_key},
                risk="destructive", facts={"plugin": plugin, "key": key})


def delete_plugin_secret(principal, plugin=None, key=None, *, cid="", plan=None, surface="mcp"):
    plugin, key = (plan or plan_delete_plugin_secret(principal, plugin, key)).value
    scope_key = f"{plugin}.{key}"
    persisted = _audit_first(principal, "plugin_secret.delete", scope_key, f"plugin={plugin} key={key}", surface,
                             cid)
    deleted, _ = PluginSecret.objects.filter(pk=scope_key).delete()
    if not deleted:
        raise not_found(f"not_found: secret {scope_key} not found")
    PLUGIN_STORE_WRITES.labels("secret_delete").inc()
    return _with_audit({"deleted": True}, persisted)


# --- kill switches ---------------------------------------------------------------------------------

def _switch_view(plugin, action, group, row):
    if row is None:
        return {"plugin": plugin, "action": action, "group": group.pk if group else "", "enabled": True}
    return row.to_dict()


def _switch_scope(principal, group_ref, operation):
    """None for a fleet-wide switch (a fleet-wide PluginConfig grant), else the management group (by id or exact
    name) the caller holds PluginConfig:<operation> on, directly or through an ancestor; another reads as absent."""
    if group_ref in (None, ""):
        _fleet_wide(principal, "PluginConfig", operation)
        return None
    rbac.refuse_service_scoped(principal, "PluginConfig", operation)  # a group is not a service
    if not isinstance(group_ref, str) or len(group_ref) > 256:
        raise invalid("group must be a management group id or name", "list_management_groups gives them")
    group = (ManagementGroup.objects.filter(pk=group_ref).first()
             or ManagementGroup.objects.filter(name=group_ref).first())
    if group is None or not rbac.may(principal, "PluginConfig", operation, group=group):
        raise YuzuError(f"not_found: management group {group_ref[:64]} not found", status=404, rpc_code=-32602,
                        remediation="list_management_groups gives the groups you can reach")
    return group


def get_plugin_kill_switch(principal, plugin, action="", group=""):
    """The display view: a store error is an error here, not 'disabled'."""
    check_plugin(plugin, reserved=True)
    action = check_action(action)
    scope = _switch_scope(principal, group, "Read")
    try:
        row = PluginKillSwitch.objects.filter(pk=PluginKillSwitch.key_of(plugin, action, scope and scope.pk)).first()
    except DatabaseError:
        raise store_fault() from None
    return _switch_view(plugin, action, scope, row)


def plan_set_plugin_kill_switch(principal, plugin, enabled, action="", reason="", group=""):
    check_plugin(plugin, reserved=True)
    action = check_action(action)
    if not isinstance(enabled, bool):
        raise invalid("enabled must be true or false")
    if not isinstance(reason, str) or len(reason) > MAX_REASON or "\x00" in reason:
        raise invalid(f"reason must be text of at most {MAX_REASON} characters")
    scope = _switch_scope(principal, group, "Write")
    where = f" in group {scope.name}" if scope else " fleet-wide"
    return Plan(summary=f"{'Enable' if enabled else 'Kill'} {PluginKillSwitch.key_of(plugin, action)}{where}",
                value=(plugin, action, enabled, reason, scope), risk="write")


def set_plugin_kill_switch(principal, plugin, enabled, action="", reason="", group="", *, cid="", surface="mcp"):
    plugin, action, enabled, reason, scope = plan_set_plugin_kill_switch(principal, plugin, enabled, action, reason,
                                                                         group).value
    scope_key = PluginKillSwitch.key_of(plugin, action, scope and scope.pk)
    persisted = _audit_first(principal, "plugin_kill_switch.set", scope_key,
                             f"plugin={plugin} action={action} group={scope.pk if scope else ''} enabled={enabled} "
                             f"reason={reason}", surface, cid)
    try:
        with transaction.atomic():
            row, _ = PluginKillSwitch.objects.update_or_create(
                scope_key=scope_key, defaults={"plugin": plugin, "action": action, "group": scope, "enabled": enabled,
                                               "reason": reason, "set_by": principal.name, "updated_at_ms": now_ms()})
    except DatabaseError:
        raise store_fault() from None
    PLUGIN_STORE_WRITES.labels("kill_switch_set").inc()
    push_kill_switches()
    return _with_audit(row.to_dict(), persisted)


def _off(rows, plugin, action):
    """The row of one scope (its rows by switch) that switches plugin.action off, or None: the action's row wins
    over the plugin's; no row means on."""
    row = rows.get(PluginKillSwitch.key_of(plugin, action)) or rows.get(plugin)
    return row if row is not None and not row.enabled else None


def _why(row, principal=None):
    """Why a switch holds a dispatch, said to ``principal``: a group's switch is named (group, who, reason) only to
    one who may read that group's switches — to anyone else another group's reads as absent."""
    if row.group_id and principal is not None and not rbac.may(principal, "PluginConfig", "Read", group=row.group_id):
        return f"{row.switch} is switched off by the kill switch of a management group the agent is in"
    where = f" in group {row.group.name}" if row.group_id else ""
    return f"{row.switch} is switched off{where} by {row.set_by}" + (f": {row.reason}" if row.reason else "")


def _scopes(plugin):
    """{group id or None: {switch: row}} for one plugin's switches."""
    scopes = {}
    for row in PluginKillSwitch.objects.filter(plugin=plugin).select_related("group"):
        scopes.setdefault(row.group_id, {})[row.switch] = row
    return scopes


def _held(scopes, plugin, action, targets, principal=None):
    """{agent_id: why} for the targets a group's switch holds back (the group's agents and its subgroups')."""
    held = {}
    if not targets:
        return held
    for gid, rows in scopes.items():
        row = gid is not None and _off(rows, plugin, action)
        if row:
            for agent_id in agents_in_groups([gid]).filter(pk__in=targets).values_list("agent_id", flat=True):
                held.setdefault(agent_id, _why(row, principal))
    return held


def _refuse(plugin, action, why, held=None):
    """Refuse the dispatch: a switch off fleet-wide, or (``held``) group switches holding back every target."""
    KILL_SWITCH_REFUSALS.inc()
    options = {"status": 403, "rpc_code": -32602, "remediation": "set_plugin_kill_switch with enabled=true turns it "
               "back on", "extra": {"reason": "kill_switched"}, "audit_result": "denied"}
    message = f"kill_switched: {plugin}.{action} refused: {why}"
    raise YuzuError(message, **options) if held is None else EveryTargetHeld(message, held, **options)


def dispatch_gate(plugin, action, targets=(), principal=None):
    """fleet.gates' hook (a command's plan, its launch, and each batch of its background dispatch): refuse a dispatch
    to a plugin or action switched off fleet-wide, or one whose every target a group's switch holds back
    (EveryTargetHeld); otherwise return the targets held back ({agent_id: why}), which are left out of the dispatch."""
    try:  # one query for the plugin's switches, whatever their scope
        scopes = _scopes(plugin)
        off = _off(scopes.get(None, {}), plugin, action)
        held = {} if off else _held(scopes, plugin, action, targets, principal)
    except DatabaseError:  # fail closed, and say what it is: a store fault (503 / -32603, retry), not a switch
        raise store_fault() from None
    if off:
        _refuse(plugin, action, _why(off))
    if targets and len(held) == len(set(targets)):
        _refuse(plugin, action, next(iter(held.values())) + (f" (all {len(held)} targets)" if len(held) > 1 else ""),
                held)
    return held


# --- delivery to agents ----------------------------------------------------------------------------

def config_message(plugin):
    values = dict(PluginConfig.objects.filter(plugin=plugin).values_list("key", "value"))
    return {"type": "plugin.config", "plugin": plugin, "config": values}


def _effective(scopes):
    """One agent's switches as the flat list the agent applies (plugin rows and action rows, the action's row
    winning): the switches of every scope that reaches it (fleet-wide, and each group it is in) combined — a
    plugin or action is off when any of those scopes switches it off."""
    switches = {}
    for rows in scopes:
        for row in rows.values():
            switches.setdefault(row.plugin, set()).add(row.action)
    out = []
    for plugin in sorted(switches):
        for action in sorted(switches[plugin]):
            off = next((row for rows in scopes if (row := _off(rows, plugin, action))), None)
            out.append({"plugin": plugin, "action": action, "enabled": off is None,
                        "reason": _why(off) if off else ""})
    return out


def kill_messages(agent_ids):
    """{agent_id: plugin.kill frame} for the given agents: fleet-wide switches plus their groups'."""
    fleet, by_group = {}, {}
    for row in PluginKillSwitch.objects.select_related("group"):
        (fleet if row.group_id is None else by_group.setdefault(row.group_id, {}))[row.switch] = row
    member_of = {}
    for gid in by_group:
        for agent_id in agents_in_groups([gid]).filter(pk__in=agent_ids).values_list("agent_id", flat=True):
            member_of.setdefault(agent_id, []).append(gid)
    frames, memo = {}, {}
    for agent_id in agent_ids:
        groups = tuple(sorted(member_of.get(agent_id, ())))
        if groups not in memo:
            memo[groups] = {"type": "plugin.kill", "switches": _effective([fleet] + [by_group[g] for g in groups])}
        frames[agent_id] = memo[groups]
    return frames


def _connected():
    return list(Agent.objects.filter(connected=True).values_list("agent_id", flat=True))


def _push(payload):
    """Send one push frame to every connected agent."""
    message = {"type": "agent.push", "payload": payload}
    for agent_id in _connected():
        send_to_agent(agent_id, message)


def push_config(plugin):
    _push(config_message(plugin))


def push_kill_switches():
    """Each connected agent gets the switches that reach it."""
    for agent_id, frame in kill_messages(_connected()).items():
        send_to_agent(agent_id, {"type": "agent.push", "payload": frame})


def sync_agent(agent_id):
    """On connect: the whole configuration (one frame per plugin) and every kill switch that reaches it — nothing
    when the store is empty (a fresh agent starts with no configuration and every plugin on)."""
    for plugin in PluginConfig.objects.values_list("plugin", flat=True).distinct():
        send_to_agent(agent_id, {"type": "agent.push", "payload": config_message(plugin)})
    if PluginKillSwitch.objects.exists():
        send_to_agent(agent_id, {"type": "agent.push", "payload": kill_messages([agent_id])[agent_id]})


def catalogue_json(plugin):
    return json.dumps(config_schema(plugin), sort_keys=True)
