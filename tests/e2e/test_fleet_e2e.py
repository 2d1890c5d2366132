"""The fleet end to end, every part a real process: daphne, the background workers (with YUZU_REDIS_URL:
a Celery worker and Celery beat on Redis; without it: Celery eager inside daphne and `manage.py
run_periodic` for the sweep), a real agent (`python -m fleet.agent`, enrolled with a token from
`mint_device_token`) and the official MCP Python client (tests/mcp_client/drive.py in .venv-mcp).

- os.info through the official client on a supervised token: -32006 first, approved, recalled, polled to
  `succeeded` honouring retry_after_ms, output read with query_responses;
- an action the agent did not declare is refused (-32602) before anything is dispatched;
- an agent SIGKILLed mid-execution ends in TIMEOUT through the sweep, not a hang;
- a Celery worker SIGKILLed mid-execution and restarted loses no response (Redis only: embedded mode has
  no separate worker to restart);
- a swarm that loses commands and answers on purpose still runs the command exactly once on every agent.

Runs on SQLite or PostgreSQL (YUZU_DATABASE_URL), embedded or on Redis (YUZU_REDIS_URL). Every wait has
a deadline."""

import io
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import time
from datetime import timedelta

import httpx
import psutil
import pytest
from django.core.management import call_command
from django.utils import timezone

from approvals.models import Approval
from approvals.services import review
from fleet.models import Agent, AgentExecStatus, AgentState, Execution, Response
from fleet.responses import FORGOTTEN
from tests.support.lossy_proxy import LossyProxy
from tests.support.stack import REDIS, Stack, wait_for
from yuzu.models import AuditEvent, TOTPDevice
from yuzu.rbac import Principal, seed_builtin_roles
from yuzu.testing import ROOT


def live(test):
    """Starts real processes on the test database (committed data: transactional)."""
    return pytest.mark.live(pytest.mark.django_db(transaction=True)(test))


MCP_PY = ROOT / ".venv-mcp" / "bin" / "python"
DRIVE = ROOT / "tests" / "mcp_client" / "drive.py"

TERMINAL = ("succeeded", "completed", "cancelled")
SCRIPT_ALLOW = [["sh", "-c", "*"]]  # the agent's script.run allow-list for these tests


@pytest.fixture
def stack(daphne, tmp_path):
    seed_builtin_roles()
    s = Stack(daphne(), tmp_path)
    yield s
    s.close()


@pytest.fixture
def rest(stack, mint):
    """A REST client with a non-MCP Operator token (MCP tiers do not apply)."""
    token = mint("fe-rest", role="Operator", tier="")
    with httpx.Client(base_url=stack.server.base, headers={"Authorization": f"Bearer {token}"}, timeout=15) as c:
        yield c


def execute(rest, **body):
    r = rest.post("/api/v1/executions", json=body)
    assert r.status_code == 202, r.text
    return r.json()["data"]


def poll_terminal(rest, execution_id, timeout, stack):
    """GET the execution until it is terminal, sleeping what retry_after_ms says between polls."""
    deadline = time.monotonic() + timeout
    while True:
        view = rest.get(f"/api/v1/executions/{execution_id}").json()["data"]
        if view["status"] in TERMINAL:
            assert view["retry_after_ms"] is None
            return view
        assert view["retry_after_ms"] == 2000
        if time.monotonic() + view["retry_after_ms"] / 1000 > deadline:
            pytest.fail(f"execution {execution_id} still {view['status']} after {timeout} s: {view}\n{stack.logs()}")
        time.sleep(view["retry_after_ms"] / 1000)


def client_env():
    """The SDK's interpreter must see none of the project: no PYTHONPATH, no Django settings."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("ANTHROPIC_", "DJANGO_", "PYTHON")) and k not in ("VIRTUAL_ENV",)}


def drive(stack, token, scenario, **params):
    if not MCP_PY.exists():
        pytest.fail(f"{MCP_PY} is missing: run `make test` (its test-deps target builds .venv-mcp)")
    cmd = [str(MCP_PY), str(DRIVE), "--url", stack.server.mcp, "--token", token, "--mode", "legacy",
           "--scenario", scenario] + [arg for k, v in params.items() for arg in ("--param", f"{k}={v}")]
    return subprocess.Popen(cmd, cwd=stack.tmp_path, env=client_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def observations(stack, proc, timeout=60):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"drive.py did not finish in {timeout} s:\n{err[-3000:]}\n{stack.logs()}")
    try:
        obs = json.loads(out)
    except ValueError:
        pytest.fail(f"drive.py printed no JSON (exit {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
    assert "fatal" not in obs, f"the official client failed: {obs['fatal']}\n{stack.logs()}"
    return obs


def assert_polled_honouring_the_hint(status):
    """Every not-yet-terminal answer carried retry_after_ms 2000 and the client slept exactly that."""
    polls = status["polls"]
    assert status["reached"], (polls, status)
    assert polls[-1]["retry_after_ms"] is None
    for before, after in itertools.pairwise(polls):
        assert before["value"] == "running" and before["retry_after_ms"] == 2000 and before["slept_s"] == 2.0
        assert after["at_s"] - before["at_s"] >= 2.0


# --- through the official MCP client ------------------------------------------------------------

@live
def test_os_info_through_the_official_client_on_a_supervised_token(stack, mint, make_user, tmp_path):
    _, agent_id = stack.agent()
    token = mint("fe-super", role="Operator", tier="supervised")
    carol = make_user("fe-carol", "Approver")
    TOTPDevice.objects.create(user=carol, name="phone", confirmed=True)
    approver = Principal(user=carol, via="session", mfa_verified_at=time.time())
    flag = tmp_path / "approved"

    client = drive(stack, token, "fleet_supervised", agent_id=agent_id, approved=flag)
    # The first call mints a ticket (-32006); a human approves it while the client's session waits.
    ticket = wait_for(lambda: client.poll() is None and Approval.objects.filter(
        submitted_by="fe-super", status=Approval.PENDING).first(), 30, "the approval ticket", stack.logs)
    assert ticket.definition_id == "mcp.execute_instruction"
    review(approver, ticket.id, Approval.APPROVED, "e2e")
    flag.touch()
    obs = observations(stack, client)
    calls = obs["calls"]

    gated = calls["gated"]["error"]
    assert gated["code"] == -32006 and gated["message"].startswith("approval required: a human must approve this call")
    assert gated["data"]["approval_id"] == ticket.id and re.fullmatch(r"[0-9a-f]{32}", ticket.id)
    assert gated["data"]["status_url"] == f"/api/v1/approvals/{ticket.id}"
    assert gated["data"]["retry_after_ms"] == 30000
    assert obs["waited"][str(flag)] is True

    receipt = calls["execute"]
    assert receipt["is_error"] is False and receipt["schema_valid"], receipt
    assert receipt["structured"]["status"] == "running" and receipt["structured"]["agents_reached"] == 1
    eid = receipt["structured"]["execution_id"]

    status = calls["status"]
    assert_polled_honouring_the_hint(status)
    final = status["structured"]
    assert status["schema_valid"] and final["id"] == eid and final["status"] == "succeeded"
    assert (final["agents_targeted"], final["agents_responded"], final["agents_success"]) == (1, 1, 1)
    assert final["progress_pct"] == 100.0

    got = calls["responses"]
    assert got["schema_valid"] and got["text_matches_structured"], got
    assert got["structured"]["execution_status"] == "succeeded" and got["structured"]["retry_after_ms"] is None
    [row] = got["structured"]["responses"]
    assert (row["agent_id"], row["execution_id"], row["status"], row["exit_code"]) == (agent_id, eid, "SUCCESS", 0)
    facts = json.loads(row["output"])
    assert facts["hostname"] == socket.gethostname() and facts["system"] == "Linux" and facts["cpu_count"] >= 1

    assert Approval.objects.get(pk=ticket.id).consumed_at is not None
    assert Response.objects.get(execution_id=eid).status == AgentState.SUCCESS
    audit = AuditEvent.objects.filter(principal="fe-super", action="mcp.execute_instruction")
    assert set(audit.values_list("result", flat=True)) == {"pending", "approved"}  # minted, then recalled


@live
def test_polling_a_running_execution_and_an_unknown_plugin_on_an_operator_token(stack, mint):
    _, agent_id = stack.agent(script_allow=SCRIPT_ALLOW)
    token = mint("fe-operator", role="Operator", tier="operator")  # operator tier: not approval-gated
    calls = observations(stack, drive(stack, token, "fleet_operator", agent_id=agent_id))["calls"]

    # A command that runs for a second is seen running at least once: the client waits what the
    # server says (2000 ms) before asking again.
    assert calls["slow"]["structured"]["status"] == "running"
    status = calls["slow_status"]
    assert len(status["polls"]) >= 2 and status["polls"][0]["value"] == "running"
    assert_polled_honouring_the_hint(status)
    assert status["structured"]["status"] == "succeeded"
    [row] = calls["slow_responses"]["structured"]["responses"]
    assert (row["status"], row["output"], row["exit_code"]) == ("SUCCESS", "slow done\n", 0)

    # An action the agent did not declare in its catalogue: refused before anything is sent.
    err = calls["unknown"]["error"]
    assert err["code"] == -32602 and err["message"].startswith("unknown plugin/action: nosuch.thing")
    assert not Execution.objects.filter(plugin="nosuch").exists()


# --- failures -----------------------------------------------------------------------------------

@live
def test_an_agent_killed_mid_execution_ends_in_timeout_not_a_hang(stack, rest):
    agent, agent_id = stack.agent(script_allow=SCRIPT_ALLOW)
    out = execute(rest, plugin="script", action="run", agent_ids=[agent_id],
                  params={"argv": json.dumps(["sh", "-c", "echo started; sleep 60; echo never"]), "timeout": "120"})
    eid = out["execution_id"]
    # The agent streams a RUNNING frame with the partial output (about a second after the start).
    wait_for(lambda: Response.objects.filter(execution_id=eid, status=AgentState.RUNNING, output__contains="started")
             .exists(), 20, "the RUNNING frame", stack.logs)
    stack.orphans |= {c.pid for c in psutil.Process(agent.proc.pid).children(recursive=True)}
    agent.kill()
    wait_for(lambda: not Agent.objects.get(pk=agent_id).connected, 10, "daphne to see the agent go", stack.logs)
    time.sleep(1)
    assert Execution.objects.get(pk=eid).status == "running"  # nothing answers for the dead agent ...
    # ... until the command expires. REST and MCP dispatch with the default expiry (300 s) and take no
    # expires_in, so move this command's expiry into the past (past the sweep's 5 s grace) instead of
    # waiting five minutes; the sweep (beat / run_periodic, every 5 s) must then time it out.
    Execution.objects.filter(pk=eid).update(expires_at=timezone.now() - timedelta(seconds=6))
    view = poll_terminal(rest, eid, 20, stack)
    assert view["status"] == "completed" and (view["agents_responded"], view["agents_failure"]) == (1, 1)
    [row] = rest.get(f"/api/v1/executions/{eid}/responses").json()["data"]["responses"]
    assert row["status"] == "TIMEOUT" and row["agent_id"] == agent_id
    assert row["output"].startswith("started") and "never" not in row["output"]  # the partial output is kept
    assert row["error"] == "no terminal response before the command expired"
    assert AgentExecStatus.objects.get(execution_id=eid).status == "timeout"


@live
@pytest.mark.skipif(not REDIS, reason="needs YUZU_REDIS_URL: CI runs it (embedded mode has no separate worker)")
def test_restarting_the_celery_worker_mid_execution_loses_no_response(stack, rest):
    _, agent_id = stack.agent(script_allow=SCRIPT_ALLOW)
    before = execute(rest, plugin="os", action="info", agent_ids=[agent_id])["execution_id"]
    assert poll_terminal(rest, before, 30, stack)["status"] == "succeeded"

    slow = execute(rest, plugin="script", action="run", agent_ids=[agent_id],
                   params={"argv": json.dumps(["sh", "-c", "echo started; sleep 3; echo finished"])})["execution_id"]
    # Kill only once the agent runs it: a worker killed between claiming an agent and sending to it
    # leaves that agent to the re-send, which waits for the broker to redeliver the task (not what this
    # test is about).
    wait_for(lambda: AgentExecStatus.objects.filter(execution_id=slow, status="running").exists(), 20,
             "the agent to start the slow command", stack.logs)
    stack.worker.kill()  # SIGKILL the worker mid-execution

    # With no worker, the broker holds new dispatches; daphne keeps storing the agent's responses.
    queued = execute(rest, plugin="os", action="info", agent_ids=[agent_id])["execution_id"]
    wait_for(lambda: Response.objects.filter(execution_id=slow, status=AgentState.SUCCESS).exists(), 20,
             "the slow command's response while the worker is down", stack.logs)
    assert AgentExecStatus.objects.get(execution_id=queued).status == "pending"  # really nobody dispatched it
    assert Execution.objects.get(pk=slow).status == "succeeded"

    stack.worker = stack.start_worker()
    assert poll_terminal(rest, queued, 30, stack)["status"] == "succeeded"
    for eid, expected in ((before, '"system": "Linux"'), (slow, "started\nfinished"), (queued, '"system": "Linux"')):
        ex = Execution.objects.get(pk=eid)
        rows = list(Response.objects.filter(execution_id=eid))
        assert len(rows) == 1 and rows[0].status == AgentState.SUCCESS and expected in rows[0].output, (eid, rows)
        assert (ex.status, ex.agents_targeted, ex.agents_responded, ex.agents_success) == ("succeeded", 1, 1, 1)
    assert Response.objects.count() == 3


# --- a terminal answer lost with its connection ----------------------------------------------------

def result_queries(stack, outcome):
    metrics = httpx.get(stack.server.base + "/metrics", timeout=10).text
    found = re.search(rf'^yuzu_fleet_result_queries_total\{{outcome="{outcome}"\}} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


@live
def test_a_terminal_answer_lost_with_its_connection_is_recovered_when_the_agent_reconnects(stack, rest, tmp_path):
    """The loss window of issue 22: the agent sends its terminal answer into a connection whose server end
    is gone (a relay drops what the agent sends, then cuts the connection). To the agent the frame was sent,
    so nothing re-sends it, and the server holds the command as running. After the agent reconnects, the
    server asks about it (result.query) and the agent answers with the frame it kept: the real result, with
    its output, long before the expiry — and the command ran once."""
    proxy = LossyProxy(stack.server.port).start()
    try:
        _, agent_id = stack.agent(script_allow=SCRIPT_ALLOW, server=f"ws://127.0.0.1:{proxy.port}")
        ran = tmp_path / "ran.txt"
        eid = execute(rest, plugin="script", action="run", agent_ids=[agent_id], params={
            "argv": json.dumps(["sh", "-c", f"echo run >> {ran}; echo started; sleep 3; echo finished"])})["execution_id"]
        wait_for(lambda: Response.objects.filter(execution_id=eid, output__contains="started").exists(), 20,
                 "the RUNNING frame", stack.logs)
        proxy.swallow()  # from now on what the agent sends is lost on the way
        wait_for(lambda: ran.exists() and proxy.swallowed > 0, 20, "the agent's answer to be swallowed", stack.logs)
        time.sleep(4)  # the command has finished and its terminal frame went into the dead connection
        row = AgentExecStatus.objects.get(execution_id=eid)
        assert row.status == "running" and "finished" not in Response.objects.get(execution_id=eid).output
        kept = result_queries(stack, "kept")
        proxy.cut()  # both ends see the connection reset; the agent reconnects through the relay
        view = poll_terminal(rest, eid, 40, stack)
    finally:
        proxy.stop()
    assert view["status"] == "succeeded" and view["resent"] == 0, view
    [r] = rest.get(f"/api/v1/executions/{eid}/responses").json()["data"]["responses"]
    assert (r["status"], r["output"], r["exit_code"]) == ("SUCCESS", "started\nfinished\n", 0)
    assert AgentExecStatus.objects.get(execution_id=eid).attempts == 1
    assert ran.read_text() == "run\n"  # it ran once
    assert result_queries(stack, "kept") == kept + 1


@live
def test_a_restarted_agent_that_no_longer_knows_a_running_command_ends_it_in_timeout_not_a_re_run(stack, rest,
                                                                                                 tmp_path):
    """The agent is SIGKILLed while a command runs and started again from its state: it does not know the
    command any more. Re-sending it could run it twice; the server asks instead, the agent answers unknown,
    and the command ends in TIMEOUT with a reason saying so, at once rather than at its expiry — run once."""
    agent, agent_id = stack.agent(script_allow=SCRIPT_ALLOW)
    ran = tmp_path / "ran.txt"
    eid = execute(rest, plugin="script", action="run", agent_ids=[agent_id], params={
        "argv": json.dumps(["sh", "-c", f"echo run >> {ran}; echo started; sleep 60; echo never"]),
        "timeout": "120"})["execution_id"]
    wait_for(lambda: Response.objects.filter(execution_id=eid, output__contains="started").exists(), 20,
             "the RUNNING frame", stack.logs)
    stack.orphans |= {c.pid for c in psutil.Process(agent.proc.pid).children(recursive=True)}
    agent.kill()
    wait_for(lambda: not Agent.objects.get(pk=agent_id).connected, 10, "daphne to see the agent go", stack.logs)
    unknown = result_queries(stack, "unknown")
    _, again = stack.agent(state=agent.state)  # the same agent, restarted
    assert again == agent_id
    view = poll_terminal(rest, eid, 30, stack)  # the expiry is 300 s away
    assert view["status"] == "completed" and (view["agents_responded"], view["agents_failure"], view["resent"]) == \
        (1, 1, 0), view
    [r] = rest.get(f"/api/v1/executions/{eid}/responses").json()["data"]["responses"]
    assert r["status"] == "TIMEOUT" and r["output"].startswith("started") and "never" not in r["output"]
    assert r["error"] == FORGOTTEN
    assert AgentExecStatus.objects.get(execution_id=eid).attempts == 1
    time.sleep(2)
    assert ran.read_text() == "run\n"  # never run again
    assert result_queries(stack, "unknown") == unknown + 1


# --- delivery: commands lost on purpose ------------------------------------------------------------

@live
def test_commands_lost_on_purpose_still_run_exactly_once_on_every_agent(stack, rest, tmp_path):
    """A swarm that loses messages on purpose (agent_swarm --lossy): in two of every six agents, one
    ignores the first delivery of the command, the other runs it but its answers are lost until the
    command arrives again. The server re-sends what is not acknowledged (with Redis: the Celery worker's
    countdown task; embedded: a timer on daphne's event loop), each agent runs the command exactly
    once, and the execution ends succeeded with exact counters."""
    n, k = 60, 6
    out = io.StringIO()
    call_command("mint_device_token", "--name", "lossy swarm", "--max-uses", str(n), stdout=out)
    ran = tmp_path / "ran.txt"
    swarm = stack.spawn("swarm", [sys.executable, "manage.py", "agent_swarm", "--count", str(n), "--server",
                                  f"ws://127.0.0.1:{stack.server.port}", "--token", out.getvalue().strip(),
                                  "--state-dir", str(tmp_path / "swarm"), "--prefix", "lossy", "--lossy", str(k),
                                  "--record", str(ran)])
    wait_for(lambda: swarm.proc.poll() is None and Agent.objects.filter(hostname__startswith="lossy-",
                                                                        connected=True).count() == n,
             90, f"{n} simulated agents to connect", stack.logs)
    receipt = execute(rest, plugin="os", action="info", scope='hostname LIKE "lossy-*"')
    assert receipt["agents_reached"] == n
    eid, cid = receipt["execution_id"], receipt["command_id"]

    view = poll_terminal(rest, eid, 90, stack)
    assert view["status"] == "succeeded", view
    assert (view["agents_targeted"], view["agents_responded"], view["agents_success"], view["agents_failure"]) == \
        (n, n, n, 0)
    assert Response.objects.filter(execution_id=eid, status=AgentState.SUCCESS).count() == n == Response.objects.filter(
        execution_id=eid).count()
    # Every agent ran it exactly once: the lossy ones too, though they were sent it twice or more.
    runs = ran.read_text().split("\n")[:-1]
    assert sorted(runs) == sorted(f"lossy-{i:05d} {cid}" for i in range(n)), runs
    hostname = dict(Agent.objects.filter(hostname__startswith="lossy-").values_list("agent_id", "hostname"))
    attempts = {int(hostname[a][-5:]): tries for a, tries in
                AgentExecStatus.objects.filter(execution_id=eid).values_list("agent_id", "attempts")}
    lossy = [i for i in range(n) if i % k in (0, 1)]
    assert all(attempts[i] >= 2 for i in lossy), attempts
    assert view["resent"] == sum(tries - 1 for tries in attempts.values()) >= len(lossy)
    metrics = httpx.get(stack.server.base + "/metrics", timeout=10).text
    resent = re.search(r'^yuzu_fleet_command_sends_total\{attempt="resend"\} (\S+)$', metrics, re.M)
    assert resent and float(resent.group(1)) >= len(lossy), metrics[-2000:]


# --- docs/fleet.md stays true to the code ----------------------------------------------------------

FLEET_DOC = ROOT / "docs" / "fleet.md"
BEGIN, END = "<!-- plugin-table:begin (generated from fleet/agent/plugins.py by tests/e2e/test_fleet_e2e.py) -->", \
    "<!-- plugin-table:end -->"


def _param(name, spec, required):
    bits = ["required"] if name in required else []
    if "enum" in spec:
        bits.append("one of " + ", ".join(f"`{v}`" for v in spec["enum"]))
    if "pattern" in spec:
        bits.append(f"matching `{spec['pattern']}`")
    if "minLength" in spec or "maxLength" in spec:
        bits.append(f"{spec.get('minLength', 0)}–{spec['maxLength']} characters" if "maxLength" in spec
                    else f"at least {spec['minLength']} characters")
    return f"`{name}`" + (f" ({'; '.join(bits)})" if bits else "")


def plugin_table():
    """The plugin table of docs/fleet.md, from the declarations the agent reports at register."""
    from fleet.agent.plugins import PLUGINS

    rows = ["| plugin.action | risk | parameters (strings; any other key is REJECTED) |", "|---|---|---|"]
    for name, p in PLUGINS.items():
        params = p.params.get("properties", {})
        cell = ", ".join(_param(k, v, p.params.get("required", [])) for k, v in params.items()) or "—"
        cell = cell.replace("|", "\\|")  # a pipe inside a pattern would end the cell
        rows.append(f"| `{name}` | {p.risk} | {cell} |")
    return "\n".join(rows)


def test_the_plugin_table_in_docs_matches_the_declarations():
    """Regenerate with YUZU_WRITE_DOCS=1 when a plugin changes."""
    text = FLEET_DOC.read_text()
    head, rest = text.split(BEGIN + "\n", 1)
    body, tail = rest.split("\n" + END, 1)
    if os.environ.get("YUZU_WRITE_DOCS") == "1":
        FLEET_DOC.write_text(head + BEGIN + "\n" + plugin_table() + "\n" + END + tail)
    else:
        assert body == plugin_table(), "docs/fleet.md's plugin table is stale: rerun with YUZU_WRITE_DOCS=1"


def test_the_scope_section_in_docs_covers_describe():
    from fleet.scope import describe, parse

    text = FLEET_DOC.read_text()
    d = describe()
    for example in d["examples"]:
        assert f"`{example}`" in text, example
        parse(example)
    for item in d["attributes"]:
        assert f"`{item['name']}`" in text, item
    for item in d["operators"]:
        assert f"`{item['operator']}`" in text, item
    for item in d["functions"]:
        assert f"`{item['name']}" in text, item
    assert f"{d['max_depth']} levels" in text and f"{d['max_length_bytes']} bytes" in text
