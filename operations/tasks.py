"""Celery: the schedule tick (CELERY_BEAT_SCHEDULE 'run-schedules', every YUZU_SCHEDULE_TICK_S)."""

from celery import shared_task

from . import schedules


@shared_task(name="operations.tasks.run_schedules", ignore_result=True)
def run_schedules():
    return schedules.tick()
