"""The agentic layer learns DEX (docs/dex.md, "The agentic layer"): get_fleet_posture_fast carries DEX health,
classify_operational_question and the playbooks name the right first DEX tool, the fleet gauges at /metrics."""

import pytest
from django.test import Client

from dex.models import DeviceFacts
from fleet import orientation
from fleet.models import ManagementGroup
from fleet.orientation import classify, playbook
from tests.dex.conftest import observe
from tests.support.mcp_http import McpClient

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("question,first", [
    ("Users say their laptops have been slow all morning, which ones are worst?", "get_dex_perf_fleet"),
    ("Is the fleet under memory pressure right now?", "get_dex_perf_fleet"),
    ("Teams call quality is choppy across the Berlin office, is it packet loss?", "get_network_fleet"),
    ("Why is network latency so high for the finance group?", "get_network_fleet"),
    ("Our Java gateway got slow and uses a lot of memory", "list_dex_perf_apps"),
    ("Did the node 20 upgrade make things slower?", "compare_app_perf_versions"),
    ("The database is slow, is it a disk latency bottleneck?", "list_dex_perf_devices"),
    ("Which machines had OOM kills or kernel panics this week?", "list_dex_signals"),
    ("Is cpu throttling happening anywhere?", "list_dex_signals"),
])
def test_the_classifier_names_the_first_dex_tool(question, first):
    out = classify(question)
    assert out["suggested_tools"][0] == first, out
    assert out["category"] == "answerable_now"


def test_a_question_naming_one_host_still_goes_to_the_live_probe():
    assert classify("Memory usage on app-04 spiked; what's using all the RAM?")["suggested_tools"][0] == \
        "execute_instruction"


@pytest.mark.parametrize("scenario,first", [
    ("slow devices", "get_dex_perf_fleet"), ("collaboration quality", "get_network_fleet"),
    ("app degradation", "list_dex_perf_apps"), ("database bottleneck", "list_dex_perf_devices"),
    ("the video call quality is choppy", "get_network_fleet"), ("the java gateway is slow", "list_dex_perf_apps"),
])
def test_the_playbooks(scenario, first):
    book = playbook(scenario)
    assert book["found"] and book["first_tool"] == first, book


def test_posture_carries_dex_health(world, mint):
    c = McpClient(mint("dex-viewer", role="Viewer", tier="readonly"))
    c.initialize()
    orientation._cache.clear()
    posture = c.call("get_fleet_posture_fast", {}).json()["result"]["structuredContent"]
    dex = posture["dex"]
    assert dex["status"] == "attention" and dex["perf_reporting"] == 30 and dex["devices_under_pressure"] == 3
    assert {"list_dex_perf_devices", "list_dex_signals"} <= set(posture["recommended_next_tools"])
    DeviceFacts.objects.all().delete()
    orientation._cache.clear()
    quiet = c.call("get_fleet_posture_fast", {}).json()["result"]["structuredContent"]["dex"]
    assert quiet["status"] == "no_data" and quiet["cpu_pct_p90"] is None  # nobody reports: not "healthy"
    observe(world["agents"][0], "storage.low", "/dev/sda1")
    orientation._cache.clear()
    signals = c.call("get_fleet_posture_fast", {}).json()["result"]["structuredContent"]["dex"]
    assert signals["status"] == "attention" and signals["top_signals_24h"] == [{"obs_type": "storage.low",
                                                                               "count": 1}]


def test_the_posture_carries_dex_health_only_to_who_may_read_dex(world, mint):
    """The DEX tools need a fleet-wide GuaranteedState:Read; the posture's dex section (p90s, devices under pressure,
    the top signals) went to every Infrastructure:Read holder — an Approver, a role held on one group — whom those
    tools refuse."""
    orientation._cache.clear()
    approver = McpClient(mint("dex-approver", role="Approver", tier="readonly"))
    approver.initialize()
    assert approver.call("list_dex_signals", {}).json()["error"]["code"] == -32003
    posture = approver.call("get_fleet_posture_fast", {}).json()["result"]["structuredContent"]
    assert posture["agents"]["total"] > 0 and "dex" not in posture, posture
    assert not {"list_dex_perf_devices", "list_dex_signals"} & set(posture["recommended_next_tools"])
    group = ManagementGroup.objects.create(name="dex-g")
    group.members.add(*world["agents"][:12])
    owner = McpClient(mint("dex-owner", role="ITServiceOwner", tier="readonly", group=group))
    owner.initialize()
    posture = owner.call("get_fleet_posture_fast", {}).json()["result"]["structuredContent"]
    assert posture["agents"]["total"] == 12 and "dex" not in posture, posture


def test_fleet_gauges_at_metrics(world):
    text = Client().get("/metrics").content.decode()
    assert "yuzu_fleet_perf_reporting 30.0" in text
    assert 'yuzu_fleet_perf_cpu_pct{stat="max"} 95.0' in text
    assert 'yuzu_fleet_net_rtt_ms{stat="p50"}' in text
    assert "yuzu_fleet_net_degraded" not in text  # not fed: absent, not 0
