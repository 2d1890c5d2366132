"""Drive yuzu's bridge (/mcp/bridge/) with the official MCP Python SDK (`mcp` 2.x) as a primary and
print what happened as ONE JSON document (exit 0; exit 2 with a ``fatal`` entry if the connection
itself failed). Run it with the SDK's own interpreter, never the project's (the import name `mcp`
clashes with the project's `mcp` app)::

    .venv-mcp/bin/python tests/mcp_client/bridge_drive.py --url http://127.0.0.1:8000/mcp/bridge/ \\
        --token yuzu_… [--profile standin] [--flow delegation|clarification|both]

Flows (spec §4): delegation — bridge_spawn(profile), bridge_send("reply:…") blocks → outcome reply;
clarification — bridge_send("ask:…") → outcome question → bridge_send(turnId) → outcome reply. Every
structured result is checked against the tool's outputSchema; the worker is stopped at the end.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import httpx2
from jsonschema import Draft202012Validator

from mcp import Client
from mcp.client.streamable_http import streamable_http_client

warnings.simplefilter("ignore")

from drive import (  # noqa: E402  (this folder is on sys.path when run as a script)
    error_obs,
    run_and_report,
)


class Driver:
    def __init__(self, client: Client, obs: dict[str, Any]):
        self.client, self.obs = client, obs
        self.schemas: dict[str, Any] = {}
        self.calls: list[dict[str, Any]] = obs.setdefault("calls", [])

    async def list_tools(self) -> None:
        page = await self.client.list_tools()
        self.schemas = {t.name: t.output_schema for t in page.tools}
        self.obs["tools"] = sorted(self.schemas)
        self.obs["params"] = {t.name: sorted((t.input_schema or {}).get("properties", {})) for t in page.tools}

    async def call(self, name: str, args: dict[str, Any], label: str | None = None) -> dict[str, Any]:
        rec: dict[str, Any] = {"tool": name, "as": label or name}
        try:
            result = await self.client.call_tool(name, args, read_timeout_seconds=90)
        except Exception as exc:
            rec["error"] = error_obs(exc)
        else:
            rec["is_error"] = bool(result.is_error)
            rec["structured"] = result.structured_content
            schema = self.schemas.get(name)
            if schema is not None and not result.is_error:
                errors = list(Draft202012Validator(schema).iter_errors(result.structured_content))
                rec["schema_valid"] = not errors
                rec["schema_errors"] = [e.message[:300] for e in errors[:5]]
        self.calls.append(rec)
        return rec


async def drive(url: str, token: str, profile: str, flow: str, obs: dict[str, Any]) -> None:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx2.Timeout(30.0, read=120.0), trust_env=False) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy",
                          read_timeout_seconds=90) as client:
            obs["server_info"] = client.server_info.model_dump(mode="json", exclude_none=True) \
                if client.server_info else None
            obs["instructions"] = client.instructions
            d = Driver(client, obs)
            await d.list_tools()
            await d.call("bridge_whoami", {})
            spawned = await d.call("bridge_spawn", {"profile": profile})
            sid = (spawned.get("structured") or {}).get("sessionId")
            try:
                if flow in ("delegation", "both"):
                    await d.call("bridge_send", {"content": "reply:from the official client", "sessionId": sid,
                                                 "timeoutMs": 30000}, "delegation")
                if flow in ("clarification", "both"):
                    q = await d.call("bridge_send", {"content": "ask:which branch?", "sessionId": sid,
                                                     "timeoutMs": 30000}, "question")
                    turn = (q.get("structured") or {}).get("turnId")
                    await d.call("bridge_send", {"content": "main", "sessionId": sid, "turnId": turn,
                                                 "timeoutMs": 30000}, "answer")
                await d.call("bridge_status", {"sessionId": sid})
            finally:
                if sid:
                    await d.call("bridge_stop", {"paneId": sid})
        obs["closed"] = True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--profile", default="standin")
    ap.add_argument("--flow", choices=["delegation", "clarification", "both"], default="both")
    a = ap.parse_args(argv)
    obs: dict[str, Any] = {"flow": a.flow}
    return run_and_report(drive(a.url, a.token, a.profile, a.flow, obs), obs)


if __name__ == "__main__":
    sys.exit(main())
