"""The streaming metric families (docs/metrics.md lists them with their meaning and alert posture)."""

from django.conf import settings
from prometheus_client import Counter, Gauge

from yuzu.metrics import MCP_SESSIONS_ACTIVE

from .sessions import store

EVICTIONS = Counter("yuzu_mcp_stream_replay_ring_evictions_total", "frames evicted from replay rings")
TOO_LARGE = Counter("yuzu_mcp_stream_frames_too_large_total", "frames truncated to the per-frame cap")
DROPPED = Counter("yuzu_mcp_stream_frames_dropped_total", "frames that could not reach a connection")
STREAMS_ACTIVE = Gauge("yuzu_mcp_streams_active", "held-open GET streams in this process")
STREAMS_CAP = Gauge("yuzu_mcp_streams_cap", "the effective cap on held-open GET streams in this process")
STREAMS_CAP.set_function(lambda: settings.YUZU_MCP_MAX_STREAMS)
POST_STREAMS_ACTIVE = Gauge("yuzu_mcp_post_streams_active", "held-open streamed POST responses in this process")
REJECTS = Counter("yuzu_mcp_stream_rejects_total", "stream admissions refused", ["reason"])
CLOSES = Counter("yuzu_mcp_stream_closes_total", "streams closed, by reason", ["reason"])
PIN_DISPLACED = Counter("yuzu_mcp_progress_pin_displaced_for_admission_total",
                        "undelivered pinned finals released to admit a new streamed call")
RECORDS_ACTIVE = Gauge("yuzu_mcp_progress_records_active", "progress records (followers) alive in this process")
PROGRESS_SUPPRESSED = Counter("yuzu_mcp_progress_suppressed_total", "progress snapshots that did not advance")
ADOPTIONS = Counter("yuzu_mcp_progress_follows_adopted_total",
                    "streamed calls whose follow this process took over from a process that stopped renewing its lease")
CANCELS = Counter("yuzu_mcp_cancel_notifications_total", "notifications/cancelled by outcome", ["outcome"])


def _sessions_active() -> float:
    """yuzu_mcp_sessions_active, read from the session store at scrape time (the Redis store counts every
    process's sessions). A store that cannot answer reads as NaN rather than failing the scrape."""
    try:
        return store().active()
    except Exception:
        return float("nan")


MCP_SESSIONS_ACTIVE.set_function(_sessions_active)
