"""A service-scoped token reaches its service's devices only (docs/tokens-and-rbac.md), on every face: the tools
of the "confined" class (execute_instruction, execute_bundle, set_tag, delete_tag, quarantine_device), which the
MCP pipeline lets such a token into, keep to the devices tagged service=<its service> — another service's device
answers exactly as an unknown one — and every other REST route refuses the token, as its MCP tool does. Before,
a token scoped to service=payments executed on, tagged and quarantined any device, and listed every agent and
the whole audit log over REST."""

import pytest

from fleet.agent.plugins import catalogue
from fleet.models import Agent, AgentExecStatus, AgentInventory, Execution, Tag
from tests.operations.conftest import Caller

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_celery")]


@pytest.fixture(autouse=True)
def fleet(db):
    """a1 is tagged service=payments; b2 belongs to another service (hr)."""
    for aid, service in (("a1", "payments"), ("b2", "hr")):
        a = Agent.objects.create(agent_id=aid, hostname=f"{aid}.example", os="linux", connected=True)
        AgentInventory.objects.create(agent=a, plugin=AgentInventory.CATALOGUE, data=catalogue())
        Tag.objects.create(agent=a, key="service", value=service)


@pytest.fixture
def payments(mint):
    """An Operator held fleet-wide, its token scoped to service=payments (MCP tier operator)."""
    return Caller(mint("svc", role="Operator", tier="operator", scope_service="payments"))


@pytest.fixture
def rest(mint):
    raw = mint("svc-rest", role="Administrator", scope_service="payments")
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def test_an_execution_reaches_the_services_devices_only(payments):
    everywhere, _ = payments.tool("execute_instruction", {"plugin": "os", "action": "info"})
    assert everywhere["agents_reached"] == 1
    listed, _ = payments.tool("execute_instruction", {"plugin": "os", "action": "info", "agent_ids": ["a1", "b2"]})
    assert listed["agents_reached"] == 1
    other, _ = payments.tool("execute_instruction", {"plugin": "os", "action": "info", "agent_ids": ["b2"]})
    assert other["status"] == "no_agents_reached"
    assert set(AgentExecStatus.objects.values_list("agent_id", flat=True)) == {"a1"}


@pytest.mark.parametrize(("tool", "args"), [
    ("set_tag", {"key": "owner", "value": "mallory"}),
    ("delete_tag", {"key": "service"}),
    ("execute_bundle", {"steps": [{"plugin": "os", "action": "info"}]}),
])
def test_another_services_device_answers_as_an_unknown_one(payments, tool, args):
    _, other = payments.tool(tool, {"agent_id": "b2", **args})
    _, missing = payments.tool(tool, {"agent_id": "zz", **args})
    assert other is not None and missing is not None and other["code"] != -32006  # refused before any ticket
    assert (other["code"], other["message"].replace("b2", "zz")) == (missing["code"], missing["message"])
    assert dict(Tag.objects.filter(agent_id="b2").values_list("key", "value")) == {"service": "hr"}
    assert not Execution.objects.exists()
    own, error = payments.tool(tool, {"agent_id": "a1", **args})
    assert own is not None or error["code"] == -32006  # its own device: done, or (delete_tag) gated for a human


def test_quarantine_keeps_to_the_service(client, rest):
    other = client.post("/api/v1/quarantine", {"agent_id": "b2"}, content_type="application/json", **rest)
    missing = client.post("/api/v1/quarantine", {"agent_id": "zz"}, content_type="application/json", **rest)
    assert other.status_code == missing.status_code == 404
    assert not Agent.objects.get(pk="b2").quarantined
    own = client.post("/api/v1/quarantine", {"agent_id": "a1"}, content_type="application/json", **rest)
    assert own.status_code == 200 and Agent.objects.get(pk="a1").quarantined


def test_rest_executions_and_tags_keep_to_the_service(client, rest):
    r = client.post("/api/v1/executions", {"plugin": "os", "action": "info", "agent_ids": ["b2"]},
                    content_type="application/json", **rest)
    assert r.status_code == 202 and r.json()["data"]["status"] == "no_agents_reached"
    r = client.put("/api/v1/tags", {"agent_id": "b2", "key": "owner", "value": "x"}, content_type="application/json",
                   **rest)
    assert r.status_code == 404 and not Tag.objects.filter(agent_id="b2", key="owner").exists()


@pytest.mark.parametrize("path", ["/api/v1/agents", "/api/v1/agents/a1", "/api/v1/audit", "/api/v1/executions",
                                  "/api/v1/management-groups", "/api/v1/tokens"])
def test_the_routes_of_denied_tools_refuse_a_service_scoped_token(client, rest, path):
    r = client.get(path, **rest)
    assert r.status_code == 403, (path, r.content)
    assert "service-scoped" in r.json()["error"]["message"]


def test_a_service_scoped_token_follows_its_ticket_by_recalling(payments):
    """get_approval and the status_url refuse a service-scoped token (docs/approvals.md): a recall with the ticket's
    id answers -32006 while it waits, and runs once a human approved it."""
    from approvals.models import Approval

    args = {"agent_id": "a1", "key": "service"}
    _, first = payments.tool("delete_tag", args)
    assert first["code"] == -32006
    ticket = first["data"]["approval_id"]
    # its -32006 points it at what it may do: recall (no status_url, which would refuse it)
    assert "status_url" not in first["data"] and "re-call this tool" in first["data"]["remediation"]
    assert "get_approval" not in first["data"]["remediation"]
    assert payments.tool("get_approval", {"approval_id": ticket})[1]["code"] == -32003
    _, again = payments.tool("delete_tag", {**args, "approval_id": ticket})
    assert again["code"] == -32006
    Approval.objects.filter(pk=ticket).update(status=Approval.APPROVED, reviewed_by="zed")
    done, error = payments.tool("delete_tag", {**args, "approval_id": ticket})
    assert error is None and done["deleted"] is True
