"""Frame editing on a connection: the hook for address rewriting and Kafka-aware faults.

Why a layer of its own: the plain relay forwards chunks as they arrive and never
frames them (that is what keeps it cheap). Cluster mode must rewrite broker
addresses inside some responses, and Kafka-aware faults must answer some
requests with errors, delay or drop them. Both need whole frames, the request
each response answers, and Kafka's rule that a connection's responses come in
request order. A connection gets a `FrameEditor` only when an `Interceptor`
asks for it at accept; every other connection keeps the untouched relay.

How it frames: each direction is cut at frame boundaries as bytes arrive. Only
a frame's head is held until readable (request: api key, version, correlation
id, client id and, for Produce, acks; response: the correlation id). A frame no
interceptor wants is then streamed through chunk by chunk, so large Produce and
Fetch frames are never stored whole; a wanted frame is collected whole (up to
`MAX_EDIT_FRAME`), as the reads it came in, handed to the interceptors, and
their result is sent. An interceptor that can tell from those reads that it
will not edit the frame (`leaves_unchanged`: a Fetch response without node
endpoints) has it forwarded as the reads themselves, never joined. An
interceptor that never edits requests (`edits_requests = False`: cluster mode)
has every request chunk forwarded the moment it is read; the requests are
framed afterwards, only to pair the responses with them.

Ordering: every request that expects a response takes a place in `order`. A
response from the broker must be for `order[0]`; a response made by an
interceptor in the broker's place (`Edit.answer`) waits in `ready` until every
response before it has been sent. A delay (`Edit.delay_s`) holds its flow's
output, and everything behind it, for that long; past `QUEUE_PAUSE` queued
bytes the flow's source stops being read until the queue drains.

What it never does: change a byte nobody asked it to change. Anything that is
not Kafka framing (TLS, garbage, an oversize size prefix, a response the
connection did not ask for, the raw token exchange after a SaslHandshake v0)
turns the editor into pass-through for the rest of the connection, logged once
with the reason. The editor holds at most one frame per direction being edited
plus the queues of delayed output.

Unless relaying as is would be unsafe: an interceptor that says so
(`must_edit = True`: cluster mode, whose responses carry the brokers' own
addresses) has the connection closed instead (`EditorOutput.stop_closing`):
what the editor holds and everything read after is dropped, so no response
the editor could not rewrite reaches the client, which reconnects to a fresh
editor. Kafka faults alone keep relaying as is: an unedited frame of theirs is
a fault not injected, never a client sent around the proxy.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from struct import Struct
from time import monotonic
from typing import Any, Protocol

from protocol.apis import PRODUCE, SASL_HANDSHAKE, api_info
from protocol.errors import ProtocolError
from protocol.framing import DEFAULT_MAX_FRAME_BYTES, check_size
from protocol.headers import parse_request_header, skip_request_header_tags
from protocol.pieces import Pieces
from protocol.summaries.varint import Over, uv
from proxy.precise_timer import PreciseTimer

__all__ = ["RequestHead", "Edit", "Interceptor", "ConnInfo", "InterceptorFactory", "FrameEditor", "MAX_EDIT_FRAME",
           "QUEUE_PAUSE", "EDIT_MEMORY_BYTES", "EditMemory", "chain"]

MAX_EDIT_FRAME = 64 * 1024 * 1024  # a wanted frame larger than this is streamed unedited (and counted)
# Requests a connection has sent and the editor pairs answers with (`pending`, `order`: ~170 B each). A Kafka
# broker answers one request of a connection at a time and clients keep a handful in flight; past this many a
# client is not one (a flood into a broker that does not answer), and editing stops (cluster mode: closed).
MAX_AWAITING = 10_000
MAX_HEAD = 64 * 1024 + 512  # bytes held to read a request head (client_id, header tags, transactional_id)
HEAD_TAKE = 512  # bytes of a frame's start taken at once to read its head (most heads are under 100)
QUEUE_PAUSE = 1024 * 1024  # delayed output past which the flow's source is paused
# Wanted frames being collected, all connections of a process together: a frame is collected whole before it
# can be edited (cluster mode's Fetch v16+ / Produce v10+ responses carry their node endpoints at the end), so
# eight consumers fetching 40 MiB at once held 320 MiB. Past this, a new wanted frame's source is paused until
# earlier frames are out (first come, first served); one frame is always let through, however large.
EDIT_MEMORY_BYTES = 256 * 1024 * 1024
_I32 = Struct(">i").unpack_from
_I16 = Struct(">h").unpack_from


@dataclass(slots=True)
class RequestHead:
    """What is known of a request once its header has been read (the body is not parsed)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # frame size without the 4-byte prefix
    acks: int | None  # Produce only (0: no response will come), else None
    expects_response: bool


@dataclass(slots=True)
class Edit:
    """What an interceptor wants done with one frame; the defaults change nothing."""

    frame: bytes | None = None  # responses: the replacement frame, 4-byte size prefix included
    answer: bytes | None = None  # requests: not forwarded; this whole response frame goes to the client, in order
    delay_s: float = 0.0  # hold this frame, and what follows it on the same flow, this long
    close: bool = False  # requests: close the connection instead of forwarding; responses: after sending it
    note: str | None = None  # recorded in the request row's `edit` column


class Interceptor(Protocol):
    """One editing concern on one connection (cluster address rewriting, Kafka faults, ...)."""

    def wants_request(self, head: RequestHead) -> bool: ...

    def on_request(self, head: RequestHead, frame: bytes) -> Edit | None: ...

    def wants_response(self, head: RequestHead) -> bool: ...

    def on_response(self, head: RequestHead, frame: bytes) -> Edit | None: ...

    def closed(self) -> None: ...

    # Optional: `leaves_unchanged(head, request, data) -> bool`, asked before a wanted frame read in several
    # pieces is joined. True means on_request/on_response would return None: the pieces go on as they were
    # read, and the frame is never joined. `data` is a `protocol.pieces.Pieces` (or one buffer).
    # Optional: `edits_requests = False` (a class attribute): wants_request is always False. The editor then
    # forwards every request chunk the moment it is read and frames it afterwards (to pair the responses),
    # so the requests' own framing is off their latency path (cluster mode's address rewriting).
    # Optional: `must_edit = True` (a class attribute): a frame it wants must never go on unedited, so when
    # the editor stops framing it closes the connection rather than relay as is (cluster mode's addresses).


@dataclass(frozen=True, slots=True)
class ConnInfo:
    """The connection an interceptor factory is asked about."""

    conn_id: str
    client: tuple[str, int] | None
    listener: str
    upstream: tuple[str, int] | None  # known at accept in explicit and cluster mode


InterceptorFactory = Callable[[ConnInfo], "Interceptor | None"]


class _Chain:
    """Several interceptors as one: requests stop at the first answer/close, responses pass through each."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[Interceptor]) -> None:
        self.parts = parts

    def wants_request(self, head: RequestHead) -> bool:
        return any(p.wants_request(head) for p in self.parts)

    def on_request(self, head: RequestHead, frame: bytes) -> Edit | None:
        notes: list[str] = []
        delay = 0.0
        for p in self.parts:
            if not p.wants_request(head):
                continue
            e = p.on_request(head, frame)
            if e is None:
                continue
            if e.note:
                notes.append(e.note)
            delay += e.delay_s
            if e.answer is not None or e.close:
                return Edit(answer=e.answer, close=e.close, delay_s=delay, note="; ".join(notes) or None)
        return Edit(delay_s=delay, note="; ".join(notes)) if notes or delay else None

    @property
    def edits_requests(self) -> bool:
        return any(getattr(p, "edits_requests", True) for p in self.parts)

    @property
    def must_edit(self) -> bool:
        return any(getattr(p, "must_edit", False) for p in self.parts)

    def wants_response(self, head: RequestHead) -> bool:
        return any(p.wants_response(head) for p in self.parts)

    def on_response(self, head: RequestHead, frame: bytes) -> Edit | None:
        notes: list[str] = []
        out: bytes | None = None
        delay, close = 0.0, False
        for p in self.parts:
            if not p.wants_response(head):
                continue
            e = p.on_response(head, frame if out is None else out)
            if e is None:
                continue
            if e.frame is not None:
                out = e.frame
            if e.note:
                notes.append(e.note)
            delay += e.delay_s
            close = close or e.close
        if out is None and not notes and not delay and not close:
            return None
        return Edit(frame=out, delay_s=delay, close=close, note="; ".join(notes) or None)

    def leaves_unchanged(self, head: RequestHead, request: bool, data: Any) -> bool:
        for p in self.parts:
            if p.wants_request(head) if request else p.wants_response(head):
                check = getattr(p, "leaves_unchanged", None)
                if check is None or not check(head, request, data):
                    return False
        return True

    def closed(self) -> None:
        for p in self.parts:
            p.closed()


def chain(parts: list[Interceptor]) -> Interceptor | None:
    """None, the one interceptor, or a chain of them."""
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else _Chain(parts)


class EditorOutput(Protocol):
    """What the editor drives on its connection (proxy.connection implements it)."""

    def send(self, request: bool, data: bytes | memoryview, now_ns: int) -> None:
        """Write bytes to the flow's destination and let the observer see them."""

    def send_many(self, request: bool, pieces: list[bytes | memoryview], now_ns: int) -> None:
        """`send` of consecutive pieces, as one write (a gathered write: nothing is copied to join them)."""

    def observe_only(self, request: bool, data: bytes, now_ns: int) -> None:
        """Let the observer see bytes that go nowhere (a request answered in the broker's place)."""

    def hold(self, request: bool, on: bool, memory: bool = False) -> None:
        """Pause (on) or resume reading the flow's source: its delayed output is over the bound, or (`memory`)
        the frame it is sending waits for EditMemory."""

    def close(self, detail: str) -> None:
        """End the connection on purpose (an interceptor asked for it)."""

    def note(self, correlation_id: int, text: str) -> None:
        """Record an edit for the request row of `correlation_id`."""

    def log(self, level: str, event: str, **kw: Any) -> None: ...

    def stopped(self, reason: str) -> None:
        """Editing gave up for the rest of the connection (recorded on the connection row, counted)."""

    def stop_closing(self, reason: str) -> None:
        """Editing gave up where relaying as is is unsafe (`must_edit`): end the connection (both sides)."""

    def unedited_oversize(self, size: int) -> None:
        """A wanted frame over MAX_EDIT_FRAME went through unedited (recorded, counted)."""


_HEAD, _STREAM, _WHOLE, _PASS, _DROP = 0, 1, 2, 3, 4  # _DROP: editing stopped on a must_edit connection


class EditMemory:
    """The bytes a process's editors may hold in wanted frames at once (`EDIT_MEMORY_BYTES`), granted in order.

    A frame's size is known from its prefix, so its whole size is asked for before it is collected. A grant
    that does not fit waits in line and its source is paused (TCP pushes back on the broker); what that
    source had already read is still collected, so the bound is the limit plus about one read per waiting
    connection. A frame alone in flight is always granted, or nothing would ever move.
    """

    _per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EditMemory] = weakref.WeakKeyDictionary()

    def __init__(self, limit: int = EDIT_MEMORY_BYTES) -> None:
        self.limit = limit
        self.granted = 0
        self.line: deque[list[Any]] = deque()  # [bytes, on_grant] waiting, oldest first (on_grant None: cancelled)
        self.waits = 0  # frames that had to wait (kafkatap counts them in the editor's log)

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop) -> EditMemory:
        budget = cls._per_loop.get(loop)
        if budget is None:
            budget = cls._per_loop[loop] = cls()
        return budget

    def ask(self, n: int, on_grant: Callable[[], None]) -> list[Any] | None:
        """None: granted now. Otherwise a ticket in line; `on_grant` runs when its turn comes (`cancel` it)."""
        if not self.line and (self.granted == 0 or self.granted + n <= self.limit):
            self.granted += n
            return None
        ticket = [n, on_grant]
        self.line.append(ticket)
        self.waits += 1
        return ticket

    def give_back(self, n: int) -> None:
        self.granted -= n
        self._serve()

    def cancel(self, ticket: list[Any]) -> None:
        ticket[1] = None
        self._serve()

    def _serve(self) -> None:
        line = self.line
        while line:
            n, on_grant = line[0]
            if on_grant is None:
                line.popleft()
                continue
            if self.granted and self.granted + n > self.limit:
                return
            line.popleft()
            self.granted += n
            on_grant()


class _Side:
    """Framing state of one direction."""

    __slots__ = ("request", "mode", "buf", "pieces", "want", "size", "remaining", "head", "queue", "queued",
                 "hold_until", "holding", "timer", "after", "out", "fresh", "verbatim", "forwarded", "granted",
                 "ticket")

    def __init__(self, request: bool) -> None:
        self.request = request
        self.mode = _HEAD
        self.buf = bytearray()  # a frame's start, until its head is read
        self.pieces: list[bytes | memoryview] = []  # a wanted frame as it was read, until it is whole
        self.want = 4  # bytes wanted in `buf` before the head can be read
        self.size = -1  # the current frame's size (without the prefix), -1 until known
        self.remaining = 0  # bytes of the current frame still to stream / collect
        self.head: RequestHead | None = None  # the request the current frame is (or answers)
        self.queue: deque[tuple[bytes | memoryview, int]] | None = None  # output held by a delay
        self.queued = 0
        self.hold_until = 0.0
        self.holding = False
        self.timer: PreciseTimer | None = None
        self.after: list[Callable[[], None]] = []  # run once the held output is out (a FIN to propagate)
        self.out: list[bytes | memoryview] = []  # output of the current `feed`, written as one chunk at its end
        self.fresh = True  # no frame yet: the first size prefix is also checked for TLS / HTTP
        self.verbatim = False  # during a feed: every piece in `out` is the chunk's own bytes, in order
        self.forwarded = False  # requests nobody edits: each chunk is sent as read, framing only follows it
        self.granted = 0  # bytes of EditMemory held for the wanted frame being collected
        self.ticket: list[Any] | None = None  # waiting in EditMemory's line (the source is paused meanwhile)


class FrameEditor:
    """Cuts both directions of one connection into frames and lets an interceptor edit them."""

    def __init__(self, interceptor: Interceptor, out: EditorOutput, loop: asyncio.AbstractEventLoop,
                 clock: Callable[[], int], max_frame: int = DEFAULT_MAX_FRAME_BYTES,
                 memory: EditMemory | None = None) -> None:
        self.interceptor = interceptor
        self.memory = memory if memory is not None else EditMemory.for_loop(loop)
        self._leaves: Callable[[RequestHead, bool, Any], bool] | None = getattr(interceptor, "leaves_unchanged", None)
        self.out = out
        self.loop = loop
        self.clock = clock
        self.max_frame = max_frame
        self.req = _Side(True)
        self.resp = _Side(False)
        self.req.forwarded = not getattr(interceptor, "edits_requests", True)
        self.must_edit = bool(getattr(interceptor, "must_edit", False))  # giving up closes instead of relaying
        self.pending: dict[int, RequestHead] = {}  # correlation id -> request awaiting its response
        self.order: deque[int] = deque()  # correlation ids in the order their responses must go out
        self.ready: dict[int, tuple[bytes, float]] = {}  # answers made here (frame, delay), waiting for their turn
        self.passing = False  # pass-through for the rest of the connection
        self.pass_reason: str | None = None
        self.oversize = 0  # wanted frames too large to edit, streamed as they were
        self.edited = 0
        self._closing = False

    # ------------------------------------------------------------------ input
    def feed(self, request: bool, data: bytes, now_ns: int) -> None:
        """Bytes read from the client (request=True) or from the broker.

        What a chunk yields is written as one chunk (one `transport.write`, one
        observer feed), however many frames it held: a chunk of 100 pipelined
        small requests must not become 100 system calls.
        """
        side = self.req if request else self.resp
        if side.mode == _DROP:
            return  # editing stopped where relaying as is is unsafe: the connection is being closed
        if side.forwarded:
            # requests nobody edits go on as read; framing them afterwards only pairs the responses
            self.out.send(True, data, now_ns)
            if side.mode == _PASS:
                return
            if side.mode == _STREAM and side.remaining > len(data):
                side.remaining -= len(data)
                return
            self._feed(side, data, now_ns)
            if self.resp.out:  # a request that stops framing (`_pass`) hands on a held response's reads
                self._flush_out(self.resp, now_ns)
            return
        if side.queue is None and (side.mode == _PASS or side.mode == _STREAM and side.remaining > len(data)):
            # the common chunk: the middle of a frame nobody wants (or a connection given up on) goes on as
            # it came, with no framing calls (reads of a big Fetch response are often only a few KiB each)
            if side.mode == _STREAM:
                side.remaining -= len(data)
            self.out.send(request, data, now_ns)
            return
        # nothing of an earlier chunk is held: if the feed hands on all of this chunk unchanged, it goes
        # on as the chunk itself (one write, one observer feed) rather than as the views framing cut it in
        side.verbatim = side.queue is None and not side.buf and side.mode != _WHOLE
        self._feed(side, data, now_ns)
        if side.verbatim and len(side.out) > 1 and sum(map(len, side.out)) == len(data):
            side.out = [data]
        side.verbatim = False
        for side in (self.req, self.resp):  # a request answered here emits on the response side
            if side.out:
                self._flush_out(side, now_ns)

    def _flush_out(self, side: _Side, now_ns: int) -> None:
        """Write what a feed produced as one gathered write.

        Joining the pieces of a 256 KiB read into one buffer cost more than the framing itself (a
        copy into fresh pages for every large allocation); large pieces are views of the read, and
        the transport writes all pieces with one system call.
        """
        pieces, side.out = side.out, []
        side.verbatim = False  # written mid-feed: `out` no longer holds the whole chunk
        self._write(side, pieces, now_ns)

    def _write(self, side: _Side, pieces: list[bytes | memoryview], now_ns: int) -> None:
        """One piece as it is, several as one gathered write."""
        if len(pieces) == 1:
            self.out.send(side.request, pieces[0], now_ns)
        else:
            self.out.send_many(side.request, pieces, now_ns)

    def _feed(self, side: _Side, data: bytes, now_ns: int) -> None:
        n = len(data)
        i = 0
        mv: memoryview | None = None
        while i < n:
            mode = side.mode
            if mode == _PASS:
                self._emit(side, data if i == 0 else memoryview(data)[i:], now_ns)
                return
            if mode == _DROP:
                return
            if mode == _STREAM:
                k = min(side.remaining, n - i)
                if i == 0 and k == n:
                    self._emit(side, data, now_ns)
                else:
                    mv = mv or memoryview(data)
                    self._emit(side, mv[i:i + k], now_ns)  # a view: the gathered write copies nothing
                side.remaining -= k
                i += k
                if side.remaining == 0:
                    self._frame_end(side, now_ns)
                continue
            mv = mv or memoryview(data)
            if mode == _WHOLE:
                k = min(side.remaining, n - i)
                side.pieces.append(data if k == n else mv[i:i + k])  # the read itself or a view: no copy
                side.remaining -= k
                i += k
                if side.remaining == 0:
                    self._collected(side, now_ns)
                continue
            # _HEAD: collect at least `want` bytes, then try to read the head. Once the size is known, take
            # as much of the frame's start as this chunk holds (up to HEAD_TAKE): one parse then finds the
            # whole head, where growing `want` field by field cost a parse per field (5 for a Produce)
            buf = side.buf
            if side.size < 0 and not buf and n - i >= 4:  # the size prefix is whole here: read it at once
                if not self._take_size(side, bytes(mv[i:i + 4])):
                    continue  # not Kafka framing: passing from here on
            target = side.want if side.size < 0 else max(side.want, min(side.size + 4, HEAD_TAKE))
            k = min(target - len(buf), n - i)
            buf += mv[i:i + k]
            i += k
            if len(buf) >= side.want:
                self._try_head(side, now_ns)

    def _try_head(self, side: _Side, now_ns: int) -> None:
        buf = side.buf
        if side.size < 0:
            if not self._take_size(side, bytes(buf[:4])) or len(buf) < side.want:
                return
        total = side.size + 4
        if side.request:
            try:
                head = self._request_head(buf, side.size)
            except Over as more:  # collect exactly what the head still needs, never more than MAX_HEAD
                need = max(more.need, len(buf) + 1)
                if need > min(total, MAX_HEAD):
                    self._pass(f"request header does not fit its frame or {MAX_HEAD} bytes")
                    return
                side.want = need
                return
            except (ValueError, ProtocolError) as exc:  # e.g. a tag varint longer than five bytes
                self._pass(f"unreadable request header: {exc}")
                return
            self._request_started(side, head, now_ns)
        else:
            if total < 8:
                self._pass(f"response frame of {side.size} bytes has no correlation id")
                return
            cid = _I32(buf, 4)[0]
            head = self.pending.pop(cid, None)
            if head is None or not self.order or self.order[0] != cid:
                self._pass(f"response correlation id {cid} does not answer the oldest request "
                           f"({self.order[0] if self.order else 'none'} expected)")
                return
            self._response_started(side, head, now_ns)

    def _take_size(self, side: _Side, first: bytes) -> bool:
        """Read a frame's size prefix; False (and pass-through from here on) when it cannot start a Kafka frame.

        TLS/HTTP signatures are looked for at the stream's start only, as the decoder does: later, a
        size prefix that is not a legal size is refused by its value alone.
        """
        size = _I32(first, 0)[0]
        bad = check_size(first, size, 0 if side.fresh else 1, self.max_frame)
        if bad is not None:
            self._pass(bad[1])
            return False
        side.fresh = False
        side.size = size
        side.want = min(size + 4, 14 if side.request else 8)  # the fixed part of the header
        return True

    def _request_head(self, buf: bytearray, size: int) -> RequestHead:
        lim = len(buf)
        key, ver, cid, client_id, p = parse_request_header(buf, 4, lim)
        acks = None
        if key == PRODUCE:
            acks = _produce_acks(buf, p, lim, key, ver)
        return RequestHead(key, ver, cid, client_id, size, acks, acks != 0)

    def _request_started(self, side: _Side, head: RequestHead, now_ns: int) -> None:
        side.head = head
        if head.expects_response:
            if head.correlation_id in self.pending:
                self._pass(f"correlation id {head.correlation_id} reused while its request is unanswered")
                return
            if len(self.order) >= MAX_AWAITING:
                self._pass(f"more than {MAX_AWAITING} requests waiting for their answers")
                return
            self.pending[head.correlation_id] = head
            self.order.append(head.correlation_id)
        self._start_frame(side, self.interceptor.wants_request(head), now_ns)

    def _response_started(self, side: _Side, head: RequestHead, now_ns: int) -> None:
        side.head = head
        self._start_frame(side, self.interceptor.wants_response(head), now_ns)

    def _start_frame(self, side: _Side, wanted: bool, now_ns: int) -> None:
        total = side.size + 4
        if wanted and total > MAX_EDIT_FRAME:
            self.oversize += 1
            if self.oversize == 1:
                self.out.log("warning", "frame too large to edit, forwarded unedited", size=total, bound=MAX_EDIT_FRAME)
            self.out.unedited_oversize(total)
            wanted = False
        if wanted:
            side.mode = _WHOLE
            side.remaining = total - len(side.buf)
            side.pieces = [bytes(side.buf)]
            side.buf.clear()
            if side.remaining == 0:
                self._collected(side, now_ns)
                return
            self._ask_memory(side, total)
            return
        data = bytes(side.buf)
        side.buf.clear()
        side.remaining = total - len(data)
        side.mode = _STREAM
        self._emit(side, data, now_ns)
        if side.remaining == 0:
            self._frame_end(side, now_ns)

    def _frame_end(self, side: _Side, now_ns: int) -> None:
        """The current frame is wholly handed on: get ready for the next head."""
        head = side.head
        side.mode = _HEAD
        side.want = 4
        side.size = -1
        side.head = None
        if not side.request:
            self.order.popleft()
            self._flush_ready(now_ns)
        elif head is not None and head.api_key == SASL_HANDSHAKE and head.api_version == 0:
            # v0: the SASL tokens that follow are raw bytes, not Kafka frames
            self._pass("SaslHandshake v0: the authentication bytes that follow are not framed")

    # ------------------------------------------------------------------ the memory wanted frames hold
    def _ask_memory(self, side: _Side, total: int) -> None:
        """Hold `total` bytes of the process's EditMemory for this frame, or pause its source until granted."""

        def granted() -> None:
            side.ticket = None
            side.granted = total
            self.out.hold(side.request, False, memory=True)

        side.ticket = self.memory.ask(total, granted)
        if side.ticket is None:
            side.granted = total
            return
        if self.memory.waits == 1 or self.memory.waits % 1000 == 0:
            self.out.log("info", "frames to edit are over their memory bound; reading waits for earlier frames",
                         bound=self.memory.limit, held=self.memory.granted, waited_total=self.memory.waits)
        self.out.hold(side.request, True, memory=True)

    def _give_back(self, side: _Side) -> None:
        """The side's frame is out (or never will be): its memory goes to the next frame in line."""
        if side.ticket is not None:
            self.memory.cancel(side.ticket)
            side.ticket = None
            self.out.hold(side.request, False, memory=True)
        if side.granted:
            n, side.granted = side.granted, 0
            self.memory.give_back(n)

    # ------------------------------------------------------------------ whole frames
    def _collected(self, side: _Side, now_ns: int) -> None:
        """A wanted frame is whole. Joined into one buffer only if an interceptor may edit it.

        Collecting a large frame into a growing buffer and taking bytes of it cost two copies of every
        byte into fresh pages: a quarter of cluster mode's CPU on Fetch responses, which are almost
        never edited (their node endpoints come only when a leader moved). An interceptor that can
        tell from the pieces that it will leave the frame alone spares both.
        """
        pieces, side.pieces = side.pieces, []
        self._give_back(side)  # the frame is whole: what it holds now goes out below, whatever the edit
        head = side.head
        assert head is not None
        if len(pieces) > 1 and self._leaves is not None:
            try:
                unchanged = self._leaves(head, side.request, Pieces(pieces))
            except Exception as exc:  # an interceptor must never break the relay
                self._interceptor_failed(exc)
                unchanged = False
            if unchanged:
                for piece in pieces:
                    self._emit(side, piece, now_ns)
                self._frame_end(side, now_ns)
                return
        # a frame in one piece is the bytes of its head, taken whole: handed over as they are
        self._whole(side, pieces[0] if len(pieces) == 1 else b"".join(pieces), now_ns)

    def _whole(self, side: _Side, frame: bytes, now_ns: int) -> None:
        head = side.head
        assert head is not None
        if side.request:
            try:
                edit = self.interceptor.on_request(head, frame)
            except Exception as exc:  # an interceptor must never break the relay
                self._interceptor_failed(exc)
                edit = None
            self._apply_request(side, head, frame, edit, now_ns)
        else:
            try:
                edit = self.interceptor.on_response(head, frame)
            except Exception as exc:
                self._interceptor_failed(exc)
                edit = None
            self._apply_response(side, head, frame, edit, now_ns)

    def _apply_request(self, side: _Side, head: RequestHead, frame: bytes, edit: Edit | None, now_ns: int) -> None:
        if edit is None:
            self._emit(side, frame, now_ns)
            self._frame_end(side, now_ns)
            return
        side.verbatim = False
        if edit.note:
            self.out.note(head.correlation_id, edit.note)
        self.edited += 1
        if (edit.close or edit.answer is not None) and side.out:
            self._flush_out(side, now_ns)  # the observer sees requests in the order the client sent them
        if edit.close:
            self.out.observe_only(True, frame, now_ns)
            self._frame_end(side, now_ns)
            self._close(edit.note or f"connection closed on api {head.api_key} (fault)")
            return
        if edit.answer is not None:
            self.out.observe_only(True, frame, now_ns)
            self._frame_end(side, now_ns)
            if head.expects_response:
                cid = head.correlation_id
                self.pending.pop(cid, None)
                self.ready[cid] = (edit.answer, edit.delay_s)
                self._flush_ready(now_ns)
            return
        if edit.delay_s > 0:
            self._delay(side, edit.delay_s)
        self._emit(side, frame, now_ns)
        self._frame_end(side, now_ns)

    def _apply_response(self, side: _Side, head: RequestHead, frame: bytes, edit: Edit | None, now_ns: int) -> None:
        if edit is not None:
            side.verbatim = False
            if edit.note:
                self.out.note(head.correlation_id, edit.note)
            self.edited += 1
            if edit.frame is not None:
                frame = edit.frame
            if edit.delay_s > 0:
                self._delay(side, edit.delay_s)
        self._emit(side, frame, now_ns)
        self._frame_end(side, now_ns)
        if edit is not None and edit.close:
            self._close(edit.note or f"connection closed after a response to api {head.api_key} (fault)")

    def _flush_ready(self, now_ns: int) -> None:
        """Send the answers made here whose turn has come (every earlier response is out).

        Called when an answer is made and when a broker response ends. Between
        frames (`_HEAD`: nothing of the next broker response has been handed on
        yet) an answer at the front of `order` can go out at once; a delay asked
        with it holds it, and everything after it, from that moment on.
        """
        if self.resp.mode != _HEAD:
            return  # a broker response is being handed on: answers wait for its end
        order, ready = self.order, self.ready
        while order and order[0] in ready:
            self.resp.verbatim = False
            answer, delay = ready.pop(order.popleft())
            if delay > 0:
                self._delay(self.resp, delay)
            self._emit(self.resp, answer, now_ns)

    # ------------------------------------------------------------------ output, delays
    def _emit(self, side: _Side, data: bytes | memoryview, now_ns: int) -> None:
        if not data or side.forwarded:  # (forwarded: these bytes were sent when they were read)
            return
        if side.queue is not None:
            side.queue.append((data, now_ns))
            side.queued += len(data)
            if side.queued > QUEUE_PAUSE and not side.holding:
                side.holding = True
                self.out.hold(side.request, True)
            return
        side.out.append(data)

    def _delay(self, side: _Side, seconds: float) -> None:
        """Hold this flow's output (the frame about to be emitted and all after it) for `seconds`.

        The deadline is on the precise monotonic clock (the one row times come from), not the loop's
        (`proxy.precise_timer` says why): a hold never ends early.
        """
        until = monotonic() + seconds
        if side.queue is None:
            if side.out:  # what came before the delayed frame goes now
                self._flush_out(side, self.clock())
            side.queue = deque()
        if until > side.hold_until:
            side.hold_until = until
            if side.timer is not None:
                side.timer.cancel()
            side.timer = PreciseTimer(self.loop, until, lambda: self._release(side))

    def _release(self, side: _Side) -> None:
        side.timer = None
        q, side.queue = side.queue, None
        side.queued = 0
        # Each piece goes to the observer with the time it was read, not now: the held time is the proxy's
        # (req_sent / resp_sent, stamped at the write), so a `delay=` shows as proxy_resp_delay_us and a
        # throttle's pause as proxy_req_delay_us, never as broker latency — as a TCP `latency=` fault does.
        while q:
            read_ns = q[0][1]
            pieces: list[bytes | memoryview] = []
            while q and q[0][1] == read_ns:
                pieces.append(q.popleft()[0])
            self._write(side, pieces, read_ns)
        if side.holding:
            side.holding = False
            self.out.hold(side.request, False)
        after, side.after = side.after, []
        for fn in after:
            fn()

    def after_release(self, request: bool, fn: Callable[[], None]) -> bool:
        """Run `fn` once the flow's delayed output is out; False (not deferred) when nothing is held."""
        side = self.req if request else self.resp
        if side.queue is None:
            return False
        side.after.append(fn)
        return True

    @property
    def queued(self) -> bool:
        """Output is held by a delay (half-close and close wait for it)."""
        return self.req.queue is not None or self.resp.queue is not None

    # ------------------------------------------------------------------ giving up, ending
    def _pass(self, reason: str) -> None:
        """Stop framing: everything from here on (and what is held) is forwarded as it is."""
        if self.passing:
            return
        self.req.verbatim = self.resp.verbatim = False
        self.passing = True
        self.pass_reason = reason
        self.out.stopped(reason)
        if self.must_edit:
            self._drop_and_close(reason)
            return
        self.out.log("warning", "editing stopped, relaying as is", reason=reason)
        now = self.clock()
        lost = 0
        if self.ready:  # answers made here: they can still go out if no broker response is half sent
            if self.resp.mode == _HEAD:
                for cid in list(self.order):
                    if cid in self.ready:
                        self._emit(self.resp, self.ready.pop(cid)[0], now)
            lost = len(self.ready)
            self.ready.clear()
        if lost:
            self.out.log("warning", "answers made by the proxy dropped: their place in the stream is lost", count=lost)
        for side in (self.req, self.resp):
            self._hand_on_held(side, now)
        self.order.clear()
        self.pending.clear()

    def _drop_and_close(self, reason: str) -> None:
        """Stop framing on a `must_edit` connection: nothing more goes on (what either side holds of an unfinished
        frame, what it reads from now on, answers made here), then the connection is closed.

        Relaying as is would hand the client every later response unrewritten: a broker's own address, and
        the client's traffic around the proxy, unrecorded. Frames handed on before the stop are whole and were
        edited, so they still go out before the close; a request chunk already written when its framing failed
        (cluster mode writes requests as read) is answered into the void. The client reconnects to a fresh editor.
        """
        self.out.log("warning", "editing stopped, connection closed: relaying as is could send the client a "
                     "broker's own address", reason=reason)
        for side in (self.req, self.resp):
            side.pieces = []
            side.buf.clear()
            side.mode = _DROP
            self._give_back(side)
        self.ready.clear()
        self.order.clear()
        self.pending.clear()
        self._close(reason, unsafe=True)

    def _hand_on_held(self, side: _Side, now_ns: int) -> None:
        """Stop framing `side`: what it holds of an unfinished frame (a wanted frame's reads, or a head) goes on
        as it was read, and the memory that frame held is given back."""
        held = [*side.pieces, bytes(side.buf)]
        side.pieces = []
        side.buf.clear()
        side.mode = _PASS
        self._give_back(side)
        for piece in held:
            self._emit(side, piece, now_ns)  # (an empty piece is skipped)

    def source_ended(self, request: bool) -> None:
        """One direction's source sent FIN: the frame it left unfinished never will be, so what is held of it
        (a head being read, a wanted frame being collected) goes on as it was read, before the FIN.

        A relay without an editor forwards those bytes; holding them back would make cluster mode change
        the stream it exists to leave alone (a broker's last, cut-off response would never reach the client).
        """
        side = self.req if request else self.resp
        if side.mode == _DROP:
            return  # closing: what it holds is not handed on
        now = self.clock()
        self._hand_on_held(side, now)  # nothing more comes from this source
        if side.out:
            self._flush_out(side, now)

    def _interceptor_failed(self, exc: BaseException) -> None:
        self.out.log("error", "interceptor failed, frame forwarded unedited", error=repr(exc))

    def _close(self, detail: str, unsafe: bool = False) -> None:
        """End the connection once what was handed on is out: an interceptor asked (a fault), or (`unsafe`)
        editing stopped where relaying as is is not allowed."""
        for side in (self.req, self.resp):  # what was handed on before the close goes out first
            if side.out:
                self._flush_out(side, self.clock())
        if not self._closing:
            self._closing = True
            if unsafe:
                self.out.stop_closing(detail)
            else:
                self.out.close(detail)

    def closed(self) -> None:
        """The connection ended: cancel timers, give back held memory, release the interceptor's state."""
        for side in (self.req, self.resp):
            if side.timer is not None:
                side.timer.cancel()
                side.timer = None
            side.pieces = []
            self._give_back(side)
        try:
            self.interceptor.closed()
        except Exception as exc:
            self._interceptor_failed(exc)


def _produce_acks(d: Any, p: int, lim: int, key: int, ver: int) -> int:
    """Produce acks from a request prefix (`p`: after client_id). Raises Over when more bytes are needed."""
    p = skip_request_header_tags(d, p, lim, key, ver)
    if ver >= 3:
        info = api_info(PRODUCE)
        if info is not None and info.flexible(ver):
            n, p = uv(d, p, lim)
            p += max(0, n - 1)
        else:
            if p + 2 > lim:
                raise Over(p + 2)
            p += 2 + max(0, _I16(d, p)[0])
    if p + 2 > lim:
        raise Over(p + 2)
    return _I16(d, p)[0]
