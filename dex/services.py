"""The DEX capabilities, one function each, shared by the MCP tools (dex.mcp_tools) and the REST views (dex.api).
Callers have passed the GuaranteedState:Read gate; every function here confines what it reads to the devices
the caller may see (Infrastructure:Read, a grant on a management group counts), so a per-device row — and every
statistic built from per-device rows — covers only those devices. Nothing here dispatches to agents."""

import re
from collections import defaultdict
from datetime import timedelta

from django.db.models import Count, Max
from django.db.models.functions import TruncDate
from django.utils import timezone

from fleet.groups import agents_in_groups
from fleet.models import Agent, ManagementGroup, Tag, heartbeat_interval
from fleet.services import visible_agents, visible_groups
from yuzu import rbac
from yuzu.audit import audit
from yuzu.errors import NotFound, YuzuError

from . import stats
from .models import AppDay, AppFleetDay, DeviceFacts, Observation
from .telemetry import canonical_version

WINDOWS = {"24h": 1, "7d": 7, "30d": 30, "all": None}
OSES = ("all", "windows", "linux", "macos")
PERF_PLATFORMS = ("linux", "windows")
PERF_METRICS = {"cpu": "cpu_pct", "commit": "commit_pct", "disk_lat": "disk_lat_ms"}
NET_METRICS = {"rtt": "rtt_ms", "retrans": "retrans_pct", "throughput": "throughput_bps"}
COOC = ("device", "app", "network_only", "degraded")
COHORT_FLOOR = 10
APP_FLOOR = 10
MEMBER_CAP = 5000
APPS_CAP = 500
B1_DAYS = 31
B2_DAYS = 180
KEY_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
OBS_TYPE_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
#: cohort keys that are not tags: the agent's OS, its agent version, its management groups
PSEUDO_KEYS = ("yuzu:os", "yuzu:agent_version", "yuzu:group")


def invalid(message, field, remediation):
    return YuzuError(message, status=400, rpc_code=-32602, remediation=remediation, extra={"field": field})


# --- confinement -------------------------------------------------------------------------------------------

def visible(principal):
    """The Agent queryset the caller may read, or None for every device (a fleet-wide grant). A service-scoped
    token reads only the devices tagged service=<its service> (docs/tokens-and-rbac.md)."""
    if rbac.group_scope(principal, "Infrastructure", "Read") is None and not principal.scope_service:
        return None
    return visible_agents(principal)  # the caller's groups, and a service-scoped token's service


def _confine(qs, principal, field="agent"):
    agents = visible(principal)
    return qs if agents is None else qs.filter(**{f"{field}__in": agents.values("pk")})


def _group(principal, group_id, field):
    """A management group by id or exact name that the caller reaches (Infrastructure:Read on it or an ancestor,
    or fleet-wide); any other reads as absent."""
    if not isinstance(group_id, str) or not 0 < len(group_id) <= 256:
        raise invalid(f"'{field}' must be a management group id or name", field, "list_management_groups gives them")
    g = ManagementGroup.objects.filter(pk=group_id).first() or ManagementGroup.objects.filter(name=group_id).first()
    if g is None or not rbac.may(principal, "Infrastructure", "Read", group=g):
        raise NotFound(f"management group not found: {group_id[:64]}",
                       remediation="list_management_groups gives the groups you can read")
    return g


def _members(principal, group):
    qs = agents_in_groups([group.pk])
    agents = visible(principal)
    if agents is not None:
        qs = qs.filter(pk__in=agents.values("pk"))
    return qs


def _audit(principal, action, detail, cid=""):
    return audit(principal, action, "success", target_type="Dex", detail=detail, correlation_id=cid)


# --- signals -----------------------------------------------------------------------------------------------

def window_of(window):
    """spec §3: 24h | 7d | 30d | all; anything else resolves to 7d."""
    return window if window in WINDOWS else "7d"


def _os(value):
    if value is None:
        return "all"
    if value not in OSES:
        raise invalid(f"'os' must be one of {', '.join(OSES)}", "os", "use all, windows, linux or macos")
    return value


def _observations(principal, window, os="all"):
    qs = _confine(Observation.objects.since(WINDOWS[window_of(window)]), principal)
    return qs if os == "all" else qs.filter(platform=os)


def _iso(dt):
    return dt.isoformat() if dt is not None else None


def list_signals(principal, window=None, os=None):
    qs = _observations(principal, window, _os(os))
    rows = (qs.values("obs_type").annotate(count=Count("id"), distinct_devices=Count("agent", distinct=True),
                                           last_seen=Max("received_at")).order_by("-count", "obs_type")[:500])
    return {"window": window_of(window), "os": _os(os),
            "signals": [{**r, "last_seen": _iso(r["last_seen"])} for r in rows]}


def signal_scope(principal, window=None):
    qs = _observations(principal, window)
    rows = qs.values("platform").annotate(distinct_types=Count("obs_type", distinct=True),
                                          total_events=Count("id")).order_by("platform")
    return {"window": window_of(window), "platforms": list(rows)}


def signal_detail(principal, obs_type, window=None, os=None, limit=50, cid=""):
    if not isinstance(obs_type, str) or not OBS_TYPE_RE.fullmatch(obs_type):
        raise invalid("'obs_type' must match ^[A-Za-z0-9._-]{1,64}$", "obs_type",
                      "list_dex_signals gives the obs_type values seen, e.g. perf.cpu_sustained")
    os = _os(os)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= 500:
        raise invalid("'limit' must be an integer from 0 to 500", "limit", "default 50")
    every_os = _observations(principal, window).filter(obs_type=obs_type)
    qs = every_os if os == "all" else every_os.filter(platform=os)
    subjects = (qs.values("subject").annotate(count=Count("id"), distinct_devices=Count("agent", distinct=True),
                                              last_seen=Max("received_at")).order_by("-count", "subject")[:limit])
    devices = qs.values("agent_id").annotate(count=Count("id"), last_seen=Max("received_at")) \
        .order_by("-count", "agent_id")[:limit]
    by_day = qs.annotate(day=TruncDate("received_at")).values("day").annotate(count=Count("id")).order_by("day")
    out = {"obs_type": obs_type, "window": window_of(window), "os": os,
           "subjects": [{**r, "last_seen": _iso(r["last_seen"])} for r in subjects],
           "by_os": list(every_os.values("platform").annotate(count=Count("id"),
                                                             distinct_devices=Count("agent", distinct=True))
                         .order_by("platform")),
           "devices": [{**r, "last_seen": _iso(r["last_seen"])} for r in devices],
           "by_day": [{"day": r["day"].isoformat(), "count": r["count"]} for r in by_day]}
    out["audit_persisted"] = _audit(principal, "dex.signal.view", f"obs_type={obs_type} window={out['window']}", cid)
    return out


# --- device performance and network now-views --------------------------------------------------------------

def fresh_since():
    """Facts older than three heartbeat intervals are not 'now' (the agent went quiet or lost its connection)."""
    return timezone.now() - timedelta(seconds=3 * heartbeat_interval())


def current(principal):
    """The facts rows of connected agents the caller may see, fresh, with the agent's os."""
    qs = DeviceFacts.objects.filter(agent__connected=True, updated_at__gte=fresh_since())
    return list(_confine(qs, principal).select_related("agent").only(
        "agent__os", "agent__agent_version", *[f.name for f in DeviceFacts._meta.fields]))


def _online(principal, platforms=None):
    qs = visible(principal)
    qs = (Agent.objects.all() if qs is None else qs).filter(connected=True)
    return qs if platforms is None else qs.filter(os__in=platforms)


def perf_fleet(principal):
    rows = [r for r in current(principal) if r.has_perf]
    return {"cpu_pct": stats.stat(r.cpu_pct for r in rows), "commit_pct": stats.stat(r.commit_pct for r in rows),
            "disk_lat_ms": stats.stat(r.disk_lat_ms for r in rows), "reporting": len(rows),
            "windows_online": _online(principal, PERF_PLATFORMS).count()}


def _key(key, field="key"):
    key = "model" if key is None else key
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise invalid(f"'{field}' must match ^[A-Za-z0-9_.:-]{{1,64}}$", field,
                      "a tag key such as model, or yuzu:os, yuzu:agent_version, yuzu:group; get_dex_perf_cohorts "
                      "lists available_keys")
    return key


def cohorts_of(principal, agent_ids, key):
    """{agent_id: [cohort values]} for a tag key or a pseudo key; an agent without the key is in cohort "".
    yuzu:group names only the groups the caller reads (Infrastructure:Read on it or an ancestor): a membership
    of another group counts as none, so its name never shows."""
    out = defaultdict(list)
    ids = list(agent_ids)
    if key == "yuzu:os":
        for aid, v in Agent.objects.filter(pk__in=ids).values_list("pk", "os"):
            out[aid].append(v or "")
    elif key == "yuzu:agent_version":
        for aid, v in Agent.objects.filter(pk__in=ids).values_list("pk", "agent_version"):
            out[aid].append(v or "")
    elif key == "yuzu:group":
        memberships = ManagementGroup.members.through.objects.filter(agent_id__in=ids)
        if rbac.group_scope(principal, "Infrastructure", "Read") is not None:
            memberships = memberships.filter(
                managementgroup__in=visible_groups(principal, securable="Infrastructure").values("pk"))
        for aid, name in memberships.values_list("agent_id", "managementgroup__name"):
            out[aid].append(name)
    else:
        for aid, v in Tag.objects.filter(agent_id__in=ids, key=key).values_list("agent_id", "value"):
            out[aid].append(v)
    return {aid: sorted(out.get(aid) or [""]) for aid in ids}


def _cohort_stats(rows, metrics):
    if len(rows) < COHORT_FLOOR:
        return {"devices": len(rows), "suppressed": True}
    return {"devices": len(rows), "suppressed": False,
            **{m: stats.stat(getattr(r, m) for r in rows) for m in metrics}}


def _group_rows(principal, rows, key):
    membership = cohorts_of(principal, [r.agent_id for r in rows], key)
    groups = defaultdict(list)
    for r in rows:
        for c in membership[r.agent_id]:
            groups[c].append(r)
    return groups, membership


PERF_COLS = tuple(PERF_METRICS.values())


def perf_cohorts(principal, key=None):
    key = _key(key)
    rows = [r for r in current(principal) if r.has_perf]
    groups, _ = _group_rows(principal, rows, key)
    cohorts = [{"cohort": c, **_cohort_stats(rs, PERF_COLS)} for c, rs in sorted(groups.items())]
    keys = sorted(set(Tag.objects.filter(agent_id__in=[r.agent_id for r in rows]).values_list("key", flat=True)))
    return {"key": key, "floor": COHORT_FLOOR, "cohorts": cohorts, "available_keys": [*PSEUDO_KEYS, *keys][:200]}


def _cohort_value(value, field):
    if not isinstance(value, str) or len(value) > 256:
        raise invalid(f"'{field}' must be a string of at most 256 characters", field,
                      "a cohort value from get_dex_perf_cohorts; \"\" is the untagged cohort")
    return value


def perf_cohort_diff(principal, a, b, key=None):
    key, a, b = _key(key), _cohort_value(a, "a"), _cohort_value(b, "b")
    rows = [r for r in current(principal) if r.has_perf]
    groups, _ = _group_rows(principal, rows, key)
    slot = {c: _cohort_stats(groups[c], PERF_COLS) if c in groups else None for c in (a, b)}
    sa, sb = slot[a], slot[b]
    delta = {}
    for m in PERF_COLS:
        ma, mb = (sa or {}).get(m), (sb or {}).get(m)
        delta[m] = (stats.r3((ma["p50"] - mb["p50"]) / mb["p50"] * 100)
                    if ma and mb and not sa["suppressed"] and not sb["suppressed"] and mb["p50"] else None)
    return {"key": key, "floor": COHORT_FLOOR, "found_a": sa is not None, "found_b": sb is not None,
            "a": {"cohort": a, **sa} if sa else None, "b": {"cohort": b, **sb} if sb else None, "delta_pct": delta}


def _limit(limit, high=500, default=50):
    limit = default if limit is None else limit
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= high:
        raise invalid(f"'limit' must be an integer from 1 to {high}", "limit", f"default {default}")
    return limit


def _choice(value, choices, field, default):
    value = default if value is None else value
    if value not in choices:
        raise invalid(f"'{field}' must be one of {', '.join(choices)}", field, f"default {default}")
    return value


def _not_reporting(principal, reporting_ids, key, cohort_value, limit):
    qs = _online(principal, PERF_PLATFORMS).exclude(pk__in=reporting_ids).order_by("agent_id")
    ids = list(qs.values_list("pk", flat=True)[:MEMBER_CAP])
    membership = cohorts_of(principal, ids, key)
    out = []
    for aid in ids:
        if cohort_value is not None and cohort_value not in membership[aid]:
            continue
        out.append((aid, membership[aid]))
    return out[:limit]


def _cohort_label(cohorts, wanted):
    return wanted if wanted is not None and wanted in cohorts else cohorts[0]


def perf_devices(principal, metric=None, filter=None, cohort_key=None, cohort_value=None, limit=None, cid=""):
    column = PERF_METRICS[_choice(metric, tuple(PERF_METRICS), "metric", "cpu")]
    _choice(filter, ("not_reporting", ""), "filter", "")
    key = _key(cohort_key, "cohort_key")
    if cohort_value is not None:
        _cohort_value(cohort_value, "cohort_value")
    limit = _limit(limit)
    rows = [r for r in current(principal) if r.has_perf]
    if filter == "not_reporting":
        devices = [{"agent_id": aid, "cohort": _cohort_label(c, cohort_value)}
                   for aid, c in _not_reporting(principal, [r.agent_id for r in rows], key, cohort_value, limit)]
    else:
        membership = cohorts_of(principal, [r.agent_id for r in rows], key)
        ranked = sorted(v for v in (getattr(r, column) for r in rows) if v is not None)
        if cohort_value is not None:
            rows = [r for r in rows if cohort_value in membership[r.agent_id]]
        rows.sort(key=lambda r: (getattr(r, column) is None, -(getattr(r, column) or 0), r.agent_id))
        devices = []
        for r in rows[:limit]:
            d = {"agent_id": r.agent_id, "cohort": _cohort_label(membership[r.agent_id], cohort_value)}
            for m in PERF_COLS:
                if getattr(r, m) is not None:
                    d[m] = getattr(r, m)
            if getattr(r, column) is not None:
                d["fleet_pctile"] = stats.pctile_rank(ranked, getattr(r, column))
            devices.append(d)
    persisted = _audit(principal, "dex.perf.device.view", f"metric={column} filter={filter or ''} n={len(devices)}",
                       cid)
    return {"metric": column, "devices": devices, "audit_persisted": persisted}


NET_COLS = tuple(NET_METRICS.values())


def network_fleet(principal):
    facts = current(principal)
    rows = [r for r in facts if r.has_net]
    degraded = [r for r in rows if r.net_degraded]
    also_device = sum(1 for r in degraded if r.under_pressure)
    return {"rtt_ms": stats.stat(r.rtt_ms for r in rows), "retrans_pct": stats.stat(r.retrans_pct for r in rows),
            "throughput_bps": stats.stat(r.throughput_bps for r in rows), "reporting": len(rows),
            "rtt_reporting": sum(1 for r in rows if r.rtt_ms is not None), "online": _online(principal).count(),
            "cooccurrence": {"degraded": len(degraded), "also_device": also_device, "also_app": 0,
                             "network_only": len(degraded) - also_device}}


def _in_band(r, cooc):
    if not r.net_degraded:
        return False
    return {"degraded": True, "device": r.under_pressure, "app": False,
            "network_only": not r.under_pressure}[cooc]


def network_devices(principal, metric=None, filter=None, cooc=None, key=None, cohort_value=None, limit=None,
                    cid=""):
    name = _choice(metric, tuple(NET_METRICS), "metric", "rtt")
    column = NET_METRICS[name]
    _choice(filter, ("not_reporting", ""), "filter", "")
    if cooc is not None:
        _choice(cooc, COOC, "cooc", "degraded")
    key = _key(key)
    if cohort_value is not None:
        _cohort_value(cohort_value, "cohort_value")
    limit = _limit(limit)
    facts = current(principal)
    rows = [r for r in facts if r.has_net]
    platform = {r.agent_id: r.agent.os for r in facts}
    if filter == "not_reporting":
        qs = _online(principal).exclude(pk__in=[r.agent_id for r in rows]).order_by("agent_id")
        ids = list(qs.values_list("pk", "os")[:MEMBER_CAP])
        membership = cohorts_of(principal, [i for i, _ in ids], key)
        devices = [{"agent_id": aid, "platform": os or "", "cohort": _cohort_label(membership[aid], cohort_value),
                    "net_degraded": None, "under_pressure": False, "app_unstable": False}
                   for aid, os in ids if cohort_value is None or cohort_value in membership[aid]][:limit]
    else:
        membership = cohorts_of(principal, [r.agent_id for r in rows], key)
        ranked = sorted(v for v in (getattr(r, column) for r in rows) if v is not None)
        if cooc is not None:
            rows = [r for r in rows if _in_band(r, cooc)]
        if cohort_value is not None:
            rows = [r for r in rows if cohort_value in membership[r.agent_id]]
        sign = 1 if name == "throughput" else -1  # worst: highest rtt / retransmits, lowest throughput
        rows.sort(key=lambda r: (getattr(r, column) is None, sign * (getattr(r, column) or 0), r.agent_id))
        devices = []
        for r in rows[:limit]:
            d = {"agent_id": r.agent_id, "platform": platform.get(r.agent_id) or "",
                 "cohort": _cohort_label(membership[r.agent_id], cohort_value), "net_degraded": r.net_degraded,
                 "under_pressure": r.under_pressure, "app_unstable": False}
            for m in NET_COLS:
                if getattr(r, m) is not None:
                    d[m] = getattr(r, m)
            if getattr(r, column) is not None:
                d["fleet_pctile"] = stats.pctile_rank(ranked, getattr(r, column))
            devices.append(d)
    persisted = _audit(principal, "network.device.view", f"metric={column} filter={filter or ''} "
                                                         f"cooc={cooc or ''} n={len(devices)}", cid)
    return {"metric": column, "devices": devices, "audit_persisted": persisted}


# --- app performance ---------------------------------------------------------------------------------------

def _app(app, field="app"):
    if not isinstance(app, str) or not app.strip() or len(app) > 512:
        raise invalid(f"'{field}' must be a non-empty string of at most 512 characters", field,
                      "list_dex_perf_apps gives the app names with history")
    return app.strip()


def _version(version, field="version", required=False):
    if version is None and not required:
        return None
    if not isinstance(version, str) or len(version) > 512:
        raise invalid(f"'{field}' must be a string of at most 512 characters", field,
                      "a version as get_dex_app_perf lists it (trimmed and lower-cased; \"\" = unknown version)")
    return canonical_version(version)


def list_apps(principal):
    agents = visible(principal)
    merged = {}
    sources = [AppDay.objects.filter(day__gte=timezone.now().date() - timedelta(days=B1_DAYS))]
    if agents is None:
        sources.append(AppFleetDay.objects.filter(day__gte=timezone.now().date() - timedelta(days=B2_DAYS)))
    else:
        sources[0] = sources[0].filter(agent__in=agents.values("pk"))
    for qs in sources:
        for row in qs.values("app_name").annotate(versions=Count("version", distinct=True), last_day=Max("day")):
            have = merged.get(row["app_name"])
            if have is None or row["last_day"] > have["last_day"] or row["versions"] > have["versions"]:
                merged[row["app_name"]] = {**row, "last_day": max(row["last_day"], have["last_day"])
                                           if have else row["last_day"],
                                           "versions": max(row["versions"], have["versions"] if have else 0)}
    ordered = sorted(merged.values(), key=lambda r: (-r["last_day"].toordinal(), r["app_name"]))
    return {"apps": [{**r, "last_day": r["last_day"].isoformat()} for r in ordered[:APPS_CAP]],
            "truncated": len(ordered) > APPS_CAP}


def rollup(rows):
    """B1 rows of one (app, version, day) → the B2 columns (device_count, mean/max, histograms)."""
    cpu = [r.cpu_avg for r in rows]
    ws = [r.ws_avg_bytes / stats.MIB for r in rows]
    return {"device_count": len({r.agent_id for r in rows}),
            "cpu_mean": stats.mean(cpu), "cpu_max": stats.r3(max((r.cpu_max for r in rows), default=None)),
            "ws_mean": stats.mean(r.ws_avg_bytes for r in rows),
            "ws_max": stats.r3(max((r.ws_max_bytes for r in rows), default=None)),
            "cpu_hist": stats.histogram(cpu, stats.CPU_EDGES), "ws_hist": stats.histogram(ws, stats.WS_EDGES_MIB),
            "scheme": stats.HIST_SCHEME}


def point(version, day, b2):
    """One trend point from B2 columns: suppressed below APP_FLOOR devices (the count only)."""
    out = {"version": version, "day": day.isoformat(), "device_count": b2["device_count"],
           "suppressed": b2["device_count"] < APP_FLOOR}
    if out["suppressed"]:
        return out
    stale = b2["scheme"] != stats.HIST_SCHEME
    out.update(cpu_mean=b2["cpu_mean"], cpu_max=b2["cpu_max"], ws_mean=b2["ws_mean"], ws_max=b2["ws_max"])
    for name, hist, edges in (("cpu", b2["cpu_hist"], stats.CPU_EDGES), ("ws", b2["ws_hist"], stats.WS_EDGES_MIB)):
        for p, label in ((0.5, "p50"), (0.95, "p95")):
            out[f"{name}_{label}"] = None if stale else stats.hist_percentile(hist, edges, p)
    if stale:
        out["hist_stale"] = True
    return out


def _b1_points(qs):
    grouped = defaultdict(list)
    for r in qs.only("agent_id", "version", "day", "cpu_avg", "cpu_max", "ws_avg_bytes", "ws_max_bytes"):
        grouped[(r.version, r.day)].append(r)
    return {k: rollup(v) for k, v in grouped.items()}


def app_perf(principal, app, version=None):
    app, version = _app(app), _version(version)
    agents = visible(principal)
    b1 = AppDay.objects.filter(app_name=app, day__gte=timezone.now().date() - timedelta(days=B1_DAYS))
    if version is not None:
        b1 = b1.filter(version=version)
    points = {}
    if agents is None:
        b2 = AppFleetDay.objects.filter(app_name=app, day__gte=timezone.now().date() - timedelta(days=B2_DAYS))
        if version is not None:
            b2 = b2.filter(version=version)
        for row in b2.values():
            points[(row["version"], row["day"])] = row
    else:
        b1 = b1.filter(agent__in=agents.values("pk"))
    for k, cols in _b1_points(b1).items():
        points.setdefault(k, cols)  # B1 covers the days the rollup has not reached yet
    return {"app": app, "version": version,
            "points": [point(v, d, points[(v, d)]) for v, d in sorted(points, key=lambda k: (k[1], k[0]))]}


def group_app_perf(principal, group_id, app, version=None):
    group = _group(principal, group_id, "group_id")
    app, version = _app(app), _version(version)
    b1 = AppDay.objects.filter(app_name=app, agent__in=_members(principal, group).values("pk"),
                               day__gte=timezone.now().date() - timedelta(days=B1_DAYS))
    if version is not None:
        b1 = b1.filter(version=version)
    pts = _b1_points(b1)
    return {"group_id": group.pk, "app": app, "version": version, "floor": APP_FLOOR,
            "points": [point(v, d, pts[(v, d)]) for v, d in sorted(pts, key=lambda k: (k[1], k[0]))]}


def compare_versions(principal, app, group, baseline, candidate, window=None, cid=""):
    app = _app(app)
    baseline = _version(baseline, "baseline", required=True)
    candidate = _version(candidate, "candidate", required=True)
    if baseline == candidate:
        raise invalid("'candidate' must differ from 'baseline' (compared trimmed and lower-cased)", "candidate",
                      "name the version the machines moved to")
    window = 7 if window is None else window
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= 31:
        raise invalid("'window' must be an integer from 1 to 31 (days)", "window", "default 7")
    g = _group(principal, group, "group")
    members = list(_members(principal, g).order_by("agent_id").values_list("pk", flat=True)[:MEMBER_CAP + 1])
    truncated = len(members) > MEMBER_CAP
    members = members[:MEMBER_CAP]
    per = defaultdict(lambda: {baseline: [], candidate: []})
    for r in AppDay.objects.filter(app_name=app, version__in=(baseline, candidate), agent_id__in=members) \
            .order_by("day").values("agent_id", "version", "day", "cpu_avg", "ws_avg_bytes"):
        per[r["agent_id"]][r["version"]].append(r)
    paired, baseline_only, candidate_only = [], 0, 0
    for aid in members:
        seen = per.get(aid)
        if seen is None:
            continue
        cand = seen[candidate]
        if not cand:
            baseline_only += 1
            continue
        turn = cand[0]["day"]
        base = [r for r in seen[baseline] if r["day"] < turn]
        if not base:
            candidate_only += 1
            continue
        last = base[-1]["day"]
        before = [r for r in base if r["day"] > last - timedelta(days=window)]
        after = [r for r in cand if r["day"] < turn + timedelta(days=window)]
        paired.append({"cpu": (stats.mean(r["cpu_avg"] for r in before), stats.mean(r["cpu_avg"] for r in after)),
                       "ws": (stats.mean(r["ws_avg_bytes"] for r in before),
                              stats.mean(r["ws_avg_bytes"] for r in after))})
    dist = {"up": 0, "flat": 0, "down": 0}
    for p in paired:
        dist[stats.direction(*p["cpu"])] += 1

    def summary(name):
        if not paired:
            return None
        b = [p[name][0] for p in paired]
        a = [p[name][1] for p in paired]
        return {"before_mean": stats.mean(b), "after_mean": stats.mean(a),
                "delta_median": stats.med([y - x for x, y in zip(b, a, strict=True)]),
                "before_p95": stats.p95(b), "after_p95": stats.p95(a)}

    out = {"app": app, "group_id": g.pk, "baseline_version": baseline, "candidate_version": candidate,
           "window_days": window, "cohort_size": len(members), "paired": len(paired), "baseline_only": baseline_only,
           "candidate_only": candidate_only, "no_data": len(members) - len(per),
           "small_cohort": len(paired) < APP_FLOOR, "insufficient": not paired, "truncated": truncated,
           "cpu": summary("cpu"), "ws": summary("ws"), "distribution": dist}
    out["audit_persisted"] = _audit(principal, "dex.app_perf.compare",
                                    f"app={app[:100]} group={g.pk} baseline={baseline[:64]} "
                                    f"candidate={candidate[:64]} paired={len(paired)}", cid)
    return out


# --- retention and the fleet rollup (Celery beat, dex.tasks) -----------------------------------------------

def rollup_days(days=2):
    """Recompute B2 for the last ``days`` UTC days from B1 (idempotent: an upsert per (app, version, day))."""
    since = timezone.now().date() - timedelta(days=days - 1)
    grouped = defaultdict(list)
    for r in AppDay.objects.filter(day__gte=since).only("agent_id", "app_name", "version", "day", "cpu_avg",
                                                         "cpu_max", "ws_avg_bytes", "ws_max_bytes"):
        grouped[(r.app_name, r.version, r.day)].append(r)
    rows = [AppFleetDay(app_name=a, version=v, day=d, **rollup(rs)) for (a, v, d), rs in grouped.items()]
    AppFleetDay.objects.bulk_create(rows, update_conflicts=True, unique_fields=["app_name", "version", "day"],
                                    update_fields=["device_count", "cpu_mean", "cpu_max", "ws_mean", "ws_max",
                                                   "cpu_hist", "ws_hist", "scheme"])
    return len(rows)


def reap(signal_days=30):
    """Delete what is past retention: observations (signal_days), B1 (31 days), B2 (180 days)."""
    return {"observations": Observation.objects.reap(signal_days), "app_days": AppDay.objects.reap(B1_DAYS),
            "app_fleet_days": AppFleetDay.objects.reap(B2_DAYS)}


# --- the posture section (fleet.orientation.POSTURE_SECTIONS["dex"]) ---------------------------------------

def posture(principal):
    """DEX health for get_fleet_posture_fast: → (section, the tools to call next), or (None, []) to a caller the DEX
    tools refuse (no fleet-wide GuaranteedState:Read: the posture needs only Infrastructure:Read). status is no_data
    when no device the caller can read reports DEX facts or signals (not 'healthy'), attention when a device is under
    pressure or a signal fired in the last 24 h, else ok."""
    if not rbac.may(principal, "GuaranteedState", "Read"):
        return None, []
    facts = current(principal)
    perf = [r for r in facts if r.has_perf]
    net = [r for r in facts if r.has_net]
    signals = list(_observations(principal, "24h").values("obs_type").annotate(count=Count("id"))
                   .order_by("-count", "obs_type")[:3])
    pressure = sum(1 for r in perf if r.under_pressure)

    def p90(rows, column):
        s = stats.stat(getattr(r, column) for r in rows)
        return s["p90"] if s else None

    status = "no_data" if not perf and not net and not signals else (
        "attention" if pressure or signals else "ok")
    section = {"status": status, "perf_reporting": len(perf), "devices_under_pressure": pressure,
               "cpu_pct_p90": p90(perf, "cpu_pct"), "commit_pct_p90": p90(perf, "commit_pct"),
               "disk_lat_ms_p90": p90(perf, "disk_lat_ms"), "net_reporting": len(net),
               "rtt_ms_p90": p90(net, "rtt_ms"), "retrans_pct_p90": p90(net, "retrans_pct"),
               "signals_24h": sum(s["count"] for s in signals), "top_signals_24h": signals}
    tools = {"attention": ["list_dex_perf_devices", "list_dex_signals"], "ok": ["get_dex_perf_fleet"],
             "no_data": []}[status]
    return section, tools


# --- the admin dashboard (dex.admin) -----------------------------------------------------------------------

def dashboard(principal, top=10):
    """Everything the DEX dashboard shows, from one read of the facts: the fleet perf and network now-views, the
    worst devices per metric, who does not report, and the signals of the last 24 h. Audited once
    (dex.dashboard.view): it lists devices."""
    facts = current(principal)
    perf = [r for r in facts if r.has_perf]
    net = [r for r in facts if r.has_net]
    hosts = dict(Agent.objects.filter(pk__in=[r.agent_id for r in facts]).values_list("pk", "hostname"))

    def worst(rows, column, reverse=True):
        have = sorted((r for r in rows if getattr(r, column) is not None), key=lambda r: getattr(r, column),
                      reverse=reverse)[:top]
        ranked = sorted(getattr(r, column) for r in rows if getattr(r, column) is not None)
        return [{"agent_id": r.agent_id, "hostname": hosts.get(r.agent_id, ""), "value": getattr(r, column),
                 "fleet_pctile": stats.pctile_rank(ranked, getattr(r, column)), "under_pressure": r.under_pressure}
                for r in have]

    perf_online = _online(principal, PERF_PLATFORMS)
    out = {"perf": {c: stats.stat(getattr(r, c) for r in perf) for c in PERF_COLS},
           "net": {c: stats.stat(getattr(r, c) for r in net) for c in NET_COLS},
           "perf_reporting": len(perf), "net_reporting": len(net), "perf_online": perf_online.count(),
           "online": _online(principal).count(), "under_pressure": sum(1 for r in perf if r.under_pressure),
           "worst": {"cpu_pct": worst(perf, "cpu_pct"), "commit_pct": worst(perf, "commit_pct"),
                     "disk_lat_ms": worst(perf, "disk_lat_ms"), "rtt_ms": worst(net, "rtt_ms"),
                     "retrans_pct": worst(net, "retrans_pct")},
           "not_reporting": list(perf_online.exclude(pk__in=[r.agent_id for r in perf]).order_by("agent_id")
                                 .values_list("hostname", flat=True)[:top]),
           "signals": list_signals(principal, "24h")["signals"][:top]}
    _audit(principal, "dex.dashboard.view", f"devices={len(facts)}")
    return out
