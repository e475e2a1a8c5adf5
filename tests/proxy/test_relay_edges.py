"""Relay behaviour without Kafka: half-close, resets, connect failures, many and silent clients."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from proxy.server import RunningProxy
from scenarios.kafka import free_port
from proxy_upstreams import EchoServer, OneShotServer, recv_all, rst_close


def test_half_close_client_fin_other_way_keeps_flowing(sink):
    def upstream(s: socket.socket) -> bytes:
        got = recv_all(s)  # until the client's FIN arrives through the proxy
        s.sendall(b"reply after your FIN:" + got)
        return got

    with OneShotServer(upstream) as up, RunningProxy(upstream=f"127.0.0.1:{up.port}", sink=sink) as p:
        c = socket.create_connection(p.listen_addr)
        c.sendall(b"hello")
        c.shutdown(socket.SHUT_WR)
        assert recv_all(c) == b"reply after your FIN:hello"
        c.close()
        assert up.join() == b"hello"
        (row,) = sink.wait_final(1)
    assert row["end_reason"] == "client_fin" and row["end_by"] == "client"
    assert row["bytes_from_client"] == 5 and row["bytes_from_broker"] == 26


def test_half_close_broker_fin_client_keeps_sending(sink):
    def upstream(s: socket.socket) -> bytes:
        s.sendall(b"bye")
        s.shutdown(socket.SHUT_WR)
        return recv_all(s)

    with OneShotServer(upstream) as up, RunningProxy(upstream=f"127.0.0.1:{up.port}", sink=sink) as p:
        c = socket.create_connection(p.listen_addr)
        assert recv_all(c) == b"bye"  # the broker's FIN reached us
        c.sendall(b"still talking")
        c.shutdown(socket.SHUT_WR)
        c.close()
        assert up.join() == b"still talking"
        (row,) = sink.wait_final(1)
    assert row["end_reason"] == "broker_fin" and row["end_by"] == "broker"


def test_client_reset_propagates_as_reset(sink):
    def upstream(s: socket.socket) -> str:
        s.sendall(s.recv(10))  # echo: the client knows the whole path is up
        try:
            while s.recv(65536):
                pass
        except ConnectionResetError:
            return "reset"
        return "fin"

    with OneShotServer(upstream) as up, RunningProxy(upstream=f"127.0.0.1:{up.port}", sink=sink) as p:
        c = socket.create_connection(p.listen_addr)
        c.sendall(b"x")
        assert c.recv(1) == b"x"
        rst_close(c)
        assert up.join() == "reset"
        (row,) = sink.wait_final(1)
    assert row["end_reason"] == "client_rst" and row["end_by"] == "client"


def test_broker_reset_propagates_as_reset(sink):
    def upstream(s: socket.socket) -> None:
        s.recv(10)
        rst_close(s)

    with OneShotServer(upstream) as up, RunningProxy(upstream=f"127.0.0.1:{up.port}", sink=sink) as p:
        c = socket.create_connection(p.listen_addr)
        c.sendall(b"x")
        with pytest.raises(ConnectionResetError):
            while c.recv(100):
                pass
        c.close()
        up.join()
        (row,) = sink.wait_final(1)
    assert row["end_reason"] == "broker_rst" and row["end_by"] == "broker"


def test_connect_refused_closes_client_promptly_with_reason(sink):
    dead = free_port()
    with RunningProxy(upstream=f"127.0.0.1:{dead}", sink=sink) as p:
        c = socket.create_connection(p.listen_addr)
        t0 = time.monotonic()
        with pytest.raises(ConnectionResetError):
            c.recv(10)
        assert time.monotonic() - t0 < 2
        (row,) = sink.wait_final(1)
    assert row["end_reason"] == "upstream_connect_failed"
    assert row["end_detail"].startswith("refused")
    assert "could not connect" in row["inferred_cause"]


def test_connect_timeout_recorded(sink):
    # a listener whose accept queue is full drops further SYNs: the connect hangs
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    port = full.getsockname()[1]
    fillers = []
    for _ in range(3):
        f = socket.socket()
        f.setblocking(False)
        f.connect_ex(("127.0.0.1", port))
        fillers.append(f)
    try:
        with RunningProxy(upstream=f"127.0.0.1:{port}", sink=sink, connect_timeout=0.5) as p:
            c = socket.create_connection(p.listen_addr)
            c.settimeout(10)
            with pytest.raises(ConnectionResetError):
                c.recv(10)
            (row,) = sink.wait_final(1)
    finally:
        for f in fillers:
            f.close()
        full.close()
    assert row["end_reason"] == "upstream_connect_failed"
    assert row["end_detail"].startswith("timeout"), row["end_detail"]


def test_thousand_clients_and_a_silent_one(sink):
    with EchoServer() as echo, RunningProxy(upstream=f"127.0.0.1:{echo.port}", sink=sink) as p:
        silent = socket.create_connection(p.listen_addr)  # connects, never sends
        clients = [socket.create_connection(p.listen_addr) for _ in range(1000)]
        for i, c in enumerate(clients):
            c.sendall(struct.pack(">i", i))
        for i, c in enumerate(clients):
            c.settimeout(10)
            data = b""
            while len(data) < 4:
                data += c.recv(4 - len(data))
            assert struct.unpack(">i", data)[0] == i
        assert p.open_connections() == 1001
        for c in clients:
            c.close()
        sink.wait_final(1000)
        silent.close()
        sink.wait_final(1001)
    finals = sink.finals()
    assert all(r["end_reason"] == "client_fin" for r in finals)
    assert sum(r["bytes_from_client"] for r in finals) == 4000
    # the echoes are not Kafka: each connection turned opaque on its own, none broke another
    assert sum(1 for r in finals if r["bytes_from_client"] == 0) == 1


def test_graceful_stop_closes_idle_connections_and_flushes(sink):
    with EchoServer() as echo:
        p = RunningProxy(upstream=f"127.0.0.1:{echo.port}", sink=sink).start()
        c = socket.create_connection(p.listen_addr)
        c.sendall(b"abcd")
        assert c.recv(4) == b"abcd"
        p.stop(timeout=1)
        assert c.recv(10) == b""  # FIN from the proxy
        c.close()
    (row,) = sink.finals()
    assert row["end_reason"] == "proxy_shutdown" and sink.closed
