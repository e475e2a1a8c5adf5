"""One Parquet file of a recording: its footer keys and how it appears on disk.

Why shared: flush files (writer thread) and merged files (compaction thread)
must carry the same footer keys and appear the same way — written to a
dot-file, fsynced, then renamed — so that a file under its final name is
always complete, whoever wrote it and whenever the process died.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from recording.layout import tmp_name
from recording.schema import COLUMNS, FORMAT_KEY, FORMAT_VERSION

__all__ = ["META_DROPPED", "META_DROPPED_TOTAL", "META_INTERIM", "META_PROXY", "META_RUN", "META_SEQ", "META_ROWS",
           "SORT_KEYS", "file_metadata", "fsync_dir", "ParquetOptions", "write_atomic", "finalize_interim"]

# Keys of the per-file key/value metadata (besides the schema's own).
META_DROPPED = b"kafkatap.dropped_rows"  # rows dropped since the previous file of this dataset
META_DROPPED_TOTAL = b"kafkatap.dropped_rows_total"  # since the recorder started
META_PROXY = b"kafkatap.proxy_id"
META_RUN = b"kafkatap.run"
META_SEQ = b"kafkatap.seq"  # "first-last" flush sequence numbers the file holds
META_ROWS = b"kafkatap.rows"
META_INTERIM = b"kafkatap.interim"  # "1": a flush file written the cheap way, for compaction to rewrite (ParquetOptions)

# Sort order per dataset. Sorting by connection then time turns the timestamp
# columns into small deltas and the string columns into long runs, which is
# most of what gets a request row under 40 bytes.
SORT_KEYS = {
    "requests": ["api_key", "conn_id", "req_first_ns"],
    "connections": ["conn_id", "snapshot_ns"],
    "tcp": ["conn_id", "side", "ts_ns"],
    "frames": ["conn_id", "ts_ns"],
    "topics": ["topic_id", "first_seen_ns"],
    "runs": ["ts_ns"],
    "latency_cells": ["dim", "metric", "k1", "k2", "bin"],
    "request_sums": ["conn_id", "api_name"],
    "topic_sums": ["topic", "client_id", "b"],
    "traffic_sums": ["broker_addr", "client_id", "b"],
    "notable_requests": ["conn_id", "ts_ns"],
    "slowest_requests": ["latency_us"],
}


def file_metadata(schema: pa.Schema, *, proxy_id: str, run: str, seq: str, rows: int, dropped: int,
                  dropped_total: int) -> dict[bytes, bytes]:
    """The footer of one file: the schema's own keys, the format version, and where its rows came from."""
    md = dict(schema.metadata or {})
    md.update({
        FORMAT_KEY: str(FORMAT_VERSION).encode(),
        META_DROPPED: str(dropped).encode(),
        META_DROPPED_TOTAL: str(dropped_total).encode(),
        META_PROXY: proxy_id.encode(),
        META_RUN: run.encode(),
        META_SEQ: seq.encode(),
        META_ROWS: str(rows).encode(),
    })
    return md


class ParquetOptions:
    """Encoding choices of one dataset: dictionary for strings, delta for the `_ns` timestamps, zstd, rows sorted.

    `interim` files (flush files that compaction will rewrite) are written the cheap way instead: unsorted, lz4,
    no dictionary. On the recording bench's rows that costs 1.4-1.6 µs a row against 3.1 µs (sort 0.5, zstd and
    dictionaries the rest) and reads back as fast; the files are 1.4-2.5 x bigger for the minute they live.
    Every row is encoded for good once, by compaction, instead of twice (issue 16's recording cost). An interim
    file carries META_INTERIM: one that a dead writer left unmerged is rewritten by the next (`finalize_interim`).
    """

    def __init__(self, dataset: str, compression_level: int = 3, fsync: bool = True, interim: bool = False) -> None:
        self.dataset = dataset
        self.compression_level = compression_level
        self.fsync = fsync
        self.interim = interim
        self.use_dictionary: list[str] | bool = False if interim else [
            c.name for c in COLUMNS[dataset] if not (c.name.endswith("_ns") or c.name == "data")]
        self.encodings = {} if interim else {
            c.name: "DELTA_BINARY_PACKED" for c in COLUMNS[dataset] if c.name.endswith("_ns")}

    def interim_copy(self) -> "ParquetOptions":
        """The same dataset and durability, encoded for a file that compaction rewrites."""
        return ParquetOptions(self.dataset, self.compression_level, self.fsync, interim=True)


PRIVATE_DATASETS = frozenset({"frames"})  # written readable by their owner only (write_atomic)


def write_atomic(tables: Iterable[pa.Table], final_path: Path, metadata: dict[bytes, bytes],
                 opts: ParquetOptions, written: Callable[[pa.Table], None] | None = None) -> int:
    """Write `tables` to a dot-file, fsync it and its directory, rename: readers never see a partial file.

    Each table is sorted (SORT_KEYS; an `interim` file is not, and its footer says it is interim: META_INTERIM) and
    written as its own row group(s), so memory is bounded by one table: a flush passes one, compaction streams a
    segment in batches instead of loading it whole.
    `written` is handed each table once its sorted copy is written and dropped (compaction folds the
    rollups there). Returns the file's size.
    """
    tmp = final_path.with_name(tmp_name(final_path.name))
    final_path.parent.mkdir(parents=True, exist_ok=True)
    sort = [(k, "ascending") for k in SORT_KEYS[opts.dataset]]
    # payload bytes (--capture) are for the proxy's user alone, whatever the umask: other local users read every
    # other dataset (metadata), not what clients produced
    private = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        with (os.fdopen(os.open(tmp, private, 0o600), "wb") if opts.dataset in PRIVATE_DATASETS
              else open(tmp, "wb")) as f:
            writer: pq.ParquetWriter | None = None
            try:
                for table in tables:
                    ordered = (table if opts.interim else table.sort_by(sort)).replace_schema_metadata(
                        {**metadata, META_INTERIM: b"1"} if opts.interim else metadata)
                    if writer is None:
                        writer = pq.ParquetWriter(
                            f, ordered.schema, compression="lz4" if opts.interim else "zstd",
                            compression_level=None if opts.interim else opts.compression_level,
                            use_dictionary=opts.use_dictionary, column_encoding=opts.encodings or None,
                            write_statistics=True,
                        )
                    writer.write_table(ordered, row_group_size=1_000_000)
                    del ordered
                    if written is not None:
                        written(table)
            finally:
                if writer is not None:
                    writer.close()
            if writer is None:
                raise ValueError("write_atomic needs at least one table")
            if opts.fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, final_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if opts.fsync:
        fsync_dir(final_path.parent)
    return final_path.stat().st_size


def finalize_interim(path: Path, opts: ParquetOptions) -> bool:
    """Rewrite an interim flush file that no compaction will take (its writer died) as a final one, in place.

    Same name, rows and footer (less the interim mark): readers see the old file or the new one, both complete, and
    the superseded rule (recording.layout) applies to it as before. Returns whether the file was interim.
    """
    md = dict(pq.read_schema(path).metadata or {})
    if md.pop(META_INTERIM, None) is None:
        return False
    write_atomic([pq.read_table(path).replace_schema_metadata(None)], path, md, opts)
    return True


def fsync_dir(directory: Path) -> None:
    """fsync a directory, so a rename into it survives a power loss (the file's own fsync does not cover it)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
