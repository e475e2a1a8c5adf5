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
upstream it was.

With `--workers N` the kernel (or the balancer) hands a hop to any worker, most often not the one whose
upstream socket it is: a guard that knew only its own process's sockets served such a hop as a new client, and
one client's connect made chains of dozens of hops, each recorded as a broker reset. So the workers of one proxy
also share what they know (`SiblingUpstreams`: a table in shared memory the parent makes, indexed by the
upstream socket's local port). The worker that accepts a hop another worker's socket made refuses it with the
same reason and says so in the table, and the owner, whose upstream that refusal resets, ends its client's
connection with the reason too rather than as a broker reset. The table holds a 32-bit hash of (local address,
broker) per entry: a collision or a full bucket can only hide a loop (the hop then goes on as before), never
refuse a real client, which cannot share its four addresses with a live upstream socket of ours.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import mmap
import os
import socket
import struct
import zlib
from dataclasses import dataclass
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

PORTS = 65536  # the table is indexed by the upstream socket's local port
WAYS = 4  # entries per port: Linux lets sockets to different brokers share a local port
_OWNER_BITS = 0xFFFF  # an entry: hash << 32 | owning worker's index + 1 (0: free)


def key_hash(key: Key) -> int:
    """A 32-bit hash of (local ip, broker ip, broker port), the same in every worker (Python's hash() is not)."""
    (local_ip, _), (broker_ip, broker_port) = key
    return zlib.crc32(f"{local_ip}|{broker_ip}|{broker_port}".encode())


class SiblingUpstreams:
    """The upstream sockets of every worker of one proxy, in shared memory (`--workers N`; see the module docstring).

    Two arrays of PORTS * WAYS 64-bit words on a memfd the parent creates and the workers inherit:
    `entries` (written only by the owning worker: hash << 32 | index + 1) and `caught` (written by the worker
    that refused a hop: the entry's value as it read it). Plain stores, no locks: a race can lose an entry
    or a mark, which only means a loop is caught later or its owner's row says broker reset, as before.

    And one `connecting` word per worker: the hash of the address it is connecting to, from just before its
    connect() until the entry is written. The kernel may complete a hop's handshake inside that connect() and
    run the accepting worker first (on a busy core, before the owner wrote anything): a worker that sees a
    sibling connecting to a client's target waits for the entry before deciding (`Connection._place`).
    """

    def __init__(self, fd: int, count: int, index: int | None = None) -> None:
        self.fd = fd
        self.count = count
        self.me = index  # this worker's 0-based index; None in the parent, which only clears a dead worker's entries
        self._map = mmap.mmap(fd, self.size(count))
        words = memoryview(self._map).cast("Q")
        n = PORTS * WAYS
        self._entries, self._caught, self._connecting = words[:n], words[n:2 * n], words[2 * n:]

    @staticmethod
    def size(count: int) -> int:
        return (2 * PORTS * WAYS + count) * 8

    @classmethod
    def create(cls, count: int) -> SiblingUpstreams:
        """The parent's: an empty table whose fd the workers inherit (pass_fds); its pages are allocated as used."""
        fd = os.memfd_create("kafkatap-loop-guard", 0)
        os.ftruncate(fd, cls.size(count))
        return cls(fd, count)

    def connecting(self, target: Addr | None) -> None:
        """This worker is about to connect to `target` (None: done, its entry is written)."""
        assert self.me is not None
        self._connecting[self.me] = 0 if target is None else zlib.crc32(f"{target[0]}|{target[1]}".encode()) << 1 | 1

    def sibling_connecting(self, target: Addr) -> bool:
        """Whether another worker is between its connect() to `target` and the entry of that socket."""
        value = zlib.crc32(f"{target[0]}|{target[1]}".encode()) << 1 | 1
        return any(w != self.me and held == value for w, held in enumerate(self._connecting))

    def _mine(self, h: int) -> int:
        assert self.me is not None
        return h << 32 | (self.me + 1)

    def register(self, key: Key) -> None:
        """Our upstream socket `key` is about to send its SYN: siblings that accept it will know it is ours."""
        value = self._mine(key_hash(key))
        base = key[0][1] * WAYS
        for i in range(base, base + WAYS):
            held = self._entries[i]
            if held == 0 or held >> 32 == value >> 32:  # free, or a stale entry for the same addresses
                self._caught[i] = 0
                self._entries[i] = value
                return
        # every way taken: this socket is known to its own worker only (a loop through another is caught later)

    def release(self, key: Key) -> None:
        """Our upstream socket `key` is gone: drop its entry, unless another socket took the slot since."""
        value = self._mine(key_hash(key))
        base = key[0][1] * WAYS
        for i in range(base, base + WAYS):
            if self._entries[i] == value:
                self._entries[i] = 0

    def catch(self, key: Key) -> bool:
        """An accepted client is `key`: True when a sibling worker's upstream socket it is (marked caught, so the
        sibling ends its own client with the reason). Our own sockets are the per-process registry's."""
        h = key_hash(key)
        base = key[0][1] * WAYS
        for i in range(base, base + WAYS):
            held = self._entries[i]
            owner = (held & _OWNER_BITS) - 1
            if held >> 32 == h and owner >= 0 and owner != self.me:
                self._caught[i] = held
                return True
        return False

    def owned_by_any(self, key: Key) -> bool:
        """Whether any worker's upstream socket is `key` (nothing marked): such a hop is not worth passing on."""
        h = key_hash(key)
        base = key[0][1] * WAYS
        return any(self._entries[i] >> 32 == h and self._entries[i] & _OWNER_BITS for i in range(base, base + WAYS))

    def was_caught(self, key: Key) -> bool:
        """Whether a sibling refused our upstream socket `key` as a loop (asked when that socket ends)."""
        value = self._mine(key_hash(key))
        base = key[0][1] * WAYS
        return any(self._entries[i] == value and self._caught[i] == value for i in range(base, base + WAYS))

    def drop_worker(self, index: int) -> None:
        """Worker `index` (0-based) died: its sockets are gone, so are its entries (the parent's, at the death).

        A stale entry would name a four-tuple that a real client may use next."""
        owner = index + 1
        for i, held in enumerate(self._entries.tolist()):
            if held and held & _OWNER_BITS == owner:
                self._entries[i] = 0
        self._connecting[index] = 0

    def close(self) -> None:
        self._entries.release()
        self._caught.release()
        self._connecting.release()
        self._map.close()
        os.close(self.fd)


@dataclass(frozen=True, slots=True)
class SiblingSpec:
    """A worker's share of the table, on its command line (`--worker-loop-guard INDEX:FD:WORKERS`)."""

    index: int
    fd: int
    count: int

    def render(self) -> str:
        return f"{self.index}:{self.fd}:{self.count}"

    @classmethod
    def parse(cls, text: str) -> SiblingSpec:
        index, fd, count = text.split(":")
        return cls(int(index), int(fd), int(count))


# libc through PyDLL: the GIL stays held across the call. socket.connect_ex and getsockname release it for the
# syscall, and taking it back can wait for another thread (the resolver's executor, the recorder) up to the switch
# interval (5 ms): meanwhile a sibling worker accepted the hop, found no entry, and served it as a new client.
try:
    _LIBC: Any = ctypes.PyDLL(None, use_errno=True)
    _LIBC.connect.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
    _LIBC.getsockname.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint32))
except (OSError, AttributeError):  # no libc symbols to call: the socket module's calls (a rare hop goes on)
    _LIBC = None


def _sockaddr(family: int, addr: Any) -> bytes:
    """struct sockaddr_in / sockaddr_in6 for `addr` as getaddrinfo gives it."""
    if family == socket.AF_INET6:
        flow, scope = (addr[2], addr[3]) if len(addr) >= 4 else (0, 0)
        return (struct.pack("=H", family) + struct.pack("!HI", addr[1], flow)
                + socket.inet_pton(socket.AF_INET6, addr[0]) + struct.pack("=I", scope))
    return struct.pack("=H", family) + struct.pack("!H", addr[1]) + socket.inet_pton(socket.AF_INET, addr[0]) + bytes(8)


def _parse_sockaddr(family: int, raw: bytes) -> Addr:
    port = struct.unpack_from("!H", raw, 2)[0]
    if family == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port
    return socket.inet_ntop(socket.AF_INET, raw[4:8]), port


def connect_holding_gil(sock: socket.socket, addr: Any) -> tuple[int, Any]:
    """`sock.connect_ex(addr)` and then its local address, with no thread switch in between (see `_LIBC`):
    the caller registers the socket before its process can let go of the GIL. Returns (errno or 0, local addr)."""
    if _LIBC is None:
        return sock.connect_ex(addr), sock.getsockname()
    ctypes.set_errno(0)
    fd, family = sock.fileno(), sock.family
    target = _sockaddr(family, addr)
    err = 0 if _LIBC.connect(fd, target, len(target)) == 0 else ctypes.get_errno()
    buf = ctypes.create_string_buffer(28)
    size = ctypes.c_uint32(28)
    if _LIBC.getsockname(fd, buf, ctypes.byref(size)) != 0:
        return err, sock.getsockname()
    return err, _parse_sockaddr(family, buf.raw)


class RedirectLooped(OSError):
    """Our upstream connect was reset by a sibling worker that found it to be a loop (`SiblingUpstreams.catch`)."""


class RedirectLoopGuard:
    """The upstream sockets of this process, by (local address, broker address), and whose each is.

    Keyed by both ends: Linux lets sockets to different destinations share a local (ip, port), so a local
    client of another broker can come from the very address an upstream socket of ours uses. Only a client
    whose original destination is that socket's broker as well is that socket.

    `siblings`: the other workers' sockets too (`--workers N`); None in a single process.
    """

    __slots__ = ("_owners", "siblings")

    def __init__(self, siblings: SiblingUpstreams | None = None) -> None:
        self._owners: dict[Key, Any] = {}
        self.siblings = siblings

    def __len__(self) -> int:
        return len(self._owners)

    def owner_of(self, peer: Any, original_dst: Any) -> Any | None:
        """The connection whose upstream socket an accepted client is (its address, where it was headed), or None."""
        if not peer or not original_dst:
            return None
        return self._owners.get((_addr(peer), _addr(original_dst)))

    def sibling_of(self, peer: Any, original_dst: Any) -> bool:
        """Whether an accepted client is another worker's upstream socket; if so that worker is told (`catch`)."""
        if self.siblings is None or not peer or not original_dst:
            return False
        return self.siblings.catch((_addr(peer), _addr(original_dst)))

    def is_upstream(self, peer: Any, original_dst: Any) -> bool:
        """Whether an accepted client is any worker's upstream socket, this one's included (nothing is marked)."""
        if not peer or not original_dst:
            return False
        key = (_addr(peer), _addr(original_dst))
        return key in self._owners or (self.siblings is not None and self.siblings.owned_by_any(key))

    def sibling_connecting(self, target: Any) -> bool:
        """Whether another worker is connecting to `target` and has not noted its socket yet (wait, then ask)."""
        return self.siblings is not None and bool(target) and self.siblings.sibling_connecting(_addr(target))

    def caught_by_sibling(self, key: Key | None) -> bool:
        """Whether a sibling worker refused our upstream socket `key` as a loop (asked when that socket ends)."""
        return key is not None and self.siblings is not None and self.siblings.was_caught(key)

    def forget(self, key: Key | None, owner: Any) -> None:
        """Drop `owner`'s entry (never another connection's that took the same key since)."""
        if key is not None and self._owners.get(key) is owner:
            del self._owners[key]
            if self.siblings is not None:
                self.siblings.release(key)

    async def connect(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, addr: Any, owner: Any) -> Key:
        """Connect non-blocking `sock` to `addr`, registered for `owner` before the SYN can be answered; returns
        the key (the caller forgets it when the socket goes). Raises OSError as `loop.sock_connect` does, with
        the entry forgotten; RedirectLooped when a sibling worker refused it as a loop."""
        if self.siblings is None:
            err = sock.connect_ex(addr)
            key = (_addr(sock.getsockname()), _addr(addr))
            self._owners[key] = owner
        else:
            target = _addr(addr)
            self.siblings.connecting(target)
            try:
                err, local = connect_holding_gil(sock, addr)
                key = (_addr(local), target)
                self._owners[key] = owner
                self.siblings.register(key)
            finally:
                self.siblings.connecting(None)
        try:
            if err == errno.EINPROGRESS:
                done = loop.create_future()
                loop.add_writer(sock.fileno(), lambda: done.done() or done.set_result(None))
                try:
                    await done
                finally:
                    loop.remove_writer(sock.fileno())
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err and self.caught_by_sibling(key):
                raise RedirectLooped(err, os.strerror(err))
            if err:
                raise OSError(err, os.strerror(err))
        except BaseException:
            self.forget(key, owner)
            raise
        return key
