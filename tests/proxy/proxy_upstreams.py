"""Small upstream servers for relay tests (no Kafka needed): echo, scripted, in a thread."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable


class EchoServer:
    """An asyncio echo server on its own thread/loop; serves thousands of connections."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self.connections = 0

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        outer = self

        class Echo(asyncio.Protocol):
            def connection_made(self, t: asyncio.BaseTransport) -> None:
                self.t = t
                outer.connections += 1

            def data_received(self, data: bytes) -> None:
                self.t.write(data)  # type: ignore[attr-defined]

        srv = self.loop.run_until_complete(self.loop.create_server(Echo, "127.0.0.1", 0, backlog=4096))
        self.port = srv.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()
        srv.close()

    def __enter__(self) -> "EchoServer":
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()


class OneShotServer:
    """Accepts one connection and runs `handler(sock)` on a thread; `.result` holds its return."""

    def __init__(self, handler: Callable[[socket.socket], object]) -> None:
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.handler = handler
        self.result: object = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            s, _ = self.lsock.accept()
            with s:
                self.result = self.handler(s)
        except BaseException as exc:  # noqa: BLE001
            self.error = exc

    def __enter__(self) -> "OneShotServer":
        self._thread.start()
        return self

    def join(self, timeout: float = 10.0) -> object:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "upstream handler did not finish"
        if self.error is not None:
            raise self.error
        return self.result

    def __exit__(self, *exc: object) -> None:
        self.lsock.close()


def recv_all(s: socket.socket) -> bytes:
    out = bytearray()
    while True:
        b = s.recv(65536)
        if not b:
            return bytes(out)
        out += b


def rst_close(s: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0)."""
    import struct

    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


class SilentServer:
    """Accepts any number of connections, reads them, never answers; closes one when its peer sends FIN, as Kafka does.

    An upstream that leaves every request unanswered: a request in flight for as long as a test wants.
    `received` counts the bytes read (a request reached it); `close_all()` closes (FIN) every open
    connection: the broker's own end.
    """

    def __init__(self) -> None:
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.received = 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._got = threading.Condition(self._lock)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self.lsock.accept()
            except OSError:  # closed
                return
            with self._lock:
                self._open.append(s)
            threading.Thread(target=self._read, args=(s,), daemon=True).start()

    def _read(self, s: socket.socket) -> None:
        while True:
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            with self._got:
                if not data:
                    if s in self._open:
                        self._open.remove(s)
                        s.close()
                    return
                self.received += len(data)
                self._got.notify_all()

    def wait_received(self, nbytes: int, timeout: float = 10.0) -> None:
        """Return once `nbytes` in all reached it (the proxy forwarded them)."""
        with self._got:
            assert self._got.wait_for(lambda: self.received >= nbytes, timeout), self.received

    def close_all(self, last: bytes = b"") -> None:
        """FIN every open connection, after sending each of them `last` (e.g. the start of an answer)."""
        with self._lock:
            for s in self._open:
                if last:
                    s.sendall(last)
                s.shutdown(socket.SHUT_RDWR)  # FIN now; the reader thread closes the socket on the EOF that follows

    def __enter__(self) -> "SilentServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.lsock.close()
        with self._lock:
            for s in self._open:
                s.close()
