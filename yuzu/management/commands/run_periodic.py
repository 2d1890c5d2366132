"""Embedded mode's stand-in for Celery beat: runs the periodic tasks in-process on their schedule."""

import time

from celery import current_app
from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run CELERY_BEAT_SCHEDULE's tasks in this process (embedded mode, no broker)."

    def handle(self, *args, **opts):
        import yuzu.celery  # noqa: F401  (loads the app and autodiscovers tasks)

        schedule = settings.CELERY_BEAT_SCHEDULE
        due = {name: 0.0 for name in schedule}
        while True:
            now = time.monotonic()
            for name, entry in schedule.items():
                if now >= due[name]:
                    due[name] = now + float(entry["schedule"])
                    task = current_app.tasks.get(entry["task"])
                    if task is None:
                        continue
                    try:
                        task.apply()
                    except Exception as exc:  # keep the loop alive; the next tick retries
                        self.stderr.write(f"{name}: {exc}")
            time.sleep(0.5)
