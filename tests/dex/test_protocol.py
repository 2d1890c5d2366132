"""DEX telemetry over the real agent consumer (docs/agent-protocol.md, "DEX telemetry"): heartbeat facts,
dex.observation and dex.app_perf frames are stored after validation; a bad value is dropped and counted, never
stored as 0, and never closes the connection; a frame of the wrong shape closes 4400."""

import json
import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.utils import timezone
from prometheus_client import REGISTRY

from dex import ingest
from dex.ingest import facts_buffer
from dex.models import AppDay, DeviceFacts, Observation
from tests.support.agent_ws import closed_with, enrolled_agent, mint_device_token, until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager_celery")]
db = database_sync_to_async


def dropped(field, reason):
    return REGISTRY.get_sample_value("yuzu_server_dex_telemetry_dropped_total", {"field": field, "reason": reason}) or 0


def test_facts_observations_and_app_rows_are_stored_after_validation():
    token = mint_device_token()
    before = dropped("commit_pct", "non_finite"), dropped("disk_lat_ms", "negative"), dropped("obs_type", "parse")

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        await comm.send_json_to({"type": "heartbeat", "dex": {
            "yuzu.perf_cpu_pct": "97.5", "yuzu.perf_commit_pct": "1e999", "yuzu.perf_disk_lat_ms": "-3",
            "yuzu.net_rtt_p50_ms": "12", "yuzu.net_retrans_pct": "250", "yuzu.net_throughput_bps": 5}})
        await until(lambda: bool(facts_buffer.pending))
        await facts_buffer.flush()
        now = time.time()
        await comm.send_json_to({"type": "dex.observation", "observations": [
            {"obs_type": "perf.cpu_sustained", "subject": "cpu", "observed_at": now, "detail_json": '{"metric": 97}'},
            {"obs_type": "bad type", "subject": "x", "observed_at": now}]})
        await comm.send_json_to({"type": "dex.app_perf", "day": timezone.now().date().isoformat(), "rows": [
            {"app_name": "burn", "version": "", "samples": 3, "instances_max": 1, "cpu_avg": 99.0, "cpu_max": 100.0,
             "ws_avg_bytes": 1e7, "ws_max_bytes": 2e7},
            {"app_name": "bad", "samples": 3, "instances_max": 1, "cpu_avg": "x", "cpu_max": 1, "ws_avg_bytes": 1,
             "ws_max_bytes": 1}]})
        await until(lambda: Observation.objects.exists() and AppDay.objects.exists())
        assert await comm.receive_nothing(timeout=0.2)  # still open: bad values are not a protocol error
        await comm.disconnect()
        return agent_id

    agent_id = async_to_sync(scenario)()
    facts = DeviceFacts.objects.get(agent_id=agent_id)
    assert (facts.cpu_pct, facts.commit_pct, facts.disk_lat_ms, facts.rtt_ms, facts.retrans_pct,
            facts.throughput_bps) == (97.5, None, None, 12.0, 100.0, None)
    obs = Observation.objects.get()
    assert (obs.obs_type, obs.agent_id, obs.detail) == ("perf.cpu_sustained", agent_id, {"metric": 97})
    assert list(AppDay.objects.values_list("app_name", flat=True)) == ["burn"]
    after = dropped("commit_pct", "non_finite"), dropped("disk_lat_ms", "negative"), dropped("obs_type", "parse")
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1]


def test_an_integer_beyond_a_double_drops_its_row_only():
    """``10**400`` is valid JSON; as a float it overflows. Its observation (or app row) is dropped and counted, the
    others of the frame are kept, and nothing is logged as a failure."""
    token = mint_device_token()
    before = dropped("observed_at", "parse"), dropped("ws_max_bytes", "parse")
    good_row = {"app_name": "kept", "version": "", "samples": 3, "instances_max": 1, "cpu_avg": 1.0, "cpu_max": 2.0,
                "ws_avg_bytes": 1e7, "ws_max_bytes": 2e7}

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        now = time.time()
        await comm.send_to(text_data=json.dumps({"type": "dex.observation", "observations": [
            {"obs_type": "perf.cpu_sustained", "subject": "huge", "observed_at": 10**400},
            {"obs_type": "perf.cpu_sustained", "subject": "kept", "observed_at": now}]}))
        await comm.send_to(text_data=json.dumps({"type": "dex.app_perf", "day": timezone.now().date().isoformat(),
                                                 "rows": [{**good_row, "app_name": "huge", "ws_max_bytes": 10**400},
                                                          good_row]}))
        await until(lambda: Observation.objects.exists() and AppDay.objects.exists())
        assert await comm.receive_nothing(timeout=0.2)
        await comm.disconnect()

    async_to_sync(scenario)()
    assert list(Observation.objects.values_list("subject", flat=True)) == ["kept"]
    assert list(AppDay.objects.values_list("app_name", flat=True)) == ["kept"]
    assert (dropped("observed_at", "parse"), dropped("ws_max_bytes", "parse")) == (before[0] + 1, before[1] + 1)


@pytest.mark.parametrize("frame", [
    {"type": "dex.observation", "observations": "x"},
    {"type": "dex.observation", "observations": [{}] * 101},
    {"type": "dex.app_perf", "day": "2026-12-01", "rows": {}},
    {"type": "dex.app_perf", "rows": []},
])
def test_a_telemetry_frame_of_the_wrong_shape_closes_4400(frame):
    token = mint_device_token()

    async def scenario():
        comm, _, _, _ = await enrolled_agent(token)
        await comm.send_json_to(frame)
        await closed_with(comm, 4400)

    async_to_sync(scenario)()
    assert not Observation.objects.exists() and not AppDay.objects.exists()


def test_telemetry_before_register_is_refused():
    async def scenario():
        from tests.support.agent_ws import connect
        comm = await connect()
        await comm.send_json_to({"type": "dex.observation", "observations": []})
        await closed_with(comm, 4400)

    async_to_sync(scenario)()


def test_an_agent_flooding_observations_and_app_rows_is_held_to_a_budget(settings):
    """Observations and app rows are inserted as they come, each frame up to 100 / 500 rows: a hostile agent
    sending frames as fast as its socket allows filled the database at the server's full write rate. Past a
    per-agent budget a minute they are dropped and counted; the connection stays open."""
    settings.YUZU_DEX_OBSERVATIONS_PER_MINUTE = 3
    settings.YUZU_DEX_APP_PERF_FRAMES_PER_MINUTE = 1
    token = mint_device_token()
    before = dropped("observations", "over_budget"), dropped("rows", "over_budget")

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        now = time.time()
        for n in range(2):
            await comm.send_json_to({"type": "dex.observation", "observations": [
                {"obs_type": "service.crashed", "subject": f"s{n}-{i}", "observed_at": now} for i in range(2)]})
        day = timezone.now().date().isoformat()
        for n in range(2):
            await comm.send_json_to({"type": "dex.app_perf", "day": day, "rows": [
                {"app_name": f"app{n}", "version": "", "samples": 1, "instances_max": 1, "cpu_avg": 1.0,
                 "cpu_max": 1.0, "ws_avg_bytes": 1, "ws_max_bytes": 1}]})
        await comm.send_json_to({"type": "heartbeat"})  # handled after the frames before it
        await until(lambda: Observation.objects.count() == 3 and AppDay.objects.exists())
        assert await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()

    async_to_sync(scenario)()
    assert Observation.objects.count() == 3
    assert list(AppDay.objects.values_list("app_name", flat=True)) == ["app0"]
    after = dropped("observations", "over_budget"), dropped("rows", "over_budget")
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1]


def test_an_agent_sending_slowly_forever_keeps_only_its_newest_rows(settings):
    """The budget bounds the rate, not the total: under it, a hostile agent still stored 300 observations and 3000
    app rows a minute for 30 days (13 million observations, and app rows under ever new names, per agent). Each
    agent now keeps at most YUZU_DEX_OBSERVATIONS_PER_AGENT observations and YUZU_DEX_APP_ROWS_PER_AGENT app rows:
    past the cap its oldest are deleted as its new ones are stored (counted in yuzu_server_dex_rows_reaped_total),
    so the newest — what DEX reads — stay, and no other agent's rows are touched."""
    from tests.dex.conftest import agent

    settings.YUZU_DEX_OBSERVATIONS_PER_AGENT = 5
    settings.YUZU_DEX_APP_ROWS_PER_AGENT = 4
    hostile, quiet = agent("hostile"), agent("quiet")
    reaped = [REGISTRY.get_sample_value("yuzu_server_dex_rows_reaped_total", {"table": t}) or 0
              for t in ("observations", "app_days")]
    t0 = timezone.now()
    ingest.store_observations("quiet", [{"obs_type": "service.crashed", "subject": "q", "observed_at": time.time()}],
                              now=t0)
    for n in range(4):
        stored = ingest.store_observations("hostile", [
            {"obs_type": "service.crashed", "subject": f"s{n}-{i}", "observed_at": time.time()} for i in range(3)],
            now=t0 + timedelta(seconds=n))
        assert stored == 3
        assert Observation.objects.filter(agent=hostile).count() == min(5, 3 * (n + 1))
    assert sorted(Observation.objects.filter(agent=hostile).values_list("subject", flat=True)) == [
        "s2-1", "s2-2", "s3-0", "s3-1", "s3-2"]
    assert Observation.objects.filter(agent=quiet).count() == 1

    today = timezone.now().date()
    for back in (3, 2, 1, 0):  # oldest day first, two apps a day
        day = (today - timedelta(days=back)).isoformat()
        ingest.store_app_days("hostile", day, [
            {"app_name": f"app{back}-{i}", "version": "", "samples": 1, "instances_max": 1, "cpu_avg": 1.0,
             "cpu_max": 1.0, "ws_avg_bytes": 1, "ws_max_bytes": 1} for i in range(2)])
    assert sorted(AppDay.objects.filter(agent=hostile).values_list("app_name", flat=True)) == [
        "app0-0", "app0-1", "app1-0", "app1-1"]
    after = [REGISTRY.get_sample_value("yuzu_server_dex_rows_reaped_total", {"table": t}) or 0
             for t in ("observations", "app_days")]
    assert [b - a for a, b in zip(reaped, after, strict=True)] == [7, 4]
