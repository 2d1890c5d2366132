"""MCP machinery: JSON-RPC, the Streamable HTTP transport, sessions, the registry and the check
pipeline. It knows nothing about fleets, approvals or bridges; apps plug in through
``<app>/mcp_tools.py`` and the gate hooks in ``mcp.registry``."""
