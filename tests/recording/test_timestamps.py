"""Format 3 timestamps: what the recorder writes reads as a timestamp in Spark, DuckDB and pandas as they
come (no kafkatap code, no arithmetic), and format 1 and 2 files (int64 epoch ns) are migrated by both readers."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recording.reader import read_recording, recording_start
from recording.sample_rows import SessionMix, connection_row, tcp_row
from recording.schema import FORMAT_KEY, FORMAT_VERSION, TIMESTAMP, arrow_schema
from recording.timestamps import timestamp_columns, to_epoch_ns
from recording.writer import ParquetRecorder

T0 = 1_795_000_000_123_456_789  # 2026-11-18, with sub-µs digits that format 3 drops
WHEN = dt.datetime(2026, 11, 18, 11, 6, 40, 123456, tzinfo=dt.timezone.utc)  # T0 truncated to µs


@pytest.fixture(scope="module")
def spark():
    from analytics.session import get_spark

    return get_spark(master="local[1]")  # the process-wide session


def _record(root: Path) -> None:
    rec = ParquetRecorder(root, "p1", flush_interval_s=0.05, compact_interval_s=0, fsync=False).start()
    rows = SessionMix(start_ns=T0).rows(50)
    rows[0] = dict(rows[0], req_first_ns=T0)
    for r in rows:
        rec.request(r)
    rec.connection(connection_row("p1", "c00001"))
    rec.tcp(tcp_row("p1", "c00001"))
    rec.close()


def test_format_is_3_and_every_ns_timestamp_is_a_utc_microsecond_timestamp() -> None:
    assert FORMAT_VERSION == 3
    assert timestamp_columns("requests") == ("req_first_ns", "req_last_ns", "req_sent_ns", "resp_first_ns",
                                             "resp_last_ns", "resp_sent_ns")
    assert timestamp_columns("connections") == ("snapshot_ns", "opened_ns", "closed_ns")
    assert timestamp_columns("frames") == ("ts_ns",)  # conn_offset_ns is a duration: int64 ns
    assert arrow_schema("frames").field("conn_offset_ns").type == pa.int64()
    assert arrow_schema("requests").field("latency_us").type == pa.int64()  # durations stay integers
    assert TIMESTAMP == pa.timestamp("us", tz="UTC")


def test_duckdb_and_pandas_read_recorder_timestamps_natively(tmp_path: Path) -> None:
    _record(tmp_path / "rec")
    glob = f"{tmp_path}/rec/requests/**/*.parquet"
    con = duckdb.connect()
    con.sql("SET TimeZone = 'UTC'")  # how DuckDB shows a TIMESTAMPTZ: in the session's zone
    ((typ, first, year),) = con.sql(
        f"SELECT typeof(req_first_ns), strftime(min(req_first_ns), '%Y-%m-%d %H:%M:%S.%f'), year(min(req_first_ns)) "
        f"FROM read_parquet('{glob}') GROUP BY 1").fetchall()
    assert (typ, first, year) == ("TIMESTAMP WITH TIME ZONE", "2026-11-18 11:06:40.123456", 2026)
    df = pd.read_parquet(next((tmp_path / "rec" / "requests").rglob("*.parquet")))
    assert str(df["req_first_ns"].dtype) == "datetime64[us, UTC]"
    assert df["req_first_ns"].min() == pd.Timestamp(WHEN)
    assert (df["resp_sent_ns"] - df["req_first_ns"]).dt.total_seconds().max() < 60  # time arithmetic as times
    cdf = pd.read_parquet(next((tmp_path / "rec" / "connections").rglob("*.parquet")))
    assert str(cdf["opened_ns"].dtype) == "datetime64[us, UTC]"
    assert recording_start([tmp_path / "rec"]) == T0 // 1000 * 1000  # footer statistics of a timestamp column


@pytest.mark.spark
def test_spark_reads_recorder_timestamps_natively(spark, tmp_path: Path) -> None:
    _record(tmp_path / "rec")
    df = spark.read.parquet(str(tmp_path / "rec" / "requests"))  # no schema given: Spark's own inference
    assert dict(df.dtypes)["req_first_ns"] == "timestamp"
    (row,) = df.selectExpr("unix_micros(min(req_first_ns)) AS us", "year(min(req_first_ns)) AS y").collect()
    assert (row.us, row.y) == (T0 // 1000, 2026)


# --- older formats, written here with their own schema -------------------------------------------------------

def _v2_schema(dataset: str) -> pa.Schema:
    """Format 2 as it was: every timestamp column int64 epoch ns."""
    return pa.schema([pa.field(f.name, pa.int64()) if f.type == TIMESTAMP else f for f in arrow_schema(dataset)])


def _v1_schema(dataset: str) -> pa.Schema:
    """Format 1: format 2 without requests.topic_ids, with int8 acks and int16 error_count."""
    narrow = {"acks": pa.int8(), "last_request_acks": pa.int8(), "error_count": pa.int16()}
    return pa.schema([pa.field(f.name, narrow.get(f.name, f.type)) for f in _v2_schema(dataset)
                      if f.name != "topic_ids"])


def _write_old(root: Path, version: int) -> dict[str, list[dict]]:
    schema_of = _v1_schema if version == 1 else _v2_schema
    rows = {
        "requests": [dict(r, req_first_ns=T0 + i * 1_000_000_000, topic_ids=["8f4c9b1e-1111-4000-8000-000000000001"])
                     for i, r in enumerate(SessionMix(start_ns=T0).rows(3))],
        "connections": [dict(connection_row("p1", "c00001"), opened_ns=T0, closed_ns=T0 + 5_000_000_000,
                             snapshot_ns=T0 + 5_000_000_000)],
        "tcp": [dict(tcp_row("p1", "c00001"), ts_ns=T0)],
    }
    for ds, rs in rows.items():
        schema = schema_of(ds)
        table = pa.Table.from_pylist([{n: r.get(n) for n in schema.names} for r in rs], schema=schema)
        d = root / ds / "proxy=p1" / "date=2026-11-18" / "hour=11"
        d.mkdir(parents=True)
        meta = {FORMAT_KEY: str(version).encode(), b"kafkatap.dataset": ds.encode()}
        pq.write_table(table.replace_schema_metadata(meta), d / f"part-old-{version}-00000001.parquet")
    return rows


@pytest.mark.parametrize("version", [1, 2])
def test_old_format_is_migrated_by_the_arrow_reader(tmp_path: Path, version: int) -> None:
    rows = _write_old(tmp_path, version)
    for ds in ("requests", "connections", "tcp"):
        t = read_recording(tmp_path, ds, with_partitions=False)
        assert t.schema == arrow_schema(ds).remove_metadata()
        back = to_epoch_ns(t, ds).to_pylist()
        for col in timestamp_columns(ds):
            assert [r[col] for r in back] == [None if r.get(col) is None else r[col] // 1000 * 1000
                                              for r in rows[ds]], (ds, col)
    t = read_recording(tmp_path, "requests", with_partitions=False)
    assert t["req_first_ns"][0].as_py() == WHEN
    assert t["topic_ids"].null_count == (3 if version == 1 else 0)
    assert recording_start([tmp_path]) == T0  # an int64 ns statistic, read as it was


@pytest.mark.spark
@pytest.mark.parametrize("version", [1, 2])
def test_old_format_is_migrated_by_the_spark_reader(spark, tmp_path: Path, version: int) -> None:
    from analytics import load as L

    rows = _write_old(tmp_path, version)
    listing = L.live_files(str(tmp_path), "requests")
    df, read_version = L._read_files(spark, listing, "requests")  # migrated, before the transforms' ns view
    assert read_version == version and dict(df.dtypes)["req_first_ns"] == "timestamp"
    got = sorted(r.us for r in df.selectExpr("unix_micros(req_first_ns) AS us").collect())
    assert got == [r["req_first_ns"] // 1000 for r in rows["requests"]]
    r = L.load(spark, [str(tmp_path)])
    (c,) = r.connections.collect()
    assert (c.opened_ns, c.closed_ns) == (T0 // 1000 * 1000, (T0 + 5_000_000_000) // 1000 * 1000)
    assert r.tcp.first().ts_ns == T0 // 1000 * 1000
    assert r.versions[f"{tmp_path}/requests"] == version
