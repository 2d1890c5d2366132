"""The shared statistics rules of spec/dex.md §2, as pure functions: nearest-rank percentiles, the stat object
(null when nobody reported, never zeros), percentile ranks, and the bucket histograms of the fleet app rollup."""

import bisect
import math
from statistics import median

#: CPU share-of-capacity % bucket edges (the last bucket, 100+, is open); working set in MiB (4096+ open)
CPU_EDGES = (0, 1, 2, 5, 10, 20, 30, 50, 75, 100)
WS_EDGES_MIB = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
HIST_SCHEME = 1  # bump when the edges change: older rows then answer hist_stale
MIB = 1024 * 1024
FLAT_PCT = 5.0  # compare_app_perf_versions: a machine moving by less than this (relative) is flat


def nearest_rank(sorted_values, p):
    """True nearest rank: index ceil(p·n)−1 of the sorted values."""
    n = len(sorted_values)
    return sorted_values[max(0, math.ceil(p * n) - 1)]


def r3(x):
    return None if x is None else round(float(x), 3)


def stat(values):
    """{avg, p50, p90, max, n} over the values that were reported, or None when there are none."""
    vs = sorted(v for v in values if v is not None)
    if not vs:
        return None
    return {"avg": r3(sum(vs) / len(vs)), "p50": r3(nearest_rank(vs, 0.5)), "p90": r3(nearest_rank(vs, 0.9)),
            "max": r3(vs[-1]), "n": len(vs)}


def pctile_rank(sorted_values, v):
    """Percentile rank: round(100 × share of the reported values ≤ v)."""
    if not sorted_values:
        return None
    return round(100 * bisect.bisect_right(sorted_values, v) / len(sorted_values))


def histogram(values, edges):
    """Counts per bucket [edges[i], edges[i+1]); the last bucket is open."""
    counts = [0] * len(edges)
    for v in values:
        counts[max(0, bisect.bisect_right(edges, v) - 1)] += 1
    return counts


def hist_percentile(counts, edges, p):
    """The nearest-rank percentile read from a histogram: {value, lower_bound}. value is the upper edge of the
    bucket holding that rank; in the open top bucket it is that bucket's floor and lower_bound is true."""
    n = sum(counts)
    if n == 0:
        return None
    rank = max(1, math.ceil(p * n))
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank:
            if i == len(edges) - 1:
                return {"value": edges[i], "lower_bound": True}
            return {"value": edges[i + 1], "lower_bound": False}
    return None  # unreachable: the counts sum to n


def mean(values):
    vs = [v for v in values if v is not None]
    return r3(sum(vs) / len(vs)) if vs else None


def med(values):
    vs = [v for v in values if v is not None]
    return r3(median(vs)) if vs else None


def p95(values):
    vs = sorted(v for v in values if v is not None)
    return r3(nearest_rank(vs, 0.95)) if vs else None


def direction(before, after):
    """up / flat / down for one machine's cpu mean: flat within FLAT_PCT relative of the baseline."""
    if before == 0:
        return "flat" if after == 0 else "up"
    change = (after - before) / before * 100
    return "up" if change >= FLAT_PCT else ("down" if change <= -FLAT_PCT else "flat")
