"""Raw-frame capture for one direction: keep bytes until the decoder says where a frame is.

Why it is separate from the decoder: the decoder keeps only what it needs to
summarize a frame (a bounded header window), while `--capture` needs the
whole frame. The relay appends every forwarded chunk here; when the decoder
reports a frame at (offset, size) the bytes are cut out and everything before
the frame's end is released. Memory is therefore at most one partial frame,
which the decoder's frame-size limit bounds.
"""

from __future__ import annotations

from protocol.apis import SASL_AUTHENTICATE


class FrameCapture:
    """Bytes of one direction from stream offset `base` on, until the frame that contains them is taken."""

    __slots__ = ("_buf", "_base")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._base = 0  # stream offset of _buf[0]

    def append(self, data: bytes) -> None:
        self._buf += data

    def take(self, offset: int, size: int, api_key: int | None) -> bytes | None:
        """The frame at stream `offset` of `size` bytes; None for SaslAuthenticate (credentials are never kept).

        Everything up to the frame's end is released either way.
        """
        start = offset - self._base
        data = bytes(self._buf[start:start + size]) if api_key != SASL_AUTHENTICATE else None
        del self._buf[:start + size]
        self._base = offset + size
        return data

    @property
    def held(self) -> int:
        """Bytes held now (at most one partial frame)."""
        return len(self._buf)
