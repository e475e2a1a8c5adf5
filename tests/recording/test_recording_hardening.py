"""Issue 19 (recording): bounded queue memory, streaming compaction, durable renames, private temp files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq

from recording import layout
from recording.reader import read_recording
from recording.sample_rows import SessionMix
from recording.writer import ParquetRecorder, _row_size

REPO = Path(__file__).resolve().parents[2]
PART = "requests/proxy=p1/date=2026-01-01/hour=00"


def test_queue_is_bounded_by_estimated_bytes_not_only_rows(rec_dir: Path) -> None:
    """200 000 rows of ~2 KiB each were ~350 MiB at the row cap; a byte budget now caps it first."""
    budget = 4 << 20  # half of it for requests
    rec_dir.mkdir()
    r = ParquetRecorder(rec_dir, "p1", fsync=False, queue_rows=200_000, queue_bytes=budget)  # not started
    rows = list(SessionMix().rows(5_000))
    for row in rows:
        r.request(row)
    queued, dropped = r.queue_depth()["requests"], r.dropped()["requests"]
    assert queued + dropped == len(rows) and dropped > 0
    queued_bytes = sum(_row_size(row) for row in rows[:queued])
    assert queued_bytes <= (budget // 2) * 1.5, queued_bytes  # the estimate is sampled: allow some slack
    r.close()
    assert read_recording(rec_dir, "requests").num_rows == queued


def test_rename_is_followed_by_a_directory_fsync(rec_dir: Path, monkeypatch) -> None:
    synced_dirs: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            synced_dirs.append(st.st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    rec_dir.mkdir()
    r = ParquetRecorder(rec_dir, "p1", fsync=True, compact_interval_s=0)
    for row in SessionMix().rows(10):
        r.request(row)
    r.close()
    (f,) = rec_dir.rglob("part-*.parquet")
    assert f.parent.stat().st_ino in synced_dirs, "the rename into the partition directory was never fsynced"


def _tmp(directory: Path, name: str, age_s: float = 0.0) -> Path:
    path = directory / name
    path.write_bytes(b"PAR1 in progress")
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return path


def test_recovery_keeps_a_live_writers_temp_files_and_removes_dead_or_stale_ones(rec_dir: Path) -> None:
    """Two proxies with the same proxy id share directories: one's start-up must not delete the other's files."""
    d = rec_dir / PART
    d.mkdir(parents=True)
    own = layout.tmp_name("part-20260101T000000Z-abcd-00000001.parquet")
    assert own.startswith(f".tmp-{os.getpid()}-"), own
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    try:
        live = _tmp(d, f".tmp-{other.pid}-0a1b2c3d-part-20260101T000000Z-ffff-00000007.parquet")
        dead = _tmp(d, f".tmp-{int(gone.stdout)}-0a1b2c3d-part-20260101T000000Z-eeee-00000003.parquet")
        stale = _tmp(d, f".tmp-{other.pid}-0a1b2c3d-part-20260101T000000Z-ffff-00000001.parquet",
                     age_s=layout.TMP_STALE_S + 60)
        r = ParquetRecorder(rec_dir, "p1", fsync=False).start()  # start-up recovery of proxy id p1
        r.close()
        assert live.exists(), "a live writer's in-progress file was deleted"
        assert not dead.exists() and not stale.exists()
    finally:
        other.communicate(b"")


def test_recovery_removes_the_temp_files_of_a_writer_that_is_a_zombie(rec_dir: Path) -> None:
    """A writer process orphaned by a killed proxy can stay a zombie (a container whose PID 1 reaps late, or
    never): it has exited, so its in-progress files are leftovers, though its pid still answers kill(pid, 0)."""
    d = rec_dir / PART
    d.mkdir(parents=True)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie until wait()
        os.kill(zombie.pid, 0)  # the pid still answers
        left = _tmp(d, f".tmp-{zombie.pid}-0a1b2c3d-part-20260101T000000Z-dddd-00000002-00000005.parquet")
        r = ParquetRecorder(rec_dir, "p1", fsync=False).start()  # start-up recovery of proxy id p1
        r.close()
        assert not left.exists(), "a zombie writer's leftover was kept as if its writer still ran"
    finally:
        zombie.wait()


def test_compaction_streams_with_bounded_memory(tmp_path: Path) -> None:
    """Eight flush files merged: peak Arrow memory stays near one batch, not the whole segment."""
    script = textwrap.dedent(f"""
        import pyarrow as pa
        from recording import compaction
        from recording.reader import read_recording
        from recording.sample_rows import SessionMix
        from recording.writer import ParquetRecorder

        import pathlib
        pathlib.Path({str(tmp_path / "rec")!r}).mkdir()
        # not started: flushes and the merge run inline, on this thread, where the peak is measured
        r = ParquetRecorder({str(tmp_path / "rec")!r}, "p1", fsync=False, compact_interval_s=3600)
        import time
        hour_ns = 3600 * 10**9
        mix = SessionMix(start_ns=time.time_ns() // hour_ns * hour_ns)  # one hour's segment, whenever it runs
        sizes = []
        for _ in range(8):
            for row in mix.rows(20_000):
                r.request(row)
            r._flush(final=False)
        s = r._streams["requests"]
        (seg,) = s.segments.values()
        one_file = pa.parquet.read_table(seg.files[0].path).nbytes
        compaction.MERGE_BATCH_BYTES = one_file
        before = pa.default_memory_pool().max_memory()
        r._compact_due(s, force=True)
        peak = pa.default_memory_pool().max_memory()
        r.close()
        assert read_recording({str(tmp_path / "rec")!r}, "requests").num_rows == 160_000
        print(one_file, before, peak)
    """).replace("import pyarrow as pa", "import pyarrow as pa, pyarrow.parquet")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    one_file, before, peak = map(int, out.stdout.split()[-3:])
    assert peak - before < 4 * one_file, (one_file, before, peak)  # loading the segment is ≥ 8 files (+ sort copy)
    merged = [f for f in (tmp_path / "rec" / "requests").rglob("part-*.parquet")]
    assert len(merged) == 1 and pq.ParquetFile(merged[0]).metadata.num_row_groups >= 4


def test_a_second_proxy_recording_with_the_same_id_into_the_same_directory_is_said(rec_dir: Path) -> None:
    """Two proxies with one --proxy-id recording into one directory at once got only the "already holds a
    recording" warning (or none, when both started into an empty one): an analysis then adds them up as one
    proxy. The recorder holds a lock on its partition; a second one is told who holds it."""
    from structlog.testing import capture_logs

    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from recording.writer import ParquetRecorder
        r = ParquetRecorder({str(rec_dir)!r}, "p1", fsync=False, writer="thread").start()
        print("HOLDING", flush=True)
        sys.stdin.read()
        r.close()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        for line in holder.stdout:  # its log lines come first (structlog writes to stdout)
            if line == "HOLDING\n":
                break
        with capture_logs() as logs:
            other = ParquetRecorder(rec_dir, "p2", fsync=False, writer="thread").start()  # another id: its own partition
            same = ParquetRecorder(rec_dir, "p1", fsync=False, writer="thread").start()
            same.close()
            other.close()
        said = [e for e in logs if "same proxy id" in e["event"]]
        assert len(said) == 1 and said[0]["proxy_id"] == "p1", logs
        assert said[0]["other"].startswith(f"pid {holder.pid}: ") and "ParquetRecorder" in said[0]["other"]
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(30) == 0
    with capture_logs() as logs:  # the first one closed: its lock went with it
        ParquetRecorder(rec_dir, "p1", fsync=False, writer="thread").start().close()
    assert not [e for e in logs if "same proxy id" in e["event"]]
