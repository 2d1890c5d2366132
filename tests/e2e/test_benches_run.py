"""The benches still run and still measure what their READMEs say: each at a size of a few agents and streams,
embedded (its own temp SQLite), writing its figures. A bench nobody runs rots silently: bench/streams' daphne
stopped starting when `mcp.streaming.sessions` began importing `yuzu.rbac` (Django not yet set up), and its
single set-up user would have met the per-user caps at 5,000 streams — both found only at the next measurement.
The figures themselves are the benches' business (bench/*/README.md); here they only have to exist and be sane."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    env = {k: v for k, v in os.environ.items()  # embedded: the bench makes its own database, not the suite's
           if not k.startswith(("YUZU_DATABASE_URL", "YUZU_REDIS_URL", "YUZU_TEST_DATABASE"))}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / name / "run.py"), *args, "--json", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"{name}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())


@pytest.mark.live
def test_bench_mcp_calls_runs(tmp_path):
    if not (ROOT / ".venv-mcp" / "bin" / "python").exists():
        pytest.skip("the reference server needs .venv-mcp (make test-deps)")
    figures = bench(tmp_path, "mcp_calls", "--agents", "3", "--concurrency", "1", "--duration", "1",
                    "--rounds", "1", "--warmup", "0.2", "--generator", "httpx")
    for side in ("yuzu@1", "reference@1", "yuzu-rest@1"):
        cell = figures["results"][side]
        assert cell["requests"] > 0 and cell["errors"] == 0 and cell["agents_in_result"] == 3, (side, cell)
        assert 0 < cell["p50_ms"] <= cell["p99_ms"], (side, cell)


@pytest.mark.live
def test_bench_fanout_runs(tmp_path):
    figures = bench(tmp_path, "fanout", "--counts", "3", "--reps", "1", "--chunk", "3")
    (cell,) = figures["results"].values()
    assert not figures["failures"] and cell["terminal_ms"] > 0 and cell["layer_floor_ms"] > 0, figures


@pytest.mark.live
def test_bench_streams_runs(tmp_path):
    # 40 streams: more than one user's share of GET streams (32), so a bench that piles its clients on one user
    # is refused here rather than at its 5,000
    figures = bench(tmp_path, "streams", "--levels", "40", "--hold", "4", "--open-timeout", "60", "--agents", "2",
                    "--runs", "1", "--load-streams", "4")
    (level,) = figures["levels"]
    assert level["opened"] == 40 and level["failed"] == 0 and level["silent_streams"] == 0, level
    assert level["shutdown_close_frames"] == 40, level
    assert figures["latency"]["idle"]["responses"] >= 2 and figures["latency"]["loaded"]["responses"] >= 2, figures
