import pytest

from fleet.agent.plugins import catalogue
from fleet.models import Agent, AgentInventory
from mcp.server import Request, handle
from tests.support.authz import _headers, open_session


@pytest.fixture
def agent(db):
    """One connected agent that declared the real plugin catalogue (with its configuration schemas)."""
    a = Agent.objects.create(agent_id="a1", hostname="a1.example", os="linux", connected=True)
    AgentInventory.objects.create(agent=a, plugin=AgentInventory.CATALOGUE, data=catalogue())
    return a


class Caller:
    """tools/call through mcp.server.handle (what the HTTP transport calls), in this thread and transaction."""

    def __init__(self, raw):
        self.raw, self.sid, self.n = raw, open_session(raw, "v1"), 0

    def rpc(self, method, params=None):
        self.n += 1
        msg = {"jsonrpc": "2.0", "id": self.n, "method": method, "params": params or {}}
        return handle(Request("POST", _headers(self.raw, self.sid), {}, "v1", msg)).body

    def tool(self, name, args):
        body = self.rpc("tools/call", {"name": name, "arguments": args})
        if "error" in body:
            return None, body["error"]
        result = body["result"]
        if result.get("isError"):
            return None, result["structuredContent"]["error"]
        return result.get("structuredContent"), None


@pytest.fixture
def mcp(mint):
    """mcp(role, tier) → a Caller; .tool(name, args) → (structured result or None, error or None)."""

    def make(role="Administrator", tier="", username=None):
        return Caller(mint(username or f"{role.lower()}-{tier or 'untiered'}", role=role, tier=tier))

    return make
