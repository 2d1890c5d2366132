"""Validation of what agents send (docs/agent-protocol.md, "DEX telemetry"): pure functions, no database.

Every field is checked on its own. A field that is the wrong type, not a full numeric token, non-finite,
negative or oversized is **dropped and counted** (``yuzu_dex_telemetry_dropped_total{field,reason}``) and the
rest of the frame is kept: a dropped value means "did not report" and is never stored as 0. Percentages above
100 are clamped to 100 (spec/dex.md §1a)."""

import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from yuzu import jsondata

from .models import DEGRADED_TAG, NET_FIELDS, PERF_FIELDS

MAX_TAG_CHARS = 32
MAX_FACT_KEYS = 32
MAX_OBSERVATIONS = 100  # per dex.observation frame
MAX_APP_ROWS = 500  # per dex.app_perf frame
NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
OBS_TYPE_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")  # PostgreSQL stores neither NUL nor an unpaired surrogate
PLATFORMS = ("linux", "windows", "macos")
#: tag → (column, clamp to 100, reject above)
FACTS = {
    PERF_FIELDS["cpu_pct"]: ("cpu_pct", True, None),
    PERF_FIELDS["commit_pct"]: ("commit_pct", True, None),
    PERF_FIELDS["disk_lat_ms"]: ("disk_lat_ms", False, 1e6),
    NET_FIELDS["rtt_ms"]: ("rtt_ms", False, 60000.0),
    NET_FIELDS["retrans_pct"]: ("retrans_pct", True, None),
    NET_FIELDS["throughput_bps"]: ("throughput_bps", False, 1e12),
}
OBS_TEXT = {"subject": 256, "reason": 1024, "symbolic": 256, "component": 256, "version": 128}
MAX_DETAIL_BYTES = 4096
APP_TEXT_MAX = 512


@dataclass
class Checked:
    """What survived validation, and what was dropped: [(field, reason)]."""

    value: object
    dropped: list = field(default_factory=list)


def parse_number(raw):
    """A heartbeat tag's value: a string of ≤32 characters that is one full decimal token, finite and ≥0.
    → (float, None) or (None, reason)."""
    if not isinstance(raw, str):
        return None, "type"
    if len(raw) > MAX_TAG_CHARS:
        return None, "oversized"
    if not NUMBER_RE.fullmatch(raw):
        return None, "parse"
    value = float(raw)
    if not math.isfinite(value):
        return None, "non_finite"
    if value < 0:
        return None, "negative"
    return value, None


def facts(tags):
    """The heartbeat's ``dex`` object → Checked({column: float|bool|None}). Unknown keys are ignored (a newer
    agent may send more); a missing key is None."""
    out = {column: None for column, _, _ in FACTS.values()}
    out["net_degraded"] = None
    dropped = []
    if not isinstance(tags, dict) or len(tags) > MAX_FACT_KEYS:
        return Checked(None, [("dex", "type" if not isinstance(tags, dict) else "oversized")])
    for tag, (column, clamp, reject_above) in FACTS.items():
        if tag not in tags:
            continue
        value, reason = parse_number(tags[tag])
        if value is not None and reject_above is not None and value > reject_above:
            value, reason = None, "oversized"
        if value is not None and clamp and value > 100:
            value = 100.0
        if reason:
            dropped.append((column, reason))
        out[column] = value
    if DEGRADED_TAG in tags:
        raw = tags[DEGRADED_TAG]
        flag = {"1": True, "true": True, "0": False, "false": False}.get(raw.lower()) if isinstance(raw, str) else None
        if flag is None:
            dropped.append(("net_degraded", "type" if not isinstance(raw, str) else "parse"))
        out["net_degraded"] = flag
    return Checked(out, dropped)


def _text(value, limit):
    """A bounded string without control characters, or None."""
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit or CONTROL_RE.search(value):
        return None
    return value


def _number(value):
    """A JSON number as a finite float, or None: not a bool, not text, not NaN/Infinity, and not an integer beyond a
    double's range (``10**400``: ``math.isfinite`` raises OverflowError on it, which once lost the whole frame)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _instant(value, now):
    """Epoch seconds (a finite number) within the last 31 days (and at most a day ahead) → an aware datetime."""
    value = _number(value)
    if value is None:
        return None
    if not (now - timedelta(days=31)).timestamp() <= value <= (now + timedelta(days=1)).timestamp():
        return None
    return datetime.fromtimestamp(value, UTC)


def observation(raw, now):
    """One observation → (fields, None) or (None, (field, reason))."""
    if not isinstance(raw, dict):
        return None, ("observation", "type")
    obs_type = raw.get("obs_type")
    if not isinstance(obs_type, str) or not OBS_TYPE_RE.fullmatch(obs_type):
        return None, ("obs_type", "parse")
    out = {"obs_type": obs_type}
    for key, limit in OBS_TEXT.items():
        text = _text(raw.get(key), limit)
        if text is None:
            return None, (key, "type")
        out[key] = text
    platform = raw.get("platform", "linux")
    if platform not in PLATFORMS:
        return None, ("platform", "parse")
    out["platform"] = platform
    observed = _instant(raw.get("observed_at"), now)
    if observed is None:
        return None, ("observed_at", "parse")
    out["observed_at"] = observed
    detail = raw.get("detail_json", "{}")
    if not isinstance(detail, str) or len(detail.encode(errors="surrogatepass")) > MAX_DETAIL_BYTES:
        return None, ("detail_json", "oversized" if isinstance(detail, str) else "type")
    try:
        parsed = json.loads(detail, parse_constant=_no_constant) if detail else {}
    except ValueError:
        return None, ("detail_json", "parse")
    except RecursionError:  # 4 KiB of brackets: the parser ran out of stack (it lost the whole frame)
        return None, ("detail_json", "oversized")
    if not jsondata.depth_ok(parsed):  # the bound of every JSON face
        return None, ("detail_json", "oversized")
    if not isinstance(parsed, dict) or UNSTORABLE_RE.search(json.dumps(parsed, ensure_ascii=False)):
        return None, ("detail_json", "type")
    out["detail"] = parsed
    return out, None


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def observations(items, now):
    """A dex.observation frame's list → Checked([fields…]); a bad item is dropped and counted."""
    if not isinstance(items, list) or len(items) > MAX_OBSERVATIONS:
        return Checked([], [("observations", "type" if not isinstance(items, list) else "oversized")])
    kept, dropped = [], []
    for item in items:
        fields, reason = observation(item, now)
        if fields is None:
            dropped.append(reason)
        else:
            kept.append(fields)
    return Checked(kept, dropped)


def canonical_version(version):
    """spec §5: trimmed, lower-cased."""
    return version.strip().lower()


def _count(value, high):
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        return None
    return value


def _measure(value, high, clamp=False):
    value = _number(value)
    if value is None or value < 0:
        return None
    if value > high:
        return float(high) if clamp else None
    return value


def app_day(raw):
    """One per-app daily row → (fields, None) or (None, (field, reason))."""
    if not isinstance(raw, dict):
        return None, ("row", "type")
    name = _text(raw.get("app_name"), APP_TEXT_MAX)
    if not name or not name.strip():
        return None, ("app_name", "type")
    version = _text(raw.get("version", ""), APP_TEXT_MAX)
    if version is None:
        return None, ("version", "type")
    out = {"app_name": name.strip(), "version": canonical_version(version)}
    samples = _count(raw.get("samples"), 10 * 86400)
    if not samples:
        return None, ("samples", "parse")
    instances = _count(raw.get("instances_max"), 1_000_000)
    if instances is None:
        return None, ("instances_max", "parse")
    out.update(samples=samples, instances_max=instances)
    for key, high, clamp in (("cpu_avg", 100, True), ("cpu_max", 100, True), ("ws_avg_bytes", 2**50, False),
                             ("ws_max_bytes", 2**50, False)):
        value = _measure(raw.get(key), high, clamp)
        if value is None:
            return None, (key, "parse")
        out[key] = value
    return out, None


def app_days(day, rows, now):
    """A dex.app_perf frame → Checked((date, [fields…])). The day is a UTC date, at most 31 days old and not in the
    future; a bad day drops the whole frame."""
    try:
        when = date.fromisoformat(day) if isinstance(day, str) and len(day) == 10 else None
    except ValueError:
        when = None
    today = now.astimezone(UTC).date()
    if when is None or not today - timedelta(days=31) <= when <= today:
        return Checked(None, [("day", "parse")])
    if not isinstance(rows, list) or len(rows) > MAX_APP_ROWS:
        return Checked(None, [("rows", "type" if not isinstance(rows, list) else "oversized")])
    kept, dropped, seen = [], [], set()
    for row in rows:
        fields, reason = app_day(row)
        if fields is None:
            dropped.append(reason)
        elif (fields["app_name"], fields["version"]) in seen:
            dropped.append(("row", "duplicate"))
        else:
            seen.add((fields["app_name"], fields["version"]))
            kept.append(fields)
    return Checked((when, kept), dropped)
