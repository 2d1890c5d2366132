"""Storing what agents send, after dex.telemetry validated it. Heartbeat facts are batched in the process (the
latest per agent wins) and written in one upsert per flush, so 5,000 agents at a 30 s heartbeat cost one INSERT
a second, not 170; observations and app rows are written as they come (they are rare), within a per-agent budget a
minute. The budget bounds the rate, not the total: each agent also keeps at most YUZU_DEX_OBSERVATIONS_PER_AGENT
observations and YUZU_DEX_APP_ROWS_PER_AGENT app rows, its oldest deleted in the transaction that stores its new
ones (a per-device quota, first in first out: the newest stay, which is what DEX reads, and an agent over its cap
evicts only its own rows)."""

import asyncio
import logging
import time
from collections import defaultdict, deque

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.models import Agent
from yuzu.metrics import DEX_ROWS_REAPED, DEX_TELEMETRY_DROPPED, DEX_TELEMETRY_FRAMES

from . import telemetry
from .models import AppDay, DeviceFacts, Observation

log = logging.getLogger("yuzu.dex")
FACT_COLUMNS = ("cpu_pct", "commit_pct", "disk_lat_ms", "rtt_ms", "retrans_pct", "throughput_bps", "net_degraded")
FLUSH_S = 1.0


def count_dropped(dropped):
    for field, reason in dropped:
        DEX_TELEMETRY_DROPPED.labels(field, reason).inc()


def store_facts(batch):
    """{agent_id: (facts, at)} → one upsert. Agents deleted meanwhile are skipped."""
    if not batch:
        return 0
    known = set(Agent.objects.filter(pk__in=list(batch)).values_list("pk", flat=True))
    rows = [DeviceFacts(agent_id=aid, updated_at=at, **values) for aid, (values, at) in batch.items() if aid in known]
    DeviceFacts.objects.bulk_create(rows, update_conflicts=True, unique_fields=["agent"],
                                    update_fields=[*FACT_COLUMNS, "updated_at"])
    return len(rows)


def accept_facts(tags):
    """Validate a heartbeat's dex object; → the columns, or None when nothing usable came."""
    DEX_TELEMETRY_FRAMES.labels("heartbeat").inc()
    checked = telemetry.facts(tags)
    count_dropped(checked.dropped)
    return checked.value


def store_observations(agent_id, items, now=None):
    """A dex.observation frame's list: validated, then written in one INSERT. → how many were stored."""
    now = now or timezone.now()
    DEX_TELEMETRY_FRAMES.labels("observation").inc()
    checked = telemetry.observations(items, now)
    count_dropped(checked.dropped)
    rows = [Observation(agent_id=agent_id, received_at=now, **fields) for fields in checked.value]
    if rows:
        with transaction.atomic():
            Observation.objects.bulk_create(rows)
            evicted = Observation.objects.keep_newest(agent_id, settings.YUZU_DEX_OBSERVATIONS_PER_AGENT)
        DEX_ROWS_REAPED.labels("observations").inc(evicted)
    return len(rows)


def store_app_days(agent_id, day, rows, now=None):
    """A dex.app_perf frame: the agent's summary of one UTC day so far replaces what it sent before for that day."""
    now = now or timezone.now()
    DEX_TELEMETRY_FRAMES.labels("app_perf").inc()
    checked = telemetry.app_days(day, rows, now)
    count_dropped(checked.dropped)
    if checked.value is None:
        return 0
    when, kept = checked.value
    objs = [AppDay(agent_id=agent_id, day=when, updated_at=now, **fields) for fields in kept]
    with transaction.atomic():
        AppDay.objects.bulk_create(objs, update_conflicts=True, unique_fields=["agent", "app_name", "version", "day"],
                                   update_fields=["samples", "instances_max", "cpu_avg", "cpu_max", "ws_avg_bytes",
                                                  "ws_max_bytes", "updated_at"])
        evicted = AppDay.objects.keep_newest(agent_id, settings.YUZU_DEX_APP_ROWS_PER_AGENT) if objs else 0
    DEX_ROWS_REAPED.labels("app_days").inc(evicted)
    return len(objs)


class Budget:
    """How much of something each agent may have stored in the last minute (the process's event loop calls it)."""

    def __init__(self, per_minute):
        self.per_minute = per_minute  # () → the budget, read at each take
        self.spent = defaultdict(deque)  # agent id → (monotonic time, how many)

    def take(self, agent_id, wanted, now=None):
        """Of ``wanted``, how many the agent may still have stored this minute (taken from its budget)."""
        now = time.monotonic() if now is None else now
        spent = self.spent[agent_id]
        while spent and now - spent[0][0] > 60:
            spent.popleft()
        granted = max(0, min(wanted, self.per_minute() - sum(n for _, n in spent)))
        if granted:
            spent.append((now, granted))
        elif not spent:
            del self.spent[agent_id]
        return granted


# Observations and app-row frames are inserted as they come, so a hostile agent sending them as fast as its socket
# allows filled the database: each agent may have so many stored a minute (settings.YUZU_DEX_*_PER_MINUTE: 300
# observations, three full frames; 6 app-perf frames, where an agent sends one an hour).
observation_budget = Budget(lambda: settings.YUZU_DEX_OBSERVATIONS_PER_MINUTE)
app_perf_budget = Budget(lambda: settings.YUZU_DEX_APP_PERF_FRAMES_PER_MINUTE)


class FactsBuffer:
    """The latest facts per agent, flushed FLUSH_S after the first one arrives (on the event loop that got it)."""

    def __init__(self):
        self.pending = {}
        self.task = None

    def put(self, agent_id, values):
        self.pending[agent_id] = (values, timezone.now())
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.task = loop.create_task(self._drain())

    async def _drain(self):
        while self.pending:
            await asyncio.sleep(FLUSH_S)
            batch, self.pending = self.pending, {}
            try:
                await database_sync_to_async(store_facts)(batch)
            except Exception:
                log.exception("storing the heartbeat facts of %d agents failed", len(batch))

    async def flush(self):
        """Write what is pending now (tests, shutdown)."""
        batch, self.pending = self.pending, {}
        await database_sync_to_async(store_facts)(batch)


facts_buffer = FactsBuffer()
