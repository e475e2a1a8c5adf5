"""Rollup files: what the analysis would sum from each final requests file, written beside it.

Layout: the rollups of `DIR/requests/<partition>/<name>` are `DIR/<dataset>/<partition>/<name>`
for each derived dataset (`recording.schema.DERIVED_DATASETS`): the latency cells
(`recording.latency_cells`), the request, topic and traffic sums, the notable rows and
the slowest requests (`recording.request_sums`). A requests file gets them once it is final — when
compaction merged it, or left it alone as the only file of its segment — so a live
proxy writes a handful of small files a minute, never one per flush. A merged file's rollups are
folded from the batches as compaction writes them (`RollupFold`), not read back afterwards. When the writer leaves
an hour (or closes), it merges that hour's rollups of its run into one file per dataset named
for the range of sequence numbers it spans (`merge_hour`), as compaction does for flush files.

Files are written as every file of a recording is (dot-file, fsync, rename), rollups after
their requests file: a crash in between leaves a requests file without them, which an
analysis treats as not covered (it reads the requests instead) until `write_missing` (`kafkatap
rollups DIR`) fills it in. Nothing runs that on its own: the analysis stays correct, only slower.

The name is the link, so the reader needs no index: a requests file is covered by its namesake
or by a merged rollup of its run whose range spans its own (`coverage`); an analysis uses a
derived dataset when every live requests file is covered there, and ignores files whose
requests file is gone. A merged rollup stands for its whole range, so data is deleted by whole
partition directories of every dataset (an hour), not a requests file at a time.

Each derived file's footer carries the rollup version (`kafkatap.rollup_version`, ROLLUP_VERSION) beside the
format version: the rules it was computed under (what a long poll is …). A dataset whose files are of another
format or rollup version is stale: not read, and recomputed from the requests by `write_missing`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from recording import latency_cells as cells_mod
from recording import request_sums as sums_mod
from recording.files import META_PROXY, META_RUN, META_SEQ, ParquetOptions, file_metadata, write_atomic
from recording.layout import HOUR_NS, file_range, hour_of_dirs, live_names, merged_name, partition_values
from recording.reader import (LiveFiles, RecordingFormatError, conform, dataset_version, file_version, live_files,
                              sampled_footers)
from recording.schema import DERIVED_DATASETS, FIRST_ROLLUP_VERSION, FORMAT_VERSION, ROLLUP_KEY, ROLLUP_VERSION, arrow_schema

__all__ = ["CELLS", "META_SOURCE_ROWS", "BATCH_ROWS", "rollup_version", "derived_path", "RollupFold", "write_rollups",
           "merge_hour",
           "Backfill", "write_missing", "Coverage", "RecordingCoverage", "coverage_all", "TIME_KEYED", "stored_span_ns",
           "settled", "Missing", "missing_rollups", "unreadable_rollup", "unreadable_requests"]

CELLS = "latency_cells"
# stored per ROLLUP_BUCKET_S: an analysis whose time bucket is not a multiple of it computes these from the requests
TIME_KEYED = (CELLS, "topic_sums", "traffic_sums")
META_SOURCE_ROWS = b"kafkatap.source_rows"  # requests the file summarizes
BATCH_ROWS = 32_768  # requests read at a time: a merged file of a busy minute never sits in memory whole
MERGE_ROWS = 262_144  # partial rollup rows held before they are merged into one (merging is the costly step)
INPUT_COLUMNS = sorted(set(cells_mod.INPUT_COLUMNS) | set(sums_mod.INPUT_COLUMNS))


@dataclass(frozen=True)
class _Derived:
    """How one derived dataset is computed from a batch of requests, and how two partial results merge."""

    compute: Callable[[pa.Table], pa.Table]
    merge: Callable[[list[pa.Table]], pa.Table]


def _sums(name: str) -> _Derived:
    spec = sums_mod.SUMS[name]
    return _Derived(getattr(sums_mod, name), lambda parts: sums_mod.merge(spec, parts))


DERIVED: dict[str, _Derived] = {
    CELLS: _Derived(cells_mod.latency_cells, cells_mod.merge_cells),
    "request_sums": _sums("request_sums"),
    "topic_sums": _sums("topic_sums"),
    "traffic_sums": _sums("traffic_sums"),
    "notable_requests": _Derived(sums_mod.notable_rows, pa.concat_tables),
    "slowest_requests": _Derived(sums_mod.slowest_rows, lambda parts: sums_mod.slowest_of(pa.concat_tables(parts))),
}
assert set(DERIVED) == set(DERIVED_DATASETS)


def rollup_version(metadata: Mapping[bytes, bytes] | None) -> int:
    """The rollup version in a derived file's footer: FIRST_ROLLUP_VERSION without the key (written before it
    existed), 0 when unreadable (stale either way: derived data is recomputed, never guessed at)."""
    raw = (metadata or {}).get(ROLLUP_KEY)
    if raw is None:
        return FIRST_ROLLUP_VERSION
    try:
        return int(raw)
    except ValueError:
        return 0


def derived_path(requests_file: Path, dataset: str) -> Path:
    """Where `dataset`'s rollup of a requests file goes: the same partition and name under `dataset/`."""
    parts = requests_file.parts
    i = len(parts) - 1 - parts[::-1].index("requests")  # the innermost `requests` directory
    return Path(*parts[:i], dataset, *parts[i + 1:])


def _fold(d: _Derived, held: list[pa.Table], part: pa.Table) -> list[pa.Table]:
    """Add one partial result; merge what is held once it passes MERGE_ROWS (memory stays a few batches)."""
    held.append(part)
    return [d.merge(held)] if sum(p.num_rows for p in held) > MERGE_ROWS else held


def _finish(name: str, held: list[pa.Table]) -> pa.Table:
    """The merged rollup of `held`, in the dataset's stored schema."""
    schema = arrow_schema(name)
    table = DERIVED[name].merge(held) if len(held) > 1 else held[0] if held else schema.empty_table()
    return table.select(schema.names).cast(schema.remove_metadata())


def _write(name: str, table: pa.Table, out: Path, *, proxy_id: str, run: str, seq: str, source_rows: int,
           fsync: bool, version: int = ROLLUP_VERSION) -> None:
    """Write one derived file; `version`: the rollup version of the rules its rows were computed under."""
    schema = arrow_schema(name)
    footer = file_metadata(schema, proxy_id=proxy_id, run=run, seq=seq, rows=table.num_rows, dropped=0, dropped_total=0)
    footer[META_SOURCE_ROWS] = str(source_rows).encode()
    footer[ROLLUP_KEY] = str(version).encode()
    write_atomic([table], out, footer, ParquetOptions(name, fsync=fsync))


class RollupFold:
    """The derived datasets of one requests file, folded a table at a time as its rows go by.

    Why: the writer's compaction already holds every row of the file it merges, a batch at a time; folding
    those batches spares reading the merged file back for its rollups (`write_rollups` reads a file that
    is already written). Memory is one batch plus the (small) partial rollups, whatever the file's size.
    """

    def __init__(self) -> None:
        self.held: dict[str, list[pa.Table]] = {name: [] for name in DERIVED}
        self.rows = 0

    def add(self, table: pa.Table) -> None:
        """Fold some of the file's request rows (any columns; those the rollups need are taken and conformed),
        BATCH_ROWS at a time: the computations' intermediates stay the size of one such slice."""
        # a column added to the format since the file was written reads as nulls, as the readers make it
        table = conform(table, "requests", columns=INPUT_COLUMNS)
        self.rows += table.num_rows
        for start in range(0, table.num_rows, BATCH_ROWS):
            part = table.slice(start, BATCH_ROWS)
            for name, d in DERIVED.items():
                self.held[name] = _fold(d, self.held[name], d.compute(part))

    def write(self, requests_file: Path, md: Mapping[bytes, bytes], fsync: bool = True) -> list[Path]:
        """Write every derived dataset of `requests_file` (whose footer metadata is `md`); returns their paths."""
        written = []
        for name in DERIVED:
            out = derived_path(requests_file, name)
            _write(name, _finish(name, self.held[name]), out, proxy_id=md.get(META_PROXY, b"").decode(),
                   run=md.get(META_RUN, b"").decode(), seq=md.get(META_SEQ, b"").decode(), source_rows=self.rows,
                   fsync=fsync)
            written.append(out)
        return written


def write_rollups(requests_file: Path, fsync: bool = True) -> list[Path]:
    """Compute and write every derived dataset of one final requests file (current format); returns their paths.

    RecordingFormatError when the requests file cannot be read; a failed write stays the OSError it is.
    The file is read a batch at a time (`RollupFold`).
    """
    fold = RollupFold()
    try:  # reading only: a write that fails below is no fault of this file's
        pf = pq.ParquetFile(requests_file)
        md = pf.schema_arrow.metadata or {}
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=INPUT_COLUMNS):
            fold.add(pa.Table.from_batches([batch]))
    except (pa.ArrowException, OSError) as exc:  # cut short, damaged pages: pyarrow's message names no file
        raise RecordingFormatError(unreadable_requests(Path(requests_file), exc)) from None
    return fold.write(requests_file, md, fsync=fsync)


def _live_names(directory: Path) -> list[str]:
    """The live Parquet file names of one local partition directory (recording.layout's rules)."""
    try:
        return live_names(os.listdir(directory))
    except FileNotFoundError:
        return []


def _standing_for(requests: list[str], derived: list[str]) -> dict[str, str | None]:
    """The derived file standing for each requests file of one directory (None: it has none).

    A requests file's own rollup has its name; a merged rollup (`merge_hour`) stands for every
    file of its run whose range it spans.
    """
    have = set(derived)
    ranges = [(r, n) for n in derived if (r := file_range(n)) is not None and r[1] != r[2]]
    out: dict[str, str | None] = {}
    for name in requests:
        rr = file_range(name)
        out[name] = name if name in have else None if rr is None else next(
            (n for (run, x, y), n in ranges if run == rr[0] and x <= rr[1] and rr[2] <= y), None)
    return out


def merge_hour(requests_dir: Path, run: str, fsync: bool = True) -> int:
    """Merge the rollups of `run`'s requests files in one partition directory into one file per dataset.

    Why: a live proxy finishes a requests file a minute or so, and the views without a time
    key repeat in each one's rollups; an hour merged is one small file per dataset, so a
    week's analysis reads ~170 files a dataset instead of ~10,000. The writer calls this
    when it leaves an hour (and on close).

    The merged file is named for the range of sequence numbers it spans
    (`part-<run>-<first>-<last>.parquet`), which is what links it to its requests files
    (`coverage`). So it is written only when every live requests file of the run in the
    directory has its rollups: otherwise its range would claim a file it lacks. It is written
    before its inputs are deleted; a crash in between leaves inputs that the superseded rule
    hides and `recover()` removes. Returns the number of datasets merged.
    """
    requests = [n for n in _live_names(requests_dir) if (r := file_range(n)) is not None and r[0] == run]
    if len(requests) < 2:
        return 0
    plans = {}
    for name in DERIVED:
        directory = derived_path(requests_dir / requests[0], name).parent
        standing = _standing_for(requests, [n for n in _live_names(directory) if (r := file_range(n)) is not None and r[0] == run])
        if None in standing.values():
            return 0  # a requests file without its rollups (a crash): `write_missing` first, then merge
        plans[name] = (directory, sorted(set(v for v in standing.values() if v is not None)))
    merged = 0
    for name, (directory, inputs) in plans.items():
        if len(inputs) < 2:
            continue
        spans = [r for n in inputs if (r := file_range(n)) is not None]
        first, last = min(r[1] for r in spans), max(r[2] for r in spans)
        held: list[pa.Table] = []
        source_rows = 0
        proxy_id = ""
        versions: list[int] = []
        for n in inputs:
            try:
                pf = pq.ParquetFile(directory / n)
                md = pf.schema_arrow.metadata or {}
                part = pf.read().replace_schema_metadata(None)
            except (pa.ArrowException, OSError) as exc:  # pyarrow's message names no file
                raise RecordingFormatError(unreadable_rollup(directory / n, exc)) from None
            proxy_id = proxy_id or md.get(META_PROXY, b"").decode()
            source_rows += int(md.get(META_SOURCE_ROWS, b"0") or 0)
            versions.append(rollup_version(md))
            held = _fold(DERIVED[name], held, part)
        # merging computes nothing anew: the merged file is as old as its oldest input (stale stays stale)
        _write(name, _finish(name, held), directory / merged_name(run, first, last), proxy_id=proxy_id, run=run,
               seq=f"{first}-{last}", source_rows=source_rows, fsync=fsync, version=min(versions))
        for n in inputs:
            (directory / n).unlink(missing_ok=True)
        merged += 1
    return merged


def unreadable_rollup(path: Path, exc: BaseException) -> str:
    """What to say of a rollup file that cannot be read while rolling up, and what to do: it is derived data."""
    return (f"cannot read {path} ({str(exc).strip() or type(exc).__name__}): a rollup file cut short by a crash; "
            "delete it and run `kafkatap rollups` again (it is recomputed from the requests: nothing is lost)")


def unreadable_requests(path: Path, exc: BaseException) -> str:
    """What to say of a requests file whose rollups cannot be computed (it cannot be read)."""
    return (f"cannot read {path} ({str(exc).strip() or type(exc).__name__}): a requests file cut short by a crash, "
            "or not Parquet; move it out of the recording (its rows are lost) and run `kafkatap rollups` again")


def settled(relative: str, settled_before_ns: int | None) -> bool:
    """Does the file's partition hour end at or before `settled_before_ns` (None: every hour counts as settled)?

    A file outside the date=/hour= layout counts as settled: no proxy writes such a file.
    """
    if settled_before_ns is None:
        return True
    pv = partition_values(relative)
    index = hour_of_dirs(f"date={pv.get('date', '')}", f"hour={pv.get('hour', '')}")
    return index is None or (index + 1) * HOUR_NS <= settled_before_ns


@dataclass(frozen=True)
class Backfill:
    """What `write_missing` did to one recording."""

    written: int  # requests files that got their rollups
    skipped: int  # requests files of an older format: an analysis reads those requests themselves
    merged: int  # partition directories whose rollups were merged per run (`merge_hour`)
    recent: int = 0  # requests files without rollups left alone: their hour may still be written to


@dataclass(frozen=True)
class Missing:
    """The live requests files that lack rollups, by what `write_missing` does with each (local paths)."""

    to_write: list[str]  # of the current format, in hours that have ended
    older: list[str]  # of an older format: skipped (an analysis reads those requests themselves)
    recent: list[str]  # in hours not settled (`settled`): left alone


def missing_rollups(cover: RecordingCoverage, settled_before_ns: int | None = None) -> Missing:
    """Which of `cover`'s requests files `write_missing` writes rollups for, skips, or leaves for later.

    One rule for `write_missing` and for `kafkatap rollups`' count (`--check`): they cannot disagree.
    """
    listing, uncovered = cover.requests, set(cover.uncovered)
    out = Missing([], [], [])
    for rel, path in zip(listing.relative, listing.paths):
        if rel not in uncovered:
            continue
        if not settled(rel, settled_before_ns):
            out.recent.append(path)
        elif file_version(path) != FORMAT_VERSION:
            out.older.append(path)
        else:
            out.to_write.append(path)
    return out


def write_missing(root: Path | str, fsync: bool = True, merge: bool = True,
                  progress: Callable[[int, int], None] | None = None, settled_before_ns: int | None = None,
                  cover: RecordingCoverage | None = None) -> Backfill:
    """Write the rollups of every live requests file of a local recording that lacks any, then merge each hour's.

    For recordings made before the writer stored rollups, with compaction off, or left by a
    crash between a requests file and its rollups. Merging (`merge_hour`, per directory and run)
    is what a writer does when it leaves an hour. `settled_before_ns`: only the hours that ended by
    then are touched — beside a running proxy, rolling up the hour it still flushes and compacts
    counted rows twice (a flush file's rollups merged, then its compacted file's range overlapping
    them), and the analysis summed the inflated rollups. `progress(done, todo)` is called after
    each file written. RecordingFormatError names a file that cannot be read. `cover`: the recording's
    `coverage_all`, when the caller has it already.
    """
    cover = cover if cover is not None else coverage_all(root)
    if cover is None:
        raise ValueError(f"{root}: not a local path")
    listing = cover.requests
    for name, c in cover.by_dataset.items():
        if c.stale is not None:  # another format's or rollup version's: derived data, recomputed below (deleting loses nothing)
            for path in (Path(root) / name).rglob("*.parquet"):  # superseded ones too: they would surface
                path.unlink(missing_ok=True)
    missing = missing_rollups(cover, settled_before_ns)
    skipped, todo = len(missing.older), len(missing.to_write) + len(missing.older)
    written = 0
    for path in missing.to_write:
        write_rollups(Path(path), fsync=fsync)  # RecordingFormatError names a file it cannot read
        written += 1
        if progress is not None:
            progress(written + skipped, todo)
    merged = 0
    if merge:
        runs: dict[Path, set[str]] = {}
        for rel, path in zip(listing.relative, listing.paths):
            r = file_range(Path(path).name)
            if r is not None and settled(rel, settled_before_ns):
                runs.setdefault(Path(path).parent, set()).add(r[0])
        merged = sum(1 for directory, rs in runs.items() for run in sorted(rs) if merge_hour(directory, run, fsync=fsync))
    return Backfill(written, skipped, merged, len(missing.recent))


@dataclass(frozen=True)
class Coverage:
    """Which derived files stand for the live requests files of one recording, in one derived dataset."""

    requests: int  # live requests files
    uncovered: tuple[str, ...]  # those with no rollup there (relative names)
    files: tuple[str, ...]  # the derived files standing for the others, spelled for Spark, each once
    stale: str | None = None  # why the dataset's files cannot be read as they are (another format or rollup version): none count

    @property
    def complete(self) -> bool:
        return self.requests > 0 and not self.uncovered


def _by_dir(relative: tuple[str, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for rel in relative:
        d, _, name = rel.rpartition("/")
        out.setdefault(d, []).append(name)
    return out


def _coverage(requests: LiveFiles, derived: LiveFiles) -> Coverage:
    stale = _stale(derived)
    if stale is not None:  # derived data is never migrated: it is recomputed (`write_missing`)
        return Coverage(len(requests.relative), requests.relative, (), stale)
    have = _by_dir(derived.relative)
    uncovered: list[str] = []
    files: set[str] = set()
    for d, names in _by_dir(requests.relative).items():
        prefix = f"{d}/" if d else ""
        for name, standing in _standing_for(names, have.get(d, [])).items():
            if standing is None:
                uncovered.append(prefix + name)
            else:
                files.add(f"{derived.spelled_base}/{prefix}{standing}")
    return Coverage(len(requests.relative), tuple(uncovered), tuple(sorted(files)))


def _stale(derived: LiveFiles) -> str | None:
    """Why a derived dataset's files are not in the current format or rollup version (sampled as the reader samples:
    one file per run, and a run is one kafkatap), or None."""
    if not derived.relative:
        return None
    try:
        footers = sampled_footers(derived)
        version, _ = dataset_version(derived, footers=footers)
    except RecordingFormatError as exc:
        return str(exc)
    if version != FORMAT_VERSION:
        return f"{derived.spelled_base}: format version {version}, not {FORMAT_VERSION}"
    other = sorted({rollup_version(md) for md in footers.values()} - {ROLLUP_VERSION})
    return (f"{derived.spelled_base}: rollup version {other[0]}, not {ROLLUP_VERSION} (computed under other rules)"
            if other else None)


@dataclass(frozen=True)
class RecordingCoverage:
    """Every derived dataset's coverage of one recording, and the listings it was made from (one per dataset
    directory: an analysis's sizing and drill-down read them instead of listing again)."""

    requests: LiveFiles
    derived: dict[str, LiveFiles]
    by_dataset: dict[str, Coverage]

    def listing(self, dataset: str) -> LiveFiles | None:
        """The listing of `dataset` this coverage was made from; None for a dataset it did not list."""
        return self.requests if dataset == "requests" else self.derived.get(dataset)

    @property
    def complete(self) -> bool:
        """Every derived dataset stands for every live requests file (the passes can read rollups only)."""
        return all(c.complete for c in self.by_dataset.values())

    @property
    def uncovered(self) -> set[str]:
        """Requests files lacking their rollups in at least one derived dataset (relative names)."""
        return {rel for c in self.by_dataset.values() for rel in c.uncovered}


def coverage_all(root: Path | str) -> RecordingCoverage | None:
    """Coverage of every derived dataset of `root`: the requests and each dataset listed once; None where pyarrow cannot list it."""
    requests = live_files(root, "requests")
    if requests is None:
        return None
    derived = {}
    for dataset in DERIVED:
        listing = live_files(root, dataset)
        if listing is None:
            return None
        derived[dataset] = listing
    return RecordingCoverage(requests, derived, {name: _coverage(requests, listing) for name, listing in derived.items()})


def stored_span_ns(listing: LiveFiles) -> tuple[int, int] | None:
    """(first, last) request time, epoch ns, from the footer statistics of `request_sums` files; None if unknown.

    Why: an analysis picks its time bucket from the recording's span, and whether the time-keyed
    rollups can serve depends on that bucket; its Spark settings are chosen before Spark starts,
    from what the passes will read. The footers answer without reading a row. Connections may
    stretch the real span: this is a lower bound.
    """
    lo = hi = None
    for path in listing.paths:
        try:
            md = pq.read_metadata(path, filesystem=listing.filesystem)
        except (OSError, ValueError):
            return None
        names = [md.schema.column(i).name for i in range(md.num_columns)]
        if "first_ns" not in names or "last_ns" not in names:
            return None
        first, last = names.index("first_ns"), names.index("last_ns")
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            a, b = rg.column(first).statistics, rg.column(last).statistics
            if a is None or b is None or not (a.has_min_max and b.has_min_max):
                if rg.num_rows:
                    return None
                continue
            lo = _epoch_ns(a.min) if lo is None else min(lo, _epoch_ns(a.min))
            hi = _epoch_ns(b.max) if hi is None else max(hi, _epoch_ns(b.max))
    return None if lo is None or hi is None else (lo, hi)


def _epoch_ns(value: object) -> int:
    """A footer statistic of a timestamp[us] column as epoch ns (pyarrow gives a datetime; a raw integer is in µs)."""
    return int(pa.scalar(value, pa.timestamp("us", "UTC")).value) * 1000
