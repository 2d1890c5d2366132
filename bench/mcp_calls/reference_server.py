"""The comparison point for bench/mcp_calls: the official Python SDK's reference server (`MCPServer`
from `mcp` 2.3.0) serving the same agents from memory as a `list_agents` tool, over streamable HTTP
with JSON responses and sessions.

Runs ONLY under .venv-mcp (the SDK's import name `mcp` clashes with the project's app); run.py
starts it as a subprocess::

    .venv-mcp/bin/python bench/mcp_calls/reference_server.py --port 8001 --agents agents.json
"""

import argparse
import json

from typing_extensions import TypedDict  # pydantic needs this TypedDict on Python < 3.12

from mcp.server.mcpserver import MCPServer


class AgentRow(TypedDict):
    agent_id: str
    hostname: str
    os: str
    arch: str
    agent_version: str
    connected: bool
    last_seen: str | None
    quarantined: bool


class AgentList(TypedDict):
    agents: list[AgentRow]
    count: int


def build(agents: list) -> MCPServer:
    server = MCPServer("reference-bench", instructions="Benchmark reference: list_agents from memory.",
                       log_level="WARNING")

    @server.tool(structured_output=True, description="Lists the agents (endpoints), served from memory for the benchmark.")
    def list_agents(connected: bool | None = None, limit: int = 1000) -> AgentList:
        rows = [a for a in agents if connected is None or a["connected"] == connected][:limit]
        return {"agents": rows, "count": len(rows)}

    return server


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--agents", required=True, help="JSON file: the list_agents rows to serve")
    a = ap.parse_args()
    with open(a.agents) as f:
        agents = json.load(f)
    build(agents).run("streamable-http", host="127.0.0.1", port=a.port, streamable_http_path="/mcp",
                      json_response=True, stateless_http=False)


if __name__ == "__main__":
    main()
