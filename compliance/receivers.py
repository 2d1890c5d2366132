"""Receivers of the agent protocol's signals (fleet.signals): startup-triggered checks and Guardian reports."""

import logging

from django.dispatch import receiver

from fleet.signals import agent_connected, agent_report
from yuzu.metrics import GUARDIAN_EVENTS, GUARDIAN_EVENTS_DROPPED, GUARDIAN_EVENTS_WRITTEN

from . import engine, services

log = logging.getLogger("yuzu.compliance")
EVENT_FIELDS = {"rule_id": 36, "event_type": 64, "guard_type": 64, "guard_category": 32, "detected_value": 4096,
                "expected_value": 4096, "remediation_action": 64}


@receiver(agent_connected)
def check_on_connect(sender, agent_id, **kwargs):
    engine.on_agent_connected(agent_id)


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
    latency = frame.get("detection_latency_us")
    if not isinstance(detail, dict) or len(str(detail)) > 16384:
        return None
    if latency is not None and (not isinstance(latency, int) or isinstance(latency, bool) or not 0 <= latency < 2**62):
        return None
    return {**out, "detail": detail, "detection_latency_us": latency}


@receiver(agent_report)
def guardian_report(sender, agent_id, frame, **kwargs):
    if frame.get("kind") != "guardian":
        return
    GUARDIAN_EVENTS.inc()
    fields = guardian_frame(frame)
    if fields is None or services.record_event(agent_id, fields) is None:
        GUARDIAN_EVENTS_DROPPED.inc()
        log.info("dropped a guardian report from %s: malformed or naming an unknown rule", agent_id)
        return
    GUARDIAN_EVENTS_WRITTEN.inc()
