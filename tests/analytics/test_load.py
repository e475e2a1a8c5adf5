"""Reading recordings: derived schema, version check, snapshot de-duplication, filters."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analytics import load as L
from analytics.synthetic import write_rows
from recording import schema as rec
from analytics_rows import S, T0, conn, req

pytestmark = pytest.mark.spark


def test_parse_time_formats() -> None:
    iso = L.parse_time("2026-11-20T09:00:00")
    assert iso == T0
    assert L.parse_time("2026-11-20T10:00:00+01:00") == T0
    assert L.parse_time(str(T0 // S)) == T0
    assert L.parse_time(T0) == T0
    assert L.parse_time(dt.datetime(2026, 11, 20, 9, tzinfo=dt.timezone.utc)) == T0
    with pytest.raises(ValueError, match="ISO 8601"):
        L.parse_time("yesterday")


def test_load_dedupes_snapshots_and_reads_partitions(spark, tmp_path) -> None:
    write_rows(tmp_path, "requests", [req("c1", 1, t_s=1), req("c2", 1, t_s=4000, broker="10.0.0.2:9092")])
    snap = conn("c1", 0, None, snapshot_ns=T0 + 30 * S)
    snap2 = conn("c1", 0, None, snapshot_ns=T0 + 60 * S, requests=7)
    final = conn("c1", 0, 100, requests=9)
    only_snaps = [conn("c2", 3990, None, snapshot_ns=T0 + 4000 * S, requests=1, broker="10.0.0.2:9092"),
                  conn("c2", 3990, None, snapshot_ns=T0 + 4100 * S, requests=2, broker="10.0.0.2:9092")]
    write_rows(tmp_path, "connections", [final, snap2, snap, *only_snaps])
    r = L.load(spark, [str(tmp_path)])
    rows = {x.conn_id: x for x in r.connections.collect()}
    assert rows["c1"].final is True and rows["c1"].requests == 9
    assert rows["c2"].final is False and rows["c2"].requests == 2  # latest snapshot
    assert {x.hour for x in r.requests.select("hour").collect()} == {"09", "10"}
    assert r.tcp.count() == 0  # absent dataset reads as empty with the right schema
    assert "wscale_ok" in r.tcp.columns


def test_filters(spark, tmp_path) -> None:
    write_rows(tmp_path, "requests", [
        req("c1", 1, t_s=10, topics=["a"]), req("c1", 2, t_s=20, topics=["b"]),
        req("c2", 1, t_s=3700, client="other", broker="10.0.0.2:9092", topics=["a"]),
    ])
    write_rows(tmp_path, "connections", [conn("c1", 0, 30), conn("c2", 3690, 3800, client="other", broker="10.0.0.2:9092")])
    since = L.load(spark, [str(tmp_path)], L.Filters(since_ns=T0 + 3600 * S))
    assert [x.conn_id for x in since.requests.collect()] == ["c2"]
    assert [x.conn_id for x in since.connections.collect()] == ["c2"]
    until = L.load(spark, [str(tmp_path)], L.Filters(until_ns=T0 + 15 * S))
    assert until.requests.count() == 1
    by_broker = L.load(spark, [str(tmp_path)], L.Filters(brokers=("10.0.0.2",)))
    assert {x.conn_id for x in by_broker.connections.collect()} == {"c2"}
    by_client = L.load(spark, [str(tmp_path)], L.Filters(clients=("app-1",)))
    assert by_client.requests.count() == 2
    by_topic = L.load(spark, [str(tmp_path)], L.Filters(topics=("b",)))
    assert by_topic.requests.count() == 1 and {x.conn_id for x in by_topic.connections.collect()} == {"c1"}


def _write_with_version(root, version: bytes | None) -> None:
    schema = rec.arrow_schema("requests")
    meta = dict(schema.metadata)
    if version is None:
        meta.pop(rec.FORMAT_KEY)
    else:
        meta[rec.FORMAT_KEY] = version
    t = pa.Table.from_pylist([{n: req("c1", 1).get(n) for n in schema.names}], schema=schema).replace_schema_metadata(meta)
    d = root / "requests" / "proxy=p1" / "date=2026-11-20" / "hour=09"
    d.mkdir(parents=True)
    pq.write_table(t, d / "part-0.parquet")


def test_newer_format_is_refused_clearly(spark, tmp_path) -> None:
    _write_with_version(tmp_path, str(rec.FORMAT_VERSION + 1).encode())
    with pytest.raises(L.RecordingFormatError, match="newer than this kafkatap reads"):
        L.load(spark, [str(tmp_path)])


def test_missing_version_is_refused(spark, tmp_path) -> None:
    _write_with_version(tmp_path, None)
    with pytest.raises(L.RecordingFormatError, match="not a kafkatap recording"):
        L.load(spark, [str(tmp_path)])


def test_older_format_goes_through_migrations(spark, tmp_path, monkeypatch) -> None:
    _write_with_version(tmp_path, b"0")
    with pytest.raises(L.RecordingFormatError, match="no migration from version 0"):
        L.load(spark, [str(tmp_path)])
    seen = []

    def mig(dataset, df):
        seen.append(dataset)
        return df

    monkeypatch.setitem(L.MIGRATIONS, 0, mig)
    r = L.load(spark, [str(tmp_path)])
    assert r.requests.count() == 1 and seen == ["requests"]


def test_empty_dir_is_a_clear_error(spark, tmp_path) -> None:
    with pytest.raises(L.RecordingFormatError, match="holds no recording"):
        L.load(spark, [str(tmp_path)])
