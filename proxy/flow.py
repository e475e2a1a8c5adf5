"""The two halves of a proxied connection: a `Peer` per socket and a `Flow` per direction.

Why two small classes instead of "client" and "broker" code: everything the
relay does one way it also does the other way (count bytes, write them to the
other socket, pause reading when that socket's buffer is full, queue behind a
fault, half-close). A connection owns two `Peer`s (client, broker) and two
`Flow`s (requests: client → broker, responses: broker → client) and drives
both flows with the same code.

Backpressure: each transport's write buffer has high = low = 0 water marks,
so asyncio calls `pause_writing` whenever the kernel did not take a whole
write and `resume_writing` exactly when the buffer drained; the flow then
holds reading on its source until it drained. A peer's reading is paused
while any hold bit is set, so independent reasons (peer buffer, fault
backlog, early data before the upstream connect) never resume each other.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from typing import Any

from proxy import tcpinfo
from proxy.facts import FlowCounts
from proxy.faults import DelayedWriter
from proxy.timing import SendStamps

# why a peer's reading is paused (any bit set → paused)
HOLD_PEER_BUFFER = 1  # the other peer's transport buffer has not drained
HOLD_FAULT_BACKLOG = 2  # a latency/bandwidth fault queue is over its limit
HOLD_EARLY = 4  # not connected upstream yet and the early buffer is full
HOLD_STOPPING = 8  # the proxy is stopping: no new requests are read while answers drain
HOLD_EDIT_BACKLOG = 16  # a frame editor's delayed output is over its bound (proxy.intercept)
HOLD_EDIT_MEMORY = 32  # a frame to edit waits for the process's EditMemory (proxy.intercept)

EARLY_LIMIT = 256 * 1024  # bytes read from the client before the upstream connect completes
_LINGER0 = struct.pack("ii", 1, 0)


class Peer:
    """One of the connection's two sockets: its transport, its socket, and why its reading is paused.

    `sock` is the transport's own socket object, not a dup: a dup per peer made a
    connection cost four descriptors, and under a low open-files limit clients went
    unaccepted. TCP_INFO and SO_LINGER are read and set through it while the transport
    is open; the connection samples TCP_INFO at its end (`Connection._set_end`) before
    it closes anything, so only a peer that reset first has no close sample of its own
    socket (its fd is gone when connection_lost reports the RST). Once closed, the
    object refuses every call (uvloop sets its fd to -1), so it can never touch a
    descriptor the kernel gave to someone else.
    """

    __slots__ = ("role", "transport", "sock", "closed", "eof", "_holds")

    def __init__(self, role: str) -> None:
        self.role = role  # "client" | "broker": the schema's end_by / side vocabulary
        self.transport: asyncio.Transport | None = None
        self.sock: socket.socket | None = None
        self.closed = False  # connection_lost was reported
        self.eof = False  # the peer sent FIN
        self._holds = 0

    def attach(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        if transport.get_extra_info("sslcontext") is None:
            transport.set_write_buffer_limits(0, 0)
        # a TLS transport (proxy.tls) keeps its default limits: with (0, 0) uvloop's SSL layer pauses its
        # protocol on its own handshake bytes and never resumes it, so the other side is never read again
        self.sock = transport.get_extra_info("socket")

    @property
    def open(self) -> bool:
        """The transport exists and has not reported connection_lost."""
        return self.transport is not None and not self.closed

    @property
    def holding(self) -> bool:
        return bool(self._holds)

    def hold(self, bit: int) -> None:
        if not self._holds and self.open:
            self.transport.pause_reading()  # type: ignore[union-attr]
        self._holds |= bit

    def release(self, bit: int) -> None:
        if self._holds & bit:
            self._holds &= ~bit
            if not self._holds and self.open and not self.eof:
                self.transport.resume_reading()  # type: ignore[union-attr]

    def reset(self) -> None:
        """Close with RST: SO_LINGER 0, then abort (the kernel discards unsent data)."""
        reset_socket(self.sock)
        if self.transport is not None:
            self.transport.abort()

    def tcp_info(self) -> dict[str, Any] | None:
        return tcpinfo.sample(self.sock) if self.sock is not None else None

    def release_fd(self) -> None:
        """Forget the socket: the transport owns and closes its descriptor."""
        self.sock = None


def reset_socket(sock: socket.socket | None) -> None:
    """Make the next close of `sock` send RST instead of FIN."""
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER0)
        except (OSError, ValueError):  # ValueError: a closed transport's socket (fd -1)
            pass


class Flow:
    """Bytes read from `src` and written to `dst`: one direction of a connection."""

    __slots__ = ("request", "label", "src", "dst", "counts", "stamps", "delayed", "close_after", "forwarded", "early",
                 "early_bytes", "gate", "discarded")

    def __init__(self, request: bool, src: Peer, dst: Peer, counts: FlowCounts) -> None:
        self.request = request  # True: client → broker (requests); False: broker → client (responses)
        self.label = "to_broker" if request else "to_client"  # the fault vocabulary
        self.src = src
        self.dst = dst
        self.counts = counts  # shared with the connection's facts (bytes read, frames parsed)
        self.stamps: SendStamps = SendStamps()
        self.delayed: DelayedWriter | None = None  # a latency/bandwidth fault's queue
        self.close_after: int | None = None  # a close-after-bytes fault
        self.forwarded = 0  # bytes handed on (counted on the fault path only: the close-after limit)
        # chunks read before `dst` exists (the upstream connect is pending), with their read times
        self.early: list[tuple[bytes, int]] | None = [] if request else None
        self.early_bytes = 0
        # a frame editor holding this flow's output: gate(fn) defers fn until it is out (True) or not (False)
        self.gate: Callable[[Callable[[], None]], bool] | None = None
        # bytes read and dropped, not forwarded: only once a client left during the shutdown drain (None: forwarding)
        self.discarded: int | None = None

    def write(self, data: bytes) -> None:
        """Hand bytes to the destination transport if it is still open (the fault queue's writer)."""
        if self.dst.open:
            self.dst.transport.write(data)  # type: ignore[union-attr]

    def half_close(self) -> None:
        """Propagate the source's FIN: write_eof on the destination once queued bytes are out."""
        dst = self.dst
        transport = dst.transport
        if transport is None or dst.closed:
            return

        def eof() -> None:
            if not dst.closed and transport.can_write_eof():
                transport.write_eof()

        self.after_queue(eof)

    def close_dst(self) -> None:
        """Close the destination (FIN) once queued bytes are out."""
        transport = self.dst.transport
        if transport is not None:
            self.after_queue(transport.close)

    def after_queue(self, fn: Callable[[], None]) -> None:
        """Run `fn` once every byte held for this flow (editor delays, fault queue) is handed on."""
        if self.gate is not None and self.gate(lambda: self.after_queue(fn)):
            return
        if self.delayed is not None and self.delayed.queued:
            self.delayed.write_eof_after(fn)
        else:
            fn()
