"""Relay behaviour without Kafka: half-close, resets, connect failures, many and silent clients."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from proxy.running import RunningProxy
from harness.kafka import free_port
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


async def _async_echo_once():
    """An asyncio upstream that echoes one read and closes: (server, port)."""
    import asyncio

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(await r.read(100))
        await w.drain()
        w.close()

    up = await asyncio.start_server(echo, "127.0.0.1", 0)
    return up, up.sockets[0].getsockname()[1]


def test_async_api_proxyserver(sink):
    """The asyncio API: `async with ProxyServer(routes=[...], sink=...) as p` on the caller's loop."""
    import asyncio

    import uvloop

    from proxy.server import ProxyServer

    async def main() -> bytes:
        up, port = await _async_echo_once()
        async with ProxyServer([f"127.0.0.1:0=127.0.0.1:{port}"], sink=sink) as p:
            r, w = await asyncio.open_connection(*p.listen_addr)
            w.write(b"async")
            got = await r.read(100)
            w.close()
        up.close()
        return got

    assert uvloop.run(main()) == b"async"
    assert sink.closed and len(sink.finals()) == 1


def test_backpressure_slow_client_bounds_proxy_memory(sink):
    """A client that stops reading pauses the broker side; user-space buffering stays ≤ one read."""
    import hashlib
    import threading

    total = 64 << 20
    block = bytes(range(256)) * 4096  # 1 MiB

    def upstream(s: socket.socket) -> None:
        for _ in range(total // len(block)):
            s.sendall(block)
        s.shutdown(socket.SHUT_WR)
        recv_all(s)

    with OneShotServer(upstream) as up, RunningProxy(upstream=f"127.0.0.1:{up.port}", sink=sink) as p:
        c = socket.create_connection(p.listen_addr)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)

        def state() -> tuple[bool, int, int]:
            conn = next(iter(p.server.conns), None)
            if conn is None or conn.client.transport is None:
                return False, 0, 0
            return conn.broker.holding, conn.client.transport.get_write_buffer_size(), conn.facts.from_broker.bytes

        deadline = time.monotonic() + 20
        held = False
        while time.monotonic() < deadline and not held:  # the proxy's own state is what we wait on
            held, buffered, got = p.call(state)
            if not held:
                threading.Event().wait(0.01)
        assert held, "broker reading was never paused"
        held, buffered, got = p.call(state)
        assert buffered <= 256 * 1024 + 65536
        assert got < total // 2  # kernel buffers, not the proxy, hold the rest
        h = hashlib.sha1()
        n = 0
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            h.update(b)
            n += len(b)
        c.close()
        up.join(30)
        sink.wait_final(1)
    assert n == total
    assert h.hexdigest() == hashlib.sha1(block * (total // len(block))).hexdigest()


def test_graceful_stop_lets_inflight_request_finish(sink):
    import threading

    got_request = threading.Event()
    release = threading.Event()

    def upstream(s: socket.socket) -> None:
        head = s.recv(4)
        body = b""
        while len(body) < struct.unpack(">i", head)[0]:
            body += s.recv(100)
        got_request.set()
        release.wait(10)  # the broker is "slow": it answers only after shutdown began
        resp = body[4:8] + b"\x00\x00"
        s.sendall(struct.pack(">i", len(resp)) + resp)
        recv_all(s)

    with OneShotServer(upstream) as up:
        p = RunningProxy(upstream=f"127.0.0.1:{up.port}", sink=sink).start()
        c = socket.create_connection(p.listen_addr)
        body = struct.pack(">hhih", 18, 0, 42, 2) + b"gs"
        c.sendall(struct.pack(">i", len(body)) + body)
        assert got_request.wait(10)
        stopper = threading.Thread(target=p.stop, kwargs={"timeout": 10})
        stopper.start()
        # shutdown has begun (listener closed) while the request is in flight
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not p.server.closing:
            threading.Event().wait(0.005)
        release.set()
        data = recv_all(c)  # the answer, then the proxy's FIN
        stopper.join(15)
        c.close()
        up.join()
    assert struct.unpack(">i", data[4:8])[0] == 42
    (row,) = sink.finals()
    assert row["end_reason"] == "proxy_shutdown" and row["unanswered"] == 0
    (req,) = sink.requests
    assert req["status"] == "answered" and req["correlation_id"] == 42


def test_the_proxy_is_the_one_owner_that_closes_its_sink(tmp_path):
    """The ProxyServer closes the sink it was given exactly once, after the last row, off the event loop.

    build_sinks' status endpoint closes nothing; stopping it after the proxy leaves the recording intact.
    """
    import asyncio
    import threading

    import uvloop

    from proxy.server import ProxyServer
    from proxy.sinks import build_sinks
    from recording.reader import read_recording

    sinks = build_sinks(tmp_path / "rec", "owner", status_addr="127.0.0.1:0", flush_interval_s=0.05)
    recorder = sinks.recorder
    assert recorder is not None
    closes: list[tuple[str, bool]] = []
    real_close = recorder.close

    def counting_close() -> None:
        closes.append((threading.current_thread().name, threading.current_thread() is threading.main_thread()))
        real_close()

    recorder.close = counting_close  # type: ignore[method-assign]

    async def main() -> None:
        up, port = await _async_echo_once()
        await sinks.serve()
        async with ProxyServer([f"127.0.0.1:0=127.0.0.1:{port}"], sink=sinks.sink, proxy_id="owner") as p:
            r, w = await asyncio.open_connection(*p.listen_addr)
            w.write(b"own")
            assert await r.read(100) == b"own"
            w.close()
            await w.wait_closed()
        await sinks.stop_serving()
        up.close()

    uvloop.run(main())
    assert len(closes) == 1, closes
    assert closes[0][1] is False  # joined off the event-loop thread
    (row,) = read_recording(tmp_path / "rec", "connections").to_pylist()
    assert row["end_reason"] in ("client_fin", "broker_fin", "proxy_shutdown")
