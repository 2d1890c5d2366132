"""Validation of DEX telemetry (docs/agent-protocol.md, "DEX telemetry"): every field, every way it can be wrong —
non-finite, negative, oversized, wrong type, not a full token — is dropped and counted, never stored as 0."""

import json
from datetime import UTC, datetime, timedelta

import pytest

from dex import telemetry

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NUMERIC_TAGS = [("yuzu.perf_cpu_pct", "cpu_pct"), ("yuzu.perf_commit_pct", "commit_pct"),
                ("yuzu.perf_disk_lat_ms", "disk_lat_ms"), ("yuzu.net_rtt_p50_ms", "rtt_ms"),
                ("yuzu.net_retrans_pct", "retrans_pct"), ("yuzu.net_throughput_bps", "throughput_bps")]
BAD_VALUES = [("nan", "parse"), ("NaN", "parse"), ("inf", "parse"), ("-inf", "parse"), ("1e999", "non_finite"),
              ("-1", "negative"), ("-0.5", "negative"), ("1" * 33, "oversized"), ("12abc", "parse"), ("", "parse"),
              (" 12", "parse"), ("1_0", "parse"), ("0x10", "parse"), (12.5, "type"), (12, "type"), (True, "type"),
              (None, "type"), ([], "type"), ({}, "type")]


@pytest.mark.parametrize("tag,column", NUMERIC_TAGS)
@pytest.mark.parametrize("raw,reason", BAD_VALUES)
def test_a_bad_numeric_value_is_dropped_and_counted_never_zero(tag, column, raw, reason):
    checked = telemetry.facts({tag: raw, "yuzu.perf_cpu_pct" if tag != "yuzu.perf_cpu_pct" else
                               "yuzu.perf_commit_pct": "7"})
    assert checked.value[column] is None  # did not report: not 0
    assert checked.dropped == [(column, reason)]


@pytest.mark.parametrize("tag,column", NUMERIC_TAGS)
def test_a_good_value_is_kept_and_an_absent_one_is_none(tag, column):
    checked = telemetry.facts({tag: "12.5"})
    assert checked.value[column] == 12.5 and checked.dropped == []
    others = [c for _, c in NUMERIC_TAGS if c != column]
    assert all(checked.value[c] is None for c in others)
    assert telemetry.facts({tag: "0"}).value[column] == 0.0  # a real zero is a measurement


@pytest.mark.parametrize("tag,column", [("yuzu.perf_cpu_pct", "cpu_pct"), ("yuzu.perf_commit_pct", "commit_pct"),
                                        ("yuzu.net_retrans_pct", "retrans_pct")])
def test_percentages_above_100_clamp(tag, column):
    assert telemetry.facts({tag: "140"}).value[column] == 100.0


@pytest.mark.parametrize("tag,column,limit", [("yuzu.perf_disk_lat_ms", "disk_lat_ms", 1e6),
                                              ("yuzu.net_rtt_p50_ms", "rtt_ms", 60000),
                                              ("yuzu.net_throughput_bps", "throughput_bps", 1e12)])
def test_oversized_values_are_rejected_not_clamped(tag, column, limit):
    assert telemetry.facts({tag: repr(float(limit))}).value[column] == float(limit)
    checked = telemetry.facts({tag: repr(float(limit) * 1.5)})
    assert checked.value[column] is None and checked.dropped == [(column, "oversized")]


@pytest.mark.parametrize("raw,expected", [("1", True), ("true", True), ("TRUE", True), ("0", False),
                                          ("false", False), ("yes", None), ("", None), (1, None), (None, None)])
def test_the_degraded_flag(raw, expected):
    checked = telemetry.facts({"yuzu.net_degraded": raw})
    assert checked.value["net_degraded"] is expected
    assert bool(checked.dropped) == (expected is None)


@pytest.mark.parametrize("tags", [[], "x", 5, {f"k{i}": "1" for i in range(40)}])
def test_a_facts_object_of_the_wrong_shape_drops_everything(tags):
    checked = telemetry.facts(tags)
    assert checked.value is None and len(checked.dropped) == 1


def obs(**kw):
    base = {"obs_type": "perf.cpu_sustained", "subject": "cpu", "reason": "busy", "observed_at": NOW.timestamp(),
            "detail_json": json.dumps({"metric": 97.5})}
    return {**base, **kw}


def test_a_good_observation():
    checked = telemetry.observations([obs()], NOW)
    assert checked.dropped == [] and checked.value[0]["detail"] == {"metric": 97.5}
    assert checked.value[0]["platform"] == "linux" and checked.value[0]["observed_at"] == NOW


@pytest.mark.parametrize("field,value,reason", [
    ("obs_type", "", "parse"), ("obs_type", "has space", "parse"), ("obs_type", "x" * 65, "parse"),
    ("obs_type", 5, "parse"), ("subject", "x" * 257, "type"), ("subject", 5, "type"), ("subject", "a\x00b", "type"),
    ("reason", "x" * 1025, "type"), ("platform", "solaris", "parse"), ("observed_at", "yesterday", "parse"),
    ("observed_at", float("nan"), "parse"), ("observed_at", float("inf"), "parse"), ("observed_at", True, "parse"),
    ("observed_at", 10**400, "parse"), ("observed_at", -10**400, "parse"),
    ("observed_at", (NOW - timedelta(days=40)).timestamp(), "parse"),
    ("observed_at", (NOW + timedelta(days=3)).timestamp(), "parse"), ("detail_json", "x" * 5000, "oversized"),
    ("detail_json", "{not json", "parse"), ("detail_json", "[1]", "type"), ("detail_json", '{"a": NaN}', "parse"),
    ("detail_json", {"a": 1}, "type"), ("detail_json", '{"a": "\\ud800"}', "type"),
    # nested past the bound of every JSON face (32), and so deep the parser runs out of stack (it lost the frame)
    pytest.param("detail_json", '{"a": ' + "[" * 32 + "]" * 32 + "}", "oversized", id="detail_json-33-deep"),
    pytest.param("detail_json", '{"a": ' + "[" * 2000 + "]" * 2000 + "}", "oversized", id="detail_json-2001-deep"),
])
def test_a_bad_observation_is_dropped_and_counted_and_the_rest_kept(field, value, reason):
    checked = telemetry.observations([obs(**{field: value}), obs(subject="kept")], NOW)
    assert [o["subject"] for o in checked.value] == ["kept"]
    assert checked.dropped == [(field, reason)]


def test_an_observation_list_of_the_wrong_shape():
    assert telemetry.observations("x", NOW).dropped == [("observations", "type")]
    assert telemetry.observations([obs()] * 101, NOW).dropped == [("observations", "oversized")]
    assert telemetry.observations([5], NOW).dropped == [("observation", "type")]


def row(**kw):
    base = {"app_name": "java", "version": " 17.0.1 ", "samples": 10, "instances_max": 2, "cpu_avg": 12.5,
            "cpu_max": 40.0, "ws_avg_bytes": 1e8, "ws_max_bytes": 2e8}
    return {**base, **kw}


def test_a_good_app_row_canonicalises_its_version():
    checked = telemetry.app_days(NOW.date().isoformat(), [row()], NOW)
    day, rows = checked.value
    assert day == NOW.date() and rows[0]["version"] == "17.0.1" and checked.dropped == []


@pytest.mark.parametrize("field,value", [
    ("app_name", ""), ("app_name", "   "), ("app_name", 5), ("app_name", "x" * 513), ("app_name", "a\nb"),
    ("version", 5), ("version", "x" * 513), ("samples", 0), ("samples", -1), ("samples", 1.5), ("samples", True),
    ("samples", "10"), ("instances_max", -1), ("instances_max", None), ("cpu_avg", float("nan")),
    ("cpu_avg", float("inf")), ("cpu_avg", -1), ("cpu_avg", "12"), ("cpu_max", None), ("ws_avg_bytes", -5),
    ("ws_avg_bytes", 2.0 ** 60), ("ws_max_bytes", float("nan")), ("ws_max_bytes", False), ("ws_max_bytes", 10**400),
    ("cpu_avg", 10**400), ("cpu_max", -10**400),
])
def test_a_bad_app_row_is_dropped_and_counted(field, value):
    checked = telemetry.app_days(NOW.date().isoformat(), [row(**{field: value}), row(app_name="kept")], NOW)
    assert [r["app_name"] for r in checked.value[1]] == ["kept"]
    assert checked.dropped[0][0] == field


def test_cpu_above_100_clamps_in_app_rows_and_duplicates_drop():
    checked = telemetry.app_days(NOW.date().isoformat(), [row(cpu_max=250.0), row()], NOW)
    assert checked.value[1][0]["cpu_max"] == 100.0 and checked.dropped == [("row", "duplicate")]


@pytest.mark.parametrize("day", ["2026-13-01", "tomorrow", None, 5, (NOW + timedelta(days=1)).date().isoformat(),
                                 (NOW - timedelta(days=40)).date().isoformat()])
def test_a_bad_day_drops_the_frame(day):
    checked = telemetry.app_days(day, [row()], NOW)
    assert checked.value is None and checked.dropped == [("day", "parse")]
