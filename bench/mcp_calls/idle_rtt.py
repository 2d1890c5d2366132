"""One round trip to PostgreSQL and to Redis, hot and after a pause: what each of a call's round trips costs when
the server it goes to has been idle since the last call (the one-connection cell: a few milliseconds).

    YUZU_DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> YUZU_REDIS_URL=redis://127.0.0.1:6379/<n> \\
        .venv/bin/python bench/mcp_calls/idle_rtt.py [--samples 600] [--gaps 0 0.2 1 3 10]

Between two round trips this process spins for the gap (its own CPU stays busy), so only the server's side idles.
Prints the p50 and p90 of `SELECT 1` (psycopg, autocommit) and of `PING` (redis-py) per gap, in microseconds.
"""

import argparse
import os
import time

import psycopg
import redis


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def timed(op, gap, samples):
    for _ in range(20):
        op()
    out = []
    for _ in range(samples):
        spin(gap)
        t = time.perf_counter()
        op()
        out.append(time.perf_counter() - t)
    out.sort()
    return out[len(out) // 2] * 1e6, out[len(out) * 9 // 10] * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--gaps", type=float, nargs="+", default=[0, 0.2, 1, 3, 10], help="milliseconds")
    a = ap.parse_args()
    db, cache = os.environ.get("YUZU_DATABASE_URL"), os.environ.get("YUZU_REDIS_URL")
    if not db or not cache:
        raise SystemExit("set YUZU_DATABASE_URL (PostgreSQL) and YUZU_REDIS_URL")
    with psycopg.connect(db.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        cur = conn.cursor()
        r = redis.Redis.from_url(cache)
        ops = {"PostgreSQL SELECT 1": lambda: cur.execute("SELECT 1").fetchone(), "Redis PING": r.ping}
        print("round trip after the server idled for a gap (this process busy meanwhile); p50 / p90 in µs")
        print(f"{'gap ms':>8} " + " ".join(f"{name:>24}" for name in ops))
        for gap in a.gaps:
            cells = [timed(op, gap / 1000, a.samples) for op in ops.values()]
            print(f"{gap:8.1f} " + " ".join(f"{f'{p50:.0f} / {p90:.0f}':>24}" for p50, p90 in cells))


if __name__ == "__main__":
    main()
