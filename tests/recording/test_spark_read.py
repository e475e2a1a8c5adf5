"""Spark reads what the recorder writes, with the schema derived from recording/schema.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from recording.writer import ParquetRecorder
from recording.sample_rows import SessionMix, connection_row, tcp_row

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark():
    from analytics.session import get_spark

    # the process-wide session (shared with tests/analytics if they run in the same process)
    return get_spark(master="local[1]")


def test_spark_reads_recording_with_derived_schema(spark, tmp_path: Path) -> None:
    from analytics.spark_schema import spark_schema
    from pyspark.sql import functions as F

    root = tmp_path / "rec"
    rec = ParquetRecorder(root, "p1", flush_interval_s=0.05, compact_interval_s=0.2, fsync=False).start()
    rows = SessionMix().rows(5000)
    for r in rows:
        rec.request(r)
    for i in range(3):
        rec.connection(connection_row("p1", f"c{i:05d}"))
        rec.tcp(tcp_row("p1", f"c{i:05d}"))
    rec.close()

    req = spark.read.schema(spark_schema("requests")).parquet(str(root / "requests"))
    assert req.count() == 5000
    by_api = {r["api_name"]: r["n"] for r in req.groupBy("api_name").agg(F.count("*").alias("n")).collect()}
    assert by_api["Produce"] + by_api["Fetch"] > 4500
    assert dict(req.dtypes)["req_first_ns"] == "timestamp"  # a real timestamp, no arithmetic needed
    first = req.orderBy("conn_id", "correlation_id").withColumns(
        {c: F.unix_micros(c) for c in ("req_first_ns", "resp_sent_ns")}).first()
    want = min(rows, key=lambda r: (r["conn_id"], r["correlation_id"]))
    for k in ("req_first_ns", "resp_sent_ns"):
        assert first[k] == want[k] // 1000, k  # stored in µs
    for k in ("latency_us", "topics", "client_id", "api_version", "acks"):
        assert first[k] == want.get(k), k
    assert {r["proxy"] for r in req.select("proxy").distinct().collect()} == {"p1"}
    pruned = req.where((F.col("proxy") == "p1") & (F.col("api_key") == 0)).count()
    assert pruned == by_api["Produce"]
    conns = spark.read.schema(spark_schema("connections")).parquet(str(root / "connections"))
    assert conns.count() == 3 and conns.first()["tcp_client_open"]["wscale_ok"] is True
    tcp = spark.read.schema(spark_schema("tcp")).parquet(str(root / "tcp"))
    assert tcp.count() == 3
