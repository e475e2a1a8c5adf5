"""Read a recording directory back as Arrow, checking the format version of every file.

Why a helper: replay, tests and small tools should not each re-learn the
layout (Hive partitions, dot-files to ignore, flush files that a crash left
next to the merged file that already contains them) nor the version rule:
a file written by a *newer* format is refused with a message saying so; an
*older* one is migrated to the current schema (registered migrations first,
then missing columns become nulls) so callers always see one schema.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from recording.writer import superseded
from recording.schema import DATASETS, FORMAT_KEY, FORMAT_VERSION, arrow_schema

__all__ = ["RecordingFormatError", "recording_files", "file_version", "read_recording", "open_recording",
           "PARTITION_SCHEMA", "MIGRATIONS"]

PARTITION_SCHEMA = pa.schema([("proxy", pa.string()), ("date", pa.string()), ("hour", pa.int32())])

# from_version → function(table, dataset) returning the table in the next version's shape.
MIGRATIONS: dict[int, Callable[[pa.Table, str], pa.Table]] = {}


class RecordingFormatError(ValueError):
    """A file in the recording cannot be read by this kafkatap (message says which and why)."""


def recording_files(root: Path | str, dataset: str) -> list[Path]:
    """Every complete Parquet file of one dataset (no `.tmp-`/`_` files, no superseded flush files)."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; one of {DATASETS}")
    base = Path(root) / dataset
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        names = [n for n in filenames if n.endswith(".parquet") and not n.startswith((".", "_"))]
        skip = superseded(names)
        files.extend(Path(dirpath) / n for n in sorted(names) if n not in skip)
    return files


def file_version(path: Path | str) -> int:
    """The kafkatap format version stored in a file's footer (RecordingFormatError if absent)."""
    md = pq.read_metadata(path).metadata or {}
    raw = md.get(FORMAT_KEY)
    if raw is None:
        raise RecordingFormatError(f"{path} is not a kafkatap recording (no {FORMAT_KEY.decode()} in its metadata)")
    try:
        return int(raw)
    except ValueError as exc:
        raise RecordingFormatError(f"{path}: unreadable format version {raw!r}") from exc


def _partition_values(path: Path, root: Path) -> dict[str, str]:
    out = {}
    for part in path.relative_to(root).parts[:-1]:
        k, eq, v = part.partition("=")
        if eq:
            out[k] = v
    return out


def _conform(table: pa.Table, dataset: str, version: int, path: Path) -> pa.Table:
    for v in range(version, FORMAT_VERSION):
        step = MIGRATIONS.get(v)
        if step is not None:
            table = step(table, dataset)
    target = arrow_schema(dataset)
    cols = []
    for f in target:
        if f.name in table.column_names:
            col = table[f.name]
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=target)


def read_recording(root: Path | str, dataset: str = "requests", *, with_partitions: bool = True,
                   filter: pc.Expression | None = None) -> pa.Table:
    """The whole dataset as one Arrow table in the current schema (plus proxy/date/hour columns).

    Raises RecordingFormatError naming the first file written by a newer format.
    """
    root = Path(root)
    files = recording_files(root, dataset)
    target = arrow_schema(dataset)
    tables = []
    for path in files:
        version = file_version(path)
        if version > FORMAT_VERSION:
            raise RecordingFormatError(
                f"{path} was written by recording format version {version}, but this kafkatap reads up to "
                f"version {FORMAT_VERSION}: upgrade kafkatap to read this recording")
        t = pq.read_table(path)
        t = _conform(t, dataset, version, path) if (version < FORMAT_VERSION or t.schema != target) else t
        if filter is not None:
            t = t.filter(filter)
        if with_partitions:
            pv = _partition_values(path, root / dataset)
            t = t.append_column("proxy", pa.array([pv.get("proxy")] * t.num_rows, pa.string()))
            t = t.append_column("date", pa.array([pv.get("date")] * t.num_rows, pa.string()))
            hour = pv.get("hour")
            t = t.append_column("hour", pa.array([int(hour) if hour else None] * t.num_rows, pa.int32()))
        tables.append(t.replace_schema_metadata(None))
    if not tables:
        schema = pa.schema(list(target) + (list(PARTITION_SCHEMA) if with_partitions else []))
        return schema.empty_table()
    return pa.concat_tables(tables)


def open_recording(root: Path | str, dataset: str = "requests") -> pads.Dataset:
    """A lazy pyarrow Dataset over current-version files (for large recordings; filters push down).

    Refuses (RecordingFormatError) when any file is not the current version:
    use `read_recording`, which migrates, for old recordings.
    """
    root = Path(root)
    files = recording_files(root, dataset)
    for path in files:
        v = file_version(path)
        if v != FORMAT_VERSION:
            raise RecordingFormatError(
                f"{path} has recording format version {v} (this kafkatap: {FORMAT_VERSION}); "
                + ("upgrade kafkatap" if v > FORMAT_VERSION else "read it with read_recording(), which migrates"))
    schema = pa.schema(list(arrow_schema(dataset)) + list(PARTITION_SCHEMA))
    return pads.dataset([str(p) for p in files], schema=schema, format="parquet",
                        partitioning=pads.partitioning(PARTITION_SCHEMA, flavor="hive"),
                        partition_base_dir=str(root / dataset))
