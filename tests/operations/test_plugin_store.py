"""Plugin configuration, secrets and kill switches (spec/operator.md §1) through the MCP face in process:
schema validation against the plugin's declared schema, write-only sealed secrets, not_found never a silent
success, the kill switch as a dispatch gate (and failing closed), audit rows, nothing half-written."""

import json

import pytest
from django.db import DatabaseError

from fleet.agent.plugins import catalogue
from fleet.executions import launch, plan_execution
from fleet.models import Agent, AgentExecStatus, AgentInventory, Execution, ManagementGroup
from operations import plugins
from operations.models import SECRET_VALUE, PluginConfig, PluginKillSwitch, PluginSecret
from tests.operations.conftest import Caller
from yuzu import secrets as sealed
from yuzu.errors import YuzuError
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


LENIENT = {"type": "string"}  # what a hostile agent declares for process.default_limit to get "lots" through


def other_agent(agent_id, default_limit):
    plugins = catalogue()
    plugins["process.list"] = {**plugins["process.list"], "config": {"default_limit": default_limit}}
    a = Agent.objects.create(agent_id=agent_id, hostname=f"{agent_id}.example", os="linux", connected=True)
    AgentInventory.objects.create(agent=a, plugin=AgentInventory.CATALOGUE, data=plugins)


@pytest.mark.parametrize("hostile_first", [True, False])
def test_no_agent_can_replace_the_schema_another_declared_for_a_key(db, mcp, hostile_first):
    """Whatever order the database returns the catalogues in, a value must satisfy every distinct schema the
    agents declared for the key; the refusal names the agents whose schema refused it."""
    if hostile_first:
        other_agent("a0", LENIENT)
    Agent.objects.create(agent_id="a1", hostname="a1.example", os="linux", connected=True)
    AgentInventory.objects.create(agent_id="a1", plugin=AgentInventory.CATALOGUE, data=catalogue())
    if not hostile_first:
        other_agent("a2", LENIENT)
    result, error = mcp().tool("set_plugin_config", {"plugin": "process", "key": "default_limit", "value": "lots"})
    assert result is None and "does not match the plugin's schema as a1.example (a1) declared it" in error["message"]
    assert "one of 2 different schemas" in error["message"]
    assert not PluginConfig.objects.exists()
    with pytest.raises(YuzuError) as info:
        plugins.check_value("process", "default_limit", "lots")
    assert info.value.extra["agent_ids"] == ["a1"] and info.value.extra["schema"]["pattern"] == "^[0-9]{1,5}$"
    assert plugins.check_value("process", "default_limit", "25") == "25"  # every schema accepts it


def test_a_stricter_schema_refuses_naming_the_agent_and_the_schema_shows_as_all_of(agent):
    strict = {"type": "string", "maxLength": 1}
    other_agent("a2", strict)
    other_agent("a3", strict)
    with pytest.raises(YuzuError) as info:
        plugins.check_value("process", "default_limit", "25")
    assert "a2.example (a2), a3.example (a3) declared it" in info.value.message
    assert info.value.extra["agent_ids"] == ["a2", "a3"]
    assert plugins.check_value("process", "default_limit", "5") == "5"
    honest = catalogue()["process.list"]["config"]["default_limit"]
    shown = plugins.config_schema("process")["default_limit"]
    assert sorted(shown["allOf"], key=lambda s: json.dumps(s, sort_keys=True)) == shown["allOf"]
    assert shown["allOf"] in ([honest, strict], [strict, honest])
    AgentInventory.objects.filter(agent_id__in=["a2", "a3"]).delete()
    assert plugins.config_schema("process")["default_limit"] == honest  # one schema: shown as it is


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
    assert view == {"plugin": "os", "action": "", "group": "", "enabled": True}
    admin.tool("set_plugin_kill_switch", {"plugin": "os", "enabled": False, "reason": "incident 42"})
    _, error = admin.tool("execute_instruction", {"plugin": "os", "action": "info", "agent_ids": ["a1"]})
    assert error["code"] == -32602 and error["message"].startswith("kill_switched") and "incident 42" in error["message"]
    assert error["data"]["reason"] == "kill_switched"
    assert not Execution.objects.exists()
    admin.tool("set_plugin_kill_switch", {"plugin": "os", "action": "info", "enabled": True})
    assert plugins.dispatch_gate("os", "info") == {}
    with pytest.raises(YuzuError, match="kill_switched: os.other"):
        plugins.dispatch_gate("os", "other")
    _, error = admin.tool("execute_bundle", {"agent_id": "a1", "steps": [{"plugin": "os", "action": "other"}]})
    assert "kill_switched" in error["message"]
    reserved, _ = admin.tool("set_plugin_kill_switch", {"plugin": "__all_plugins__", "enabled": False})
    assert reserved["plugin"] == "__all_plugins__"
    for bad in ({"plugin": "os", "enabled": "no"}, {"plugin": "os", "enabled": False, "reason": "x" * 513},
                {"plugin": "__" + "a" * 65 + "__", "enabled": False}, {"plugin": "os", "action": "A B", "enabled": False}):
        _, error = admin.tool("set_plugin_kill_switch", bad)
        assert error["code"] == -32602, bad
    assert PluginKillSwitch.objects.count() == 3


def test_the_dispatch_gate_fails_closed_as_a_store_fault(agent, mcp, monkeypatch):
    """A kill switch store that cannot be read refuses the dispatch — honestly: a store fault with a retry hint
    (503 / -32603), not a kill_switched refusal nobody flipped."""
    def broken(*a, **kw):
        raise DatabaseError("down")

    monkeypatch.setattr(PluginKillSwitch.objects, "filter", broken)
    with pytest.raises(YuzuError) as exc:
        plugins.dispatch_gate("os", "info", ["a1"])
    assert (exc.value.status, exc.value.rpc_code) == (503, -32603) and exc.value.retry_after_ms
    _, error = mcp().tool("execute_instruction", {"plugin": "os", "action": "info", "agent_ids": ["a1"]})
    assert error["code"] == -32603 and error["data"]["retry_after_ms"], error
    assert not Execution.objects.exists()


def test_tiers(agent, mcp):
    _, error = mcp(tier="operator").tool("set_plugin_config", {"plugin": "process", "key": "default_limit",
                                                                "value": "5"})
    assert error["code"] == -32004
    _, error = mcp("Operator", "").tool("set_plugin_kill_switch", {"plugin": "os", "enabled": False})
    assert error["code"] == -32003
    assert mcp("Viewer", "readonly").tool("get_plugin_kill_switch", {"plugin": "os"})[1] is None


@pytest.fixture
def lab(agent):
    """a1 outside any group; a2 in group lab; a3 in lab's subgroup lab-child — all connected, same catalogue."""
    lab = ManagementGroup.objects.create(name="lab")
    child = ManagementGroup.objects.create(name="lab-child", parent=lab)
    for agent_id, group in (("a2", lab), ("a3", child)):
        a = Agent.objects.create(agent_id=agent_id, hostname=f"{agent_id}.example", os="linux", connected=True)
        AgentInventory.objects.create(agent=a, plugin=AgentInventory.CATALOGUE, data=catalogue())
        group.members.add(a)
    return lab


def reached(admin, **target):
    result, error = admin.tool("execute_instruction", {"plugin": "os", "action": "info", **target})
    assert error is None, error
    return result, set(AgentExecStatus.objects.filter(execution_id=result["execution_id"])
                       .values_list("agent_id", flat=True))


def test_a_group_switch_is_named_only_to_a_caller_who_may_read_it(lab, mcp, mint):
    """An Operator of another group that shares an agent with lab learns that a group's switch holds it back —
    not which group, who set it, or why (another group's switch reads as absent, as the group does)."""
    mcp().tool("set_plugin_kill_switch", {"plugin": "os", "enabled": False, "group": "lab",
                                          "reason": "deal Zeta closing"})
    ops = ManagementGroup.objects.create(name="ops")
    ops.members.add(Agent.objects.get(pk="a2"))
    other = Caller(mint("ops-operator", role="Operator", tier="operator", group=ops))
    _, error = other.tool("execute_instruction", {"plugin": "os", "action": "info", "agent_ids": ["a2"]})
    assert error["data"]["reason"] == "kill_switched", error
    assert "a management group the agent is in" in error["message"]
    assert "lab" not in error["message"] and "Zeta" not in error["message"] and "administrator" not in error["message"]


def test_a_group_switch_holds_back_its_agents_and_its_subgroups(lab, mcp):
    admin = mcp()
    row, error = admin.tool("set_plugin_kill_switch", {"plugin": "os", "enabled": False, "group": "lab",
                                                       "reason": "lab incident"})
    assert error is None and row["group"] == lab.pk and row["enabled"] is False
    assert admin.tool("get_plugin_kill_switch", {"plugin": "os"})[0]["enabled"] is True  # fleet-wide untouched
    assert admin.tool("get_plugin_kill_switch", {"plugin": "os", "group": lab.pk})[0]["reason"] == "lab incident"
    result, agents = reached(admin, agent_ids=["a1", "a2", "a3"])
    assert agents == {"a1"} and result["agents_reached"] == 1 and result["kill_switched_agents"] == 2
    _, error = admin.tool("execute_instruction", {"plugin": "os", "action": "info", "scope": "hostname == a3.example"})
    assert error["data"]["reason"] == "kill_switched" and "in group lab" in error["message"], error
    assert "lab incident" in error["message"]
    _, error = admin.tool("execute_bundle", {"agent_id": "a2", "steps": [{"plugin": "os", "action": "info"}]})
    assert "kill_switched" in error["message"]
    # within the group the action's row wins over the plugin's, as fleet-wide
    admin.tool("set_plugin_kill_switch", {"plugin": "os", "action": "info", "enabled": True, "group": "lab"})
    assert reached(admin, agent_ids=["a1", "a2", "a3"])[1] == {"a1", "a2", "a3"}
    _, error = admin.tool("execute_instruction", {"plugin": "os", "action": "other", "agent_ids": ["a2"]})
    assert error["data"]["reason"] == "kill_switched"
    # an execution to nobody held back says nothing about switches
    assert "kill_switched_agents" not in reached(admin, agent_ids=["a1"])[0]


def test_a_switch_flipped_between_plan_and_launch_holds_back_the_pinned_agents(lab, mcp, principal):
    p = principal("launcher", role="Administrator")
    order = plan_execution(p, plugin="os", action="info", agent_ids=["a1", "a2"]).value
    assert sorted(order.targets) == ["a1", "a2"]
    mcp().tool("set_plugin_kill_switch", {"plugin": "os", "enabled": False, "group": "lab"})
    result = launch(p, order)
    assert result["agents_reached"] == 1 and result["kill_switched_agents"] == 1
    assert list(AgentExecStatus.objects.values_list("agent_id", flat=True)) == ["a1"]


def test_each_agent_is_sent_the_switches_that_reach_it(lab, mcp):
    admin = mcp()
    admin.tool("set_plugin_kill_switch", {"plugin": "os", "action": "info", "enabled": True})  # fleet-wide 'on' row
    admin.tool("set_plugin_kill_switch", {"plugin": "os", "enabled": False, "group": "lab", "reason": "r"})
    admin.tool("set_plugin_kill_switch", {"plugin": "script", "enabled": False, "reason": "everywhere"})
    frames = plugins.kill_messages(["a1", "a2", "a3"])
    off = {a: {(s["plugin"], s["action"]) for s in f["switches"] if not s["enabled"]} for a, f in frames.items()}
    # a1: only the fleet-wide script switch; a2 and a3 (subgroup): the group turns os off, and its os.info too —
    # the fleet-wide 'on' row for os.info does not undo another scope's 'off'
    assert off == {"a1": {("script", "")}, "a2": {("script", ""), ("os", ""), ("os", "info")},
                   "a3": {("script", ""), ("os", ""), ("os", "info")}}
    reasons = {s["plugin"]: s["reason"] for s in frames["a2"]["switches"] if not s["action"]}
    assert "in group lab" in reasons["os"] and "everywhere" in reasons["script"]


def test_a_group_switch_needs_the_grant_on_that_group(lab, mint):
    other = ManagementGroup.objects.create(name="other")
    caller = Caller(mint("lab-admin", role="Administrator", group=lab))
    row, error = caller.tool("set_plugin_kill_switch", {"plugin": "os", "enabled": False, "group": "lab-child"})
    assert error is None and row["group"] == ManagementGroup.objects.get(name="lab-child").pk  # through its parent
    for group in ("other", other.pk, "nosuch"):  # another group reads as absent: no oracle
        _, error = caller.tool("set_plugin_kill_switch", {"plugin": "os", "enabled": False, "group": group})
        assert error["code"] == -32602 and "not_found" in error["message"], error
    _, error = caller.tool("set_plugin_kill_switch", {"plugin": "os", "enabled": False})  # fleet-wide
    assert error["code"] == -32003
    _, error = caller.tool("get_plugin_kill_switch", {"plugin": "os", "group": "other"})
    assert "not_found" in error["message"]
    assert PluginKillSwitch.objects.count() == 1
    assert AuditEvent.objects.filter(action="plugin_kill_switch.set").count() == 1
