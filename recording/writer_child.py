"""The recording writer process: rows from the proxy's pipe → the same Parquet files the writer thread makes.

Run by `recording.writer_pipe.WriterProcess` as `python -m recording.writer_child`;
the protocol is described there. Inside, it is an ordinary `ParquetRecorder`
driven inline (flushes when the proxy says so, compaction on its own
thread), so the files, their names, footers and crash rules are exactly the
writer thread's: one code path for the format.

Counting: the proxy tells the child how many rows were dropped before they
reached it (queue full, or lost with an earlier writer process); the child
writes those into the footers beside its own write drops, and answers every
flush with what it wrote and dropped, which the proxy shows in `/metrics`.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
from typing import Any

from recording.thread_names import name_os_thread
from recording.writer import ParquetRecorder, row_data_bytes
from recording.writer_pipe import recv, send


def _configure_logging(level: str, fmt: str) -> None:
    """Lines on stderr (stdout is the pipe) in the proxy's own format and level: one log stream, one format."""
    from recording.logs import configure_logging

    configure_logging(fmt if fmt in ("console", "json") else "json", level)  # type: ignore[arg-type]


UNUSED_PACKAGES = ("pandas", "numpy")  # what pyarrow would import in this process, and nothing here uses


class _Refused:
    """An import finder that refuses `UNUSED_PACKAGES`, so that pyarrow finds neither and does without.

    Why: pyarrow imports numpy with itself and pandas on its first array, only to ask whether an
    argument is one of their objects. Here the answer is always no (rows arrive as Python values), and
    the two cost this process ~35 MB (pandas) and ~12 MB (numpy) of RSS: the proxy's memory with its
    writer (bench/proxy_overhead.py) is counted with this process. Nothing the writer does needs them.
    """

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".", 1)[0] in UNUSED_PACKAGES:
            raise ModuleNotFoundError(f"the recording writer process does not use {name}", name=name)
        return None


def refuse_unused() -> None:
    """Install `_Refused` first among the import finders (once; before pyarrow is imported)."""
    if not any(isinstance(f, _Refused) for f in sys.meta_path):
        sys.meta_path.insert(0, _Refused())


def use_returnable_memory() -> None:
    """Make Arrow allocate with the C library's malloc, so that `give_back_memory` can return it.

    Why: Arrow's default pool (mimalloc in the wheels) keeps what a flush, a merge or a rollup freed in
    heaps of the thread that freed it, for that thread's next use. Over a proxy's run that held ~60 MB
    more in this process than it was using. glibc's malloc gives back the free memory of every thread's
    arena at once (`malloc_trim`). Set before pyarrow is imported: Arrow reads it when first allocating.
    """
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"


def give_back_memory() -> None:
    """Return what the flushes and merges freed to the kernel (Arrow's system pool: `malloc_trim(0)`, 1-3 ms).

    Called when `GiveBack` says so, so that the process's RSS falls back to what it holds once the
    traffic ebbs, not the largest flush it ever wrote.
    """
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


class GiveBack:
    """When the writer process gives its freed memory back: when the load ebbs, and at least every HOLD_S.

    Why not after every flush (as it did): memory given back is memory the next flush faults in again,
    page by page, each one cleared by the kernel. Under a steady load every flush needs about what the
    last one freed, and giving it back cost ~1 µs per request row and ~5 µs per captured frame in the
    writer process, half of a frame's cost (bench/RESULTS.md, thirty-ninth session). So the memory is
    kept while flushes stay about as large as the largest since the last return, and given back at the
    first flush EBB times smaller (the traffic ebbed, or stopped: the idle proxy's RSS is what it
    was), and in any case HOLD_S after the last return (a merge's memory, a load that never ebbs).
    Pure: the caller says how many rows each flush wrote and when.
    """

    EBB = 4
    HOLD_S = 30.0

    def __init__(self, now: float) -> None:
        self.largest = 0  # rows of the largest flush since the memory was last given back
        self.since = now

    def after_flush(self, rows: int, now: float) -> bool:
        """Whether to give the memory back now, after a flush of `rows` rows (every dataset)."""
        self.largest = max(self.largest, rows)
        ebbed = self.largest > 0 and rows * self.EBB <= self.largest  # nothing since the last return: nothing ebbed
        if not ebbed and now - self.since < self.HOLD_S:
            return False
        self.largest, self.since = rows, now
        return True


def _stats(rec: ParquetRecorder) -> dict[str, Any]:
    return {
        "rows_written": {n: s.rows_written for n, s in rec._streams.items()},
        "write_dropped": {n: s.write_dropped for n, s in rec._streams.items()},
        "files_written": {n: s.files_written for n, s in rec._streams.items()},
        "errors": dict(rec.errors),
    }


class _Answers:
    """The child's answers to the proxy, which may be dead: then nobody reads them, and they stop.

    Why: a proxy killed with answers still to come (its last flush requests in the pipe) leaves the
    child with a pipe that has no reader. An answer written there raised BrokenPipeError, which ended
    the child there and then: the rows the pipe still held after that flush were never written, and a
    merge its compaction thread was writing stayed a `.tmp-` file.
    """

    def __init__(self, out: Any) -> None:
        self.out: Any = out

    def send(self, msg: Any) -> None:
        if self.out is None:
            return
        try:
            send(self.out, msg)
        except (BrokenPipeError, ValueError, OSError):  # the proxy is gone: the input's end will tell the rest
            out, self.out = self.out, None
            try:
                out.close()  # its unsent bytes go with it (else the interpreter's exit tries them again)
            except (BrokenPipeError, ValueError, OSError):
                pass


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only "close" or end of input end this process
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    name_os_thread(b"kafkatap-writer")  # how `top` and `ps -L` show it beside the proxy
    refuse_unused()
    use_returnable_memory()
    # Unpickled rows are plain acyclic dicts freed by reference counting; the default collector would
    # walk every queued row again and again while a flush's worth accumulates (~20 % of unpickling).
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    inp = os.fdopen(os.dup(0), "rb")
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print must not corrupt the pipe
    msg = recv(inp)
    if msg is None or msg[0] != "config":
        return 2
    cfg = dict(msg[1])
    _configure_logging(cfg.pop("log_level", "warning"), cfg.pop("log_format", "json"))
    rec = ParquetRecorder(cfg.pop("root"), cfg.pop("proxy_id"), queue_rows=1 << 62, queue_bytes=1 << 62,
                          frame_queue_bytes=1 << 62, **cfg)
    # Drops are the proxy's to log: it counts its own and, from the stats answered below, this process's write
    # drops too. Logged here as well, each write drop came twice, once beside this process's unbounded queue cap.
    rec.log_drops = False
    if rec.compact_interval_s > 0:
        rec._compactor.start()
    if rec.finalize_leftovers_at_start:  # the proxy holds the partition's lock: no other writer records into it
        rec.start_finalizing()
    answers = _Answers(out)
    answers.send(("ready", os.getpid()))
    streams = rec._streams
    give_back = GiveBack(time.monotonic())
    arrived = 0  # rows received since the last flush, every dataset
    while True:
        msg = recv(inp)
        if msg is None:  # the proxy is gone (crash, kill -9): write what arrived, then exit
            rec._flush(final=True)
            rec.finish_compaction()
            return 0
        kind = msg[0]
        if kind == "rows":
            s = streams[msg[1]]
            rows = msg[2]
            s.queue.extend(rows)
            s.enqueued += len(rows)
            arrived += len(rows)
            if s.name == "frames":
                s.enq_bytes += row_data_bytes(s, rows)
        elif kind in ("flush", "close"):
            for name, dropped in msg[1].items():  # dropped before reaching this process: the proxy logged them
                s = streams[name]
                s.dropped_logged += dropped - s.dropped
                s.dropped = dropped
            rec.requests_dropped = msg[2]
            rec._flush(final=kind == "close")
            if kind == "close":
                rec.finish_compaction()
            if kind == "flush" and give_back.after_flush(arrived, time.monotonic()):
                give_back_memory()  # before the answer: the proxy (and a test) see the process as it will stay
            arrived = 0
            answers.send(("stats", _stats(rec)))
            if kind == "close":
                return 0


if __name__ == "__main__":
    sys.exit(main())
