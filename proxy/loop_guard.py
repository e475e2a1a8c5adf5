"""Transparent mode: a client that is the proxy's own upstream connection is a redirect loop, refused at once.

In local transparent mode the OUTPUT rule must skip the proxy's own upstream
packets, which the proxy marks (SO_MARK, `--mark`) and the rule matches
(`kafkatap iptables --mark`). With two different marks (or a hand-written rule
without the exception) the proxy's connection to the broker is redirected back
to the proxy. Its original destination is still the broker, so the
"original destination is my listener" check passes, and every hop opens the
next one: thousands of connections a second until the process runs out of
file descriptors.

The guard knows the local address of every upstream socket of a transparent
connection from the moment its SYN leaves (the connect is started here, so the
address is known before the handshake can complete and the listener accept
it), and the connection accepted from such an address is refused with the
reason, as is the one whose upstream it was. One process sees only its own
sockets: with `--workers N` a loop that crosses workers is caught at the first
hop that stays in one worker (each hop does with probability 1/N).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from typing import Any

Addr = tuple[str, int]

LOOP_DETAIL = ("redirect loop: the client is this proxy's own connection to {broker} (the iptables rule that lets "
               "the proxy's marked packets through has another --mark than the proxy's, or none)")


def _key(addr: Any) -> Addr:
    """(host, port) as a listener reports a peer: IPv4-mapped IPv6 read as the IPv4 address."""
    host = addr[0]
    return (host[7:] if host.startswith("::ffff:") else host, addr[1])


class RedirectLoopGuard:
    """The local addresses of this process's transparent upstream sockets, and whose each is."""

    __slots__ = ("_owners",)

    def __init__(self) -> None:
        self._owners: dict[Addr, Any] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def owner_of(self, peer: Any) -> Any | None:
        """The connection whose upstream socket `peer` (an accepted client's address) is, or None."""
        return self._owners.get(_key(peer)) if peer else None

    def forget(self, local: Addr | None) -> None:
        if local is not None:
            self._owners.pop(local, None)

    async def connect(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, addr: Any, owner: Any) -> Addr:
        """Connect non-blocking `sock` to `addr`, its local address registered for `owner` before the SYN can be
        answered; returns that address (the caller forgets it when the socket goes). Raises OSError as
        `loop.sock_connect` does, with the address forgotten."""
        err = sock.connect_ex(addr)
        local = _key(sock.getsockname())
        self._owners[local] = owner
        try:
            if err == errno.EINPROGRESS:
                done = loop.create_future()
                loop.add_writer(sock.fileno(), lambda: done.done() or done.set_result(None))
                try:
                    await done
                finally:
                    loop.remove_writer(sock.fileno())
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, os.strerror(err))
        except BaseException:
            self.forget(local)
            raise
        return local
