"""Governance background work (Celery beat, or run_periodic in embedded mode): every 60 s, end the overlap of
engine credential rotations (governance.engines.sweep_rotations)."""

from celery import shared_task

from . import engines


@shared_task(name="governance.tasks.sweep_engine_rotations", ignore_result=True)
def sweep_engine_rotations():
    return engines.sweep_rotations()
