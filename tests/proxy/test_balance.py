"""Connection passing between workers (proxy.balance), with real sockets in one process.

Two `Balancer`s stand for two workers: each gets its own copies of the descriptors a
worker inherits, and the shared table is the same memory both write. The end-to-end
tests (several worker processes, real clients) are in test_workers.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Iterator

import pytest

from proxy.balance import DOWN, Balancer, BalanceSpec, WorkerMail


_OPENED: list[WorkerMail | Balancer] = []


@pytest.fixture(autouse=True)
def _close_what_was_opened() -> Iterator[None]:
    """Every table and socket pair closed after each test: the suite runs in one long process."""
    yield
    while _OPENED:
        _OPENED.pop().close()


def _mail(count: int) -> WorkerMail:
    mail = WorkerMail(count)
    _OPENED.append(mail)
    return mail


def _worker(mail: WorkerMail, index: int) -> Balancer:
    """A worker's balancer over duplicates of what it would inherit (each Balancer owns its descriptors)."""
    spec = mail.spec(index)
    worker = Balancer(BalanceSpec(index, os.dup(spec.table_fd), os.dup(spec.mailbox_fd),
                                  tuple(os.dup(fd) for fd in spec.inbox_fds)))
    _OPENED.append(worker)
    return worker


def _serving(w: Balancer, n: int) -> None:
    """Make worker `w` serve `n` connections, as its acceptor and server would report them."""
    while w.serving < n:
        w.kept()
    while w.serving > n:
        w.released()


def _accepted_with(data: bytes) -> tuple[socket.socket, socket.socket, socket.socket]:
    """(listener, client, accepted): a client that already sent `data`, which nobody has read yet."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    client.sendall(data)
    conn, _ = listener.accept()
    return listener, client, conn


def _taker(got: list, ready: asyncio.Event, has: Callable[[str], bool] = lambda _name: True):
    def adopt(name: str, sock: socket.socket) -> bool:
        if not has(name):
            return False
        got.append((name, sock))
        ready.set()
        return True

    return adopt


def _two_started(has1: Callable[[str], bool] = lambda _name: True):
    """Two workers taking connections on the running loop: (mail, w0, w1, what w0 took, what w1 took, event)."""
    mail = _mail(2)
    w0, w1 = _worker(mail, 0), _worker(mail, 1)
    loop = asyncio.get_running_loop()
    got0, got1, ready = [], [], asyncio.Event()
    w0.start(loop, _taker(got0, ready))
    w1.start(loop, _taker(got1, ready, has=has1))
    return mail, w0, w1, got0, got1, ready


def test_a_connection_goes_to_the_less_loaded_worker_with_its_unread_bytes() -> None:
    async def run() -> None:
        mail, w0, w1, got0, got1, ready = _two_started()
        _serving(w0, 3)
        _serving(w1, 1)
        listener, client, conn = _accepted_with(b"first request")
        assert w0.target() == 1
        assert w0.pass_on(conn, "127.0.0.1:19092")
        assert conn.fileno() == -1  # closed in the worker that accepted it
        assert mail.table.load(1) == 2  # in flight: counted for worker 1 before it took it
        await asyncio.wait_for(ready.wait(), 5)
        assert got0 == [] and [name for name, _ in got1] == ["127.0.0.1:19092"]
        taken = got1[0][1]
        assert taken.recv(100) == b"first request"  # not a byte was read on the way
        taken.sendall(b"answer")
        assert client.recv(100) == b"answer"
        assert mail.table.load(1) == 1  # received: no longer in flight (its acceptor counts it as kept)
        assert (w0.stats()["passed"], w1.stats()["taken"]) == (1, 1)
        for s in (taken, client, listener):
            s.close()

    asyncio.run(run())


def test_ties_stay_and_down_or_stopping_workers_are_never_chosen() -> None:
    mail = _mail(3)
    w0, w1, w2 = _worker(mail, 0), _worker(mail, 1), _worker(mail, 2)
    loop = asyncio.new_event_loop()
    try:
        for w in (w0, w1, w2):
            w.start(loop, lambda name, sock: True)
        _serving(w0, 2)
        _serving(w1, 2)
        _serving(w2, 2)
        assert w0.target() is None  # equal loads: the kernel's choice stands, nothing is passed
        _serving(w2, 0)
        assert w0.target() == 2
        mail.down(2)  # the parent saw worker 2 die
        assert w0.target() is None and mail.table.load(2) is None
        _serving(w1, 1)
        assert w0.target() == 1
        w1.stop()  # worker 1 stops: it takes no more
        assert mail.table.open(1) == DOWN and w0.target() is None
    finally:
        loop.close()


def test_a_worker_without_the_listener_gives_the_connection_back() -> None:
    """Cluster mode: worker 1 has not discovered the broker whose listener took the connection; worker 0 serves it."""
    async def run() -> None:
        mail, w0, w1, got0, got1, ready = _two_started(has1=lambda name: name != "127.0.0.1:19095")
        _serving(w0, 4)
        listener, client, conn = _accepted_with(b"metadata")
        assert w0.pass_on(conn, "127.0.0.1:19095")
        await asyncio.wait_for(ready.wait(), 5)
        assert got1 == [] and [name for name, _ in got0] == ["127.0.0.1:19095"]
        assert got0[0][1].recv(100) == b"metadata"
        assert w1.stats()["returned"] == 1 and w0.stats()["taken"] == 1
        assert mail.table.load(0) == 4 and mail.table.load(1) == 0  # nothing left in flight either way
        for s in (got0[0][1], client, listener):
            s.close()

    asyncio.run(run())


def test_top_shows_the_shares_and_how_many_were_passed() -> None:
    from proxy.live import worker_spread_text

    shares = {"kafkatap_worker_open_connections": [({"worker": "p-w2"}, 16.0), ({"worker": "p-w1"}, 16.0)]}
    assert worker_spread_text(shares) == " (per worker 16 / 16)"  # nothing passed: nothing said
    moved = [({"how": "passed"}, 9.0), ({"how": "taken"}, 9.0), ({"how": "returned"}, 0.0)]
    assert worker_spread_text({**shares, "kafkatap_balanced_connections_total": moved}) == " (per worker 16 / 16, 9 passed)"
    assert worker_spread_text({"kafkatap_worker_open_connections": [({"worker": "p"}, 3.0)]}) == ""


def test_two_servers_on_one_port_share_held_connections_and_count_each_once() -> None:
    """Two ProxyServers with SO_REUSEPORT on one port, as two workers: 10 held connections end up 5 and 5
    (each answers through whichever server serves it), and once they close, and a TLS-less client
    fails a TLS listener's handshake, every count is back at 0: nothing is counted twice or leaked."""
    from proxy.server import ProxyServer

    async def run() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(100):
                writer.write(data)
            writer.close()

        upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
        up = upstream.sockets[0].getsockname()
        mail = _mail(2)
        first = ProxyServer([f"127.0.0.1:0=127.0.0.1:{up[1]}"], reuse_port=True, tcp_info=False,
                            balancer=_worker(mail, 0))
        await first.start()
        port = first.listen_addr[1]
        second = ProxyServer([f"127.0.0.1:{port}=127.0.0.1:{up[1]}"], reuse_port=True, tcp_info=False,
                             balancer=_worker(mail, 1))
        await second.start()
        held = []
        for i in range(10):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"c%d" % i)
            assert await reader.readexactly(len(b"c%d" % i)) == b"c%d" % i
            held.append(writer)
        assert sorted((first.open_connections, second.open_connections)) == [5, 5]
        assert (mail.table.load(0), mail.table.load(1)) == (5, 5)
        for writer in held:
            writer.close()
        async with asyncio.timeout(10):  # a regression fails here, not at pytest's 600 s timeout
            while first.open_connections or second.open_connections:
                await asyncio.sleep(0.01)  # the servers' closes follow the clients' FINs: nothing to await on
        assert (mail.table.load(0), mail.table.load(1)) == (0, 0)
        await first.stop()
        await second.stop()
        assert mail.table.load(0) is None and mail.table.load(1) is None  # stopped: never chosen
        upstream.close()

    asyncio.run(run())


def test_a_failed_tls_handshake_gives_its_count_back(tmp_path) -> None:
    """A connection kept by a worker whose TLS set-up fails never reaches the server, whose close would
    release it: the acceptor releases it, or the worker would look busier for good and be passed nothing."""
    from harness.tls import Pki
    from proxy.server import ProxyServer
    from proxy.tls import server_context

    pki = Pki.create(tmp_path / "pki")
    cert = pki.issue("proxy")

    async def run() -> None:
        mail = _mail(2)
        server = ProxyServer(["127.0.0.1:0=127.0.0.1:9"], reuse_port=True, tcp_info=False, balancer=_worker(mail, 0),
                             tls_server=server_context(cert.cert, cert.key))
        await server.start()
        reader, writer = await asyncio.open_connection(*server.listen_addr)
        writer.write(b"\x00\x00\x00\x0bnot a TLS hello")
        assert await reader.read() == b""  # the proxy gave up on the handshake and closed
        writer.close()
        async with asyncio.timeout(10):  # a regression fails here, not at pytest's 600 s timeout
            while server.accept_failures.get("tls_handshake", 0) == 0:
                await asyncio.sleep(0.01)  # counted after the close the client saw: nothing to await on
        assert mail.table.load(0) == 0
        await server.stop()

    asyncio.run(run())
