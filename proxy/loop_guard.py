"""A client that is the proxy's own upstream connection is a loop, refused at once.

Transparent mode: in local transparent mode the OUTPUT rule must skip the proxy's own upstream
packets, which the proxy marks (SO_MARK, `--mark`) and the rule matches
(`kafkatap iptables --mark`). With two different marks (or a hand-written rule
without the exception) the proxy's connection to the broker is redirected back
to the proxy. Its original destination is still the broker, so the
"original destination is my listener" check passes, and every hop opens the
next one: thousands of connections a second until the process runs out of
file descriptors.

Explicit and cluster mode: an upstream that is the proxy's own listener (a `--upstream` equal to its `--listen`
under another name, a broker advertising the proxy's bootstrap address) loops the same way; the start-up probe
of the upstream alone set it off. The command refuses the plain case at start (`proxy.cli._refuse_self_upstreams`);
the guard catches the rest as it happens.

The guard knows every upstream socket, by its local address and its broker, from the moment its SYN leaves
(the connect is started here, so the socket is known before the handshake can complete and the listener
accept it), and a connection accepted from such an address with that broker as its original destination
(transparent) or its listener's address (explicit, cluster) is refused with the reason, as is the one whose
upstream it was. One process sees only its own sockets: with `--workers N` a loop that crosses workers is
caught at the first hop that stays in one worker (each hop does with probability 1/N).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from typing import Any

from proxy.address import connected_host

Addr = tuple[str, int]

SELF_LOOP_DETAIL = ("loop: the upstream {upstream} is this proxy's own listener (check --upstream, or the address the "
                    "broker advertises)")
LOOP_DETAIL = ("redirect loop: the client is this proxy's own connection to {broker} (the iptables rule that lets "
               "the proxy's marked packets through has another --mark than the proxy's, or none)")


def _addr(addr: Any) -> Addr:
    """(host, port) as the listener that accepts a connection to or from it reports it (`proxy.address.connected_host`:
    IPv4-mapped IPv6 read as IPv4, and a connect to 0.0.0.0 or :: as one to the loopback, where Linux sends it)."""
    return (connected_host(addr[0]), addr[1])


Key = tuple[Addr, Addr]  # (the upstream socket's local address, the broker it connects to): unique on the host


class RedirectLoopGuard:
    """The upstream sockets of this process, by (local address, broker address), and whose each is.

    Keyed by both ends: Linux lets sockets to different destinations share a local (ip, port), so a local
    client of another broker can come from the very address an upstream socket of ours uses. Only a client
    whose original destination is that socket's broker as well is that socket.
    """

    __slots__ = ("_owners",)

    def __init__(self) -> None:
        self._owners: dict[Key, Any] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def owner_of(self, peer: Any, original_dst: Any) -> Any | None:
        """The connection whose upstream socket an accepted client is (its address, where it was headed), or None."""
        if not peer or not original_dst:
            return None
        return self._owners.get((_addr(peer), _addr(original_dst)))

    def forget(self, key: Key | None, owner: Any) -> None:
        """Drop `owner`'s entry (never another connection's that took the same key since)."""
        if key is not None and self._owners.get(key) is owner:
            del self._owners[key]

    async def connect(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, addr: Any, owner: Any) -> Key:
        """Connect non-blocking `sock` to `addr`, registered for `owner` before the SYN can be answered; returns
        the key (the caller forgets it when the socket goes). Raises OSError as `loop.sock_connect` does, with
        the entry forgotten."""
        err = sock.connect_ex(addr)
        key = (_addr(sock.getsockname()), _addr(addr))
        self._owners[key] = owner
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
            self.forget(key, owner)
            raise
        return key
