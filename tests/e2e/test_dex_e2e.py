"""DEX end to end, every part a real process (issue 18, "Must show"): daphne, the background workers, two real
agents (`python -m fleet.agent`) reading this machine through psutil and /proc, a bounded CPU load, and the
official MCP Python client (tests/mcp_client/drive.py in .venv-mcp).

- the busy agent's heartbeat facts arrive; the one started with --dex-disable sends none and is listed by
  list_dex_perf_devices filter=not_reporting;
- a bounded busy loop on every core (each a process named ``yuzu-burn``: a symlink to this Python, so its
  version is the package version dpkg/rpm gives for the real interpreter) makes perf.cpu_sustained fire for the
  reporting agent (the sustain window is shortened to seconds by its config), list_dex_perf_devices orders it
  first, and the agent's app rows carry ``yuzu-burn``;
- compare_app_perf_versions: the agent's real rows of today are the candidate version; its baseline days on an
  older version are seeded rows of the days before (a real upgrade history takes days), with a lower CPU, so the
  right direction is "up".

The whole load is bounded: the busy loops end by themselves after BURN_S seconds, and are killed at the end."""

import io
import json
import os
import subprocess
import sys
from datetime import timedelta

import psutil
import pytest
from django.core.management import call_command
from django.utils import timezone

from dex.models import AppDay, DeviceFacts, Observation
from fleet.models import Agent, ManagementGroup
from tests.e2e.test_compliance_e2e import AGENT_MAIN, official_client
from tests.e2e.test_fleet_e2e import live
from tests.support.stack import Proc, Stack, wait_for
from yuzu.rbac import seed_builtin_roles
from yuzu.testing import ROOT

HEARTBEAT_S = 2
SUSTAIN_S = 8
BURN_S = 90
BURN = "import time\nend = time.time() + {s}\nwhile time.time() < end:\n    pass\n"


@pytest.fixture
def dstack(daphne, tmp_path):
    seed_builtin_roles()
    s = Stack(daphne(YUZU_AGENT_HEARTBEAT_S=HEARTBEAT_S), tmp_path)
    yield s
    s.close()


def start_agent(stack, name, config, *extra):
    out = io.StringIO()
    call_command("mint_device_token", "--name", f"dex e2e {name}", "--max-uses", "1", stdout=out)
    home = stack.tmp_path / name
    home.mkdir()
    (home / "config.json").write_text(json.dumps(config))
    args = ["--server", f"ws://127.0.0.1:{stack.server.port}", "--token", out.getvalue().strip(),
            "--state-dir", str(home), *extra]
    proc = Proc(f"agent-{name}", [sys.executable, "-c", AGENT_MAIN.format(root=str(ROOT), cwd=str(home), args=args)],
                stack.tmp_path, stack.env)
    stack.procs.append(proc)

    def connected():
        if proc.proc.poll() is not None:
            pytest.fail(f"agent {name} exited with {proc.proc.returncode}\n{stack.logs()}")
        state = home / "state.json"
        agent_id = json.loads(state.read_text())["agent_id"] if state.exists() else None
        return agent_id if agent_id and Agent.objects.filter(pk=agent_id, connected=True).exists() else None

    return wait_for(connected, 30, f"agent {name} to connect", stack.logs)


def burn(tmp_path):
    """One bounded busy loop per core, each a process named yuzu-burn."""
    exe = tmp_path / "yuzu-burn"
    exe.symlink_to(os.path.realpath(sys.executable))
    return [subprocess.Popen([str(exe), "-c", BURN.format(s=BURN_S)]) for _ in range(psutil.cpu_count() or 1)]


@live
def test_real_telemetry_signals_app_rows_and_version_comparison(dstack, mint):
    stack = dstack
    busy = start_agent(stack, "busy", {"procperf_enabled": True, "procperf_send_s": 2, "dex_sustain_s": SUSTAIN_S})
    quiet = start_agent(stack, "quiet", {}, "--dex-disable")
    wait_for(lambda: DeviceFacts.objects.filter(agent_id=busy, cpu_pct__isnull=False).exists(), 30,
             "the busy agent's first perf facts", stack.logs)
    assert not DeviceFacts.objects.filter(agent_id=quiet).exists()  # --dex-disable: nothing at all

    loops = burn(stack.tmp_path)
    try:
        wait_for(lambda: Observation.objects.filter(agent_id=busy, obs_type="perf.cpu_sustained").exists(),
                 SUSTAIN_S + 40, "perf.cpu_sustained from the busy agent",
                 lambda: f"{list(DeviceFacts.objects.values())}\n{stack.logs()}")
        wait_for(lambda: AppDay.objects.filter(agent_id=busy, app_name="yuzu-burn").exists(), 30,
                 "the busy agent's app rows to carry yuzu-burn", stack.logs)
        wait_for(lambda: (DeviceFacts.objects.get(agent_id=busy).cpu_pct or 0) >= 90, 20, "a busy heartbeat",
                 stack.logs)
        signal = Observation.objects.filter(agent_id=busy, obs_type="perf.cpu_sustained").first()
        assert signal.detail["metric"] >= 90 and signal.platform == "linux"
        def burning():  # the summary is cumulative: its first rows include the loops' first (0 %) samples
            row = AppDay.objects.filter(agent_id=busy, app_name="yuzu-burn", day=timezone.now().date()).first()
            return row if row and row.cpu_avg > 5 and row.instances_max == len(loops) else None

        row = wait_for(burning, 40, "yuzu-burn's daily row to show the load",
                       lambda: f"{list(AppDay.objects.filter(app_name='yuzu-burn').values())}\n{stack.logs()}")
        assert row.ws_avg_bytes > 0 and AppDay.objects.filter(agent_id=busy, app_name="yuzu-burn").count() == 1

        # History before the upgrade: the same machine on an older version, lighter, on the days before.
        group = ManagementGroup.objects.create(name="dex-e2e")
        group.members.add(busy, quiet)
        for d in (3, 2, 1):
            AppDay.objects.create(agent_id=busy, app_name="yuzu-burn", version="0.9-baseline",
                                  day=timezone.now().date() - timedelta(days=d), samples=100, instances_max=1,
                                  cpu_avg=1.0, cpu_max=2.0, ws_avg_bytes=row.ws_avg_bytes,
                                  ws_max_bytes=row.ws_max_bytes)

        reader = mint("dex-reader", role="Viewer", tier="readonly")
        obs = official_client(stack, reader, [
            {"op": "list", "kind": "tools"},
            {"op": "call", "tool": "list_dex_signals", "args": {"window": "24h"}, "as": "signals"},
            {"op": "call", "tool": "get_dex_signal_detail", "args": {"obs_type": "perf.cpu_sustained"},
             "as": "detail"},
            {"op": "call", "tool": "get_dex_perf_fleet", "args": {}, "as": "fleet"},
            {"op": "call", "tool": "list_dex_perf_devices", "args": {"metric": "cpu"}, "as": "devices"},
            {"op": "call", "tool": "list_dex_perf_devices", "args": {"filter": "not_reporting"}, "as": "silent"},
            {"op": "call", "tool": "list_dex_perf_apps", "args": {}, "as": "apps"},
            {"op": "call", "tool": "get_dex_app_perf", "args": {"app": "yuzu-burn"}, "as": "app"},
            {"op": "call", "tool": "compare_app_perf_versions",
             "args": {"app": "yuzu-burn", "group": "dex-e2e", "baseline": "0.9-baseline",
                      "candidate": "$candidate", "window": 7}, "as": "compare"},
            {"op": "call", "tool": "get_network_fleet", "args": {}, "as": "net"},
            {"op": "call", "tool": "list_network_devices", "args": {}, "as": "net_devices"},
        ], candidate=row.version)
    finally:
        for p in loops:
            p.kill()
            p.wait(timeout=10)

    calls = obs["calls"]
    for label, call in calls.items():
        assert call["is_error"] is False and call["schema_valid"], (label, call)
    assert {"list_dex_signals", "compare_app_perf_versions", "list_network_devices"} <= set(
        obs["lists"]["tools"]["names"])
    signals = {s["obs_type"]: s for s in calls["signals"]["structured"]["signals"]}
    assert signals["perf.cpu_sustained"]["distinct_devices"] == 1
    assert calls["detail"]["structured"]["devices"][0]["agent_id"] == busy
    assert calls["devices"]["structured"]["devices"][0]["agent_id"] == busy  # the loaded machine's agent first
    assert [d["agent_id"] for d in calls["silent"]["structured"]["devices"]] == [quiet]
    fleet = calls["fleet"]["structured"]
    assert fleet["reporting"] == 1 and fleet["windows_online"] == 2 and fleet["cpu_pct"]["n"] == 1
    assert "yuzu-burn" in {a["app_name"] for a in calls["apps"]["structured"]["apps"]}
    points = calls["app"]["structured"]["points"]
    assert points and all(p["suppressed"] for p in points)  # one device: below the floor of 10, counts only
    cmp = calls["compare"]["structured"]
    assert (cmp["paired"], cmp["small_cohort"], cmp["insufficient"]) == (1, True, False), cmp
    assert cmp["distribution"] == {"up": 1, "flat": 0, "down": 0}
    assert cmp["cpu"]["after_mean"] > cmp["cpu"]["before_mean"] == 1.0 and cmp["cpu"]["delta_median"] > 0
    net = calls["net"]["structured"]
    assert net["online"] == 2 and net["reporting"] == 1
    assert net["cooccurrence"]["degraded"] == 0  # agents send no degraded flag (no calibrated threshold)
