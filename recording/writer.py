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
  the inputs are deleted. A crash between the rename and the deletes leaves
  duplicates that `recover()` (run at start-up) and the reader
  (`recording.reader`) both resolve by file name.
* **Partitions** follow the rows' own time (requests: `req_first_ns`, others:
  their timestamp), so a Spark job pruning by `date`/`hour` never misses rows
  written just after the hour turned.
* **Redaction is enforced here too**: SaslAuthenticate (api key 36) frames are
  never queued, whatever the relay sends, and request frames whose header does
  not match the row (e.g. raw SASL tokens after a v0 handshake) are refused.

Layout: ``DIR/<dataset>/proxy=<id>/date=YYYY-MM-DD/hour=HH/part-<run>-<seq>.parquet``.
"""

from __future__ import annotations

import os
import queue
import re
import secrets
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import structlog

from recording.schema import COLUMNS, FORMAT_KEY, FORMAT_VERSION, arrow_schema

log = structlog.get_logger("kafkatap.recorder")

Row = dict[str, Any]

SASL_AUTHENTICATE = 36
CAPTURE_CHOICES = ("none", "requests", "all")

# Keys of the per-file key/value metadata (besides the schema's own).
META_DROPPED = b"kafkatap.dropped_rows"  # rows dropped since the previous file of this dataset
META_DROPPED_TOTAL = b"kafkatap.dropped_rows_total"  # since the recorder started
META_PROXY = b"kafkatap.proxy_id"
META_RUN = b"kafkatap.run"
META_SEQ = b"kafkatap.seq"  # "first-last" flush sequence numbers the file holds
META_ROWS = b"kafkatap.rows"

# Row time (partition) and sort order per dataset. Sorting by connection then
# time turns the timestamp columns into small deltas and the string columns
# into long runs, which is most of what gets a request row under 40 bytes.
TIME_COLUMN = {"requests": "req_first_ns", "connections": "snapshot_ns", "tcp": "ts_ns", "frames": "ts_ns"}
SORT_KEYS = {
    "requests": ["api_key", "conn_id", "req_first_ns"],
    "connections": ["conn_id", "snapshot_ns"],
    "tcp": ["conn_id", "side", "ts_ns"],
    "frames": ["conn_id", "ts_ns"],
}
_HOUR_NS = 3600 * 1_000_000_000
_CONVERT_CHUNK = 512  # rows per Arrow conversion call: bounds how long the writer holds the GIL
_FILE_RE = re.compile(r"^part-(?P<run>[0-9TZ]+-[0-9a-f]+)-(?P<first>\d{8})(?:-(?P<last>\d{8}))?\.parquet$")


class RecordingError(RuntimeError):
    """The recording directory cannot be used (message says why and what to do)."""


@dataclass
class _Segment:
    """Flush files of one dataset in one partition directory, waiting to be compacted."""

    directory: Path
    started: float
    files: list[tuple[int, Path, int, int]] = field(default_factory=list)  # (seq, path, rows, dropped)
    bytes: int = 0


class _Stream:
    """Queue and writer state of one dataset."""

    def __init__(self, name: str, cap_rows: int) -> None:
        self.name = name
        self.schema = arrow_schema(name)
        self.struct = pa.struct(list(self.schema))
        self.names = set(self.schema.names)
        self.queue: deque[Row] = deque()
        self.cap_rows = cap_rows
        # written by the loop thread only
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
        self.segments: dict[Path, _Segment] = {}
        ts = TIME_COLUMN[name]
        self.time_col = ts
        self.use_dictionary = [c.name for c in COLUMNS[name] if not (c.name.endswith("_ns") or c.name == "data")]
        self.encodings = {c.name: "DELTA_BINARY_PACKED" for c in COLUMNS[name] if c.name.endswith("_ns")}

    def dropped_total(self) -> int:
        return self.dropped + self.write_dropped


def _safe_segment(value: str) -> str:
    """A proxy id usable as a directory name on every filesystem and in Hive partitions."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", value) or "proxy"


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
        self.capture = capture
        self.flush_interval_s = flush_interval_s
        self.frame_queue_bytes = frame_queue_bytes
        self.compact_interval_s = compact_interval_s
        self.rotate_bytes = rotate_bytes
        self.min_free_bytes = min_free_bytes
        self.fsync = fsync
        self.compression_level = compression_level
        self._clock_ns = clock_ns
        self.run = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(2)
        self._seq = 0
        self._streams = {name: _Stream(name, queue_rows if name != "frames" else max(1, queue_rows // 4))
                         for name in COLUMNS}
        self._req, self._conn, self._tcp, self._frames = (self._streams[n] for n in
                                                          ("requests", "connections", "tcp", "frames"))
        self.frames_redacted = 0  # SaslAuthenticate / unverifiable frames refused (loop thread)
        self.write_errors = 0
        self._last_error_log = 0.0
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._compactor: threading.Thread | None = None
        self._compact_q: queue.SimpleQueue = queue.SimpleQueue()
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
            self._compactor = threading.Thread(target=self._run_compactor, name="kafkatap-compactor", daemon=True)
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
        if self._compactor is not None:
            self._compact_q.put(None)
            self._compactor.join()
        log.info("recording closed", root=str(self.root), **self.stats())

    # -- RecordSink: event loop thread, O(1), never blocks --------------------------
    def request(self, row: Row) -> None:
        s = self._req
        if len(s.queue) < s.cap_rows:
            s.queue.append(row)
            s.enqueued += 1
        else:
            s.dropped += 1

    def connection(self, row: Row) -> None:
        s = self._conn
        if len(s.queue) < s.cap_rows:
            s.queue.append(row)
            s.enqueued += 1
        else:
            s.dropped += 1

    def tcp(self, row: Row) -> None:
        s = self._tcp
        if len(s.queue) < s.cap_rows:
            s.queue.append(row)
            s.enqueued += 1
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
        if len(s.queue) < s.cap_rows and s.enq_bytes - s.deq_bytes + len(data) <= self.frame_queue_bytes:
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
        _name_os_thread(b"kafkatap-rec")
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
        hours = pc.divide(ts, _HOUR_NS)
        uniq = pc.unique(hours).to_pylist()
        parts = []
        for h in sorted(uniq):
            part = table if len(uniq) == 1 else table.filter(pc.equal(hours, h))
            parts.append((self._partition_dir(s.name, h), part))
        return parts

    def _partition_dir(self, dataset: str, hour_index: int) -> Path:
        t = time.gmtime(hour_index * 3600)
        return (self.root / dataset / f"proxy={_safe_segment(self.proxy_id)}"
                / f"date={time.strftime('%Y-%m-%d', t)}" / f"hour={t.tm_hour:02d}")

    def _file_metadata(self, s: _Stream, rows: int, seq: str, dropped: int) -> dict[bytes, bytes]:
        md = dict(s.schema.metadata or {})
        md.update({
            FORMAT_KEY: str(FORMAT_VERSION).encode(),
            META_DROPPED: str(dropped).encode(),
            META_DROPPED_TOTAL: str(s.dropped_total()).encode(),
            META_PROXY: self.proxy_id.encode(),
            META_RUN: self.run.encode(),
            META_SEQ: seq.encode(),
            META_ROWS: str(rows).encode(),
        })
        return md

    def _write_parquet(self, s: _Stream, table: pa.Table, final_path: Path, metadata: dict[bytes, bytes]) -> int:
        """Write `table` sorted to a dot-file, fsync, rename: readers never see a partial file."""
        table = table.sort_by([(k, "ascending") for k in SORT_KEYS[s.name]]).replace_schema_metadata(metadata)
        tmp = final_path.with_name(".tmp-" + final_path.name)
        final_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(tmp, "wb") as f:
                pq.write_table(
                    table, f, compression="zstd", compression_level=self.compression_level,
                    use_dictionary=s.use_dictionary, column_encoding=s.encodings,
                    row_group_size=1_000_000, write_statistics=True,
                )
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, final_path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return final_path.stat().st_size

    def _write_flush_file(self, s: _Stream, directory: Path, table: pa.Table) -> None:
        if shutil.disk_usage(self.root).free < self.min_free_bytes // 4:
            s.write_dropped += table.num_rows
            self._error("recording disk nearly full: dropping rows", None, dataset=s.name,
                        free_mib=shutil.disk_usage(self.root).free // 2**20)
            return
        self._seq += 1
        seq = self._seq
        dropped = s.dropped_total() - s.dropped_reported
        path = directory / f"part-{self.run}-{seq:08d}.parquet"
        try:
            size = self._write_parquet(s, table, path, self._file_metadata(s, table.num_rows, f"{seq}-{seq}", dropped))
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
            seg = s.segments[directory] = _Segment(directory, time.monotonic())
        seg.files.append((seq, path, table.num_rows, dropped))
        seg.bytes += size

    # -- compaction -------------------------------------------------------------------
    def _compact_due(self, s: _Stream, force: bool) -> None:
        now = time.monotonic()
        newest = max(s.segments, key=lambda d: str(d)) if s.segments else None
        for directory, seg in list(s.segments.items()):
            due = (force or directory != newest or seg.bytes >= self.rotate_bytes
                   or (self.compact_interval_s > 0 and now - seg.started >= self.compact_interval_s))
            if not due:
                continue
            del s.segments[directory]
            if len(seg.files) >= 2:
                if self._compactor is not None:
                    self._compact_q.put((s, seg))
                else:
                    self._compact(s, seg)

    def _run_compactor(self) -> None:
        _name_os_thread(b"kafkatap-cmp")
        while True:
            item = self._compact_q.get()
            if item is None:
                return
            try:
                self._compact(*item)
            except Exception as exc:  # the flush files stay valid; only the merge is lost
                self._error("recording compaction failed; keeping the flush files", exc, dataset=item[0].name)

    def _compact(self, s: _Stream, seg: _Segment) -> None:
        tables = []
        for _, path, _, _ in seg.files:
            tables.append(pq.read_table(path, schema=s.schema))
        table = pa.concat_tables(tables)
        first, last = seg.files[0][0], seg.files[-1][0]
        dropped = sum(f[3] for f in seg.files)
        out = seg.directory / f"part-{self.run}-{first:08d}-{last:08d}.parquet"
        try:
            self._write_parquet(s, table, out, self._file_metadata(s, table.num_rows, f"{first}-{last}", dropped))
        except OSError as exc:  # the small files are still there and valid: nothing lost
            self._error("recording compaction failed; keeping the flush files", exc, dataset=s.name)
            return
        for _, path, _, _ in seg.files:
            path.unlink(missing_ok=True)

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


def _name_os_thread(name: bytes) -> None:
    """Give the writer thread a kernel-visible name (top -H, /proc/PID/task/*/comm) so its CPU can be told apart."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)  # PR_SET_NAME
    except Exception:  # noqa: BLE001 — cosmetic only
        pass


def recover(root: Path | str, proxy_id: str | None = None) -> int:
    """Remove what a crash can leave behind: stale `.tmp-` files and flush files already merged.

    Returns the number of files removed. With `proxy_id`, only that proxy's
    partitions are touched, so proxies sharing one recording root never remove
    each other's in-progress `.tmp-` files (the recorder runs it that way,
    before its writer thread starts). Without it, the whole root is cleaned:
    only do that while no proxy writes there.
    """
    root = Path(root)
    removed = 0
    if not root.is_dir():
        return 0
    if proxy_id is not None:
        part = f"proxy={_safe_segment(proxy_id)}"
        tops = [root / ds / part for ds in COLUMNS if (root / ds / part).is_dir()]
    else:
        tops = [root]
    walk = [w for top in tops for w in os.walk(top)]
    for dirpath, _dirnames, filenames in walk:
        d = Path(dirpath)
        merged: list[tuple[str, int, int]] = []
        singles: list[tuple[str, int, str]] = []
        for name in filenames:
            if name.startswith(".tmp-"):
                (d / name).unlink(missing_ok=True)
                removed += 1
                continue
            m = _FILE_RE.match(name)
            if not m:
                continue
            if m["last"]:
                merged.append((m["run"], int(m["first"]), int(m["last"])))
            else:
                singles.append((m["run"], int(m["first"]), name))
        for run, seq, name in singles:
            if any(r == run and a <= seq <= b for r, a, b in merged):
                (d / name).unlink(missing_ok=True)
                removed += 1
    return removed


def superseded(names: list[str]) -> set[str]:
    """File names (same directory) that a merged file already contains: the reader skips them."""
    merged = []
    for n in names:
        m = _FILE_RE.match(n)
        if m and m["last"]:
            merged.append((m["run"], int(m["first"]), int(m["last"])))
    out = set()
    if not merged:
        return out
    for n in names:
        m = _FILE_RE.match(n)
        if m and not m["last"] and any(r == m["run"] and a <= int(m["first"]) <= b for r, a, b in merged):
            out.add(n)
    return out
