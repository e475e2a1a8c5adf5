"""ParquetRecorder: the relay's rows to Hive-partitioned Parquet, off the event loop.

Why this shape
--------------
* **The event loop only appends.** `request()`/`connection()`/`tcp()`/`frame()`
  do a length check and a `deque.append` (O(1), no lock, never blocks). When a
  dataset's queue is full the row is dropped and counted; the proxy keeps
  forwarding. Each counter is written by exactly one thread (enqueue side by
  the loop, dequeue side by the writer), so no lock is needed.
* **One writer thread** wakes every `flush_interval_s`, drains the queues,
  converts rows to Arrow in small chunks (the conversion holds the GIL; small
  chunks let the loop thread in between), sorts them for compression and
  writes **each flush as its own small Parquet file**: `.tmp-…` first (Spark
  and pyarrow ignore dot-files), fsync, then `rename()` to `part-…`. A file is
  therefore either absent or complete: `kill -9` loses at most the rows still
  queued (≤ one flush interval) and every `part-*.parquet` is valid.
* **Compaction** (on its own thread, so merging never delays a flush) keeps
  the file count sane for Spark: every
  `compact_interval_s` (or when a segment reaches `rotate_bytes`, or its hour
  partition is left, or on close) the flush files of a segment are merged into
  one `part-<run>-<first>-<last>.parquet` (again via `.tmp-` + rename), then
  the inputs are deleted (`recording.compaction`). A crash between the rename
  and the deletes leaves duplicates that `recover()` (run at start-up) and the
  reader (`recording.reader`) both resolve by file name
  (`recording.layout.superseded`).
* **Partitions** follow the rows' own time (requests: `req_first_ns`, others:
  their timestamp), so a Spark job pruning by `date`/`hour` never misses rows
  written just after the hour turned.
* **Redaction is enforced here too**: SaslAuthenticate (api key 36) frames are
  never queued, whatever the relay sends, and request frames whose header does
  not match the row (e.g. raw SASL tokens after a v0 handshake) are refused.

Layout and file names: `recording.layout`; how one file is written: `recording.files`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import structlog

from protocol.apis import SASL_AUTHENTICATE
from recording.compaction import Compactor, FlushFile, Segment, name_os_thread, take_due
from recording.files import ParquetOptions, file_metadata, write_atomic
from recording.layout import HOUR_NS, TIME_COLUMN, flush_name, new_run_id, partition_dir, recover
from recording.schema import COLUMNS, arrow_schema

__all__ = ["ParquetRecorder", "RecordingError", "check_recording_dir", "recover", "CAPTURE_CHOICES"]

log = structlog.get_logger("kafkatap.recorder")

Row = dict[str, Any]

CAPTURE_CHOICES = ("none", "requests", "all")
_CONVERT_CHUNK = 512  # rows per Arrow conversion call: bounds how long the writer holds the GIL
_ROW_BYTES_GUESS = 2048  # before the first row is measured: about a request row with its dict and values
_SIZE_SAMPLE = 256  # re-measure a dataset's row size on every 256th row: the hot path stays O(1)


def _row_size(row: Row) -> int:
    """Memory of a row dict and its values, one level deep: cheap, and close for these flat rows."""
    size = sys.getsizeof(row)
    for v in row.values():
        size += sys.getsizeof(v)
        if isinstance(v, (list, dict)):
            size += sum(sys.getsizeof(x) for x in v)
    return size


class RecordingError(RuntimeError):
    """The recording directory cannot be used (message says why and what to do)."""


class _Stream:
    """Queue and writer state of one dataset."""

    def __init__(self, name: str, cap_rows: int, cap_bytes: int) -> None:
        self.name = name
        self.schema = arrow_schema(name)
        self.struct = pa.struct(list(self.schema))
        self.names = set(self.schema.names)
        self.queue: deque[Row] = deque()
        self.cap_rows = cap_rows
        self.cap_bytes = cap_bytes  # estimated queue memory (rows × row_bytes; frames: their data)
        # written by the loop thread only
        self.row_bytes = _ROW_BYTES_GUESS  # running estimate of one queued row's memory
        self.enqueued = 0
        self.dropped = 0
        self.enq_bytes = 0
        # written by the writer thread only
        self.deq_bytes = 0
        self.write_dropped = 0  # rows lost to write errors / invalid rows / no disk space
        self.dropped_reported = 0
        self.dropped_logged = 0
        self.rows_written = 0
        self.files_written = 0
        self.segments: dict[Path, Segment] = {}
        self.time_col = TIME_COLUMN[name]

    def dropped_total(self) -> int:
        return self.dropped + self.write_dropped


def check_recording_dir(root: Path | str, min_free_bytes: int = 64 << 20) -> Path:
    """Create `root` if needed and prove it is writable with enough free space, or raise RecordingError.

    Why at start-up: a proxy that silently drops every row because its
    directory is read-only is worse than one that refuses to start.
    """
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".tmp-probe-{os.getpid()}-{secrets.token_hex(3)}"
        with open(probe, "wb") as f:
            f.write(b"kafkatap")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as exc:
        raise RecordingError(
            f"cannot write recordings to {root}: {exc.strerror or exc}. "
            "Choose a writable --record directory (or fix its permissions)."
        ) from exc
    free = shutil.disk_usage(root).free
    if free < min_free_bytes:
        raise RecordingError(
            f"only {free / 2**20:.0f} MiB free under {root}; recording needs at least "
            f"{min_free_bytes / 2**20:.0f} MiB. Free some space or record elsewhere."
        )
    return root


class ParquetRecorder:
    """A RecordSink writing the four datasets as Parquet, see the module docstring.

    Thread model: the row methods run on the event loop thread; `start()` and
    `close()` may be called from any thread (`close()` joins the writer, so
    call it from an executor if the loop must keep running meanwhile).
    """

    def __init__(
        self,
        root: Path | str,
        proxy_id: str,
        *,
        capture: str = "none",
        flush_interval_s: float = 1.0,
        queue_rows: int = 200_000,
        queue_bytes: int = 256 << 20,
        frame_queue_bytes: int = 64 << 20,
        compact_interval_s: float = 60.0,
        rotate_bytes: int = 128 << 20,
        min_free_bytes: int = 64 << 20,
        fsync: bool = True,
        compression_level: int = 3,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if capture not in CAPTURE_CHOICES:
            raise ValueError(f"capture must be one of {CAPTURE_CHOICES}, not {capture!r}")
        if flush_interval_s <= 0:
            raise ValueError("flush_interval_s must be positive")
        self.root = Path(root)
        self.proxy_id = proxy_id
        # requests the relay saw but gave no row, by reason (the server's own dict, wired by `kafkatap proxy`):
        # written into every requests file's footer beside the recorder's own drops
        self.requests_dropped: dict[str, int] = {}
        self.capture = capture
        self.flush_interval_s = flush_interval_s
        self.frame_queue_bytes = frame_queue_bytes
        self.compact_interval_s = compact_interval_s
        self.rotate_bytes = rotate_bytes
        self.min_free_bytes = min_free_bytes
        self.fsync = fsync
        self.compression_level = compression_level
        self._clock_ns = clock_ns
        self.run = new_run_id()
        self._seq = 0
        # queue_bytes bounds the row datasets' queues (rows were bounded only by count: ~350 MiB at the cap):
        # half for requests, the rest shared by the others; frames keep their own frame_queue_bytes
        others = [n for n in COLUMNS if n not in ("frames", "requests")]
        cap_bytes = {"requests": queue_bytes // 2, "frames": frame_queue_bytes,
                     **{n: queue_bytes // 2 // len(others) for n in others}}
        self._streams = {name: _Stream(name, queue_rows if name != "frames" else max(1, queue_rows // 4),
                                       cap_bytes[name])
                         for name in COLUMNS}
        self._req, self._conn, self._tcp, self._frames = (self._streams[n] for n in
                                                          ("requests", "connections", "tcp", "frames"))
        self.frames_redacted = 0  # SaslAuthenticate / unverifiable frames refused (loop thread)
        self.write_errors = 0
        self._last_error_log = 0.0
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._options = {name: ParquetOptions(name, compression_level, fsync) for name in COLUMNS}
        self._compactor = Compactor(self.run, self._write_file, self._error)
        self._closed = False
        self._lock = threading.Lock()  # serializes flushes (writer thread vs. close on another thread)

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> "ParquetRecorder":
        """Check the directory (RecordingError if unusable), clean leftovers, start the writer thread."""
        check_recording_dir(self.root, self.min_free_bytes)
        removed = recover(self.root, self.proxy_id)
        if removed:
            log.info("recording leftovers cleaned", root=str(self.root), files=removed)
        self._thread = threading.Thread(target=self._run, name="kafkatap-recorder", daemon=True)
        self._thread.start()
        if self.compact_interval_s > 0:
            # its own thread, so a long merge never delays the next flush (the kill -9 bound)
            self._compactor.start()
        log.info("recording", root=str(self.root), proxy_id=self.proxy_id, capture=self.capture,
                 flush_interval_s=self.flush_interval_s, run=self.run)
        return self

    def close(self) -> None:
        """Write every queued row, compact, stop the writer. Loses nothing; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        else:  # never started: still write what was queued
            self._flush(final=True)
        self._compactor.close()
        log.info("recording closed", root=str(self.root), **self.stats())

    # -- RecordSink: event loop thread, O(1), never blocks --------------------------
    def request(self, row: Row) -> None:
        self._offer(self._req, row)

    def connection(self, row: Row) -> None:
        self._offer(self._conn, row)

    def tcp(self, row: Row) -> None:
        self._offer(self._tcp, row)

    def topic(self, row: Row) -> None:
        """One topic id ↔ name pair the proxy learned (`topics/`)."""
        self._offer(self._streams["topics"], row)

    @staticmethod
    def _offer(s: _Stream, row: Row) -> None:
        """Queue a row unless its dataset's queue is full by count or by estimated bytes (then drop and count)."""
        n = len(s.queue)
        if n < s.cap_rows and n * s.row_bytes < s.cap_bytes:
            s.queue.append(row)
            s.enqueued += 1
            if s.enqueued % _SIZE_SAMPLE == 1:  # the first row, then every 256th: keeps up with bigger rows
                size = _row_size(row)
                s.row_bytes = size if s.enqueued == 1 else max(size, (s.row_bytes + size) // 2)
        else:
            s.dropped += 1

    def frame(self, row: Row) -> None:
        capture = self.capture
        if capture == "none":
            return
        direction = row.get("direction")
        if capture == "requests" and direction != "request":
            return
        if not self._frame_allowed(row, direction):
            self.frames_redacted += 1
            return
        s = self._frames
        data = row.get("data") or b""
        if len(s.queue) < s.cap_rows and s.enq_bytes - s.deq_bytes + len(data) <= s.cap_bytes:
            s.queue.append(row)
            s.enqueued += 1
            s.enq_bytes += len(data)
        else:
            s.dropped += 1

    @staticmethod
    def _frame_allowed(row: Row, direction: Any) -> bool:
        """Never keep SaslAuthenticate bytes; keep a request frame only if its own header agrees with the row."""
        api_key = row.get("api_key")
        if api_key is None or api_key == SASL_AUTHENTICATE:
            return False
        if direction == "request":
            data = row.get("data")
            if not data or len(data) < 8:
                return False
            hdr_key = int.from_bytes(data[4:6], "big", signed=True)
            hdr_ver = int.from_bytes(data[6:8], "big", signed=True)
            if hdr_key != api_key or hdr_key == SASL_AUTHENTICATE or hdr_ver != row.get("api_version", hdr_ver):
                return False
        return True

    # -- introspection (any thread) ----------------------------------------------------
    def queue_depth(self) -> dict[str, int]:
        return {name: len(s.queue) for name, s in self._streams.items()}

    def dropped(self) -> dict[str, int]:
        return {name: s.dropped_total() for name, s in self._streams.items()}

    def stats(self) -> dict[str, Any]:
        return {
            "rows_written": {n: s.rows_written for n, s in self._streams.items()},
            "files_written": sum(s.files_written for s in self._streams.values()),
            "dropped": self.dropped(),
            "queued": self.queue_depth(),
            "frames_redacted": self.frames_redacted,
            "write_errors": self.write_errors,
        }

    # -- writer thread ---------------------------------------------------------------
    def _run(self) -> None:
        name_os_thread(b"kafkatap-rec")
        while not self._stopping:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._stopping:
                break
            self._flush(final=False)
        self._flush(final=True)

    def _flush(self, final: bool) -> None:
        with self._lock:
            for s in self._streams.values():
                try:
                    self._flush_stream(s)
                    self._compact_due(s, force=final)
                except Exception as exc:  # the writer must survive anything a row or the disk throws at it
                    self._error("recording flush failed", exc, dataset=s.name)
                self._log_drops(s)
            if final:
                # rows that arrived while we were flushing the other datasets
                for s in self._streams.values():
                    if s.queue:
                        try:
                            self._flush_stream(s)
                            self._compact_due(s, force=True)
                        except Exception as exc:
                            self._error("recording flush failed", exc, dataset=s.name)

    def _drain(self, s: _Stream) -> list[Row]:
        rows: list[Row] = []
        pop = s.queue.popleft
        n = len(s.queue)  # only what is there now; later rows go to the next flush
        for _ in range(n):
            rows.append(pop())
        if s.name == "frames":
            s.deq_bytes += sum(len(r.get("data") or b"") for r in rows)
        return rows

    def _to_table(self, s: _Stream, rows: list[Row]) -> pa.Table:
        """Rows → Arrow in chunks; a chunk that does not convert is retried row by row and bad rows dropped."""
        batches = []
        for i in range(0, len(rows), _CONVERT_CHUNK):
            chunk = rows[i:i + _CONVERT_CHUNK]
            try:
                arr = pa.array(chunk, type=s.struct)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                good = []
                for r in chunk:
                    try:
                        pa.array([r], type=s.struct)
                        good.append(r)
                    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
                        s.write_dropped += 1
                        self._error("recording row does not match the schema", exc, dataset=s.name)
                if not good:
                    continue
                arr = pa.array(good, type=s.struct)
            batches.append(pa.RecordBatch.from_struct_array(arr))
        if not batches:
            return s.schema.empty_table()
        return pa.Table.from_batches(batches)

    def _flush_stream(self, s: _Stream) -> None:
        rows = self._drain(s)
        if not rows:
            return
        table = self._to_table(s, rows)
        if s.name == "frames":  # defense in depth: never SaslAuthenticate, whatever got queued
            table = table.filter(pc.fill_null(pc.not_equal(table["api_key"], SASL_AUTHENTICATE), False))
        if table.num_rows == 0:
            return
        for directory, part in self._split_by_hour(s, table):
            self._write_flush_file(s, directory, part)

    def _split_by_hour(self, s: _Stream, table: pa.Table) -> list[tuple[Path, pa.Table]]:
        now = self._clock_ns()
        ts = pc.fill_null(table[s.time_col], now)
        hours = pc.divide(ts, HOUR_NS)
        uniq = pc.unique(hours).to_pylist()
        parts = []
        for h in sorted(uniq):
            part = table if len(uniq) == 1 else table.filter(pc.equal(hours, h))
            parts.append((partition_dir(self.root, s.name, self.proxy_id, h), part))
        return parts

    def _write_file(self, s: _Stream, tables: Iterable[pa.Table], path: Path, seq: str, dropped: int,
                    rows: int) -> int:
        """Write one flush or merged file of `s` (footer: format version, run, sequence range, drops)."""
        md = file_metadata(s.schema, proxy_id=self.proxy_id, run=self.run, seq=seq, rows=rows,
                           dropped=dropped, dropped_total=s.dropped_total())
        if s.name == "requests":
            relay = dict(self.requests_dropped)  # a copy: the loop thread keeps counting
            md[b"kafkatap.requests_dropped_by_relay"] = ",".join(f"{k}={v}" for k, v in sorted(relay.items())).encode()
        return write_atomic(tables, path, md, self._options[s.name])

    def _write_flush_file(self, s: _Stream, directory: Path, table: pa.Table) -> None:
        if shutil.disk_usage(self.root).free < self.min_free_bytes // 4:
            s.write_dropped += table.num_rows
            self._error("recording disk nearly full: dropping rows", None, dataset=s.name,
                        free_mib=shutil.disk_usage(self.root).free // 2**20)
            return
        self._seq += 1
        seq = self._seq
        dropped = s.dropped_total() - s.dropped_reported
        path = directory / flush_name(self.run, seq)
        try:
            size = self._write_file(s, [table], path, f"{seq}-{seq}", dropped, table.num_rows)
        except OSError as exc:
            s.write_dropped += table.num_rows
            self._error("recording write failed: dropping rows", exc, dataset=s.name, rows=table.num_rows)
            return
        s.dropped_reported += dropped
        s.rows_written += table.num_rows
        s.files_written += 1
        if self.compact_interval_s <= 0:  # compaction off: every flush file stays as written
            return
        seg = s.segments.get(directory)
        if seg is None:
            seg = s.segments[directory] = Segment(directory, time.monotonic())
        seg.files.append(FlushFile(seq, path, table.num_rows, dropped))
        seg.bytes += size

    # -- compaction (recording.compaction) ----------------------------------------------
    def _compact_due(self, s: _Stream, force: bool) -> None:
        for seg in take_due(s.segments, now=time.monotonic(), force=force, rotate_bytes=self.rotate_bytes,
                            interval_s=self.compact_interval_s):
            self._compactor.submit(s, seg)

    # -- logging ----------------------------------------------------------------------
    def _log_drops(self, s: _Stream) -> None:
        total = s.dropped_total()
        if total != s.dropped_logged:
            log.warning("recording dropped rows (queue full or write failed); the proxy kept forwarding",
                        dataset=s.name, dropped=total - s.dropped_logged, dropped_total=total,
                        queue_rows=len(s.queue), queue_cap=s.cap_rows)
            s.dropped_logged = total

    def _error(self, msg: str, exc: BaseException | None, **kw: Any) -> None:
        self.write_errors += 1
        now = time.monotonic()
        if now - self._last_error_log >= self.flush_interval_s:  # once per interval, not once per row
            self._last_error_log = now
            log.error(msg, error=repr(exc) if exc else None, errors_total=self.write_errors, **kw)

