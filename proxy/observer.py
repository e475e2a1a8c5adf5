"""Observe one connection's forwarded bytes: decoder events → connection facts and request rows.

Why it is apart from the relay: this is everything the proxy learns from the
bytes, and none of it needs a socket. The relay forwards a chunk first and
then hands the same chunk here with its read time; the relay also reports
when bytes reached the kernel (`proxy.timing.SendStamps`), which is what the
"sent" timestamps come from. Tests drive an `Observer` with bytes, clocks and
stamps alone.

Failure rule: the decoder must never break the relay. Any exception raised
while observing makes the connection opaque (`decoder_failed`), is logged
once, and the relay keeps forwarding.

Fairness (issue 19): decoding runs on the event loop, so one connection
pipelining tiny frames could keep the loop busy decoding and starve every
other connection's *forwarding*. Observation is therefore budgeted per loop
turn by one `ObserveScheduler` per loop: a chunk of at most `SLICE_FRAMES_MAX`
frames is decoded at once while the turn's budget lasts (`TURN_NS` of
decoding, and at most `TURN_BUDGET` units: one per frame decoded, one per chunk
or slice) and no backlog is queued for that connection; otherwise the chunk is
queued (what the read earned is decoded at once) and the scheduler decodes the
queues round-robin, one slice at a time, 30 µs per waiting connection per
`loop.call_soon` turn, so I/O callbacks (forwarding) run between turns. A slice
is a number of whole frames (`KafkaStream.frames_end` reads only their size
prefixes): 4 while few connections wait, so a lone flood holds the loop for
about four tiny frames at a time, and up to 16 when many wait (the turn is long
then anyway, and fewer slices cost less). Large Produce/Fetch frames (mostly
skipped bytes) are decoded a chunk at a time. While a connection's observation is
behind, its `SendStamps` keep flush marks so "sent" times stay those of the
flush, not of the late decode. Bound: a connection whose queued observation
exceeds `MAX_BACKLOG_BYTES` (16 MiB) stops being observed (kind
`observation_backlog`, the bytes counted as skipped, its requests in flight
counted as dropped) — the relay is never slowed to decode.

Small reads linger (`LINGER_S`): a chunk of at most `LINGER_CHUNK_MAX` bytes is queued as if
behind, and the loop's scheduler decodes every such chunk in one batch a few ms later, through the
same turns; a lone small frame decoded cold costs several times what it costs in a batch (the
constants below say how much). Shutdown's last resort (`hurry`) decodes what is still queued.

Closing a connection with up to `max_in_flight` (10,000) unanswered requests
builds their rows the same way, a turn's budget at a time, and the
connection row follows the last of them.

Accounting: every request the decoder reports gets exactly one row or is
counted in `ConnectionFacts.dropped` with its reason, so requests seen ==
rows + drops for every connection.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from time import perf_counter_ns
from typing import Any, Protocol

from protocol.apis import API_VERSIONS, CLUSTER_ID_APIS, PRODUCE, SASL_AUTHENTICATE, SASL_HANDSHAKE, TOPIC_PAIR_APIS
from protocol.events import Direction, RequestDropped, RequestSeen, ResponseSeen, StreamClosed, StreamOpaque
from proxy import rows
from proxy.capture import FrameCapture
from proxy.facts import KAFKA_4_OLDEST, REMOVED_KEPT, ConnectionFacts
from proxy.inference import request_cause
from proxy.timing import SendStamps

Log = Callable[..., None]  # log(level, event, **fields), bound to the connection
MAX_CLIENT_IDS = 16  # distinct client_id values kept per connection
# Answers the proxy learns from (cluster id, topic id ↔ name pairs) before their row is built
LEARNED_FROM = CLUSTER_ID_APIS | TOPIC_PAIR_APIS


def _note_removed(f: ConnectionFacts, ev: RequestSeen) -> None:
    """Name a request version Kafka 4.0 removed (KIP-896) on its connection, once per API version: the connection's row
    says which a client would have to stop sending before its brokers move to 4.x (the analysis's upgrade check)."""
    label = f"{ev.api_name} v{ev.api_version}"
    if label not in f.removed_in_kafka_4 and len(f.removed_in_kafka_4) < REMOVED_KEPT:
        f.removed_in_kafka_4.append(label)
    if f.removed_first_ns is None:
        f.removed_first_ns = ev.last_byte_ns


# What one loop turn may spend decoding, and how much of a queued chunk one slice decodes. Another
# connection waits for about one turn plus one slice of this work. A tiny pipelined frame costs ~10-15 µs
# to decode, pair and row, so a budget counted in frames alone was either long for tiny frames (128 units
# and 1 KiB slices held a ping beside a flood the decoder keeps up with for 2-4 ms at the median,
# bench/hostile.py) or short for large ones (64 units let a 1 GiB full-speed stream of large frames fall
# behind the relay, tests/proxy/test_bytes.py). A turn is therefore bounded by time (`TURN_NS`), checked
# after each slice, and a slice is a count of whole frames; the unit cap stays as a bound on rows per turn. A turn
# lasts `TURN_NS` per connection waiting in it (at most `TURN_MAX_NS`): each busy connection gets about 30 µs
# of decoding per loop iteration, round-robin, so one flood holds another connection for ~30 µs while 16
# busy, legitimate connections still get ~480 µs (a turn of 30 µs in all decoded ~13k of 20k requests/s
# pipelined on 16 connections, `bench/workers.py --rate 20000`, bench/RESULTS.md). A slice is
# whole frames, twice the connections waiting, at least 4, at most 16 (`SLICE_FRAMES_*`): what a ping beside a
# lone flood waits for is one slice (byte-sized slices of 4-16 frames held it up to ~160 µs and missed
# the 2x p99 target, bench/hostile.py), while many busy connections, which already make a long turn, pay
# the per-slice overhead less often (fixed 4-frame slices decoded ~8 % less of that 20k load).
# Forwarding itself is not budgeted (libuv reads up to 8 MiB per socket per loop iteration), so a chunk
# that has to queue also earns decoding time where it is read: 1 ns per 2**`CREDIT_SHIFT` bytes (32 µs
# per 256 KiB read), about an eighth of what forwarding it cost. That keeps up with large frames at full
# speed (a 256 KiB slice of a large frame decodes in ~4 µs), while a flood of tiny frames (~10 µs each)
# falls behind and, past `MAX_BACKLOG_BYTES`, goes opaque, counted, instead of delaying every other
# connection.
TURN_NS = 30_000
CREDIT_SHIFT = 3
TURN_MAX_NS = 1_000_000
TURN_BUDGET = 128
SLICE_FRAMES_MIN, SLICE_FRAMES_MAX = 4, 16  # whole frames per slice of a queued chunk
UNANSWERED_STEP = 16  # rows of requests left unanswered at close built per step of a turn
# Queued, not yet decoded bytes per connection before it goes opaque. libuv reads up to 32 × 256 KiB from
# one socket per loop iteration, so the bound must hold a few such bursts of cheap (large) frames.
MAX_BACKLOG_BYTES = 16 << 20

# Lingering (issue 16, the added p50). A small chunk is not decoded in the read callback that forwarded it: it
# waits, queued like a backlog, for a batch that the scheduler decodes from a turn LINGER_S later (from the next
# turn when LINGER_BATCH chunks wait), a turn's budget at a time. Why: decoding one small frame on its own is cold
# work. At the latency probe's sparse rate a ~200-byte Produce request took ~44 µs to observe and its answer
# ~50 µs (scratch timing around `feed`), where the same decode takes ~8 µs in a loop (bench/parse.py), and that
# work evicted the relay's own code and data from the caches, so the next forward ran cold too. Deferring each
# chunk alone by 3 ms changed nothing; decoding them ~8 at a time cut the observe cost to ~9-13 µs a frame, and
# the p50 that decoding and recording add over the bare relay from ~55-60 µs to ~20 (bench/latency_split.py,
# bench/RESULTS.md, thirty-second session; the sixteenth session's throwaway version flushed each batch in one
# callback). Rows, live stats and log lines come about LINGER_S later; their timestamps are the reads' and flushes'
# own (the flush marks of `proxy.timing`). Large chunks (mostly record bytes skipped by length) gain nothing from
# a batch and are decoded at once as before, and so is everything of a connection gone opaque.
LINGER_S = 0.010
LINGER_CHUNK_MAX = 16 << 10  # chunks up to this size may linger
LINGER_BATCH = 64  # lingering chunks (all connections of the loop) that make the batch's turn run at once
# A loop that reads more than LINGER_BATCH small chunks within LINGER_S has its batches without waiting: its decodes
# are warm, and queueing every chunk only adds work (a queue entry, flush marks, a step per chunk). Such a loop decodes
# at once, as before lingering, for BUSY_NS, then looks again. (`bench/workers.py --capacity`, thirty-second session:
# two workers sustained 28,992 and 30,518 requests/s with every small read queued, 31,471 and 30,518 with this rule,
# last session 32,425-34,332: within this machine's noise either way.)
BUSY_NS = 1_000_000_000
HURRY_NS = 200_000_000  # shutdown's last resort decodes what every connection has queued for this long in all, then skips


def hurry_deadline() -> int:
    """The time (perf_counter_ns) until which a forced stop decodes queued chunks: HURRY_NS from now."""
    return perf_counter_ns() + HURRY_NS


class ObserveScheduler:
    """One per event loop: the decode budget of the current turn and the observers waiting for theirs."""

    _per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ObserveScheduler] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop, linger_s: float = 0.0) -> None:
        """`linger_s` 0: every chunk is decoded as soon as the budget allows (unit tests of the budget); the
        proxy's scheduler (`for_loop`) lets small chunks linger LINGER_S for a batch."""
        self.loop = loop
        self.used = 0  # units spent in this turn
        self.until = 0  # perf_counter_ns() at which this turn's decoding time is spent
        self.ready: deque[Observer] = deque()
        self.scheduled = False  # a turn is due at the loop's next iteration (call_soon)
        self.linger_s = linger_s
        self.lingering = 0  # small chunks queued for the batch since the last turn
        self._linger_timer: asyncio.TimerHandle | None = None
        self._window_ns = int(linger_s * 1e9)  # the rate check: small chunks seen since `_window_start`
        self._window_start = 0
        self._window_chunks = 0
        self.busy_until = 0  # perf_counter_ns() until which small chunks are decoded at once (BUSY_NS)

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop) -> ObserveScheduler:
        s = cls._per_loop.get(loop)
        if s is None:
            s = cls._per_loop[loop] = cls(loop, LINGER_S)
        return s

    def lingers(self, nbytes: int) -> bool:
        """A chunk of `nbytes` waits for the batch instead of being decoded in its read callback: a small one, unless
        the loop is busy (more than LINGER_BATCH small chunks within LINGER_S; then none for BUSY_NS)."""
        if self.linger_s <= 0 or nbytes > LINGER_CHUNK_MAX:
            return False
        now = perf_counter_ns()
        if now < self.busy_until:
            return False
        if now - self._window_start > self._window_ns:
            self._window_start, self._window_chunks = now, 0
        self._window_chunks += 1
        if self._window_chunks > LINGER_BATCH:
            self.busy_until = now + BUSY_NS
            return False
        return True

    def linger(self, obs: Observer) -> None:
        """`obs` queued a small chunk: decode it with the batch, in a turn LINGER_S from the first one (or now,
        when a turn is due anyway or the batch is full)."""
        self.lingering += 1
        if not obs.waiting:
            obs.waiting = True
            self.ready.append(obs)
        if self.scheduled:
            return
        if self.lingering >= LINGER_BATCH:
            self._soon()
        elif self._linger_timer is None:
            self._linger_timer = self.loop.call_later(self.linger_s, self._linger_due)

    def _linger_due(self) -> None:
        self._linger_timer = None
        if not self.scheduled:
            self.scheduled = True
            self._turn()

    def _soon(self) -> None:
        self.scheduled = True
        self.loop.call_soon(self._turn)

    def spend_all(self) -> None:
        """Use up this turn's budget (tests: what a busy turn looks like)."""
        self.used = TURN_BUDGET
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._turn)

    def over(self) -> bool:
        """This turn's budget (time or units) is spent."""
        return self.used >= TURN_BUDGET or perf_counter_ns() >= self.until

    def may_decode_now(self) -> bool:
        """A chunk may be decoded in this I/O callback: the turn has budget left, or no turn is pending and
        the last one's window has passed (an idle loop: a new window opens here)."""
        if self.used >= TURN_BUDGET:
            return False
        now = perf_counter_ns()
        if now < self.until:
            return True
        if self.scheduled:  # spent in this loop iteration: the pending turn opens the next window
            return False
        self.until = now + TURN_NS
        return True

    def wait(self, obs: Observer) -> None:
        """`obs` has queued work: give it slices round-robin from the next turn on (queued once, however often
        asked; a lingering batch it is part of is then decoded from the next turn too)."""
        if not obs.waiting:
            obs.waiting = True
            self.ready.append(obs)
        if not self.scheduled:
            self._soon()

    def _turn(self) -> None:
        self.lingering = 0  # this turn serves every queued chunk, the lingering ones too
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        self.used = 0
        self.until = perf_counter_ns() + min(TURN_NS * max(1, len(self.ready)), TURN_MAX_NS)
        ready = self.ready
        while ready and not self.over():
            obs = ready.popleft()
            if obs.guarded_step():
                ready.append(obs)
            else:
                obs.waiting = False
        if ready or self.over():
            self.loop.call_soon(self._turn)
        else:
            self.scheduled = False


class RowEmitter(Protocol):
    def request(self, row: dict[str, Any]) -> None: ...

    def frame(self, row: dict[str, Any]) -> None: ...


class Observer:
    """Feeds one connection's two directions to a `KafkaStream` and records what it reports."""

    def __init__(self, stream: Any, facts: ConnectionFacts, requests_sent: SendStamps, responses_sent: SendStamps,
                 emit: RowEmitter, log: Log, *, capture: str = "none", log_requests: bool = False,
                 on_quiet: Callable[[], None] = lambda: None, scheduler: ObserveScheduler | None = None,
                 on_cluster: Callable[[str], None] | None = None,
                 on_topics: Callable[[list[tuple[bytes, str]]], None] | None = None) -> None:
        """`on_cluster(cluster_id)`: called once, with the first cluster id a relayed response carries.
        `on_topics(pairs)`: called with the (16-byte topic id, name) pairs of each response that carries some."""
        self.stream = stream
        self.facts = facts
        self._req_stamps = requests_sent
        self._resp_stamps = responses_sent
        self._emit = emit
        self._log = log
        self._log_requests = log_requests
        self._on_quiet = on_quiet
        self._on_cluster = on_cluster  # None once told: the broker's cluster does not change under a connection
        self._on_topics = on_topics
        # request → when its last byte reached the kernel (filled by the stamps)
        self._sent_at: dict[int, int] = {}
        self._cap_req: FrameCapture | None = FrameCapture() if capture in ("requests", "all") else None
        self._cap_resp: FrameCapture | None = FrameCapture() if capture == "all" else None
        self._no_schema_logged = False  # an API/version no schema describes: logged once per connection
        self._orphan_responses = 0
        # None: observe every chunk at once (tests, replay). Otherwise the loop's decode budget applies.
        self._sched = scheduler
        # chunks forwarded but not observed yet: (request?, data, read ns, offset already observed);
        # data None marks the connection's end (with its time), then `_closed` is called
        self._backlog: deque[list[Any]] = deque()
        self._backlog_bytes = 0
        self._closed: Callable[[], None] | None = None
        self.waiting = False  # in the scheduler's ready queue
        self._unanswered: deque[RequestSeen] = deque()  # left unanswered by the end, rows not built yet

    @property
    def behind(self) -> bool:
        """Forwarded bytes wait to be observed (a graceful stop must wait for them too)."""
        return bool(self._backlog)

    @property
    def parsing(self) -> bool:
        """False once the decoder failed: the relay then forwards without observing."""
        return self.stream is not None

    # ------------------------------------------------------------------ input
    def feed(self, request: bool, data: bytes, now_ns: int) -> None:
        """Observe a chunk already forwarded one way, read at `now_ns` — now, or queued when over budget."""
        if self.stream is None and self.facts.opaque_kind == "observation_backlog":  # past the decoder: skipped too
            self.facts.skipped_bytes += len(data)
        sched = self._sched
        if sched is None:
            self._observe(request, data, now_ns)
            return
        backlog = self._backlog
        st = self.stream
        if st is not None and self.facts.opaque_kind is None and sched.lingers(len(data)):  # small: with the batch
            self._queue(request, data, now_ns)
            if self._backlog_bytes > MAX_BACKLOG_BYTES:
                self._fall_behind()
            else:
                sched.linger(self)
            return
        if not backlog and (st is None or self._slice_end(request, data, 0, SLICE_FRAMES_MAX) >= len(data)) \
                and sched.may_decode_now():  # a large chunk, or no lingering: decoded now if the turn allows
            f = self.facts
            before = f.requests + f.from_broker.frames
            self._observe(request, data, now_ns)
            self._spent(f.requests + f.from_broker.frames - before)
            return
        if st is None:
            self.settle(request)
            return
        n = len(data)
        self._queue(request, data, now_ns)
        deadline = perf_counter_ns() + (n >> CREDIT_SHIFT)  # what this read earned, then the turns' share
        while perf_counter_ns() < deadline and self.step():
            pass
        if not backlog:
            return
        if self._backlog_bytes > MAX_BACKLOG_BYTES:
            self._fall_behind()
        else:
            sched.wait(self)

    def _queue(self, request: bool, data: Any, now_ns: int) -> None:
        """Queue a forwarded chunk for a later turn."""
        backlog = self._backlog
        backlog.append([request, data, now_ns, 0])
        self._backlog_bytes += len(data)
        if len(backlog) == 1:  # behind from here: flush marks keep the "sent" times of each flush
            self._req_stamps.mark()
            self._resp_stamps.mark()

    def _slice_frames(self) -> int:
        """Whole frames per slice: 4 while few connections wait for decoding, up to 16 when many do."""
        sched = self._sched
        assert sched is not None
        return min(SLICE_FRAMES_MAX, max(SLICE_FRAMES_MIN, 2 * (len(sched.ready) + 1)))

    def _spent(self, frames: int) -> None:
        """Charge a decoded slice (or chunk) to the turn: one unit per frame and one for the slice."""
        sched = self._sched
        assert sched is not None
        sched.used += frames + 1
        if not sched.scheduled and sched.over():
            sched.scheduled = True
            sched.loop.call_soon(sched._turn)

    def step(self) -> bool:
        """Observe one slice of the oldest queued chunk (the scheduler's turn); True while more is queued."""
        if self._unanswered:
            sched = self._sched
            assert sched is not None
            n = UNANSWERED_STEP
            self._emit_unanswered(n)
            sched.used += n  # only ever run from a turn, which reschedules itself
            if self._unanswered:
                return True
            self._ended()
            return False
        if not self._backlog:  # emptied by `_fall_behind` while waiting for its turn
            return False
        item = self._backlog[0]
        request, data, now_ns, done = item
        if data is None:  # the connection ended after everything before it was observed
            self._backlog.clear()
            self._end_marks()
            self._close_now(now_ns)
            # Rows of requests left unanswered are built in later steps of this same turn loop: `_close_now` cannot
            # queue this observer again (it is still marked waiting), so saying "more to do" is what keeps it queued.
            return bool(self._unanswered)
        f = self.facts
        before = f.requests + f.from_broker.frames
        n = len(data)
        st = self.stream
        end = n if st is None else self._slice_end(request, data, done, self._slice_frames())
        piece = data if done == 0 and end >= n else memoryview(data)[done:end]
        item[3] = end
        if end >= n:
            self._backlog.popleft()
            self._backlog_bytes -= n
        self._observe(request, piece, now_ns)
        self._spent(f.requests + f.from_broker.frames - before)
        if not self._backlog:
            self._end_marks()
            self._on_quiet()  # caught up: whoever waits decides from here (nothing in flight, or the broker's FIN)
            return False
        return True

    def _slice_end(self, request: bool, data: Any, start: int, frames: int) -> int:
        """Where a slice of `frames` frames ends (`KafkaStream.frames_end`). It runs outside the decoder's
        guard (`_observe`), in the connection's read callback, so a slicer that raised (a bug) would end the
        connection: the connection goes opaque instead, and the whole chunk is one slice."""
        try:
            return self.stream.frames_end(request, data, start, frames)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 — the decoder must never break the relay
            self.decoder_failed(exc)
            return len(data)

    def hurry(self, until_ns: int | None = None) -> None:
        """Shutdown's last resort: end now. What is queued is decoded until `until_ns` (perf_counter_ns; one
        deadline for every connection the stop forces: `hurry_deadline`), the rest counted as skipped; unanswered
        rows are built at once. Usually what is queued is a lingering batch of small chunks: a few µs."""
        deadline = hurry_deadline() if until_ns is None else until_ns
        while self._backlog and perf_counter_ns() < deadline:  # the connection's end too, when queued
            if not self.guarded_step():
                break
        if self._backlog:
            self._fall_behind()
        if self._unanswered:
            self._emit_unanswered(len(self._unanswered))
            self._ended()

    def _end_marks(self) -> None:
        self._req_stamps.unmark()
        self._resp_stamps.unmark()

    def _fall_behind(self) -> None:
        """The queued observation outgrew its bound: stop observing this connection, never slow the relay."""
        f = self.facts
        skipped = sum(len(d) - done for _, d, _, done in self._backlog if d is not None)
        f.skipped_bytes += skipped
        end = self._backlog[-1] if self._backlog[-1][1] is None else None
        self._backlog.clear()
        self._backlog_bytes = 0
        self._end_marks()
        self.stream = None
        self._cap_req = self._cap_resp = None
        self._give_up_in_flight("observation_backlog")
        if f.opaque_reason is None:
            f.opaque_kind = "observation_backlog"
            f.opaque_reason = (f"observation fell more than {MAX_BACKLOG_BYTES} bytes behind the relay; relayed "
                               f"without decoding from here on ({skipped} bytes then, every later one counted in "
                               "skipped_bytes)")
            self._log("warning", "decoding fell behind; connection is now opaque (bytes still relayed)",
                      skipped_bytes=skipped, bound=MAX_BACKLOG_BYTES)
        if end is not None:
            self._close_now(end[2])

    def _observe(self, request: bool, data: Any, now_ns: int) -> None:
        """Decode a chunk already forwarded one way, read at `now_ns`."""
        st = self.stream
        if st is None:
            self.settle(request)
            return
        try:
            if request:
                if self._cap_req is not None:
                    self._cap_req.append(data)
                st.receive_request_data(data, now_ns)
            else:
                if self._cap_resp is not None:
                    self._cap_resp.append(data)
                st.receive_response_data(data, now_ns)
            self._drain_events()
        except Exception as exc:  # noqa: BLE001 — the decoder must never break the relay
            self.decoder_failed(exc)
        self.settle(request)

    def settle(self, request: bool) -> None:
        """Record what the latest flush of one direction completed (requests sent, responses delivered)."""
        if request:
            stamps = self._req_stamps
            if stamps.waiting:
                for ev, ts in stamps.settled():
                    if ev.expects_response:
                        self._sent_at[id(ev)] = ts
                    else:
                        self._request_done(ev, None, ts, None, "no_response")
        else:
            stamps = self._resp_stamps
            if stamps.waiting:
                for (req, resp, sent), ts in stamps.settled():
                    self._request_done(req, resp, sent, ts, "answered")

    def close(self, now_ns: int, closed: Callable[[], None] = lambda: None) -> None:
        """The connection ended: once what was forwarded is observed, settle the rest; then call `closed`.

        `closed` runs at once unless observation is behind; then it runs in the
        scheduler's turn that reaches the end (the connection row waits for it).
        """
        self._closed = closed
        if self._backlog:
            self._backlog.append([True, None, now_ns, 0])
            return
        self._close_now(now_ns)

    def _close_now(self, now_ns: int) -> None:
        for ev in self._req_stamps.drain_all():
            if not ev.expects_response:  # acks=0 Produce never flushed: still a request the client made
                self._request_done(ev, None, None, None, "no_response")
        for req, resp, sent in self._resp_stamps.drain_all():
            self._request_done(req, resp, sent, None, "answered")
        if self.stream is not None:
            try:
                self.stream.close(now_ns)
                self._drain_events()
            except Exception as exc:  # noqa: BLE001
                self.decoder_failed(exc)
        if self._unanswered:  # up to 10,000 rows: built a turn's budget at a time, not in one stall
            assert self._sched is not None
            self._sched.wait(self)
            return
        self._ended()

    def _ended(self) -> None:
        closed, self._closed = self._closed, None
        if closed is not None:
            closed()

    def guarded_step(self) -> bool:
        """`step`, where a step that raises (a bug, never bad input) goes to `step_failed`: one connection's bug must
        stop neither every connection's turns nor the shutdown's last decoding."""
        try:
            return self.step()
        except Exception as exc:  # noqa: BLE001
            return self.step_failed(exc)

    def step_failed(self, exc: BaseException) -> bool:
        """A scheduler turn's step raised (a bug, never bad input): True while its queued chunks can still be stepped.

        The first time, the connection goes opaque as for any decoder error, and its queued chunks are then only
        settled (no decoding). A second failure is not the decoder's: the observer is left out of the turns, and
        its rows are built when the proxy stops (`hurry`).
        """
        if self.stream is not None:
            self.decoder_failed(exc)
            return True
        self._log("error", "observation failed; this connection's rows wait for the proxy's stop",
                  error=f"{type(exc).__name__}: {exc}")
        return False

    def decoder_failed(self, exc: BaseException) -> None:
        self.stream = None
        self._cap_req = self._cap_resp = None
        f = self.facts
        self._give_up_in_flight("decoder_failed")
        f.opaque_kind = "decoder_error"
        f.opaque_reason = f"decoder error: {type(exc).__name__}: {exc}"
        self._log("error", "decoder failed; connection is now opaque (bytes still relayed)",
                  error=f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ events
    def _drain_events(self) -> None:
        st = self.stream
        while True:
            ev = st.next_event()
            t = type(ev)
            if t is RequestSeen:
                self._on_request(ev)
            elif t is ResponseSeen:
                self._on_response(ev)
            elif t is StreamOpaque:
                self._on_opaque(ev)
            elif t is StreamClosed:
                self._on_closed(ev)
            elif t is RequestDropped:
                self._on_dropped(ev)
            else:
                break

    def _on_dropped(self, ev: RequestDropped) -> None:
        """The decoder stopped waiting for a request: count it (it gets no row) and stop waiting here too."""
        f = self.facts
        req = ev.request
        if self._sent_at.pop(id(req), None) is None:
            self._req_stamps.forget(req)
        self._count_dropped(ev.reason, 1)
        f.inflight -= 1
        if f.inflight == 0:
            self._on_quiet()

    def _count_dropped(self, reason: str, n: int) -> None:
        d = self.facts.dropped
        d[reason] = d.get(reason, 0) + n

    def _give_up_in_flight(self, reason: str) -> None:
        """Nothing will pair the requests in flight any more (decoder gone): count them, wake a stop."""
        f = self.facts
        if f.inflight > 0:
            self._count_dropped(reason, f.inflight)
            f.inflight = 0
        self._sent_at.clear()
        self._on_quiet()  # nothing is awaited any more (and a backlog, if any, is gone)

    def _on_request(self, ev: RequestSeen) -> None:
        f = self.facts
        f.requests += 1
        f.from_client.frames += 1
        cid = ev.client_id
        if cid is not None and cid not in f.client_ids and len(f.client_ids) < MAX_CLIENT_IDS:
            f.client_ids.append(cid)
        s = ev.summary
        if s is None and not self._no_schema_logged and ev.decode_note and ev.decode_note.startswith("no schema"):
            # the frame stays paired and recorded (decode_note), only its body is not summarized
            self._no_schema_logged = True
            self._log("warning", "request without a schema: relayed unchanged, recorded without a summary",
                      kind="no_schema", api_key=ev.api_key, version=ev.api_version, reason=ev.decode_note)
        oldest = KAFKA_4_OLDEST.get(ev.api_key)
        if oldest is not None and ev.api_version < oldest:  # rare: a dict lookup is all most requests pay
            _note_removed(f, ev)
        last = f.last
        last.api = ev.api_name
        last.key = ev.api_key
        last.version = ev.api_version
        last.size = ev.size
        last.at_ns = ev.last_byte_ns
        if s is not None:
            last.acks = s.acks if ev.api_key == PRODUCE else None
            last.topics = s.topics
            last.batch_bytes = max((b.batch_bytes for b in s.batches), default=None) if s.batches else None
            if s.client_software_name:
                f.software_name = s.client_software_name
                f.software_version = s.client_software_version
        else:
            last.acks = None
            last.topics = []
            last.batch_bytes = None
        if last.acks == 0:  # only a Produce has acks: the one a broker's close most likely answers (facts.blamed_request)
            suspect = f.acks0_suspect
            if suspect is None or (last.size or 0) > (suspect.size or 0):
                f.acks0_suspect = replace(last)  # a copy: `last` is reused by the next request
        if self._cap_req is not None:
            self._capture(self._cap_req, True, ev.offset, ev.size, ev.api_key, ev.api_version, ev.correlation_id,
                          ev.first_byte_ns)
        sent = self._req_stamps.sent_at(ev.offset + ev.size, ev)
        if ev.expects_response:
            f.inflight += 1
            if sent is not None:
                self._sent_at[id(ev)] = sent
        elif sent is not None:
            self._request_done(ev, None, sent, None, "no_response")

    def _on_response(self, ev: ResponseSeen) -> None:
        f = self.facts
        f.from_broker.frames += 1
        req = ev.request
        if self._cap_resp is not None:
            self._capture(self._cap_resp, False, ev.offset, ev.size, req.api_key if req else None,
                          req.api_version if req else None, ev.correlation_id, ev.first_byte_ns)
        if req is None:
            self._orphan_responses += 1
            if self._orphan_responses == 1:
                self._log("warning", "response with no matching request", correlation_id=ev.correlation_id)
            return
        f.responses += 1
        f.inflight -= 1
        if f.acks0_suspect is not None and req.last_byte_ns >= (f.acks0_suspect.at_ns or 0):
            f.acks0_suspect = None  # the broker read past it and answered
        if f.removed_first_ns is not None and not f.removed_served and req.last_byte_ns >= f.removed_first_ns:
            f.removed_served = True  # it answered a removed version, or a request after one: it serves them
        if req.api_key in LEARNED_FROM:  # Produce, Fetch …: one set lookup
            self._learn(ev)
        sent = self._sent_at.pop(id(req), None)
        if sent is None:
            # the drain notice has not arrived yet, but the broker had the whole request: bound it
            self._req_stamps.forget(req)
            sent = ev.first_byte_ns
        delivered = self._resp_stamps.sent_at(ev.offset + ev.size, (req, ev, sent))
        if delivered is not None:
            self._request_done(req, ev, sent, delivered, "answered")
        if f.inflight == 0:
            self._on_quiet()

    def _learn(self, ev: ResponseSeen) -> None:
        """Report what a Metadata / DescribeCluster / CreateTopics / DescribeTopicPartitions answer carries.

        The cluster id (the summary kept it) once per connection, then the answer's topic id ↔
        name pairs, each time. Before the request's row is built, so the row's way out
        (`proxy.topics`) finds the broker's id and the topics' names known and asks the broker
        nothing, and the rows after it (this connection's and the others') name those ids. The
        cluster id first: the `topics/` rows of pairs learned here carry it. The pairs are taken
        out of the summary (one tuple per topic of the answer: not kept until the row is built).
        """
        s = ev.summary
        extra = s.extra if s is not None else None
        if not extra:
            return
        tell = self._on_cluster
        if tell is not None:
            cluster = extra.get("cluster_id")
            if cluster:
                self._on_cluster = None
                tell(cluster)
        learn = self._on_topics
        if learn is not None:
            pairs = extra.pop("topic_pairs", None)
            if pairs:
                learn(pairs)

    def _on_opaque(self, ev: StreamOpaque) -> None:
        f = self.facts
        if ev.kind == "tls":
            f.tls = True
        if f.opaque_reason is None:
            f.opaque_kind = ev.kind
            f.opaque_reason = f"{ev.direction.value} stream opaque at offset {ev.offset}: {ev.kind}: {ev.reason}"
            closed = f.end is not None and f.end.reason == "edit_stopped"  # cluster mode relays nothing unedited
            self._log("warning", "stream not parsed from here on; the connection is closed (its editing stopped)"
                      if closed else "stream not parsed from here on; bytes still relayed unchanged",
                      direction=ev.direction.value, kind=ev.kind, offset=ev.offset, reason=ev.reason)
        if ev.direction is Direction.REQUEST:
            self._cap_req = None
        else:
            self._cap_resp = None

    def _on_closed(self, ev: StreamClosed) -> None:
        # A frame cut off by the end of the connection is bad input like any other:
        # it goes through the same opaque path (recorded reason, one log line).
        for direction, got in ev.truncated.items():
            total = self.stream.request_bytes if direction is Direction.REQUEST else self.stream.response_bytes
            self._on_opaque(StreamOpaque(direction, total - got, "truncated",
                                         f"connection ended {got} bytes into an unfinished {direction.value} frame"))
        self.facts.unanswered_at_end = len(ev.unanswered)
        self._unanswered.extend(ev.unanswered)
        if self._sched is None:
            self._emit_unanswered(len(self._unanswered))

    def _emit_unanswered(self, n: int) -> None:
        """Rows for up to `n` requests the connection's end left unanswered (a budget's worth per turn)."""
        todo = self._unanswered
        for _ in range(min(n, len(todo))):
            req = todo.popleft()
            self._request_done(req, None, self._sent_at.pop(id(req), None), None, "unanswered")

    # ------------------------------------------------------------------ output
    def _capture(self, cap: FrameCapture, request: bool, offset: int, size: int, api_key: int | None,
                 api_version: int | None, corr: int, first_ns: int) -> None:
        data = cap.take(offset, size, api_key)
        self._emit.frame(rows.frame_row(self.facts, request, first_ns, corr, api_key, api_version, data))

    def _request_done(self, req: RequestSeen, resp: ResponseSeen | None, sent: int | None,
                      resp_sent: int | None, status: str) -> None:
        f = self.facts
        row = rows.request_row(f, req, resp, sent, resp_sent, status)
        f.rows += 1
        self._emit.request(row)
        key = req.api_key
        if key == SASL_HANDSHAKE or key == SASL_AUTHENTICATE:  # evidence for the end's cause (proxy.inference)
            f.sasl_seen = True
            if row["error_count"] and f.sasl_error is None:
                f.sasl_error = f"{req.api_name}: {row['errors'][0]['name']}"
        elif not f.answered_beyond_versions and resp is not None and key != API_VERSIONS:  # set once, then only read
            f.answered_beyond_versions = True
        if row["error_count"] and key == PRODUCE:
            cause = request_cause(req.api_name, row["acks"], req.size, row["topics"], [e["name"] for e in row["errors"]])
            if cause is not None:
                f.too_large += 1
                if f.too_large_example is None:
                    f.too_large_example = cause
                    self._log("warning", "produce rejected", cause=cause, client_id=req.client_id)
        if self._log_requests:
            self._log("debug", "request", api=req.api_name, version=req.api_version, client_id=req.client_id,
                      correlation_id=req.correlation_id, status=status, topics=row["topics"],
                      request_bytes=req.size, response_bytes=row["response_bytes"],
                      latency_us=row["latency_us"], broker_latency_us=row["broker_latency_us"],
                      errors=[e["name"] for e in row["errors"]] or None)
