"""The 13 DEX tools through the MCP pipeline (in process) and their REST twins: results as spec/dex.md gives them,
what empty and missing mean, management-group confinement of every per-device row, and hostile arguments."""

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from dex import services
from dex.models import DeviceFacts
from fleet.models import ManagementGroup
from tests.dex.conftest import agent, app_day, observe
from tests.support.mcp_http import McpClient
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)
TOOLS = ("list_dex_signals", "get_dex_signal_scope", "get_dex_signal_detail", "get_dex_perf_fleet",
         "get_dex_perf_cohorts", "get_dex_perf_cohort_diff", "list_dex_perf_devices", "list_dex_perf_apps",
         "get_dex_app_perf", "get_dex_group_app_perf", "compare_app_perf_versions", "get_network_fleet",
         "list_network_devices")


def client(raw):
    c = McpClient(raw)
    c.initialize()
    return c


def sc(c, name, args=None):
    body = c.call(name, args or {}).json()
    assert "result" in body, body
    assert not body["result"].get("isError"), body
    return body["result"]["structuredContent"]


def err(c, name, args):
    return c.call(name, args).json()["error"]


def test_the_catalogue_lists_13_readonly_ungated_tools_with_output_schemas(mint):
    c = client(mint("dex-viewer", role="Viewer", tier="readonly"))
    listed = {t["name"]: t for t in c.rpc("tools/list").json()["result"]["tools"]}
    for name in TOOLS:
        t = listed[name]
        assert t["annotations"]["readOnlyHint"] is True and t["annotations"].get("idempotentHint") is True
        assert t["outputSchema"]["type"] == "object"
        assert "approval_id" not in t["inputSchema"]["properties"]


def test_empty_fleet_means_null_not_zero(mint):
    c = client(mint("dex-viewer", role="Viewer", tier="readonly"))
    fleet = sc(c, "get_dex_perf_fleet")
    assert fleet == {"cpu_pct": None, "commit_pct": None, "disk_lat_ms": None, "reporting": 0, "windows_online": 0}
    net = sc(c, "get_network_fleet")
    assert net["rtt_ms"] is None and net["reporting"] == 0
    assert sc(c, "list_dex_signals")["signals"] == []
    assert sc(c, "list_dex_perf_apps") == {"apps": [], "truncated": False}


def test_perf_now_views(world, mint):
    c = client(mint("dex-viewer", role="Viewer", tier="readonly"))
    fleet = sc(c, "get_dex_perf_fleet")
    assert fleet["reporting"] == 30 and fleet["windows_online"] == 31  # silent-01 is online; gone-01 is not
    assert fleet["cpu_pct"]["max"] == 95.0 and fleet["cpu_pct"]["n"] == 30
    assert fleet["disk_lat_ms"]["n"] == 24  # every fifth device did not report disk latency: not counted as 0
    devices = sc(c, "list_dex_perf_devices", {"limit": 3})["devices"]
    assert [d["agent_id"] for d in devices] == ["hot-00", "hot-01", "hot-02"]
    assert devices[0]["fleet_pctile"] == 100 and devices[0]["cohort"] == "a"
    assert "disk_lat_ms" not in devices[0]  # hot-00 did not report it
    missing = sc(c, "list_dex_perf_devices", {"filter": "not_reporting"})["devices"]
    assert [d["agent_id"] for d in missing] == ["silent-01"]
    cohort = sc(c, "list_dex_perf_devices", {"cohort_value": "b", "limit": 500})["devices"]
    assert len(cohort) == 15 and {d["cohort"] for d in cohort} == {"b"}
    assert AuditEvent.objects.filter(action="dex.perf.device.view").count() == 3
    cohorts = sc(c, "get_dex_perf_cohorts", {})
    assert [(x["cohort"], x["devices"], x["suppressed"]) for x in cohorts["cohorts"]] == [("a", 15, False),
                                                                                        ("b", 15, False)]
    assert "model" in cohorts["available_keys"] and "yuzu:os" in cohorts["available_keys"]
    by_group = sc(c, "get_dex_perf_cohorts", {"key": "yuzu:group"})["cohorts"]
    assert [(x["cohort"], x["devices"]) for x in by_group] == [("dex-in", 15), ("dex-out", 15)]
    diff = sc(c, "get_dex_perf_cohort_diff", {"a": "a", "b": "b"})
    assert diff["found_a"] and diff["found_b"] and diff["delta_pct"]["cpu_pct"] is not None
    missing_cohort = sc(c, "get_dex_perf_cohort_diff", {"a": "zzz", "b": "b"})
    assert missing_cohort["found_a"] is False and missing_cohort["a"] is None
    assert missing_cohort["delta_pct"] == {"cpu_pct": None, "commit_pct": None, "disk_lat_ms": None}


def test_small_cohorts_are_suppressed(world, mint):
    c = client(mint("dex-viewer", role="Viewer", tier="readonly"))
    per_os = sc(c, "get_dex_perf_cohorts", {"key": "yuzu:agent_version"})["cohorts"]
    assert per_os[0]["suppressed"] is False
    hot_only = services.perf_cohorts  # noqa: F841 (the service the tool calls)
    from fleet.models import Tag
    Tag.objects.filter(agent_id__in=["calm-03", "calm-04"]).update(value="rare")
    rare = [x for x in sc(c, "get_dex_perf_cohorts", {})["cohorts"] if x["cohort"] == "rare"][0]
    assert rare == {"cohort": "rare", "devices": 2, "suppressed": True}  # population only: no stat keys
    diff = sc(c, "get_dex_perf_cohort_diff", {"a": "rare", "b": "a"})
    assert diff["found_a"] and diff["delta_pct"]["cpu_pct"] is None


def test_network_views(world, mint):
    c = client(mint("dex-viewer", role="Viewer", tier="readonly"))
    net = sc(c, "get_network_fleet")
    assert net["reporting"] == 30 and net["rtt_reporting"] == 30 and net["online"] == 31
    assert net["cooccurrence"] == {"degraded": 0, "also_device": 0, "also_app": 0, "network_only": 0}
    worst = sc(c, "list_network_devices", {"limit": 2})["devices"]
    assert [d["agent_id"] for d in worst] == ["calm-29", "calm-28"]
    assert worst[0]["under_pressure"] is False and worst[0]["app_unstable"] is False
    slowest = sc(c, "list_network_devices", {"metric": "throughput", "limit": 1})["devices"]
    assert slowest[0]["agent_id"] == "hot-00"  # throughput: the lowest is the worst
    assert sc(c, "list_network_devices", {"cooc": "degraded"})["devices"] == []
    DeviceFacts.objects.filter(agent_id="hot-00").update(net_degraded=True)
    assert sc(c, "get_network_fleet")["cooccurrence"] == {"degraded": 1, "also_device": 1, "also_app": 0,
                                                          "network_only": 0}
    band = sc(c, "list_network_devices", {"cooc": "device"})["devices"]
    assert [d["agent_id"] for d in band] == ["hot-00"] and band[0]["under_pressure"] is True
    assert AuditEvent.objects.filter(action="network.device.view").count() == 4


def test_signals(world, mint):
    c = client(mint("dex-viewer", role="Viewer", tier="readonly"))
    a = world["agents"]
    for x in a[:3]:
        observe(x)
    observe(a[0], "storage.low", "/dev/sda1")
    observe(a[1], "storage.low", "/dev/sda1", ago=timedelta(days=3))
    observe(a[2], "os.uptime_report", "uptime", ago=timedelta(days=10))
    signals = sc(c, "list_dex_signals", {"window": "24h"})["signals"]
    assert [(s["obs_type"], s["count"], s["distinct_devices"]) for s in signals] == [
        ("perf.cpu_sustained", 3, 3), ("storage.low", 1, 1)]
    assert len(sc(c, "list_dex_signals", {})["signals"]) == 2  # 7d
    assert len(sc(c, "list_dex_signals", {"window": "all"})["signals"]) == 3
    assert sc(c, "list_dex_signals", {"window": "bogus"})["window"] == "7d"
    assert sc(c, "list_dex_signals", {"os": "windows"})["signals"] == []
    assert err(c, "list_dex_signals", {"os": "beos"})["code"] == -32602
    scope = sc(c, "get_dex_signal_scope", {"window": "all"})["platforms"]
    assert scope == [{"platform": "linux", "distinct_types": 3, "total_events": 6}]
    detail = sc(c, "get_dex_signal_detail", {"obs_type": "storage.low", "window": "30d"})
    assert detail["subjects"][0] == {"subject": "/dev/sda1", "count": 2, "distinct_devices": 2,
                                     "last_seen": detail["subjects"][0]["last_seen"]}
    assert len(detail["by_day"]) == 2 and detail["audit_persisted"] is True
    assert sc(c, "get_dex_signal_detail", {"obs_type": "never.seen"})["devices"] == []
    assert err(c, "get_dex_signal_detail", {"obs_type": "bad type!"})["code"] == -32602
    assert AuditEvent.objects.filter(action="dex.signal.view").count() == 2


def test_app_perf_and_version_comparison(world, mint):
    c = client(mint("dex-viewer", role="Viewer", tier="readonly"))
    today = timezone.now().date()
    for i, a in enumerate(world["agents"][:12]):
        for d in range(4, 1, -1):  # three days on 1.0 …
            app_day(a, "java", "1.0", today - timedelta(days=d), cpu=10.0)
        for d in range(1, -1, -1):  # … then two on 2.0, using twice the CPU on every machine but one
            app_day(a, "java", "2.0", today - timedelta(days=d), cpu=10.0 if i == 0 else 20.0)
    app_day(world["agents"][20], "java", "1.0", today, cpu=5.0)  # in the other group
    apps = sc(c, "list_dex_perf_apps")
    assert apps == {"apps": [{"app_name": "java", "versions": 2, "last_day": today.isoformat()}], "truncated": False}
    trend = sc(c, "get_dex_app_perf", {"app": "java", "version": " 2.0 "})
    assert trend["version"] == "2.0" and len(trend["points"]) == 2
    p = trend["points"][-1]
    assert p["device_count"] == 12 and not p["suppressed"] and p["cpu_p50"] == {"value": 30, "lower_bound": False}
    small = sc(c, "get_dex_app_perf", {"app": "java", "version": "1.0"})["points"][-1]
    assert small == {"version": "1.0", "day": today.isoformat(), "device_count": 1, "suppressed": True}
    assert services.rollup_days(7) == 6  # B2: the same points from the rollup
    assert sc(c, "get_dex_app_perf", {"app": "java", "version": "2.0"}) == trend
    group = sc(c, "get_dex_group_app_perf", {"group_id": "dex-out", "app": "java"})
    assert [(x["version"], x["device_count"]) for x in group["points"]] == [("1.0", 1)]
    cmp = sc(c, "compare_app_perf_versions", {"app": "java", "group": "dex-in", "baseline": "1.0",
                                              "candidate": "2.0", "window": 2})
    assert (cmp["cohort_size"], cmp["paired"], cmp["no_data"], cmp["small_cohort"]) == (15, 12, 3, False)
    assert cmp["distribution"] == {"up": 11, "flat": 1, "down": 0}
    assert cmp["cpu"]["before_mean"] == 10.0 and cmp["cpu"]["delta_median"] == 10.0
    assert cmp["audit_persisted"] is True
    assert err(c, "compare_app_perf_versions", {"app": "java", "group": "dex-in", "baseline": "1.0",
                                                "candidate": " 1.0"})["code"] == -32602
    assert err(c, "compare_app_perf_versions", {"app": "java", "group": "nope", "baseline": "1.0",
                                                "candidate": "2.0"})["code"] == -32602
    assert err(c, "get_dex_group_app_perf", {"group_id": "nope", "app": "java"})["code"] == -32602


def test_every_per_device_row_is_confined_to_the_callers_groups(world, confined):
    c = client(confined("dex-confined", world["in"]))
    assert sc(c, "get_dex_perf_fleet")["reporting"] == 15
    ids = {d["agent_id"] for d in sc(c, "list_dex_perf_devices", {"limit": 500})["devices"]}
    assert len(ids) == 15 and ids <= {a.agent_id for a in world["agents"][:15]}
    assert {d["agent_id"] for d in sc(c, "list_network_devices", {"limit": 500})["devices"]} == ids
    observe(world["agents"][20], "storage.low", "/dev/sdz")
    assert sc(c, "list_dex_signals")["signals"] == []
    assert sc(c, "get_dex_signal_detail", {"obs_type": "storage.low"})["devices"] == []
    assert err(c, "get_dex_group_app_perf", {"group_id": "dex-out", "app": "java"})["code"] == -32602
    assert err(c, "compare_app_perf_versions", {"app": "java", "group": world["out"].pk, "baseline": "1",
                                                "candidate": "2"})["code"] == -32602
    app_day(world["agents"][20], "secret-app", "1", timezone.now().date(), cpu=5.0)
    assert sc(c, "list_dex_perf_apps")["apps"] == []
    assert sc(c, "get_dex_app_perf", {"app": "secret-app"})["points"] == []


def test_the_group_cohort_names_only_groups_the_caller_reads(world, confined):
    """yuzu:group cohorts come from the visible devices' memberships: a device of the caller's group that is also
    in a group the caller cannot read named that group (its name, and how many of the caller's devices are in
    it), which list_management_groups and every by-id read hide. Such a membership now counts as no group."""
    secret = ManagementGroup.objects.create(name="mergers-and-acquisitions")
    for a in world["agents"][:12]:
        secret.members.add(a)
    c = client(confined("dex-grouped", world["in"]))
    by_group = sc(c, "get_dex_perf_cohorts", {"key": "yuzu:group"})
    assert [(x["cohort"], x["devices"]) for x in by_group["cohorts"]] == [("dex-in", 15)]
    assert "mergers" not in json.dumps(by_group)
    diff = sc(c, "get_dex_perf_cohort_diff", {"key": "yuzu:group", "a": "mergers-and-acquisitions", "b": "dex-in"})
    assert diff["found_a"] is False and diff["a"] is None
    devices = sc(c, "list_dex_perf_devices", {"cohort_key": "yuzu:group", "limit": 500})["devices"]
    assert {d["cohort"] for d in devices} == {"dex-in"}
    assert sc(c, "list_network_devices", {"key": "yuzu:group", "cohort_value": "mergers-and-acquisitions"})[
        "devices"] == []


def test_service_scoped_tokens(world, mint):
    c = client(mint("dex-svc", role="Viewer", tier="readonly", scope_service="payments"))
    for name, args in (("get_dex_signal_detail", {"obs_type": "x"}), ("list_dex_perf_devices", {}),
                       ("list_network_devices", {})):
        assert err(c, name, args)["code"] == -32003
    assert sc(c, "get_dex_group_app_perf", {"group_id": "dex-in", "app": "java"})["points"] == []
    assert sc(c, "get_dex_perf_fleet")["reporting"] == 0  # confined to the devices tagged service=payments
    from fleet.models import Tag
    for a in world["agents"][:4]:
        Tag.objects.create(agent=a, key="service", value="payments")
    assert sc(c, "get_dex_perf_fleet")["reporting"] == 4
    assert sc(c, "get_network_fleet")["reporting"] == 4


@pytest.mark.parametrize("name,args", [
    ("list_dex_perf_devices", {"metric": "gpu"}), ("list_dex_perf_devices", {"limit": 0}),
    ("list_dex_perf_devices", {"limit": 501}), ("list_dex_perf_devices", {"filter": "all"}),
    ("list_dex_perf_devices", {"cohort_key": "bad key"}), ("get_dex_perf_cohorts", {"key": "x" * 65}),
    ("get_dex_perf_cohort_diff", {"a": "x"}), ("get_dex_perf_cohort_diff", {"a": "x" * 257, "b": ""}),
    ("list_network_devices", {"cooc": "both"}), ("get_dex_app_perf", {}), ("get_dex_app_perf", {"app": ""}),
    ("get_dex_app_perf", {"app": "x" * 513}), ("compare_app_perf_versions", {"app": "j", "group": "g"}),
    ("compare_app_perf_versions", {"app": "j", "group": "g", "baseline": "1", "candidate": "2", "window": 32}),
    ("get_dex_signal_detail", {"obs_type": "x", "limit": -1}), ("list_dex_signals", {"window": "x" * 9}),
])
def test_hostile_arguments_are_32602_and_write_nothing(world, mint, name, args):
    c = client(mint("dex-viewer", role="Viewer", tier="readonly"))
    before = AuditEvent.objects.filter(action__startswith="dex.").count()
    assert err(c, name, args)["code"] == -32602
    assert AuditEvent.objects.filter(action__startswith="dex.").count() == before


def test_rest_twins_answer_what_the_tools_answer(world, mint):
    raw = mint("dex-viewer", role="Viewer", tier="readonly")
    c, http = client(raw), Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    observe(world["agents"][0], "storage.low", "/dev/sda1")
    for path, name, args in (("/api/v1/dex/perf/fleet", "get_dex_perf_fleet", {}),
                             ("/api/v1/network/fleet", "get_network_fleet", {}),
                             ("/api/v1/dex/perf/cohorts?key=model", "get_dex_perf_cohorts", {"key": "model"}),
                             ("/api/v1/dex/signals?window=24h", "list_dex_signals", {"window": "24h"}),
                             ("/api/v1/dex/scope", "get_dex_signal_scope", {})):
        r = http.get(path)
        assert r.status_code == 200, r.content
        assert r.json()["data"] == sc(c, name, args)
    devices = http.get("/api/v1/dex/perf/devices?limit=2").json()["data"]
    assert [d["agent_id"] for d in devices["devices"]] == ["hot-00", "hot-01"]
    assert http.get("/api/v1/dex/signals/storage.low").json()["data"]["subjects"][0]["subject"] == "/dev/sda1"
    for bad in ("/api/v1/dex/perf/devices?limit=9999", "/api/v1/dex/perf/devices?metric=gpu",
                "/api/v1/dex/perf/cohort-diff?a=x", "/api/v1/dex/perf/app", "/api/v1/dex/signals/bad%20type",
                "/api/v1/dex/perf/compare?app=j&group=g&baseline=1&candidate=1", "/api/v1/network/devices?cooc=x",
                "/api/v1/dex/signals?os=beos"):
        assert http.get(bad).status_code == 400, bad
    assert http.get("/api/v1/dex/perf/group?group_id=nope&app=j").status_code == 404


def test_stale_and_offline_facts_are_not_now(world, mint):
    c = client(mint("dex-viewer", role="Viewer", tier="readonly"))
    DeviceFacts.objects.filter(agent_id="hot-00").update(updated_at=timezone.now() - timedelta(minutes=10))
    agent("fresh-win", os="windows", cpu_pct=50.0)
    fleet = sc(c, "get_dex_perf_fleet")
    assert fleet["reporting"] == 30 and fleet["cpu_pct"]["max"] == 94.0
