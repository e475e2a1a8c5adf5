"""When forwarded bytes reached the kernel, tracked by stream offset.

Why by offset: the relay writes whole chunks, the decoder finds frames inside
them. A request's `req_sent_ns` (and a response's `resp_sent_ns`) is the time
its last byte was handed to `transport.write` when that left the transport
buffer empty (the kernel took it), otherwise the time the buffer drained.
Because each direction counts the bytes it handed over, "the frame ending at
offset E has been sent" is simply `E <= flushed`. No sockets here: the relay
reports writes and drains with its own clock, so the rule is unit-tested
with plain numbers.

When observation runs behind the relay (the per-turn decode budget of
`proxy.observer`), `flushed` has moved on by the time a frame is decoded.
`mark()` then keeps one (flushed offset, time) pair per flush advance until
`unmark()`, and `sent_at` answers from those marks: the time `flushed` first
reached the frame's end. Bound: one pair per forwarded chunk while behind,
which the observer's backlog bound limits; none otherwise.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class SendStamps(Generic[T]):
    """One direction's flushed offset, and the items waiting for their last byte to be flushed."""

    __slots__ = ("written", "flushed", "flushed_ns", "blocked", "_waiting", "_marks")

    def __init__(self) -> None:
        self.written = 0  # bytes handed to the transport
        self.flushed = 0  # offset up to which bytes reached the kernel
        self.flushed_ns = 0  # when `flushed` last advanced
        self.blocked = False  # the transport buffer holds bytes the kernel did not take yet
        self._waiting: deque[tuple[int, T]] = deque()
        self._marks: deque[tuple[int, int]] | None = None  # (flushed, ns) history while decoding is behind

    def handed(self, nbytes: int, now_ns: int) -> None:
        """`nbytes` were given to the transport; unless it is blocked, the kernel has them now."""
        self.written += nbytes
        if not self.blocked:
            self.flushed = self.written
            self.flushed_ns = now_ns
            if self._marks is not None:
                self._marks.append((self.written, now_ns))

    def block(self) -> None:
        """The transport could not hand everything to the kernel (asyncio `pause_writing`)."""
        self.blocked = True

    def drained(self, now_ns: int) -> None:
        """The transport buffer is empty again (asyncio `resume_writing`)."""
        self.blocked = False
        self.flushed = self.written
        self.flushed_ns = now_ns
        if self._marks is not None:
            self._marks.append((self.written, now_ns))

    def mark(self) -> None:
        """Decoding is about to fall behind: remember every flush from now on (see the module docstring)."""
        if self._marks is None:
            self._marks = deque(((self.flushed, self.flushed_ns),))

    def unmark(self) -> None:
        """Decoding caught up: `flushed`/`flushed_ns` are current again."""
        self._marks = None

    def sent_at(self, end_offset: int, item: T) -> int | None:
        """The time the frame ending at `end_offset` was flushed, or None after queueing `item` for `settled`."""
        if end_offset <= self.flushed:
            marks = self._marks
            if marks is not None:  # decoded late: the first flush that covered the frame, not the latest
                while marks[0][0] < end_offset:
                    marks.popleft()
                return marks[0][1]
            return self.flushed_ns
        self._waiting.append((end_offset, item))
        return None

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def settled(self) -> Iterator[tuple[T, int]]:
        """Pop every waiting item whose last byte is flushed now, with the flush time, oldest first."""
        w = self._waiting
        flushed, ts = self.flushed, self.flushed_ns
        while w and w[0][0] <= flushed:
            yield w.popleft()[1], ts

    def forget(self, item: T) -> None:
        """Stop waiting for `item` (its answer came before the drain notice did)."""
        for i, (_, waiting) in enumerate(self._waiting):
            if waiting is item:
                del self._waiting[i]
                return

    def drain_all(self) -> Iterator[T]:
        """Every item still waiting, oldest first (the connection ended)."""
        w = self._waiting
        while w:
            yield w.popleft()[1]
