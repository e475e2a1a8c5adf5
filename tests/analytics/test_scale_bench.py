"""bench/analytics_scale.py's DuckDB side keeps working on the recording format of the day.

Why a test for a bench: its DuckDB queries read the recorder's files directly, so a format change
(format 3 made the `_ns` columns timestamps) broke the bench silently until someone ran it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from analytics.synthetic import generate

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("analytics_scale", ROOT / "bench" / "analytics_scale.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_bench_duckdb_queries_run_on_a_fresh_recording(tmp_path: Path) -> None:
    bench = _bench()
    rec = tmp_path / "rec"
    generate(rec, 500)
    out = subprocess.run([sys.executable, "-c", bench.duckdb_script(rec)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    timings = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(timings) == set(bench.DUCKDB_QUERIES)
    assert all(isinstance(v, float | int) and v >= 0 for v in timings.values())
    assert bench.target_s(2_444) == 8.0 and bench.target_s(1_000_000) == 12.0 and bench.target_s(10_000_000) == 30.0
