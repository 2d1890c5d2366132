"""Receivers of the agent protocol's signals (fleet.signals): startup-triggered checks and Guardian reports."""

import asyncio
import logging
import time
from collections import defaultdict, deque

from channels.db import database_sync_to_async
from django.conf import settings
from django.dispatch import receiver

from fleet.signals import agent_connected, agent_report
from yuzu.metrics import GUARDIAN_EVENTS, GUARDIAN_EVENTS_DROPPED, GUARDIAN_EVENTS_WRITTEN

from . import engine, services

log = logging.getLogger("yuzu.compliance")
EVENT_FIELDS = {"rule_id": 36, "event_type": 64, "guard_type": 64, "guard_category": 32, "detected_value": 4096,
                "expected_value": 4096, "remediation_action": 64}


@receiver(agent_connected)
def check_on_connect(sender, agent_id, **kwargs):
    """startup-triggered checks, and the agent's Guardian rule set (it keeps guarding across reconnects)."""
    engine.on_agent_connected(agent_id)
    services.push_rules_to(agent_id)


_evaluator = None


@receiver(agent_connected)
async def evaluate_in_the_server(sender, **kwargs):
    """Embedded mode (no Redis): the evaluator ticks on the server's own event loop, started with the first
    agent connection — the in-memory channel layer reaches agents only from inside this process, so a check
    dispatched by `manage.py run_periodic` could never arrive. With Redis, Celery beat runs it instead."""
    global _evaluator
    if settings.REDIS_URL or (_evaluator is not None and not _evaluator.done()):
        return
    _evaluator = asyncio.create_task(_tick_forever(float(getattr(settings, "YUZU_COMPLIANCE_TICK_S", 10))))


async def _tick_forever(every):
    while True:
        await asyncio.sleep(every)
        try:
            await database_sync_to_async(engine.tick)()
        except Exception:
            log.exception("compliance evaluator tick failed")


def guardian_frame(frame):
    """The event fields of a guardian report, or None when it is malformed."""
    if frame.get("kind") != "guardian" or frame.get("event_type") not in services.EVENT_TYPES:
        return None
    out = {}
    for key, limit in EVENT_FIELDS.items():
        value = frame.get(key, "")
        if not isinstance(value, str) or len(value) > limit:
            return None
        out[key] = value
    detail = frame.get("detail", {})
    if not isinstance(detail, dict) or len(str(detail)) > 16384:
        return None
    for key in ("detection_latency_us", "remediation_latency_us"):
        value = frame.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**62):
            return None
        out[key] = value
    return {**out, "detail": detail}


#: at most this many Guardian reports per agent per minute are stored by one server process (a guard flapping, or
#: a compromised agent, cannot fill the database); the rest are dropped and counted
REPORTS_PER_MINUTE = 120
_recent: defaultdict[str, deque[float]] = defaultdict(deque)


def within_budget(agent_id, now=None):
    now = time.monotonic() if now is None else now
    seen = _recent[agent_id]
    while seen and now - seen[0] > 60:
        seen.popleft()
    if len(seen) >= REPORTS_PER_MINUTE:
        return False
    seen.append(now)
    return True


@receiver(agent_report)
def guardian_report(sender, agent_id, frame, **kwargs):
    if frame.get("kind") != "guardian":
        return
    GUARDIAN_EVENTS.inc()
    fields = guardian_frame(frame)
    if fields is None or not within_budget(agent_id) or services.record_event(agent_id, fields) is None:
        GUARDIAN_EVENTS_DROPPED.inc()
        log.info("dropped a guardian report from %s: malformed, over budget, or naming a rule it was not sent",
                 agent_id)
        return
    GUARDIAN_EVENTS_WRITTEN.inc()
