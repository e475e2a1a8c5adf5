"""The one reader: which files are live (for pyarrow and for Spark), and the version rule both paths share."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recording.migrations import Migration, RecordingFormatError, migrations_from, single_version
from recording.reader import dataset_version, live_files, read_recording, version_sample
from recording.sample_rows import SessionMix
from recording.schema import FORMAT_KEY, FORMAT_VERSION, arrow_schema

PART = "proxy=p1/date=2026-01-01/hour=00"


def _write(root: Path, rel: str, rows: int = 2, version: int = FORMAT_VERSION) -> Path:
    table = pa.Table.from_pylist(SessionMix(seed=len(rel)).rows(rows), schema=arrow_schema("requests"))
    path = root / "requests" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, FORMAT_KEY: str(version).encode()}), path)
    return path


def test_live_files_skip_hidden_and_superseded_and_keep_the_callers_spelling(tmp_path: Path, monkeypatch) -> None:
    for name in ("part-20260101T000000Z-abcd-00000001.parquet", "part-20260101T000000Z-abcd-00000002.parquet",
                 "part-20260101T000000Z-abcd-00000001-00000002.parquet", "part-20260101T000000Z-abcd-00000003.parquet",
                 ".tmp-part-20260101T000000Z-abcd-00000004.parquet", "_SUCCESS.parquet"):
        _write(tmp_path / "rec", f"{PART}/{name}")
    _write(tmp_path / "rec", f"{PART}/_temporary/part-x.parquet")
    (tmp_path / "rec" / "requests" / PART / "notes.txt").write_text("not data")
    want = (f"{PART}/part-20260101T000000Z-abcd-00000001-00000002.parquet",
            f"{PART}/part-20260101T000000Z-abcd-00000003.parquet")
    monkeypatch.chdir(tmp_path)
    listing = live_files("rec", "requests")
    assert listing.relative == want
    assert listing.uris == [f"rec/requests/{r}" for r in want]  # what Spark gets: relative stays relative
    assert listing.paths == [f"{tmp_path}/rec/requests/{r}" for r in want]  # what pyarrow opens
    assert live_files(f"file://{tmp_path}/rec", "requests").uris == [f"file://{tmp_path}/rec/requests/{r}" for r in want]
    assert read_recording("rec").num_rows == 4
    assert live_files("rec", "tcp").relative == ()  # absent dataset: nothing, not an error
    assert live_files("s3a://bucket/rec", "requests") is None  # pyarrow has no s3a: the caller falls back
    with pytest.raises(ValueError, match="unknown dataset"):
        live_files("rec", "nope")


def test_arrow_reader_migrates_each_file_on_its_own_spark_sample_refuses_mixed(tmp_path: Path, monkeypatch) -> None:
    from recording import migrations

    _write(tmp_path, "proxy=p1/date=2026-01-01/hour=00/part-a.parquet", rows=3, version=0)
    _write(tmp_path, "proxy=p1/date=2026-01-01/hour=01/part-b.parquet", rows=2)
    with pytest.raises(RecordingFormatError, match="no migration from version 0"):
        read_recording(tmp_path)
    monkeypatch.setitem(migrations.MIGRATIONS, 0, Migration(0))
    assert read_recording(tmp_path).num_rows == 5
    with pytest.raises(RecordingFormatError, match=rf"mixes recording format versions \[0, {FORMAT_VERSION}\].*part-a.parquet: 0"):
        dataset_version(live_files(tmp_path, "requests"))


def test_spark_sample_sees_a_version_that_only_the_middle_of_a_recording_holds(tmp_path: Path) -> None:
    """A second proxy of an older kafkatap recorded one hour among 30 of another's: its run's one file is read."""
    for hour in range(3):
        for seq in range(1, 11):
            _write(tmp_path, f"proxy=a/date=2026-01-01/hour={hour:02d}/part-20260101T000000Z-aaaa-{hour * 10 + seq:08d}.parquet")
    older = "proxy=b/date=2026-01-01/hour=01/part-20260101T010000Z-bbbb-00000001.parquet"
    _write(tmp_path, older, version=FORMAT_VERSION - 1)
    listing = live_files(tmp_path, "requests")
    assert older not in listing.time_ordered()[:8] + listing.time_ordered()[-8:]  # the old sample's blind spot
    assert older in version_sample(listing.time_ordered())
    assert len(version_sample(listing.time_ordered())) == 17  # 16 earliest and latest, one more run
    with pytest.raises(RecordingFormatError, match=rf"mixes recording format versions .*part-20260101T010000Z-bbbb"):
        dataset_version(listing)


def test_version_rule_messages() -> None:
    with pytest.raises(RecordingFormatError, match=f"version {FORMAT_VERSION + 1}, newer than.*upgrade kafkatap"):
        migrations_from(FORMAT_VERSION + 1, "x")
    assert migrations_from(FORMAT_VERSION, "x") == []
    assert single_version({}, "x") == FORMAT_VERSION
    assert single_version({"a": 1, "b": 1}, "x") == 1


def test_a_migration_serves_both_readers() -> None:
    with pytest.raises(ValueError, match="both the arrow and the spark step"):
        Migration(0, arrow=lambda t, ds: t)
    m = Migration(0, rename={"requests": {"api": "api_name"}}, drop={"requests": ["junk"]})
    t = m.to_arrow(pa.table({"api": ["Produce"], "junk": [1], "conn_id": ["c1"]}), "requests")
    assert t.column_names == ["api_name", "conn_id"]
    assert m.to_arrow(pa.table({"api": ["x"]}), "tcp").column_names == ["api"]  # per dataset

    class FakeDF:  # the DataFrame methods to_spark uses, recorded
        def __init__(self, calls: list) -> None:
            self.calls = calls

        def withColumnRenamed(self, old: str, new: str) -> "FakeDF":
            return FakeDF(self.calls + [("rename", old, new)])

        def drop(self, *cols: str) -> "FakeDF":
            return FakeDF(self.calls + [("drop", *cols)])

    assert m.to_spark(FakeDF([]), "requests").calls == [("rename", "api", "api_name"), ("drop", "junk")]


def test_an_unreadable_file_is_told_what_to_do_for_its_own_dataset() -> None:
    """A cut `runs/` file was told to 'analyze with --ignore-rollups': rollups stand in for requests files only."""
    from recording.reader import unreadable_file

    assert unreadable_file("/r/requests/proxy=a/date=2026-11-20/hour=09/part-1.parquet").endswith(
        "analyze with --ignore-rollups: the hour's stored rollups still count its rows")
    said = unreadable_file("/r/runs/proxy=a/date=2026-11-20/hour=09/part-1.parquet")
    assert said.endswith("(its rows are lost) and analyze again") and "rollups" not in said
