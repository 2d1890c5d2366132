"""The full fuzz run against a real daphne (see README.md beside this file):

    .venv/bin/python bench/fuzz/run.py [--bodies 5000] [--rest-examples 30] [--json out.json]

1. generated JSON-RPC bodies (tests/support/fuzz.py: valid-ish and hostile, from the real input schemas) POSTed to
   /mcp/v1/ and /mcp/bridge/ with an Administrator's untiered and supervised tokens and a Viewer's readonly one;
2. schemathesis over /api/v1/openapi.json, every operation, with the Administrator's token and the Viewer's;
3. the server's log read for stack traces.

Counted: requests, answers with status >= 500, bodies holding a stack trace, tracebacks in the log. Exit 1 if
any is not zero. The database is a fresh SQLite file under a temp dir, or YUZU_DATABASE_URL's when that is set.
Every loop is bounded by count.
"""

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

SETUP = r"""
import json
from datetime import timedelta
import django
django.setup()
from django.contrib.auth import get_user_model
from django.utils import timezone
from fleet.agent.plugins import catalogue
from fleet.models import Agent, AgentInventory, ManagementGroup, Tag
from yuzu.models import ApiToken
from yuzu.rbac import assign_role, seed_builtin_roles

seed_builtin_roles()
User = get_user_model()
admin = User.objects.filter(username="fuzz-admin").first() or User.objects.create_user("fuzz-admin")
assign_role(admin, "Administrator")
viewer = User.objects.filter(username="fuzz-viewer").first() or User.objects.create_user("fuzz-viewer")
assign_role(viewer, "Viewer")
g, _ = ManagementGroup.objects.get_or_create(name="fuzz")
for agent_id, connected in (("fz-1", True), ("fz-2", False)):
    a, _ = Agent.objects.update_or_create(agent_id=agent_id, defaults=dict(hostname=agent_id + ".example", os="linux",
                                                                            connected=connected))
    AgentInventory.objects.update_or_create(agent=a, plugin=AgentInventory.CATALOGUE, defaults={"data": catalogue()})
    Tag.objects.update_or_create(agent=a, key="env", defaults={"value": "test"})
    g.members.add(a)
soon = timezone.now() + timedelta(days=30)
print(json.dumps({"admin": ApiToken.mint(admin, "fuzz-admin")[1],
                  "supervised": ApiToken.mint(admin, "fuzz-sup", mcp_tier="supervised", expires_at=soon)[1],
                  "viewer": ApiToken.mint(viewer, "fuzz-viewer", mcp_tier="readonly", expires_at=soon)[1]}))
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def manage(env, *args, stdin=None):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, input=stdin, capture_output=True, text=True,
                          check=True).stdout


def start(env, port, log_path):
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "yuzu.daphne_main", "-v", "0", "-b", "127.0.0.1", "-p", str(port),
                             "yuzu.asgi:application"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1, trust_env=False).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"daphne did not start: {log_path.read_text()[-2000:]}")


def open_session(client, url, token):
    r = client.post(url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "0"}}},
        headers={"authorization": f"Bearer {token}", "accept": "application/json, text/event-stream"})
    r.raise_for_status()
    return r.headers["mcp-session-id"]


def fuzz_mcp(base, tokens, n, stats):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.support.fuzz import bodies

    endpoints = (("/mcp/v1/", "v1"), ("/mcp/bridge/", "bridge"))
    with httpx.Client(timeout=60, trust_env=False) as client:
        # Every session first: fuzzed initialize calls may use up a principal's session cap (8) later.
        all_sessions = {path: {who: open_session(client, base + path, raw) for who, raw in tokens.items()}
                        for path, _ in endpoints}
        for path, cat in endpoints:
            url = base + path
            sessions = all_sessions[path]

            @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
            @given(body=bodies(cat, large=True), who=st.sampled_from(sorted(tokens)),
                   session=st.sampled_from([True] * 9 + [False]))
            def one(body, who, session):
                headers = {"authorization": f"Bearer {tokens[who]}", "content-type": "application/json",
                           "accept": "application/json"}
                if session:
                    headers.update({"mcp-session-id": sessions[who], "mcp-protocol-version": "2025-11-25"})
                r = client.post(url, content=body, headers=headers)
                stats[f"mcp {path}"]["requests"] += 1
                stats[f"mcp {path}"][f"HTTP {r.status_code}"] += 1
                if r.status_code >= 500 or b"Traceback" in r.content:
                    stats["failures"].append(f"POST {path} {body[:300]!r} -> {r.status_code} {r.content[:200]!r}")

            one()


def fuzz_rest(base, tokens, n, stats):
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_url(base + "/api/v1/openapi.json")
    for who in ("admin", "viewer"):
        key = f"rest as {who}"
        for result in schema.get_all_operations():
            operation = result.ok()

            @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy())
            def one(case):
                case.headers = {**(case.headers or {}), "Authorization": f"Bearer {tokens[who]}"}
                r = case.call(base_url=base, timeout=60)
                stats[key]["requests"] += 1
                stats[key][f"HTTP {r.status_code}"] += 1
                if r.status_code >= 500 or b"Traceback" in r.content:
                    stats["failures"].append(f"{case.method} {case.formatted_path} {str(case.body)[:200]} -> "
                                             f"{r.status_code} {r.content[:200]!r}")

            one()


def exceptions(log):
    """How often each exception ended a stack trace in the server log ("TypeError: unhashable type: 'list'"),
    with the frame that raised it."""
    found = Counter()
    for block in log.split("Traceback (most recent call last):")[1:]:
        lines = [line for line in block.splitlines() if line.strip()]
        frames = [line.strip() for line in lines if line.strip().startswith("File ")]
        last = next((line for line in lines if not line.startswith((" ", "\t")) and ":" in line), "?")
        found[f"{last.strip()[:120]} at {frames[-1][:160] if frames else '?'}"] += 1
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bodies", type=int, default=5000, help="generated bodies per MCP endpoint (default 5000)")
    ap.add_argument("--rest-examples", type=int, default=30, help="schemathesis examples per operation and token")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (database, server log)")
    opts = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="yuzu-fuzz-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(DJANGO_SETTINGS_MODULE="yuzu.settings", PYTHONUNBUFFERED="1", YUZU_LOG_LEVEL="WARNING")
    if not env.get("YUZU_DATABASE_URL"):
        env["YUZU_SQLITE_PATH"] = str(tmp / "fuzz.sqlite3")
    os.environ.update(env)
    manage(env, "manage.py", "migrate", "--noinput", "-v0")
    tokens = json.loads(manage(env, "-c", SETUP).strip().splitlines()[-1])
    port = free_port()
    log_path = tmp / "daphne.log"
    proc = start(env, port, log_path)
    base = f"http://127.0.0.1:{port}"
    stats = {"failures": []}
    for key in ("mcp /mcp/v1/", "mcp /mcp/bridge/", "rest as admin", "rest as viewer"):
        stats[key] = Counter()
    started = time.monotonic()
    try:
        import django

        django.setup()
        fuzz_mcp(base, tokens, opts.bodies, stats)
        mcp_done = time.monotonic()
        fuzz_rest(base, tokens, opts.rest_examples, stats)
    finally:
        proc.terminate()
        proc.wait(10)
    ended = time.monotonic()
    log = log_path.read_text(errors="replace")
    figures = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "database": "PostgreSQL" if os.environ.get("YUZU_DATABASE_URL") else "SQLite",
        "mcp_bodies": sum(stats[k]["requests"] for k in ("mcp /mcp/v1/", "mcp /mcp/bridge/")),
        "mcp_seconds": round(mcp_done - started, 1),
        "rest_requests": sum(stats[k]["requests"] for k in ("rest as admin", "rest as viewer")),
        "rest_seconds": round(ended - mcp_done, 1),
        "responses_5xx": sum(n for k in stats if k != "failures" for s, n in stats[k].items()
                             if s.startswith("HTTP 5")),
        "failures": stats["failures"][:50],
        "tracebacks_in_server_log": log.count("Traceback"),
        "exceptions_in_server_log": dict(exceptions(log)),
        "statuses": {k: dict(sorted(v.items())) for k, v in stats.items() if k != "failures"},
    }
    print(json.dumps(figures, indent=2))
    if opts.json:
        Path(opts.json).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        Path(opts.json).write_text(json.dumps(figures, indent=2))
    if figures["tracebacks_in_server_log"]:
        print(log[log.index("Traceback") - 300:][:4000], file=sys.stderr)
    if opts.keep:
        print(f"kept {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    bad = figures["responses_5xx"] or figures["tracebacks_in_server_log"] or figures["failures"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
