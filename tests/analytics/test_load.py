"""Reading recordings: derived schema, version check, snapshot de-duplication, filters."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analytics import load as L
from analytics.synthetic import write_rows
from recording import schema as rec
from recording.migrations import Migration
from recording.timestamps import from_epoch_ns, ingest_schema
from analytics_rows import S, T0, conn, req

pytestmark = pytest.mark.spark


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
    t = from_epoch_ns(pa.Table.from_pylist([{n: req("c1", 1).get(n) for n in schema.names}], schema=ingest_schema("requests")),
                      "requests").replace_schema_metadata(meta)
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

    def mig(df, dataset):
        seen.append(dataset)
        return df

    monkeypatch.setitem(L.MIGRATIONS, 0, Migration(0, arrow=lambda t, ds: t, spark=mig))
    r = L.load(spark, [str(tmp_path)])
    assert r.requests.count() == 1 and seen == ["requests"]


def test_empty_dir_is_a_clear_error(spark, tmp_path) -> None:
    with pytest.raises(L.RecordingFormatError, match="holds no recording"):
        L.load(spark, [str(tmp_path)])


def test_older_format_with_a_renamed_column_is_migrated_in_spark(spark, tmp_path, monkeypatch) -> None:
    """The same declared Migration the Arrow reader applies renames the column before Spark conforms."""
    old = pa.table({"proxy_id": ["p1"], "conn_id": ["c1"], "correlation_id": pa.array([5], pa.int32()),
                    "api": ["Produce"], "req_first_ns": [T0]})
    d = tmp_path / "requests" / "proxy=p1" / "date=2026-11-20" / "hour=09"
    d.mkdir(parents=True)
    pq.write_table(old.replace_schema_metadata({rec.FORMAT_KEY: b"0"}), d / "part-old.parquet")
    monkeypatch.setitem(L.MIGRATIONS, 0, Migration(0, rename={"requests": {"api": "api_name"}}))
    (row,) = L.load(spark, [str(tmp_path)]).requests.collect()
    assert row.api_name == "Produce" and row.api_key is None and row.correlation_id == 5 and row.hour == "09"
    assert L.load(spark, [str(tmp_path)]).versions[f"{tmp_path}/requests"] == 0
    from recording.reader import read_recording

    assert read_recording(tmp_path)["api_name"].to_pylist() == ["Produce"]  # the Arrow reader: same registry


def test_mixed_versions_are_refused_clearly(spark, tmp_path) -> None:
    _write_with_version(tmp_path, b"0")
    later = tmp_path / "requests" / "proxy=p1" / "date=2026-11-20" / "hour=10"
    later.mkdir(parents=True)
    pq.write_table(pq.read_table(tmp_path / "requests" / "proxy=p1" / "date=2026-11-20" / "hour=09" / "part-0.parquet")
                   .replace_schema_metadata(rec.arrow_schema("requests").metadata), later / "part-1.parquet")
    with pytest.raises(L.RecordingFormatError, match=rf"mixes recording format versions \[0, {rec.FORMAT_VERSION}\]"):
        L.load(spark, [str(tmp_path)])


def test_dot_and_underscore_files_are_not_read(spark, tmp_path) -> None:
    write_rows(tmp_path, "requests", [req("c1", 1), req("c1", 2)])
    (d,) = {p.parent for p in (tmp_path / "requests").rglob("*.parquet")}
    (src,) = d.glob("part-*.parquet")
    (d / ".tmp-part-x.parquet").write_bytes(b"PAR1 half written")
    (d / "_temporary").mkdir()
    (d / "_temporary" / "part-y.parquet").write_bytes(src.read_bytes())
    assert L.load(spark, [str(tmp_path)]).requests.count() == 2


def _crash_during_compaction(root, monkeypatch, flushes: int = 3, rows_per_flush: int = 200) -> int:
    """What a crash between renaming the merged file and deleting its inputs leaves: both, same rows.

    A real recorder (not started, so flushes happen exactly when called) writes
    `flushes` flush files into one hour partition; on close it compacts them
    with the deletion of the inputs skipped — the step the crash prevents.
    """
    from recording import compaction
    from recording.sample_rows import SessionMix, connection_row
    from recording.writer import ParquetRecorder, check_recording_dir

    check_recording_dir(root)
    r = ParquetRecorder(root, "p1", compact_interval_s=3600, fsync=False)
    mix = SessionMix(start_ns=T0 + 60 * S)
    for _ in range(flushes):
        for row in mix.rows(rows_per_flush):
            r.request(row)
        r._flush(final=False)
    for i in range(3):
        r.connection(connection_row("p1", f"c{i:05d}"))
    monkeypatch.setattr(compaction, "remove_inputs", lambda seg: None)
    r.close()
    return flushes * rows_per_flush


def test_analyze_counts_each_request_once_after_a_crash_during_compaction(spark, tmp_path, monkeypatch) -> None:
    from click.testing import CliRunner

    from analytics.cli import analyze
    from recording.layout import superseded
    from recording.reader import read_recording

    root = tmp_path / "rec"
    n = _crash_during_compaction(root, monkeypatch)
    (d,) = {p.parent for p in (root / "requests").rglob("part-*.parquet")}
    names = sorted(p.name for p in d.glob("part-*.parquet"))
    stale = superseded(names)
    (merged,) = set(names) - stale
    assert len(stale) == 3 and merged.endswith("-00000001-00000003.parquet")
    assert pq.read_metadata(d / merged).num_rows == n == sum(pq.read_metadata(d / s).num_rows for s in stale)
    assert spark.read.parquet(str(root / "requests")).count() == 2 * n  # reading the directory double-counts
    assert read_recording(root).num_rows == n  # the Arrow path

    out = CliRunner().invoke(analyze, [str(root), "--out", str(tmp_path / "out"), "--quiet", "--no-csv"])
    assert out.exit_code == 0, out.output
    (overview,) = pq.read_table(tmp_path / "out" / "tables" / "overview.parquet").to_pylist()
    assert overview["requests"] == n


FORMS = [  # (--since value, what it means) — the same for both commands
    ("2026-11-20T09:00:30", T0 + 30 * S),
    ("2026-11-20T10:00:30+01:00", T0 + 30 * S),
    ("2026-11-20T09:00:30Z", T0 + 30 * S),
    (str(T0 // S + 30), T0 + 30 * S),
    (str((T0 + 30 * S) // 1_000_000), T0 + 30 * S),
    (str(T0 + 30 * S), T0 + 30 * S),
    ("+20", T0 + 30 * S),  # the first request is at T0 + 10 s
    ("+19.5s", T0 + 29_500_000_000),
]


def _analyze_window(tmp_path, monkeypatch, *args: str):
    """Run the real `kafkatap analyze` command line up to the analysis; return (result, the window it asked for)."""
    from click.testing import CliRunner

    from analytics import job
    from analytics.cli import analyze

    seen = {}

    def fake_run(dirs, out, **kw):
        seen.update(kw)
        return None

    monkeypatch.setattr(job, "run_analysis", fake_run)
    monkeypatch.setattr(job, "summary", lambda result: "ok")
    out = f"{tmp_path}-out"  # beside the recording: an OUT inside it is refused
    res = CliRunner().invoke(analyze, [str(tmp_path), "--out", out, "--quiet", *args])
    if not seen:
        return res, (None, None)
    return res, L.time_window(seen["since"], seen["until"], [tmp_path])  # the job resolves what the CLI checked


def _replay_window(tmp_path, monkeypatch, *args: str):
    """Run the real `kafkatap replay` command line up to loading; return (result, the window it asked for)."""
    from click.testing import CliRunner

    from replay import cli as replay_cli

    seen = {}

    def fake_load(path, filters, **kw):
        seen.update(since=filters.since_ns, until=filters.until_ns)
        raise replay_cli.ReplayLoadError("stop here")

    monkeypatch.setattr(replay_cli, "load_recording", fake_load)
    res = CliRunner().invoke(replay_cli.replay, [str(tmp_path), "--target", "127.0.0.1:9", *args])
    return res, (seen.get("since"), seen.get("until"))


@pytest.mark.parametrize("run", [_analyze_window, _replay_window], ids=["analyze", "replay"])
def test_both_commands_accept_the_same_times(tmp_path, monkeypatch, run) -> None:
    write_rows(tmp_path, "requests", [req("c1", 1, t_s=10), req("c1", 2, t_s=50)])
    for text, want in FORMS:
        res, window = run(tmp_path, monkeypatch, "--since", text, "--until", "+40")
        assert window == (want, T0 + 50 * S), (text, res.output, res.exception)
    res, window = run(tmp_path, monkeypatch)
    assert window == (None, None)
    for bad in ("yesterday", "-5", "+", "2026-13-01"):
        res, window = run(tmp_path, monkeypatch, "--until", bad)
        assert res.exit_code == 2 and window == (None, None), res.output
        assert f"Invalid value for '--until': cannot parse time '{bad}'" in res.output


@pytest.mark.parametrize("run", [_analyze_window, _replay_window], ids=["analyze", "replay"])
def test_relative_time_without_requests_is_a_bad_parameter(tmp_path, monkeypatch, run) -> None:
    write_rows(tmp_path, "connections", [conn("c1", 0, 30)])
    res, _ = run(tmp_path, monkeypatch, "--since", "+5")
    assert res.exit_code == 2 and "Invalid value for '--since'" in res.output and "absolute time" in res.output
    res, window = run(tmp_path, monkeypatch, "--since", "2026-11-20T09:00:00")
    assert window == (T0, None)


def test_time_window_resolves_relative_times_for_programmatic_callers(tmp_path) -> None:
    write_rows(tmp_path, "requests", [req("c1", 1, t_s=10)])
    assert L.time_window("+5", T0 + 60 * S, [tmp_path]) == (T0 + 15 * S, T0 + 60 * S)
    assert L.time_window(None, "2026-11-20T09:00:00", []) == (None, T0)


def test_topic_ids_recorded_before_their_name_are_named_late(spark, tmp_path) -> None:
    """A row that left the proxy with an id is named from the recording's topics/ pairs (issue 14)."""
    tid, gone = "8f4c9b1e-1111-4000-8000-000000000001", "8f4c9b1e-1111-4000-8000-00000000dead"
    err = [{"code": 6, "name": "NOT_LEADER_OR_FOLLOWER", "topic": tid, "partition": 0, "resource": None}]
    write_rows(tmp_path, "requests", [
        req("c1", 1, "Fetch", t_s=1, topics=[tid], topic_ids=[tid], errors=err, error_count=1),
        req("c1", 2, "Fetch", t_s=2, topics=["orders"], topic_ids=[tid]),
        req("c1", 3, "Fetch", t_s=3, topics=[gone], topic_ids=[gone]),  # never named: stays an id
        req("c2", 1, "Produce", t_s=1, topics=["orders"], topic_ids=[]),
        req("c3", 1, "ConsumerGroupHeartbeat", t_s=4, topics=["orders", tid], topic_ids=[tid]),  # by name and by id
        req("c1", 4, "Fetch", t_s=5, topics=[], topic_ids=[], errors=err, error_count=1),  # an incremental fetch
    ])
    write_rows(tmp_path, "connections", [conn("c1", 0, 10, last_request_topics=[tid])])
    write_rows(tmp_path, "topics", [{"proxy_id": "p1", "topic_id": tid, "name": "old-name", "first_seen_ns": T0},
                                    {"proxy_id": "p1", "topic_id": tid, "name": "orders", "first_seen_ns": T0 + 5 * S}])
    r = L.load(spark, [str(tmp_path)], L.Filters(topics=("orders",)))
    rows = {(x.conn_id, x.correlation_id): x for x in r.requests.collect()}
    assert set(rows) == {("c1", 1), ("c1", 2), ("c2", 1), ("c3", 1)}  # the --topic filter sees the late names
    assert rows[("c1", 1)].topics == ["orders"] and rows[("c1", 1)].topic_ids == [tid]
    assert rows[("c1", 1)].errors[0].topic == "orders"
    assert rows[("c3", 1)].topics == ["orders"]  # counted once in every per-topic table
    everything = {(x.conn_id, x.correlation_id): x for x in L.load(spark, [str(tmp_path)]).requests.collect()}
    assert everything[("c1", 4)].errors[0].topic == "orders"  # its error is named though it names no topic
    assert r.connections.collect()[0].last_request_topics == ["orders"]
    assert r.topic_names == {tid: "orders"}  # the latest name learned wins
    unnamed = L.load(spark, [str(tmp_path)]).requests.where("correlation_id = 3").collect()[0]
    assert unnamed.topics == [gone]


def test_format_1_recording_reads_without_topic_ids(spark, tmp_path) -> None:
    """Format 1 had no requests.topic_ids and no topics/: read through Migration(1), the column is null."""
    old = pa.table({"proxy_id": ["p1"], "conn_id": ["c1"], "api_name": ["Fetch"], "topics": [["orders"]],
                    "req_first_ns": [T0]})
    d = tmp_path / "requests" / "proxy=p1" / "date=2026-11-20" / "hour=09"
    d.mkdir(parents=True)
    pq.write_table(old.replace_schema_metadata({rec.FORMAT_KEY: b"1"}), d / "part-v1.parquet")
    (row,) = L.load(spark, [str(tmp_path)]).requests.collect()
    assert row.topics == ["orders"] and row.topic_ids is None
