"""Which implementation a process-wide store uses: Redis when YUZU_REDIS_URL is set (``settings.REDIS_URL``),
so that every server process sees the same sessions and rings; process memory otherwise (embedded mode)."""

import threading
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings

T = TypeVar("T")


def configured(memory: Callable[[], T], redis: Callable[[str], T]) -> Callable[[], T]:
    """A process-wide accessor for the configured backend, built on first use."""
    lock = threading.Lock()
    holder: list[T] = []

    def get() -> T:
        if not holder:
            with lock:
                if not holder:
                    holder.append(redis(settings.REDIS_URL) if settings.REDIS_URL else memory())
        return holder[0]

    return get
