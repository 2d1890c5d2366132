"""Embedded mode's stand-in for Celery beat: runs the periodic tasks in-process on their schedule."""

import logging
import time

from celery import current_app
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

import yuzu.celery  # noqa: F401  (loads the Celery app, so current_app is yuzu's)


class Command(BaseCommand):
    help = "Run CELERY_BEAT_SCHEDULE's tasks in this process (embedded mode, no broker)."

    def handle(self, *args: str, **opts: object) -> None:
        # autodiscover_tasks() is lazy: only a worker imports the apps' tasks modules. Import them here,
        # else every scheduled task is unknown to this process and nothing ever runs.
        current_app.loader.import_default_modules()
        schedule = settings.CELERY_BEAT_SCHEDULE
        unknown = [entry["task"] for entry in schedule.values() if entry["task"] not in current_app.tasks]
        if unknown:
            raise CommandError(f"scheduled tasks not found: {', '.join(unknown)}")
        logging.getLogger("celery.app.trace").setLevel(logging.WARNING)  # not a line per tick; failures still show
        due = dict.fromkeys(schedule, 0.0)
        while True:
            now = time.monotonic()
            for name, entry in schedule.items():
                if now >= due[name]:
                    due[name] = now + float(entry["schedule"])
                    task = current_app.tasks[entry["task"]]
                    try:
                        task.apply()
                    except Exception as exc:  # keep the loop alive; the next tick retries
                        self.stderr.write(f"{name}: {exc}")
            time.sleep(0.5)
