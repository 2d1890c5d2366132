"""Calls started at the same instant on their own threads (each with its own database connection), for tests that
race write paths on the configured database (SQLite by default; PostgreSQL with YUZU_DATABASE_URL)."""

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections


def at_once(*calls: Callable[[], Any], timeout: float = 60) -> list[tuple[str, Any]]:
    """Run every call on its own thread, released together by a barrier; each one's outcome in order:
    ``("ok", what it returned)`` or ``("error", the exception it raised)``."""
    start = threading.Barrier(len(calls), timeout=timeout)
    outcomes: list[tuple[str, Any]] = [("error", TimeoutError("did not finish"))] * len(calls)

    def run(i: int) -> None:
        try:
            start.wait()
            outcomes[i] = ("ok", calls[i]())
        except Exception as exc:  # reported to the test, not lost in the thread
            outcomes[i] = ("error", exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return outcomes
