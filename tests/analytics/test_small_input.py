"""Size-chosen Spark settings: a small local analysis runs interpreted on one shuffle partition, a mid-sized one
compiled on one shuffle partition without adaptive re-planning, with the same results.

Why: for a demo-sized recording every query's cost is fixed overhead (code generation,
adaptive re-planning, shuffles), so `run_analysis` switches those off when the Parquet
footers say the recording is small. These tests pin that the switch changes nothing in
the output, never applies to a cluster master, never outlives the analysis, and that the
driver JVM runs with the cheap JIT flags.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from analytics import session
from analytics.job import input_rows, run_analysis, stored_rollups
from analytics.result import AnalysisResult
from analytics.synthetic import generate
from recording.rollups import TIME_KEYED
from recording.schema import DERIVED_DATASETS

pytestmark = pytest.mark.spark


def test_settings_only_for_small_local_inputs() -> None:
    small = session.SMALL_INPUT_ROWS
    assert session.small_input_settings("local[2]", small) == session.SMALL_INPUT
    assert session.small_input_settings("local[2]", small + 1) == session.MID_INPUT  # compiled, but no AQE
    assert session.small_input_settings("local[2]", session.MID_INPUT_ROWS) == session.MID_INPUT
    assert session.small_input_settings("local[2]", session.MID_INPUT_ROWS + 1) == {}
    assert set(session.MID_INPUT.items()) < set(session.SMALL_INPUT.items())  # the small tier only adds to it
    assert session.small_input_settings("local[2]", None) == {}  # unknown size (e.g. s3a://): assume big
    assert session.small_input_settings("spark://127.0.0.1:7077", 10) == {}  # a cluster keeps Spark's own


def test_listing_stays_in_the_driver_locally_only() -> None:
    """Locally, Spark lists the recording's files itself instead of running a job per read; a cluster keeps its own."""
    key = "spark.sql.sources.parallelPartitionDiscovery.threshold"
    assert int(session.DEFAULTS[key]) >= 10_000 and key not in session.cluster_defaults("local[2]")
    assert session.cluster_defaults("spark://127.0.0.1:7077")[key] is None  # None: left to Spark


def test_input_rows_reads_footers_and_stops_past_the_limit(tmp_path: Path) -> None:
    counts = generate(tmp_path / "rec", 600)
    total = sum(counts.values())
    assert input_rows([tmp_path / "rec"], limit=10**9) == total  # rollups not to be used (e.g. a filter)
    # with rollups beside every requests file, the passes read those instead of the requests: they are counted
    stored = {ds: sum(pq.read_metadata(p).num_rows for p in (tmp_path / "rec" / ds).rglob("*.parquet")) for ds in DERIVED_DATASETS}
    assert all(stored.values())
    covers = stored_rollups([tmp_path / "rec"], True)
    assert input_rows([tmp_path / "rec"], limit=10**9, covers=covers) == total - counts["requests"] + sum(stored.values())
    # a 90 s bucket cannot be made of the stored 60 s ones: the time-keyed views read the requests
    untimed = sum(n for ds, n in stored.items() if ds not in TIME_KEYED)
    assert input_rows([tmp_path / "rec"], limit=10**9, covers=covers, bucket_s=90) == total + untimed
    early = input_rows([tmp_path / "rec"], limit=10)
    assert early is not None and 10 < early <= total
    assert input_rows([tmp_path / "missing"], limit=10**9) == 0


def test_small_settings_change_no_output_and_do_not_leak(spark, tmp_path: Path) -> None:
    generate(tmp_path / "rec", 1500)
    before = {k: spark.conf.get(k, None) for k in session.SMALL_INPUT}
    assert before["spark.sql.codegen.factoryMode"] != "NO_CODEGEN"  # else the comparison below compares nothing
    small = run_analysis([tmp_path / "rec"], tmp_path / "small", spark=spark, progress=False, report=False)
    assert {k: spark.conf.get(k, None) for k in session.SMALL_INPUT} == before  # put back after the analysis
    usual = {k: v for k, v in before.items() if v is not None}  # the caller's conf wins over the size rule
    big = run_analysis([tmp_path / "rec"], tmp_path / "usual", spark=spark, progress=False, report=False, spark_conf=usual)
    _same_results(small, big)


def _same_results(a: AnalysisResult, b: AnalysisResult) -> None:
    """The same tables (but the analysis's own `_meta`) and the same findings."""
    assert a.tables.keys() == b.tables.keys()
    for name in a.tables:
        if name != "_meta":
            assert a.tables[name] == b.tables[name], name
    assert [f.to_json() for f in a.findings] == [f.to_json() for f in b.findings]


def test_mid_sized_settings_change_no_output(spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mid tier (MID_INPUT) answers as Spark's own settings do; a small recording stands in for a mid-sized one."""
    generate(tmp_path / "rec", 1500)
    monkeypatch.setattr(session, "SMALL_INPUT_ROWS", 0)
    applied: list[dict[str, str]] = []
    real = session.small_input_settings
    monkeypatch.setattr("analytics.job.small_input_settings", lambda m, n: applied.append(real(m, n)) or applied[-1])
    mid = run_analysis([tmp_path / "rec"], tmp_path / "mid", spark=spark, progress=False, report=False)
    assert applied == [session.MID_INPUT]
    usual = {k: spark.conf.get(k) for k in session.MID_INPUT}
    assert usual["spark.sql.adaptive.enabled"] == "true"  # else the comparison below compares nothing
    _same_results(mid, run_analysis([tmp_path / "rec"], tmp_path / "usual", spark=spark, progress=False, report=False,
                                    spark_conf=usual))


def test_driver_jvm_runs_the_cheap_jit(spark) -> None:
    args = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())  # type: ignore[union-attr]
    for flag in session.driver_jvm(None).split():
        assert flag in args


def test_local_pages_and_broadcast_chunks_are_small(spark) -> None:
    """Locally a task's memory page is 2 MB, not the 64 MB Spark derives from a 3g heap on two cores, and a
    broadcast's chunks 512 KB, not 4 MB: the running JVM's memory manager holds the page size it was given.
    A cluster's executors size their own."""
    env = spark.sparkContext._jsc.sc().env()  # type: ignore[union-attr]
    assert env.memoryManager().pageSizeBytes() == 2 * 1024 * 1024
    assert spark.sparkContext.getConf().get("spark.broadcast.blockSize") == "512k"
    cluster = session.cluster_defaults("spark://127.0.0.1:7077")
    assert cluster["spark.buffer.pageSize"] is None and cluster["spark.broadcast.blockSize"] is None
    assert "spark.buffer.pageSize" not in session.session_settings("spark://127.0.0.1:7077", None, None, {})


def test_driver_jit_follows_the_input_size() -> None:
    """C1 alone for small and unknown inputs; the full tiered JIT past C1_ONLY_MAX_ROWS, where C2 pays back."""
    for rows in (None, 2_444, session.C1_ONLY_MAX_ROWS):
        assert session.driver_jvm(rows, cores=8) == session.DRIVER_JVM
    big = session.driver_jvm(session.C1_ONLY_MAX_ROWS + 1)
    assert "TieredStopAtLevel" not in big and "-XX:+UseParallelGC" in big


def test_a_small_host_compiles_with_one_c1_thread() -> None:
    """Two cores or fewer: one C1 compiler thread (the second took a core from the queries); more cores, the JVM's count.
    Never with the full tiered JIT of a big input, whose C1 and C2 need a thread each."""
    for cores in (1, 2):
        assert session.driver_jvm(2_444, cores=cores) == f"{session.DRIVER_JVM} -XX:CICompilerCount=1"
    assert "CICompilerCount" not in session.driver_jvm(2_444, cores=3)
    assert "CICompilerCount" not in session.driver_jvm(session.C1_ONLY_MAX_ROWS + 1, cores=2)
    assert session.driver_jvm(None) == session.driver_jvm(None, cores=session.usable_cores())


def test_a_big_input_starts_the_driver_with_the_full_jit() -> None:
    """The size reaches the JVM's command line: a fresh session for 3 M rows has no TieredStopAtLevel."""
    code = ("from analytics.session import get_spark; s = get_spark(input_rows=3_000_000); "
            "print(' '.join(s.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "-XX:+UseParallelGC" in p.stdout and "TieredStopAtLevel" not in p.stdout, p.stdout[-2000:]
