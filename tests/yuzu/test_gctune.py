"""The daphne process's GC thresholds (yuzu/gctune.py): a steady churn of objects that each live a few ticks,
beside a large long-lived heap (a process holding thousands of streams), must not trigger full collections —
each one stops the event loop for as long as it takes to traverse the whole heap (~1 s at 5,000 streams)."""

import gc
from collections import deque

import yuzu.asgi  # noqa: F401  (the entry point applies the tuning on import)
from yuzu.gctune import THRESHOLDS

LIVE_TICKS = 3  # a stream's tick objects (sleep future, timer, message) outlive a few young collections
PER_TICK = 5_000  # one per stream


def full_collections(thresholds: tuple[int, int, int], ticks: int = 400) -> int:
    """Full collections during ``ticks`` ticks of churn under ``thresholds``, beside 200,000 long-lived objects."""
    # Lists, not dicts: the GC traverses and promotes only tracked objects, and a dict of ints is untracked.
    heap: list[list[int]] = [[] for _ in range(200_000)]  # the streams' own objects, alive throughout
    living: deque[list[list[int]]] = deque()
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()
    full = gc.get_stats()[2]["collections"]
    gc.set_threshold(*thresholds)
    gc.enable()  # automatic collection on, whatever the test process did with it: else "none" proves nothing
    try:
        for tick in range(ticks):
            living.append([[tick] for _ in range(PER_TICK)])
            if len(living) > LIVE_TICKS:
                living.popleft()
        return gc.get_stats()[2]["collections"] - full
    finally:
        gc.set_threshold(*before)
        if not enabled:
            gc.disable()
        del heap, living


def test_tick_churn_triggers_no_full_collection():
    assert full_collections(THRESHOLDS) == 0


def test_python_defaults_would():
    """The test above can fail: under Python's own thresholds the same churn triggers full collections."""
    assert full_collections((700, 10, 10)) > 0


def test_the_entry_point_applies_the_thresholds_and_freezes_the_start_up_heap():
    assert gc.get_threshold() == THRESHOLDS
    assert gc.get_freeze_count() > 0
