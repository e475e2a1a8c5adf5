"""Unix datagram mailboxes between the workers of `--workers N`: one socket pair per worker.

Why pairs made by the parent: a worker's mailbox must outlive the worker (a restarted
worker finds what was sent to it while it was down), and every worker must reach every
other without a process in between. The parent creates the pairs before any worker
starts and keeps every end open for the proxy's life; each worker inherits its own
receiving end (its mailbox) and every worker's sending end (the inboxes) with pass_fds.
A datagram sent into worker w's inbox arrives, whole, in w's mailbox.

Used by connection passing (`proxy.balance`) and by the workers' broker news
(`proxy.broker_news`), each with pairs of its own.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass


class Mailboxes:
    """The parent's side: `count` non-blocking (inbox, mailbox) datagram socket pairs."""

    def __init__(self, count: int) -> None:
        self.pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(count)]
        for inbox, mailbox in self.pairs:
            inbox.setblocking(False)
            mailbox.setblocking(False)

    def spec(self, index: int) -> MailSpec:
        """What worker `index` (0-based) is given: its mailbox and everyone's inbox."""
        return MailSpec(index, self.pairs[index][1].fileno(), tuple(inbox.fileno() for inbox, _ in self.pairs))

    def fds(self, index: int) -> tuple[int, ...]:
        """The descriptors worker `index` inherits."""
        spec = self.spec(index)
        return (spec.mailbox_fd, *spec.inbox_fds)

    def close(self) -> None:
        for a, b in self.pairs:
            a.close()
            b.close()


@dataclass(frozen=True, slots=True)
class MailSpec:
    """A worker's share of a `Mailboxes`, as the parent writes it on the worker's command line."""

    index: int
    mailbox_fd: int
    inbox_fds: tuple[int, ...]

    def render(self) -> str:
        return f"{self.index}:{self.mailbox_fd}:{','.join(map(str, self.inbox_fds))}"

    @classmethod
    def parse(cls, text: str) -> MailSpec:
        index, mailbox, inboxes = text.split(":")
        return cls(int(index), int(mailbox), tuple(int(x) for x in inboxes.split(",")))


def open_mail(mailbox_fd: int, inbox_fds: tuple[int, ...]) -> tuple[socket.socket, list[socket.socket]]:
    """A worker's inherited descriptors as non-blocking sockets: (its mailbox, every worker's inbox)."""
    mailbox = socket.socket(fileno=mailbox_fd)
    inboxes = [socket.socket(fileno=fd) for fd in inbox_fds]
    for s in (mailbox, *inboxes):
        s.setblocking(False)
    return mailbox, inboxes


class WorkerMailbox:
    """A worker's end of one set of mailboxes, read on its event loop: the part `proxy.balance.Balancer` and
    `proxy.broker_news.BrokerNews` share (open the inherited descriptors, read while listening, close)."""

    def __init__(self, mailbox_fd: int, inbox_fds: tuple[int, ...]) -> None:
        self.mailbox, self.inboxes = open_mail(mailbox_fd, inbox_fds)
        self._loop: asyncio.AbstractEventLoop | None = None

    def _listen(self, loop: asyncio.AbstractEventLoop, on_readable: Callable[[], None]) -> None:
        self._loop = loop
        loop.add_reader(self.mailbox.fileno(), on_readable)

    def _unlisten(self) -> None:
        """No more reading; what is sent meanwhile waits in the mailbox (a restarted worker reads it)."""
        if self._loop is not None:
            self._loop.remove_reader(self.mailbox.fileno())
            self._loop = None

    def _close_mail(self) -> None:
        self._unlisten()
        for s in (self.mailbox, *self.inboxes):
            s.close()
