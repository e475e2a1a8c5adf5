"""Cluster mode with `--workers N`: what one worker learns about the brokers, every worker learns.

Why: each worker keeps its own `proxy.cluster.BrokerRegistry`, and a new broker or one
that came back at another address is learned from the response that names it, by the
worker that relayed that response. Its siblings went on sending new connections on that
broker's listener to the old address, or did not even listen on a new broker's port,
until a response naming it happened to pass through them.

How: the parent gives the workers a set of datagram mailboxes of their own
(`proxy.mailboxes`). A worker that learns a new or moved broker (`BrokerRegistry.on_learned`)
sends `[node id, host, port, learned at]` to every other worker; the learnings of one
event-loop turn (one Metadata answer naming many brokers) go in one datagram. A receiver
applies each as a sibling's learning (`BrokerRegistry.learn_from_sibling`): it binds a
new broker's listener on the same port (SO_REUSEPORT joins the sender's), follows a move,
keeps whichever learning is later, and never tells it on, so nothing circulates.

Nothing here is on the data path, and a failing channel changes no forwarded byte: a
learning that cannot be sent (a sibling's mailbox full) or a message that cannot be read
is counted and logged once; that sibling then follows the broker when a response through
it names it, as before.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable

import structlog

from proxy.mailboxes import MailSpec, WorkerMailbox

log = structlog.get_logger("kafkatap.proxy")

Learning = tuple[int, str, int, int]  # node id, host, port, learned at (BrokerRegistry.clock)
MAX_PER_MESSAGE = 128  # learnings per datagram: well below a Unix socket's send buffer even with 253-byte host names
MAX_MESSAGE = 64 * 1024


def encode(learnings: list[Learning]) -> bytes:
    return json.dumps(learnings, separators=(",", ":")).encode()


def decode(data: bytes) -> list[Learning]:
    """The learnings of one message; ValueError unless each is [node id ≥ 0, host, port, learned at]."""
    items = json.loads(data)
    if not isinstance(items, list):
        raise ValueError("not a list")
    out: list[Learning] = []
    for item in items:
        if not (isinstance(item, list) and len(item) == 4 and isinstance(item[1], str) and item[1]
                and all(type(item[i]) is int for i in (0, 2, 3)) and item[0] >= 0 and 0 < item[2] < 65536):
            raise ValueError(f"not [node id, host, port, learned at]: {item!r:.80}")
        out.append((item[0], item[1], item[2], item[3]))
    return out


class BrokerNews(WorkerMailbox):
    """A worker's side: tell the siblings what this worker learned, apply what they learned.

    `announce` may be called before `start` (discovery at start-up): what it is given waits and
    goes out once the loop runs. `start(loop, apply)` also reads the mailbox; `apply(node, host,
    port, at)` returns True when the learning changed this worker's map.
    """

    def __init__(self, spec: MailSpec) -> None:
        self.me = spec.index
        super().__init__(spec.mailbox_fd, spec.inbox_fds)
        self.sent = 0  # learnings announced (each to every sibling)
        self.applied = 0  # siblings' learnings that changed this worker's map
        self.lost = 0  # learnings a sibling could not be sent, and unreadable messages
        self._pending: list[Learning] = []
        self._apply: Callable[[int, str, int, int], bool] | None = None
        self._flush_due = False
        self._said: set[str] = set()  # failures logged once each

    def start(self, loop: asyncio.AbstractEventLoop, apply: Callable[[int, str, int, int], bool]) -> None:
        self._apply = apply
        self._listen(loop, self._drain)
        if self._pending:
            self._schedule()

    def stop(self) -> None:
        """No more reading; what siblings send meanwhile waits in the mailbox (a restarted worker reads it)."""
        self._unlisten()

    def close(self) -> None:
        self._close_mail()

    # ------------------------------------------------------------------ sending
    def announce(self, node_id: int, host: str, port: int, at: int) -> None:
        """A broker this worker found new or moved: sent to the siblings at the end of this loop turn."""
        self._pending.append((node_id, host, port, at))
        self.sent += 1
        self._schedule()

    def _schedule(self) -> None:
        if self._flush_due or self._loop is None:
            return
        try:
            self._loop.call_soon(self._flush)
        except RuntimeError as exc:  # the loop closed under a late answer: the rewrite it came from goes on
            self.lost += len(self._pending)
            self._pending.clear()
            self._once("schedule", "cannot tell the other workers of a broker change", error=str(exc))
            return
        self._flush_due = True

    def _flush(self) -> None:
        self._flush_due = False
        pending, self._pending = self._pending, []
        for i in range(0, len(pending), MAX_PER_MESSAGE):
            chunk = pending[i:i + MAX_PER_MESSAGE]
            data = encode(chunk)
            for to, inbox in enumerate(self.inboxes):
                if to != self.me:
                    self._send(to, inbox, data, len(chunk))

    def _send(self, to: int, inbox: socket.socket, data: bytes, count: int) -> None:
        try:
            inbox.send(data)
        except OSError as exc:  # its mailbox is full (EAGAIN: the sibling is stuck or down), or worse
            self.lost += count
            self._once("send", "a worker could not be told of a broker change: it follows when a response through "
                       "it names the broker", to_worker=to + 1, error=str(exc))

    # ------------------------------------------------------------------ receiving
    def _drain(self) -> None:
        while True:
            try:
                data = self.mailbox.recv(MAX_MESSAGE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.lost += 1
                self._once("recv", "cannot read the other workers' broker news", error=str(exc))
                return
            try:
                learnings = decode(data)
            except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
                self.lost += 1
                self._once("decode", "unreadable broker news from another worker: ignored", error=str(exc))
                continue
            self._take(learnings)

    def _take(self, learnings: list[Learning]) -> None:
        assert self._apply is not None
        for node_id, host, port, at in learnings:
            try:
                changed = self._apply(node_id, host, port, at)
            except Exception as exc:  # noqa: BLE001 — a bad learning must not stop the worker's loop
                self.lost += 1
                self._once("apply", "cannot apply another worker's broker news", node_id=node_id,
                           broker=f"{host}:{port}", error=str(exc) or repr(exc))
                continue
            self.applied += changed

    def _once(self, key: str, event: str, **fields: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log.error(event, **fields)

    def stats(self) -> dict[str, int]:
        return {"sent": self.sent, "applied": self.applied, "lost": self.lost}
