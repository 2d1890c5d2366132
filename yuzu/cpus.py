"""Which CPUs a process runs on. `manage.py serve` pins each daphne, threads and all, to one CPU (docs/running.md):
one GIL, whose threads hand it to each other on one CPU without waking another. What a daphne starts that
outlives a call — the bridge's tmux server and the worker sessions in its panes — must not inherit that pin:
``unpinned`` gives it the CPUs serve itself had (YUZU_SERVE_CPUS, which serve sets for its children)."""

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

ENV = "YUZU_SERVE_CPUS"


def pinned_cpus(n: int, pin: bool = True) -> list[int]:
    """The CPU each of ``n`` daphnes runs on: the CPUs this process may use (its affinity: a container's cpuset,
    a ``taskset``), in turn. None (an empty list) when not pinning, on one CPU, or where the platform cannot pin."""
    if not pin or not hasattr(os, "sched_getaffinity"):
        return []
    allowed = sorted(os.sched_getaffinity(0))
    return [allowed[i % len(allowed)] for i in range(n)] if len(allowed) > 1 else []


@contextmanager
def affinity(cpus: set[int] | None) -> Iterator[None]:
    """Within: this thread runs on ``cpus``, and so does a process it starts, which inherits the mask at fork (and
    every thread that process starts after) — deterministic where setting a started child's mask would race its
    first threads. Only the calling thread's mask changes (Linux keeps one per thread). None: no change."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    whole = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:  # none of them in this process's cpuset (any more): leave the mask as it is
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, whole)


def unpinned() -> AbstractContextManager[None]:
    """``affinity`` of the CPUs serve ran on, for a process started from a pinned daphne; no change elsewhere."""
    cpus = {int(c) for c in os.environ.get(ENV, "").split(",") if c.strip().isdigit()}
    return affinity(cpus or None)
