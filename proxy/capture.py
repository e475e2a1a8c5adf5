"""Raw-frame capture for one direction: keep bytes until the decoder says where a frame is.

Why it is separate from the decoder: the decoder keeps only what it needs to
summarize a frame (a bounded header window), while `--capture` needs the
whole frame. The relay appends every forwarded chunk here; when the decoder
reports a frame at (offset, size) the bytes are cut out and everything before
the frame's end is released. Memory is therefore at most one partial frame
plus the chunk being decoded, which the decoder's frame-size limit bounds.

Cost (issue 16: capture added +138 % proxy CPU per request): a chunk is kept
as the relay passed it, not copied, while nothing is left over from the
previous one — the common case, where clients write whole frames — so a
frame costs exactly one copy (its own `bytes`, which the recorder keeps).
Only a frame split across reads is joined in a `bytearray`.
"""

from __future__ import annotations

from protocol.apis import CREDENTIAL_APIS


class FrameCapture:
    """Bytes of one direction from stream offset `base` on, until the frame that contains them is taken."""

    __slots__ = ("_buf", "_start", "_base")

    def __init__(self) -> None:
        # a chunk as the relay passed it (bytes or a read-only memoryview of bytes), or a bytearray when
        # chunks had to be joined; `_start` indexes the first byte not taken yet, at stream offset `_base`
        self._buf: bytes | bytearray | memoryview = b""
        self._start = 0
        self._base = 0

    def append(self, data: bytes | memoryview) -> None:
        buf = self._buf
        if self._start >= len(buf):  # nothing held: keep the chunk itself (a copy only if it could change)
            if type(data) is not bytes and not (type(data) is memoryview and data.readonly):
                data = bytes(data)
            self._buf = data
            self._start = 0
            return
        if type(buf) is not bytearray:  # a partial frame continues in this chunk: join from here on
            buf = self._buf = bytearray(memoryview(buf)[self._start:])
            self._start = 0
        buf += data

    def take(self, offset: int, size: int, api_key: int | None) -> bytes | None:
        """The frame at stream `offset` of `size` bytes; None for a frame that carries credentials (never kept).

        Everything up to the frame's end is released either way.
        """
        buf = self._buf
        i = self._start + offset - self._base
        j = i + size
        if api_key in CREDENTIAL_APIS:
            data = None
        elif type(buf) is bytearray:
            with memoryview(buf) as view:
                data = bytes(view[i:j])
        else:
            data = bytes(buf[i:j])  # bytes: the slice is the one copy; memoryview: bytes() is
        self._base = offset + size
        if j >= len(buf):
            self._buf, self._start = b"", 0
        elif type(buf) is bytearray:
            del buf[:j]  # CPython trims a bytearray's front in O(1)
            self._start = 0
        else:
            self._start = j
        return data

    @property
    def held(self) -> int:
        """Bytes held now (at most one partial frame, plus the rest of the chunk being decoded)."""
        return len(self._buf) - self._start
