"""DEX storage (docs/dex.md, spec/dex.md): the latest perf and network facts per agent (now-views), windowed
signal observations, and per-app daily performance rows per device (B1, ≤31 days) and fleet (B2, ≤180 days).

A value the agent did not report — or one the server rejected — is stored as NULL, never as 0: "did not report"
is not a measurement."""

from datetime import timedelta

from django.db import models
from django.db.models import Q
from django.utils import timezone

from fleet.models import Agent

#: the heartbeat facts, as model fields (column name → the agent's tag)
PERF_FIELDS = {"cpu_pct": "yuzu.perf_cpu_pct", "commit_pct": "yuzu.perf_commit_pct",
               "disk_lat_ms": "yuzu.perf_disk_lat_ms"}
NET_FIELDS = {"rtt_ms": "yuzu.net_rtt_p50_ms", "retrans_pct": "yuzu.net_retrans_pct",
              "throughput_bps": "yuzu.net_throughput_bps"}
DEGRADED_TAG = "yuzu.net_degraded"


class DeviceFacts(models.Model):
    """The latest heartbeat facts of one agent (one row per agent, replaced on every heartbeat that carries any)."""

    agent = models.OneToOneField(Agent, primary_key=True, on_delete=models.CASCADE, related_name="dex_facts")
    cpu_pct = models.FloatField(null=True, blank=True)
    commit_pct = models.FloatField(null=True, blank=True)
    disk_lat_ms = models.FloatField(null=True, blank=True)
    rtt_ms = models.FloatField(null=True, blank=True)
    retrans_pct = models.FloatField(null=True, blank=True)
    throughput_bps = models.FloatField(null=True, blank=True)
    net_degraded = models.BooleanField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        verbose_name = "DEX dashboard"  # its admin page is the dashboard of the fleet's now-views (dex.admin)
        verbose_name_plural = "DEX dashboard"

    def __str__(self):
        return f"{self.agent_id} cpu={self.cpu_pct} commit={self.commit_pct}"

    @property
    def has_perf(self):
        return any(getattr(self, f) is not None for f in PERF_FIELDS)

    @property
    def has_net(self):
        return any(getattr(self, f) is not None for f in NET_FIELDS) or self.net_degraded is not None

    @property
    def under_pressure(self):
        """spec §6: cpu ≥85 or commit ≥90 or disk ≥25 ms."""
        return bool((self.cpu_pct is not None and self.cpu_pct >= 85)
                    or (self.commit_pct is not None and self.commit_pct >= 90)
                    or (self.disk_lat_ms is not None and self.disk_lat_ms >= 25))


class PerAgentQuerySet(models.QuerySet):
    newest_by = ""  # the field a newer row has more of (ties: the later stored)

    def keep_newest(self, agent_id, keep):
        """Delete the agent's rows beyond its newest ``keep`` (by ``newest_by``, then id). → how many."""
        by = self.newest_by
        mine = self.filter(agent_id=agent_id)
        cut = list(mine.order_by(f"-{by}", "-id").values_list(by, "id")[keep:keep + 1])
        if not cut:
            return 0
        (at, pk), = cut
        return mine.filter(Q(**{f"{by}__lt": at}) | Q(**{by: at, "id__lte": pk})).delete()[0]


class ObservationQuerySet(PerAgentQuerySet):
    newest_by = "received_at"

    def since(self, window_days):
        return self if window_days is None else self.filter(received_at__gte=timezone.now() - timedelta(days=window_days))

    def reap(self, days):
        return self.filter(received_at__lt=timezone.now() - timedelta(days=days)).delete()[0]


class Observation(models.Model):
    """One signal observation an agent pushed (a dex.observation frame), stamped with the server's receipt time."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="dex_observations")
    obs_type = models.CharField(max_length=64)
    subject = models.CharField(max_length=256, blank=True)
    reason = models.CharField(max_length=1024, blank=True)
    symbolic = models.CharField(max_length=256, blank=True)
    component = models.CharField(max_length=256, blank=True)
    version = models.CharField(max_length=128, blank=True)
    platform = models.CharField(max_length=16, blank=True)
    observed_at = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now, db_index=True)
    detail = models.JSONField(default=dict, blank=True)

    objects = ObservationQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["obs_type", "received_at"]), models.Index(fields=["agent", "received_at"])]
        ordering = ["-received_at"]

    def __str__(self):
        return f"{self.obs_type} {self.subject} on {self.agent_id}"


class AppDayQuerySet(PerAgentQuerySet):
    newest_by = "day"

    def reap(self, days):
        return self.filter(day__lt=timezone.now().date() - timedelta(days=days)).delete()[0]


class AppDay(models.Model):
    """B1: one device's performance of one app (name, version) on one UTC day."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="dex_app_days")
    app_name = models.CharField(max_length=512)
    version = models.CharField(max_length=512, blank=True)
    day = models.DateField()
    samples = models.PositiveIntegerField()
    instances_max = models.PositiveIntegerField()
    cpu_avg = models.FloatField()
    cpu_max = models.FloatField()
    ws_avg_bytes = models.FloatField()
    ws_max_bytes = models.FloatField()
    updated_at = models.DateTimeField(default=timezone.now)

    objects = AppDayQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "app_name", "version", "day"], name="dex_appday_unique")]
        indexes = [models.Index(fields=["app_name", "version", "day"])]

    def __str__(self):
        return f"{self.app_name} {self.version} {self.day} on {self.agent_id}"


class AppFleetDay(models.Model):
    """B2: the fleet rollup of one (app, version, day): exact mean/max, bucket histograms for p50/p95."""

    app_name = models.CharField(max_length=512)
    version = models.CharField(max_length=512, blank=True)
    day = models.DateField()
    device_count = models.PositiveIntegerField()
    cpu_mean = models.FloatField(null=True)
    cpu_max = models.FloatField(null=True)
    ws_mean = models.FloatField(null=True)
    ws_max = models.FloatField(null=True)
    cpu_hist = models.JSONField(default=list)
    ws_hist = models.JSONField(default=list)
    scheme = models.PositiveSmallIntegerField(default=1, help_text="bucket scheme the histograms use")

    objects = AppDayQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["app_name", "version", "day"], name="dex_appfleetday_unique")]

    def __str__(self):
        return f"{self.app_name} {self.version} {self.day}"
