"""ParquetRecorder: the relay's rows to Hive-partitioned Parquet, off the event loop.

Why this shape
--------------
* **The event loop only appends.** `request()`/`connection()`/`tcp()`/`frame()`
  do a length check and a `deque.append` (O(1), no lock, never blocks). When a
  dataset's queue is full the row is dropped and counted; the proxy keeps
  forwarding. Each counter is written by exactly one thread (enqueue side by
  the loop, dequeue side by the writer), so no lock is needed.
* **A writer process** (`writer="process"`, what `kafkatap proxy` uses; issue 16):
  the loop thread keeps a request row or captured frame as the tuple of its
  values (`TUPLE_DATASETS`), pickles every `PACK_ROWS` (64) queued rows (frames:
  sooner, at `PACK_BYTES`) into one chunk (~0.1 ms) and frees them; a thread of the proxy wakes every
  `flush_interval_s` and writes the chunks (and the tail, pickled there) to a
  pipe to a child process (`recording.writer_child`) that does everything
  below — Arrow, sort, zstd, files, compaction — on another core, with the
  very same code. A flush of 10,000 rows no longer stalls the loop (issue 19),
  the queue holds ~270 bytes per row instead of a ~2.5 KiB dict, and Arrow
  and Parquet leave the proxy's process; taking the values and pickling them
  (~1.5 µs a row in a warm loop) is what recording still costs the relay
  process (about +9 % CPU per request over live stats alone). The writer
  process adds about twice that (its flushes ~+12 %, its compaction ~+9 %):
  the proxy's processes together spend ~30 % more per request with recording
  on (bench/RESULTS.md, thirty-ninth session).
  A child that dies is replaced at the next flush; the rows it had not
  confirmed are counted as dropped.
* **Or one writer thread** (`writer="thread"`, the default for direct use:
  tests, tools) wakes every `flush_interval_s`, drains the queues,
  converts rows to Arrow in small chunks (the conversion holds the GIL; small
  chunks let the loop thread in between) and writes **each flush as its own
  small Parquet file** (unsorted and lz4 while compaction is on, which
  rewrites it: `recording.files.ParquetOptions.interim`): `.tmp-…` first (Spark
  and pyarrow ignore dot-files), fsync, then `rename()` to `part-…`. A file is
  therefore either absent or complete: `kill -9` loses at most the rows still
  queued (≤ one flush interval) and every `part-*.parquet` is valid.
* **Compaction** (on its own thread, so merging never delays a flush) keeps
  the file count sane for Spark: every
  `compact_interval_s` (or when a segment reaches `rotate_bytes`, or its hour
  partition is left, or on close) the flush files of a segment are merged into
  one `part-<run>-<first>-<last>.parquet` (again via `.tmp-` + rename), then
  the inputs are deleted (`recording.compaction`); a merged requests file's
  rollups are computed from the batches as they are written (`_write_merged`). A crash between the rename
  and the deletes leaves duplicates that `recover()` (run at start-up) and the
  reader (`recording.reader`) both resolve by file name
  (`recording.layout.superseded`).
* **Retention** (`retain_s`, `kafkatap proxy --retain`): once a minute the
  writer deletes this proxy's hours that ended more than `retain_s` ago, every
  dataset but topics/ (`recording.retention`).
* **Partitions** follow the rows' own time (requests: `req_first_ns`, others:
  their timestamp), so a Spark job pruning by `date`/`hour` never misses rows
  written just after the hour turned.
* **Redaction is enforced here too**: frames that may carry credentials
  (`protocol.apis.CREDENTIAL_APIS`) are never queued, whatever the relay
  sends, and request frames whose header does not match the row (e.g. raw
  SASL tokens after a v0 handshake) are refused.

Layout and file names: `recording.layout`; how one file is written: `recording.files`.
"""

from __future__ import annotations

import os
import pickle
import secrets
import shutil
import struct
import sys
import threading
import time
from collections import deque
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import structlog

from protocol.apis import CREDENTIAL_APIS
from recording.datasets import DATASETS, DERIVED_COLUMNS, RECORDED, row_names
from recording.dir_lock import DirBusy, lock_dir
from recording.layout import HOUR_NS, TIME_COLUMN, flush_name, new_run_id, partition_dir, proxy_dir, recover
from recording.thread_names import name_os_thread
from recording.writer_pipe import CHUNK_BYTES, CHUNK_ROWS, WriterGone, WriterProcess

# Arrow, Parquet and compaction are imported where rows are written (writer="thread", and the writer
# process), never at import: a proxy whose writer is a process only queues, packs and ships rows, and
# pyarrow alone would cost its process ~75 MB of resident memory (tests/recording/test_writer_process.py).
if TYPE_CHECKING:
    import pyarrow as pa

    from recording.compaction import Compactor, Segment

__all__ = ["ParquetRecorder", "RecordingError", "check_recording_dir", "recover", "CAPTURE_CHOICES"]

log = structlog.get_logger("kafkatap.recorder")

Row = dict[str, Any]

CAPTURE_CHOICES = ("none", "requests", "all")
WRITER_CHOICES = ("thread", "process")  # where Arrow + Parquet run: a thread of this process, or a child process
_CONVERT_CHUNK = 512  # rows per Arrow conversion call: bounds how long the writer holds the GIL
_ROW_BYTES_GUESS = 2048  # before the first row is measured: about a request row with its dict and values
_SIZE_SAMPLE = 256  # re-measure a dataset's row size on every 256th row: the hot path stays O(1)
# writer="process": rows are pickled on the loop thread every PACK_ROWS rows, while they are still in
# the core's cache (~1.5 µs a row; ~100 µs per pack), and freed at once; the shipping thread only writes
# the packed bytes. Pickling them later on the other thread cost 2-3x that (cache misses on every row,
# and holding a flush interval of rows made every young collection walk them).
PACK_ROWS = 64
# writer="process": a request row is queued as the tuple of its values in the ingest schema's column order
# (`operator.itemgetter`, one C call while the row is hot), not as the dict. The dict is then freed at
# once, a tuple pickles in half the time of a dict (no key per value), and the writer process builds
# Arrow column by column from the tuples instead of converting dicts. Rows without every column
# (tests, hand-made rows) stay dicts; both may meet in one chunk. Captured frames go the same way (kept
# as dicts until the next flush, they cost the proxy more than their own capture: bench/RESULTS.md).
TUPLE_DATASETS = ("requests", "frames")
# writer="process", frames: a pack also closes once its frames hold this many data bytes, so one pickle
# call on the loop thread copies at most this plus one frame (a frame's size is bounded by the decoder).
PACK_BYTES = 256 << 10


def _row_size(row: Row) -> int:
    """Memory of a row dict and its values, one level deep: cheap, and close for these flat rows."""
    size = sys.getsizeof(row)
    for v in row.values():
        size += sys.getsizeof(v)
        if isinstance(v, (list, dict)):
            size += sum(sys.getsizeof(x) for x in v)
    return size


# What can go wrong while recording, counted apart (`/metrics` kafkatap_recording_errors_total{kind}) because
# they mean different things to the operator: "write" loses rows (counted as dropped), "compaction" keeps
# the flush files (more, smaller files), "rollups" loses derived data only (the analysis reads the requests
# instead), "writer_process" is the child writer failing to start or dying, "retention" an hour older than
# `retain_s` that could not be deleted (it stays; the next pass tries again).
ERROR_KINDS = ("write", "compaction", "rollups", "writer_process", "retention")
ERROR_HINTS: dict[str, dict[str, str]] = {
    "write": {"consequence": "these rows are lost, counted in kafkatap_recording_dropped_rows_total; the proxy keeps "
                             "forwarding, and recording resumes by itself once writing works again",
              "fix": "free disk space under the recording directory, or fix its permissions or filesystem"},
    "compaction": {"consequence": "the flush files stay and are read as they are; nothing is lost"},
    "rollups": {"consequence": "nothing is lost: an analysis reads these requests instead of their rollups",
                "fix": "once no proxy writes to the recording, `kafkatap rollups DIR` writes what is missing"},
    "retention": {"consequence": "old hours stay on disk until a later pruning (once a minute) succeeds",
                  "fix": "check the recording directory's permissions, or prune it with `kafkatap prune DIR --older-than …`"},
}
PRUNE_EVERY_S = 60.0  # retention: how often the writer looks for hours to delete


def _log_level() -> str:
    """The lowest level this process logs at: its writer process logs at the same one."""
    import logging

    enabled = getattr(log.bind(), "is_enabled_for", None)  # structlog's filtering loggers; others: the old default
    if enabled is None:
        return "warning"
    for name in ("debug", "info", "warning"):
        if enabled(logging.getLevelName(name.upper())):
            return name
    return "error"


def _log_format() -> str:
    """The format this process logs in (`kafkatap --log-format`): its writer process writes the same."""
    from recording.logs import current_logging

    configured = current_logging()
    return configured[0] if configured is not None else "json"


def _conversion_errors() -> tuple[type[BaseException], ...]:
    """What pyarrow raises when a value does not fit its column."""
    import pyarrow as pa

    return (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)

_HEADER_KEY_VERSION = struct.Struct(">hh")  # a request frame's api key and version, after its 4-byte size


def row_data_bytes(s: "_Stream", rows: Iterable[Any]) -> int:
    """Frame bytes that rows (dicts or value tuples) carry: what the frames queue's byte cap counts."""
    i = s.data_at
    total = 0
    for r in rows:
        d = r[i] if type(r) is tuple else r.get("data")
        if d:
            total += len(d)
    return total


def _take(q: deque[Row], k: int) -> list[Row]:
    """Up to `k` rows from the front of a stream's queue. The loop thread (`_pack`) and the shipping thread
    (`_ship_stream`) both take from it, only ever with popleft, so each row goes exactly one way; the
    other may have emptied it since its length was read, and a row taken is never dropped for that."""
    pop = q.popleft
    rows: list[Row] = []
    try:
        for _ in range(k):
            rows.append(pop())
    except IndexError:
        pass
    return rows


class RecordingError(RuntimeError):
    """The recording directory cannot be used (message says why and what to do)."""


class _Stream:
    """Queue and writer state of one dataset (slots: the loop thread reads a dozen of them for every row)."""

    __slots__ = ("name", "schema", "struct", "as_tuple", "queue", "cap_rows", "cap_bytes", "row_bytes",
                 "enqueued", "dropped", "enq_bytes", "deq_bytes", "write_dropped", "dropped_reported",
                 "dropped_logged", "rows_written", "files_written", "shipped", "gone_written", "gone_dropped",
                 "gone_files", "packed", "pk_rows", "pk_bytes", "pk_data", "tx_rows", "tx_bytes", "segments", "time_col",
                 "data_at", "room", "tuple_names")

    def __init__(self, name: str, cap_rows: int, cap_bytes: int, arrow: bool) -> None:
        self.name = name
        # arrow: this stream converts and writes its rows (writer="thread"); a proxy that ships them to a
        # writer process never needs the types
        self.schema: pa.Schema | None = None
        self.struct: pa.StructType | None = None
        if arrow:
            import pyarrow as pa

            from recording.schema import arrow_schema
            from recording.timestamps import ingest_schema

            self.schema = arrow_schema(name)
            self.struct = pa.struct(list(ingest_schema(name)))  # rows carry timestamps as int epoch ns
        # writer="process": the row → values tuple of TUPLE_DATASETS (None: rows stay dicts), without the
        # columns the writer process derives from the others (`recording.derived`)
        self.tuple_names = list(row_names(name))
        self.as_tuple: Callable[[Row], tuple] | None = (
            itemgetter(*self.tuple_names) if name in TUPLE_DATASETS else None)
        names = self.tuple_names
        self.data_at: int | None = names.index("data") if "data" in names else None  # frames: the bytes' slot
        self.queue: deque[Row] = deque()
        self.cap_rows = cap_rows
        self.cap_bytes = cap_bytes  # estimated queue memory (rows × row_bytes; frames: their data)
        # written by the loop thread only
        # running estimate of one queued row's memory (writer="thread"; writer="process" keeps the guess:
        # at most PACK_ROWS rows wait unpacked, and packed chunks are counted by their real size)
        self.row_bytes = _ROW_BYTES_GUESS
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
        # writer="process" only (shipping thread): rows sent to writer processes, and the counts of those
        # that ended (their rows_written / write_dropped, plus what they never confirmed, counted as dropped)
        self.shipped = 0
        self.gone_written = 0
        self.gone_dropped = 0
        self.gone_files = 0
        # writer="process": pickled chunks of rows (payload, rows) waiting for the shipping thread;
        # pk_* are written by the loop thread (packing), tx_* by the shipping thread (sending).
        # Frames: pk_data is the frame bytes that packing took out of the queue, so the bytes still
        # queued are enq_bytes - pk_data - deq_bytes (each counter written by one thread only)
        self.packed: deque[tuple[bytes, int]] = deque()
        self.pk_rows = self.pk_bytes = self.pk_data = 0
        self.room = 0  # rows the loop thread may still queue before the caps are checked again (`_grant`)
        self.tx_rows = self.tx_bytes = 0
        self.segments: dict[Path, Segment] = {}
        self.time_col = TIME_COLUMN[name]

    def dropped_total(self) -> int:
        return self.dropped + self.write_dropped


def check_recording_dir(root: Path | str, min_free_bytes: int = 64 << 20) -> Path:
    """Create `root` if needed and prove it is writable, or raise RecordingError; warn when space is short.

    Why at start-up: a proxy that silently drops every row because its
    directory is read-only is worse than one that refuses to start. Low space
    is only a warning: a proxy restarted (Restart=on-failure) while its disk is
    low must still give clients their path to Kafka, and once running the
    writer drops rows below a quarter of `min_free_bytes` and counts them.
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
        log.warning(f"recording directory low on space: only {free / 2**20:.0f} MiB free under {root} (at least "
                    f"{min_free_bytes / 2**20:.0f} MiB wanted); the proxy forwards, and rows are dropped and counted "
                    f"while less than {min_free_bytes / 4 / 2**20:.0f} MiB is free",
                    fix="free some space or record elsewhere", free_mib=free // 2**20)
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
        writer: str = "thread",
        run: str | None = None,
        retain_s: float | None = None,
        finalize_leftovers: bool = True,
    ) -> None:
        if capture not in CAPTURE_CHOICES:
            raise ValueError(f"capture must be one of {CAPTURE_CHOICES}, not {capture!r}")
        if writer not in WRITER_CHOICES:
            raise ValueError(f"writer must be one of {WRITER_CHOICES}, not {writer!r}")
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
        self.retain_s = retain_s  # None: keep every hour (recording.retention)
        # rewrite the interim flush files a dead writer of this proxy id left (finalize_leftovers); the writer process
        # is told by the proxy, which holds the partition's lock: never while another process records into it
        self.finalize_leftovers_at_start = finalize_leftovers
        self._finalizer: threading.Thread | None = None
        self.log_drops = True  # a writer process leaves them to the proxy, which counts every drop
        self._next_prune = 0.0  # monotonic time of the next retention pass (writer side)
        self.rotate_bytes = rotate_bytes
        self.min_free_bytes = min_free_bytes
        self.fsync = fsync
        self.compression_level = compression_level
        self._clock_ns = clock_ns
        self.writer = writer
        self.run = run or new_run_id()  # a writer process is given its parent's
        self._child: WriterProcess | None = None  # writer="process": the current child, spawned by the shipper
        self._children = 0
        self._child_errors: dict[str, int] = {}  # the current child's errors already added to ours, by kind
        self._stats_lock = threading.Lock()  # the child's answers (its reader thread) vs. giving a child up
        if writer == "process":
            self._offer = self._offer_packed  # type: ignore[method-assign]
        self._seq = 0
        # queue_bytes bounds the row datasets' queues (rows were bounded only by count: ~350 MiB at the cap):
        # half for requests, the rest shared by the others; frames keep their own frame_queue_bytes
        others = [n for n in RECORDED if n not in ("frames", "requests")]
        cap_bytes = {"requests": queue_bytes // 2, "frames": frame_queue_bytes,
                     **{n: queue_bytes // 2 // len(others) for n in others}}
        arrow = writer == "thread"  # this process converts and writes rows (else the writer process does)
        self._streams = {name: _Stream(name, queue_rows if name != "frames" else max(1, queue_rows // 4),
                                       cap_bytes[name], arrow)
                         for name in RECORDED}
        self._req, self._conn, self._tcp, self._frames = (self._streams[n] for n in
                                                          ("requests", "connections", "tcp", "frames"))
        # one Python call less for every request the relay hands over (the method below says what it does)
        self.request = partial(self._offer, self._req)  # type: ignore[method-assign]
        self.frames_redacted = 0  # credential-bearing / unverifiable frames refused (loop thread)
        self.errors = dict.fromkeys(ERROR_KINDS, 0)  # by kind (ERROR_KINDS): /metrics shows each
        # -inf: the first error of a kind is always logged (monotonic time starts at boot, not at a flush interval)
        self._last_error_log = dict.fromkeys(ERROR_KINDS, float("-inf"))
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._options: dict[str, Any] = {}  # dataset → recording.files.ParquetOptions (writer="thread")
        self._flush_options: dict[str, Any] = {}  # the same, for flush files (interim while compaction is on)
        self._compactor: Compactor | None = None
        if arrow:
            from recording.compaction import Compactor
            from recording.files import ParquetOptions

            self._options = {name: ParquetOptions(name, compression_level, fsync) for name in DATASETS}
            # flush files that compaction will rewrite are encoded the cheap way (ParquetOptions.interim)
            self._flush_options = (self._options if compact_interval_s <= 0 else
                                   {name: o.interim_copy() for name, o in self._options.items()})
            self._compactor = Compactor(self.run, self._write_merged, self._error, self._file_final)
        self._unmerged: set[Path] = set()  # partition directories whose rollups are not merged yet (compactor thread)
        self._folds: dict[Path, Any] = {}  # merged requests file → its rollups, folded while merging (compactor thread)
        self._closed = False
        self._partition_lock: int | None = None  # fd holding the lock on this proxy id's partition (_lock_partition)
        self._lock = threading.Lock()  # serializes flushes (writer thread vs. close on another thread)

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> "ParquetRecorder":
        """Check the directory (RecordingError if unusable), clean leftovers, start the writer thread.

        writer="process": the writer process is started here (without waiting for its ~0.5 s of
        imports: the pipe holds what is sent meanwhile); the thread only ships rows to it.
        """
        check_recording_dir(self.root, self.min_free_bytes)
        self._partition_lock = self._lock_partition()
        removed = recover(self.root, self.proxy_id)
        if removed:
            log.info("recording leftovers cleaned", root=str(self.root), files=removed)
        process = self.writer == "process"
        if process:
            try:
                self._spawn()
            except (OSError, WriterGone) as exc:  # the shipping thread tries again at every flush
                self._error("writer_process", "cannot start the recording writer process", exc)
        self._thread = threading.Thread(target=self._ship_loop if process else self._run, name="kafkatap-recorder",
                                        daemon=True)
        self._thread.start()
        if self.compact_interval_s > 0 and self._compactor is not None:
            # its own thread, so a long merge never delays the next flush (the kill -9 bound)
            self._compactor.start()
        if not process and self._partition_lock is not None and self.finalize_leftovers_at_start:
            self.start_finalizing()
        log.info("recording", root=str(self.root), proxy_id=self.proxy_id, capture=self.capture,
                 flush_interval_s=self.flush_interval_s, run=self.run, writer=self.writer)
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
        elif self.writer == "process":  # never started: still write what was queued
            self._ship(final=True)
        else:
            self._flush(final=True)
        self.finish_compaction()
        if self._partition_lock is not None:
            os.close(self._partition_lock)
            self._partition_lock = None
        log.info("recording closed", root=str(self.root), **self.stats())

    def _lock_partition(self) -> int | None:
        """Hold a lock on this proxy id's requests partition while recording; warn when another process holds it.

        Two proxies recording into one directory with the same --proxy-id (a copy-pasted unit, a second
        instance started by hand) write one partition: each keeps its own files, but an analysis cannot tell
        the two proxies apart (their connections, clients and rates add up as one proxy's). The recording's
        "already holds a recording" warning said nothing of a proxy recording there *now*. A warning, not a
        refusal: a restart whose old instance is still draining is the same picture for a few seconds.
        Returns the fd holding the lock (None when another holds it or the directory cannot be made: the
        recorder's own checks and writes report that)."""
        part = proxy_dir(self.root, "requests", self.proxy_id)
        try:
            part.mkdir(parents=True, exist_ok=True)
            return lock_dir(part)
        except DirBusy as exc:
            log.warning("another process is recording into this directory with the same proxy id now: an analysis "
                        "cannot tell the two proxies apart (their connections and rates add up as one); give each "
                        "proxy its own --proxy-id", root=str(self.root), proxy_id=self.proxy_id,
                        other=exc.holder.strip(" ()") or "unknown")
        except OSError:
            pass
        return None

    # -- RecordSink: event loop thread, O(1), never blocks --------------------------
    def request(self, row: Row) -> None:
        self._offer(self._req, row)  # writer="process": `_offer_packed` (set per instance in __init__)

    def connection(self, row: Row) -> None:
        self._offer(self._conn, row)

    def tcp(self, row: Row) -> None:
        self._offer(self._tcp, row)

    def topic(self, row: Row) -> None:
        """One topic id ↔ name pair the proxy learned (`topics/`)."""
        self._offer(self._streams["topics"], row)

    def run_event(self, row: Row) -> None:
        """A proxy run's start, clean stop or launch (`runs/`): two or three rows per run, written by the server that owns
        the run."""
        self._offer(self._streams["runs"], row)

    def _offer_packed(self, s: _Stream, row: Row) -> None:
        """writer="process": queue a row (same caps as `_offer`, packed chunks counted by their real size)
        and pickle every PACK_ROWS rows into one chunk for the shipping thread.

        The caps are checked when room is granted (`_grant`, up to PACK_ROWS rows at a time), not for every
        row: this runs for every request, and the checks were a fifth of the recorder's cost per row.
        """
        if s.room <= 0 and not self._grant(s):
            s.dropped += 1
            return
        s.room -= 1
        q = s.queue
        if s.as_tuple is not None:
            try:
                row = s.as_tuple(row)  # type: ignore[assignment]
            except KeyError:  # a row without every column: it travels as the dict it is
                pass
        q.append(row)
        if len(q) >= PACK_ROWS:
            self._pack(s)

    @staticmethod
    def _grant(s: _Stream) -> bool:
        """Room for up to PACK_ROWS more rows of `s` under both caps (loop thread): rows waiting here or
        packed and not yet shipped, queued rows at the estimated `row_bytes`, packed ones at their size."""
        n = len(s.queue)
        by_rows = s.cap_rows - (n + s.pk_rows - s.tx_rows)
        by_bytes = (s.cap_bytes - (s.pk_bytes - s.tx_bytes)) // s.row_bytes - n
        s.room = max(0, min(PACK_ROWS, by_rows, by_bytes))
        return s.room > 0

    @staticmethod
    def _pack(s: _Stream) -> None:
        """Pickle what `s.queue` holds into one chunk (loop thread). The shipping thread may take the queue's
        tail at a flush meanwhile: both only ever popleft, so each row goes exactly one way."""
        rows = _take(s.queue, len(s.queue))
        if not rows:
            return
        if s.data_at is not None:
            s.pk_data += row_data_bytes(s, rows)  # out of the queue's bytes, whether they pickle or not
        try:
            payload = pickle.dumps(("rows", s.name, rows), protocol=5)
        except Exception:  # noqa: BLE001 — a value pickle refuses (a bug upstream): that row is dropped, counted
            good = []
            for r in rows:
                try:
                    pickle.dumps(r, protocol=5)
                    good.append(r)
                except Exception:  # noqa: BLE001
                    s.dropped += 1
            if not good:
                return
            rows = good
            payload = pickle.dumps(("rows", s.name, rows), protocol=5)
        s.packed.append((payload, len(rows)))
        s.pk_rows += len(rows)
        s.pk_bytes += len(payload)

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
        data = row.get("data")
        size = len(data) if data else 0
        q = s.queue
        n = len(q)
        queued = s.enq_bytes - s.pk_data - s.deq_bytes  # writer="thread": the pk_* and tx_* counters stay 0
        if n + s.pk_rows - s.tx_rows < s.cap_rows and queued + s.pk_bytes - s.tx_bytes + size <= s.cap_bytes:
            s.enqueued += 1
            s.enq_bytes += size
            if self.writer == "process":  # as request rows: a value tuple, packed while it is hot
                try:
                    row = s.as_tuple(row)  # type: ignore[misc]
                except KeyError:  # a row without every column travels as the dict it is
                    pass
                q.append(row)
                if n + 1 >= PACK_ROWS or queued + size >= PACK_BYTES:
                    self._pack(s)
            else:
                q.append(row)
        else:
            s.dropped += 1

    @staticmethod
    def _frame_allowed(row: Row, direction: Any) -> bool:
        """Never keep credential-bearing frames; keep a request frame only if its own header agrees with the row."""
        api_key = row.get("api_key")
        if api_key is None or api_key in CREDENTIAL_APIS:
            return False
        if direction == "request":
            data = row.get("data")
            if not data or len(data) < 8:
                return False
            hdr_key, hdr_ver = _HEADER_KEY_VERSION.unpack_from(data, 4)
            if hdr_key != api_key or hdr_key in CREDENTIAL_APIS or hdr_ver != row.get("api_version", hdr_ver):
                return False
        return True

    # -- introspection (any thread) ----------------------------------------------------
    def queue_depth(self) -> dict[str, int]:
        """Rows not written yet: queued here, plus (writer="process") those in the child not yet confirmed."""
        if self.writer != "process":  # a drained flush is written or counted before the lock is let go
            return {name: len(s.queue) for name, s in self._streams.items()}
        return {name: len(s.queue) + s.pk_rows - s.tx_rows + (s.shipped - s.rows_written - s.write_dropped)
                for name, s in self._streams.items()}

    def dropped(self) -> dict[str, int]:
        return {name: s.dropped_total() for name, s in self._streams.items()}

    def stats(self) -> dict[str, Any]:
        return {
            "rows_written": {n: s.rows_written for n, s in self._streams.items()},
            "files_written": sum(s.files_written for s in self._streams.values()),
            "dropped": self.dropped(),
            "queued": self.queue_depth(),
            "frames_redacted": self.frames_redacted,
            "errors": dict(self.errors),  # by kind; write_errors is their sum
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

    # -- writer="process": the shipping thread ------------------------------------------
    def _ship_loop(self) -> None:
        name_os_thread(b"kafkatap-rec")
        while not self._stopping:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._stopping:
                break
            try:
                self._ship(final=False)
            except Exception as exc:  # noqa: BLE001 — this thread must outlive anything, or nothing is recorded
                self._error("write", "recording flush failed", exc)
        self._ship(final=True)

    def _ship(self, final: bool) -> None:
        """Pipe every queued row to the writer process and have it write them (final: then end it).

        A child that fails is replaced (its unconfirmed rows counted as dropped); at the end one more
        child gets a chance, and rows that still cannot be handed over are counted as dropped.
        """
        with self._lock:
            for attempt in range(2 if final else 1):
                child = self._child
                if child is not None and (child.ended or child.proc.poll() is not None):  # died since the last
                    self._child_lost(WriterGone(f"writer process ended (exit code {child.proc.poll()})"))
                try:  # … flush, so the rows queued meanwhile go to its replacement instead of being lost with it
                    child = self._child or self._spawn()
                    for s in self._streams.values():
                        self._ship_stream(child, s)
                    if final:  # rows that arrived while the other datasets were shipped
                        for s in self._streams.values():
                            self._ship_stream(child, s)
                    drops = {n: s.dropped + s.gone_dropped for n, s in self._streams.items()}
                    msg = ("close" if final else "flush", drops, dict(self.requests_dropped))
                    if final:
                        child.finish(msg)  # every answer applied when this returns
                        self._child = None
                    else:
                        child.flush(msg)  # answered later, on the child's reader thread (`_on_child_stats`)
                    break
                except (WriterGone, OSError) as exc:
                    self._child_lost(exc)
            else:
                if final:  # and no writer process could take them: counted (a flush leaves them to the next child)
                    for s in self._streams.values():
                        self._drop_unshipped(s)
            for s in self._streams.values():
                self._log_drops(s)

    @staticmethod
    def _drop_unshipped(s: _Stream) -> None:
        """Count what `s` still holds (packed chunks and queued rows) as shipped and lost, so the queue reads 0."""
        n = 0
        while s.packed:
            payload, k = s.packed.popleft()
            s.tx_rows += k
            s.tx_bytes += len(payload)
            n += k
        while s.queue:
            r = s.queue.popleft()
            if s.name == "frames":
                s.deq_bytes += row_data_bytes(s, (r,))
            n += 1
        s.shipped += n
        s.write_dropped += n
        s.gone_dropped += n

    def _spawn(self) -> WriterProcess:
        run = self.run if self._children == 0 else new_run_id()  # a replacement must not reuse file names
        self._children += 1
        self._child_errors = {}
        self._child = WriterProcess({
            "root": str(self.root), "proxy_id": self.proxy_id, "capture": self.capture,
            "flush_interval_s": self.flush_interval_s, "compact_interval_s": self.compact_interval_s,
            "rotate_bytes": self.rotate_bytes, "min_free_bytes": self.min_free_bytes, "fsync": self.fsync,
            "compression_level": self.compression_level, "run": run, "retain_s": self.retain_s,
            "finalize_leftovers": self._partition_lock is not None and self.finalize_leftovers_at_start,
            "log_level": _log_level(), "log_format": _log_format(),
        }, self._on_child_stats)
        return self._child

    def _on_child_stats(self, child: WriterProcess, st: dict[str, Any]) -> None:
        """A flush answer (the child's reader thread): counted unless it comes from a child already given up."""
        with self._stats_lock:
            if child is self._child:
                self._apply(st)

    def _wait_flushed(self, timeout: float = 60.0) -> bool:
        """writer="process": wait until the writer process answered every flush asked so far (tests, benches)."""
        child = self._child
        return child is None or child.wait_answered(timeout)

    @staticmethod
    def _ship_stream(child: WriterProcess, s: _Stream) -> None:
        """Send what `s` holds now: the chunks the loop thread packed, then the rest in chunks of its own
        (one pickle call per chunk is the longest this thread holds the GIL)."""
        packed = s.packed
        while packed:
            payload, n = packed.popleft()
            s.tx_rows += n
            s.tx_bytes += len(payload)
            s.shipped += n  # before sending: if the send fails they are counted as lost
            child.send_raw(payload)
        q = s.queue
        pop = q.popleft
        n = len(q)
        frames = s.name == "frames"
        while n > 0:
            if frames:  # bounded by bytes too: a chunk of big frames is one long copy
                rows: list[Row] = []
                size = 0
                while n > 0 and len(rows) < CHUNK_ROWS and size < CHUNK_BYTES:
                    try:
                        r = pop()
                    except IndexError:  # the loop thread's _pack took the rest
                        n = 0
                        break
                    n -= 1
                    rows.append(r)
                    size += row_data_bytes(s, (r,))
                s.deq_bytes += size
            else:
                k = min(n, CHUNK_ROWS)
                rows = _take(q, k)
                n = n - k if len(rows) == k else 0
            if not rows:
                break
            s.shipped += len(rows)  # before sending: if the send fails they are counted as lost
            try:
                child.send(("rows", s.name, rows))
            except WriterGone:
                raise
            except Exception:  # noqa: BLE001 — a value pickle refuses: send the other rows, count that one
                good = []
                for r in rows:
                    try:
                        pickle.dumps(r, protocol=5)
                        good.append(r)
                    except Exception:  # noqa: BLE001 — counted as shipped and lost, as the child's own drops are
                        s.write_dropped += 1
                        s.gone_dropped += 1  # not the child's drop: it goes into the footers it writes
                if good:
                    child.send(("rows", s.name, good))

    def _apply(self, st: dict[str, Any]) -> None:
        """The child's answer: what it wrote and dropped so far (this child's life), into our counters."""
        for n, s in self._streams.items():
            s.rows_written = s.gone_written + st["rows_written"][n]
            s.write_dropped = s.gone_dropped + st["write_dropped"][n]
            s.files_written = s.gone_files + st["files_written"][n]
        for kind, n in st["errors"].items():
            self.errors[kind] += n - self._child_errors.get(kind, 0)
        self._child_errors = dict(st["errors"])

    def _child_lost(self, exc: BaseException) -> None:
        """The writer process is gone: what it never confirmed is lost, and counted; the next flush starts another."""
        child = self._child
        if child is not None:
            child.close(timeout=5.0)  # its reader thread has applied every answer it got when this returns
        with self._stats_lock:
            self._child = None
            lost = 0
            for s in self._streams.values():
                unconfirmed = s.shipped - s.rows_written - s.write_dropped
                lost += unconfirmed
                s.write_dropped += unconfirmed
                s.gone_written, s.gone_dropped, s.gone_files = s.rows_written, s.write_dropped, s.files_written
        self._error("writer_process", "recording writer process failed; rows it had not written are counted as dropped", exc,
                    rows_lost=lost, pid=child.pid if child else None)

    def _flush(self, final: bool) -> None:
        with self._lock:
            for s in self._streams.values():
                try:
                    self._flush_stream(s)
                    self._compact_due(s, force=final)
                except Exception as exc:  # the writer must survive anything a row or the disk throws at it
                    self._error("write", "recording flush failed", exc, dataset=s.name)
                self._log_drops(s)
            if final:
                # rows that arrived while we were flushing the other datasets
                for s in self._streams.values():
                    if s.queue:
                        try:
                            self._flush_stream(s)
                            self._compact_due(s, force=True)
                        except Exception as exc:
                            self._error("write", "recording flush failed", exc, dataset=s.name)
            self._apply_retention()

    def _apply_retention(self) -> None:
        """Delete this proxy's hours older than `retain_s` (and its launch's other ids': `writer_prunes`), at most
        once per PRUNE_EVERY_S (writer side)."""
        if self.retain_s is None:
            return
        now = time.monotonic()
        if now < self._next_prune:
            return
        self._next_prune = now + PRUNE_EVERY_S
        from recording.retention import describe, prune, writer_prunes

        try:
            result = prune(self.root, self._clock_ns() - int(self.retain_s * 1e9), writer_prunes(self.root, self.proxy_id))
        except OSError as exc:
            self._error("retention", "recording retention could not delete an old hour", exc)
            return
        if result.hours:
            log.info("recording retention: deleted " + describe(result), proxy_id=self.proxy_id,
                     retain_s=self.retain_s)

    def _drain(self, s: _Stream) -> list[Row]:
        rows: list[Row] = []
        pop = s.queue.popleft
        n = len(s.queue)  # only what is there now; later rows go to the next flush
        for _ in range(n):
            rows.append(pop())
        if s.name == "frames":
            s.deq_bytes += row_data_bytes(s, rows)
        return rows

    def _to_table(self, s: _Stream, rows: list[Row]) -> pa.Table:
        """Rows → Arrow in chunks; a chunk that does not convert is retried row by row and bad rows dropped.

        Value tuples (`TUPLE_DATASETS`, from a proxy's writer="process") are converted together, as one struct
        array (`_columns_to_batch`), apart from any dict rows beside them (the writer process only: in one call, as its GIL is its own).
        When their columns do not convert they are converted one by one, so only the bad rows are dropped.
        """
        import pyarrow as pa

        from recording.timestamps import from_epoch_ns

        conversion_errors = _conversion_errors()
        batches = []
        tuples = [r for r in rows if type(r) is tuple]
        if tuples:
            rows = [r for r in rows if type(r) is not tuple]
            try:
                batches.append(self._columns_to_batch(s, tuples))
            except conversion_errors:
                batches += self._one_by_one(s, tuples, lambda t: self._columns_to_batch(s, [t]))
        for i in range(0, len(rows), _CONVERT_CHUNK):
            chunk = rows[i:i + _CONVERT_CHUNK]
            try:
                arrays = [pa.array(chunk, type=s.struct)]
            except conversion_errors:
                arrays = self._one_by_one(s, chunk, lambda r: pa.array([r], type=s.struct))
            batches += [pa.RecordBatch.from_struct_array(a) for a in arrays]
        if not batches:
            return s.schema.empty_table()
        # int epoch ns → timestamp[us, UTC], once per flush for the whole table (never per row on the loop)
        return from_epoch_ns(pa.Table.from_batches(batches), s.name)

    def _one_by_one(self, s: _Stream, rows: list[Any], convert: Callable[[Any], Any]) -> list[Any]:
        """`convert` each row alone (a chunk of them did not convert): a row whose values do not fit their
        columns is dropped, counted and logged; the others are kept."""
        out = []
        conversion_errors = _conversion_errors()
        for r in rows:
            try:
                out.append(convert(r))
            except conversion_errors as exc:
                s.write_dropped += 1
                self._error("write", "recording row does not match the schema", exc, dataset=s.name)
        return out

    @staticmethod
    def _columns_to_batch(s: _Stream, tuples: list[tuple]) -> pa.RecordBatch:
        """Value tuples → one record batch (one struct array, then its fields), the derived columns computed from
        the others (`recording.derived`). Raises one of `_conversion_errors()` when a value does not fit its column."""
        import pyarrow as pa

        from recording.derived import derive

        fields = {f.name: f for f in s.struct}
        # one conversion of the tuples as a struct array, then its fields, instead of transposing the rows in Python
        # (zip(*tuples)) and converting column by column: 2.0 against 2.9 µs a row on the analytics bench's synthetic
        # rows, no difference on `SessionMix` rows, within the noise in bench/recording_cost.py. A tuple of the wrong
        # length is refused as a row of its own (the transposition lost the flush, or dropped a long row's extras)
        carried = pa.array(tuples, type=pa.struct([fields[n] for n in s.tuple_names]))
        cols = dict(zip(s.tuple_names, carried.flatten()))
        cols.update(derive(s.name, cols, {n: fields[n].type for n in DERIVED_COLUMNS.get(s.name, ())}))
        return pa.RecordBatch.from_arrays([cols[n] for n in fields], schema=pa.schema(list(s.struct)))

    def _flush_stream(self, s: _Stream) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        rows = self._drain(s)
        if not rows:
            return
        settled = s.rows_written + s.write_dropped
        try:
            table = self._to_table(s, rows)
            if s.name == "frames":  # defense in depth: never a credential-bearing frame, whatever got queued
                secret = pc.fill_null(pc.is_in(table["api_key"], value_set=pa.array(sorted(CREDENTIAL_APIS),
                                                                                   table["api_key"].type)), True)
                if pc.any(secret).as_py():  # a filter copies every frame's bytes: only when one is to go
                    table = table.filter(pc.invert(secret))
                settled -= len(rows) - table.num_rows  # refused here, as the queue refuses them: not written or lost
            for directory, part in self._split_by_hour(s, table):
                self._write_flush_file(s, directory, part)
        except Exception:  # the drained rows neither written nor already counted are lost: counted, then logged
            s.write_dropped += max(0, len(rows) - (s.rows_written + s.write_dropped - settled))
            raise

    def _split_by_hour(self, s: _Stream, table: pa.Table) -> list[tuple[Path, pa.Table]]:
        import pyarrow as pa
        import pyarrow.compute as pc

        now_us = self._clock_ns() // 1000
        ts = pc.fill_null(table[s.time_col].cast(pa.int64()), now_us)  # timestamp[us] → epoch µs
        hours = pc.divide(ts, HOUR_NS // 1000)
        uniq = pc.unique(hours).to_pylist()
        parts = []
        for h in sorted(uniq):
            part = table if len(uniq) == 1 else table.filter(pc.equal(hours, h))
            parts.append((partition_dir(self.root, s.name, self.proxy_id, h), part))
        return parts

    def _write_file(self, s: _Stream, tables: Iterable[pa.Table], path: Path, seq: str, dropped: int,
                    rows: int, written: Callable[[pa.Table], None] | None = None, flush: bool = False) -> int:
        """Write one flush or merged file of `s` (footer: format version, run, sequence range, drops)."""
        from recording.files import file_metadata, write_atomic

        md = file_metadata(s.schema, proxy_id=self.proxy_id, run=self.run, seq=seq, rows=rows,
                           dropped=dropped, dropped_total=s.dropped_total())
        if s.name == "requests":
            relay = dict(self.requests_dropped)  # a copy: the loop thread keeps counting
            md[b"kafkatap.requests_dropped_by_relay"] = ",".join(f"{k}={v}" for k, v in sorted(relay.items())).encode()
        return write_atomic(tables, path, md, (self._flush_options if flush else self._options)[s.name], written)

    def _write_merged(self, s: _Stream, tables: Iterable[pa.Table], path: Path, seq: str, dropped: int,
                      rows: int) -> int:
        """`_write_file` for compaction (compactor thread): a requests file's rollups are folded from the batches
        as they are merged (`recording.rollups.RollupFold`), so `_file_final` need not read the file back."""
        if s.name != "requests":
            return self._write_file(s, tables, path, seq, dropped, rows)
        from recording.rollups import RollupFold  # here: see _merge_rollups

        fold = RollupFold()
        failed: list[BaseException] = []

        def fold_in(table: pa.Table) -> None:  # each merged batch, once written (`write_atomic`)
            if failed:
                return
            try:
                fold.add(table)
            except Exception as exc:  # noqa: BLE001 — derived data only: the merge goes on, and
                failed.append(exc)  # `_file_final` reads the file back (and reports what fails there)

        size = self._write_file(s, tables, path, seq, dropped, rows, fold_in)
        if failed:  # nothing is lost, but every merge would take the slower way: said, not counted as an error
            log.warning("recording: folding a merged requests file's rollups failed; reading the file back instead",
                        error=repr(failed[0]), file=str(path))
        else:  # only once the file is complete: a failed write leaves no partial fold behind
            self._folds[path] = fold
        return size

    def _write_flush_file(self, s: _Stream, directory: Path, table: pa.Table) -> None:
        try:
            free: int | None = shutil.disk_usage(self.root).free
        except OSError:  # the directory was deleted under us: the write below makes it again, or says why it cannot
            free = None
        if free is not None and free < self.min_free_bytes // 4:
            s.write_dropped += table.num_rows
            self._error("write", "recording disk nearly full: dropping rows", None, dataset=s.name,
                        free_mib=free // 2**20)
            return
        self._seq += 1
        seq = self._seq
        dropped = s.dropped_total() - s.dropped_reported
        path = directory / flush_name(self.run, seq)
        try:
            size = self._write_file(s, [table], path, f"{seq}-{seq}", dropped, table.num_rows, flush=True)
        except OSError as exc:
            s.write_dropped += table.num_rows
            self._error("write", "recording write failed: dropping rows", exc, dataset=s.name, rows=table.num_rows)
            return
        s.dropped_reported += dropped
        s.rows_written += table.num_rows
        s.files_written += 1
        if self.compact_interval_s <= 0:  # compaction off: every flush file stays as written
            return
        from recording.compaction import FlushFile, Segment

        seg = s.segments.get(directory)
        if seg is None:
            seg = s.segments[directory] = Segment(directory, time.monotonic())
        seg.files.append(FlushFile(seq, path, table.num_rows, dropped, self._flush_options[s.name].interim))
        seg.bytes += size

    # -- compaction (recording.compaction) ----------------------------------------------
    def _compact_due(self, s: _Stream, force: bool) -> None:
        from recording.compaction import take_due

        for seg in take_due(s.segments, now=time.monotonic(), force=force, rotate_bytes=self.rotate_bytes,
                            interval_s=self.compact_interval_s):
            assert self._compactor is not None  # flushes run where rows are written: writer="thread"
            self._compactor.submit(s, seg)

    def _file_final(self, s: _Stream, path: Path, closes: bool) -> None:
        """A requests file compaction is done with gets its rollups (recording.rollups), off the flush path.

        Once the writer has left an hour (a later hour's file is final, or this file's segment
        closed its directory), that hour's rollups of this run are merged into one file per dataset
        (`merge_hour`); the hours still open are merged at close (`_merge_rollups`).
        """
        if s.name != "requests":
            return
        fold = self._folds.pop(path, None)
        if fold is not None:  # merged just now: its rollups were folded on the way (`_write_merged`)
            import pyarrow.parquet as pq

            fold.write(path, pq.read_schema(path).metadata or {}, fsync=self._options[s.name].fsync)
        else:  # a segment of one flush file, kept as it is: read back
            from recording.rollups import write_rollups  # here: see _merge_rollups

            write_rollups(path, fsync=self._options[s.name].fsync)
        self._unmerged.add(path.parent)
        newest = max(self._unmerged, key=str)
        self._merge_rollups([d for d in self._unmerged if d != newest or (closes and d == path.parent)])

    def start_finalizing(self) -> None:
        """Rewrite, on a thread of its own, the interim flush files a dead writer of this proxy id left (arrow side)."""
        self._finalizer = threading.Thread(target=self.finalize_leftovers, name="kafkatap-finalize", daemon=True)
        self._finalizer.start()

    def finalize_leftovers(self) -> int:
        """Interim flush files that a writer of this proxy id left unmerged (kill -9, a writer process that died):
        rewritten as final files in place (`recording.files.finalize_interim`), so that none stays in the cheap
        encoding for good. Other runs' files only: this run's own are compaction's. Returns how many."""
        from recording.files import finalize_interim
        from recording.layout import file_range, flush_files

        done = 0
        for name, path in flush_files(self.root, self.proxy_id, self._options):
            r = file_range(path.name)
            if r is None or r[0] == self.run:
                continue
            try:
                done += finalize_interim(path, self._options[name])
            except Exception as exc:  # noqa: BLE001 — deleted meanwhile, or unreadable: it stays as it is, complete
                self._error("compaction", "recording: could not rewrite a flush file a previous writer left", exc,
                            dataset=name, file=str(path))
        if done:
            log.info("recording: flush files a previous writer left unmerged were rewritten for good", files=done)
        return done

    def finish_compaction(self) -> None:
        """Finish every submitted merge and stop the compactor, then merge the rollups of the hours still open.

        The last step of a close, here and in the writer process (recording.writer_child).
        """
        if self._finalizer is not None:
            self._finalizer.join()
        if self._compactor is not None:
            self._compactor.close()
        self._merge_rollups(list(self._unmerged))  # the compactor thread has stopped: nothing else touches the set

    def _merge_rollups(self, directories: Iterable[Path]) -> None:
        # Imported when first needed, not with this module: the rollups read Parquet through pyarrow.dataset
        # (~50 MB of RSS), and a proxy whose writer is a process never computes them itself.
        if not directories:
            return
        from recording.rollups import merge_hour

        for d in sorted(directories, key=str):
            self._unmerged.discard(d)
            try:
                merge_hour(d, self.run, fsync=self._options["requests"].fsync)
            except Exception as exc:  # derived data only: the per-file rollups stay valid and are read instead
                self._error("rollups", "recording: could not merge an hour's rollups; keeping one per requests file",
                            exc, directory=str(d))

    # -- logging ----------------------------------------------------------------------
    def _log_drops(self, s: _Stream) -> None:
        if not self.log_drops:
            return
        total = s.dropped_total()
        if total != s.dropped_logged:
            log.warning("recording dropped rows (queue full or write failed); the proxy kept forwarding",
                        dataset=s.name, dropped=total - s.dropped_logged, dropped_total=total,
                        queue_rows=len(s.queue), queue_cap=s.cap_rows)
            s.dropped_logged = total

    @property
    def write_errors(self) -> int:
        """Every error of every kind so far."""
        return sum(self.errors.values())

    def _error(self, kind: str, msg: str, exc: BaseException | None, **kw: Any) -> None:
        """Count an error of `kind` (ERROR_KINDS) and log it, once per flush interval and kind.

        Per kind, so that a failing rollup (derived data, nothing lost) cannot hide a failing
        write (rows lost) behind its throttle, and the operator reads which one it is.
        """
        self.errors[kind] += 1
        now = time.monotonic()
        if now - self._last_error_log[kind] >= self.flush_interval_s:  # once per interval, not once per row
            self._last_error_log[kind] = now
            log.error(msg, **({"error": repr(exc)} if exc else {}), kind=kind, errors_total=self.errors[kind],
                      **ERROR_HINTS.get(kind, {}), **kw)

