"""Compaction: a segment's small flush files merged into one file, on a thread of its own.

Why: one file per flush (every second) is what bounds the loss on `kill -9`,
but a day of them is ~86 000 files per dataset, which Spark lists and opens
slowly. So the flush files of one partition directory (a *segment*) are merged
into `part-<run>-<first>-<last>.parquet` every `compact_interval_s`, when the
segment reaches `rotate_bytes`, when its hour is left, or on close.

Order matters for crashes: the merged file is written (dot-file, fsync,
rename) *before* the inputs are deleted. A crash in between leaves both; the
superseded rule in `recording.layout` makes readers count those rows once and
`recover()` deletes the leftovers at the next start. Merging on its own thread
means a long merge never delays the next flush (the kill -9 bound).

Memory: a merge streams its inputs row group by row group and writes a row
group per `MERGE_BATCH_BYTES` of them (sorted within it), so merging a 128 MiB
segment never holds the segment in memory (it used to load and sort it whole).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from recording.layout import merged_name
from recording.thread_names import name_os_thread

__all__ = ["FlushFile", "Segment", "take_due", "Compactor", "remove_inputs", "read_batches"]

MERGE_BATCH_BYTES = 32 << 20  # Arrow bytes per written row group: bounds a merge's memory, keeps sorting useful


class _Stream(Protocol):
    name: str
    schema: pa.Schema


@dataclass(frozen=True)
class FlushFile:
    seq: int
    path: Path
    rows: int
    dropped: int  # rows dropped since the previous file, as written in its footer
    interim: bool = False  # written the cheap way (recording.files.ParquetOptions): rewritten even when alone


@dataclass
class Segment:
    """Flush files of one dataset in one partition directory, waiting to be compacted."""

    directory: Path
    started: float  # time.monotonic() of its first file
    files: list[FlushFile] = field(default_factory=list)
    bytes: int = 0
    closes: bool = False  # its hour was left or the writer closes: its directory is done (a late row may still reopen it)


def take_due(segments: dict[Path, Segment], *, now: float, force: bool, rotate_bytes: int,
             interval_s: float) -> list[Segment]:
    """Remove the segments due for compaction from `segments` and return them.

    The newest directory keeps collecting unless it is old or big enough;
    any older one (its hour was left) is due at once.
    """
    newest = max(segments, key=str) if segments else None
    out = []
    for directory, seg in list(segments.items()):
        due = (force or directory != newest or seg.bytes >= rotate_bytes
               or (interval_s > 0 and now - seg.started >= interval_s))
        if not due:
            continue
        del segments[directory]
        seg.closes = force or directory != newest
        if seg.files:
            out.append(seg)
    return out


def remove_inputs(seg: Segment) -> None:
    """Delete the flush files a merged file now holds (the step a crash can skip)."""
    for f in seg.files:
        f.path.unlink(missing_ok=True)


# write(stream, tables, path, seq_label, dropped, rows) -> bytes written; raises OSError on failure
WriteFile = Callable[[Any, Iterable[pa.Table], Path, str, int, int], int]
# on_error(kind, message, exc, **fields): kind is "compaction" (the flush files stay) or "rollups" (derived data)
OnError = Callable[..., None]
# final(stream, path, closes): a file that compaction will not touch again (merged, or alone in its segment);
# `closes` when it is the last of this run in its directory (Segment.closes)
OnFinal = Callable[[Any, Path, bool], None]


class Compactor:
    """Merges segments inline, or on its own thread once `start()`ed; hands every final file to `on_final`."""

    def __init__(self, run: str, write: WriteFile, on_error: OnError, on_final: OnFinal | None = None) -> None:
        self.run = run
        self._write = write
        self._on_error = on_error
        self._on_final = on_final
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="kafkatap-compactor", daemon=True)
        self._thread.start()

    def submit(self, stream: _Stream, seg: Segment) -> None:
        if self._thread is not None:
            self._queue.put((stream, seg))
        else:
            self.merge(stream, seg)

    def close(self) -> None:
        """Finish every submitted merge, then stop the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()

    def _loop(self) -> None:
        name_os_thread(b"kafkatap-cmp")
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self.merge(*item)
            except Exception as exc:  # the flush files stay valid; only the merge is lost
                self._on_error("compaction", "recording compaction failed; keeping the flush files", exc, dataset=item[0].name)

    def merge(self, stream: _Stream, seg: Segment) -> Path | None:
        """Merge the segment, then hand the final file to `on_final`. A segment of one file written for good (not
        `interim`) stays as it is; an interim one is rewritten, sorted and compressed, like any merge."""
        alone = len(seg.files) == 1 and not seg.files[0].interim
        out = seg.files[0].path if alone else self._merged(stream, seg)
        if out is None and len(seg.files) == 1:  # a lone interim file not rewritten (said): it is final as it is
            out = seg.files[0].path
        if out is not None and self._on_final is not None:
            try:
                self._on_final(stream, out, seg.closes)
            except Exception as exc:  # derived data only: the file itself is complete and stays
                self._on_error("rollups", "recording: could not write a requests file's rollups", exc,
                               dataset=stream.name, file=str(out))
        return out

    def _merged(self, stream: _Stream, seg: Segment) -> Path | None:
        """Write the merged file, then delete its inputs; on a write error keep the inputs (nothing lost)."""
        first, last = seg.files[0].seq, seg.files[-1].seq
        out = seg.directory / merged_name(self.run, first, last)
        try:
            self._write(stream, read_batches([f.path for f in seg.files], stream.schema), out, f"{first}-{last}",
                        sum(f.dropped for f in seg.files), sum(f.rows for f in seg.files))
        except OSError as exc:
            self._on_error("compaction", "recording compaction failed; keeping the flush files", exc, dataset=stream.name)
            return None
        try:
            remove_inputs(seg)
        except OSError as exc:  # the merged file is complete: readers skip the inputs it supersedes, recover() deletes them
            self._on_error("compaction", "recording compaction could not delete the merged flush files; readers skip "
                           "them, and the next start deletes them", exc, dataset=stream.name)
        return out  # final either way: its rollups are due (`on_final`)


def read_batches(paths: list[Path], schema: pa.Schema, batch_bytes: int | None = None) -> Iterator[pa.Table]:
    """The rows of `paths` in order, as tables of about `batch_bytes`, read one row group at a time."""
    limit = MERGE_BATCH_BYTES if batch_bytes is None else batch_bytes
    held: list[pa.Table] = []
    size = 0
    for path in paths:
        with pq.ParquetFile(path) as pf:
            for i in range(pf.num_row_groups):
                t = pf.read_row_group(i)
                if not t.schema.equals(schema, check_metadata=False):
                    t = t.select(schema.names).cast(schema)
                held.append(t.replace_schema_metadata(None))
                size += t.nbytes
                if size >= limit:
                    yield pa.concat_tables(held)
                    held, size = [], 0
    if held:
        yield pa.concat_tables(held)
