"""writer="process" (issue 16): the same files as the writer thread, every row accounted for, a dead child replaced."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from recording.files import META_DROPPED_TOTAL
from recording.reader import read_recording
from recording.sample_rows import SessionMix, connection_row, frame_row, tcp_row
from recording.schema import REQUEST_COLUMNS
from recording.writer import ParquetRecorder
from recording.writer_pipe import WriterProcess


def _write_both(root: Path, writer: str, rows: list[dict], others: tuple[dict, dict, dict]) -> ParquetRecorder:
    r = ParquetRecorder(root, "p1", capture="all", fsync=False, flush_interval_s=3600, writer=writer).start()
    for row in rows:
        r.request(dict(row))
    conn, tcp, frame = others
    r.connection(dict(conn))
    r.tcp(dict(tcp))
    r.frame(dict(frame))
    r.close()
    return r


def test_the_writer_process_writes_what_the_thread_writes(tmp_path: Path) -> None:
    rows = SessionMix(proxy_id="p1").rows(3000)
    others = (connection_row("p1", "c00001"), tcp_row("p1", "c00001"),
              frame_row("p1", "c00001", 3, b"\x00\x00\x00\x0c\x00\x03\x00\x0c\x00\x00\x00\x07", api_version=12))
    by = {w: _write_both(tmp_path / w, w, rows, others) for w in ("thread", "process")}
    for ds in ("requests", "connections", "tcp", "frames"):
        a = read_recording(tmp_path / "thread", ds, with_partitions=False)
        b = read_recording(tmp_path / "process", ds, with_partitions=False)
        assert a.schema == b.schema, ds
        assert a.num_rows == b.num_rows > 0, ds
        key = [(f.name, "ascending") for f in a.schema if not pa.types.is_nested(f.type)]
        assert a.sort_by(key).equals(b.sort_by(key)), ds
    st = by["process"].stats()
    assert st["rows_written"]["requests"] == 3000 and st["dropped"]["requests"] == 0
    assert st["queued"]["requests"] == 0 and st["files_written"] == by["thread"].stats()["files_written"]
    assert not list((tmp_path / "process").rglob(".tmp-*"))
    names = [p.relative_to(tmp_path / "process").parent for p in (tmp_path / "process").rglob("part-*.parquet")]
    assert sorted(names) == sorted(p.relative_to(tmp_path / "thread").parent
                                   for p in (tmp_path / "thread").rglob("part-*.parquet"))


def test_drops_before_the_pipe_reach_the_footers_the_child_writes(tmp_path: Path) -> None:
    r = ParquetRecorder(tmp_path, "p1", fsync=False, flush_interval_s=3600, queue_rows=100, writer="process",
                        compact_interval_s=0).start()
    r.requests_dropped = {"in_flight_cap": 3}
    for row in SessionMix().rows(150):  # 50 over the queue's cap: dropped here, in the proxy's process
        r.request(row)
    r.close()
    assert r.stats()["rows_written"]["requests"] == 100 and r.dropped()["requests"] == 50
    (f,) = (tmp_path / "requests").rglob("part-*.parquet")
    md = pq.read_metadata(f).metadata
    assert md[META_DROPPED_TOTAL] == b"50" and md[b"kafkatap.dropped_rows"] == b"50"
    assert md[b"kafkatap.requests_dropped_by_relay"] == b"in_flight_cap=3"


def test_a_killed_writer_process_is_replaced_and_its_rows_counted(tmp_path: Path) -> None:
    """Accounting holds whatever the child does: rows handed over == rows written + rows counted as dropped."""
    r = ParquetRecorder(tmp_path, "p1", fsync=False, flush_interval_s=3600, writer="process",
                        compact_interval_s=0).start()
    mix = SessionMix()
    handed = 0
    for row in mix.rows(500):
        r.request(row)
        handed += 1
    r._ship(final=False)  # the shipping thread's flush, run here so the test knows when it happened
    assert r._wait_flushed()
    first = r._child
    assert first is not None and r.stats()["rows_written"]["requests"] == 500
    for row in mix.rows(300):
        r.request(row)
        handed += 1
    r._ship_stream(first, r._streams["requests"])  # handed over, not yet written …
    os.kill(first.pid, signal.SIGKILL)  # … when the writer dies
    first.proc.wait()
    for row in mix.rows(200):
        r.request(row)
        handed += 1
    r._ship(final=False)  # notices the dead child: its 300 unconfirmed rows are counted as dropped
    assert r.dropped()["requests"] == 300 and r.write_errors >= 1
    r._ship(final=False)  # a new writer process takes the rows from here on
    assert r._child is not None and r._child.pid != first.pid
    r.close()
    st = r.stats()
    assert st["rows_written"]["requests"] + st["dropped"]["requests"] == handed
    assert read_recording(tmp_path, "requests").num_rows == st["rows_written"]["requests"] == 700
    for f in (tmp_path / "requests").rglob("part-*.parquet"):  # the replacement wrote under its own run id
        pq.read_table(f)
    runs = {f.name.split("-")[1] + f.name.split("-")[2] for f in (tmp_path / "requests").rglob("part-*.parquet")}
    assert len(runs) == 2


def test_a_row_that_cannot_cross_the_pipe_is_counted_not_fatal(tmp_path: Path) -> None:
    r = ParquetRecorder(tmp_path, "p1", fsync=False, flush_interval_s=3600, writer="process",
                        compact_interval_s=0).start()
    rows = SessionMix().rows(100)
    # nothing the proxy makes, but a bug must cost a row, not the recording: one in a chunk packed on the
    # loop thread (every 64 rows), one in the tail the shipping thread pickles
    rows[3]["client_id"] = rows[90]["client_id"] = lambda: None
    for row in rows:
        r.request(row)
    r.close()
    assert r.stats()["rows_written"]["requests"] == 98 and r.dropped()["requests"] == 2
    assert r.stats()["queued"]["requests"] == 0  # each refused row counted once: not -1 in the queue gauge
    (f,) = (tmp_path / "requests").rglob("part-*.parquet")
    assert pq.read_metadata(f).metadata[META_DROPPED_TOTAL] == b"2"


def _full_rows(n: int) -> list[dict]:
    """Request rows with every column, as `proxy.rows.request_row` makes them (SessionMix leaves some out)."""
    return [{c.name: r.get(c.name) for c in REQUEST_COLUMNS} for r in SessionMix(proxy_id="p1").rows(n)]


def test_full_request_rows_travel_as_value_tuples_and_are_written_alike(tmp_path: Path) -> None:
    """Rows with every column cross the pipe as value tuples (the cheap way); others, mixed in, as dicts."""
    rows = _full_rows(1000) + SessionMix(proxy_id="p1", seed=11).rows(300)  # the last 300 lack some columns
    probe = ParquetRecorder(tmp_path / "probe", "p1", fsync=False, flush_interval_s=3600, writer="process").start()
    probe.request(dict(rows[0]))
    probe.request(dict(rows[-1]))
    assert [type(r) for r in probe._req.queue] == [tuple, dict]
    # what the writer process does with them (its recorder writes: writer="thread", the one with Arrow types)
    writes = ParquetRecorder(tmp_path / "writes", "p1", fsync=False, writer="thread")
    batch = ParquetRecorder._columns_to_batch(writes._req, [probe._req.as_tuple(r) for r in rows[:1000]])
    assert batch.num_rows == 1000  # column by column, not row by row
    probe.close()
    others = (connection_row("p1", "c00001"), tcp_row("p1", "c00001"),
              frame_row("p1", "c00001", 3, b"\x00\x00\x00\x0c\x00\x03\x00\x0c\x00\x00\x00\x07", api_version=12))
    for w in ("thread", "process"):
        _write_both(tmp_path / w, w, rows, others)
    a = read_recording(tmp_path / "thread", "requests", with_partitions=False)
    b = read_recording(tmp_path / "process", "requests", with_partitions=False)
    assert a.schema == b.schema and a.num_rows == b.num_rows == 1300
    key = [(f.name, "ascending") for f in a.schema if not pa.types.is_nested(f.type)]
    assert a.sort_by(key).equals(b.sort_by(key))


def test_a_value_tuple_that_does_not_fit_its_column_costs_that_row_only(tmp_path: Path) -> None:
    r = ParquetRecorder(tmp_path, "p1", fsync=False, flush_interval_s=3600, writer="process",
                        compact_interval_s=0).start()
    rows = _full_rows(200)
    rows[5]["api_key"] = "not a number"  # crosses the pipe (it pickles) but no int16 column takes it
    for row in rows:
        r.request(row)
    r.close()
    assert r.stats()["rows_written"]["requests"] == 199 and r.dropped()["requests"] == 1
    assert read_recording(tmp_path, "requests").num_rows == 199


def test_the_rows_pipe_is_widened(tmp_path: Path) -> None:
    """A second of rows crosses in a few writes, not one blocking write per 64 KiB (bench/RESULTS.md)."""
    import fcntl

    from recording.writer_pipe import PIPE_BYTES

    r = ParquetRecorder(tmp_path, "p1", fsync=False, writer="process", compact_interval_s=0).start()
    try:
        assert r._child is not None
        assert fcntl.fcntl(r._child.proc.stdin.fileno(), fcntl.F_GETPIPE_SZ) == PIPE_BYTES
    finally:
        r.close()


def _frames(n: int, size: int = 200) -> list[dict]:
    """Request frames whose own header agrees with the row (the recorder refuses the others)."""
    out = []
    for i in range(n):
        body = (3).to_bytes(2, "big") + (12).to_bytes(2, "big") + i.to_bytes(4, "big") + bytes(size - 12)
        out.append(frame_row("p1", f"c{i % 4:05d}", 3, len(body).to_bytes(4, "big") + body, api_version=12,
                             correlation_id=i))
    return out


def test_captured_frames_travel_as_value_tuples_packed_by_rows_and_bytes(tmp_path: Path) -> None:
    """Frames are packed on the loop thread like request rows: every 64, or sooner when their bytes add up."""
    from recording.writer import PACK_BYTES, PACK_ROWS

    r = ParquetRecorder(tmp_path / "probe", "p1", capture="all", fsync=False, flush_interval_s=3600,
                        writer="process").start()
    s = r._frames
    r.frame(_frames(1)[0])
    assert [type(x) for x in s.queue] == [tuple]
    for f in _frames(PACK_ROWS - 1):
        r.frame(f)
    assert not s.queue and len(s.packed) == 1 and s.pk_rows == PACK_ROWS
    big = _frames(2, size=PACK_BYTES // 2 + 1)
    r.frame(big[0])
    assert len(s.queue) == 1  # half the bytes: still queued
    r.frame(big[1])
    assert not s.queue and len(s.packed) == 2  # two frames, but their bytes closed the pack
    r.close()
    assert r.stats()["rows_written"]["frames"] == PACK_ROWS + 2 and r.dropped()["frames"] == 0
    assert s.enq_bytes - s.pk_data - s.deq_bytes == 0 and s.pk_bytes == s.tx_bytes  # every byte left the cap
    frames = _frames(300, size=300) + _frames(3, size=PACK_BYTES)
    for w in ("thread", "process"):
        rec = ParquetRecorder(tmp_path / w, "p1", capture="all", fsync=False, flush_interval_s=3600, writer=w).start()
        for f in frames:
            rec.frame(dict(f))
        rec.close()
    a = read_recording(tmp_path / "thread", "frames", with_partitions=False)
    b = read_recording(tmp_path / "process", "frames", with_partitions=False)
    assert a.num_rows == b.num_rows == 303
    assert a.sort_by("correlation_id").equals(b.sort_by("correlation_id"))


def test_the_frames_byte_cap_counts_packed_frames_until_they_are_shipped(tmp_path: Path) -> None:
    r = ParquetRecorder(tmp_path, "p1", capture="all", fsync=False, flush_interval_s=3600, writer="process",
                        frame_queue_bytes=1_000_000, compact_interval_s=0).start()
    for f in _frames(30, size=100_000):  # packed every third frame (PACK_BYTES), never shipped before close
        r.frame(f)
    kept = r._frames.enqueued
    assert len(r._frames.packed) >= 2 and 8 <= kept <= 10 and r.dropped()["frames"] == 30 - kept
    r.close()
    st = r.stats()
    assert st["rows_written"]["frames"] == kept and st["rows_written"]["frames"] + st["dropped"]["frames"] == 30


def test_request_rows_stop_at_the_byte_cap_counting_packed_chunks_by_their_size(tmp_path: Path) -> None:
    """Room is granted a pack at a time, never past either cap; what is refused is counted."""
    r = ParquetRecorder(tmp_path, "p1", fsync=False, flush_interval_s=3600, writer="process",
                        queue_bytes=2 * 60_000, compact_interval_s=0).start()  # requests get half: 60,000 bytes
    s = r._req
    for row in _full_rows(3000):  # never shipped before close: everything kept waits in the proxy
        r.request(row)
    kept = 3000 - r.dropped()["requests"]
    assert 0 < kept < 3000
    assert s.pk_bytes - s.tx_bytes + len(s.queue) * s.row_bytes <= 60_000
    r.close()
    assert r.stats()["rows_written"]["requests"] == kept


def test_derived_columns_equal_the_proxys_own_rows(tmp_path: Path) -> None:
    """The writer process computes latencies, `answered` and `error_count` itself (`recording.derived`):
    they must equal what `proxy.rows.request_row` put in the rows, with missing and out-of-order clocks."""
    from protocol.events import ErrorSeen, RequestSeen, ResponseSeen, Summary
    from proxy.facts import ConnectionFacts
    from proxy.rows import request_row

    conn = ConnectionFacts(proxy_id="p1", conn_id="c1", listener="l", mode="explicit", opened_ns=0,
                           client_addr="127.0.0.1:5000", broker_addr="127.0.0.1:9092")
    base = 1_790_000_000_000_000_000
    rows = []
    for i, (last, sent, rfirst, rlast, rsent, status) in enumerate([
        (1_500, 2_999, 900_001, 901_000, 1_000_999, "answered"),
        (5_000, 4_001, 3_000, 3_500, 3_200, "answered"),  # out of order: negative spans floor like Python's //
        (700, 1_300, None, None, None, "unanswered"),  # no response: null latencies, not answered
        (700, None, None, None, None, "unanswered"),  # never sent either
    ]):
        req = RequestSeen(0, 40, base, base + last, 3, 12, "Metadata", i, "c", True, Summary())
        resp = None
        if rfirst is not None:
            errors = [ErrorSeen(3, "UNKNOWN_TOPIC_OR_PARTITION", "t", 0)] * i
            resp = ResponseSeen(40, 30, base + rfirst, base + rlast, i, req, Summary(errors=errors))
        rows.append(request_row(conn, req, resp, None if sent is None else base + sent,
                                None if rsent is None else base + rsent, status))
    assert rows[1]["proxy_req_delay_us"] == -1 and rows[1]["error_count"] == 1
    r = ParquetRecorder(tmp_path, "p1", fsync=False, flush_interval_s=3600, writer="process",
                        compact_interval_s=0).start()
    for row in rows:
        r.request(dict(row))
    assert all(type(x) is tuple for x in r._req.queue)
    r.close()
    got = read_recording(tmp_path, "requests", with_partitions=False).sort_by("correlation_id").to_pylist()
    for name in ("latency_us", "broker_latency_us", "proxy_req_delay_us", "proxy_resp_delay_us", "answered",
                 "error_count"):
        assert [g[name] for g in got] == [row[name] for row in rows], name


def test_the_writer_process_runs_this_checkouts_code_whatever_the_working_directory(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """`python -m` puts the working directory first on sys.path: another `recording` package there (an older
    checkout, say) must not become the writer process."""
    impostor = tmp_path / "cwd" / "recording"
    impostor.mkdir(parents=True)
    (impostor / "__init__.py").write_text("")
    (impostor / "writer_child.py").write_text("raise SystemExit(3)\n")
    monkeypatch.chdir(tmp_path / "cwd")
    r = ParquetRecorder(tmp_path / "rec", "p1", fsync=False, flush_interval_s=3600, writer="process",
                        compact_interval_s=0).start()
    for row in _full_rows(100):
        r.request(row)
    r.close()
    assert r.stats()["rows_written"]["requests"] == 100 and r.write_errors == 0


def test_the_proxy_process_does_not_load_what_only_the_writer_process_needs(tmp_path: Path) -> None:
    """pyarrow alone is ~75 MB of RSS per process (the rollups' pyarrow.dataset ~50 MB more): the proxy process,
    whose writer is a process, queues, packs and ships rows and must import none of it. Checked on the whole
    path: import the proxy, record rows through a process writer, close; then the rows are on disk."""
    import json

    probe = (
        "import sys\n"
        "import proxy.cli, proxy.sinks\n"
        "from recording.sample_rows import SessionMix, connection_row\n"
        "from recording.writer import ParquetRecorder\n"
        f"r = ParquetRecorder({str(tmp_path)!r}, 'p1', fsync=False, writer='process').start()\n"
        "for row in SessionMix(proxy_id='p1').rows(500):\n"
        "    r.request(row)\n"
        "r.connection(connection_row('p1', 'c00001'))\n"
        "r.close()\n"
        "import json\n"
        "print(json.dumps([r.stats()['rows_written']['requests'],\n"
        "                  sorted(m for m in sys.modules if m.split('.')[0] == 'pyarrow' or m == 'recording.rollups')]))\n"
    )
    out = _run_probe(probe)
    written, loaded = json.loads(out.stdout.strip().splitlines()[-1])  # the last line: the recorder logs to stdout
    assert loaded == [], loaded
    assert written == 500
    assert read_recording(tmp_path, "requests", with_partitions=False).num_rows == 500


def _run_probe(probe: str) -> subprocess.CompletedProcess:
    """Run `probe` in a fresh interpreter from this checkout (its imports are what a test looks at); it must succeed."""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_the_writer_process_logs_in_the_proxys_format_and_leaves_drops_to_the_proxy(tmp_path: Path) -> None:
    """The writer process logged JSON under `--log-format console`, and each of its write drops twice (once
    beside its own unbounded queue cap); the disk-full line said `error: null` and had no hint. On a real full
    disk: a small tmpfs, filled once the recorder has started."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m", "tmpfs", str(disk)], check=True)
    try:
        probe = (
            "from recording.logs import configure_logging\n"
            "configure_logging('console', 'info')\n"
            "from recording.sample_rows import SessionMix\n"
            "from recording.writer import ParquetRecorder\n"
            f"r = ParquetRecorder({str(disk / 'rec')!r}, 'p1', fsync=False, writer='process').start()\n"
            f"with open({str(disk / 'fill')!r}, 'wb') as f:  # leave less than a quarter of the 64 MiB floor\n"
            "    f.write(bytes(70 << 20))\n"
            "for row in SessionMix(proxy_id='p1').rows(50):\n"
            "    r.request(row)\n"
            "r.close()\n"
            "print('dropped', r.dropped()['requests'])\n"
        )
        out = _run_probe(probe)
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    assert "dropped 50" in out.stdout, out.stdout + out.stderr[-2000:]
    lines = out.stderr.splitlines()
    full = [ln for ln in lines if "recording disk nearly full" in ln]
    drops = [ln for ln in lines if "recording dropped rows" in ln]
    assert full and not any(ln.lstrip().startswith("{") for ln in full), full  # the console format, not JSON
    assert all("error=" not in ln and "free disk space" in ln for ln in full), full
    assert len(drops) == 1 and "queue_cap=200000" in drops[0], drops  # logged once, by the proxy side


def _anonymous_kib(pid: int) -> int:
    """The process's anonymous memory (heap, arenas, Arrow's pool): what it allocated, not the libraries it maps."""
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return int(next(line.split()[1] for line in rollup.splitlines() if line.startswith("Anonymous:")))


def test_the_writer_process_does_without_pandas_and_numpy(tmp_path: Path) -> None:
    """pyarrow imports numpy with itself and pandas on its first array, only to ask whether an argument is one
    of their objects: ~47 MB of the writer process's RSS for nothing. The child refuses both
    (`writer_child.refuse_unused`). Checked twice: a real child after a flush has neither mapped, and the whole
    writing path (files, per-file rollups, the hour's merge, compaction) runs with them refused and writes
    every row."""
    r = ParquetRecorder(tmp_path / "child", "p1", fsync=False, flush_interval_s=3600, writer="process",
                        compact_interval_s=0).start()
    for row in _full_rows(200):
        r.request(row)
    r._ship(final=False)
    assert r._wait_flushed()
    maps = Path(f"/proc/{r._child.pid}/maps").read_text()
    r.close()
    assert "/pyarrow/" in maps and "/pandas/" not in maps and "/numpy/" not in maps and "/numpy.libs/" not in maps
    assert r.stats()["rows_written"]["requests"] == 200

    probe = (
        "import sys\n"
        "from recording.writer_child import refuse_unused, use_returnable_memory\n"
        "refuse_unused()\n"
        "use_returnable_memory()\n"
        "from recording.sample_rows import SessionMix, connection_row\n"
        "from recording.writer import ParquetRecorder\n"
        f"r = ParquetRecorder({str(tmp_path / 'thread')!r}, 'p1', fsync=False, writer='thread', rotate_bytes=20_000,\n"
        "                     compact_interval_s=0.01).start()\n"
        "for row in SessionMix(proxy_id='p1').rows(3000):\n"
        "    r.request(row)\n"
        "r.connection(connection_row('p1', 'c00001'))\n"
        "r.close()\n"
        "import pyarrow as pa\n"
        "print(r.stats()['rows_written']['requests'], r.write_errors, 'pandas' in sys.modules, 'numpy' in sys.modules,\n"
        "      pa.default_memory_pool().backend_name)\n"
    )
    written, errors, pandas, numpy, pool = _run_probe(probe).stdout.split()[-5:]
    assert (written, errors, pandas, numpy, pool) == ("3000", "0", "False", "False", "system")
    assert read_recording(tmp_path / "thread", "requests", with_partitions=False).num_rows == 3000
    for rollup in ("request_sums", "latency_cells"):  # the rollups, built with pyarrow.compute and group_by
        assert list((tmp_path / "thread" / rollup).rglob("part-*.parquet")), rollup


def test_the_writer_process_gives_its_memory_back_when_the_load_ebbs(tmp_path: Path) -> None:
    """Arrow's default pool kept what each flush freed for the thread that freed it: after a few large
    flushes the writer process held ~60 MB more than it used, counted in the proxy's memory
    (bench/proxy_overhead.py). The child now allocates with malloc and gives the memory back once the load
    ebbs (`writer_child.use_returnable_memory`, `give_back_memory`, `GiveBack`): after three flushes of
    60,000 rows and one of none, its anonymous memory is back near where it was after the first small one."""
    r = ParquetRecorder(tmp_path, "p1", fsync=False, flush_interval_s=3600, writer="process",
                        compact_interval_s=0).start()
    rows = SessionMix(proxy_id="p1").rows(60_000)
    r.request(dict(rows[0]))
    r._ship(final=False)
    assert r._wait_flushed()
    settled = _anonymous_kib(r._child.pid)
    for _ in range(3):
        for row in rows:
            r.request(dict(row))
        r._ship(final=False)
        assert r._wait_flushed()
    r._ship(final=False)  # nothing since: the load ebbed
    assert r._wait_flushed()
    after = _anonymous_kib(r._child.pid)
    r.close()
    assert r.stats()["rows_written"]["requests"] == 180_001
    assert after - settled < 16 * 1024, (settled, after)


def test_memory_is_kept_under_a_steady_load_and_given_back_when_it_ebbs_or_after_a_while() -> None:
    """`GiveBack`: flushes about as large as the largest since the last return keep the memory (the next flush
    needs it again); one EBB times smaller, or HOLD_S since the last return, gives it back; an idle writer
    with nothing since its last return is left alone until HOLD_S."""
    from recording.writer_child import GiveBack

    g = GiveBack(now=0.0)
    steady = [g.after_flush(rows, now=t) for t, rows in enumerate((1, 6000, 5800, 6100, 4000, 6000), start=1)]
    assert steady == [False] * 6
    assert g.after_flush(1000, now=7.0)  # the load ebbed (≤ 6,100 / 4)
    assert [g.after_flush(0, now=t) for t in (8.0, 9.0, 10.0)] == [True, False, False]  # stopped; then idle
    assert not g.after_flush(6000, now=10.5)
    assert g.after_flush(6000, now=8.0 + GiveBack.HOLD_S)  # a load that never ebbs: HOLD_S after the last return
    assert not g.after_flush(6000, now=9.0 + GiveBack.HOLD_S)
    assert g.after_flush(0, now=10.0 + GiveBack.HOLD_S)  # the traffic stopped


def test_rows_the_loop_thread_packs_while_the_shipping_thread_takes_are_never_lost(tmp_path: Path) -> None:
    """Both threads popleft the same queue: when the loop thread's packer takes rows between the shipping thread
    reading the queue's length and taking them, the shipper once raised IndexError and lost the rows it held."""
    from collections import deque

    r = ParquetRecorder(tmp_path, "p1", fsync=False, writer="process")
    s = r._streams["requests"]
    rows = [dict(row) for row in SessionMix(seed=3).rows(40)]
    for row in rows:
        r.request(row)
    packed_meanwhile: list = []

    class PackedMeanwhile(deque):
        def popleft(self):  # the first take lets the other thread take half of what is left
            row = super().popleft()
            if not packed_meanwhile:
                for _ in range(len(self) // 2):
                    packed_meanwhile.append(deque.popleft(self))
            return row

    s.queue = PackedMeanwhile(s.queue)
    assert len(s.queue) == 40

    class Child:
        sent: list = []

        def send(self, message: tuple) -> None:
            self.sent.extend(message[2])

        def send_raw(self, payload: bytes) -> None:
            raise AssertionError("nothing was packed")

    child = Child()
    ParquetRecorder._ship_stream(child, s)
    assert len(packed_meanwhile) == 19 and len(child.sent) == 21 == s.shipped and not s.queue


def _with_a_flushed_child(root: Path, rows: int) -> tuple[ParquetRecorder, SessionMix, WriterProcess]:
    """A recorder whose writer process has written `rows` request rows (its first flush answered)."""
    r = ParquetRecorder(root, "p1", fsync=False, flush_interval_s=3600, writer="process", compact_interval_s=0).start()
    mix = SessionMix()
    for row in mix.rows(rows):
        r.request(row)
    r._ship(final=False)
    assert r._wait_flushed()
    assert r._child is not None
    return r, mix, r._child


def test_a_stuck_writer_process_is_given_up_and_the_stop_does_not_wait_for_it(tmp_path: Path, monkeypatch) -> None:
    """A stopped child (SIGSTOP: as a disk that hangs) took neither rows nor flushes: the proxy's stop waited for ever,
    logging nothing. Now the watchdog kills it once it shows no progress for STALL_S and a new child takes over."""
    import threading

    monkeypatch.setattr(WriterProcess, "STALL_S", 1.0)
    monkeypatch.setattr(WriterProcess, "CHECK_S", 0.05)
    r, mix, first = _with_a_flushed_child(tmp_path, 300)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        for row in mix.rows(200):
            r.request(row)
        r._ship(final=False)  # into the pipe; the flush is never answered
        for row in mix.rows(100):
            r.request(row)
        closing = threading.Thread(target=r.close, daemon=True)
        closing.start()
        closing.join(60)
        assert not closing.is_alive(), "the stop waits on a stopped writer process"
    finally:
        if first.proc.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
    assert first.stalled is not None and "made no progress" in first.stalled
    st = r.stats()  # what the stopped child's pipe took is lost (counted); the rest is written
    assert st["rows_written"]["requests"] + st["dropped"]["requests"] == 600 and st["dropped"]["requests"] >= 200
    assert r.errors["writer_process"] >= 1 and st["queued"]["requests"] == 0
    assert read_recording(tmp_path, "requests").num_rows == st["rows_written"]["requests"] >= 300


def test_a_flush_that_loses_its_writer_process_leaves_the_other_datasets_queued(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """A failed (not final) shipment dropped every other dataset's queue too, and the queue gauge went negative:
    those rows are the next writer process's to write."""
    from recording.writer_pipe import WriterGone

    r, mix, child = _with_a_flushed_child(tmp_path, 100)

    def broken(payload: bytes) -> None:
        raise WriterGone("writer process pipe broke (test)")

    monkeypatch.setattr(child, "send_raw", broken)
    for row in mix.rows(50):
        r.request(row)
    for i in range(5):
        r.connection(connection_row("p1", f"c{i:05d}"))
    r._ship(final=False)  # requests go first and are lost with the pipe; connections wait
    assert min(r.queue_depth().values()) >= 0 and r.queue_depth()["connections"] == 5
    r.close()
    st = r.stats()
    assert st["rows_written"]["connections"] == 5 and st["dropped"]["connections"] == 0
    assert st["rows_written"]["requests"] + st["dropped"]["requests"] == 150
    assert all(v == 0 for v in st["queued"].values())
