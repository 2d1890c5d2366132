"""The Celery app. Embedded mode runs tasks in-process (CELERY_TASK_ALWAYS_EAGER); with
YUZU_REDIS_URL a separate `celery -A yuzu worker` consumes them from Redis."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yuzu.settings")
app = Celery("yuzu")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
