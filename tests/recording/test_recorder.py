"""ParquetRecorder with synthetic rows: round trip, metadata, drops, redaction, errors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from structlog.testing import capture_logs

from recording.latency_cells import CELL_KEYS, latency_cells, merge_cells
from recording.layout import file_range
from recording.rollups import CELLS, coverage_all, derived_path
from recording.schema import DERIVED_DATASETS
from recording.writer import ParquetRecorder, RecordingError, check_recording_dir, recover
from recording.sample_rows import SessionMix, connection_row, frame_row, tcp_row
from recording.reader import (
    Migration, RecordingFormatError, file_version, open_recording, read_recording, recording_files,
)
from recording.files import SORT_KEYS
from recording.schema import FORMAT_KEY, FORMAT_VERSION, TIMESTAMP, arrow_schema
from recording.timestamps import timestamp_columns, to_epoch_ns


def _flush_each(r: ParquetRecorder, mix: SessionMix, flushes: int, rows: int) -> None:
    """`flushes` flushes of `rows` request rows each from `mix`: that many flush files (one segment per hour).

    `r` must not flush on its own (flush_interval_s=3600): its timer, firing while a busy machine was still
    handing it one flush's rows, split them into two files."""
    for _ in range(flushes):
        for row in mix.rows(rows):
            r.request(row)
        r._flush(final=False)


def _files(root: Path, dataset: str) -> list[Path]:
    """Complete files only: `.tmp-*` ones are still being written."""
    return sorted((root / dataset).rglob("part-*.parquet"))


def test_round_trip_all_datasets(make_recorder, rec_dir: Path) -> None:
    r = make_recorder(capture="all")
    rows = SessionMix(proxy_id="p1").rows(3000)
    for row in rows:
        r.request(row)
    r.connection(connection_row("p1", "c00001"))
    r.tcp(tcp_row("p1", "c00001"))
    r.frame(frame_row("p1", "c00001", 3, b"\x00\x00\x00\x0c\x00\x03\x00\x0c\x00\x00\x00\x07", api_version=12))
    pair = {"proxy_id": "p1", "topic_id": "8f4c9b1e-1111-4000-8000-000000000001", "name": "orders",
            "first_seen_ns": rows[0]["req_first_ns"], "broker_addr": "10.0.0.1:9092", "cluster_id": "c1"}
    r.topic(pair)
    r.close()

    got = read_recording(rec_dir, "requests")
    assert got.num_rows == len(rows)
    assert got.schema.names[: len(arrow_schema("requests"))] == arrow_schema("requests").names
    key = lambda d: (d["conn_id"], d["correlation_id"])  # noqa: E731
    want = sorted(rows, key=key)
    assert {got.schema.field(c).type for c in timestamp_columns("requests")} == {TIMESTAMP}
    back = sorted(to_epoch_ns(got, "requests").to_pylist(), key=key)
    ts = set(timestamp_columns("requests"))
    for w, b in zip(want[:200], back[:200]):
        for k, v in w.items():
            # timestamps are stored in µs: the ns digits below are dropped, nothing else changes
            assert b[k] == (v // 1000 * 1000 if k in ts and v is not None else v), k
    assert set(got["proxy"].to_pylist()) == {"p1"}
    for ds in ("connections", "tcp", "frames"):
        assert read_recording(rec_dir, ds).num_rows == 1
    (back_pair,) = to_epoch_ns(read_recording(rec_dir, "topics", with_partitions=False), "topics").to_pylist()
    assert back_pair == {**pair, "first_seen_ns": pair["first_seen_ns"] // 1000 * 1000}
    for f in _files(rec_dir, "requests"):
        md = pq.read_metadata(f).metadata
        assert md[FORMAT_KEY] == str(FORMAT_VERSION).encode()
        assert md[b"kafkatap.dataset"] == b"requests"
        assert md[b"kafkatap.dropped_rows"] == b"0"
        rel = f.relative_to(rec_dir / "requests").parts
        assert rel[0] == "proxy=p1" and rel[1].startswith("date=") and rel[2].startswith("hour=")
        assert f.name.startswith("part-")
    assert not list(rec_dir.rglob(".tmp-*"))


def test_flush_happens_every_interval(make_recorder, rec_dir: Path) -> None:
    r = make_recorder(flush_interval_s=0.2, compact_interval_s=0)
    for row in SessionMix().rows(100):
        r.request(row)
    deadline = time.monotonic() + 3
    while not _files(rec_dir, "requests") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _files(rec_dir, "requests"), "nothing on disk within a few flush intervals"
    assert read_recording(rec_dir, "requests").num_rows == 100  # before close


def test_compaction_merges_flush_files(make_recorder, rec_dir: Path) -> None:
    r = make_recorder(flush_interval_s=0.05, compact_interval_s=0.3)
    mix = SessionMix()
    for _ in range(8):
        for row in mix.rows(200):
            r.request(row)
        time.sleep(0.07)
    r.close()
    files = _files(rec_dir, "requests")
    assert 1 <= len(files) <= 3, files
    assert any(f.name.count("-") == 4 for f in files), "a merged part-<run>-<first>-<last> file"
    assert read_recording(rec_dir, "requests").num_rows == 1600


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_final_requests_files_get_their_latency_cells(rec_dir: Path, writer: str) -> None:
    """Every requests file compaction is done with (merged, or alone in its segment) gets its cells; flush files do not."""
    r = ParquetRecorder(rec_dir, "p1", fsync=False, flush_interval_s=3600, compact_interval_s=3600, writer=writer).start()
    mix = SessionMix(proxy_id="p1")
    rows = mix.rows(1500)
    for row in rows:
        r.request(row)
    r.close()
    requests = _files(rec_dir, "requests")
    cells = _files(rec_dir, "latency_cells")
    assert requests and [derived_path(f, CELLS) for f in requests] == cells
    got = merge_cells(pq.read_table(f) for f in cells)
    want = latency_cells(read_recording(rec_dir, "requests", with_partitions=False))
    assert got.sort_by([(k, "ascending") for k in CELL_KEYS]).equals(want.sort_by([(k, "ascending") for k in CELL_KEYS]))
    assert sum(got.filter(pc.equal(got["dim"], "api_version"))["n"].to_pylist()) == sum(
        1 for row in rows if row.get("latency_us") is not None)


def test_merged_segments_get_cells_and_no_cells_without_compaction(make_recorder, rec_dir: Path, tmp_path: Path) -> None:
    r = make_recorder(compact_interval_s=3600, flush_interval_s=3600)
    mix = SessionMix()
    _flush_each(r, mix, flushes=3, rows=100)
    r.close()
    (merged,) = _files(rec_dir, "requests")
    assert merged.name.count("-") == 4 and derived_path(merged, CELLS).is_file()
    assert int(pq.read_metadata(derived_path(merged, CELLS)).metadata[b"kafkatap.source_rows"]) == 300
    off = ParquetRecorder(tmp_path / "off", "p1", fsync=False, compact_interval_s=0).start()
    for row in mix.rows(100):
        off.request(row)
    off.close()
    assert _files(tmp_path / "off", "requests") and not _files(tmp_path / "off", "latency_cells")


def _codecs(path: Path) -> set[str]:
    md = pq.read_metadata(path)
    return {md.row_group(g).column(c).compression for g in range(md.num_row_groups) for c in range(md.num_columns)}


def _is_sorted(path: Path, dataset: str) -> bool:
    t = pq.read_table(path)
    return t.equals(t.sort_by([(k, "ascending") for k in SORT_KEYS[dataset]]))


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_flush_files_are_interim_and_every_final_file_is_sorted_zstd(rec_dir: Path, writer: str) -> None:
    """While compaction is on, flush files are written the cheap way (lz4, as the rows came): compaction rewrites every
    one of them, a segment of a single flush file too, sorted and zstd-compressed. Without compaction each flush file
    is final, and written so."""
    r = ParquetRecorder(rec_dir, "p1", fsync=False, flush_interval_s=0.1, compact_interval_s=3600, writer=writer).start()
    mix = SessionMix(proxy_id="p1")
    for row in mix.rows(600):
        r.request(row)
    deadline = time.monotonic() + 10
    while not _files(rec_dir, "requests") and time.monotonic() < deadline:  # polls the disk: no event says "written"
        time.sleep(0.02)
    flushed = _files(rec_dir, "requests")  # one file, or two if a flush came while the rows were offered
    assert all({c.upper() for c in _codecs(f)} <= {"LZ4", "LZ4_RAW"} for f in flushed)
    assert not all(_is_sorted(f, "requests") for f in flushed)
    r.close()
    (final,) = _files(rec_dir, "requests")  # rewritten, even when its segment holds one flush file
    assert final not in flushed and final.name.count("-") == 4
    assert _codecs(final) == {"ZSTD"} and _is_sorted(final, "requests")
    assert pq.read_table(final).num_rows == 600 and derived_path(final, CELLS).is_file()

    off = rec_dir.parent / "off"
    r = ParquetRecorder(off, "p1", fsync=False, flush_interval_s=3600, compact_interval_s=0, writer=writer).start()
    for row in mix.rows(600):
        r.request(row)
    r.close()
    (kept,) = _files(off, "requests")
    assert _codecs(kept) == {"ZSTD"} and _is_sorted(kept, "requests")


T_HOUR = 1_795_165_200 * 10**9  # 2026-11-20 09:00 UTC


def test_the_writer_merges_an_hours_rollups(make_recorder, rec_dir: Path) -> None:
    """Several final requests files in one hour still open: at close their rollups are one file per dataset spanning them all."""
    r = make_recorder(compact_interval_s=3600)
    mix = SessionMix(start_ns=T_HOUR + 60 * 10**9)  # one hour, whenever the test runs
    stream = r._streams["requests"]
    for _ in range(3):
        for row in mix.rows(100):
            r.request(row)
        r._flush(final=False)
        # each segment final on its own, as compact_interval_s makes it: three requests files in one open hour
        (seg,) = [stream.segments.pop(d) for d in list(stream.segments)]
        r._compactor.submit(stream, seg)
    r.close()  # the hour is still open: merged at close
    requests = _files(rec_dir, "requests")
    (cells,) = _files(rec_dir, "latency_cells")
    assert len(requests) == 3 and {f.parent.relative_to(rec_dir / "requests") for f in requests} == {
        cells.parent.relative_to(rec_dir / "latency_cells")}
    spans = [file_range(f.name) for f in requests]
    assert file_range(cells.name) == (r.run, min(s[1] for s in spans), max(s[2] for s in spans))
    assert int(pq.read_metadata(cells).metadata[b"kafkatap.source_rows"]) == 300
    assert all(coverage_all(rec_dir).by_dataset[ds].complete and len(_files(rec_dir, ds)) == 1 for ds in DERIVED_DATASETS)


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_leaving_an_hour_merges_its_rollups_and_a_late_file_merges_again(rec_dir: Path, writer: str) -> None:
    """Rows of 09:00, then of 10:00 (09:00 is left: its file is final), then late rows of 09:00 (a second file there):
    at close each hour's rollups are one file per dataset spanning that hour's requests files, in both writer modes."""
    r = ParquetRecorder(rec_dir, "p1", fsync=False, flush_interval_s=3600, compact_interval_s=3600, writer=writer).start()
    flush = (lambda: r._ship(final=False)) if writer == "process" else (lambda: r._flush(final=False))
    for start, n in ((T_HOUR + 60 * 10**9, 100), (T_HOUR + 3660 * 10**9, 50), (T_HOUR + 1800 * 10**9, 70)):
        for row in SessionMix(start_ns=start).rows(n):
            r.request(row)
        flush()
    r.close()
    requests = _files(rec_dir, "requests")
    by_hour: dict[Path, list[Path]] = {}
    for f in requests:
        by_hour.setdefault(f.parent.relative_to(rec_dir / "requests"), []).append(f)
    assert sorted(len(v) for v in by_hour.values()) == [1, 2], requests
    for ds in DERIVED_DATASETS:
        assert coverage_all(rec_dir).by_dataset[ds].complete, ds
        files = _files(rec_dir, ds)
        assert {f.parent.relative_to(rec_dir / ds) for f in files} == set(by_hour) and len(files) == 2, (ds, files)
    for hour, files in by_hour.items():
        (cells,) = (rec_dir / CELLS / hour).glob("part-*.parquet")
        spans = [file_range(f.name) for f in files]
        assert file_range(cells.name)[1:] == (min(s[1] for s in spans), max(s[2] for s in spans))
        assert int(pq.read_metadata(cells).metadata[b"kafkatap.source_rows"]) == sum(pq.read_metadata(f).num_rows for f in files)


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_rollup_failure_is_counted_as_its_own_kind(rec_dir: Path, writer: str) -> None:
    """Rollups that cannot be written (a file where their dataset directory should be) lose no row: the
    requests are all written, and the error counts under "rollups", not as a write error, in both writer modes."""
    rec_dir.mkdir(parents=True, exist_ok=True)
    (rec_dir / CELLS).write_bytes(b"in the way")
    r = ParquetRecorder(rec_dir, "p1", fsync=False, flush_interval_s=3600, compact_interval_s=3600, writer=writer).start()
    for row in SessionMix(proxy_id="p1").rows(200):
        r.request(row)
    with capture_logs() as logs:
        r.close()
    assert sum(pq.read_metadata(f).num_rows for f in _files(rec_dir, "requests")) == 200
    assert r.dropped()["requests"] == 0
    errors = r.stats()["errors"]
    assert errors["rollups"] >= 1 and errors["write"] == errors["compaction"] == 0, errors
    if writer == "thread":  # the process writer logs from its own process
        (line,) = [e for e in logs if e.get("kind") == "rollups"]
        assert "kafkatap rollups" in line["fix"] and line["log_level"] == "error"


def test_rows_partitioned_by_their_own_hour(make_recorder, rec_dir: Path) -> None:
    r = make_recorder()
    base = 1_763_000_000 * 10**9 // (3600 * 10**9) * 3600 * 10**9  # an hour boundary
    mix = SessionMix(start_ns=base - 10**9, rate_per_s=1000)  # 1 s before the hour, 2 s of rows
    for row in mix.rows(2000):
        r.request(row)
    r.close()
    hours = {f.parent.name for f in _files(rec_dir, "requests")}
    assert len(hours) == 2
    t = read_recording(rec_dir, "requests")
    for h, ts in zip(t["hour"].to_pylist(), t["req_first_ns"].to_pylist()):
        assert h == ts.hour  # a timestamp[us, UTC]: the datetime's own hour


def test_full_queue_drops_counts_logs_never_blocks(make_recorder, rec_dir: Path) -> None:
    r = make_recorder(queue_rows=100, flush_interval_s=30)  # the writer will not drain during the test
    rows = SessionMix().rows(1000)
    with capture_logs() as logs:
        t0 = time.perf_counter()
        for row in rows:
            r.request(row)
        per_row_us = (time.perf_counter() - t0) / len(rows) * 1e6
        assert per_row_us < 50, "enqueue must be O(1) and non-blocking"
        assert r.dropped()["requests"] == 900
        assert r.queue_depth()["requests"] == 100
        r.close()
    warnings = [e for e in logs if e["log_level"] == "warning" and "dropped" in e["event"]]
    assert warnings and warnings[0]["dropped"] == 900 and warnings[0]["dataset"] == "requests"
    files = _files(rec_dir, "requests")
    assert sum(int(pq.read_metadata(f).metadata[b"kafkatap.dropped_rows"]) for f in files) == 900
    assert read_recording(rec_dir, "requests").num_rows == 100


def test_close_loses_nothing_under_steady_load(make_recorder, rec_dir: Path) -> None:
    r = make_recorder(flush_interval_s=0.05, compact_interval_s=0.2)
    mix = SessionMix()
    n = 0
    t_end = time.monotonic() + 1.0
    while time.monotonic() < t_end:
        for row in mix.rows(500):
            r.request(row)
            n += 1
        time.sleep(0.01)
    r.close()
    assert r.dropped()["requests"] == 0
    assert read_recording(rec_dir, "requests").num_rows == n


def test_sasl_authenticate_frames_never_written(make_recorder, rec_dir: Path) -> None:
    secret = b"\x00alice\x00s3cr3t-passw0rd"
    r = make_recorder(capture="all")
    sasl_req = len(secret).to_bytes(4, "big") + b"\x00\x24\x00\x02" + secret
    r.frame(frame_row("p1", "c1", 36, sasl_req, api_version=2))
    r.frame(frame_row("p1", "c1", 36, b"\x00\x00\x00\x08" + secret, direction="response"))
    # a row that lies about its api key: the header inside the bytes says 36
    r.frame(frame_row("p1", "c1", 3, sasl_req, api_version=2))
    # raw SASL token (v0 handshake): no Kafka header to verify
    r.frame(frame_row("p1", "c1", 3, secret))
    ok = b"\x00\x00\x00\x0c\x00\x03\x00\x0c\x00\x00\x00\x07"
    r.frame(frame_row("p1", "c1", 3, ok, api_version=12))
    r.close()
    assert r.frames_redacted == 4
    t = read_recording(rec_dir, "frames")
    assert t["data"].to_pylist() == [ok]
    for f in rec_dir.rglob("*"):
        if f.is_file():
            assert b"s3cr3t" not in f.read_bytes()


@pytest.mark.parametrize("api_key", [38, 39, 40, 41, 51])
def test_frames_carrying_credentials_are_never_written(make_recorder, rec_dir: Path, api_key: int) -> None:
    """Delegation tokens' HMACs (38-41) and SCRAM salted passwords (51) are credentials, as SaslAuthenticate's are."""
    secret = b"hmac-or-salted-password"
    r = make_recorder(capture="all")
    req = (len(secret) + 4).to_bytes(4, "big") + api_key.to_bytes(2, "big") + b"\x00\x00" + secret
    r.frame(frame_row("p1", "c1", api_key, req, api_version=0))
    r.frame(frame_row("p1", "c1", api_key, b"\x00\x00\x00\x08" + secret, direction="response"))
    r.close()
    assert r.frames_redacted == 2
    assert not list((rec_dir / "frames").rglob("*.parquet"))


def test_capture_modes(make_recorder, tmp_path: Path) -> None:
    req = frame_row("p1", "c1", 3, b"\x00\x00\x00\x0c\x00\x03\x00\x0c\x00\x00\x00\x07", api_version=12)
    resp = frame_row("p1", "c1", 3, b"\x00\x00\x00\x04\x00\x00\x00\x07", direction="response", api_version=12)
    counts = {}
    for mode in ("none", "requests", "all"):
        r = make_recorder(root=tmp_path / mode, capture=mode)
        r.frame(dict(req))
        r.frame(dict(resp))
        r.close()
        counts[mode] = read_recording(tmp_path / mode, "frames").num_rows
    assert counts == {"none": 0, "requests": 1, "all": 2}


def test_bad_row_is_dropped_not_the_batch(make_recorder, rec_dir: Path) -> None:
    r = make_recorder()
    rows = SessionMix().rows(50)
    bad = dict(rows[0], api_key="not-a-number")
    for row in rows[1:25] + [bad] + rows[25:]:
        r.request(row)
    r.close()
    assert read_recording(rec_dir, "requests").num_rows == 49
    assert r.dropped()["requests"] == 1


def test_unwritable_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(RecordingError, match="cannot write recordings to .*a-file"):
        check_recording_dir(blocker / "rec")
    with pytest.raises(RecordingError, match="cannot write recordings"):
        ParquetRecorder(blocker / "rec", "p1").start()


def test_too_little_free_space_at_start_is_a_warning_and_the_rows_are_counted_as_dropped(tmp_path: Path,
                                                                                         capsys) -> None:
    """It refused to start, so a proxy restarted on a low disk took the clients' path to Kafka away: now it warns,
    starts, and the writer drops (and counts) rows while the disk is below its floor, as a running one does."""
    r = ParquetRecorder(tmp_path / "rec", "p1", min_free_bytes=1 << 62, fsync=False, writer="thread").start()
    for row in SessionMix().rows(10):
        r.request(row)
    r.close()
    said = capsys.readouterr()
    assert "recording directory low on space" in said.out + said.err and "the proxy forwards" in said.out + said.err
    assert r.dropped()["requests"] == 10 and r.stats()["rows_written"]["requests"] == 0


def test_disk_failure_at_runtime_drops_and_counts(make_recorder, rec_dir: Path, monkeypatch) -> None:
    r = make_recorder(flush_interval_s=30)
    for row in SessionMix().rows(10):
        r.request(row)

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", boom)
    with capture_logs() as logs:
        r._flush(final=False)
    monkeypatch.undo()
    assert r.dropped()["requests"] == 10
    assert any(e["event"].startswith("recording write failed") for e in logs)
    assert not list(rec_dir.rglob(".tmp-*"))
    for row in SessionMix(seed=9).rows(5):
        r.request(row)
    r.close()
    files = _files(rec_dir, "requests")
    assert [pq.read_metadata(f).metadata[b"kafkatap.dropped_rows"] for f in files] == [b"10"]


def test_recover_removes_tmp_and_superseded(rec_dir: Path) -> None:
    d = rec_dir / "requests" / "proxy=p1" / "date=2026-01-01" / "hour=00"
    d.mkdir(parents=True)
    t = arrow_schema("requests").empty_table()
    for name in ("part-20260101T000000Z-abcd-00000001.parquet", "part-20260101T000000Z-abcd-00000002.parquet",
                 "part-20260101T000000Z-abcd-00000001-00000002.parquet",
                 "part-20260101T000000Z-abcd-00000003.parquet"):
        pq.write_table(t, d / name)
    (d / ".tmp-part-20260101T000000Z-abcd-00000004.parquet").write_bytes(b"PAR1 half")
    assert [p.name for p in recording_files(rec_dir, "requests")] == [
        "part-20260101T000000Z-abcd-00000001-00000002.parquet", "part-20260101T000000Z-abcd-00000003.parquet"]
    assert recover(rec_dir) == 3
    assert sorted(p.name for p in d.iterdir()) == [
        "part-20260101T000000Z-abcd-00000001-00000002.parquet", "part-20260101T000000Z-abcd-00000003.parquet"]


def _write_versioned(path: Path, version: int, table: pa.Table) -> None:
    md = dict(table.schema.metadata or {})
    md[FORMAT_KEY] = str(version).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(md), path)


def test_reader_refuses_newer_format(rec_dir: Path) -> None:
    d = rec_dir / "requests" / "proxy=p1" / "date=2026-01-01" / "hour=00"
    _write_versioned(d / "part-x-00000001.parquet", FORMAT_VERSION + 1, arrow_schema("requests").empty_table())
    with pytest.raises(RecordingFormatError, match=f"version {FORMAT_VERSION + 1}.*upgrade kafkatap"):
        read_recording(rec_dir, "requests")
    with pytest.raises(RecordingFormatError, match="upgrade kafkatap"):
        open_recording(rec_dir, "requests")


def test_reader_migrates_older_format(rec_dir: Path, monkeypatch) -> None:
    from recording import reader as recording_reader

    # an "older" file: fewer columns, a renamed one (what a migration step fixes)
    old = pa.table({"proxy_id": ["p1"], "conn_id": ["c1"], "correlation_id": pa.array([5], pa.int32()),
                    "api": ["Produce"]})
    d = rec_dir / "requests" / "proxy=p1" / "date=2026-01-01" / "hour=00"
    _write_versioned(d / "part-x-00000001.parquet", 0, old)
    monkeypatch.setitem(recording_reader.MIGRATIONS, 0, Migration(0, rename={"requests": {"api": "api_name"}}))
    t = read_recording(rec_dir, "requests")
    assert t.num_rows == 1 and t["api_name"].to_pylist() == ["Produce"]
    assert t["api_key"].to_pylist() == [None]
    assert file_version(d / "part-x-00000001.parquet") == 0


def test_reader_refuses_foreign_parquet(rec_dir: Path) -> None:
    d = rec_dir / "requests" / "proxy=p1" / "date=2026-01-01" / "hour=00"
    d.mkdir(parents=True)
    pq.write_table(pa.table({"x": [1]}), d / "part-foreign.parquet")
    with pytest.raises(RecordingFormatError, match="not a kafkatap recording"):
        read_recording(rec_dir, "requests")


def test_open_recording_is_lazy_dataset_with_partitions(make_recorder, rec_dir: Path) -> None:
    r = make_recorder()
    for row in SessionMix().rows(500):
        r.request(row)
    r.close()
    ds = open_recording(rec_dir, "requests")
    t = ds.to_table(columns=["api_name", "proxy", "hour"], filter=pads.field("api_key") == 0)
    assert t.num_rows > 0 and set(t["proxy"].to_pylist()) == {"p1"}
    assert set(t["api_name"].to_pylist()) == {"Produce"}


def test_bytes_per_request_row_within_target(make_recorder, rec_dir: Path) -> None:
    """A typical produce/fetch mix at 20k req/s and 1 s flushes stays within 40 B per row on disk."""
    r = make_recorder(flush_interval_s=30, compact_interval_s=0)
    for row in SessionMix().rows(20_000):
        r.request(row)
    r.close()
    size = sum(f.stat().st_size for f in _files(rec_dir, "requests"))
    assert size / 20_000 <= 40, f"{size / 20_000:.1f} B/row"
    assert os.path.getsize(_files(rec_dir, "requests")[0]) == size


def test_startup_recovery_only_touches_own_proxy(rec_dir: Path) -> None:
    mine = rec_dir / "requests" / "proxy=p1" / "date=2026-01-01" / "hour=00"
    other = rec_dir / "requests" / "proxy=p2" / "date=2026-01-01" / "hour=00"
    for d in (mine, other):
        d.mkdir(parents=True)
        (d / ".tmp-part-20260101T000000Z-abcd-00000009.parquet").write_bytes(b"in progress")
    r = ParquetRecorder(rec_dir, "p1", fsync=False).start()
    r.close()
    assert not list(mine.glob(".tmp-*"))
    assert list(other.glob(".tmp-*")), "another proxy's file being written must survive"


def test_a_recording_directory_deleted_under_the_writer_is_made_again(make_recorder, rec_dir: Path) -> None:
    """The free-space check raised on the missing directory before any write: rows were lost, never counted, and
    recording stopped until someone made the directory again."""
    import shutil

    r = make_recorder(flush_interval_s=3600, compact_interval_s=0)
    mix = SessionMix()
    for row in mix.rows(50):
        r.request(row)
    r._flush(final=False)
    shutil.rmtree(rec_dir)
    for row in mix.rows(70):
        r.request(row)
    r._flush(final=False)
    r.close()
    assert r.dropped()["requests"] == 0 and r.errors["write"] == 0
    assert read_recording(rec_dir, "requests").num_rows == 70


def test_rows_a_flush_fails_on_before_writing_are_counted_as_dropped(make_recorder, monkeypatch) -> None:
    r = make_recorder(flush_interval_s=3600, compact_interval_s=0)
    for row in SessionMix().rows(40):
        r.request(row)

    def refuse(*_a, **_k):
        raise ValueError("cannot split (test)")

    monkeypatch.setattr(r, "_split_by_hour", refuse)
    r._flush(final=False)
    assert r.dropped()["requests"] == 40 and r.errors["write"] == 1 and r.queue_depth()["requests"] == 0


def test_captured_payloads_are_readable_by_the_proxys_user_only(make_recorder, rec_dir: Path) -> None:
    """frames/ files followed the umask (0644): with --capture, what clients produced was readable by every local
    user. They are 0600 whatever the umask; the other datasets (metadata) keep it."""
    import stat

    old = os.umask(0o022)
    try:
        r = make_recorder(capture="all")
        r.frame(frame_row("p1", "c1", 3, b"\x00\x00\x00\x0c\x00\x03\x00\x0c\x00\x00\x00\x07", api_version=12))
        for row in SessionMix().rows(5):
            r.request(row)
        r.close()
    finally:
        os.umask(old)
    modes = {f.relative_to(rec_dir).parts[0]: stat.S_IMODE(f.stat().st_mode) for f in rec_dir.rglob("part-*.parquet")}
    assert modes["frames"] == 0o600 and modes["requests"] == 0o644, modes


def _derived_tables(root: Path) -> dict[str, tuple[list[dict], list[dict]]]:
    """Every derived dataset's rows, in a stable order, and its files' kafkatap footers (run, range, source rows …)."""
    out = {}
    for ds in DERIVED_DATASETS:
        rows = [r for f in _files(root, ds) for r in pq.read_table(f).to_pylist()]
        footers = [{k: v for k, v in pq.read_metadata(f).metadata.items() if k.startswith(b"kafkatap.")}
                   for f in _files(root, ds)]
        out[ds] = (sorted(rows, key=repr), footers)
    return out


def test_merged_files_rollups_folded_while_merging_equal_those_read_back(make_recorder, rec_dir: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction folds a merged requests file's rollups from the batches it writes (no read-back): they equal
    what reading the merged file gives, batch size and order notwithstanding."""
    import recording.compaction as compaction
    import recording.rollups as rollups

    read_back = []
    monkeypatch.setattr(rollups, "write_rollups",
                        lambda path, fsync=True, _w=rollups.write_rollups: read_back.append(path) or _w(path, fsync))
    monkeypatch.setattr(compaction, "MERGE_BATCH_BYTES", 200_000)  # several merged batches, each folded
    r = make_recorder(compact_interval_s=3600, flush_interval_s=3600)
    mix = SessionMix(start_ns=T_HOUR + 60 * 10**9, rate_per_s=2000)
    _flush_each(r, mix, flushes=4, rows=1500)
    r.close()
    (merged,) = _files(rec_dir, "requests")
    assert file_range(merged.name)[1:] == (1, 4) and read_back == []  # merged, rollups not read back
    folded = _derived_tables(rec_dir)
    assert all(folded[ds][0] for ds in ("latency_cells", "request_sums", "topic_sums")), folded.keys()
    monkeypatch.undo()
    rollups.write_rollups(merged, fsync=False)  # the same file's rollups, read back: overwrite in place
    assert _derived_tables(rec_dir) == folded


def test_a_fold_that_fails_leaves_the_merge_and_reads_the_file_back(make_recorder, rec_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Rollups are derived data: a failure while folding them neither stops the merge nor loses the rollups."""
    import recording.rollups as rollups

    real_add, calls = rollups.RollupFold.add, []

    def first_fails(self, table):  # the merge's fold fails; reading the file back afterwards works
        calls.append(table.num_rows)
        if len(calls) == 1:
            raise pa.ArrowInvalid("folding failed")
        real_add(self, table)

    monkeypatch.setattr(rollups.RollupFold, "add", first_fails)
    r = make_recorder(compact_interval_s=3600, flush_interval_s=3600)
    mix = SessionMix(start_ns=T_HOUR + 60 * 10**9)
    _flush_each(r, mix, flushes=2, rows=300)
    with capture_logs() as logs:
        r.close()
    (merged,) = _files(rec_dir, "requests")
    assert pq.read_metadata(merged).num_rows == 600 and calls[0] == 600 and len(calls) >= 2
    assert r.stats()["errors"] == dict.fromkeys(r.stats()["errors"], 0)  # nothing lost: said, not counted
    (said,) = [e for e in logs if "folding" in e["event"]]
    assert said["log_level"] == "warning" and "folding failed" in said["error"] and said["file"] == str(merged)
    assert coverage_all(rec_dir).by_dataset[CELLS].complete
    (cells,) = _files(rec_dir, CELLS)
    assert int(pq.read_metadata(cells).metadata[b"kafkatap.source_rows"]) == 600


def test_a_merge_whose_inputs_cannot_be_deleted_still_gets_its_rollups(make_recorder, rec_dir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The merged file is complete when its inputs' deletion fails: the error is counted as compaction's, readers
    skip the superseded inputs, and the merged file still gets its rollups (its fold is not left behind)."""
    import recording.compaction as compaction

    def cannot_delete(seg):
        raise PermissionError("read-only directory")

    monkeypatch.setattr(compaction, "remove_inputs", cannot_delete)
    r = make_recorder(compact_interval_s=3600, flush_interval_s=3600)
    mix = SessionMix(start_ns=T_HOUR + 60 * 10**9)
    _flush_each(r, mix, flushes=2, rows=300)
    r.close()
    assert r.stats()["errors"]["compaction"] == 1 and r.stats()["errors"]["rollups"] == 0
    assert r._folds == {}
    assert read_recording(rec_dir, "requests").num_rows == 600  # the inputs are still there, counted once
    assert coverage_all(rec_dir).by_dataset[CELLS].complete


def test_a_lone_interim_file_whose_rewrite_fails_is_final_as_it_is(tmp_path: Path) -> None:
    """Compaction cannot rewrite a segment's one interim flush file (a full disk): the file stays, complete, and is
    handed on as final (its rollups are read back from it), as a lone flush file always was."""
    from recording.compaction import Compactor, FlushFile, Segment

    def full_disk(*_args) -> int:
        raise OSError(28, "No space left on device")

    errors, finals = [], []
    path = tmp_path / "part-20261130T000000Z-abcd-00000001.parquet"
    c = Compactor("20261130T000000Z-abcd", full_disk, lambda kind, *a, **k: errors.append(kind),
                  lambda stream, p, closes: finals.append(p))
    seg = Segment(tmp_path, 0.0, [FlushFile(1, path, 10, 0, interim=True)], closes=True)
    stream = type("Stream", (), {"name": "requests", "schema": arrow_schema("requests")})()
    assert c.merge(stream, seg) == path
    assert errors == ["compaction"] and finals == [path]
