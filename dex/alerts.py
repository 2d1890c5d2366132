"""Blast-radius incidents (spec/dex.md §7): at least YUZU_DEX_BLAST_DEVICES distinct devices report the same
(obs_type, subject) within YUZU_DEX_BLAST_WINDOW_S of server receipt time. One alert per pair per
YUZU_DEX_BLAST_COOLDOWN_S (the cooldown lives in the Django cache, so every process shares it): a warning in the
log, an audit row ``dex.blast_radius`` and the counters. The webhook of upstream is not wired here (docs/dex.md)."""

import logging
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count
from django.utils import timezone

from yuzu.audit import audit
from yuzu.metrics import DEX_ALERT_FIRED, DEX_BLAST_RADIUS_DEVICES

from .models import Observation

log = logging.getLogger("yuzu.dex")


def _setting(name, default):
    return int(getattr(settings, name, default))


def check_blast_radius(agent_id):
    """After an agent's observations were stored: the pairs it just reported that now reach the threshold."""
    window = _setting("YUZU_DEX_BLAST_WINDOW_S", 900)
    threshold = _setting("YUZU_DEX_BLAST_DEVICES", 5)
    since = timezone.now() - timedelta(seconds=window)
    pairs = set(Observation.objects.filter(agent_id=agent_id, received_at__gte=since)
                .values_list("obs_type", "subject")[:100])
    fired = []
    for obs_type, subject in pairs:
        devices = (Observation.objects.filter(obs_type=obs_type, subject=subject, received_at__gte=since)
                   .aggregate(n=Count("agent", distinct=True))["n"])
        if devices < threshold:
            continue
        key = f"dex:blast:{obs_type}:{subject}"[:240]
        if not cache.add(key, 1, _setting("YUZU_DEX_BLAST_COOLDOWN_S", 3600)):
            continue
        DEX_ALERT_FIRED.inc()
        DEX_BLAST_RADIUS_DEVICES.observe(devices)
        log.warning("DEX blast radius: %d devices report %s %r within %d s", devices, obs_type, subject, window)
        audit("system", "dex.blast_radius", "success", target_type="DexSignal", target_id=obs_type,
              detail=f"subject={subject[:200]} device_count={devices} window_seconds={window}")
        fired.append({"obs_type": obs_type, "subject": subject, "device_count": devices, "window_seconds": window})
    return fired
