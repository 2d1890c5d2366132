"""The DEX fleet gauges, computed at scrape time from the latest facts (docs/dex.md#metrics, docs/metrics.md).
A family is absent while nobody reports — never 0 — and /metrics keeps answering while the database is away."""

import logging

from django.db import DatabaseError
from prometheus_client.core import GaugeMetricFamily

from . import stats
from .models import DeviceFacts
from .services import fresh_since

log = logging.getLogger("yuzu.dex")
STATS = ("avg", "p50", "p90", "max")


class FleetCollector:
    def describe(self):
        return []  # no samples at registration: collect() runs only when /metrics is scraped

    def collect(self):
        try:
            rows = list(DeviceFacts.objects.filter(agent__connected=True, updated_at__gte=fresh_since()))
        except DatabaseError:
            return
        perf = [r for r in rows if r.has_perf]
        net = [r for r in rows if r.has_net]
        yield GaugeMetricFamily("yuzu_fleet_perf_reporting", "Connected agents reporting at least one perf value",
                                value=len(perf))
        yield GaugeMetricFamily("yuzu_fleet_net_reporting", "Connected agents reporting at least one network value",
                                value=len(net))
        yield GaugeMetricFamily("yuzu_fleet_net_retrans_reporting", "Connected agents reporting a retransmit rate",
                                value=sum(1 for r in net if r.retrans_pct is not None))
        for prefix, group, columns in (("yuzu_fleet_perf_", perf, ("cpu_pct", "commit_pct", "disk_lat_ms")),
                                       ("yuzu_fleet_net_", net, ("rtt_ms", "retrans_pct", "throughput_bps"))):
            for column in columns:
                s = stats.stat(getattr(r, column) for r in group)
                if s is None:
                    continue  # nobody reported it: absent, not 0
                family = GaugeMetricFamily(prefix + column, f"Fleet {column} now (nearest-rank stats)",
                                           labels=["stat"])
                for name in STATS:
                    family.add_metric([name], s[name])
                yield family
