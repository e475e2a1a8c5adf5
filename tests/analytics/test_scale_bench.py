"""The analysis benches' tools keep working: bench/analytics_scale.py's DuckDB side on the recording format of the
day, bench/spark_timeline.py on the event logs Spark writes.

Why tests for benches: the DuckDB queries read the recorder's files directly, so a format change (format 3
made the `_ns` columns timestamps) broke the bench silently until someone ran it; and the timeline read only
plain event logs, when Spark 4 writes them zstd-compressed by default.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from analytics.synthetic import generate

ROOT = Path(__file__).resolve().parents[2]


def _bench_module(name: str) -> Any:
    """A module of bench/ (not a package), loaded by path and registered, as its dataclasses need."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_bench_duckdb_queries_run_on_a_fresh_recording(tmp_path: Path) -> None:
    bench = _bench_module("analytics_scale")
    rec = tmp_path / "rec"
    generate(rec, 500)
    out = subprocess.run([sys.executable, "-c", bench.duckdb_script(rec)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    timings = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(timings) == set(bench.DUCKDB_QUERIES)
    assert all(isinstance(v, float | int) and v >= 0 for v in timings.values())
    assert bench.target_s(2_444) == 8.0 and bench.target_s(1_000_000) == 12.0 and bench.target_s(10_000_000) == 30.0


def test_spark_timeline_reads_spark4s_zstd_event_logs(tmp_path: Path) -> None:
    """Spark 4 compresses event logs with zstd by default; the timeline read only plain ones and failed on it."""
    tl = _bench_module("spark_timeline")
    events = [
        {"Event": "SparkListenerApplicationStart", "Timestamp": 1_000},
        {"Event": "SparkListenerExecutorAdded", "Timestamp": 1_300},
        {"Event": tl.SQL_START, "executionId": 0, "time": 2_000, "description": "toArrow at job.py:1"},
        {"Event": tl.SQL_END, "executionId": 0, "time": 2_500},
        {"Event": "SparkListenerApplicationEnd", "Timestamp": 3_000},
    ]
    app = tmp_path / "logs" / "eventlog_v2_local-1"
    app.mkdir(parents=True)
    with pa.CompressedOutputStream(pa.OSFile(str(app / "events_1_local-1.zstd"), "wb"), "zstd") as out:
        out.write("".join(json.dumps(e) + "\n" for e in events).encode())
    got = tl.read(tmp_path / "logs", 500, 3_200)
    assert got.executions == 1 and got.slowest[0].ms == 500 and got.slowest[0].description == "toArrow"
    (app / "events_1_local-1.zstd").rename(app / "events_1_local-1.lz4")
    with pytest.raises(ValueError, match="spark.eventLog.compress=false"):
        tl.read(tmp_path / "logs", 500, 3_200)


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "analytics_scale.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_the_bench_refuses_what_it_cannot_measure_before_starting_anything(tmp_path: Path) -> None:
    r = _bench("--sizes", "10", "--workdir", str(tmp_path), "--rounds", "0")
    assert r.returncode != 0 and "--rounds must be at least 1" in r.stderr
    r = _bench("--sizes", "10", "--workdir", str(tmp_path), "--before", "HEAD", "--generate-only")
    assert r.returncode != 0 and "--generate-only runs none" in r.stderr
    r = _bench("--sizes", "10", "--workdir", str(tmp_path), "--before", "no-such-revision")
    assert r.returncode != 0 and "--before no-such-revision: git cannot archive that revision" in r.stderr
    assert not (tmp_path / "rec-10").exists()  # refused before generating a recording


def test_before_and_after_pairs_are_listed_in_run_order_with_their_medians() -> None:
    bench = _bench_module("analytics_scale")
    def run(wall: float, cpu: float, load: str = "1.0") -> dict:
        return {"wall_s": wall, "cpu_s": cpu, "load_before": load, "load_after": load + "+"}
    result = {"requests": 2_444, "before_runs": [run(16.0, 25.0), run(14.0, 22.0, "3.0"), run(15.0, 24.0)],
              "runs": [run(13.0, 21.0, "2.0"), run(15.5, 25.5), run(12.0, 20.0)]}
    lines = bench.pairs_markdown([result], "abc1234")
    assert "`abc1234`" in lines[1]
    rows = [ln for ln in lines if ln.startswith("| 2,444 |")]
    assert rows[0] == "| 2,444 | 1 | 16.0 s (25.0 s) | 13.0 s (21.0 s) | -3.0 s | 1.0→2.0+ |"  # before ran first
    assert rows[1].startswith("| 2,444 | 2 | 14.0 s") and "+1.5 s" in rows[1] and "1.0→3.0+" in rows[1]  # after ran first
    assert rows[-1] == "| 2,444 | median | 15.0 s | 13.0 s | -2.0 s | |"


@pytest.mark.spark
@pytest.mark.slow
def test_the_bench_says_where_sparks_time_went(tmp_path: Path) -> None:
    """Issue 16 asks the bench to print where Spark's time goes; for twenty sessions the README said it did while
    bench/spark_timeline.py was only ever run by hand. One real analysis of a small recording, profiled."""
    rec = tmp_path / "rec"
    generate(rec, 300)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "analytics_scale.py"), "--recording", str(rec),
                        "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("- ") and " requests, " in ln)
    for phase in ("start-up (python, JVM, classes)", "SparkContext", "between queries (python, planning)",
                  "queries running", "after last query (write, report)", "JVM shutdown"):
        assert phase in line
    executions = int(line.split(" SQL executions")[0].rsplit(" ", 1)[1])
    assert executions >= 10  # the report is dozens of queries; a log that missed them would read 0
    assert "Slowest executions: " in line and "jobs, " in line


def test_the_timeline_lines_say_each_phase_and_count() -> None:
    bench = _bench_module("analytics_scale")
    profile = {"wall_s": 17.7, "phases_s": {"start-up (python, JVM, classes)": 3.1, "queries running": 12.6},
               "sql_executions": 51, "jobs": 71, "stages": 139, "tasks": 151, "task_s": 6.2, "task_cpu_s": 3.1,
               "task_gc_s": 1.3, "slowest": [{"id": 30, "s": 2.01, "jobs": 8, "tasks": 20, "what": "toArrow"}]}
    lines = bench.timeline_markdown([{"requests": 1_459, "profile": profile}, {"requests": 9}])
    assert lines[-1] == ("- 1,459 requests, 17.7 s in all: start-up (python, JVM, classes) 3.1 s, queries running "
                         "12.6 s; 51 SQL executions, 71 jobs, 139 stages, 151 tasks, task time 6.2 s (CPU 3.1 s, "
                         "GC 1.3 s). Slowest executions: toArrow 2.01 s (8 jobs, 20 tasks).")
    assert "bench/spark_timeline.py" in lines[1]
    assert bench.timeline_markdown([{"requests": 9}]) == []  # --no-timeline: no heading over nothing
