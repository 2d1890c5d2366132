"""The agent's DEX telemetry (fleet.agent.dex): real readings, the windowed signals' fire-once/re-arm rule, journald
mapping, the daily app summary, and --dex-disable."""

import json
import time

import psutil

from fleet.agent import dex
from fleet.agent.__main__ import build_parser
from fleet.agent.client import AgentClient


class Clock:
    def __init__(self, t=1_800_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def test_real_readings_first_tick_is_baseline_only(tmp_path):
    t = dex.Telemetry({})
    tags, _ = t.tick()
    assert not {"yuzu.perf_cpu_pct", "yuzu.net_throughput_bps", "yuzu.perf_disk_lat_ms"} & set(tags)
    time.sleep(0.3)
    tags, frames = t.tick()
    assert 0 <= float(tags["yuzu.perf_cpu_pct"]) <= 100
    assert "yuzu.net_degraded" not in tags  # no calibrated threshold: never sent
    for value in tags.values():
        assert isinstance(value, str) and len(value) <= 32 and float(value) >= 0
    with open("/proc/sys/vm/overcommit_memory") as f:
        assert ("yuzu.perf_commit_pct" in tags) == (f.read().strip() != "1")


def test_commit_pct_reads_meminfo_and_is_omitted_under_overcommit_1(tmp_path):
    meminfo, mode = tmp_path / "meminfo", tmp_path / "mode"
    meminfo.write_text("MemTotal: 100 kB\nCommitLimit:     2000 kB\nCommitted_AS:    500 kB\n")
    mode.write_text("0\n")
    assert dex.commit_pct(str(meminfo), str(mode)) == 25.0
    mode.write_text("1\n")
    assert dex.commit_pct(str(meminfo), str(mode)) is None
    assert dex.commit_pct(str(tmp_path / "missing"), str(tmp_path / "missing")) is None


def test_a_sustained_metric_fires_once_and_rearms_after_a_recovery():
    w = dex.Sustained("perf.cpu_sustained", "cpu", 90.0, 600)
    fired = [w.feed(t, 95.0) for t in range(0, 1300, 30)]
    hits = [f for f in fired if f]
    assert len(hits) == 1 and hits[0]["detail"]["metric"] == 95.0
    assert all(w.feed(t, 95.0 if t % 60 else 50.0) is None for t in range(1300, 2000, 30))  # no recovery yet
    for t in range(2000, 2700, 30):
        w.feed(t, 10.0)
    assert any(w.feed(t, 99.0) for t in range(2700, 3400, 30))  # re-armed
    assert w.feed(4000, None) is None  # a missing reading is not a low one


def test_journald_entries_map_to_signals_and_debounce():
    t = dex.Telemetry({}, clock=Clock())
    t.journal_entry({"UNIT": "nginx.service", "UNIT_RESULT": "exit-code", "MESSAGE": "failed"})
    t.journal_entry({"UNIT": "nginx.service", "UNIT_RESULT": "exit-code", "MESSAGE": "failed again"})  # debounced
    t.journal_entry({"UNIT": "db.service", "UNIT_RESULT": "watchdog", "MESSAGE": "watchdog timeout"})
    t.journal_entry({"SYSLOG_IDENTIFIER": "systemd-coredump", "COREDUMP_EXE": "/usr/bin/java", "MESSAGE": "dumped"})
    t.journal_entry({"_TRANSPORT": "kernel", "MESSAGE": "Out of memory: Killed process 42 (java) total-vm:1kB"})
    t.journal_entry({"_TRANSPORT": "kernel", "MESSAGE": "blk_update_request: I/O error, dev sda, sector 1"})
    t.journal_entry({"SYSLOG_IDENTIFIER": "chronyd", "MESSAGE": "System clock unsynchronised"})
    assert [(o["obs_type"], o["subject"]) for o in t.pending] == [
        ("service.crashed", "nginx.service"), ("service.hung", "db.service"), ("process.crashed", "java"),
        ("memory.exhausted", "java"), ("disk.error", "sda"), ("os.time_unsynced", "chronyd")]
    assert all(json.loads(o["detail_json"]) is not None and o["platform"] == "linux" for o in t.pending)


def test_the_daily_app_summary_carries_real_processes():
    clock = Clock(time.time())
    t = dex.Telemetry({"procperf_enabled": True, "procperf_send_s": 0}, clock=clock)
    t.sample_apps()
    time.sleep(0.2)
    t.sample_apps()
    frames = t.app_frames()
    assert frames and frames[0]["type"] == "dex.app_perf"
    rows = {r["app_name"]: r for r in frames[0]["rows"]}
    me = psutil.Process().name()
    assert rows[me]["samples"] == 2 and rows[me]["ws_avg_bytes"] > 0 and rows[me]["instances_max"] >= 1
    clock.t += 86400  # the next UTC day: yesterday's summary goes out final, then is forgotten
    t.sample_apps()
    days = [f["day"] for f in t.app_frames(force=True)]
    assert len(days) == 2 and len(t.apps) == 1


def test_dex_disable(tmp_path, monkeypatch):
    assert build_parser().parse_args(["--server", "ws://x", "--dex-disable"]).dex_disable is True
    assert AgentClient("ws://127.0.0.1:1", state_dir=tmp_path, config={"dex_disable": True}).dex is None
    assert AgentClient("ws://127.0.0.1:1", state_dir=tmp_path, config={}).dex is not None
    monkeypatch.setenv("YUZU_AGENT_DEX_DISABLE", "1")
    from fleet.agent.client import load_config
    assert load_config(None)["dex_disable"] is True
