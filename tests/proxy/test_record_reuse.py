"""`kafkatap proxy --record DIR` into a directory that already holds a recording says so at start, once."""

from __future__ import annotations

import calendar
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness.kafka import free_port
from proxy_procs import wait_listening
from proxy_upstreams import EchoServer
from recording.existing import existing_recording

KAFKATAP = [sys.executable, "-m", "kafkatap.cli"]
REUSED = "already holds a recording"


def _run_proxy(record: Path, echo_port: int) -> list[dict]:
    """One proxy run into `record` that relays one connection, stopped by SIGTERM: its JSON log lines."""
    port = free_port()
    env = dict(os.environ, KAFKATAP_LOG_FORMAT="json")
    proc = subprocess.Popen(KAFKATAP + ["proxy", "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{echo_port}",
                                        "--record", str(record), "--workers", "1"], stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        wait_listening(port, proc)
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(b"hello")
            assert c.recv(5) == b"hello"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    return [json.loads(ln) for ln in proc.stderr.read().splitlines() if ln.startswith("{")]


def test_a_second_run_into_the_same_directory_names_what_is_there(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    with EchoServer() as echo:
        before = time.time_ns()
        first = _run_proxy(record, echo.port)
        after = time.time_ns()
        second = _run_proxy(record, echo.port)
    assert not [ln for ln in first if REUSED in ln["event"]], "a fresh directory holds nothing to warn about"
    warned = [ln for ln in second if REUSED in ln["event"]]
    assert len(warned) == 1, second
    w = warned[0]
    assert w["level"] == "warning" and w["earlier_runs"] == 1
    assert "--since/--until" in w["event"] and "fresh directory" in w["event"]
    # the first run's data, bounded from its names and mtimes (the run id has whole seconds)
    assert before - 1_000_000_000 <= w["earlier_first_ns"] <= w["earlier_last_ns"] <= after


def _touch(path: Path, mtime_s: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    os.utime(path, ns=(mtime_s * 1_000_000_000, mtime_s * 1_000_000_000))


def test_the_span_comes_from_partitions_run_ids_and_mtimes(tmp_path: Path) -> None:
    """Two earlier runs (11:07–11:10, and 13:52 on another proxy id), a copied file's mtime held to its hour."""
    t = calendar.timegm((2026, 11, 28, 0, 0, 0, 0, 0, 0))
    hour = tmp_path / "requests" / "proxy=a" / "date=2026-11-28" / "hour=11"
    _touch(hour / "part-20261128T110700Z-ab12-00000001.parquet", t + 11 * 3600 + 9 * 60)
    _touch(hour / "part-20261128T110700Z-ab12-00000002.parquet", t + 11 * 3600 + 10 * 60)
    _touch(hour / ".tmp-1-ab-part-20261128T110700Z-ab12-00000003.parquet", t + 20 * 3600)  # in progress: not data
    later = tmp_path / "runs" / "proxy=b" / "date=2026-11-28" / "hour=13"
    _touch(later / "part-20261128T135200Z-cd34-00000001.parquet", t + 30 * 3600)  # copied: mtime a day later
    held = existing_recording(tmp_path)
    assert held is not None and held.runs == 2 and held.proxy_ids == ("a", "b")
    assert held.first_ns == (t + 11 * 3600 + 7 * 60) * 1_000_000_000
    assert held.last_ns == (t + 14 * 3600) * 1_000_000_000  # the end of its hour, not the copy's time
    assert existing_recording(tmp_path / "empty") is None


def test_a_directory_of_an_older_recording_format_is_named_as_one_analyze_will_not_mix(tmp_path: Path) -> None:
    """An upgraded service recorded into the directory of an earlier format, and `analyze` then refused all of it
    ('mixes recording format versions'), while the start warning said it would read them all as one recording.
    The footer's version is read by hand (the proxy's process does not import pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recording.existing import footer_format, reuse_message
    from recording.schema import FORMAT_KEY, FORMAT_VERSION

    hour = tmp_path / "requests" / "proxy=a" / "date=2026-11-28" / "hour=11"
    hour.mkdir(parents=True)
    older = hour / "part-20261128T110700Z-ab12-00000001.parquet"
    pq.write_table(pa.table({"x": [1]}).replace_schema_metadata({FORMAT_KEY: b"2"}), older)
    assert footer_format(older) == 2
    held = existing_recording(tmp_path)
    assert held is not None and held.older_format == 2
    said = reuse_message(tmp_path, held)
    assert f"recording format 2, an earlier kafkatap's" in said and f"(format {FORMAT_VERSION})" in said
    assert "reads them all as one recording" not in said
    pq.write_table(pa.table({"x": [1]}).replace_schema_metadata({FORMAT_KEY: str(FORMAT_VERSION).encode()}),
                   hour / "part-20261128T110800Z-cd34-00000001.parquet")  # a newer file of this format: no warning
    assert existing_recording(tmp_path).older_format is None
