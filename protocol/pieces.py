"""A frame as it was read, in pieces, readable as one byte sequence without joining it.

Why: a response the proxy may have to edit is held until it is whole, but most
are forwarded unchanged (a Fetch response's broker addresses live in a tag at
its very end, and are almost never there). Joining a 1 MiB Fetch response's
reads into one buffer costs a copy into fresh pages, and the decoder then copies
a mutable buffer once more; reading the few structural bytes the check needs
straight from the pieces costs neither. Reads are sparse and mostly forward,
so the piece of the last read is tried first.

Sans-I/O: pieces are any read-only buffers (bytes, memoryviews of bytes).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any, overload

__all__ = ["Pieces"]


class Pieces:
    """Consecutive buffers read as one: `len`, an int index, a contiguous slice (as bytes)."""

    __slots__ = ("bufs", "starts", "n", "_k")

    def __init__(self, bufs: Sequence[Any]) -> None:
        self.bufs = [v for v in (memoryview(b) for b in bufs) if len(v)]
        self.starts: list[int] = []
        n = 0
        for b in self.bufs:
            self.starts.append(n)
            n += len(b)
        self.n = n
        self._k = 0  # the piece of the last read

    def __len__(self) -> int:
        return self.n

    def _piece(self, i: int) -> int:
        """The index of the piece that holds byte i (0 <= i < n)."""
        k = self._k
        start = self.starts[k]
        if not (start <= i < start + len(self.bufs[k])):
            k = self._k = bisect_right(self.starts, i) - 1
        return k

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> bytes: ...

    def __getitem__(self, i: int | slice) -> int | bytes:
        if isinstance(i, slice):
            start, stop, step = i.indices(self.n)
            if step != 1:
                raise ValueError("Pieces slices are contiguous")
            return self._slice(start, stop)
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError("index past the pieces")
        k = self._piece(i)
        return self.bufs[k][i - self.starts[k]]

    def _slice(self, start: int, stop: int) -> bytes:
        if stop <= start:
            return b""
        k = self._piece(start)
        off = start - self.starts[k]
        first = self.bufs[k]
        if off + (stop - start) <= len(first):  # the usual case: within one piece
            return bytes(first[off:off + stop - start])
        out = bytearray(first[off:])
        while len(out) < stop - start:
            k += 1
            out += self.bufs[k][:stop - start - len(out)]
        return bytes(out)

    def __bytes__(self) -> bytes:
        return b"".join(self.bufs)
