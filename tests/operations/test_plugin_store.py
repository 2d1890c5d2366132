"""Plugin configuration, secrets and kill switches (spec/operator.md §1) through the MCP face in process:
schema validation against the plugin's declared schema, write-only sealed secrets, not_found never a silent
success, the kill switch as a dispatch gate (and failing closed), audit rows, nothing half-written."""

import pytest
from django.db import DatabaseError

from fleet.models import Execution, ManagementGroup
from operations import plugins
from operations.models import SECRET_VALUE, PluginConfig, PluginKillSwitch, PluginSecret
from tests.operations.conftest import Caller
from yuzu import secrets as sealed
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("args", "needle"), [
    ({"plugin": "process", "key": "default_limit", "value": "lots"}, "does not match the plugin's schema"),
    ({"plugin": "nosuch", "key": "default_limit", "value": "1"}, "unknown plugin"),
    ({"plugin": "process", "key": "undeclared", "value": "1"}, "declares no configuration key"),
    ({"plugin": "Process", "key": "default_limit", "value": "1"}, "does not match"),
    ({"plugin": "process", "key": ".dot", "value": "1"}, "does not match"),
    ({"plugin": "process", "key": "default_limit", "value": "x" * 8193}, "is too long"),
    ({"plugin": "process", "key": "default_limit"}, "required"),
    ({"plugin": "process", "key": "default_limit", "value": 5}, "not of type"),
])
def test_set_plugin_config_refuses_bad_input_and_writes_nothing(agent, mcp, args, needle):
    result, error = mcp().tool("set_plugin_config", args)
    assert result is None and error["code"] == -32602 and needle in error["message"], error
    assert not PluginConfig.objects.exists()
    assert not AuditEvent.objects.filter(action="plugin_config.set").exists()


def test_config_round_trip_and_not_found(agent, mcp):
    admin = mcp()
    row, _ = admin.tool("set_plugin_config", {"plugin": "process", "key": "default_limit", "value": "5"})
    assert row["value"] == "5" and row["updated_by"] == "administrator-untiered"
    again, _ = admin.tool("set_plugin_config", {"plugin": "process", "key": "default_limit", "value": "6"})
    assert again["updated_at_ms"] >= row["updated_at_ms"] and again["value"] == "6"
    got, _ = admin.tool("get_plugin_config", {"plugin": "process", "key": "default_limit"})
    assert got["value"] == "6"
    listed, _ = admin.tool("list_plugin_config", {})
    assert listed == {"data": [got], "truncated": False}
    assert admin.tool("list_plugin_config", {"plugin": "script"})[0] == {"data": [], "truncated": False}
    deleted, _ = admin.tool("delete_plugin_config", {"plugin": "process", "key": "default_limit"})
    assert deleted == {"deleted": True}
    for tool in ("get_plugin_config", "delete_plugin_config"):
        _, error = admin.tool(tool, {"plugin": "process", "key": "default_limit"})
        assert error["code"] == -32602 and "not_found" in error["message"]
    assert AuditEvent.objects.filter(action="plugin_config.set").count() == 2
    assert AuditEvent.objects.filter(action="plugin_config.delete", result="success").count() == 1


def test_a_group_confined_reader_is_denied_the_list_never_filtered(agent, mint):
    group = ManagementGroup.objects.create(name="g")
    _, error = Caller(mint("gviewer", role="Viewer", tier="readonly", group=group)).tool("list_plugin_config", {})
    assert error["code"] == -32003


def test_secrets_are_sealed_write_only_and_never_audited_in_clear(agent, mcp):
    admin = mcp()
    meta, _ = admin.tool("set_plugin_secret", {"plugin": "process", "key": "api.token", "value": "hunter2-secret"})
    assert meta.keys() == {"plugin", "key", "updated_at_ms", "updated_by"}
    row = PluginSecret.objects.get(pk="process.api.token")
    assert b"hunter2" not in bytes(row.sealed_value)
    assert sealed.unseal(bytes(row.sealed_value), SECRET_VALUE.where("process.api.token")) == b"hunter2-secret"
    first = bytes(row.sealed_value)
    admin.tool("set_plugin_secret", {"plugin": "process", "key": "api.token", "value": "hunter2-secret"})
    assert bytes(PluginSecret.objects.get(pk="process.api.token").sealed_value) != first  # a fresh DEK per write
    assert not AuditEvent.objects.filter(detail__contains="hunter2").exists()
    tools = {t["name"] for t in admin.rpc("tools/list")["result"]["tools"]}
    assert not {"get_plugin_secret", "list_plugin_secrets"} & tools
    _, error = admin.tool("set_plugin_secret", {"plugin": "nosuch", "key": "k", "value": "v"})
    assert "unknown plugin" in error["message"]
    assert admin.tool("delete_plugin_secret", {"plugin": "process", "key": "api.token"})[0] == {"deleted": True}
    _, error = admin.tool("delete_plugin_secret", {"plugin": "process", "key": "api.token"})
    assert "not_found" in error["message"]
    assert AuditEvent.objects.filter(action="plugin_secret.delete", result="failure").exists()  # still audited


def test_an_oversized_secret_is_refused_without_echoing_it(agent, mcp, mint, client):
    """A schema refusal names the field and the rule, never the submitted value: a secret that is too long
    must not come back in the error (a client transcript, a proxy log), on either face."""
    value = "hunter2-" + "s" * 70_000
    _, error = mcp().tool("set_plugin_secret", {"plugin": "process", "key": "api.token", "value": value})
    assert error["code"] == -32602 and "/value" in error["message"] and "too long" in error["message"]
    assert "hunter2" not in str(error)
    raw = mint("admin-rest", role="Administrator", tier="")
    r = client.put("/api/v1/plugin-config/process/api.token/secret", {"value": value},
                   content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 400 and b"hunter2" not in r.content and b"too long" in r.content
    assert not PluginSecret.objects.exists()


def test_delete_is_gated_on_the_supervised_tier(agent, mcp):
    PluginConfig.objects.create(plugin="process", key="default_limit", value="5", updated_by="x")
    _, error = mcp(tier="supervised").tool("delete_plugin_config", {"plugin": "process", "key": "default_limit"})
    assert error["code"] == -32006
    assert PluginConfig.objects.exists()


def test_kill_switch_refuses_dispatch_and_the_action_row_wins(agent, mcp):
    admin = mcp()
    view, _ = admin.tool("get_plugin_kill_switch", {"plugin": "os"})
    assert view == {"plugin": "os", "action": "", "enabled": True}
    admin.tool("set_plugin_kill_switch", {"plugin": "os", "enabled": False, "reason": "incident 42"})
    _, error = admin.tool("execute_instruction", {"plugin": "os", "action": "info", "agent_ids": ["a1"]})
    assert error["code"] == -32602 and error["message"].startswith("kill_switched") and "incident 42" in error["message"]
    assert error["data"]["reason"] == "kill_switched"
    assert not Execution.objects.exists()
    admin.tool("set_plugin_kill_switch", {"plugin": "os", "action": "info", "enabled": True})
    assert plugins.action_allowed("os", "info") == (True, "")
    assert plugins.action_allowed("os", "other")[0] is False
    _, error = admin.tool("execute_bundle", {"agent_id": "a1", "steps": [{"plugin": "os", "action": "other"}]})
    assert "kill_switched" in error["message"]
    reserved, _ = admin.tool("set_plugin_kill_switch", {"plugin": "__all_plugins__", "enabled": False})
    assert reserved["plugin"] == "__all_plugins__"
    for bad in ({"plugin": "os", "enabled": "no"}, {"plugin": "os", "enabled": False, "reason": "x" * 513},
                {"plugin": "__" + "a" * 65 + "__", "enabled": False}, {"plugin": "os", "action": "A B", "enabled": False}):
        _, error = admin.tool("set_plugin_kill_switch", bad)
        assert error["code"] == -32602, bad
    assert PluginKillSwitch.objects.count() == 3


def test_the_dispatch_gate_fails_closed(monkeypatch):
    def broken(*a, **kw):
        raise DatabaseError("down")

    monkeypatch.setattr(PluginKillSwitch.objects, "filter", broken)
    allowed, why = plugins.action_allowed("os", "info")
    assert allowed is False and "fail closed" in why


def test_tiers(agent, mcp):
    _, error = mcp(tier="operator").tool("set_plugin_config", {"plugin": "process", "key": "default_limit",
                                                                "value": "5"})
    assert error["code"] == -32004
    _, error = mcp("Operator", "").tool("set_plugin_kill_switch", {"plugin": "os", "enabled": False})
    assert error["code"] == -32003
    assert mcp("Viewer", "readonly").tool("get_plugin_kill_switch", {"plugin": "os"})[1] is None
