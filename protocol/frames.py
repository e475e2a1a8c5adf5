"""Whole Kafka frames as bytes: header fields, correlation ids, Produce acks — read and edited in place.

Why a module of its own: the proxy's stream decoder never edits, but replay
renumbers every request it sends, and Kafka-aware fault injection will change
acks or correlation ids on purpose. These are small, fixed-position edits
that need no full decode; keeping them beside the header parser means the
positions are written down once, next to the code that reads them.

A frame here is always whole and starts with its 4-byte size prefix:
request header `api_key i16 | api_version i16 | correlation_id i32 |
client_id` (v2: + tagged fields), response header `correlation_id i32`
(v1: + tagged fields). No sockets, no clocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from struct import Struct

from protocol.apis import FETCH, PRODUCE, api_info
from protocol.headers import parse_request_header, response_header_flexible, skip_request_header_tags
from protocol.summaries.varint import Over, skip_tags, uv

__all__ = ["RequestFrame", "parse_request", "set_correlation_id", "response_correlation_id",
           "set_response_correlation_id", "response_body", "produce_acks_at", "produce_acks", "set_produce_acks",
           "expects_response", "fetch_response_session"]

_I16 = Struct(">h")
_I32 = Struct(">i")
REQUEST_CORRELATION_AT = 8  # after size, api key and version
RESPONSE_CORRELATION_AT = 4  # right after the size


@dataclass(frozen=True, slots=True)
class RequestFrame:
    """A request frame (with its size prefix) and its header fields."""

    data: bytes
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the body starts in `data` (after the header's tagged fields)

    @property
    def body(self) -> memoryview:
        return memoryview(self.data)[self.body_offset:]

    @property
    def header(self) -> bytes:
        """The header bytes exactly as they are (client_id and tagged fields included), without the size."""
        return self.data[4:self.body_offset]


def parse_request(data: bytes) -> RequestFrame:
    """Header fields of a whole request frame. Raises ValueError on a malformed frame."""
    d = memoryview(data)
    if len(d) < 14:
        raise ValueError("frame shorter than a request header")
    size = _I32.unpack_from(d, 0)[0]
    if size != len(d) - 4:
        raise ValueError(f"size prefix {size} does not match the frame length {len(d) - 4}")
    try:
        key, ver, cid, client_id, p = parse_request_header(d, 4, len(d))
        p = skip_request_header_tags(d, p, len(d), key, ver)
    except Exception as exc:  # Over / ValueError from the header reader
        raise ValueError(f"unreadable request header: {exc!r}") from exc
    return RequestFrame(bytes(data), key, ver, cid, client_id, p)


def set_correlation_id(data: bytes, correlation_id: int) -> bytes:
    """The request frame with a new correlation id (everything else byte for byte)."""
    at = REQUEST_CORRELATION_AT
    return data[:at] + _I32.pack(correlation_id) + data[at + 4:]


def response_correlation_id(frame: bytes | memoryview) -> int:
    """Correlation id of a whole response frame (size prefix included)."""
    return _I32.unpack_from(frame, RESPONSE_CORRELATION_AT)[0]


def set_response_correlation_id(data: bytes, correlation_id: int) -> bytes:
    """The response frame with a new correlation id (everything else byte for byte)."""
    at = RESPONSE_CORRELATION_AT
    return data[:at] + _I32.pack(correlation_id) + data[at + 4:]


def response_body(frame: bytes | memoryview, api_key: int, api_version: int) -> memoryview:
    """The body of a whole response frame to a request of `api_key`/`api_version` (header skipped)."""
    d = memoryview(frame)
    p = RESPONSE_CORRELATION_AT + 4
    if response_header_flexible(api_key, api_version):
        try:
            p = skip_tags(d, p, len(d))
        except Over as exc:
            raise ValueError("response header runs past the frame") from exc
    return d[p:]


# --------------------------------------------------------------------------- Produce acks
def _transactional_id(frame: RequestFrame) -> tuple[int, int]:
    """(length of a Produce's transactional_id, -1 when null or before v3; where in the body what follows it starts).

    Raises ValueError when the body ends too early to say."""
    if frame.api_key != PRODUCE:
        raise ValueError(f"api {frame.api_key} is not Produce")
    if frame.api_version < 3:
        return -1, 0
    d = frame.body
    try:
        info = api_info(PRODUCE)
        if info is not None and info.flexible(frame.api_version):
            n, p = uv(d, 0, len(d))  # compact nullable string: length + 1, 0 = null
            return n - 1, p + max(0, n - 1)
        length = _I16.unpack_from(d, 0)[0]
        return length, 2 + max(0, length)
    except Exception as exc:  # Over, DecodeError, struct.error: the body ends too early
        raise ValueError(f"Produce v{frame.api_version} body too short for its transactional_id") from exc


def produce_acks_at(frame: RequestFrame) -> int:
    """Position of `acks` (i16) in `frame.data`: first in the body, after transactional_id from v3."""
    try:
        p = _transactional_id(frame)[1]
    except ValueError as exc:
        if frame.api_key != PRODUCE:
            raise
        raise ValueError(f"Produce v{frame.api_version} body too short for acks") from exc
    if p + 2 > len(frame.body):
        raise ValueError(f"Produce v{frame.api_version} body too short for acks")
    return frame.body_offset + p


def produce_acks(frame: RequestFrame) -> int:
    """Produce acks read without decoding the body (0: the broker sends no response)."""
    return _I16.unpack_from(frame.data, produce_acks_at(frame))[0]


def produce_transactional(frame: RequestFrame) -> bool:
    """Whether a Produce names a transactional id (v3+), read without decoding the body; False when it cannot say."""
    if frame.api_key != PRODUCE:
        return False
    try:
        return _transactional_id(frame)[0] > 0
    except ValueError:
        return False


def set_produce_acks(frame: RequestFrame, acks: int) -> bytes:
    """The Produce frame with other acks (size unchanged; record batches untouched)."""
    at = produce_acks_at(frame)
    return frame.data[:at] + _I16.pack(acks) + frame.data[at + 2:]


def expects_response(frame: RequestFrame) -> bool:
    """Everything is answered except Produce with acks=0."""
    return frame.api_key != PRODUCE or produce_acks(frame) != 0


# --------------------------------------------------------------------------- Fetch sessions
def fetch_response_session(api_version: int, frame: bytes | memoryview) -> tuple[int, int] | None:
    """(error_code, session_id) of a whole Fetch v7+ response, read without decoding its records.

    v7+ bodies start `throttle_time_ms i32 | error_code i16 | session_id i32`;
    older versions have no sessions (None), as has a body too short to say.
    """
    if api_version < 7:
        return None
    body = response_body(frame, FETCH, api_version)
    if len(body) < 10:
        return None
    return _I16.unpack_from(body, 4)[0], _I32.unpack_from(body, 6)[0]
