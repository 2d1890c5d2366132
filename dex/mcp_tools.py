"""The 13 DEX MCP tools (spec/dex.md §3-6): readonly, idempotent, never approval-gated, on GuaranteedState:Read.
Each is a thin handler over the dex.services function its REST twin (dex.api) calls. Every per-device row — and
every statistic built from them — covers only the devices the caller may read (Infrastructure:Read)."""

from mcp.registry import tool
from mcp.schema import array, boolean, enum, integer, nullable, obj, string

from . import services

NUM = {"type": "number"}
STAT = nullable(obj({"avg": NUM, "p50": NUM, "p90": NUM, "max": NUM, "n": integer(1)},
                    ["avg", "p50", "p90", "max", "n"]))
PCT = nullable(obj({"value": NUM, "lower_bound": boolean()}, ["value", "lower_bound"]))
ISO = string(64)
WINDOW = string(8, "24h | 7d | 30d | all (default 7d; any other value is read as 7d)")
OS = enum(services.OSES, "Platform filter (default all)")
OBS_TYPE = string(64, "The signal type, e.g. perf.cpu_sustained (list_dex_signals gives those seen)", minLength=1,
                  pattern="^[A-Za-z0-9._-]{1,64}$")
KEY = string(64, "Cohort key: a tag key (default model), or yuzu:os, yuzu:agent_version, yuzu:group",
             pattern="^[A-Za-z0-9_.:-]{1,64}$")
COHORT = string(256, "A cohort value of that key; \"\" is the devices without the key")
LIMIT = integer(1, 500, "At most this many devices (default 50)")
APP = string(512, "The app (process) name, as list_dex_perf_apps gives it", minLength=1)
VERSION = string(512, "The app version (trimmed, lower-cased, exact match; \"\" = version unknown)")
GROUP = string(256, "A management group id or exact name (list_management_groups)", minLength=1)
AUDITED = {"audit_persisted": boolean()}

PERF_VALUES = {"cpu_pct": NUM, "commit_pct": NUM, "disk_lat_ms": NUM}
NET_VALUES = {"rtt_ms": NUM, "retrans_pct": NUM, "throughput_bps": NUM}
COHORT_ROW = obj({"cohort": string(256), "devices": integer(0), "suppressed": boolean(), "cpu_pct": STAT,
                  "commit_pct": STAT, "disk_lat_ms": STAT}, ["cohort", "devices", "suppressed"])
APP_POINT = obj({"version": string(512), "day": string(10), "device_count": integer(0), "suppressed": boolean(),
                 "cpu_mean": nullable(NUM), "cpu_max": nullable(NUM), "cpu_p50": PCT, "cpu_p95": PCT,
                 "ws_mean": nullable(NUM), "ws_max": nullable(NUM), "ws_p50": PCT, "ws_p95": PCT,
                 "hist_stale": boolean()}, ["version", "day", "device_count", "suppressed"])
COMPARE_STATS = nullable(obj({k: nullable(NUM) for k in ("before_mean", "after_mean", "delta_median", "before_p95",
                                                         "after_p95")}))
CONFINEMENT = (" Covers only the devices you may read (Infrastructure:Read; a grant on a management group confines "
               "it to that group's devices; a service-scoped token to the devices tagged service=<its service>).")


def _read(name, title, description, input_schema, output_schema, service_scope="confined"):
    return tool(name=name, title=title, securable="GuaranteedState", operation="Read", effect="read", idempotent=True,
                description=description + CONFINEMENT, input_schema=input_schema, output_schema=output_schema,
                service_scope=service_scope)


# --- signals -----------------------------------------------------------------------------------------------

@_read("list_dex_signals", "DEX signal catalogue rollup",
       "Catalogue rollup of every DEX signal type seen in the window, with event count, distinct devices and last "
       "seen (server receipt time, ISO 8601), most frequent first, at most 500. Signals are windowed observations "
       "agents push (perf.cpu_sustained, perf.memory_pressure, perf.disk_latency_high, storage.low, "
       "os.uptime_report, hw.cpu_throttled, service.crashed, memory.exhausted …; docs/dex.md). An empty list "
       "means no device you can read reported any signal in the window — quiet, not proof of health (agents with "
       "--dex-disable send none). Drill in with get_dex_signal_detail.",
       obj({"window": WINDOW, "os": OS}),
       obj({"window": string(8), "os": string(16),
            "signals": array(obj({"obs_type": string(64), "count": integer(0), "distinct_devices": integer(0),
                                  "last_seen": nullable(ISO)}, ["obs_type", "count", "distinct_devices"]),
                             max_items=500)}, ["signals"]))
def list_dex_signals(ctx, args):
    return services.list_signals(ctx.principal, args.get("window"), args.get("os"))


@_read("get_dex_signal_scope", "DEX signal coverage per platform",
       "Per-platform signal coverage: how many distinct signal types each OS reports and the total event count in "
       "the window. A platform missing from the list reported nothing (it is not 0 of something); an empty list "
       "means no signals at all in the window.",
       obj({"window": WINDOW}),
       obj({"window": string(8), "platforms": array(obj({"platform": string(16), "distinct_types": integer(0),
                                                         "total_events": integer(0)},
                                                        ["platform", "distinct_types", "total_events"]))},
           ["platforms"]))
def get_dex_signal_scope(ctx, args):
    return services.signal_scope(ctx.principal, args.get("window"))


@_read("get_dex_signal_detail", "Drill into one DEX signal type",
       "Drill into one signal type: top subjects (e.g. the disk or unit it concerns), OS split, most affected "
       "devices (agent ids) and daily trend (UTC days) in the window. os scopes subjects, devices and by_day; "
       "by_os stays cross-OS. limit (0-500, default 50) caps subjects and devices. An unknown or unseen obs_type "
       "gives empty lists, not an error. Each call writes the audit row dex.signal.view (behavioural data); if "
       "that row cannot be written the data is still served with audit_persisted:false. Service-scoped tokens "
       "are refused (fleet-wide agent ids).",
       obj({"obs_type": OBS_TYPE, "window": WINDOW, "os": OS, "limit": integer(0, 500, "Default 50")}, ["obs_type"]),
       obj({"obs_type": string(64), "window": string(8), "os": string(16),
            "subjects": array(obj({"subject": string(256), "count": integer(0), "distinct_devices": integer(0),
                                   "last_seen": nullable(ISO)})),
            "by_os": array(obj({"platform": string(16), "count": integer(0), "distinct_devices": integer(0)})),
            "devices": array(obj({"agent_id": string(128), "count": integer(0), "last_seen": nullable(ISO)})),
            "by_day": array(obj({"day": string(10), "count": integer(0)})), **AUDITED},
           ["obs_type", "subjects", "by_os", "devices", "by_day"]), service_scope="denied")
def get_dex_signal_detail(ctx, args):
    ctx.note(f"obs_type={args['obs_type']}")
    return services.signal_detail(ctx.principal, args["obs_type"], args.get("window"), args.get("os"),
                                  args.get("limit", 50), cid=ctx.cid)


# --- device performance ------------------------------------------------------------------------------------

@_read("get_dex_perf_fleet", "Fleet device performance now",
       "Fleet CPU %, memory commit % and disk latency (ms per IO) right now, from the connected agents' latest "
       "heartbeats: {avg, p50, p90, max, n} per metric, reporting (agents with at least one perf value) and "
       "windows_online (online agents on platforms that collect perf: linux and windows — the name is kept for "
       "compatibility). A metric is null when no device reported it (never 0); reporting < windows_online means "
       "some online agents send no perf (first heartbeat, --dex-disable, or an old agent): "
       "list_dex_perf_devices filter=not_reporting lists them. Worst devices: list_dex_perf_devices.",
       obj(),
       obj({"cpu_pct": STAT, "commit_pct": STAT, "disk_lat_ms": STAT, "reporting": integer(0),
            "windows_online": integer(0)}, ["cpu_pct", "commit_pct", "disk_lat_ms", "reporting", "windows_online"]))
def get_dex_perf_fleet(ctx, args):
    return services.perf_fleet(ctx.principal)


@_read("get_dex_perf_cohorts", "Device performance by cohort",
       "Compare performance percentiles across the cohorts of one tag key (e.g. model; also yuzu:os, "
       "yuzu:agent_version, yuzu:group); small cohorts are suppressed: below floor (10) devices a cohort shows its "
       "population only (suppressed:true, no stat keys). A metric null in an unsuppressed cohort means none of its "
       "devices reported it. Devices without the key form the cohort \"\". available_keys lists the keys present "
       "on reporting devices. An empty cohorts list means no device you can read reports perf now. Head to head: "
       "get_dex_perf_cohort_diff.",
       obj({"key": KEY}),
       obj({"key": string(64), "floor": integer(0), "cohorts": array(COHORT_ROW), "available_keys": array(string(64))},
           ["key", "floor", "cohorts", "available_keys"]))
def get_dex_perf_cohorts(ctx, args):
    return services.perf_cohorts(ctx.principal, args.get("key"))


@_read("get_dex_perf_cohort_diff", "Two device cohorts head to head",
       "Head-to-head comparison of two cohorts of a tag key, B being the baseline: each cohort's stats and "
       "delta_pct = (A.p50 − B.p50) / B.p50 × 100 per metric (positive: A is worse/higher). found_a/found_b false "
       "(and a/b null) when no reporting device is in that cohort; a delta is null unless both cohorts are "
       "unsuppressed (≥10 devices), both expose the metric and B.p50 is not 0.",
       obj({"key": KEY, "a": COHORT, "b": COHORT}, ["a", "b"]),
       obj({"key": string(64), "floor": integer(0), "found_a": boolean(), "found_b": boolean(),
            "a": nullable(COHORT_ROW), "b": nullable(COHORT_ROW),
            "delta_pct": obj({"cpu_pct": nullable(NUM), "commit_pct": nullable(NUM), "disk_lat_ms": nullable(NUM)})},
           ["key", "floor", "found_a", "found_b", "a", "b", "delta_pct"]))
def get_dex_perf_cohort_diff(ctx, args):
    return services.perf_cohort_diff(ctx.principal, args["a"], args["b"], args.get("key"))


@_read("list_dex_perf_devices", "Devices behind a performance drill",
       "The device list behind any performance drill: worst devices by a metric (cpu, commit or disk_lat; highest "
       "first), devices not reporting (filter=not_reporting: online linux/windows agents with no perf sample), or "
       "one cohort's members (cohort_value; cohort_key sets the cohort column, default model). Each row carries the "
       "values the device reported — a missing key means it did not report that metric, never 0 — and "
       "fleet_pctile (percentile rank of the sorted metric among reporting devices). An empty list: nobody you can "
       "read reports (or none matches). Audited as dex.perf.device.view. Service-scoped tokens are refused.",
       obj({"metric": enum(tuple(services.PERF_METRICS), "Sort by (default cpu)"),
            "filter": enum(("not_reporting",), "not_reporting: online agents that send no perf"),
            "cohort_key": KEY, "cohort_value": COHORT, "limit": LIMIT}),
       obj({"metric": string(32), "devices": array(obj({"agent_id": string(128), "cohort": string(256), **PERF_VALUES,
                                                        "fleet_pctile": integer(0, 100)}, ["agent_id", "cohort"]),
                                                   max_items=500), **AUDITED}, ["devices"]), service_scope="denied")
def list_dex_perf_devices(ctx, args):
    return services.perf_devices(ctx.principal, args.get("metric"), args.get("filter"), args.get("cohort_key"),
                                 args.get("cohort_value"), args.get("limit"), cid=ctx.cid)


# --- app performance ---------------------------------------------------------------------------------------

@_read("list_dex_perf_apps", "Apps with performance history",
       "Apps that have retained fleet performance history — the names get_dex_app_perf can answer for: app_name, "
       "how many versions, last_day (UTC), newest first then by name, at most 500 (truncated:true when there are "
       "more). Empty: no agent sends app performance (it is off by default on agents: procperf_enabled).",
       obj(),
       obj({"apps": array(obj({"app_name": string(512), "versions": integer(0), "last_day": string(10)}),
                          max_items=500), "truncated": boolean()}, ["apps", "truncated"]))
def list_dex_perf_apps(ctx, args):
    return services.list_apps(ctx.principal)


@_read("get_dex_app_perf", "Fleet performance trend of one app",
       "Fleet CPU (share of machine capacity, %) and working-set (bytes; percentiles in MiB) trend for one app, per "
       "version and UTC day (up to 180 days). A point with fewer than 10 devices is suppressed: device_count only. "
       "Percentiles are {value, lower_bound} read from buckets (CPU 0,1,2,5,10,20,30,50,75,100+; MiB "
       "16…4096+): value is the bucket's upper edge, or with lower_bound:true the floor of the open top bucket; "
       "null when the row predates the bucket scheme (hist_stale). Empty points: the app never ran on a device you "
       "can read, or the name/version does not match exactly (list_dex_perf_apps).",
       obj({"app": APP, "version": VERSION}, ["app"]),
       obj({"app": string(512), "version": nullable(string(512)), "points": array(APP_POINT)}, ["app", "points"]))
def get_dex_app_perf(ctx, args):
    return services.app_perf(ctx.principal, args["app"], args.get("version"))


@_read("get_dex_group_app_perf", "App performance trend in one management group",
       "The same app trend as get_dex_app_perf restricted to one management group's members (≤31 days, computed "
       "from the per-device daily rows), with the same suppression floor (10); empty points: no member ran the app "
       "in 31 days (or sends no app performance). An unknown group, or one you cannot "
       "read, is -32602 'management group not found'. Service-scoped tokens may call it (confined to what they "
       "can read).",
       obj({"group_id": GROUP, "app": APP, "version": VERSION}, ["group_id", "app"]),
       obj({"group_id": string(64), "app": string(512), "version": nullable(string(512)), "floor": integer(0),
            "points": array(APP_POINT)}, ["group_id", "app", "floor", "points"]), service_scope="confined")
def get_dex_group_app_perf(ctx, args):
    return services.group_app_perf(ctx.principal, args["group_id"], args["app"], args.get("version"))


@_read("compare_app_perf_versions", "Before/after evidence for an app upgrade",
       "Before/after evidence for an upgrade: how the same machines in a group performed on the baseline version "
       "versus the candidate. Per machine, its last `window` days (1-31, default 7) on baseline against its first "
       "`window` days on candidate, anchored at its own transition; then aggregated: cpu and ws {before_mean, "
       "after_mean, delta_median, before_p95, after_p95} (null when nothing is paired) and distribution {up, "
       "flat, down} (flat: cpu moved less than 5 % relative). paired/baseline_only/candidate_only/no_data count "
       "the members; small_cohort when paired < 10, insufficient when 0; truncated when the group has more than "
       "5000 members. Evidence only: no verdict, no threshold. Audited as dex.app_perf.compare.",
       obj({"app": APP, "group": GROUP, "baseline": string(512, "The version before", minLength=0),
            "candidate": string(512, "The version after (≠ baseline)"),
            "window": integer(1, 31, "Days per side (default 7)")}, ["app", "group", "baseline", "candidate"]),
       obj({"app": string(512), "group_id": string(64), "baseline_version": string(512),
            "candidate_version": string(512), "window_days": integer(1, 31), "cohort_size": integer(0),
            "paired": integer(0), "baseline_only": integer(0), "candidate_only": integer(0), "no_data": integer(0),
            "small_cohort": boolean(), "insufficient": boolean(), "truncated": boolean(), "cpu": COMPARE_STATS,
            "ws": COMPARE_STATS, "distribution": obj({"up": integer(0), "flat": integer(0), "down": integer(0)}),
            **AUDITED},
           ["app", "group_id", "baseline_version", "candidate_version", "paired", "cpu", "ws", "distribution"]),
       service_scope="confined")
def compare_app_perf_versions(ctx, args):
    return services.compare_versions(ctx.principal, args["app"], args["group"], args["baseline"], args["candidate"],
                                     args.get("window"), cid=ctx.cid)


# --- network -----------------------------------------------------------------------------------------------

@_read("get_network_fleet", "Fleet network quality now",
       "Fleet network quality right now, from the connected agents' latest heartbeats: RTT (median smoothed TCP "
       "RTT per device, ms), TCP retransmit % and throughput (bytes/s, non-loopback) stats, reporting (devices with "
       "≥1 network value), rtt_reporting, online, and cooccurrence counts of degraded devices that also show "
       "device (CPU ≥85, commit ≥90 or disk ≥25 ms) or app trouble. A stat is null when nobody reported it. Agents "
       "do not send a degraded flag yet (no calibrated threshold), so every cooccurrence band is 0 — that is "
       "'not measured', not 'healthy'. Worst devices: list_network_devices.",
       obj(),
       obj({"rtt_ms": STAT, "retrans_pct": STAT, "throughput_bps": STAT, "reporting": integer(0),
            "rtt_reporting": integer(0), "online": integer(0),
            "cooccurrence": obj({"degraded": integer(0), "also_device": integer(0), "also_app": integer(0),
                                 "network_only": integer(0)})},
           ["rtt_ms", "retrans_pct", "throughput_bps", "reporting", "online", "cooccurrence"]))
def get_network_fleet(ctx, args):
    return services.network_fleet(ctx.principal)


@_read("list_network_devices", "Devices behind a network drill",
       "The device list behind any network drill: worst by metric (rtt or retrans: highest first; throughput: "
       "lowest first), not reporting (filter=not_reporting: online agents with no network value), a "
       "co-occurrence band (cooc: device | app | network_only | degraded — only devices flagged net_degraded, "
       "which agents do not send yet, so these bands are empty), or one cohort (key, cohort_value). Rows carry "
       "the values reported (a missing key = not reported, never 0), under_pressure (CPU ≥85, commit ≥90 or disk "
       "≥25 ms), app_unstable (always false: not wired) and fleet_pctile. Audited as network.device.view. "
       "Service-scoped tokens are refused.",
       obj({"metric": enum(tuple(services.NET_METRICS), "Sort by (default rtt)"),
            "filter": enum(("not_reporting",), "not_reporting: online agents that send no network value"),
            "cooc": enum(services.COOC, "A co-occurrence band of net_degraded devices"), "key": KEY,
            "cohort_value": COHORT, "limit": LIMIT}),
       obj({"metric": string(32), "devices": array(obj({
           "agent_id": string(128), "platform": string(64), "cohort": string(256), **NET_VALUES,
           "net_degraded": nullable(boolean()), "under_pressure": boolean(), "app_unstable": boolean(),
           "fleet_pctile": integer(0, 100)}, ["agent_id", "platform", "cohort"]), max_items=500), **AUDITED},
           ["devices"]), service_scope="denied")
def list_network_devices(ctx, args):
    return services.network_devices(ctx.principal, args.get("metric"), args.get("filter"), args.get("cooc"),
                                    args.get("key"), args.get("cohort_value"), args.get("limit"), cid=ctx.cid)
