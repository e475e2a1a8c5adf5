"""kill -9 mid-stream leaves only valid files and loses at most ~one flush interval; SIGTERM loses nothing."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from recording.writer import ParquetRecorder, recover
from recording.reader import read_recording

RATE = 5000  # rows/s
FLUSH = 0.2


def _start(root: Path, compact: float, writer: str = "thread") -> subprocess.Popen:
    env = dict(os.environ, KAFKATAP_LOG_FORMAT="json")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.recording.writer_proc", str(root), str(RATE), str(FLUSH), str(compact), writer],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2], env=env,
    )


def _run_until(proc: subprocess.Popen, seconds: float, pids: list[int] | None = None,
               root: Path | None = None) -> int:
    """Let the writer run `seconds`, and on (until a minute) until `root` holds a complete file and the
    writer process, if asked for, was reported: on a loaded machine start-up alone can take seconds.

    Returns (rows enqueued, of them at risk by design at that moment) from the writer's last line.
    """
    t_end = time.monotonic() + seconds
    deadline = t_end + 60
    last = (0, 0)

    def ready() -> bool:
        return ((pids is None or bool(pids)) and (root is None or any(root.rglob("part-*.parquet"))))

    while time.monotonic() < t_end or (time.monotonic() < deadline and not ready()):
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"writer exited early: {proc.stderr.read()[-2000:]}")
        if line.startswith("writer "):
            if pids is not None:
                pids.append(int(line.split()[1]))
            continue
        n, at_risk = map(int, line.split())
        last = (n, at_risk)
    return last


def _wait_gone(pid: int, timeout: float = 60.0) -> None:
    """Wait for a process that is not our child (the writer process, orphaned by the kill) to end."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        poller = select.poll()  # not select(): by this point of a full run the descriptor may be above 1023
        poller.register(fd, select.POLLIN)
        assert poller.poll(timeout * 1000), f"writer process {pid} still running {timeout} s after its proxy was killed"
    finally:
        os.close(fd)


@pytest.mark.parametrize("writer", ["thread", "process"])
@pytest.mark.parametrize("compact", [0.0, 0.5], ids=["flush-files", "with-compaction"])
def test_kill9_leaves_valid_files_and_loses_at_most_one_interval(tmp_path: Path, compact: float, writer: str) -> None:
    """writer=process: kill -9 of the proxy ends the writer's input; it writes what it got and exits."""
    root = tmp_path / "rec"
    proc = _start(root, compact, writer)
    pids: list[int] = []
    try:
        enqueued, at_risk = _run_until(proc, 2.5, pids if writer == "process" else None, root)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    if writer == "process":
        assert pids, "the writer process never started"
        _wait_gone(pids[0])
    files = list(root.rglob("part-*.parquet"))
    assert files
    for f in files:  # every complete-named file is a valid Parquet file
        pq.read_table(f)
    assert not [f for f in root.rglob("*.parquet") if not f.name.startswith(("part-", ".tmp-"))]
    t = read_recording(root, "requests")
    ids = t["correlation_id"].to_pylist()
    assert len(ids) == len(set(ids)), "the reader must not see duplicates after a crash during compaction"
    assert sorted(ids) == list(range(1, len(ids) + 1)), "only the tail may be missing"
    lost = enqueued - len(ids)
    # what was still at risk at the last report (thread: not written; process: not yet in the writer
    # process), plus one flush interval and a batch of scheduling slack on an oversubscribed 2-core box
    assert lost <= at_risk + RATE * (FLUSH + 0.5), f"lost {lost} rows of {enqueued} ({at_risk} at risk)"
    recover(root)
    assert not list(root.rglob(".tmp-*"))
    assert read_recording(root, "requests").num_rows == len(ids)


@pytest.mark.parametrize("next_writer", ["thread", "process"])
def test_the_next_writer_rewrites_the_interim_flush_files_a_crash_left(tmp_path: Path, next_writer: str) -> None:
    """While compaction is on, flush files are written the cheap way (lz4, unsorted) for compaction to rewrite; a
    writer killed before its compaction leaves them so. The next writer of the proxy id rewrites them in place as
    final files (zstd, sorted), every row kept, whichever writer mode it runs."""
    root = tmp_path / "rec"
    proc = _start(root, 60.0)
    try:
        _run_until(proc, 1.0, None, root)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    left = sorted(root.rglob("part-*.parquet"))
    assert left and all(pq.read_schema(f).metadata.get(b"kafkatap.interim") == b"1" for f in left)
    rows = read_recording(root, "requests").num_rows
    rec = ParquetRecorder(root, "crash", fsync=False, writer=next_writer).start()
    rec.close()  # waits for the rewrite
    for f in left:
        md = pq.read_metadata(f)
        assert b"kafkatap.interim" not in md.metadata, f
        assert {md.row_group(0).column(c).compression for c in range(md.num_columns)} == {"ZSTD"}, f
    assert read_recording(root, "requests").num_rows == rows


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_sigterm_loses_nothing(tmp_path: Path, writer: str) -> None:
    root = tmp_path / "rec"
    proc = _start(root, 0.5, writer)
    try:
        _run_until(proc, 1.5, None, root)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    closed = [ln for ln in out.splitlines() if ln.startswith("closed ")]
    n = int(closed[0].split()[1])
    t = read_recording(root, "requests")
    assert t.num_rows == n and sorted(t["correlation_id"].to_pylist()) == list(range(1, n + 1))


def test_a_proxy_killed_before_its_writer_answers_loses_nothing_it_handed_over(tmp_path: Path) -> None:
    """The writer process answers each flush; when its proxy was killed meanwhile, nobody reads that answer.
    Writing it must not end the child: the rows still in the pipe behind the flush are written too, every
    merge is finished (no `.tmp-` file), and nothing is printed but the child's own log lines."""
    root = tmp_path / "rec"
    proc = subprocess.Popen([sys.executable, "-m", "tests.recording.orphan_proc", str(root), "3000", "2000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    _wait_gone(next(int(ln) for ln in out.splitlines() if ln.strip().isdigit()))  # (log lines share stdout)
    assert "Traceback" not in err and "BrokenPipe" not in err, err[-2000:]
    assert not list(root.rglob(".tmp-*")), "a merge was left half written"
    ids = read_recording(root, "requests")["correlation_id"].to_pylist()
    assert sorted(ids) == list(range(1, 5001))
