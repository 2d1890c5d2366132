"""The agent's plugins, run for real on this Linux machine, and the agent program's command handling."""

import asyncio
import hashlib
import json
import os
import socket
import stat
import time

import psutil
import pytest
import websockets

from fleet.agent.client import AgentClient
from fleet.agent.inventory_sync import InventorySync
from fleet.agent.plugins import PLUGINS, Context, allowed, catalogue, execute


def run(plugin, action, params=None, **config):
    return execute(PLUGINS, plugin, action, params or {}, Context(config=config, server="ws://127.0.0.1:8000"))


def data(result):
    assert result.status == "SUCCESS", result
    return json.loads(result.output)


def test_catalogue_declares_risk_and_schema_for_every_plugin():
    cat = catalogue()
    assert {"os.info", "system.uptime", "process.list", "disk.usage", "network.interfaces", "reboot.pending",
            "file.hash", "service.status", "script.run", "quarantine.quarantine"} <= set(cat)
    for name, entry in cat.items():
        assert entry["risk"] in ("read", "write", "destructive"), name
        assert entry["params"]["type"] == "object" and entry["params"]["additionalProperties"] is False
    assert cat["script.run"]["risk"] == "write" and cat["quarantine.quarantine"]["risk"] == "destructive"
    assert cat["file.hash"]["params"]["required"] == ["path"]


def test_os_info():
    info = data(run("os", "info"))
    assert info["hostname"] == socket.gethostname()
    assert info["system"] == "Linux" and info["kernel"] == os.uname().release
    assert info["cpu_count"] == psutil.cpu_count() and info["memory_total"] > 0


def test_system_uptime():
    up = data(run("system", "uptime"))
    assert abs(up["uptime_seconds"] - (time.time() - psutil.boot_time())) < 5
    assert len(up["load_average"]) == 3


def test_process_list_finds_this_process_and_honours_limit():
    procs = data(run("process", "list", {"limit": "9999999"}))  # the default (200) may stop short of this pid
    assert os.getpid() in {p["pid"] for p in procs["processes"]}
    assert len(data(run("process", "list"))["processes"]) == min(200, procs["count"])
    mine = data(run("process", "list", {"name": psutil.Process().name()}))
    assert mine["count"] >= 1 and all(psutil.Process().name().lower() in p["name"].lower() for p in mine["processes"])
    assert len(data(run("process", "list", {"limit": "1"}))["processes"]) == 1


def test_disk_usage():
    disks = data(run("disk", "usage"))["disks"]
    assert disks and all(d["total"] >= d["used"] >= 0 for d in disks)
    root = data(run("disk", "usage", {"path": "/"}))["disks"][0]
    assert root["total"] == psutil.disk_usage("/").total
    assert run("disk", "usage", {"path": "/no/such/dir"}).status == "FAILURE"


def test_network_interfaces_include_loopback():
    ifaces = {i["name"]: i for i in data(run("network", "interfaces"))["interfaces"]}
    assert "lo" in ifaces
    assert any(a["family"] == "ipv4" and a["address"] == "127.0.0.1" for a in ifaces["lo"]["addresses"])


def test_reboot_pending_reports_a_boolean_with_reasons():
    out = data(run("reboot", "pending"))
    assert isinstance(out["reboot_pending"], bool) and out["reboot_pending"] == bool(out["reasons"])


@pytest.mark.parametrize("algorithm", ["sha256", "sha1", "sha512", "md5"])
def test_file_hash_matches_hashlib(tmp_path, algorithm):
    f = tmp_path / "blob.bin"
    f.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    out = data(run("file", "hash", {"path": str(f), "algorithm": algorithm}))
    assert out["hash"] == hashlib.new(algorithm, f.read_bytes()).hexdigest()
    assert out["size"] == f.stat().st_size and out["algorithm"] == algorithm


def test_file_hash_defaults_to_sha256_and_fails_cleanly_on_a_missing_file(tmp_path):
    f = tmp_path / "x"
    f.write_text("yuzu")
    assert data(run("file", "hash", {"path": str(f)}))["hash"] == hashlib.sha256(b"yuzu").hexdigest()
    missing = run("file", "hash", {"path": str(tmp_path / "nope")})
    assert missing.status == "FAILURE" and "cannot read" in missing.error


def test_service_status_is_real_or_clearly_unsupported():
    result = run("service", "status", {"name": "ssh.service"})
    if os.path.isdir("/run/systemd/system"):
        assert data(result)["properties"]["Id"]
    else:
        assert result.status == "FAILURE" and result.error.startswith("unsupported:")
        assert json.loads(result.output)["result"] == "unsupported"


@pytest.mark.parametrize("plugin,action,params,why", [
    ("nope", "nothing", {}, "unknown plugin/action"),
    ("os", "reboot", {}, "unknown plugin/action"),
    ("file", "hash", {}, "'path' is a required property"),
    ("file", "hash", {"path": "/etc/hostname", "algorithm": "crc32"}, "is not one of"),
    ("os", "info", {"extra": "1"}, "Additional properties"),
    ("process", "list", {"limit": "many"}, "does not match"),
    ("service", "status", {"name": "x; reboot"}, "does not match"),
])
def test_unknown_actions_and_invalid_parameters_are_rejected(plugin, action, params, why):
    result = run(plugin, action, params)
    assert result.status == "REJECTED" and why in result.error


def test_a_plugin_exception_is_a_failure_not_a_crash(monkeypatch):
    from fleet.agent import plugins

    broken = plugins.Plugin("boom.now", "read", plugins.schema(), lambda p, c: 1 / 0)
    result = execute({"boom.now": broken}, "boom", "now", {}, Context())
    assert result.status == "FAILURE" and "ZeroDivisionError" in result.error


# --- script.run --------------------------------------------------------------------------------

ALLOW = [["echo", "**"], ["sleep", "*"], ["head", "-c", "*", "/dev/zero"], ["sh", "-c", "exit 3"]]


def test_allow_list_matching():
    assert allowed(["echo"], ALLOW) and allowed(["echo", "a", "b"], ALLOW)
    assert allowed(["sleep", "5"], ALLOW) and not allowed(["sleep"], ALLOW) and not allowed(["sleep", "1", "2"], ALLOW)
    assert not allowed(["rm", "-rf", "/"], ALLOW) and not allowed(["sh", "-c", "id"], ALLOW)


def test_script_run_refuses_argv_not_on_the_allow_list(tmp_path):
    marker = tmp_path / "ran"
    result = run("script", "run", {"argv": json.dumps(["touch", str(marker)])}, script_allow=ALLOW)
    assert result.status == "REJECTED" and "allow-list" in result.error and not marker.exists()
    assert run("script", "run", {"argv": "echo hi"}).status == "REJECTED"  # an empty allow-list allows nothing


def test_script_run_executes_without_a_shell():
    result = run("script", "run", {"argv": json.dumps(["echo", "$HOME;", "id", "|", "cat"])}, script_allow=ALLOW)
    assert result.status == "SUCCESS" and result.exit_code == 0
    assert result.output == "$HOME; id | cat\n"
    assert run("script", "run", {"argv": "echo 'two words'"}, script_allow=ALLOW).output == "two words\n"


def test_script_run_reports_a_nonzero_exit_as_failure():
    result = run("script", "run", {"argv": json.dumps(["sh", "-c", "exit 3"])}, script_allow=ALLOW)
    assert result.status == "FAILURE" and result.exit_code == 3


def test_script_run_honours_the_timeout():
    started = time.monotonic()
    result = run("script", "run", {"argv": "sleep 30", "timeout": "1"}, script_allow=ALLOW)
    assert result.status == "TIMEOUT" and result.exit_code is None
    assert time.monotonic() - started < 10


def test_script_run_timeout_is_capped_by_the_agent_config():
    started = time.monotonic()
    result = run("script", "run", {"argv": "sleep 30", "timeout": "600"}, script_allow=ALLOW, script_timeout_max=1)
    assert result.status == "TIMEOUT" and time.monotonic() - started < 10


def test_script_run_streams_progress_while_running():
    seen = []
    ctx = Context(config={"script_allow": [["sh", "-c", "*"]]}, progress=seen.append)
    argv = json.dumps(["sh", "-c", "echo one; sleep 1.5; echo two"])
    result = execute(PLUGINS, "script", "run", {"argv": argv}, ctx)
    assert result.status == "SUCCESS" and result.output == "one\ntwo\n"
    assert seen and seen[0] == "one\n"  # partial output, before the process finished


def test_script_run_caps_output():
    result = run("script", "run", {"argv": "head -c 200000 /dev/zero"}, script_allow=ALLOW, script_output_cap=1000)
    assert result.status == "SUCCESS"
    body, _, note = result.output.rpartition("\n")
    assert len(body.encode()) == 1000 and note == "[output truncated at 1000 bytes]"


# --- quarantine --------------------------------------------------------------------------------

def test_quarantine_is_a_dry_run_report_by_default(monkeypatch):
    calls = []
    monkeypatch.setattr("fleet.agent.plugins.subprocess.run", lambda *a, **k: calls.append(a))
    out = data(run("quarantine", "quarantine", {"allow": "10.0.0.5"}))
    assert out["enforced"] is False and out["mode"] == "dry_run"
    assert "table inet yuzu_quarantine" in out["ruleset"] and "policy drop" in out["ruleset"]
    assert "127.0.0.1" in out["keeps_reachable"] and "10.0.0.5" in out["keeps_reachable"]
    assert out["changes"] and calls == []  # nothing was applied
    assert data(run("quarantine", "release"))["enforced"] is False


# --- the agent program's command handling ------------------------------------------------------

class ScriptedServer:
    """A minimal server speaking the agent protocol, to drive the real AgentClient over a real socket."""

    def __init__(self, commands):
        self.commands, self.received = commands, []
        self.done = asyncio.Event()

    async def handler(self, ws):
        async for raw in ws:
            msg = json.loads(raw)
            self.received.append(msg)
            if msg["type"] == "enroll":
                await ws.send(json.dumps({"type": "enrolled", "agent_id": "a1", "credential": "yza_test"}))
            elif msg["type"] == "register":
                await ws.send(json.dumps({"type": "registered", "agent_id": "a1", "heartbeat_interval": 0.2,
                                          "tags": {"role": "web"}}))
                for c in self.commands:
                    await ws.send(json.dumps({"type": "command", "expires_at": time.time() + 60, **c}))
            terminal = {m["command_id"] for m in self.received if m["type"] == "response" and m["status"] != "RUNNING"}
            beats = [m for m in self.received if m["type"] == "heartbeat"]
            if terminal == {c["command_id"] for c in self.commands} and len(beats) >= 2:
                self.done.set()


def test_agent_program_enrols_registers_and_answers_commands(tmp_path):
    commands = [
        {"command_id": "c-sleep", "plugin": "script", "action": "run", "parameters": {"argv": "sleep 1"}},
        {"command_id": "c-os", "plugin": "os", "action": "info", "parameters": {}},
        {"command_id": "c-unknown", "plugin": "nope", "action": "x", "parameters": {}},
        {"command_id": "c-bad", "plugin": "file", "action": "hash", "parameters": {"algorithm": "md5"}},
        {"command_id": "c-os", "plugin": "os", "action": "info", "parameters": {}},  # redelivered: runs once
    ]
    server = ScriptedServer(commands)

    async def scenario():
        async with websockets.serve(server.handler, "127.0.0.1", 0) as srv:
            port = srv.sockets[0].getsockname()[1]
            client = AgentClient(f"ws://127.0.0.1:{port}", "yzd_x", tmp_path,
                                 config={"tags": {"role": "web"}, "script_allow": [["sleep", "*"]]})
            task = asyncio.create_task(client.run())
            await asyncio.wait_for(server.done.wait(), 20)
            await asyncio.sleep(0.3)
            task.cancel()
            return client

    client = asyncio.run(scenario())
    kinds = [m["type"] for m in server.received]
    assert kinds[:3] == ["enroll", "register", "inventory"]
    register = server.received[1]
    assert register["agent_id"] == "a1" and register["credential"] == "yza_test" and register["tags"] == {"role": "web"}
    assert register["plugins"]["file.hash"]["risk"] == "read" and register["os"] == "linux"
    assert server.received[2]["plugin"] == "os" and server.received[2]["data"]["hostname"]
    state = tmp_path / "state.json"
    assert json.loads(state.read_text())["agent_id"] == "a1"
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert client.tags == {"role": "web"}
    responses = {}
    for m in server.received:
        if m["type"] == "response":
            responses.setdefault(m["command_id"], []).append(m)
    assert [r["status"] for r in responses["c-sleep"]] == ["RUNNING", "SUCCESS"]  # no output, no progress frames
    # Run once despite the re-send: the repeat is answered with `received` (still running) or with
    # the same terminal frame again (done), never run a second time.
    statuses = [r["status"] for r in responses["c-os"]]
    assert statuses[:2] == ["RUNNING", "SUCCESS"] and set(statuses[2:]) <= {"SUCCESS"}
    assert all(r == responses["c-os"][1] for r in responses["c-os"][1:])
    assert len([m for m in server.received if m["type"] == "received"]) + len(statuses) == 3
    assert json.loads(responses["c-os"][-1]["output"])["system"] == "Linux"
    assert [r["status"] for r in responses["c-unknown"]] == ["REJECTED"]
    assert responses["c-bad"][-1]["status"] == "REJECTED" and "path" in responses["c-bad"][-1]["error"]
    # Heartbeats kept flowing while the sleep ran in the thread pool.
    sleep_end = server.received.index(responses["c-sleep"][-1])
    assert any(m["type"] == "heartbeat" for m in server.received[3:sleep_end])


def test_a_result_finished_while_disconnected_is_sent_after_reconnecting(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"agent_id": "a1", "credential": "yza_test"}))
    connections, got = [], asyncio.Event()

    async def handler(ws):
        connections.append(ws)
        async for raw in ws:
            msg = json.loads(raw)
            if msg["type"] == "register":
                await ws.send(json.dumps({"type": "registered", "agent_id": "a1", "heartbeat_interval": 30}))
                if len(connections) == 1:  # first connection: send a command, then drop the agent
                    await ws.send(json.dumps({"type": "command", "command_id": "c1", "plugin": "script",
                                              "action": "run", "parameters": {"argv": "sleep 1"}}))
                    await asyncio.sleep(0.2)
                    await ws.close()
            elif msg["type"] == "response" and msg["status"] == "SUCCESS" and len(connections) == 2:
                got.set()

    async def scenario():
        async with websockets.serve(handler, "127.0.0.1", 0) as srv:
            port = srv.sockets[0].getsockname()[1]
            client = AgentClient(f"ws://127.0.0.1:{port}", None, tmp_path, config={"script_allow": [["sleep", "*"]]})
            task = asyncio.create_task(client.run())
            await asyncio.wait_for(got.wait(), 20)
            task.cancel()

    asyncio.run(scenario())
    assert len(connections) == 2


def test_a_re_sent_command_runs_once_across_reconnects_and_gets_the_kept_result(tmp_path):
    """The server re-sends a command it has no acknowledgement for. While it runs the agent answers
    `received`; once done, with the terminal frame it kept — also on a later connection."""
    (tmp_path / "state.json").write_text(json.dumps({"agent_id": "a1", "credential": "yza_test"}))
    command = {"type": "command", "command_id": "c1", "plugin": "script", "action": "run",
               "parameters": {"argv": "sleep 1"}}
    frames, connections, done = [], [], asyncio.Event()

    async def handler(ws):
        connections.append(ws)
        async for raw in ws:
            msg = json.loads(raw)
            frames.append((len(connections), msg))
            if msg["type"] == "register":
                await ws.send(json.dumps({"type": "registered", "agent_id": "a1", "heartbeat_interval": 30}))
                await ws.send(json.dumps(command))
                if len(connections) == 1:
                    await ws.send(json.dumps(command))  # a re-send while it runs
            elif msg["type"] == "response" and msg["status"] == "SUCCESS":
                if len(connections) == 1:
                    await ws.close()  # the agent reconnects; the server re-sends once more
                else:
                    done.set()

    async def scenario():
        async with websockets.serve(handler, "127.0.0.1", 0) as srv:
            port = srv.sockets[0].getsockname()[1]
            client = AgentClient(f"ws://127.0.0.1:{port}", None, tmp_path, config={"script_allow": [["sleep", "*"]]})
            task = asyncio.create_task(client.run())
            await asyncio.wait_for(done.wait(), 30)
            task.cancel()

    asyncio.run(scenario())
    about = [(n, m["type"], m.get("status")) for n, m in frames if m.get("command_id") == "c1"]
    assert about == [(1, "response", "RUNNING"), (1, "received", None), (1, "response", "SUCCESS"),
                     (2, "response", "SUCCESS")]
    first, second = [m for _, m in frames if m.get("status") == "SUCCESS"]
    assert first == second and first["exit_code"] == 0


def test_a_result_query_is_answered_from_what_the_agent_kept_and_a_malformed_one_is_ignored(tmp_path):
    """After a register the server asks about the commands it holds as running: the agent sends the terminal
    frame it kept again, says which still run and which it does not know, and runs none of them again."""
    (tmp_path / "state.json").write_text(json.dumps({"agent_id": "a1", "credential": "yza_test"}))
    slow = {"type": "command", "command_id": "c-slow", "plugin": "script", "action": "run",
            "parameters": {"argv": "sleep 2"}}
    quick = {"type": "command", "command_id": "c-quick", "plugin": "os", "action": "info", "parameters": {}}
    malformed = [{"command_ids": "c-quick"}, {"command_ids": []}, {"command_ids": ["x" * 161]},
                 {"command_ids": ["c-quick"] * 101}, {"command_ids": [7]}, {}]
    frames, connections, done = [], [], asyncio.Event()

    async def handler(ws):
        connections.append(ws)
        async for raw in ws:
            msg = json.loads(raw)
            frames.append((len(connections), msg))
            if msg["type"] == "register":
                await ws.send(json.dumps({"type": "registered", "agent_id": "a1", "heartbeat_interval": 30}))
                if len(connections) == 1:
                    await ws.send(json.dumps(slow))
                    await ws.send(json.dumps(quick))
                else:
                    for bad in malformed:
                        await ws.send(json.dumps({"type": "result.query", **bad}))
                    await ws.send(json.dumps({"type": "result.query",
                                              "command_ids": ["c-quick", "c-slow", "c-other", "c-quick"]}))
            elif msg.get("command_id") == "c-quick" and msg.get("status") == "SUCCESS" and len(connections) == 1:
                await ws.close()  # as if this answer had been lost with the connection
            elif msg.get("command_id") == "c-slow" and msg.get("status") == "SUCCESS":
                done.set()

    async def scenario():
        async with websockets.serve(handler, "127.0.0.1", 0) as srv:
            port = srv.sockets[0].getsockname()[1]
            client = AgentClient(f"ws://127.0.0.1:{port}", None, tmp_path, config={"script_allow": [["sleep", "*"]]})
            task = asyncio.create_task(client.run())
            await asyncio.wait_for(done.wait(), 30)
            task.cancel()
            return client

    client = asyncio.run(scenario())
    assert client.refused_frames == len(malformed)
    second = [m for n, m in frames if n == 2 and m["type"] in ("response", "result.answer")]
    answers = [m for m in second if m["type"] == "result.answer"]
    assert answers == [{"type": "result.answer", "kept": ["c-quick"], "running": ["c-slow"], "unknown": ["c-other"]}]
    quick_frames = [m for _, m in frames if m.get("command_id") == "c-quick" and m.get("status") == "SUCCESS"]
    assert len(quick_frames) == 2 and quick_frames[0] == quick_frames[1]  # the kept frame, sent again
    assert second.index(quick_frames[1]) < second.index(answers[0])  # before the answer that says "kept"
    # Each ran once: one RUNNING frame each, and the slow one's terminal frame came when it finished.
    running = [m["command_id"] for _, m in frames if m.get("status") == "RUNNING"]
    assert sorted(running) == ["c-quick", "c-slow"]
    assert [n for n, m in frames if m.get("command_id") == "c-slow" and m.get("status") == "SUCCESS"] == [2]


def test_the_software_sync_state_is_owner_only(tmp_path):
    """var/agent/software-sync.json was written 0644: the start-up check (yuzu.W001) reported it on a fresh make run."""
    path = tmp_path / "software-sync.json"
    path.write_text("{}")
    os.chmod(path, 0o644)  # an install from before the fix: rewritten private
    sync = InventorySync(None, path, "a1", {})
    sync._save({"hash": "abc"})
    assert sync._state() == {"hash": "abc"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["software-sync.json"]
