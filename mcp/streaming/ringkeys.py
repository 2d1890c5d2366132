"""Where a session's replay ring (mcp.streaming.ring) lives, apart from the ring itself: the Redis session store
(sessions.py) slides the ring's expiry with the session's in its one validation script, and needs only this."""

import hashlib
from functools import lru_cache

RING_TTL = 1800 + 300  # outlives the session's idle expiry; slid on every append, and by the session's checks …
RING_SLIDE = 60  # … at most once a minute (so a ring lives at least RING_TTL - RING_SLIDE past its session's last use)
REDIS_PREFIX = "yuzu:mcp:ring:"
#: a ring's Redis keys are its base (REDIS_PREFIX + ring_key) and each of these; the counter first (the one every
#: ring has: the first append's INCR made it). The last holds its streamed calls' follow records
#: (mcp.streaming.handover), which must outlive their followers as long as the frames they go with: they expire,
#: slide and drop with the ring.
PARTS = (":seq", ":frames", ":ids", ":bytes", ":pins", ":oldest", ":follows")


def ring_key(principal_key: str, session_id: str | None) -> str:
    return hashlib.sha256(f"{principal_key}\x00{session_id}".encode()).hexdigest()[:32]


def redis_keys(key: str) -> list[str]:
    p = REDIS_PREFIX + key
    return [p + part for part in PARTS]


def follows_key(key: str) -> str:
    """The Redis hash of the ring ``key``'s follow records (stream tag → record)."""
    return REDIS_PREFIX + key + PARTS[-1]


@lru_cache(maxsize=4096)
def redis_base(principal_key: str, session_id: str) -> str:
    """The Redis base name of this session's ring (kept: the session check names it on every request)."""
    return REDIS_PREFIX + ring_key(principal_key, session_id)
