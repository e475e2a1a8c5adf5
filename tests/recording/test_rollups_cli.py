"""`kafkatap rollups DIR`: backfills an older recording's rollups and merges each hour's; `--check` writes nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from analytics.synthetic import RUN, generate, write_rows
from kafkatap.cli import cli
from recording.reader import file_version
from recording.rollups import coverage_all, merge_hour, rollup_version
from recording.schema import DERIVED_DATASETS, FORMAT_KEY, FORMAT_VERSION, ROLLUP_KEY, ROLLUP_VERSION
from tests.analytics.analytics_rows import conn, req


def test_backfill_writes_merges_and_checks(tmp_path: Path) -> None:
    root = tmp_path / "rec"
    generate(root, 3000, rollups=False)  # a recording as an older proxy left it
    for i in range(2):  # two more requests files in an hour that already has one: that hour merges
        write_rows(root, "requests", [req(f"late-{i}", 1, t_s=600 + i)])
    for ds in ("latency_cells", "request_sums"):  # write_rows gave the late files theirs; the backfill must not mind
        assert any((root / ds).rglob("*.parquet"))
    before = coverage_all(root)
    assert before is not None and not before.complete
    runner = CliRunner()
    checked = runner.invoke(cli, ["rollups", str(root), "--check"])
    assert checked.exit_code == 1 and "without all their rollups" in checked.output
    assert coverage_all(root).uncovered == before.uncovered  # --check wrote nothing
    done = runner.invoke(cli, ["rollups", str(root)])
    assert done.exit_code == 0, done.output
    assert f"wrote rollups for {len(before.uncovered)} requests files" in done.output
    assert "merged the rollups of 1 partition directories" in done.output
    after = coverage_all(root)
    assert after is not None and after.complete
    hours = {p.parent for p in (root / "requests").rglob("*.parquet")}
    assert len(list((root / "latency_cells").rglob("*.parquet"))) == len(hours)  # one merged file per hour
    assert runner.invoke(cli, ["rollups", str(root), "--check"]).exit_code == 0


def test_a_directory_without_requests_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["rollups", str(tmp_path)])
    assert result.exit_code != 0 and "holds no requests files" in result.output


def test_a_recording_of_tls_pass_through_only_has_nothing_to_roll_up(tmp_path: Path) -> None:
    """Every connection opaque (TLS relayed as it is): connections/ and tcp/, no requests/ at all, as a proxy writes it.

    It used to be refused like an empty directory ("holds no requests files (record one …)", exit 1), though it is
    a recording and lacks no rollup.
    """
    root = tmp_path / "rec"
    tls = "request stream opaque at offset 0: tls: TLS ClientHello/handshake (0x16 0x03 0x01): the connection is encrypted"
    rows = [conn(f"t{i}", i, i + 30, client_ids=[], requests=0, responses=0, tls=True, opaque=True, opaque_reason=tls)
            for i in range(3)]
    rows.append({**rows[0], "final": False, "closed_ns": None, "end_reason": "open"})  # a snapshot of t0: counted once
    write_rows(root, "connections", rows)
    for args in (["--check"], []):
        result = CliRunner().invoke(cli, ["rollups", str(root), *args])
        assert result.exit_code == 0, result.output
        assert result.output == (f"{root}: no requests files, so no rollups to write: 3 connection(s) recorded, "
                                 "3 of them opaque (3 TLS passed through), and no Kafka request\n")
    assert sorted(p.name for p in root.iterdir()) == ["connections"]  # nothing written
    assert not any((root / ds).exists() for ds in DERIVED_DATASETS)


def test_rollups_of_another_format_are_not_used_and_are_rewritten(tmp_path: Path) -> None:
    """Derived data is never migrated: rollups of another format version count as missing until rewritten."""
    root = tmp_path / "rec"
    generate(root, 2000)
    assert coverage_all(root).complete
    for path in (root / "topic_sums").rglob("*.parquet"):  # as a future (or older) kafkatap would have left them
        table = pq.read_table(path)
        pq.write_table(table.replace_schema_metadata({**table.schema.metadata, FORMAT_KEY: b"99"}), path)
    cover = coverage_all(root)
    stale = cover.by_dataset["topic_sums"]
    assert not cover.complete and not stale.complete and stale.files == () and "99" in (stale.stale or "")
    assert cover.by_dataset["request_sums"].complete  # the others still serve
    done = CliRunner().invoke(cli, ["rollups", str(root)])
    assert done.exit_code == 0, done.output
    again = coverage_all(root)
    assert again.complete and all(file_version(p) == FORMAT_VERSION for p in (root / "topic_sums").rglob("*.parquet"))


def _as_an_older_kafkatap_left_them(root: Path, datasets: tuple[str, ...] = DERIVED_DATASETS) -> dict[Path, pa.Table]:
    """Strip the rollup version from every derived file (written before the key existed: version 1) and empty it
    (rows computed under older rules: not these); returns what each file held."""
    fresh = {}
    for ds in datasets:
        for path in (root / ds).rglob("*.parquet"):
            table = pq.read_table(path)
            fresh[path] = table.replace_schema_metadata(None)
            old = {k: v for k, v in table.schema.metadata.items() if k != ROLLUP_KEY}
            pq.write_table(table.slice(0, 0).replace_schema_metadata(old), path)
    assert fresh
    return fresh


def test_rollups_of_an_older_rollup_version_are_recomputed_not_read(tmp_path: Path) -> None:
    """Rollups computed under older rules (no kafkatap.rollup_version) are stale as another format's are: none is read,
    `kafkatap rollups` deletes and recomputes them from the requests, which stay readable as they are."""
    root = tmp_path / "rec"
    generate(root, 2000)
    assert coverage_all(root).complete
    fresh = _as_an_older_kafkatap_left_them(root)
    cover = coverage_all(root)
    assert not cover.complete
    for ds, c in cover.by_dataset.items():
        assert c.files == () and f"rollup version 1, not {ROLLUP_VERSION}" in (c.stale or ""), ds
    assert all(file_version(p) == FORMAT_VERSION for p in (root / "requests").rglob("*.parquet"))
    done = CliRunner().invoke(cli, ["rollups", str(root)])
    assert done.exit_code == 0, done.output
    assert coverage_all(root).complete
    for path, table in fresh.items():  # recomputed: the rows of the current rules, the current version
        assert rollup_version(pq.read_metadata(path).metadata) == ROLLUP_VERSION
        assert pq.read_table(path).replace_schema_metadata(None).equals(table), path


def test_merging_rollups_of_an_older_version_keeps_them_stale(tmp_path: Path) -> None:
    """A merge computes nothing anew: an hour merged from older rollups is as old as they are, so still not read."""
    root = tmp_path / "rec"
    for i in range(2):
        write_rows(root, "requests", [req(f"c{i}", 1, t_s=10 + i)])
    _as_an_older_kafkatap_left_them(root, ("latency_cells",))
    (directory,) = {p.parent for p in (root / "requests").rglob("*.parquet")}
    assert merge_hour(directory, RUN, fsync=False) == len(DERIVED_DATASETS)
    (merged,) = (root / "latency_cells").rglob("*.parquet")
    assert rollup_version(pq.read_metadata(merged).metadata) == 1
    (current,) = (root / "request_sums").rglob("*.parquet")
    assert rollup_version(pq.read_metadata(current).metadata) == ROLLUP_VERSION
    cover = coverage_all(root)
    assert cover.by_dataset["latency_cells"].stale and cover.by_dataset["request_sums"].complete


def test_a_file_cut_short_is_named_in_one_line_not_a_traceback(tmp_path: Path) -> None:
    """`rollups` is for recordings left by a crash, which is when a file lacks its footer."""
    for dataset in ("requests", "connections"):  # the second: a recording without requests files
        root = tmp_path / dataset
        cut = root / dataset / "proxy=x/date=2026-11-20/hour=09/part-20261120T090000Z-abcd-00000001.parquet"
        cut.parent.mkdir(parents=True)
        cut.write_bytes(b"PAR1\x00")
        result = CliRunner().invoke(cli, ["rollups", str(root)])
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output and f"Error: cannot read {cut}" in result.output, result.output
        assert "cut short by a crash" in result.output


def test_requests_files_written_before_a_column_was_added_still_roll_up(tmp_path: Path) -> None:
    """A file of this format from before `topic_record_bytes` existed: the column reads as nulls, as the readers make it."""
    root = tmp_path / "rec"
    generate(root, 2000, rollups=False)
    for path in (root / "requests").rglob("*.parquet"):
        table = pq.read_table(path, partitioning=None)
        pq.write_table(table.drop_columns(["topic_record_bytes"]).replace_schema_metadata(table.schema.metadata), path)
    done = CliRunner().invoke(cli, ["rollups", str(root)])
    assert done.exit_code == 0, done.output
    assert coverage_all(root).complete


def _without_rollups(root: Path, files: list[Path]) -> None:
    """Remove the rollups of `files` (requests files): as a proxy's flush files are before compaction."""
    for f in files:
        rel = f.relative_to(root / "requests")
        for ds in DERIVED_DATASETS:
            (root / ds / rel).unlink(missing_ok=True)


def test_the_last_two_hours_are_left_alone_unless_asked(tmp_path: Path) -> None:
    """Beside a running proxy, rolling up the hour it still flushed and compacted counted rows twice (26,400 rows
    in the rollups of 20,400 requests), and the analysis summed them. The hours it may still write are left."""
    import time

    root = tmp_path / "rec"
    now = time.time_ns()
    old = write_rows(root, "requests", [req("o1", 1, t_s=0)])  # 2026-11-20 09:00
    live = write_rows(root, "requests", [req("n1", 1, req_first_ns=now, req_last_ns=now, req_sent_ns=now)])
    _without_rollups(root, old + live)
    runner = CliRunner()
    checked = runner.invoke(cli, ["rollups", str(root), "--check"])
    assert checked.exit_code == 1, checked.output
    assert checked.output == (f"{root}: 2 requests files, 1 without all their rollups; left alone: 1 in the last two "
                              "hours (a proxy may still be writing them: --include-recent)\n")
    done = runner.invoke(cli, ["rollups", str(root)])
    assert done.exit_code == 0 and "wrote rollups for 1 requests files" in done.output, done.output
    assert set(coverage_all(root).uncovered) == {str(p.relative_to(root / "requests")) for p in live}
    assert runner.invoke(cli, ["rollups", str(root), "--check"]).exit_code == 0  # what it would write is written
    done = runner.invoke(cli, ["rollups", str(root), "--include-recent"])
    assert done.exit_code == 0 and "wrote rollups for 1 requests files" in done.output, done.output
    assert coverage_all(root).complete


def test_files_of_an_older_format_do_not_keep_check_failing(tmp_path: Path) -> None:
    """An older-format file cannot get rollups (the analysis reads its requests): `--check` exited 1 for ever."""
    from tests.recording.test_timestamps import _write_old

    root = tmp_path / "rec"
    _write_old(root, 2)
    runner = CliRunner()
    checked = runner.invoke(cli, ["rollups", str(root), "--check"])
    assert checked.exit_code == 0, checked.output
    assert "0 without all their rollups; left alone: 1 of an older format" in checked.output
    assert "skipped 1 of an older format" in runner.invoke(cli, ["rollups", str(root)]).output


def test_a_damaged_rollup_or_requests_file_is_named_in_one_line(tmp_path: Path) -> None:
    """A rollup file with a sound footer and damaged pages failed the hour's merge with a traceback
    (`Couldn't deserialize thrift`), and so did such a requests file when its rollups were computed."""
    root = tmp_path / "rec"
    files = [f for i in range(3) for f in write_rows(root, "requests", [req(f"c{i}", 1, t_s=10 + i)])]
    cells = sorted((root / "latency_cells").rglob("*.parquet"))
    assert len(cells) == 3  # one hour, three files: the merge reads each
    _damage_pages(cells[1])
    res = CliRunner().invoke(cli, ["rollups", str(root)])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"Error: cannot read {cells[1]} (" in res.output and "delete it and run `kafkatap rollups` again" in res.output
    cells[1].unlink()  # as the line says
    _without_rollups(root, files[:1])
    _damage_pages(files[0])
    res = CliRunner().invoke(cli, ["rollups", str(root)])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"Error: cannot read {files[0]} (" in res.output and "move it out of the recording" in res.output


def _damage_pages(path: Path) -> None:
    """Overwrite the data pages, keep the footer: pyarrow opens the file and fails reading it."""
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    data[4:len(data) - footer] = bytes([0xFF]) * (len(data) - footer - 4)
    path.write_bytes(bytes(data))


def test_a_rollup_that_cannot_be_written_is_not_blamed_on_its_requests_file(tmp_path: Path) -> None:
    """A write that failed (here latency_cells/ is a file, as a full disk or a read-only directory fails it) was said
    as "cannot read <requests file> … move it out of the recording (its rows are lost)": good rows thrown away."""
    root = tmp_path / "rec"
    files = write_rows(root, "requests", [req("c1", 1, t_s=10)])
    _without_rollups(root, files)
    import shutil

    shutil.rmtree(root / "latency_cells")
    (root / "latency_cells").write_text("in the way")
    res = CliRunner().invoke(cli, ["rollups", str(root)])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"Error: cannot write rollups in {root}: " in res.output and "move it out" not in res.output
