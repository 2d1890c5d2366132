"""Object-level permissions of fleet tools, declared on the tool (mcp.registry.Tool.object_permission) so
the MCP pipeline checks them without knowing what an agent is."""

from yuzu import rbac

from .models import Agent


def on_agent(arg="agent_id"):
    """The tool acts on the agent named by ``args[arg]``: RBAC on that device (a grant on one of its
    management groups counts). An unknown agent falls back to the permission on any scope, so the handler
    answers "not found" rather than the gate revealing whether the id exists. A refusal on a known agent
    says what the caller holds (yuzu.rbac.denial)."""

    def allows(principal, tool, args):
        agent = Agent.objects.filter(pk=args.get(arg)).first() if isinstance(args.get(arg), str) else None
        if agent is None:
            return rbac.has_any(principal, tool.securable, tool.operation)
        if not rbac.may(principal, tool.securable, tool.operation, agent=agent):
            raise rbac.denial(principal, tool.securable, tool.operation, agent=agent)  # says which grant falls short
        return True

    return allows
