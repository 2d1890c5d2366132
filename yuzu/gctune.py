"""Python's cyclic garbage collector, tuned for a daphne process that holds thousands of streams.

A held stream is ~175 GC-tracked objects (its tasks, coroutines, futures, Twisted protocol, consumer): 1.07
million at 5,000 streams. A full (generation-2) collection traverses every one of them with the event loop
stopped — 0.9-1.2 s on this project's 2-core bench machine — and under Python's default thresholds
(700, 10, 10) the streams' per-tick objects (each tick's sleep, timer and message lives ~3 s, past several
young collections) were promoted fast enough to trigger one every 5-10 s: every heartbeat due in that second
was late by up to a second (bench/streams/README.md, 2026-12-02).

So: the start-up heap (Django, the apps, the URL and model registries; ~200,000 objects that live as long as
the process) is frozen out of every later collection, and a young collection waits for 10,000 net new objects
instead of 700, so what lives a tick or two dies young instead of being promoted: held streams that only tick
no longer trigger full collections. Cyclic garbage still goes, a little later. What remains: Python still runs
a full collection whenever the long-lived heap has grown by a quarter since the last one (opening thousands of
streams, heavy stream churn), and that one still takes ~1 s at 5,000 streams."""

import gc

THRESHOLDS = (10_000, 10, 10)


def tune() -> None:
    """Call once, after start-up (the end of yuzu.asgi): what exists now is never traversed again."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
