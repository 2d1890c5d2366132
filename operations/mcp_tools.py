"""The operator surface's MCP tools (spec/operator.md): thin handlers over operations.plugins, .uploads,
.schedules and .inventory, which the REST views (operations.api) call too."""

from mcp.registry import tool
from mcp.schema import APPROVAL_ID, array, boolean, enum, integer, obj, string

from . import inventory, plugins, schedules, uploads
from .models import DetectedLicense, UploadGrant

PLUGIN = string(64, "Plugin name, e.g. process", minLength=1, pattern="^[a-z0-9_][a-z0-9_-]{0,63}$")
SWITCH_PLUGIN = string(68, "Plugin name, or a reserved __name__", minLength=1,
                       pattern="^([a-z0-9_][a-z0-9_-]{0,63}|__[a-z0-9_]{1,64}__)$")
KEY = string(128, "Configuration key; dots mark a nested path (smtp.host)", minLength=1,
             pattern="^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
ACTION = string(64, "One action of the plugin (empty or absent: the whole plugin)", pattern="^([a-z0-9_][a-z0-9_-]{0,63})?$")
CONFIG_ROW = obj({"plugin": string(64), "key": string(128), "value": string(8192), "updated_at_ms": integer(),
                  "updated_by": string(150), "audit_persisted": boolean()},
                 ["plugin", "key", "value", "updated_at_ms", "updated_by"])
SECRET_META = obj({"plugin": string(64), "key": string(128), "updated_at_ms": integer(), "updated_by": string(150),
                   "audit_persisted": boolean()}, ["plugin", "key", "updated_at_ms", "updated_by"])
GROUP = string(256, "A management group id or name: the switch then applies to that group's agents (and its "
                   "subgroups') only. Empty or absent: fleet-wide", pattern="^[^\\x00]*$")
SWITCH = obj({"plugin": string(68), "action": string(64), "group": string(32), "enabled": boolean(),
              "reason": string(512),
              "set_by": string(150), "updated_at_ms": integer(), "audit_persisted": boolean()},
             ["plugin", "action", "enabled"])
DELETED = obj({"deleted": boolean(), "audit_persisted": boolean()}, ["deleted"])


# --- plugin configuration, secrets, kill switches ---------------------------------------------------

@tool(name="get_plugin_config", title="Get a plugin configuration value", securable="PluginConfig", operation="Read",
      description="Read one plugin configuration value. A key that is not set answers -32602 not_found. Needs a "
                  "fleet-wide PluginConfig:Read.",
      input_schema=obj({"plugin": PLUGIN, "key": KEY}, ["plugin", "key"]), output_schema=CONFIG_ROW)
def get_plugin_config(ctx, args):
    return plugins.get_plugin_config(ctx.principal, args["plugin"], args["key"])


@tool(name="list_plugin_config", title="List plugin configuration", securable="PluginConfig", operation="Read",
      description="List plugin configuration values, optionally for one plugin. An empty data list means nothing "
                  "is configured (for that plugin); truncated is true past 5000 rows. A grant confined to "
                  "management groups is refused (-32003): the configuration is fleet-wide.",
      input_schema=obj({"plugin": PLUGIN}),
      output_schema=obj({"data": array(CONFIG_ROW), "truncated": boolean()}, ["data", "truncated"]))
def list_plugin_config(ctx, args):
    return plugins.list_plugin_config(ctx.principal, args.get("plugin"))


@tool(name="set_plugin_config", title="Set a plugin configuration value", securable="PluginConfig",
      operation="Write", effect="destructive", idempotent=True,
      description="Create or overwrite one plugin configuration value. The value is checked against the schema the "
                  "plugin declares for that key (discover_plugins); unknown plugins and undeclared keys are refused "
                  "(-32602). Connected agents receive and apply it at once, without a restart.",
      input_schema=obj({"plugin": PLUGIN, "key": KEY, "value": string(8192, "The value (text, no NUL)")},
                       ["plugin", "key", "value"]), output_schema=CONFIG_ROW)
def set_plugin_config(ctx, args):
    return plugins.set_plugin_config(ctx.principal, args["plugin"], args["key"], args["value"], cid=ctx.cid)


@tool(name="delete_plugin_config", title="Delete a plugin configuration value", securable="PluginConfig",
      operation="Delete", effect="destructive", idempotent=True,
      prepare=lambda ctx, a, pinned=None: plugins.plan_delete_plugin_config(ctx.principal, a["plugin"], a["key"],
                                                                            pinned),
      description="Delete one plugin configuration value; needs approval. A key that is not set answers -32602 "
                  "not_found (never a silent success). Approval-gated on the supervised tier.",
      input_schema=obj({"plugin": PLUGIN, "key": KEY, "approval_id": APPROVAL_ID}, ["plugin", "key"]),
      output_schema=DELETED)
def delete_plugin_config(ctx, args):
    return plugins.delete_plugin_config(ctx.principal, cid=ctx.cid, plan=ctx.plan)


@tool(name="set_plugin_secret", title="Store a plugin secret", securable="PluginSecret", operation="Write",
      effect="destructive", idempotent=True,
      description="Store a plugin secret encrypted at rest; write-only, never readable back. Answers metadata only "
                  "(plugin, key, updated_at_ms, updated_by); the value is never echoed, logged or audited. Secrets "
                  "stay on the server (they are not delivered to agents).",
      input_schema=obj({"plugin": PLUGIN, "key": KEY, "value": string(65536, "The secret", minLength=1)},
                       ["plugin", "key", "value"]), output_schema=SECRET_META)
def set_plugin_secret(ctx, args):
    return plugins.set_plugin_secret(ctx.principal, args["plugin"], args["key"], args["value"], cid=ctx.cid)


@tool(name="delete_plugin_secret", title="Delete a plugin secret", securable="PluginSecret", operation="Delete",
      effect="destructive", idempotent=True,
      prepare=lambda ctx, a, pinned=None: plugins.plan_delete_plugin_secret(ctx.principal, a["plugin"], a["key"],
                                                                            pinned),
      description="Delete a stored plugin secret; needs approval. An absent secret answers -32602 not_found (the "
                  "attempt is still audited). Approval-gated on the supervised tier.",
      input_schema=obj({"plugin": PLUGIN, "key": KEY, "approval_id": APPROVAL_ID}, ["plugin", "key"]),
      output_schema=DELETED)
def delete_plugin_secret(ctx, args):
    return plugins.delete_plugin_secret(ctx.principal, cid=ctx.cid, plan=ctx.plan)


@tool(name="get_plugin_kill_switch", title="Show a plugin kill switch", securable="PluginConfig", operation="Read",
      description="Show whether a plugin or one plugin action is switched off, and why: fleet-wide, or with "
                  "`group` that group's own switch (a fleet-wide switch is not repeated there). enabled=true with "
                  "no set_by means nobody ever flipped it. action \"\" is the whole plugin.",
      input_schema=obj({"plugin": SWITCH_PLUGIN, "action": ACTION, "group": GROUP}, ["plugin"]), output_schema=SWITCH)
def get_plugin_kill_switch(ctx, args):
    return plugins.get_plugin_kill_switch(ctx.principal, args["plugin"], args.get("action", ""), args.get("group", ""))


@tool(name="set_plugin_kill_switch", title="Flip a plugin kill switch", securable="PluginConfig", operation="Write",
      effect="destructive", idempotent=True,
      description="Switch a plugin or a single plugin action off (or back on) fleet-wide, or with `group` for one "
                  "management group's agents (needs PluginConfig:Write on that group; fleet-wide needs it "
                  "fleet-wide). While off, every dispatch to it is refused (reason kill_switched) — a group's switch "
                  "leaves its agents out of a wider dispatch (kill_switched_agents counts them) and refuses one that "
                  "reaches only them — and the affected connected agents stop running it at once.",
      input_schema=obj({"plugin": SWITCH_PLUGIN, "enabled": boolean("false switches it off"), "action": ACTION,
                        "group": GROUP, "reason": string(512, "Why (shown to whoever is refused)")},
                       ["plugin", "enabled"]),
      output_schema=SWITCH)
def set_plugin_kill_switch(ctx, args):
    return plugins.set_plugin_kill_switch(ctx.principal, args["plugin"], args["enabled"], args.get("action", ""),
                                          args.get("reason", ""), args.get("group", ""), cid=ctx.cid)


# --- upload grants -------------------------------------------------------------------------------------

GRANT = obj({"grant_id": string(32), "agent_id": string(256), "source_path": string(4096),
             "declared_max_size": integer(), "expected_sha256": string(64),
             "retention_class": enum(UploadGrant.RETENTION), "destination_key": string(64),
             "state": enum(UploadGrant.State.values), "minted_by": string(150), "created_at": string(40),
             "expires_at": string(40)}, additional=True)


@tool(name="mint_upload_grant", title="Mint an upload grant", securable="UploadGrant", operation="Write",
      effect="additive", idempotent=False,
      description="Create a one-time credential that lets one agent upload one file to the server. grant_secret is "
                  "shown once; pass grant_id and grant_secret to the agent action content_dist.upload_file "
                  "(execute_instruction). The grant expires after ttl_secs (at most and by default 900). An unknown "
                  "agent is refused (-32602).",
      input_schema=obj({"agent_id": string(256, "The agent that will upload", minLength=1),
                        "declared_max_size": integer(1, 2**40, "Largest file accepted, bytes"),
                        "source_path": string(4096, "Informational: the file's path on the device"),
                        "expected_sha256": string(64, "If given, the upload must hash to this",
                                                  pattern="^([0-9a-f]{64})?$"),
                        "retention_class": enum(UploadGrant.RETENTION, "default standard"),
                        "ttl_secs": integer(1, 86400, "Lifetime; clamped to 900")},
                       ["agent_id", "declared_max_size"]),
      output_schema=obj({"grant_id": string(32), "grant_secret": string(64), "expires_at": string(40),
                         "destination_key": string(64)}, ["grant_id", "grant_secret", "expires_at", "destination_key"]))
def mint_upload_grant(ctx, args):
    return uploads.mint_upload_grant(ctx.principal, cid=ctx.cid, **args)


@tool(name="list_upload_grants", title="List upload grants", securable="UploadGrant", operation="Read",
      description="List upload grants and their state (no secrets). An empty list means none were minted (or none "
                  "for agents you may see).",
      input_schema=obj({}), output_schema=obj({"data": array(GRANT)}, ["data"]))
def list_upload_grants(ctx, args):
    return uploads.list_upload_grants(ctx.principal)


@tool(name="revoke_upload_grant", title="Revoke an upload grant", securable="UploadGrant", operation="Delete",
      effect="destructive", idempotent=False,
      prepare=lambda ctx, a, pinned=None: uploads.plan_revoke(ctx.principal, a["grant_id"], pinned),
      description="Cancel an unredeemed upload grant; needs approval. A grant already redeemed or revoked, or "
                  "unknown, answers -32602 not_found; an upload already under way is unaffected.",
      input_schema=obj({"grant_id": string(64, "The grant", minLength=1, pattern="^[a-f0-9]+$"),
                        "approval_id": APPROVAL_ID}, ["grant_id"]),
      output_schema=obj({"revoked": boolean()}, ["revoked"]))
def revoke_upload_grant(ctx, args):
    return uploads.revoke_upload_grant(ctx.principal, cid=ctx.cid, plan=ctx.plan)


# --- schedules -----------------------------------------------------------------------------------------

@tool(name="list_schedules", title="List instruction schedules", securable="Schedule", operation="Read",
      description="List scheduled recurring instructions with their frequency, enabled state and next run time. "
                  "An empty list means no schedule exists. Created and changed over REST and in the admin.",
      input_schema=obj({}),
      output_schema=obj({"schedules": array(obj({"id": integer(), "name": string(200), "definition_id": string(128),
                                                 "frequency_type": string(16), "enabled": boolean(),
                                                 "next_execution_at": {"type": ["string", "null"]}},
                                                additional=True))}, ["schedules"]))
def list_schedules(ctx, args):
    return schedules.list_schedules(ctx.principal)


# --- software inventory and licences -------------------------------------------------------------------

SOFTWARE = obj({"agent_id": string(64), "name": string(256), "version": string(128), "publisher": string(256),
                "install_date": string(32), "source": string(16)}, additional=True)


@tool(name="query_installed_software", title="Query installed software", securable="Inventory", operation="Read",
      service_scope="confined",
      description="Find installed software packages across devices by exact name and/or device (the agents' daily "
                  "dpkg/rpm/pip/npm inventory). version + version_op (lt, le, eq, ge, gt, ne) compare versions the "
                  "way dpkg does; counts=true adds devices per version. Empty software means no visible device "
                  "reported a match; devices_omitted counts devices outside your management groups (or outside a "
                  "service-scoped token's service).",
      input_schema=obj({"name": string(256, "Exact package name"), "agent_id": string(64, "Exact agent id"),
                        "version": string(128, "Compare with version_op"),
                        "version_op": enum(tuple(inventory.COMPARATORS), "How to compare with version"),
                        "source": enum(inventory.SOURCES), "counts": boolean("Add counts per version"),
                        "limit": integer(1, 1000, "Rows (default 100)")}),
      output_schema=obj({"software": array(SOFTWARE), "count": integer(), "devices_omitted": integer(),
                         "result_truncated_by_cap": boolean(), "audit_persisted": boolean(),
                         "versions": array(obj({"name": string(256), "version": string(128), "devices": integer()}))},
                        ["software", "count"]))
def query_installed_software(ctx, args):
    return inventory.query_installed_software(
        ctx.principal, name=args.get("name"), agent_id=args.get("agent_id"), version=args.get("version"),
        version_op=args.get("version_op"), source=args.get("source"), limit=args.get("limit", 100),
        counts=args.get("counts", False), cid=ctx.cid)


LICENSE = obj({"product": string(256), "vendor": string(256), "version": string(128),
               "license_type": enum(DetectedLicense.TYPES), "state": enum(DetectedLicense.STATES),
               "expiry_at": integer(), "channel": string(64), "key_hint": string(32),
               "detector": enum(DetectedLicense.DETECTORS), "confidence": enum(DetectedLicense.CONFIDENCES),
               "exe_hints": array(string(256))}, additional=True)


@tool(name="query_software_licenses", title="Query detected software licences", securable="SoftwareLicensing",
      operation="Read", service_scope="confined",
      description="List the software licences detected on one device (machine-level facts only, no user "
                  "identities). An empty licenses list means no licence was detected there, or the device has "
                  "not sent its daily licence scan yet — not that it runs nothing licensed. An unknown agent "
                  "answers count 0, and so does a device outside a service-scoped token's service; a device "
                  "outside your management groups -32003.",
      input_schema=obj({"agent_id": string(256, "The device", minLength=1)}, ["agent_id"]),
      output_schema=obj({"agent_id": string(256), "count": integer(), "licenses": array(LICENSE),
                         "audit_persisted": boolean()}, ["agent_id", "count", "licenses"]))
def query_software_licenses(ctx, args):
    return inventory.query_software_licenses(ctx.principal, args["agent_id"], cid=ctx.cid)
