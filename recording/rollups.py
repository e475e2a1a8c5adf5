"""Rollup files: what the analysis would sum from each final requests file, written beside it under the same name.

Layout: the rollups of `DIR/requests/<partition>/<name>` are `DIR/<dataset>/<partition>/<name>`
for each derived dataset (`recording.schema.DERIVED_DATASETS`): the latency cells
(`recording.latency_cells`), the request, topic and traffic sums, the notable rows and
the slowest requests (`recording.request_sums`). A requests file gets them once it is final — when
compaction merged it, or left it alone as the only file of its segment — so a live
proxy writes a handful of small files a minute, never one per flush. They are written
after their requests file (dot-file, fsync, rename, as every file of a recording): a
crash in between leaves a requests file without them, which an analysis treats as not
covered (it reads the requests instead) until `write_missing` fills it in (nothing calls it on its
own yet: the analysis stays correct, only slower, for that recording).

The name is the link, so the reader needs no index: an analysis uses a derived dataset
when every live requests file has its namesake there (`coverage`), and ignores files
whose requests file is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from recording import latency_cells as cells_mod
from recording import request_sums as sums_mod
from recording.files import META_PROXY, META_RUN, META_SEQ, ParquetOptions, file_metadata, write_atomic
from recording.reader import file_version, live_files
from recording.schema import DERIVED_DATASETS, FORMAT_VERSION, arrow_schema

__all__ = ["CELLS", "META_SOURCE_ROWS", "BATCH_ROWS", "derived_path", "write_rollups", "write_missing", "Coverage",
           "coverage"]

CELLS = "latency_cells"
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


def derived_path(requests_file: Path, dataset: str) -> Path:
    """Where `dataset`'s rollup of a requests file goes: the same partition and name under `dataset/`."""
    parts = requests_file.parts
    i = len(parts) - 1 - parts[::-1].index("requests")  # the innermost `requests` directory
    return Path(*parts[:i], dataset, *parts[i + 1:])


def write_rollups(requests_file: Path, fsync: bool = True) -> list[Path]:
    """Compute and write every derived dataset of one final requests file (current format); returns their paths.

    The file is read a batch at a time and each dataset's partial results are merged as they
    come, so memory is one batch plus the (small) rollups, whatever the file's size.
    """
    pf = pq.ParquetFile(requests_file)
    md = pf.schema_arrow.metadata or {}
    held: dict[str, list[pa.Table]] = {name: [] for name in DERIVED}
    rows = 0
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=INPUT_COLUMNS):
        table = pa.Table.from_batches([batch])
        rows += batch.num_rows
        for name, d in DERIVED.items():
            parts = held[name]
            parts.append(d.compute(table))
            if sum(p.num_rows for p in parts) > MERGE_ROWS:  # merged now and then: memory stays a few batches
                held[name] = [d.merge(parts)]
    written = []
    for name, d in DERIVED.items():
        schema = arrow_schema(name)
        parts = held[name]
        table = d.merge(parts) if len(parts) > 1 else parts[0] if parts else schema.empty_table()
        table = table.select(schema.names).cast(schema.remove_metadata())
        footer = file_metadata(schema, proxy_id=md.get(META_PROXY, b"").decode(), run=md.get(META_RUN, b"").decode(),
                               seq=md.get(META_SEQ, b"").decode(), rows=table.num_rows, dropped=0, dropped_total=0)
        footer[META_SOURCE_ROWS] = str(rows).encode()
        out = derived_path(requests_file, name)
        write_atomic([table], out, footer, ParquetOptions(name, fsync=fsync))
        written.append(out)
    return written


def write_missing(root: Path | str, fsync: bool = True) -> tuple[int, int]:
    """Write the rollups of every live requests file of a local recording that lacks any; (files done, skipped).

    For recordings made before the writer stored rollups, or with compaction off. Files of an older
    format are skipped: an analysis reads those requests themselves.
    """
    listing = live_files(root, "requests")
    if listing is None:
        raise ValueError(f"{root}: not a local path")
    done = set.intersection(*(set(_live(root, name).relative) for name in DERIVED))
    written = skipped = 0
    for rel, path in zip(listing.relative, listing.paths):
        if rel in done:
            continue
        if file_version(path) != FORMAT_VERSION:
            skipped += 1
            continue
        write_rollups(Path(path), fsync=fsync)
        written += 1
    return written, skipped


def _live(root: Path | str, dataset: str):
    listing = live_files(root, dataset)
    assert listing is not None  # the caller listed the requests of the same root
    return listing


@dataclass(frozen=True)
class Coverage:
    """Which requests files of one recording have their rollup in one derived dataset."""

    requests: int  # live requests files
    covered: tuple[str, ...]  # the rollup files of those that have one, spelled for Spark

    @property
    def complete(self) -> bool:
        return self.requests > 0 and len(self.covered) == self.requests


def coverage(root: str, dataset: str) -> Coverage | None:
    """The `dataset` files standing for the live requests files of `root`; None where pyarrow cannot list it."""
    requests = live_files(root, "requests")
    if requests is None:
        return None
    derived = _live(root, dataset)
    have = set(derived.relative)
    return Coverage(len(requests.relative), tuple(f"{derived.spelled_base}/{rel}" for rel in requests.relative if rel in have))
