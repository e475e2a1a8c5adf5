"""Fault injection through the relay: latency, bandwidth, close after N bytes, refusal."""

from __future__ import annotations

import socket
import time

import pytest

from proxy.faults import DirectionFaults, Faults
from proxy.running import RunningProxy
from proxy_upstreams import EchoServer, recv_all


def _echo_roundtrip(addr, payload: bytes) -> float:
    c = socket.create_connection(addr)
    t0 = time.monotonic()
    c.sendall(payload)
    got = b""
    while len(got) < len(payload):
        got += c.recv(65536)
    took = time.monotonic() - t0
    c.close()
    assert got == payload
    return took


def test_latency_each_way_and_order_kept(sink):
    f = Faults(to_broker=DirectionFaults(latency_ms=100, jitter_ms=20), to_client=DirectionFaults(latency_ms=50), seed=1)
    with EchoServer() as echo, RunningProxy(upstream=f"127.0.0.1:{echo.port}", sink=sink, faults=f) as p:
        took = _echo_roundtrip(p.listen_addr, bytes(range(256)) * 400)
        sink.wait_final(1)
    assert 0.15 <= took < 2.0


def test_bandwidth_cap(sink):
    f = Faults(to_client=DirectionFaults(bandwidth_bps=2_000_000))
    with EchoServer() as echo, RunningProxy(upstream=f"127.0.0.1:{echo.port}", sink=sink, faults=f) as p:
        took = _echo_roundtrip(p.listen_addr, b"z" * 1_000_000)  # 1 MB at 2 MB/s ≈ 0.5 s
    assert 0.4 <= took < 3.0


def test_a_capped_link_trickles_and_is_not_idle_while_it_delivers(sink):
    """bandwidth= held each read chunk (up to 256 KiB) until the cap had carried it: seconds of silence, then a
    burst; and idle-reset, counting only reads and drains as activity, reset a connection delivering bytes."""
    f = Faults(to_client=DirectionFaults(bandwidth_bps=200_000), idle_reset_s=0.6)
    payload = b"t" * 300_000  # 1.5 s at the cap
    with EchoServer() as echo, RunningProxy(upstream=f"127.0.0.1:{echo.port}", sink=sink, faults=f) as p:
        c = socket.create_connection(p.listen_addr)
        c.sendall(payload)
        got, gaps, last = 0, [], time.monotonic()
        while got < len(payload):
            chunk = c.recv(65536)
            assert chunk, f"reset or closed after {got} of {len(payload)} bytes"
            now = time.monotonic()
            gaps.append(now - last)
            last, got = now, got + len(chunk)
        c.close()
        (row,) = sink.wait_final(1)
    assert max(gaps[1:]) < 0.3, max(gaps[1:])  # a trickle, not bursts a second apart
    assert row["end_reason"] != "fault", row["end_detail"]


def test_close_after_bytes(sink):
    f = Faults(to_client=DirectionFaults(close_after_bytes=1000))
    with EchoServer() as echo, RunningProxy(upstream=f"127.0.0.1:{echo.port}", sink=sink, faults=f) as p:
        c = socket.create_connection(p.listen_addr)
        c.sendall(b"q" * 5000)
        assert recv_all(c) == b"q" * 1000
        c.close()
        (row,) = sink.wait_final(1)
    assert row["end_reason"] == "fault" and "close after 1000 bytes" in row["end_detail"]


def test_refuse_new_connections_then_accept_again(sink):
    with EchoServer() as echo, RunningProxy(upstream=f"127.0.0.1:{echo.port}", sink=sink,
                                            faults=Faults(refuse_connections=True)) as p:
        c = socket.create_connection(p.listen_addr)
        with pytest.raises(ConnectionResetError):
            c.recv(10)
        c.close()
        p.set_faults(None)
        assert _echo_roundtrip(p.listen_addr, b"ok") < 2
        sink.wait_final(2)
    assert sink.finals()[0]["end_reason"] == "fault"
    assert sink.finals()[0]["end_detail"].startswith("refusing")


class _Clock:
    """DelayedWriter's clock and the loop method it uses, on a time the test moves."""

    def __init__(self) -> None:
        self.t = 1.0

    def time(self) -> float:
        return self.t

    def call_later(self, delay: float, fn) -> object:  # noqa: ANN001 — the timer is not run: the test reads the queue
        return object()


def test_a_capped_link_still_pays_its_latency() -> None:
    """latency= with bandwidth= lost the latency once the cap was the bottleneck: `due` was max(now + latency,
    link free), where a real link delivers a chunk its latency after it has carried it."""
    import random

    from proxy.faults import DelayedWriter

    clock = _Clock()
    w = DelayedWriter(clock, DirectionFaults(latency_ms=100, bandwidth_bps=100_000), lambda b: None,  # type: ignore[arg-type]
                      lambda n: None, lambda p: None, random.Random(1), clock=clock.time)
    w.send(b"x" * 100_000)  # 1 s on the link, then 100 ms of travel: in pieces of 10 ms on the link, each then travels
    w.send(b"y" * 10)
    dues = [round(due, 4) for due, _ in w._queue]
    assert dues[-2:] == [2.1, 2.1001] and dues[0] == round(1.0 + 1024 / 100_000 + 0.1, 4)
    assert sum(len(piece) for _, piece in w._queue) == 100_010 and w.queued == 100_010
    clock.t = 10.0  # an idle link: a small chunk costs its latency (and its 0.1 ms on the link)
    w.send(b"z" * 10)
    assert round(w._queue[-1][0], 4) == 10.1001


def test_a_latency_never_ends_early_on_uvloops_millisecond_timers() -> None:
    """uvloop counts a timer in whole milliseconds from the start of the loop iteration: a chunk due by the loop's
    clock could go out ~1 ms before its latency had passed. Measured on the precise clock, from each send."""
    import asyncio
    import random
    import time

    import uvloop

    from proxy.faults import DelayedWriter

    loop = uvloop.new_event_loop()
    held: list[float] = []
    try:
        for i in range(30):
            out = loop.create_future()
            w = DelayedWriter(loop, DirectionFaults(latency_ms=7), lambda b, f=out: f.set_result(time.monotonic()),
                              lambda n: None, lambda p: None, random.Random(i))
            started = loop.create_future()
            loop.call_later(0.0005 * (i % 3), started.set_result, None)
            loop.run_until_complete(started)
            time.sleep(0.0003 * (i % 4))  # work done earlier in the same callback: the loop's clock lags behind
            t0 = time.monotonic()
            w.send(b"x")
            held.append(loop.run_until_complete(asyncio.wait_for(out, 5)) - t0)
    finally:
        loop.close()
    assert min(held) >= 0.007, sorted(held)[:3]


def test_a_run_records_the_tcp_faults_it_injects(tmp_path):
    """The run's start row names its TCP faults (`runs/`, column `faults`): the analysis says that the recording's
    latencies and ends include them (analytics.findings.stretches: tcp_faults_injected). A run without: null."""
    from recording.reader import read_recording
    from recording.writer import ParquetRecorder

    f = Faults(to_broker=DirectionFaults(latency_ms=5))
    for name, faults in (("with", f), ("without", None)):
        rec = ParquetRecorder(tmp_path / name, "p1", fsync=False, writer="thread").start()
        with EchoServer() as echo, RunningProxy(upstream=f"127.0.0.1:{echo.port}", sink=rec, faults=faults) as p:
            _echo_roundtrip(p.listen_addr, b"x")
        rows = read_recording(tmp_path / name, "runs").to_pylist()  # the server closed its sink when it stopped
        assert sorted(r["event"] for r in rows) == ["start", "stop"]
        said = {r["event"]: r["faults"] for r in rows}
        assert said == {"start": f.describe() if faults else None, "stop": None}
    assert "latency 5 ms" in f.describe()
