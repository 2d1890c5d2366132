"""DEX telemetry of the Linux agent (docs/dex.md): real readings from psutil and /proc, nothing synthetic.

Three outputs, all produced on the heartbeat tick (the caller runs ``tick`` in a worker thread):

* heartbeat facts — string tags (``yuzu.perf_cpu_pct`` …) attached to the heartbeat frame as ``dex``. The first
  tick of a session only sets the baseline of every delta metric, so those tags are omitted that time; a value
  that cannot be measured (no disk IO in the interval, no ``ss``, overcommit_memory=1) is omitted, never sent as 0;
* signal observations — windowed (sustained CPU, memory pressure, disk latency) and event signals (low storage,
  uptime, CPU throttling, journald crashes/hangs/OOM …), debounced per (type, subject), sent as
  ``dex.observation`` frames of at most 100;
* per-app daily performance — when ``procperf_enabled``: every tick samples the processes by name (never command
  lines) and folds them into today's summary, sent as a ``dex.app_perf`` frame every ``procperf_send_s`` and once
  more, final, for the previous day after midnight UTC.

Imports no server code."""

import json
import logging
import math
import os
import re
import shutil
import subprocess
import time
from collections import deque
from datetime import UTC, datetime

import psutil

log = logging.getLogger("yuzu.agent.dex")

REAL_FS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs"}
GIB = 1024 ** 3
MAX_OBS_PER_FRAME = 100
MAX_APP_ROWS = 500
VERSION_LOOKUPS = 8  # package-version lookups per app sample (dpkg -S is slow): the busiest executables first
RTT_RE = re.compile(r"\brtt:([0-9.]+)/[0-9.]+")
KERNEL_RULES = (  # (obs_type, pattern) over kernel log lines
    ("memory.exhausted", re.compile(r"Out of memory: Kill(?:ed)? process \d+ \(([^)]*)\)")),
    ("os.bugcheck", re.compile(r"Kernel panic - not syncing: ?(.*)")),
    ("disk.error", re.compile(r"I/O error, dev (\w+)")),
    ("fs.corruption", re.compile(r"(EXT4-fs error \(device (\w+)\)|XFS \((\w+)\): Corruption)")),
    ("process.hung", re.compile(r"task (\S+):\d+ blocked for more than \d+ seconds")),
)


def _setting(config, key, env, default, cast=float):
    if os.environ.get(env):
        return cast(os.environ[env])
    return cast(config.get(key, default))


def _flag(config, key, env, default=False):
    if os.environ.get(env):
        return os.environ[env].lower() in ("1", "true", "yes", "on")
    return bool(config.get(key, default))


def fmt(value):
    """A tag value: a short decimal string (the server parses it as one full token of ≤32 characters)."""
    return f"{value:.3f}".rstrip("0").rstrip(".") if math.isfinite(value) and value >= 0 else None


# --- readings ---------------------------------------------------------------------------------------------------

def commit_pct(meminfo="/proc/meminfo", overcommit="/proc/sys/vm/overcommit_memory"):
    """100·Committed_AS/CommitLimit, or None when overcommit is unlimited (mode 1) or the figures are missing."""
    try:
        with open(overcommit) as f:
            if f.read().strip() == "1":
                return None
        fields = {}
        with open(meminfo) as f:
            for line in f:
                name, _, rest = line.partition(":")
                fields[name] = int(rest.split()[0]) if rest.split() else 0
        limit = fields.get("CommitLimit")
        return 100.0 * fields["Committed_AS"] / limit if limit else None
    except (OSError, KeyError, ValueError):
        return None


def tcp_counters(snmp="/proc/net/snmp"):
    """(RetransSegs, OutSegs) from /proc/net/snmp, or None."""
    try:
        with open(snmp) as f:
            rows = [line.split() for line in f if line.startswith("Tcp:")]
        head, values = rows[0], rows[1]
        return int(values[head.index("RetransSegs")]), int(values[head.index("OutSegs")])
    except (OSError, IndexError, ValueError):
        return None


def whole_disks():
    """Block devices that are whole disks (not partitions, loop or RAM devices)."""
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return None
    return {n for n in names if not n.startswith(("loop", "ram", "zram", "dm-", "sr"))}


def rtt_median_ms(timeout=5.0):
    """The median smoothed RTT over established TCP connections (``ss -tin``), or None without ss or connections."""
    ss = shutil.which("ss")
    if ss is None:
        return None
    try:
        out = subprocess.run([ss, "-tin", "state", "established"], capture_output=True, text=True,
                             timeout=timeout, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rtts = sorted(float(m.group(1)) for m in RTT_RE.finditer(out))
    if not rtts:
        return None
    mid = len(rtts) // 2
    return rtts[mid] if len(rtts) % 2 else (rtts[mid - 1] + rtts[mid]) / 2


def throttle_count():
    total, seen = 0, False
    base = "/sys/devices/system/cpu"
    try:
        cpus = [d for d in os.listdir(base) if re.fullmatch(r"cpu\d+", d)]
    except OSError:
        return None
    for cpu in cpus:
        try:
            with open(f"{base}/{cpu}/thermal_throttle/core_throttle_count") as f:
                total += int(f.read().strip())
                seen = True
        except (OSError, ValueError):
            continue
    return total if seen else None


# --- the windowed and event signals -----------------------------------------------------------------------------

class Sustained:
    """A metric ≥ threshold for ``window`` seconds fires once (metric = the window's average); it re-arms only
    after it stayed below the threshold for a whole window."""

    def __init__(self, obs_type, subject, threshold, window):
        self.obs_type, self.subject, self.threshold, self.window = obs_type, subject, threshold, window
        self.samples = deque()
        self.fired = False

    def feed(self, now, value):
        if value is None:
            return None
        self.samples.append((now, value))
        # keep one sample at or before the window's start, so the samples cover the whole window whatever the
        # interval between readings
        while len(self.samples) > 1 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()
        span = now - self.samples[0][0]
        if span < self.window or len(self.samples) < 2:
            return None
        values = [v for _, v in self.samples]
        if not self.fired and min(values) >= self.threshold:
            self.fired = True
            avg = sum(values) / len(values)
            return {"obs_type": self.obs_type, "subject": self.subject,
                    "reason": f"{avg:.1f} ≥ {self.threshold:g} for {int(span)} s", "symbolic": self.obs_type,
                    "detail": {"metric": round(avg, 3), "threshold": self.threshold, "window_s": int(span)}}
        if self.fired and max(values) < self.threshold:
            self.fired = False
        return None


class Telemetry:
    """One agent's DEX state. ``tick()`` (in a worker thread) → (heartbeat tags, [extra frames])."""

    def __init__(self, config, *, clock=time.time):
        self.config = config
        self.clock = clock
        sustain = _setting(config, "dex_sustain_s", "YUZU_AGENT_DEX_SUSTAIN_S", 600)
        self.windows = {"cpu_pct": Sustained("perf.cpu_sustained", "cpu", 90.0, sustain),
                        "commit_pct": Sustained("perf.memory_pressure", "memory", 90.0, sustain),
                        "disk_lat_ms": Sustained("perf.disk_latency_high", "disk", 25.0, sustain)}
        self.debounce_s = _setting(config, "dex_debounce_s", "YUZU_AGENT_DEX_DEBOUNCE_S", 3600)
        self.uptime_every = _setting(config, "dex_uptime_s", "YUZU_AGENT_DEX_UPTIME_S", 3600)
        self.procperf = _flag(config, "procperf_enabled", "YUZU_AGENT_PROCPERF")
        self.procperf_send_s = _setting(config, "procperf_send_s", "YUZU_AGENT_PROCPERF_SEND_S", 3600)
        self.last = None  # the previous tick's counters
        self.retrans = deque(maxlen=3)
        self.emitted = {}  # (type, subject) → when last sent
        self.low_storage = set()
        self.last_uptime = 0.0
        self.throttles = None
        self.journal_cursor = None
        self.journal = shutil.which("journalctl") is not None
        self.pending = []  # observations not yet sent
        self.apps = {}  # day → {(name, version): accumulator}
        self.versions = {}  # exe → package version ("" when not resolvable)
        self.last_app_send = 0.0
        self.ncpu = psutil.cpu_count() or 1

    # -- heartbeat facts --

    def counters(self):
        disks = whole_disks()
        io = psutil.disk_io_counters(perdisk=True) or {}
        io = {k: v for k, v in io.items() if disks is None or k in disks}
        nics = psutil.net_io_counters(pernic=True) or {}
        return {"t": self.clock(), "cpu": psutil.cpu_percent(interval=None),
                "disk_ms": sum(v.read_time + v.write_time for v in io.values()),
                "disk_ops": sum(v.read_count + v.write_count for v in io.values()),
                "net_bytes": sum(v.bytes_sent + v.bytes_recv for k, v in nics.items() if k != "lo"),
                "tcp": tcp_counters()}

    def facts(self):
        """The heartbeat's values (floats; None = not measured this time)."""
        now = self.counters()
        prev, self.last = self.last, now
        values = {"commit_pct": commit_pct(), "rtt_ms": rtt_median_ms(), "cpu_pct": None, "disk_lat_ms": None,
                  "throughput_bps": None, "retrans_pct": None}
        if prev is None:
            return values  # the first tick sets the baselines only
        dt = now["t"] - prev["t"]
        values["cpu_pct"] = now["cpu"]
        ops = now["disk_ops"] - prev["disk_ops"]
        if ops > 0:
            values["disk_lat_ms"] = max(0.0, (now["disk_ms"] - prev["disk_ms"]) / ops)
        if dt > 0 and now["net_bytes"] >= prev["net_bytes"]:
            values["throughput_bps"] = (now["net_bytes"] - prev["net_bytes"]) / dt
        if now["tcp"] and prev["tcp"]:
            d_re, d_out = now["tcp"][0] - prev["tcp"][0], now["tcp"][1] - prev["tcp"][1]
            if d_out > 0 and d_re >= 0:
                self.retrans.append(100.0 * d_re / d_out)
        if self.retrans:
            values["retrans_pct"] = sum(self.retrans) / len(self.retrans)
        return values

    @staticmethod
    def tags(values):
        names = {"cpu_pct": "yuzu.perf_cpu_pct", "commit_pct": "yuzu.perf_commit_pct",
                 "disk_lat_ms": "yuzu.perf_disk_lat_ms", "rtt_ms": "yuzu.net_rtt_p50_ms",
                 "retrans_pct": "yuzu.net_retrans_pct", "throughput_bps": "yuzu.net_throughput_bps"}
        out = {}
        for key, tag in names.items():
            text = fmt(values[key]) if values.get(key) is not None else None
            if text is not None:
                out[tag] = text
        return out  # yuzu.net_degraded is not sent: there is no calibrated threshold (docs/dex.md)

    # -- observations --

    def observe(self, obs_type, subject, reason="", detail=None, debounce=True, symbolic="", component=""):
        now = self.clock()
        key = (obs_type, subject)
        if debounce and now - self.emitted.get(key, -math.inf) < self.debounce_s:
            return
        self.emitted[key] = now
        self.pending.append({"obs_type": obs_type, "subject": subject[:256], "reason": reason[:1024],
                             "symbolic": (symbolic or obs_type)[:256], "component": component[:256], "version": "",
                             "platform": "linux", "observed_at": now,
                             "detail_json": json.dumps(detail or {})[:4000]})

    def signals(self, values):
        now = self.clock()
        for key, window in self.windows.items():
            fired = window.feed(now, values.get(key))
            if fired:
                self.observe(fired["obs_type"], fired["subject"], fired["reason"], fired["detail"], debounce=False)
        self.storage()
        if now - self.last_uptime >= self.uptime_every:
            self.last_uptime = now
            boot = psutil.boot_time()
            self.observe("os.uptime_report", "uptime", f"up {int(now - boot)} s",
                         {"uptime_s": int(now - boot), "boot_time": int(boot)}, debounce=False)
        count = throttle_count()
        if count is not None and self.throttles is not None and count > self.throttles:
            self.observe("hw.cpu_throttled", "cpu", f"{count - self.throttles} throttle events",
                         {"delta": count - self.throttles})
        self.throttles = count
        if self.journal:
            self.read_journal()

    def storage(self):
        low_now = set()
        for part in psutil.disk_partitions(all=False):
            if part.fstype not in REAL_FS:
                continue
            try:
                usage = psutil.disk_usage(part.mountpoint)
            except OSError:
                continue
            if usage.percent >= 90 or usage.free < 5 * GIB:
                low_now.add(part.device)
                if part.device not in self.low_storage:
                    self.observe("storage.low", part.device, f"{usage.percent:.1f}% used, "
                                                             f"{usage.free / GIB:.1f} GiB free on {part.mountpoint}",
                                 {"percent": usage.percent, "free_bytes": usage.free, "mountpoint": part.mountpoint},
                                 debounce=False)
        self.low_storage = low_now  # a device re-arms once it is no longer low

    def read_journal(self):
        """New journald entries since the last cursor (the first call only positions the cursor)."""
        argv = ["journalctl", "-o", "json", "--no-pager", "-n", "500"]
        argv += [f"--after-cursor={self.journal_cursor}"] if self.journal_cursor else ["--since", "now"]
        argv.append("--show-cursor")
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            self.journal = False
            return
        for line in out.splitlines():
            if line.startswith("-- cursor: "):
                self.journal_cursor = line[len("-- cursor: "):].strip()
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                self.journal_entry(entry)

    def journal_entry(self, e):
        unit, result = str(e.get("UNIT") or e.get("_SYSTEMD_UNIT") or ""), e.get("UNIT_RESULT")
        message = str(e.get("MESSAGE") or "")
        if result == "watchdog":
            self.observe("service.hung", unit, message)
        elif result in ("exit-code", "signal", "core-dump"):
            self.observe("service.crashed", unit, message, {"unit_result": result})
        elif e.get("SYSLOG_IDENTIFIER") == "systemd-coredump" and e.get("COREDUMP_EXE"):
            self.observe("process.crashed", os.path.basename(str(e["COREDUMP_EXE"])), message[:1024],
                         {"signal": e.get("COREDUMP_SIGNAL_NAME")})
        elif e.get("SYSLOG_IDENTIFIER") == "chronyd" and re.search(r"unsynchronised|Can't synchronise", message):
            self.observe("os.time_unsynced", "chronyd", message)
        elif e.get("_TRANSPORT") == "kernel":
            for obs_type, rule in KERNEL_RULES:
                m = rule.search(message)
                if m:
                    subject = next((g for g in m.groups() if g), "") if m.groups() else ""
                    self.observe(obs_type, subject or "kernel", message)
                    break

    # -- app performance --

    def version_of(self, exe):
        """The owning package's version (dpkg, then rpm), cached; "" when it cannot be resolved."""
        if not exe:
            self.versions[exe] = ""
            return ""
        if exe in self.versions:
            return self.versions[exe]
        version = ""
        try:
            if shutil.which("dpkg"):
                owner = subprocess.run(["dpkg", "-S", exe], capture_output=True, text=True, timeout=5, check=False)
                if owner.returncode == 0 and ":" in owner.stdout:
                    pkg = owner.stdout.split(":", 1)[0].split(",")[0].strip()
                    q = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True,
                                       timeout=5, check=False)
                    version = q.stdout.strip() if q.returncode == 0 else ""
            elif shutil.which("rpm"):
                q = subprocess.run(["rpm", "-qf", "--qf", "%{VERSION}-%{RELEASE}", exe], capture_output=True,
                                   text=True, timeout=5, check=False)
                version = q.stdout.strip() if q.returncode == 0 else ""
        except (OSError, subprocess.SubprocessError):
            version = ""
        self.versions[exe] = version[:128]
        return self.versions[exe]

    def sample_apps(self):
        """One sample of every process, by name and package version. An executable whose version is not resolved
        yet is left out of this sample (never counted under a wrong version); the lookups are budgeted
        (VERSION_LOOKUPS per sample, the busiest processes first), so a sample stays cheap."""
        day = datetime.fromtimestamp(self.clock(), UTC).date().isoformat()
        infos = [p.info for p in psutil.process_iter(["name", "cpu_percent", "memory_info", "exe"])]
        infos = [i for i in infos if i.get("name") and i.get("memory_info") is not None]
        pending = sorted({(-(i.get("cpu_percent") or 0.0), i.get("exe") or "") for i in infos
                          if (i.get("exe") or "") not in self.versions})
        for _, exe in pending[:VERSION_LOOKUPS]:
            self.version_of(exe)
        per = {}
        for info in infos:
            exe = info.get("exe") or ""
            if exe not in self.versions:
                continue
            cur = per.setdefault((info["name"], self.versions[exe]), [0, 0.0, 0.0])
            cur[0] += 1
            cur[1] += (info.get("cpu_percent") or 0.0) / self.ncpu  # share of the machine's capacity
            cur[2] += info["memory_info"].rss
        today = self.apps.setdefault(day, {})
        for key, (n, cpu, ws) in per.items():
            acc = today.setdefault(key, {"samples": 0, "instances_max": 0, "cpu_sum": 0.0, "cpu_max": 0.0,
                                         "ws_sum": 0.0, "ws_max": 0.0})
            acc["samples"] += 1
            acc["instances_max"] = max(acc["instances_max"], n)
            acc["cpu_sum"] += min(cpu, 100.0)
            acc["cpu_max"] = max(acc["cpu_max"], min(cpu, 100.0))
            acc["ws_sum"] += ws
            acc["ws_max"] = max(acc["ws_max"], ws)

    def app_frames(self, force=False):
        now = self.clock()
        today = datetime.fromtimestamp(now, UTC).date().isoformat()
        frames = []
        for day in sorted(self.apps):
            final = day < today
            if final or force or now - self.last_app_send >= self.procperf_send_s:
                rows = sorted(({"app_name": name[:512], "version": version, "samples": a["samples"],
                                "instances_max": a["instances_max"], "cpu_avg": round(a["cpu_sum"] / a["samples"], 3),
                                "cpu_max": round(a["cpu_max"], 3), "ws_avg_bytes": round(a["ws_sum"] / a["samples"]),
                                "ws_max_bytes": round(a["ws_max"])} for (name, version), a in self.apps[day].items()),
                              key=lambda r: -r["cpu_avg"])[:MAX_APP_ROWS]
                if rows:
                    frames.append({"type": "dex.app_perf", "day": day, "rows": rows})
                if final:
                    del self.apps[day]
        if frames and any(f["day"] == today for f in frames):
            self.last_app_send = now
        return frames

    # -- the tick --

    def tick(self):
        """→ (the heartbeat's dex tags, [frames to send after it]). Never raises."""
        try:
            values = self.facts()
        except Exception:
            log.exception("DEX: reading the heartbeat facts failed")
            values = {}
        try:
            self.signals(values)
        except Exception:
            log.exception("DEX: evaluating the signals failed")
        frames = []
        try:
            if self.procperf:
                self.sample_apps()
                frames += self.app_frames()
        except Exception:
            log.exception("DEX: sampling app performance failed")
        while self.pending:
            batch, self.pending = self.pending[:MAX_OBS_PER_FRAME], self.pending[MAX_OBS_PER_FRAME:]
            frames.append({"type": "dex.observation", "observations": batch})
        return self.tags(values), frames
