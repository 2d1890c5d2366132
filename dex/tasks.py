"""Celery beat tasks of DEX (docs/dex.md): the fleet app rollup (B2) and retention. Both are idempotent."""

from celery import shared_task
from django.conf import settings

from yuzu.metrics import DEX_ROWS_REAPED

from . import services


@shared_task(acks_late=True)
def rollup_app_perf():
    """Beat, every 15 min: recompute the fleet rollup of today and yesterday from the per-device rows."""
    return services.rollup_days(2)


@shared_task(acks_late=True)
def reap():
    """Beat, hourly: observations past YUZU_DEX_SIGNAL_RETENTION_DAYS (30), per-device app rows past 31 days, fleet
    app rows past 180 days."""
    counts = services.reap(int(getattr(settings, "YUZU_DEX_SIGNAL_RETENTION_DAYS", 30)))
    for table, n in counts.items():
        DEX_ROWS_REAPED.labels(table).inc(n)
    return counts
