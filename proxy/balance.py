"""Least-connections balancing between the workers of `--workers N`.

Why: with SO_REUSEPORT the kernel gives each new connection to a worker by a hash of
its addresses, not by load. Kafka clients open few connections and keep them for
hours, so a spread of 21 and 11 connections (seen in `bench/workers.py`) stays for
hours, and the busier worker's core becomes the whole proxy's limit while the other
core idles.

How: every worker still listens with SO_REUSEPORT (so nothing new sits on the data
path, and the parent stays a supervisor). When a worker accepts a connection and
another worker has fewer connections, it passes the accepted socket to that worker
over a Unix datagram socket (SCM_RIGHTS) before reading a byte from it; the receiver
serves it exactly as if it had accepted it on its own listener of the same address.
Ties stay where the kernel put them, so a quiet proxy passes nothing. A passed
connection is never passed again. This is what Envoy calls exact connection
balancing, done by the accepting worker instead of a central acceptor.

The load each worker sees lives in a small shared-memory table (`LoadTable`) whose
every slot has one writer, so no locks are needed:

- `open[w]`: connections worker w serves or is setting up (-1: w is down or stopping);
- `sent[v][w]`: connections v has passed to w, `received[w]`: connections w has taken.

A worker's load is `open[w] + Σv sent[v][w] − received[w]`: the connections in flight
towards it count already, so a burst of accepts in two workers does not pile onto
the same third one. A restarted worker carries its `sent` and `received` on from the
table, so in-flight counts stay right across restarts.

Passing a socket keeps every byte: nothing was read from it, and the receiving worker
does the TLS handshake, reads SO_ORIGINAL_DST (transparent mode) and connects
upstream itself. What a receiver cannot place is given back: in cluster mode a worker
may not yet have discovered the broker whose listener took the connection (until the
news of it reaches it, `proxy.broker_news`); the sender has, and serves it.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from proxy.listener import refuse
from proxy.mailboxes import Mailboxes, WorkerMailbox

log = structlog.get_logger("kafkatap.proxy")

DOWN = -1  # open[w] of a worker that is not running, or stopping: never chosen
_SLOT = 8  # bytes per counter (int64)
_MSG_MAX = 1024  # a message is "SENDER FLAG LISTENER": well below this
PASS, RETURN = "p", "r"


class LoadTable:
    """The workers' shared counters (see the module docstring), on a memfd every worker maps.

    `create()` in the parent; `LoadTable(fd, count)` in a worker (the fd inherited with pass_fds).
    """

    def __init__(self, fd: int, count: int) -> None:
        self.fd = fd
        self.count = count
        self._map = mmap.mmap(fd, self.size(count))
        self._slots = memoryview(self._map).cast("q")

    @staticmethod
    def size(count: int) -> int:
        return _SLOT * (2 * count + count * count)

    @classmethod
    def create(cls, count: int) -> LoadTable:
        """A new table with every worker down; its fd is inheritable (give it to the workers with pass_fds)."""
        fd = os.memfd_create("kafkatap-worker-load", 0)
        os.ftruncate(fd, cls.size(count))
        table = cls(fd, count)
        for w in range(count):
            table.set_open(w, DOWN)
        return table

    # slot indices: open[0..n), received[n..2n), sent[2n + v*n + w]
    def open(self, w: int) -> int:
        return self._slots[w]

    def set_open(self, w: int, n: int) -> None:
        self._slots[w] = n

    def received(self, w: int) -> int:
        return self._slots[self.count + w]

    def add_received(self, w: int) -> None:
        self._slots[self.count + w] += 1

    def add_sent(self, v: int, w: int) -> None:
        self._slots[2 * self.count + v * self.count + w] += 1

    def load(self, w: int) -> int | None:
        """Connections worker w serves, sets up or has on the way to it; None when it is down."""
        opened = self.open(w)
        if opened < 0:
            return None
        n = self.count
        in_flight = sum(self._slots[2 * n + w::n]) - self.received(w)  # column w of sent[v][w], one C-level sum
        return opened + max(0, in_flight)

    def loads(self) -> list[int | None]:
        return [self.load(w) for w in range(self.count)]

    def close(self) -> None:
        self._slots.release()
        self._map.close()
        os.close(self.fd)


@dataclass(frozen=True, slots=True)
class BalanceSpec:
    """What a worker needs to balance, as the parent gives it on the command line (`--worker-balance`).

    index: this worker, 0-based; table_fd: the LoadTable's memfd; inboxes: per worker, the
    datagram socket others send its connections to; mailbox: this worker's receiving end.
    """

    index: int
    table_fd: int
    mailbox_fd: int
    inbox_fds: tuple[int, ...]

    def render(self) -> str:
        return f"{self.index}:{self.table_fd}:{self.mailbox_fd}:{','.join(map(str, self.inbox_fds))}"

    @classmethod
    def parse(cls, text: str) -> BalanceSpec:
        index, table, mailbox, inboxes = text.split(":")
        return cls(int(index), int(table), int(mailbox), tuple(int(x) for x in inboxes.split(",")))


class WorkerMail:
    """The parent's side: the table and one socket pair per worker (`proxy.mailboxes`), made before any worker starts.

    The parent keeps every end open for the proxy's life, so a restarted worker finds its
    mailbox (and whatever was queued in it while it was down) where it was.
    """

    def __init__(self, count: int) -> None:
        self.table = LoadTable.create(count)
        self.boxes = Mailboxes(count)

    def spec(self, index: int) -> BalanceSpec:
        mail = self.boxes.spec(index)
        return BalanceSpec(index, self.table.fd, mail.mailbox_fd, mail.inbox_fds)

    def fds(self, index: int) -> tuple[int, ...]:
        """The descriptors worker `index` inherits: the table, its mailbox, everyone's inbox."""
        spec = self.spec(index)
        return (spec.table_fd, spec.mailbox_fd, *spec.inbox_fds)

    def down(self, index: int) -> None:
        """Worker `index` died: nobody passes it connections until it is back."""
        self.table.set_open(index, DOWN)

    def close(self) -> None:
        self.boxes.close()
        self.table.close()


class Balancer(WorkerMailbox):
    """A worker's side: decide at each accept whether another worker should serve the connection.

    `adopt(listener, sock)` is the server's: serve `sock` as if accepted on its listener
    named `listener` ("HOST:PORT"); False when it has no such listener (or is stopping).
    """

    def __init__(self, spec: BalanceSpec) -> None:
        self.me = spec.index
        self.table = LoadTable(spec.table_fd, len(spec.inbox_fds))
        super().__init__(spec.mailbox_fd, spec.inbox_fds)
        self.serving = 0  # connections this worker serves or is setting up (TLS handshake, transport set-up)
        self.passed = 0  # connections this worker gave to another
        self.taken = 0  # connections this worker took from another
        self.returned = 0  # connections given back because this worker has no listener for them yet
        self.lost = 0  # messages whose socket did not arrive (this process was out of descriptors)
        self._adopt: Callable[[str, socket.socket], bool] | None = None

    def start(self, loop: asyncio.AbstractEventLoop, adopt: Callable[[str, socket.socket], bool]) -> None:
        """Take part: publish this worker's load and take connections from the others."""
        self._loop, self._adopt = loop, adopt
        self._publish()
        self._listen(loop, self._drain)

    def stop(self) -> None:
        """Stopping: nobody passes this worker connections any more; what is queued for it stays queued.

        Left queued rather than taken: a worker stops when the whole proxy stops (the
        connections go with it either way) or after it died, when its restart takes them.
        """
        self.table.set_open(self.me, DOWN)
        self._unlisten()

    def close(self) -> None:
        """Stop, and close the descriptors this worker was given (a worker's own exit does this too)."""
        self.stop()
        self._close_mail()
        self.table.close()

    # ------------------------------------------------------------------ counts
    # One count, from the moment a connection is kept (accepted and not passed on, or taken) until it
    # ends, whether it ends in set-up or after: a count made of the server's connections plus those
    # still in set-up counts each connection twice between its transport's set-up and the end of
    # that set-up, and a burst of such double counts sent connections away that should have stayed.
    def kept(self) -> None:
        """A connection is served here from now on (the acceptor, before its set-up)."""
        self.serving += 1
        self._publish()

    def released(self) -> None:
        """A connection kept here ended (the server, at its close; the acceptor, when its set-up failed)."""
        self.serving -= 1
        self._publish()

    def _publish(self) -> None:
        if self._loop is not None:
            self.table.set_open(self.me, self.serving)

    # ------------------------------------------------------------------ passing
    def target(self) -> int | None:
        """The worker with the fewest connections when it has fewer than this one; None: keep it here."""
        loads = self.table.loads()
        mine = loads[self.me]
        if mine is None:
            return None
        best, fewest = None, mine
        for w, load in enumerate(loads):
            if w != self.me and load is not None and load < fewest:
                best, fewest = w, load
        return best

    def pass_on(self, sock: socket.socket, listener: str) -> bool:
        """Give `sock` (just accepted on `listener`) to a less loaded worker; True when it went (it is closed here)."""
        if self._loop is None:
            return False
        to = self.target()
        if to is None:
            return False
        if not self._send(to, PASS, listener, sock):
            return False
        self.passed += 1
        return True

    def _send(self, to: int, flag: str, listener: str, sock: socket.socket) -> bool:
        try:
            socket.send_fds(self.inboxes[to], [f"{self.me} {flag} {listener}".encode()], [sock.fileno()])
        except OSError:  # its queue is full (EAGAIN) or it is gone: serve it here
            return False
        self.table.add_sent(self.me, to)
        sock.close()
        return True

    def _drain(self) -> None:
        while True:
            try:
                msg, fds, flags, _ = socket.recv_fds(self.mailbox, _MSG_MAX, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.error("cannot take connections from the other workers", error=str(exc))
                return
            self.table.add_received(self.me)
            if not fds:  # MSG_CTRUNC: out of descriptors, the kernel dropped the socket (the client sees a reset)
                self.lost += 1
                continue
            sock = socket.socket(fileno=fds[0])
            sock.setblocking(False)
            try:
                sender_text, flag, listener = msg.decode().split(" ", 2)
                sender = int(sender_text)
            except ValueError:
                sock.close()
                continue
            self._take(sender, flag, listener, sock)

    def _take(self, sender: int, flag: str, listener: str, sock: socket.socket) -> None:
        assert self._adopt is not None
        if self._adopt(listener, sock):
            self.taken += 1
            return
        if flag == PASS and self._send(sender, RETURN, listener, sock):
            self.returned += 1
            return
        refuse(sock)  # neither has the listener any more (it closed): like a refused connection

    def stats(self) -> dict[str, int]:
        return {"passed": self.passed, "taken": self.taken, "returned": self.returned, "lost": self.lost}
