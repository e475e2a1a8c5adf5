"""The one reader of recordings: which files are live, which version they are, and their rows as Arrow.

Why one reader: replay, tools and tests read recordings with pyarrow, and
analytics reads them with Spark, but both must agree on which files count
(Hive partitions, dot- and underscore-files skipped, flush files already
contained in a merged file skipped — the superseded rule of
`recording.layout`) and on the version rule (`recording.migrations`). So both
list files through `live_files()` and check versions through the same
functions; only the final read differs (`read_recording()` here, Spark's
`parquet(*files)` in `analytics.load`).

Listing goes through `pyarrow.fs`, so a local path and any URI pyarrow has a
filesystem for (`s3://`, `gs://`, `hdfs://` with libhdfs, …) work the same.
`live_files()` returns None for a path pyarrow cannot list (e.g. `s3a://`);
callers then fall back to what they did before (analytics lets Spark read the
directory, without the version check and the superseded rule).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from recording.layout import TIME_COLUMN, file_range, is_hidden, live_names, partition_values
from recording.migrations import MIGRATIONS, Migration, RecordingFormatError, migrations_from, single_version, version_of
from recording.schema import DATASETS, FORMAT_VERSION, arrow_schema

if TYPE_CHECKING:  # imported where a dataset is opened: the recording writer process reads files, never opens one
    import pyarrow.dataset as pads

__all__ = ["RecordingFormatError", "Migration", "MIGRATIONS", "PARTITION_SCHEMA", "LiveFiles", "live_files",
           "recording_files", "footer_metadata", "file_version", "sampled_footers", "dataset_version", "read_recording",
           "open_recording", "recording_start", "conform"]

PARTITION_SCHEMA = pa.schema([("proxy", pa.string()), ("date", pa.string()), ("hour", pa.int32())])


@dataclass(frozen=True)
class LiveFiles:
    """The live Parquet files of one dataset of one recording, named for pyarrow and for Spark.

    `paths` are on `filesystem` (what pyarrow opens); `uris` are the same files
    spelled the way the caller spelled the recording (what Spark resolves, so
    a relative path or a URI means to Spark what it meant before).
    """

    filesystem: pafs.FileSystem
    base: str  # the dataset directory on `filesystem`
    spelled_base: str  # the dataset directory as the caller wrote it
    relative: tuple[str, ...]  # '/'-separated, relative to base, sorted

    @property
    def paths(self) -> list[str]:
        return [f"{self.base}/{r}" for r in self.relative]

    @property
    def uris(self) -> list[str]:
        return [f"{self.spelled_base}/{r}" for r in self.relative]

    def time_ordered(self) -> list[str]:
        """Relative names by partition hour, then name: the order files were written in."""
        return sorted(self.relative, key=lambda rel: (_hour_key(rel) or ("", ""), rel))


def _hour_key(relative: str) -> tuple[str, str] | None:
    """(date, hour) of a file's Hive partition; None outside the date=/hour= layout."""
    pv = partition_values(relative)
    if "date" not in pv or "hour" not in pv:
        return None
    return pv["date"], pv["hour"].zfill(2)


def _filesystem(root: str) -> tuple[pafs.FileSystem, str] | None:
    """pyarrow's filesystem and path for `root`; None when pyarrow has no filesystem for its scheme."""
    if "://" not in root:
        return pafs.LocalFileSystem(), os.path.abspath(root)
    try:
        fs, path = pafs.FileSystem.from_uri(root)
    except Exception:  # noqa: BLE001 — s3a://, hdfs:// without libhdfs …: not ours to list
        return None
    return fs, path.rstrip("/")


def live_files(root: Path | str, dataset: str) -> LiveFiles | None:
    """Every live Parquet file of one dataset ([] when the directory is absent); None if pyarrow cannot list `root`.

    Live: named `*.parquet`, no path part starting with `.` or `_` (in-progress
    `.tmp-` files, `_SUCCESS`, `_temporary/`), not superseded by a merged file.
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; one of {DATASETS}")
    spelled = str(root).rstrip("/") or ("/" if str(root).startswith("/") else ".")
    located = _filesystem(spelled)
    if located is None:
        return None
    fs, path = located
    base = f"{path}/{dataset}"
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    by_dir: dict[str, list[str]] = {}
    for info in infos:
        if info.type != pafs.FileType.File or not info.path.endswith(".parquet"):
            continue
        rel = info.path[len(base) + 1:]
        if any(is_hidden(part) for part in rel.split("/")):
            continue
        d, _, name = rel.rpartition("/")
        by_dir.setdefault(d, []).append(name)
    live = []
    for d, names in by_dir.items():
        live.extend(f"{d}/{n}" if d else n for n in live_names(names))
    return LiveFiles(fs, base, f"{spelled}/{dataset}", tuple(sorted(live)))


def recording_files(root: Path | str, dataset: str) -> list[Path]:
    """The live files of one dataset of a local recording, as Paths (see `live_files`)."""
    listing = live_files(root, dataset)
    if listing is None:
        raise ValueError(f"{root}: not a local path (use live_files() for other filesystems)")
    return [Path(p) for p in listing.paths]


def footer_metadata(path: Path | str, filesystem: pafs.FileSystem | None = None) -> dict[bytes, bytes]:
    """A file's footer key-value metadata (RecordingFormatError if it has no footer)."""
    try:
        meta = pq.read_metadata(str(path), filesystem=filesystem)
    except pa.ArrowInvalid as exc:  # no footer: a file cut short (a crash mid-write, a full disk) or not Parquet
        raise RecordingFormatError(unreadable_file(path, str(exc))) from None
    return dict(meta.metadata or {})


def file_version(path: Path | str, filesystem: pafs.FileSystem | None = None) -> int:
    """The kafkatap format version stored in a file's footer (RecordingFormatError if absent or unreadable)."""
    return version_of(footer_metadata(path, filesystem), str(path))


def _open_parquet(f: Any, where: str) -> pq.ParquetFile:
    """A recording file opened to read; RecordingFormatError naming it when it has no footer (pyarrow names none)."""
    try:
        return pq.ParquetFile(f)
    except pa.ArrowInvalid as exc:  # cut short by a crash, or not Parquet
        raise RecordingFormatError(unreadable_file(where, str(exc))) from None


def unreadable_file(path: Path | str, detail: str | None = None) -> str:
    """What to say of a recording file that cannot be read (pyarrow's footer check or Spark's read), and what to do."""
    why = f" ({detail})" if detail else ""
    then = ("analyze with --ignore-rollups: the hour's stored rollups still count its rows"
            if "requests" in str(path).replace("\\", "/").split("/") else "analyze again")  # rollups sum requests only
    return (f"cannot read {path}{why}: a file cut short by a crash, or not Parquet; move it out of the recording "
            f"(its rows are lost) and {then}")


FOOTER_READERS = 8  # threads reading the footers of a sample larger than its earliest and latest files


def version_sample(files: list[str], sample: int = 16) -> list[str]:
    """The files whose footers tell a dataset's format versions: the earliest and latest few, and one of every run.

    Reading every footer of a week of recordings would be slow (and on object
    stores slower still). A writer run is one process of one kafkatap version,
    and only its own writer names files after it (`part-<run>-…`, compaction
    included), so one file per run sees every version there is: an upgrade at
    the start or the end, and in the middle a second proxy of another version
    recording into the same directory for a while, or an upgrade rolled back.
    Spark reads a dataset with one schema, so a version it did not check would be
    misread (timestamps as 1970) or blamed on a broken file. A file not named
    as a writer names its files counts as a run of its own.
    """
    picked = files if len(files) <= sample else files[: sample // 2] + files[-(sample // 2):]
    seen = {_run_of(rel) for rel in picked}
    for rel in files:
        run = _run_of(rel)
        if run not in seen:
            seen.add(run)
            picked.append(rel)
    return picked


def _run_of(relative: str) -> str:
    named = file_range(relative.rpartition("/")[2])
    return named[0] if named is not None else relative


def sampled_footers(listing: LiveFiles, sample: int = 16) -> dict[str, dict[bytes, bytes]]:
    """The footer metadata of the files `version_sample` picks, by relative name (RecordingFormatError: one has none).

    Read once for every key a caller checks (the format version, and for derived data its rollup version).
    """
    picked = version_sample(listing.time_ordered(), sample)

    def read(rel: str) -> dict[bytes, bytes]:
        return footer_metadata(f"{listing.base}/{rel}", listing.filesystem)

    if len(picked) <= sample:
        found = [read(rel) for rel in picked]
    else:  # a recording of many runs (workers, restarts): footers are small reads, mostly waiting (object stores)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=FOOTER_READERS) as pool:
            found = list(pool.map(read, picked))  # the first file that cannot be read raises, as one by one
    return dict(zip(picked, found))


def dataset_version(listing: LiveFiles, sample: int = 16,
                    footers: dict[str, dict[bytes, bytes]] | None = None) -> tuple[int, list[Migration]]:
    """The one format version of a dataset read as a whole (Spark), and the migrations it needs.

    Checks the footers `version_sample` picks (`footers`: those already read by `sampled_footers`). Refuses
    mixed, newer, foreign and unmigratable files (RecordingFormatError).
    """
    footers = sampled_footers(listing, sample) if footers is None else footers
    versions = {f"{listing.spelled_base}/{rel}": version_of(md, f"{listing.base}/{rel}") for rel, md in footers.items()}
    version = single_version(versions, listing.spelled_base)
    return version, migrations_from(version, listing.spelled_base)


def conform(table: pa.Table, dataset: str, steps: Sequence[Migration] = (),
            columns: Sequence[str] | None = None) -> pa.Table:
    """Migrate, then exactly the current schema (or its `columns`, in that order): absent columns as nulls, other
    types cast. Why one place: the reader and the rollup writer must read an older file's missing column alike."""
    for step in steps:
        table = step.to_arrow(table, dataset)
    target = arrow_schema(dataset)
    if columns is not None:
        target = pa.schema([target.field(c) for c in columns])
    if table.schema == target:
        return table
    cols = []
    for f in target:
        if f.name in table.column_names:
            col = table[f.name]
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=target)


def _with_partitions(t: pa.Table, relative: str) -> pa.Table:
    pv = partition_values(relative)
    hour = pv.get("hour")
    t = t.append_column("proxy", pa.array([pv.get("proxy")] * t.num_rows, pa.string()))
    t = t.append_column("date", pa.array([pv.get("date")] * t.num_rows, pa.string()))
    return t.append_column("hour", pa.array([int(hour) if hour else None] * t.num_rows, pa.int32()))


def read_recording(root: Path | str, dataset: str = "requests", *, with_partitions: bool = True,
                   filter: pc.Expression | None = None) -> pa.Table:
    """The whole dataset as one Arrow table in the current schema (plus proxy/date/hour columns).

    Every file's version is checked (files may differ: each is migrated on its
    own); RecordingFormatError names the first file that cannot be read.
    """
    listing = live_files(root, dataset)
    if listing is None:
        raise RecordingFormatError(f"{root}: pyarrow has no filesystem for this path")
    tables = []
    for rel, path in zip(listing.relative, listing.paths):
        where = f"{listing.spelled_base}/{rel}"
        with listing.filesystem.open_input_file(path) as f:
            pf = _open_parquet(f, where)
            steps = migrations_from(version_of(pf.metadata.metadata, where), where)
            t = conform(pf.read(), dataset, steps)
        if filter is not None:
            t = t.filter(filter)
        if with_partitions:
            t = _with_partitions(t, rel)
        tables.append(t.replace_schema_metadata(None))
    if not tables:
        schema = pa.schema(list(arrow_schema(dataset)) + (list(PARTITION_SCHEMA) if with_partitions else []))
        return schema.empty_table()
    return pa.concat_tables(tables)


def open_recording(root: Path | str, dataset: str = "requests") -> pads.Dataset:
    """A lazy pyarrow Dataset over current-version files (for large recordings; filters push down).

    Refuses (RecordingFormatError) when any file is not the current version:
    use `read_recording`, which migrates, for old recordings.
    """
    import pyarrow.dataset as pads  # here, not with the module: ~6 MB of RSS the writer process never needs

    listing = live_files(root, dataset)
    if listing is None:
        raise RecordingFormatError(f"{root}: pyarrow has no filesystem for this path")
    for path in listing.paths:
        v = file_version(path, listing.filesystem)
        if v > FORMAT_VERSION:
            migrations_from(v, path)  # raises: "upgrade kafkatap"
        if v != FORMAT_VERSION:
            raise RecordingFormatError(f"{path} has recording format version {v} (this kafkatap: {FORMAT_VERSION}); "
                                       "read it with read_recording(), which migrates")
    schema = pa.schema(list(arrow_schema(dataset)) + list(PARTITION_SCHEMA))
    return pads.dataset(listing.paths, schema=schema, format="parquet", filesystem=listing.filesystem,
                        partitioning=pads.partitioning(PARTITION_SCHEMA, flavor="hive"),
                        partition_base_dir=listing.base)


def _column_min(pf: pq.ParquetFile, column: str) -> int | None:
    """Minimum of a time column (epoch ns) from the row-group statistics (the column itself only where they are missing)."""
    leaves = pf.metadata.schema  # Parquet leaf columns: nested columns before it shift the index
    idx = next((j for j in range(len(leaves)) if leaves.column(j).path == column), None)
    if idx is None:
        return None
    mins = []
    for i in range(pf.metadata.num_row_groups):
        rg = pf.metadata.row_group(i)
        stats = rg.column(idx).statistics
        if stats is not None and stats.has_min_max:
            mins.append(stats.min)
        elif rg.num_rows:
            value = pc.min(pf.read_row_group(i, columns=[column])[column]).as_py()
            if value is not None:
                mins.append(value)
    return min((_as_epoch_ns(m) for m in mins), default=None)


def _as_epoch_ns(value: object) -> int:
    """A footer statistic of a time column as epoch ns: int (format ≤ 2, already ns) or datetime (format 3, µs)."""
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
        return (aware - _EPOCH) // dt.timedelta(microseconds=1) * 1000
    return int(value)  # type: ignore[call-overload]


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def recording_start(roots: Iterable[Path | str]) -> int | None:
    """When the recordings' first request was read (epoch ns): the anchor of `+SECONDS` times.

    Cheap on a week of recordings: requests are partitioned by the hour of
    `req_first_ns`, so only the files of the earliest hour partition (and any
    outside the date=/hour= layout) are opened, and of those only the footer
    statistics are read. None when no root has a request file pyarrow can read.
    """
    column = TIME_COLUMN["requests"]
    found = []
    for root in roots:
        listing = live_files(root, "requests")
        if listing is None or not listing.relative:
            continue
        keys = {rel: _hour_key(rel) for rel in listing.relative}
        first = min((k for k in keys.values() if k is not None), default=None)
        for rel in (rel for rel, k in keys.items() if k is None or k == first):
            with listing.filesystem.open_input_file(f"{listing.base}/{rel}") as f:
                value = _column_min(_open_parquet(f, f"{listing.spelled_base}/{rel}"), column)
            if value is not None:
                found.append(value)
    return min(found, default=None)
