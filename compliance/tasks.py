"""Celery tasks of the compliance engine. Both are idempotent: claims make a redelivered tick harmless."""

from celery import shared_task

from yuzu.metrics import GUARDIAN_EVENTS_REAPED

from . import engine, services


@shared_task(acks_late=True)
def evaluate_policies():
    """Beat, every YUZU_COMPLIANCE_TICK_S (10 s): collect finished runs, dispatch due policies."""
    collected, dispatched = engine.tick()
    if collected:
        services.cache.delete(services.FLEET_CACHE_KEY)
    return {"collected": collected, "dispatched": dispatched}


@shared_task(acks_late=True)
def reap_guardian_events():
    """Beat, hourly: Guardian events older than the retention (30 days) are deleted."""
    n = services.reap_events()
    GUARDIAN_EVENTS_REAPED.inc(n)
    return n
