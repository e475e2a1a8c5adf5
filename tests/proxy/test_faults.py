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
