"""Notice a peer's FIN or RST on a socket whose reading is paused, without reading it.

Why: during a graceful shutdown the proxy stops reading its clients (a request read
then could not be answered before the close), and a paused transport never reports
the peer's close. A client that left during the drain was held until the timeout
and recorded as `proxy_shutdown`. Watching for EPOLLRDHUP (FIN) and EPOLLERR/EPOLLHUP
(RST), never EPOLLIN, leaves any request still waiting in the socket unread and does
not wake up for it; one epoll set, itself watched by the event loop, serves every
connection of the drain.
"""

from __future__ import annotations

import asyncio
import select
import socket
from collections.abc import Callable

_CLOSED = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR


class CloseWatch:
    """Call a socket's callback once when its peer closes (FIN) or resets; level-triggered, one shot per socket."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._epoll = select.epoll()
        self._callbacks: dict[int, Callable[[], None]] = {}
        loop.add_reader(self._epoll.fileno(), self._ready)

    def add(self, sock: socket.socket | None, on_closed: Callable[[], None]) -> None:
        """Watch `sock` (a transport's own socket: not read, not closed here) until its peer closes or resets."""
        try:
            fd = sock.fileno() if sock is not None else -1
            if fd < 0:
                return
            self._epoll.register(fd, _CLOSED)
        except (OSError, ValueError):  # already closed: its connection ends through its transport
            return
        self._callbacks[fd] = on_closed

    def _ready(self) -> None:
        for fd, _ in self._epoll.poll(0):
            on_closed = self._callbacks.pop(fd, None)
            try:
                self._epoll.unregister(fd)
            except OSError:
                pass
            if on_closed is not None:
                on_closed()

    def close(self) -> None:
        """Stop watching (the drain is over): every socket is left to its transport."""
        self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()
        self._callbacks.clear()
