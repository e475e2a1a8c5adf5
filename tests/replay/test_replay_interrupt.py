"""Ctrl-C and SIGTERM during a replay: one line saying how far it got, the partial summary, 130/143, --record closed.

Why a subprocess: the signal must reach the real command (click's own KeyboardInterrupt handling printed
"Aborted!" and exited 1, which scripts read as a "no" at the prompt; SIGTERM killed it without a word).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from replay_synthetic import FakeBroker, SynthConn, api_versions, metadata, write_recording

KAFKATAP = Path(sys.executable).with_name("kafkatap")


@pytest.fixture
def fake_target() -> Iterator[tuple[str, FakeBroker]]:
    """A FakeBroker on a loop of its own thread, so the replay under test can be a separate process."""
    loop = asyncio.new_event_loop()
    broker = FakeBroker()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    target = asyncio.run_coroutine_threadsafe(broker.start(), loop).result(5)
    yield target, broker
    asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)


def _slow_session(root: Path) -> None:
    """One session of 40 requests a quarter second apart: 10 s at speed 1, long enough to be interrupted in."""
    reqs = [api_versions(1)] + [metadata(i + 2, 0.25 * (i + 1)) for i in range(39)]
    write_recording(root, [SynthConn("c1", 0.0, reqs)])


def _sessions_requests(broker: FakeBroker) -> int:
    return sum(len(a) for conn, a in broker.arrivals.items() if conn > 1)  # conn 1: the set-up's


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_replay_says_how_far_it_got_and_exits_128_plus_the_signal(
        tmp_path: Path, fake_target: tuple[str, FakeBroker], signum: int):
    target, broker = fake_target
    _slow_session(tmp_path / "rec")
    out = tmp_path / "out"
    proc = subprocess.Popen([str(KAFKATAP), "replay", str(tmp_path / "rec"), "--target", target, "--yes",
                             "--yes-same-cluster", "--no-create-topics", "--record", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while _sessions_requests(broker) < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert _sessions_requests(broker) >= 4, proc.communicate(timeout=5)
        os.kill(proc.pid, signum)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, (proc.returncode, stdout, stderr)
    assert "Aborted!" not in stderr
    said = [ln for ln in stderr.splitlines() if ln.startswith(f"kafkatap replay: interrupted ({name}): sent ")]
    assert len(said) == 1, stderr
    sent = int(said[0].split("sent ")[1].split("/")[0])
    assert 4 <= sent < 40 and "/40 requests" in said[0], said
    assert "closed and complete up to here" in said[0]
    assert stdout.startswith("replayed 1 connections: "), stdout  # the partial summary
    stops = [r for f in (out / "runs").rglob("*.parquet") for r in pq.read_table(f).to_pylist() if r["event"] == "stop"]
    assert stops, "the replay's recording proxy did not stop cleanly"


def test_the_help_names_the_interrupt_exit_codes():
    got = subprocess.run([str(KAFKATAP), "replay", "--help"], capture_output=True, text=True, check=True).stdout
    assert "130 interrupted (Ctrl-C), 143 terminated (SIGTERM)" in " ".join(got.split())
