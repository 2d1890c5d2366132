"""How many server processes `manage.py serve` runs: one per core with Redis, one in embedded mode."""

import os

import pytest
from django.core.management.base import CommandError

from yuzu.management.commands.serve import server_processes


def test_process_count(settings):
    settings.REDIS_URL, settings.YUZU_SERVE_PROCESSES = "", 0
    assert server_processes(None) == 1  # embedded: sessions and streams live in one process
    with pytest.raises(CommandError, match="need Redis"):
        server_processes(2)
    settings.REDIS_URL = "redis://127.0.0.1:6379/9"
    assert server_processes(None) == (os.cpu_count() or 1)
    settings.YUZU_SERVE_PROCESSES = 3
    assert server_processes(None) == 3 and server_processes(2) == 2
