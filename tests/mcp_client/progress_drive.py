"""Call execute_instruction with a progress callback through the official MCP Python SDK (`mcp` 2.3.0)
and print what the client saw: every progress notification (value, total, arrival time), then the
result, then a status read by execution_id.

Run it with the SDK's own interpreter, never the project's (the SDK's import name `mcp` clashes with
the project's `mcp` app)::

    .venv-mcp/bin/python tests/mcp_client/progress_drive.py --url http://127.0.0.1:8000/mcp/v1/ \\
        --token yuzu_… --args '{"plugin": "os", "action": "info"}'

It prints ONE JSON document on stdout (exit 0), or the same document with a ``fatal`` entry (exit 2).
tests/e2e/test_streaming_e2e.py parses it and asserts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from typing import Any

import httpx2

from mcp import Client
from mcp.client.streamable_http import streamable_http_client

warnings.simplefilter("ignore")

from drive import (  # noqa: E402  (this folder is on sys.path when run as a script)
    error_obs,
    run_and_report,
)


async def drive(url: str, token: str, args: dict[str, Any], obs: dict[str, Any]) -> None:
    http_log: list[dict[str, Any]] = obs.setdefault("http", [])

    async def on_request(request: httpx2.Request) -> None:
        rpc = None
        if request.method == "POST":
            try:
                body = json.loads(request.content)
                rpc = body.get("method")
                meta = (body.get("params") or {}).get("_meta") or {}
            except (ValueError, AttributeError, httpx2.RequestNotRead):
                meta = {}
        else:
            meta = {}
        http_log.append({"method": request.method, "rpc": rpc, "accept": request.headers.get("accept"),
                         "progress_token": "progressToken" in meta})

    async def on_response(response: httpx2.Response) -> None:
        for entry in reversed(http_log):
            if "status" not in entry and entry["method"] == response.request.method:
                entry["status"] = response.status_code
                entry["content_type"] = response.headers.get("content-type")
                break

    progress: list[dict[str, Any]] = []
    t0 = time.monotonic()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append({"progress": value, "total": total, "message": message,
                         "at": round(time.monotonic() - t0, 3)})

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx2.Timeout(30.0, read=150.0),
                                  event_hooks={"request": [on_request], "response": [on_response]}) as http:
        async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=150) as client:
            obs["protocol_version"] = client.protocol_version
            await client.list_tools()  # so the SDK knows execute_instruction's outputSchema
            t0 = time.monotonic()
            try:
                result = await client.call_tool("execute_instruction", args, progress_callback=on_progress)
            except Exception as exc:
                obs["call"] = {"error": error_obs(exc)}
            else:
                obs["call"] = {"is_error": bool(result.is_error), "structured": result.structured_content,
                               "at": round(time.monotonic() - t0, 3)}
            obs["progress"] = progress
            execution_id = (obs["call"].get("structured") or {}).get("execution_id")
            if execution_id:
                status = await client.call_tool("get_execution_status", {"execution_id": execution_id})
                obs["status"] = status.structured_content
        obs["closed"] = True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--args", required=True, help="execute_instruction arguments as JSON")
    a = ap.parse_args(argv)
    obs: dict[str, Any] = {"client": "python-sdk"}
    return run_and_report(drive(a.url, a.token, json.loads(a.args), obs), obs)


if __name__ == "__main__":
    sys.exit(main())
