"""A framing-only stand-in for `protocol.stream.KafkaStream`.

Why it exists: the relay must produce request rows (sizes, timings, api,
correlation, client_id, acks=0 detection) even where the full decoder is not
available — while `protocol/stream.py` was being written, and as a last-resort
fallback if it fails to import. It speaks the same sans-I/O contract
(`protocol.events`) but decodes no bodies beyond Produce's acks.
"""

from __future__ import annotations

import struct
from collections import deque

from protocol.apis import api_info, api_name
from protocol.events import Direction, RequestSeen, ResponseSeen, StreamClosed, StreamOpaque, Summary

MAX_FRAME = 100 * 1024 * 1024
_I32 = struct.Struct(">i")
_HDR = struct.Struct(">hhih")


class _Dir:
    __slots__ = ("buf", "off", "first_ns", "opaque")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.off = 0  # stream offset of buf[0]
        self.first_ns: int | None = None
        self.opaque = False


class FramingStream:
    """Frames + request header + pairing; bodies stay opaque (summary only for Produce acks)."""

    def __init__(self) -> None:
        self._req = _Dir()
        self._resp = _Dir()
        self._events: deque = deque()
        self._inflight: dict[int, RequestSeen] = {}

    def receive_request_data(self, data: bytes, now_ns: int) -> None:
        self._feed(self._req, Direction.REQUEST, data, now_ns)

    def receive_response_data(self, data: bytes, now_ns: int) -> None:
        self._feed(self._resp, Direction.RESPONSE, data, now_ns)

    def close(self, now_ns: int) -> None:
        trunc = {d: len(x.buf) for d, x in ((Direction.REQUEST, self._req), (Direction.RESPONSE, self._resp)) if x.buf and not x.opaque}
        self._events.append(StreamClosed(list(self._inflight.values()), trunc, now_ns))
        self._inflight.clear()

    def next_event(self):
        return self._events.popleft() if self._events else None

    def _opaque(self, d: _Dir, direction: Direction, kind: str, reason: str) -> None:
        d.opaque = True
        self._events.append(StreamOpaque(direction, d.off, kind, reason))
        d.buf = bytearray()

    def _feed(self, d: _Dir, direction: Direction, data: bytes, now: int) -> None:
        if d.opaque:
            d.off += len(data)
            return
        if not d.buf:
            d.first_ns = now
        d.buf += data
        while len(d.buf) >= 4:
            size = _I32.unpack_from(d.buf, 0)[0]
            if d.off == 0 and direction is Direction.REQUEST and d.buf[0] == 0x16:
                return self._opaque(d, direction, "tls", "TLS handshake record at offset 0")
            if size < 0 or size > MAX_FRAME:
                return self._opaque(d, direction, "oversize" if size > 0 else "negative_size", f"frame size {size} at offset {d.off}")
            if len(d.buf) < 4 + size:
                return
            frame = bytes(d.buf[: 4 + size])
            del d.buf[: 4 + size]
            first = d.first_ns if d.first_ns is not None else now
            d.first_ns = now if d.buf else None
            off = d.off
            d.off += 4 + size
            if direction is Direction.REQUEST:
                self._request(frame, off, first, now)
            else:
                self._response(frame, off, first, now)

    def _request(self, f: bytes, off: int, first: int, last: int) -> None:
        if len(f) < 14:
            return self._opaque(self._req, Direction.REQUEST, "garbage", f"request frame too short at {off}")
        key, ver, corr, clen = _HDR.unpack_from(f, 4)
        if api_info(key) is None or ver < 0:
            return self._opaque(self._req, Direction.REQUEST, "garbage", f"unknown api key {key} at offset {off}")
        cid = f[14 : 14 + clen].decode("utf-8", "replace") if clen >= 0 else None
        summary = None
        expects = True
        if key == 0:
            summary = Summary()
            try:
                p = 14 + max(clen, 0)
                info = api_info(0)
                flex = info.flexible(ver) if info else False
                if flex:  # header tagged fields
                    n, p = _uvarint(f, p)
                    for _ in range(n):
                        _, p = _uvarint(f, p)
                        sz, p = _uvarint(f, p)
                        p += sz
                if ver >= 3:
                    if flex:
                        n, p = _uvarint(f, p)
                        p += max(n - 1, 0)
                    else:
                        n = struct.unpack_from(">h", f, p)[0]
                        p += 2 + max(n, 0)
                summary.acks = struct.unpack_from(">h", f, p)[0]
                expects = summary.acks != 0
            except (struct.error, IndexError):
                summary = None
        ev = RequestSeen(off, len(f), first, last, key, ver, api_name(key), corr, cid, expects, summary,
                         None if key == 0 else "framing only")
        if expects:
            self._inflight[corr] = ev
        self._events.append(ev)

    def _response(self, f: bytes, off: int, first: int, last: int) -> None:
        corr = _I32.unpack_from(f, 4)[0] if len(f) >= 8 else -1
        req = self._inflight.pop(corr, None)
        self._events.append(ResponseSeen(off, len(f), first, last, corr, req, None, "framing only"))


def _uvarint(b: bytes, p: int) -> tuple[int, int]:
    shift = v = 0
    while True:
        x = b[p]
        p += 1
        v |= (x & 0x7F) << shift
        if not x & 0x80:
            return v, p
        shift += 7
