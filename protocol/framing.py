"""Kafka framing: the 4-byte size prefix, sanity checks, and the incremental body feeder.

Memory bound (per connection, per direction), and why it holds:
  * a frame that arrives whole inside one `receive_*_data` chunk is decoded in
    place from a memoryview of that chunk — nothing is copied;
  * otherwise the header is accumulated, at most `MAX_HEADER_BYTES` (64 KiB:
    14 bytes + a client_id ≤ 32 KiB + tagged fields; a longer header makes the
    direction opaque, kind `oversize_header`, instead of being buffered up to
    the frame limit), and
    the body is walked *incrementally*: the walker asks for the next n bytes it
    needs and everything it skips (record batches, bytes fields, tagged fields)
    is dropped as it arrives. The only bytes kept are those of the one field
    being read: at most max(61-byte batch header, a string ≤ 64 KiB) — strings
    longer than 64 KiB are skipped, not kept;
  * the suspended walker also holds a reference to the last chunk it was given
    (owned by the caller, already in memory).
So a 10 MiB Produce or a 50 MiB Fetch response costs O(64 KiB) per direction
regardless of size, never a whole-frame buffer. Bound per connection:
2 directions × (64 KiB header + 64 KiB field) ≈ 256 KiB worst case (a hostile
client), a few hundred bytes in practice, plus the pairing map (≤ `max_in_flight`
RequestSeen objects, 10,000 by default, ≈ 0.9 KiB each with summary: ≤ ~9 MiB).

Non-Kafka detection: a TLS record header (0x16 0x03 0x0[0-4], a ClientHello at
offset 0) or an ASCII HTTP method/version where a size prefix should be.
"""

from __future__ import annotations

from typing import Any, Generator

MiB = 1 << 20
DEFAULT_MAX_FRAME_BYTES = 100 * MiB
MAX_HEADER_BYTES = 64 * 1024  # frame bytes (prefix included) a header may span before the stream goes opaque

_HTTP_PREFIXES = (
    b"GET ", b"POST", b"PUT ", b"HEAD", b"HTTP", b"DELE", b"OPTI", b"PATC", b"CONN", b"PRI ", b"TRAC",
)


def sniff_non_kafka(first: bytes) -> tuple[str, str] | None:
    """(kind, reason) when the first bytes of a frame look like TLS or HTTP, else None."""
    if len(first) >= 3 and first[0] in (0x14, 0x15, 0x16, 0x17) and first[1] == 0x03 and first[2] <= 0x04:
        what = "ClientHello/handshake" if first[0] == 0x16 else "record"
        return "tls", f"TLS {what} (0x{first[0]:02x} 0x03 0x{first[2]:02x}): the connection is encrypted"
    if first[:4] in _HTTP_PREFIXES:
        return "http", f"HTTP ({bytes(first[:4])!r}…) where a Kafka size prefix should be"
    return None


def check_size(first4: bytes, size: int, offset: int, limit: int) -> tuple[str, str] | None:
    """Why a size prefix cannot start a Kafka frame, or None when it can.

    At stream offset 0 a TLS/HTTP signature wins even if the size looks legal
    (a raised limit must not make a ClientHello parse as a frame).
    """
    if 0 <= size <= limit and offset != 0:
        return None  # the hot path: no sniffing needed
    sniffed = sniff_non_kafka(first4)
    if sniffed is not None:
        return sniffed
    if size < 0:
        return "negative_size", f"negative frame size {size}"
    if size > limit:
        return "oversize", f"frame size {size} exceeds the limit of {limit} bytes"
    return None


Walk = Generator[tuple[int, int], tuple[Any, int, int], int]


class IncrementalBody:
    """Drives a generated incremental walker over frame bytes as they arrive.

    Positions are frame-relative. The walker yields (p, n): it needs n bytes
    starting at window position p. We remember the absolute position, keep
    only bytes at or after it, and resume the walker with a new window once n
    bytes are at hand. `end` is set when the walker returns; `failure` when it
    raises or asks for bytes past the frame end.
    """

    __slots__ = ("gen", "size", "got", "need_a", "need_n", "buf", "wbase", "end", "failure")

    def __init__(self, gen: Walk, size: int, start: int, window: Any) -> None:
        self.gen: Walk | None = gen
        self.size = size  # frame size including the prefix
        self.got = start + len(window)  # absolute position of the next byte to arrive
        self.need_a = 0
        self.need_n = 0
        self.buf = bytearray()
        self.wbase = start
        self.end = -1
        self.failure: BaseException | None = None
        self._resume(None, window)

    def _resume(self, value: Any, window: Any) -> None:
        gen = self.gen
        assert gen is not None
        try:
            p, n = gen.send(value)
        except StopIteration as stop:
            self.end = self.wbase + stop.value
            self.gen = None
            return
        except Exception as exc:  # any decode failure is reported, never raised
            self.failure = exc
            self.gen = None
            return
        a = self.wbase + p
        if a + n > self.size:
            self.failure = OverflowError(a + n)
            gen.close()
            self.gen = None
            return
        self.need_a, self.need_n = a, n
        self.buf = bytearray(window[p:]) if p < len(window) else bytearray()

    def feed(self, piece: Any) -> None:
        """Frame bytes [got, got+len(piece)) arrived."""
        while len(piece) and self.gen is not None:
            a, n, got = self.need_a, self.need_n, self.got
            L = len(piece)
            if got + L <= a:  # all skipped
                self.got = got + L
                return
            if got < a:
                piece = piece[a - got:]
                got = a
                L = len(piece)
            if not self.buf and L >= n:
                window, piece = piece, piece[L:]
            else:
                take = min(n - len(self.buf), L)
                self.buf += piece[:take]
                piece = piece[take:]
                got += take
                if len(self.buf) < n:
                    self.got = got
                    return
                window = bytes(self.buf)
                got -= len(window)  # window starts at a
            self.got = got + len(window)
            self.wbase = a
            self.buf = bytearray()
            self._resume((window, 0, len(window)), window)
        self.got += len(piece)
