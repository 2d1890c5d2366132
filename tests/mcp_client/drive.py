"""Drive yuzu's /mcp/v1/ with the official MCP Python SDK (`mcp` 2.3.0) and print what happened.

Run it with the SDK's own interpreter, never the project's: the SDK's import name `mcp` clashes with
the project's `mcp` app (docs/mcp-conformance.md, ARCHITECTURE.md)::

    .venv-mcp/bin/python tests/mcp_client/drive.py --url http://127.0.0.1:8000/mcp/v1/ \\
        --token yuzu_… --mode legacy --scenario core [--param agent_id=web-01] [--steps '[…]']

It prints ONE JSON document of observations on stdout (exit 0), or the same document with a
``fatal`` entry (exit 2) when the connection itself failed. pytest parses it and asserts.

Scenarios are data: a list of steps, each ``{"op": …}``. Add a scenario by adding a list to
SCENARIOS (or pass ``--steps`` with a JSON list for a one-off). Step ops:

- ``{"op": "ping"}``
- ``{"op": "list", "kind": "tools" | "resources" | "resource_templates" | "prompts"}`` — walks every
  page via ``next_cursor``; records names and the number of pages.
- ``{"op": "call", "tool": NAME, "args": {...}, "as": LABEL, "progress": bool}`` — records
  isError, structuredContent, our own jsonschema check of it against the tool's outputSchema, whether
  the text block carries the same JSON, progress notifications (when ``progress``), or the error.
- ``{"op": "read", "uri": URI}``, ``{"op": "prompt", "name": N, "args": {...}, "as": LABEL}``,
  ``{"op": "complete", "prompt": N, "argument": A, "value": V, "as": LABEL}``,
  ``{"op": "set_level", "level": L}``.
- ``{"op": "poll", "tool": NAME, "args": {...}, "until": {"field": F, "in": [V, …]}, "timeout": S, "as": LABEL}``
  — calls the tool until structuredContent[F] is one of the values, sleeping the result's
  ``retry_after_ms`` between calls (``interval`` s, default 0.5, when it gives none), for at most S s
  (≤ 120); records every poll's value and hint, the sleeps, and the last call like ``call`` does.
- ``{"op": "wait_for_file", "path": P, "timeout": S}`` — pause (bounded) until the driving test creates P,
  e.g. after it approved a ticket in the database; the session stays open meanwhile.
- ``{"op": "touch", "path": P}`` — create P, telling the driving test that the steps before it are done.
- ``{"op": "wait_for_notification", "method": M, "timeout": S}`` — pause (bounded) until the server has sent
  notification M (``notifications`` lists, in order, the methods of every notification the client got).
- ``list`` takes ``"as": LABEL`` to keep a second listing beside the first.

A string value ``"$name"`` is replaced by ``--param name=value``; ``"@a.b.c"`` by that path in the
observations so far, e.g. ``"@calls.delete_tag.error.data.approval_id"`` to re-call a gated tool.

``log`` in the observations lists every record the client side logged at WARNING or worse (e.g. the
SDK's "Tool … not listed by server"); a clean session leaves it empty.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import httpx2
from jsonschema import Draft202012Validator

from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.types import PromptReference

warnings.simplefilter("ignore")  # MCPDeprecationWarning for ping/logging (deprecated only in 2026-07-28)

CORE_READS = [
    {"op": "call", "tool": "list_agents", "args": {}},
    {"op": "call", "tool": "list_agents", "args": {"connected": True}, "as": "list_agents_connected"},
    {"op": "call", "tool": "get_fleet_posture_fast", "args": {}},
    {"op": "call", "tool": "query_audit_log", "args": {"action": "mcp.", "limit": 5}},
    {"op": "call", "tool": "check_permission", "args": {"securable_type": "Infrastructure", "operation": "Read"}},
    {"op": "call", "tool": "check_permission", "args": {"securable_type": "Tag", "operation": "Write"},
     "as": "check_permission_tag_write"},
    {"op": "call", "tool": "classify_operational_question",
     "args": {"question": "Which agents are disconnected right now?"}},
]

SCENARIOS: dict[str, list[dict[str, Any]]] = {
    # The handshake, every list with pagination, the orientation reads, resources, a prompt, an error.
    "core": [
        {"op": "ping"},
        {"op": "list", "kind": "tools"},
        {"op": "list", "kind": "resources"},
        {"op": "list", "kind": "resource_templates"},
        {"op": "list", "kind": "prompts"},
        *CORE_READS,
        {"op": "read", "uri": "yuzu://server/health"},
        {"op": "read", "uri": "yuzu://about"},
        {"op": "read", "uri": "yuzu://no-such-resource", "as": "missing_resource"},
        {"op": "prompt", "name": "investigate_agent", "args": {"agent_id": "$agent_id"}},
        {"op": "prompt", "name": "investigate_agent", "args": {}, "as": "investigate_agent_missing_arg"},
        {"op": "complete", "prompt": "ceo_demo_agentic_endpoint_management", "argument": "mode", "value": "d"},
        {"op": "set_level", "level": "info"},
        {"op": "call", "tool": "no_such_tool", "args": {}, "as": "unknown_tool"},
        {"op": "call", "tool": "list_agents", "args": {"limit": "many"}, "as": "invalid_args"},
    ],
    # A readonly-tier token: reads work, a write tool is refused by the tier (-32004).
    "readonly": [
        {"op": "list", "kind": "tools"},
        {"op": "call", "tool": "list_agents", "args": {}},
        {"op": "call", "tool": "check_permission", "args": {"securable_type": "Tag", "operation": "Write"}},
        {"op": "call", "tool": "set_tag", "args": {"agent_id": "$agent_id", "key": "role", "value": "web"}},
    ],
    # The fleet end to end on a supervised token (tests/e2e/test_fleet_e2e.py): execute_instruction is
    # approval-gated (-32006); the test approves the ticket and creates $approved; the recall with
    # approval_id dispatches; poll get_execution_status (honouring retry_after_ms); read the output.
    "fleet_supervised": [
        {"op": "list", "kind": "tools"},
        {"op": "call", "tool": "execute_instruction", "as": "gated",
         "args": {"plugin": "os", "action": "info", "agent_ids": ["$agent_id"]}},
        {"op": "wait_for_file", "path": "$approved", "timeout": 30},
        {"op": "call", "tool": "execute_instruction", "as": "execute",
         "args": {"plugin": "os", "action": "info", "agent_ids": ["$agent_id"],
                  "approval_id": "@calls.gated.error.data.approval_id"}},
        {"op": "poll", "tool": "get_execution_status", "as": "status", "timeout": 30,
         "args": {"execution_id": "@calls.execute.structured.execution_id"},
         "until": {"field": "status", "in": ["succeeded", "completed", "cancelled"]}},
        {"op": "call", "tool": "query_responses", "as": "responses",
         "args": {"execution_id": "@calls.execute.structured.execution_id"}},
    ],
    # An operator-tier token (no approval): a slow script.run (the agent must allow-list
    # ["sh", "-c", "*"]) is polled while running, honouring retry_after_ms; an action the agent did not
    # declare is refused by the server (-32602) before anything is sent.
    "fleet_operator": [
        {"op": "list", "kind": "tools"},
        {"op": "call", "tool": "execute_instruction", "as": "slow",
         "args": {"plugin": "script", "action": "run", "agent_ids": ["$agent_id"],
                  "params": {"argv": "[\"sh\", \"-c\", \"sleep 1; echo slow done\"]"}}},
        {"op": "poll", "tool": "get_execution_status", "as": "slow_status", "timeout": 30,
         "args": {"execution_id": "@calls.slow.structured.execution_id"},
         "until": {"field": "status", "in": ["succeeded", "completed", "cancelled"]}},
        {"op": "call", "tool": "query_responses", "as": "slow_responses",
         "args": {"execution_id": "@calls.slow.structured.execution_id"}},
        {"op": "call", "tool": "execute_instruction", "as": "unknown",
         "args": {"plugin": "nosuch", "action": "thing", "agent_ids": ["$agent_id"]}},
    ],
    # tools/list fitted to the token, and notifications/tools/list_changed when a role change alters it: the
    # test assigns a role once $listed exists; the client then waits for the notification and lists again.
    "list_changed": [
        {"op": "list", "kind": "tools"},
        {"op": "touch", "path": "$listed"},
        {"op": "wait_for_notification", "method": "notifications/tools/list_changed", "timeout": 30},
        {"op": "list", "kind": "tools", "as": "tools_after"},
        {"op": "call", "tool": "set_tag", "args": {"agent_id": "$agent_id", "key": "role", "value": "web"}},
    ],
    # The smallest useful session: what the TS client and the benchmark also do.
    "smoke": [
        {"op": "list", "kind": "tools"},
        {"op": "call", "tool": "list_agents", "args": {}},
    ],
}


def error_obs(exc: BaseException) -> dict[str, Any]:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # anyio task groups wrap the cause
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return {"code": exc.code, "message": exc.message, "data": exc.data}
    return {"exception": type(exc).__name__, "message": str(exc)[:2000]}


def substitute(value: Any, params: dict[str, str], obs: dict[str, Any]) -> Any:
    if isinstance(value, str) and value.startswith("$"):
        name = value[1:]
        if name not in params:
            raise KeyError(f"scenario needs --param {name}=…")
        return params[name]
    if isinstance(value, str) and value.startswith("@"):
        found: Any = obs
        for part in value[1:].split("."):
            found = found.get(part) if isinstance(found, dict) else None
        return found
    if isinstance(value, dict):
        return {k: substitute(v, params, obs) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, params, obs) for v in value]
    return value


class Driver:
    def __init__(self, client: Client, obs: dict[str, Any], params: dict[str, str]):
        self.client = client
        self.obs = obs
        self.params = params
        self.output_schemas: dict[str, dict | None] = {}

    async def run(self, steps: list[dict[str, Any]]) -> None:
        for step in steps:
            step = substitute(step, self.params, self.obs)
            await getattr(self, "op_" + step["op"])(step)

    async def op_ping(self, step):
        try:
            result = await self.client.send_ping()
            self.obs["ping"] = {"ok": True, "result": result.model_dump(mode="json", exclude_none=True)}
        except Exception as exc:
            self.obs["ping"] = {"ok": False, "error": error_obs(exc)}

    async def op_list(self, step):
        kind = step["kind"]
        label = step.get("as", kind)
        fetch = {"tools": self.client.list_tools, "resources": self.client.list_resources,
                 "resource_templates": self.client.list_resource_templates, "prompts": self.client.list_prompts}[kind]
        items, pages, cursor = [], 0, None
        out: dict[str, Any] = {}
        try:
            while True:
                page = await fetch(cursor=cursor)
                pages += 1
                items.extend(getattr(page, kind))
                cursor = page.next_cursor
                if cursor is None or pages >= 50:
                    break
            out["pages"] = pages
        except Exception as exc:
            out["error"] = error_obs(exc)
        if kind == "tools":
            out["names"] = [t.name for t in items]
            out["without_description"] = [t.name for t in items if not t.description]
            out["with_output_schema"] = [t.name for t in items if t.output_schema]
            out["read_only"] = [t.name for t in items if t.annotations and t.annotations.read_only_hint]
            self.output_schemas.update({t.name: t.output_schema for t in items})
        elif kind == "resources":
            out["uris"] = [r.uri for r in items]
        elif kind == "resource_templates":
            out["uri_templates"] = [r.uri_template for r in items]
        else:
            out["names"] = [p.name for p in items]
        self.obs.setdefault("lists", {})[label] = out

    async def op_call(self, step):
        name = step["tool"]
        label = step.get("as", name)
        progress: list[dict[str, Any]] = []

        async def on_progress(value, total, message):
            progress.append({"progress": value, "total": total, "message": message})

        rec: dict[str, Any] = {"tool": name}
        try:
            result = await self.client.call_tool(name, step.get("args", {}),
                                                 progress_callback=on_progress if step.get("progress") else None)
        except Exception as exc:
            rec["error"] = error_obs(exc)
        else:
            structured = result.structured_content
            rec["is_error"] = bool(result.is_error)
            rec["structured"] = structured
            texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
            try:
                rec["text_matches_structured"] = bool(texts) and json.loads(texts[0]) == structured
            except ValueError:
                rec["text_matches_structured"] = False
            schema = self.output_schemas.get(name)
            rec["has_output_schema"] = schema is not None
            if schema is not None and not result.is_error:
                errors = sorted(Draft202012Validator(schema).iter_errors(structured), key=lambda e: list(e.path))
                rec["schema_valid"] = not errors
                rec["schema_errors"] = [f"{list(e.path)}: {e.message}"[:300] for e in errors[:5]]
        if step.get("progress"):
            rec["progress"] = progress
        self.obs.setdefault("calls", {})[label] = rec

    async def op_read(self, step):
        uri = step["uri"]
        rec: dict[str, Any] = {}
        try:
            result = await self.client.read_resource(uri)
            rec["contents"] = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in result.contents]
        except Exception as exc:
            rec["error"] = error_obs(exc)
        self.obs.setdefault("resources_read", {})[step.get("as", uri)] = rec

    async def op_prompt(self, step):
        rec: dict[str, Any] = {}
        try:
            result = await self.client.get_prompt(step["name"], step.get("args") or {})
            rec["description"] = result.description
            rec["messages"] = [m.model_dump(mode="json", by_alias=True, exclude_none=True) for m in result.messages]
        except Exception as exc:
            rec["error"] = error_obs(exc)
        self.obs.setdefault("prompts_got", {})[step.get("as", step["name"])] = rec

    async def op_complete(self, step):
        rec: dict[str, Any] = {}
        try:
            result = await self.client.complete(PromptReference(type="ref/prompt", name=step["prompt"]),
                                                {"name": step["argument"], "value": step.get("value", "")})
            rec["values"] = result.completion.values
        except Exception as exc:
            rec["error"] = error_obs(exc)
        self.obs.setdefault("completions", {})[step.get("as", step["prompt"])] = rec

    async def op_poll(self, step):
        label, field, wanted = step.get("as", step["tool"]), step["until"]["field"], step["until"]["in"]
        start = time.monotonic()
        deadline = start + min(float(step.get("timeout", 30)), 120)
        polls: list[dict[str, Any]] = []
        while True:
            await self.op_call({**step, "op": "call", "as": label})
            rec = self.obs["calls"][label]
            structured = rec.get("structured") or {}
            hint = structured.get("retry_after_ms") if isinstance(structured, dict) else None
            polls.append({"at_s": round(time.monotonic() - start, 3), "value": structured.get(field),
                          "retry_after_ms": hint, "error": rec.get("error")})
            if "error" in rec or structured.get(field) in wanted:
                break
            wait = hint / 1000.0 if isinstance(hint, (int, float)) and hint > 0 else float(step.get("interval", 0.5))
            if time.monotonic() + wait > deadline:
                break
            polls[-1]["slept_s"] = wait
            await asyncio.sleep(wait)
        rec["polls"] = polls
        rec["reached"] = polls[-1]["value"] in wanted

    async def op_wait_for_file(self, step):
        path, deadline = Path(step["path"]), time.monotonic() + min(float(step.get("timeout", 60)), 600)
        while not path.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.obs.setdefault("waited", {})[step["path"]] = path.exists()

    async def op_touch(self, step):
        Path(step["path"]).touch()

    async def op_wait_for_notification(self, step):
        method, deadline = step["method"], time.monotonic() + min(float(step.get("timeout", 30)), 120)
        while method not in self.obs["notifications"] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.obs.setdefault("waited", {})[method] = method in self.obs["notifications"]

    async def op_set_level(self, step):
        try:
            await self.client.set_logging_level(step["level"])
            self.obs["set_level"] = {"ok": True}
        except Exception as exc:
            self.obs["set_level"] = {"ok": False, "error": error_obs(exc)}


async def drive(url: str, token: str, mode: str, steps: list[dict[str, Any]], params: dict[str, str],
                obs: dict[str, Any]) -> None:
    http_log: list[dict[str, Any]] = obs.setdefault("http", [])
    notifications: list[str] = obs.setdefault("notifications", [])

    async def on_message(message: Any) -> None:
        method = getattr(message, "method", None)
        if isinstance(method, str):
            notifications.append(method)

    async def on_request(request: httpx2.Request) -> None:
        rpc = None
        if request.method == "POST":
            try:
                rpc = json.loads(request.content).get("method")
            except (ValueError, AttributeError, httpx2.RequestNotRead):
                rpc = None
        http_log.append({"method": request.method, "rpc": rpc,
                         "session": request.headers.get("mcp-session-id") is not None,
                         "protocol_version": request.headers.get("mcp-protocol-version"),
                         "authorized": request.headers.get("authorization", "").startswith("Bearer ")})

    async def on_response(response: httpx2.Response) -> None:
        for entry in reversed(http_log):
            if "status" not in entry and entry["method"] == response.request.method:
                entry["status"] = response.status_code
                entry["session_header"] = response.headers.get("mcp-session-id") is not None
                break

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx2.Timeout(30.0, read=120.0),
                                  event_hooks={"request": [on_request], "response": [on_response]}) as http:
        transport = streamable_http_client(url, http_client=http)  # terminate_on_close: DELETE on exit
        async with Client(transport, mode=mode, read_timeout_seconds=60, message_handler=on_message) as client:
            obs["protocol_version"] = client.protocol_version
            info = client.server_info
            obs["server_info"] = info.model_dump(mode="json", exclude_none=True) if info else None
            obs["capabilities"] = client.server_capabilities.model_dump(mode="json", by_alias=True, exclude_none=True)
            obs["instructions"] = client.instructions
            await Driver(client, obs, params).run(steps)
        obs["closed"] = True
    deletes = [e for e in http_log if e["method"] == "DELETE"]
    obs["deleted"] = bool(deletes) and all(e.get("status") in (200, 204) for e in deletes)
    obs["discover_probe"] = next(({"status": e.get("status"), "session_header": e.get("session_header")}
                                  for e in http_log if e["rpc"] == "server/discover"), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--mode", choices=["legacy", "auto"], default="auto")
    ap.add_argument("--scenario", default="core", help=f"one of {', '.join(SCENARIOS)} (ignored with --steps)")
    ap.add_argument("--steps", help="a JSON list of steps to run instead of a named scenario")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    a = ap.parse_args(argv)
    params = dict(p.split("=", 1) for p in a.param)
    steps = json.loads(a.steps) if a.steps else SCENARIOS[a.scenario]
    obs: dict[str, Any] = {"mode": a.mode, "scenario": "custom" if a.steps else a.scenario}
    return run_and_report(drive(a.url, a.token, a.mode, steps, params, obs), obs)


class LogCapture(logging.Handler):
    """Every WARNING-or-worse record any logger (the SDK's, httpx's, asyncio's) emits, for ``obs["log"]``."""

    def __init__(self, sink: list[dict[str, Any]]):
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append({"logger": record.name, "level": record.levelname, "message": record.getMessage()[:2000]})


def run_and_report(coro, obs: dict[str, Any]) -> int:
    """Run the client coroutine and print ONE JSON document of observations (with ``fatal`` on failure);
    shared by the other driver scripts in this folder. ``log`` holds what the client logged at WARNING or
    worse (a clean session logs nothing)."""
    code = 0
    root = logging.getLogger()
    root.addHandler(LogCapture(obs.setdefault("log", [])))
    root.setLevel(logging.WARNING)
    try:
        asyncio.run(coro)
    except BaseException as exc:  # report, never hang or print half a document
        obs["fatal"] = {**error_obs(exc), "traceback": traceback.format_exc()[-4000:]}
        code = 2
    json.dump(obs, sys.stdout, default=str)
    sys.stdout.write("\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
