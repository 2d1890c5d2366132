"""The bridge's knobs, all from the environment (read when used, so a test may set them per process).

YUZU_BRIDGE_URL                  the /mcp/bridge/ URL workers are given (settings.YUZU_BRIDGE_URL)
YUZU_BRIDGE_TMUX_SOCKET          the private tmux socket name (default: derived from the data directory)
YUZU_BRIDGE_POLL_INTERVAL        StatusPoller/Injector interval in seconds (default 0.4)
YUZU_BRIDGE_PICKUP_GRACE_POLLS   polls to wait for a WORKING pickup before assuming a fast turn (default 4)
YUZU_BRIDGE_RECHECK_SECONDS      a waiter re-reads its turn row at least this often (default 1.0)
YUZU_BRIDGE_HOOK_TRUST_SECONDS   a hook-reported status is trusted for this long (default 60)
YUZU_BRIDGE_WORKER_TOKEN_HOURS   lifetime of a worker's token (default 24)
YUZU_BRIDGE_MAX_QUEUE            messages one worker may have queued or awaiting pickup (default 32)
YUZU_BRIDGE_MAX_INBOX            unacknowledged inbox items one primary may have (default 256)
YUZU_BRIDGE_TAIL_LINES           lines of terminal tail a turn_done outcome carries (default 40)
YUZU_BRIDGE_HISTORY_DAYS         a stopped worker (with its turns and messages) and an acknowledged inbox item are
                                 deleted this many days later (default 30; 0 keeps them)
YUZU_BRIDGE_PAUSE_FILE           while this file exists the poller pauses (and acknowledges with <file>.ack)
YUZU_BRIDGE_SAME_USER_WORKERS    1: real agents may run as the server's own OS user (a single-person workstation;
                                 see bridge/guard.py, the IsolationGuard). Default: refused.
"""

import hashlib
import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings


def _float(name, default):
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return float(default)


def _int(name, default):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return int(default)


def bridge_url():
    return getattr(settings, "YUZU_BRIDGE_URL", "") or os.environ.get("YUZU_BRIDGE_URL") or \
        f"http://{settings.YUZU_BIND}/mcp/bridge/"


def events_url(session_id):
    """The hook sink for one worker, derived from the bridge URL (same host)."""
    parts = urlsplit(bridge_url())
    return urlunsplit((parts.scheme, parts.netloc, f"/api/v1/bridge/members/{session_id}/events", "", ""))


def socket_name():
    """This installation's private tmux server (``tmux -L <name>``): $YUZU_BRIDGE_TMUX_SOCKET, else
    ``yuzu-bridge-`` + a digest of the data directory (settings.VAR_DIR, resolved). Two installations on
    one host have two data directories, so they never share a tmux server; daphne and the poller of one
    installation share its data directory, so they agree."""
    explicit = os.environ.get("YUZU_BRIDGE_TMUX_SOCKET", "").strip()
    if explicit:
        return explicit
    digest = hashlib.sha256(str(Path(settings.VAR_DIR).resolve()).encode()).hexdigest()[:12]
    return f"yuzu-bridge-{digest}"


def poll_interval():
    return max(0.05, _float("YUZU_BRIDGE_POLL_INTERVAL", 0.4))


def pickup_grace_polls():
    return max(1, _int("YUZU_BRIDGE_PICKUP_GRACE_POLLS", 4))


def recheck_seconds():
    return max(0.05, _float("YUZU_BRIDGE_RECHECK_SECONDS", 1.0))


def hook_trust_seconds():
    return max(0.0, _float("YUZU_BRIDGE_HOOK_TRUST_SECONDS", 60))


def worker_token_hours():
    return max(1, _int("YUZU_BRIDGE_WORKER_TOKEN_HOURS", 24))


def max_workers():
    return max(1, _int("YUZU_BRIDGE_MAX_WORKERS", 8))


def max_queue():
    return max(1, _int("YUZU_BRIDGE_MAX_QUEUE", 32))


def max_inbox():
    return max(1, _int("YUZU_BRIDGE_MAX_INBOX", 256))


def history_days():
    return max(0, _int("YUZU_BRIDGE_HISTORY_DAYS", 30))


def tail_lines():
    return max(1, _int("YUZU_BRIDGE_TAIL_LINES", 40))


def repo_root():
    return str(Path(settings.BASE_DIR))


def same_user_workers():
    return os.environ.get("YUZU_BRIDGE_SAME_USER_WORKERS", "").strip().lower() in ("1", "true", "yes", "on")


def pause_file():
    raw = os.environ.get("YUZU_BRIDGE_PAUSE_FILE", "").strip()
    return Path(raw) if raw else None
