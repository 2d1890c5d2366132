"""Client registrations per hour, per client address and in all (fixed windows in Django's cache, so per server
process: yuzu serves from one daphne)."""

import time

from django.conf import settings
from django.core.cache import cache

WINDOW = 3600


def admit(address):
    """Count one registration attempt; False once either hourly limit is spent."""
    window = int(time.time() // WINDOW)
    for key, limit in ((f"yuzu:oauth:register:{address}:{window}", settings.YUZU_OAUTH_REGISTRATIONS_PER_HOUR),
                       (f"yuzu:oauth:register:*:{window}", settings.YUZU_OAUTH_REGISTRATIONS_PER_HOUR_TOTAL)):
        cache.add(key, 0, WINDOW)
        if cache.incr(key) > limit:
            return False
    return True


def retry_after():
    return WINDOW - int(time.time()) % WINDOW
