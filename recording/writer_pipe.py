"""The pipe between a proxy and its recording writer process: message framing and spawning.

Why a process (issue 16): converting rows to Arrow and encoding Parquet
(sort, dictionary, zstd) cost ~5-15 µs per row. On a thread of the proxy's
process that work competed with the event loop for the GIL and for the
proxy's one core: +54 % proxy CPU per request, and loop stalls of 50-80 ms
while 10,000 rows were converted (issue 19). In a child process it runs on
another core; the proxy only pickles queued rows in small chunks (on the
loop thread every 64 rows, `recording.writer.PACK_ROWS`; what is left at a
flush on the shipping thread, ≤ `CHUNK_ROWS` rows per call, so the GIL is
never held long) and writes them to a pipe.

Messages are pickled tuples behind an 8-byte big-endian length:

    parent → child   ("config", {...})                       once, first
                     ("rows", dataset, [row dict, ...])     a chunk of queued rows
                     ("flush" | "close", drops, relay_drops) write what came so far; close: then exit
    child → parent   ("ready", pid)                         after "config"
                     ("stats", {...})                       after every "flush" / "close" (read by a
                                                            thread of the proxy: nobody waits for it)

End of input (the proxy died, even by kill -9) makes the child write every
row it received and exit: the crash bound stays "rows still queued in the
proxy", as with the thread. The child ignores SIGINT/SIGTERM (its own
session, so a terminal's Ctrl-C or a service manager's SIGTERM to the group
cannot kill it before the proxy's last rows arrive); it only ever ends at
"close" or end of input.

Memory: the proxy ships what its queues hold at a flush and waits for that
flush's answer before it ships more, so the child holds at most one queue's
worth of rows (the recorder's `queue_rows` / `queue_bytes` bound both sides);
the pipe itself holds one 512-row chunk.

The child runs `python -P -m recording.writer_child` from this checkout; this module imports
nothing of the writer, so neither side imports the other.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["CHUNK_ROWS", "CHUNK_BYTES", "send", "send_raw", "recv", "WriterGone", "WriterProcess"]

CHUNK_ROWS = 512  # rows per pickled message: bounds how long the shipping thread holds the GIL (~0.8 ms)
CHUNK_BYTES = 8 << 20  # frames: also bounded by their data bytes
_HEADER = 8
_PROJECT_ROOT = Path(__file__).resolve().parents[1]


PIPE_BYTES = 1 << 20  # the rows' pipe: a flush's chunks go through in a few writes, not one per 64 KiB


def _widen(pipe: BinaryIO) -> None:
    """Grow the pipe to PIPE_BYTES. With the default 64 KiB, a second of rows at 20k requests/s (several
    MiB with `--capture`) crossed in hundreds of blocking writes, each a wake-up of both processes."""
    try:
        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (OSError, AttributeError):  # not Linux, or a pipe-max-size below it: the default size works, in more turns
        pass


class WriterGone(RuntimeError):
    """The writer process ended or its pipe broke: what it had not confirmed is lost."""


def send(out: BinaryIO, msg: Any) -> None:
    """Write one message (pickled, length-prefixed) and flush it."""
    send_raw(out, pickle.dumps(msg, protocol=5))


def send_raw(out: BinaryIO, payload: bytes) -> None:
    """Write one message pickled beforehand (the recorder packs rows on the loop thread) and flush it."""
    out.write(len(payload).to_bytes(_HEADER, "big"))
    out.write(payload)
    out.flush()


def _activity(pid: int) -> tuple[str, ...] | None:
    """What a process has done so far: its CPU ticks (/proc/PID/stat) and bytes read and written (/proc/PID/io).

    Any change is progress. None when they cannot be read (the process is gone, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/io", "rb") as f:
            io = f.read().split()
    except OSError:
        return None
    return (*(x.decode() for x in stat[11:13]), *(x.decode() for x in io[1:4:2]))


def recv(inp: BinaryIO) -> Any | None:
    """Read one message; None at end of input (a message cut short counts as the end)."""
    header = inp.read(_HEADER)
    if len(header) < _HEADER:
        return None
    size = int.from_bytes(header, "big")
    payload = inp.read(size)
    if len(payload) < size:
        return None
    return pickle.loads(payload)


class WriterProcess:
    """The parent's handle on one writer child: spawn, send rows, ask for flushes, close.

    Rows and flush requests are sent without waiting for the child: its
    answers (its counts after each flush) are read by a thread of their own
    and handed to `on_stats`. So the proxy's queue is emptied into the pipe
    every flush interval even while the child is still writing the previous
    flush — a kill -9 of the proxy then loses only what it had queued since
    its last shipment, not also what waited for a slow disk. At most
    `MAX_PENDING_FLUSHES` flushes may be unanswered: past that, `flush()`
    waits (and rows wait in the proxy's bounded queue, counted when it is
    full), so a child slower than the traffic cannot make memory grow.
    Used by one shipping thread; `on_stats` runs on the reader thread.
    """

    MAX_PENDING_FLUSHES = 2
    # A child with work to do (a flush unanswered, or rows the pipe cannot take) that for STALL_S neither answered
    # nor used CPU nor read or wrote a byte is stopped (SIGSTOP) or stuck on its disk (a hung NFS mount): it is
    # killed and given up, so that the proxy's flushes and its stop never wait on it for ever. A slow disk still
    # shows progress (bytes written, CPU), so it is not taken for a stuck one.
    STALL_S = 60.0
    CHECK_S = 5.0

    def __init__(self, config: dict[str, Any], on_stats: Callable[[WriterProcess, dict[str, Any]], None]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PROJECT_ROOT), env.get("PYTHONPATH")) if p)
        # -P: not the working directory first on sys.path (what `-m` does by default), so the child runs the
        # same code as the proxy, whatever directory the proxy was started from
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "recording.writer_child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=None, env=env, start_new_session=True, close_fds=True,
        )
        self.pid = self.proc.pid
        _widen(self.proc.stdin)  # type: ignore[arg-type]
        self._fd = self.proc.stdin.fileno()  # type: ignore[union-attr]
        os.set_blocking(self._fd, False)  # writes wait in `_write`, which gives up on a child found stuck
        self._on_stats = on_stats
        self._cond = threading.Condition()
        self._pending = 0  # flushes sent, not answered yet
        self._answers = 0  # answers received: progress, for the watchdog
        self._sending = False  # a write waits for room in the pipe
        self.stalled: str | None = None  # why the watchdog gave this child up
        self.ready = False
        self.ended = False  # its answers stopped: it exited, its pipe broke, or it was given up as stuck
        self._reader = threading.Thread(target=self._read, name="kafkatap-rec-answers", daemon=True)
        self._reader.start()
        self._watchdog = threading.Thread(target=self._watch, name="kafkatap-rec-watch", daemon=True)
        self._watchdog.start()
        try:
            self.send(("config", config))  # the child reads it once its imports are done; the pipe holds it
        except WriterGone:
            self.close(timeout=5.0)
            raise

    def _read(self) -> None:
        out = self.proc.stdout
        try:
            while True:
                msg = recv(out)  # type: ignore[arg-type]
                if msg is None:
                    break
                if msg[0] == "ready":
                    self.ready = True
                elif msg[0] == "stats":
                    self._on_stats(self, msg[1])
                    with self._cond:
                        self._pending -= 1
                        self._answers += 1
                        self._cond.notify_all()
        except (OSError, ValueError):  # our end was closed under us
            pass
        finally:
            with self._cond:
                self.ended = True
                self._cond.notify_all()

    def _watch(self) -> None:
        """Give up a child that has work to do and shows no sign of doing it for STALL_S (see STALL_S)."""
        last, mark = time.monotonic(), None
        with self._cond:
            while not self.ended:
                self._cond.wait(self.CHECK_S)
                now = time.monotonic()
                if self.ended or not (self._pending > 0 or self._sending):
                    last, mark = now, None
                    continue
                seen = (self._answers, _activity(self.pid))
                if seen != mark:
                    last, mark = now, seen
                elif now - last >= self.STALL_S:
                    self.stalled = (f"writer process {self.pid} made no progress for {now - last:.0f} s with rows to "
                                    "write (stopped, or its disk hangs): killed, a new one takes over")
                    self.ended = True
                    self._cond.notify_all()
                    try:
                        os.kill(self.pid, signal.SIGKILL)
                    except OSError:
                        pass

    def gone(self) -> WriterGone:
        """Why this child can take nothing more."""
        return WriterGone(self.stalled or f"writer process ended (exit code {self.proc.poll()})")

    def send(self, msg: Any) -> None:
        self.send_raw(pickle.dumps(msg, protocol=5))

    def send_raw(self, payload: bytes) -> None:
        if self.ended:
            raise self.gone()
        try:
            self._write(len(payload).to_bytes(_HEADER, "big"))
            self._write(payload)
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise WriterGone(f"writer process pipe broke: {exc}") from exc

    def _write(self, data: bytes) -> None:
        """All of `data` into the pipe; while it is full, wait for room unless the child is given up meanwhile."""
        view = memoryview(data)
        poller = None
        while view:
            try:
                view = view[os.write(self._fd, view):]
                continue
            except BlockingIOError:
                pass
            if self.ended:
                raise self.gone()
            if poller is None:
                poller = select.poll()
                poller.register(self._fd, select.POLLOUT)
            self._sending = True
            try:
                poller.poll(self.CHECK_S * 1000)
            finally:
                self._sending = False

    def flush(self, msg: Any) -> None:
        """Ask for a flush (its answer arrives through `on_stats`); waits while too many are unanswered."""
        with self._cond:
            while self._pending >= self.MAX_PENDING_FLUSHES and not self.ended:
                self._cond.wait()
            self._pending += 1
        self.send(msg)

    def wait_answered(self, timeout: float) -> bool:
        """Wait until every flush asked so far is answered (or the child ended); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending <= 0 or self.ended, timeout)

    def finish(self, msg: Any, timeout: float = 600.0) -> None:
        """Send the last request ("close"), wait for every answer, then for the child to exit."""
        with self._cond:
            self._pending += 1
        self.send(msg)
        with self._cond:
            self._cond.wait_for(lambda: self._pending <= 0 or self.ended, timeout)
            if self._pending > 0:
                raise WriterGone(self.stalled or "writer process ended before it confirmed its last rows")
        self.close()

    def close(self, timeout: float = 60.0) -> None:
        """Close our end; the child exits at end of input. Waits for it (kills it if it hangs) and its answers."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:  # killed, but in an uninterruptible wait on its disk: left to end
                pass
        self._reader.join(timeout)
        with self._cond:
            self.ended = True  # the watchdog's end too
            self._cond.notify_all()
        if self._reader.is_alive():  # still reading the answers of a child that cannot die yet: closing would wait
            return
        try:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        except OSError:
            pass
