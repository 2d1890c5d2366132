"""Object-level permissions of fleet tools, declared on the tool (mcp.registry.Tool.object_permission) so
the MCP pipeline checks them without knowing what an agent is."""

from yuzu import rbac
from yuzu.errors import NotFound

from .models import Agent


def on_agent(arg="agent_id"):
    """The tool acts on the agent named by ``args[arg]``: RBAC on that device (a grant on one of its
    management groups counts). Without the permission anywhere the call is refused (-32003); a device outside
    the caller's groups reads exactly like one that does not exist — "Agent not found", the handler's answer
    for an unknown id — so the gate reveals nothing about what lies in other groups."""

    def allows(principal, tool, args):
        if not rbac.has_any(principal, tool.securable, tool.operation):
            return False
        agent_id = args.get(arg)
        agent = Agent.objects.filter(pk=agent_id).first() if isinstance(agent_id, str) else None
        if agent is not None and not rbac.may(principal, tool.securable, tool.operation, agent=agent):
            raise NotFound(f"Agent not found: {agent_id}")
        return True

    return allows
