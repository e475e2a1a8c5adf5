"""The state `KafkaStream` keeps per direction and per frame, and the verdicts on a frame's body.

Why apart from `protocol.stream`: the stream's methods are the control flow
(framing, header, body, events); what they carry between chunks — a frame
cut across chunks, what its header said, one direction's offsets — and the
per-(api, version) tables of the whole-frame fast path are plain data with no
behaviour of their own, and read more easily on their own.
"""

from __future__ import annotations

from struct import error as struct_error
from typing import Any

from protocol.apis import APIS, SASL_HANDSHAKE
from protocol.events import Direction, Summary
from protocol.framing import IncrementalBody
from protocol.headers import response_header_flexible
from protocol.summaries.codegen import walker
from protocol.summaries.varint import Over

# Process-wide caches keyed by (api_key, api_version) — values a client chooses.
# Bound: only pairs a schema describes are stored (the stream checks before
# storing), so each holds at most the schemas' (api, version) pairs (~1,000),
# however many versions a hostile client sends; the rest are recomputed
# (a dict lookup and a range check).
KNOWN: dict[tuple[int, int], tuple[bool, bool]] = {}
FAST_REQ: dict[tuple[int, int], tuple[str, bool, Any] | tuple[()]] = {}
FAST_RESP: dict[tuple[int, int], tuple[str, bool, Any] | tuple[()]] = {}


def fast_entry(key: int, ver: int, request: bool) -> tuple[str, bool, Any] | tuple[()]:
    """(api name, header has tags, plain walker) for the whole-frame fast path; () when not applicable."""
    info = APIS.get(key)
    if key < 0 or ver < 0 or info is None or not info.decodable(ver) or key == SASL_HANDSHAKE:
        return ()  # SaslHandshake: the stream switches to raw SASL tokens after v0, on the slow path
    try:
        walk = walker(key, request, ver, optimistic=True)  # its bail-outs land on the slow path
    except Exception:  # noqa: BLE001 - the slow path will report it
        return ()
    flex = info.flexible(ver) if request else response_header_flexible(key, ver)
    return (info.name, flex, walk)


def schema_known(key: int, ver: int) -> tuple[bool, bool]:
    """(a schema describes this version, the request header is v2) — cached per stream-less key."""
    info = APIS.get(key)
    return (info is not None and info.decodable(ver), info is not None and info.flexible(ver))


def locate_errors(resp: Summary, req: Summary) -> None:
    """Top-level response errors name no group: take it from the request (JoinGroup, EndTxn …)."""
    where = req.group_id or req.transactional_id or req.coordinator_key
    if where is None:
        return
    for e in resp.errors:
        if e.resource is None and e.topic is None:
            e.resource = where


class FrameInProgress:
    """A frame whose bytes span several chunks."""

    __slots__ = ("start", "size", "first_ns", "got", "hbuf", "hneed", "body", "info")

    def __init__(self, start: int, size: int, first_ns: int, hneed: int) -> None:
        self.start = start  # stream offset of the size prefix
        self.size = size  # including the 4-byte prefix
        self.first_ns = first_ns
        self.got = 0  # frame bytes received so far
        self.hbuf = bytearray()
        self.hneed = hneed  # header bytes needed before parsing is attempted
        self.body: IncrementalBody | None = None
        self.info: Head | None = None


class Head:
    """What the header said, and how the body is to be handled."""

    __slots__ = ("event_args", "summary", "note", "fail", "key", "ver", "body_pos")

    def __init__(self) -> None:
        self.event_args: tuple[Any, ...] = ()
        self.summary: Summary | None = None  # None: opaque frame, body not decoded
        self.note: str | None = None
        self.fail: tuple[str, str] | None = None  # (kind, reason) when the body is bad
        self.key = -1
        self.ver = -1  # version the body is decoded with
        self.body_pos = 0


class Side:
    """One direction of the connection: where it is in the byte stream and the frame in progress."""

    __slots__ = ("direction", "offset", "opaque", "prefix", "prefix_ns", "frame", "frames")

    def __init__(self, direction: Direction) -> None:
        self.direction = direction
        self.offset = 0  # stream bytes consumed
        self.opaque = False
        self.prefix = bytearray()  # partial size prefix
        self.prefix_ns = 0
        self.frame: FrameInProgress | None = None
        self.frames = 0


def walk_failure(exc: BaseException, size: int) -> tuple[str, str]:
    """The same (kind, reason) whichever walker (plain or incremental) failed."""
    if isinstance(exc, (Over, OverflowError, IndexError, struct_error)):
        return "body_overrun", f"a declared length runs past the end of the {size - 4}-byte body"
    return "body_overrun", f"body does not decode: {exc!r}"


def end_mismatch(head: Head, end: int, size: int) -> None:
    """The walk ended before or after the frame end.

    After: a declared length overran the frame — a body failure. Before:
    trailing bytes. Real clients send these (librdkafka 2.x appends
    `01 00 00` to Metadata v13 requests) and the broker ignores them, so
    the frame keeps its summary and only gets a note; the stream stays parsed.
    """
    if end > size:
        head.fail = ("body_overrun", f"a declared length runs past the end of the {size - 4}-byte body")
    else:
        head.note = f"trailing_bytes: {size - end} bytes left over after the body decoded"
