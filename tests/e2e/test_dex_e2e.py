"""DEX end to end, every part a real process (issue 18, "Must show"): daphne, the background workers, real agents
(`python -m fleet.agent`) reading this machine through psutil and /proc, bounded CPU loads, and the official MCP
Python client (tests/mcp_client/drive.py in .venv-mcp).

test_real_telemetry_signals_and_app_rows:
- the busy agent's heartbeat facts arrive; the one started with --dex-disable sends none and is listed by
  list_dex_perf_devices filter=not_reporting;
- a bounded busy loop on every core (each a process named ``yuzu-burn``: a symlink to this Python, so its
  version is the package version dpkg/rpm gives for the real interpreter) makes perf.cpu_sustained fire for the
  reporting agent (the sustain window is shortened to seconds by its config), list_dex_perf_devices orders it
  first, and the agent's app rows carry ``yuzu-burn``.

test_version_comparison_across_real_cohorts — compare_app_perf_versions on real rows only, nothing seeded:
- agents on one machine see every process, so each agent of the cohort runs in its own PID namespace with its own
  /proc (``unshare -p -f --mount-proc``) together with its own ``yuzu-burn``. Both are named ``yuzu-burn`` but
  are symlinks to two different real executables, so the agent resolves two real package versions (dpkg -S): the
  baseline is Perl (perl-base) running a light duty-cycled loop, the candidate is Python (python3.x-minimal)
  running a full busy loop;
- two machines (agents) in one management group, one on each version, at the same time: the tool counts one
  member per version (baseline_only 1, candidate_only 1) and gives no direction — different machines are not a
  before/after (the tool compares each machine around its own upgrade, docs/dex.md);
- then the baseline machine is upgraded: restarted (same identity) with the candidate's executable and load. Its
  transition must fall on a later UTC day than its baseline rows, and a real upgrade history takes days, so the
  test moves the day of that machine's real baseline row one day back — the only thing the test changes; every
  figure (samples, CPU, working set, version) is the agent's. The tool then pairs that machine, says "up", and
  its before/after means are exactly the two real rows' CPU averages.
Without unshare (or without two dpkg-resolvable interpreters) this test is skipped with the reason.

Every load is bounded: the busy loops end by themselves (BURN_S, COHORT_BURN_S seconds), and are killed at the end (a
namespace dies with its first process: unshare --kill-child)."""

import io
import json
import os
import shutil
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
# the baseline's lighter load: busy 15 ms of every 100 ms (Perl's core Time::HiRes), bounded the same way
LIGHT_PERL = "use Time::HiRes qw(time sleep); my $end = time + {s}; while (time < $end) {{ my $t = time + 0.015; " \
             "1 while time < $t; sleep 0.085 }}"
COHORT_BURN_S = 60  # each cohort phase stops its namespaces well before this
COHORT_SAMPLES = 4  # app samples (one per heartbeat) before a row is read: the first sample of a process is 0 %
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
# PID 1 of a private PID namespace: starts the busy process and the agent, and ends when the agent ends (the
# namespace, and so the busy process, dies with it; unshare --kill-child kills it if unshare is killed).
NS_MAIN = ("import subprocess, sys\nburn = subprocess.Popen({burn!r})\nagent = subprocess.Popen({agent!r})\n"
           "code = agent.wait()\nburn.kill()\nsys.exit(code)\n")


@pytest.fixture
def dstack(daphne, tmp_path):
    seed_builtin_roles()
    # These agents send their app summary every 2 s (procperf_send_s), where a real one sends it hourly: the budget
    # of 6 frames a minute an agent (dex.ingest) dropped the frames of an agent restarted within the minute, and
    # the cohort test waited in vain for its row. The budget has its own test (tests/dex/test_protocol.py).
    s = Stack(daphne(YUZU_AGENT_HEARTBEAT_S=HEARTBEAT_S, YUZU_DEX_APP_PERF_FRAMES_PER_MINUTE=120), tmp_path)
    yield s
    s.close()


def start_agent(stack, name, config, *extra, namespace_burn=None):
    """A real agent; the first start of ``name`` enrols it with a fresh token, a later one reuses its identity.
    ``namespace_burn`` (an argv): run the agent and that process in a private PID namespace with its own /proc, so
    the agent sees only them (see NS_MAIN)."""
    home = stack.tmp_path / name
    args = ["--server", f"ws://127.0.0.1:{stack.server.port}", "--state-dir", str(home), *extra]
    if not (home / "state.json").exists():
        out = io.StringIO()
        call_command("mint_device_token", "--name", f"dex e2e {name}", "--max-uses", "1", stdout=out)
        args += ["--token", out.getvalue().strip()]
    home.mkdir(exist_ok=True)
    (home / "config.json").write_text(json.dumps(config))
    main = AGENT_MAIN.format(root=str(ROOT), cwd=str(home), args=args)
    argv = [sys.executable, "-c", main]
    if namespace_burn is not None:
        argv = [*UNSHARE, sys.executable, "-c", NS_MAIN.format(burn=namespace_burn, agent=argv)]
    proc = Proc(f"agent-{name}", argv, stack.tmp_path, stack.env)
    stack.procs.append(proc)

    def connected():
        if proc.proc.poll() is not None:
            pytest.fail(f"agent {name} exited with {proc.proc.returncode}\n{stack.logs()}")
        state = home / "state.json"
        agent_id = json.loads(state.read_text())["agent_id"] if state.exists() else None
        return agent_id if agent_id and Agent.objects.filter(pk=agent_id, connected=True).exists() else None

    return wait_for(connected, 30, f"agent {name} to connect", stack.logs), proc


def burn(tmp_path):
    """One bounded busy loop per core, each a process named yuzu-burn."""
    exe = tmp_path / "yuzu-burn"
    exe.symlink_to(os.path.realpath(sys.executable))
    return [subprocess.Popen([str(exe), "-c", BURN.format(s=BURN_S)]) for _ in range(psutil.cpu_count() or 1)]


@live
def test_real_telemetry_signals_and_app_rows(dstack, mint):
    stack = dstack
    busy, _ = start_agent(stack, "busy", {"procperf_enabled": True, "procperf_send_s": 2,
                                          "dex_sustain_s": SUSTAIN_S})
    quiet, _ = start_agent(stack, "quiet", {}, "--dex-disable")
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
            {"op": "call", "tool": "get_network_fleet", "args": {}, "as": "net"},
            {"op": "call", "tool": "list_network_devices", "args": {}, "as": "net_devices"},
        ])
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
    net = calls["net"]["structured"]
    assert net["online"] == 2 and net["reporting"] == 1
    assert net["cooccurrence"]["degraded"] == 0  # agents send no degraded flag (no calibrated threshold)


def package_version(exe):
    """The version of the Debian package owning ``exe`` (dpkg -S, dpkg-query), or "" — checked independently of
    the agent, which must find the same."""
    if shutil.which("dpkg") is None or not os.path.exists(exe):
        return ""
    owner = subprocess.run(["dpkg", "-S", exe], capture_output=True, text=True, timeout=10, check=False)
    if owner.returncode != 0 or ":" not in owner.stdout:
        return ""
    pkg = owner.stdout.split(":", 1)[0].split(",")[0].strip()
    q = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True, timeout=10,
                       check=False)
    return q.stdout.strip() if q.returncode == 0 else ""


@pytest.fixture
def cohort(tmp_path):
    """Two real executables with different package versions, each behind a symlink named yuzu-burn, and their
    bounded loads; skips (with the reason) where private PID namespaces or the two packaged interpreters are
    missing. Runs before the stack starts, so a skip costs nothing."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is missing: the cohort agents need private PID namespaces")
    probe = subprocess.run([*UNSHARE, "sh", "-c", "echo $$"], capture_output=True, text=True, timeout=10,
                           check=False)
    if probe.returncode != 0 or probe.stdout.strip() != "1":
        pytest.skip("no private PID namespace here (`unshare --pid --fork --mount-proc` needs root or user "
                    f"namespaces): exit {probe.returncode}, {probe.stderr.strip()[:200]}")
    exes = {"baseline": os.path.realpath("/usr/bin/perl"), "candidate": os.path.realpath("/usr/bin/python3")}
    versions = {k: package_version(exe) for k, exe in exes.items()}
    if not all(versions.values()) or versions["baseline"] == versions["candidate"]:
        pytest.skip("needs /usr/bin/perl and /usr/bin/python3 owned by dpkg packages of different versions: "
                    f"{versions}")
    out = {}
    for side, exe in exes.items():
        link = tmp_path / f"burn-{side}" / "yuzu-burn"
        link.parent.mkdir()
        link.symlink_to(exe)
        argv = ([str(link), "-e", LIGHT_PERL.format(s=COHORT_BURN_S)] if side == "baseline"
                else [str(link), "-I", "-c", BURN.format(s=COHORT_BURN_S)])
        out[side] = (argv, versions[side])
    return out


def wait_row(stack, agent_id, version):
    """The agent's row of today for yuzu-burn at ``version`` once it holds COHORT_SAMPLES samples."""
    def ready():
        row = AppDay.objects.filter(agent_id=agent_id, app_name="yuzu-burn", version=version,
                                    day=timezone.now().date()).first()
        return row if row and row.samples >= COHORT_SAMPLES else None

    return wait_for(ready, 40, f"{agent_id}'s yuzu-burn row at {version}",
                    lambda: f"{list(AppDay.objects.filter(app_name='yuzu-burn').values())}\n{stack.logs()}")


def stop(stack, proc, agent_id):
    """Stop an agent and its namespace, and wait until the server saw it go (every frame it sent is stored: the
    connection's frames are handled in order, before its close)."""
    proc.stop()
    wait_for(lambda: not Agent.objects.filter(pk=agent_id, connected=True).exists(), 20,
             f"{agent_id} to disconnect", stack.logs)


@live
def test_version_comparison_across_real_cohorts(cohort, dstack, mint):
    stack = dstack
    (base_argv, base_version), (cand_argv, cand_version) = cohort["baseline"], cohort["candidate"]
    config = {"procperf_enabled": True, "procperf_send_s": 2}
    today = timezone.now().date()
    try:
        # Two machines at the same time, one per version, each alone with its yuzu-burn in its own namespace.
        old, old_proc = start_agent(stack, "old", config, namespace_burn=base_argv)
        new, new_proc = start_agent(stack, "new", config, namespace_burn=cand_argv)
        group = ManagementGroup.objects.create(name="dex-cohort")
        group.members.add(old, new)
        wait_row(stack, old, base_version)
        wait_row(stack, new, cand_version)
        stop(stack, old_proc, old)
        stop(stack, new_proc, new)
        old_base = AppDay.objects.get(agent_id=old, app_name="yuzu-burn", version=base_version, day=today)
        new_cand = AppDay.objects.get(agent_id=new, app_name="yuzu-burn", version=cand_version, day=today)
        # each agent saw only its own namespace: one yuzu-burn, at its own version
        assert list(AppDay.objects.filter(app_name="yuzu-burn").values_list("agent_id", "version").order_by(
            "agent_id")) == sorted([(old, base_version), (new, cand_version)])
        assert old_base.instances_max == new_cand.instances_max == 1
        assert 0 < old_base.cpu_avg < new_cand.cpu_avg and old_base.ws_avg_bytes > 0 and new_cand.ws_avg_bytes > 0

        reader = mint("dex-cohort-reader", role="Viewer", tier="readonly")
        compare = {"op": "call", "tool": "compare_app_perf_versions",
                   "args": {"app": "yuzu-burn", "group": "dex-cohort", "baseline": base_version,
                            "candidate": cand_version, "window": 7}}
        tools = {"op": "list", "kind": "tools"}  # the output schemas the calls are checked against
        split = official_client(stack, reader, [
            tools,
            {**compare, "as": "compare"},
            {"op": "call", "tool": "get_dex_group_app_perf", "args": {"group_id": str(group.pk), "app": "yuzu-burn"},
             "as": "group"},
        ])["calls"]

        # The baseline machine is upgraded: its real baseline row moves to yesterday (a transition needs a later
        # UTC day), and it comes back, the same identity, running the candidate's executable and load.
        assert AppDay.objects.filter(pk=old_base.pk).update(day=today - timedelta(days=1)) == 1
        again, old_proc = start_agent(stack, "old", config, namespace_burn=cand_argv)
        assert again == old
        wait_row(stack, old, cand_version)
        stop(stack, old_proc, old)
        old_cand = AppDay.objects.get(agent_id=old, app_name="yuzu-burn", version=cand_version, day=today)
        upgrade = official_client(stack, reader, [tools, {**compare, "as": "compare"}])["calls"]
    finally:
        for proc in stack.procs:
            proc.stop()
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"])
                 if (p.info["cmdline"] or [""])[0].startswith(str(stack.tmp_path))]
    assert not leftovers, f"busy processes left behind: {leftovers}"

    for call in (*split.values(), *upgrade.values()):
        assert call["is_error"] is False and call["schema_valid"], call
    # Two machines, one on each version: one member counted per version, and no direction — they are not a
    # before/after of the same machines.
    cmp = split["compare"]["structured"]
    assert (cmp["cohort_size"], cmp["paired"], cmp["baseline_only"], cmp["candidate_only"], cmp["no_data"]) == (
        2, 0, 1, 1, 0), cmp
    assert cmp["insufficient"] is True and cmp["cpu"] is None and cmp["ws"] is None
    assert cmp["distribution"] == {"up": 0, "flat": 0, "down": 0}
    points = {(p["version"], p["day"]): p for p in split["group"]["structured"]["points"]}
    assert set(points) == {(base_version, today.isoformat()), (cand_version, today.isoformat())}, points
    assert all(p["device_count"] == 1 and p["suppressed"] for p in points.values())  # below the floor: counts only

    # After the upgrade: that machine is paired, the heavier candidate says "up", the figures are its real rows.
    cmp = upgrade["compare"]["structured"]
    assert (cmp["cohort_size"], cmp["paired"], cmp["baseline_only"], cmp["candidate_only"], cmp["no_data"]) == (
        2, 1, 0, 1, 0), cmp
    assert (cmp["insufficient"], cmp["small_cohort"]) == (False, True)
    assert cmp["distribution"] == {"up": 1, "flat": 0, "down": 0}
    assert cmp["cpu"]["before_mean"] == pytest.approx(old_base.cpu_avg)
    assert cmp["cpu"]["after_mean"] == pytest.approx(old_cand.cpu_avg)
    assert cmp["cpu"]["delta_median"] == pytest.approx(old_cand.cpu_avg - old_base.cpu_avg) and \
        cmp["cpu"]["delta_median"] > 0
    assert cmp["ws"]["before_mean"] == pytest.approx(old_base.ws_avg_bytes)
    assert cmp["ws"]["after_mean"] == pytest.approx(old_cand.ws_avg_bytes)
