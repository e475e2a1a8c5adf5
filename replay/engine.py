"""The replay engine: one asyncio task per recorded connection, sending recorded frames to a target.

Why this shape:
* **One replay connection per recorded connection**, opened at the recorded
  offset (scaled by the speed) so the broker sees the same connection
  pattern, and requests on it in the recorded order.
* **Timing.** `speed` 1.0/2.0: each request at its recorded offset from the
  recording's start divided by the speed. `max`: requests go out in the
  recorded global order as fast as the target allows, keeping the recorded
  pipelining: a request waits for exactly the responses its client had
  already received when it sent it (from `requests/`), no more, no less.
  In every mode a request also waits for those responses (a client cannot
  send what depends on an answer it has not had), and the wait is counted.
* **State flows from responses.** Every target response goes through the pure
  `learn_from_response`; a request whose rewrite needs state not learned yet
  (`Pending`) waits for the next response and is skipped with its reason
  after `pending_timeout`.
* **Recording the replay.** With `record_dir`, the engine runs a normal
  kafkatap proxy on its own loop in front of the target and connects through
  it, so the output is an ordinary recording that `kafkatap analyze
  --compare` reads like any other.
* **Nothing is silent.** Every request ends as sent (answered / failed /
  unanswered-by-design for acks=0) or skipped with a reason; the totals are
  the result.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import structlog
import uvloop

from protocol.deep import message_class
from replay.load import RecordedConnection, Recording
from replay.rewrite import (
    SASL_HANDSHAKE,
    ConnState,
    Pending,
    ReplayState,
    Send,
    Skip,
    decode_response,
    expects_response,
    learn_from_response,
    parse_request,
    response_correlation_id,
    rewrite_request,
    sasl_plain_authenticate,
    set_correlation_id,
)

log = structlog.get_logger("kafkatap.replay")

__all__ = ["ReplayOptions", "ReplayResult", "Replayer", "run_replay", "replay_async", "prepare_target"]

_MAX_FRAME = 256 << 20


@dataclass
class ReplayOptions:
    target: str
    speed: float | None = 1.0  # None = max
    record_dir: Path | None = None
    proxy_id: str = "replay"
    topic_map: dict[str, str] = field(default_factory=dict)
    fetch_mode: str = "track"
    create_topics: bool = True
    sasl_plain: tuple[str, str] | None = None
    pending_timeout: float = 10.0
    response_timeout: float = 30.0
    connect_timeout: float = 10.0
    progress: TextIO | None = None
    flush_interval_s: float = 0.5


@dataclass
class ReplayResult:
    """Totals of one replay run (also what the CLI prints at the end)."""

    connections: int = 0
    sent: int = 0
    answered: int = 0
    failed: int = 0
    no_response: int = 0  # acks=0 produce: nothing to wait for
    skipped: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    late: int = 0  # requests sent > 50 ms after their scheduled time (waiting for responses)
    closed_by_target: list[str] = field(default_factory=list)  # recorded conn ids whose replay the target closed
    topics_created: list[str] = field(default_factory=list)
    notes: dict[str, int] = field(default_factory=dict)
    rewrites: Counter = field(default_factory=Counter)
    started_ns: int = 0
    first_sent_ns: int | None = None
    last_sent_ns: int | None = None
    finished_ns: int = 0
    record_dir: Path | None = None

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last request sent (the replay's rhythm, for --speed checks)."""
        if self.first_sent_ns is None or self.last_sent_ns is None:
            return 0.0
        return (self.last_sent_ns - self.first_sent_ns) / 1e9

    def summary(self) -> str:
        lines = [f"replayed {self.connections} connections: {self.sent} requests sent, {self.answered} answered, "
                 f"{self.no_response} without response (acks=0), {self.failed} failed, "
                 f"{sum(self.skipped.values())} skipped; span {self.span_s:.2f} s"]
        for reason, n in sorted(self.skipped.items(), key=lambda kv: -kv[1]):
            lines.append(f"  skipped {n:>5}  {reason}")
        for reason, n in sorted(self.failures.items(), key=lambda kv: -kv[1]):
            lines.append(f"  failed  {n:>5}  {reason}")
        if self.closed_by_target:
            lines.append(f"  the target closed {len(self.closed_by_target)} connection(s): {', '.join(self.closed_by_target[:8])}")
        if self.late:
            lines.append(f"  {self.late} request(s) went out > 50 ms late, waiting for the target's responses")
        if self.topics_created:
            lines.append(f"  topics created on the target: {', '.join(self.topics_created)}")
        for what, n in sorted(self.rewrites.items()):
            lines.append(f"  rewritten {n:>5}  {what}")
        for what, n in sorted(self.notes.items()):
            lines.append(f"  note    {n:>5}  {what}")
        if self.record_dir:
            lines.append(f"  replay recorded in {self.record_dir}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- a tiny Kafka client for setup
class _RawClient:
    """Request/response over one connection using kafka-python's codec (setup only: Metadata, CreateTopics)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.cid = 0

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float) -> _RawClient:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        return cls(r, w)

    async def call(self, api_key: int, version: int, timeout: float = 30.0, **fields: Any) -> Any:
        self.cid += 1
        req = message_class(api_key, True)(version=version, **fields)
        req.with_header(correlation_id=self.cid, client_id="kafkatap-replay-setup")
        frame = bytes(req.encode(version=version, header=True, framed=True))
        self.writer.write(frame)
        await self.writer.drain()
        size = int.from_bytes(await asyncio.wait_for(self.reader.readexactly(4), timeout), "big")
        data = (size).to_bytes(4, "big") + await asyncio.wait_for(self.reader.readexactly(size), timeout)
        sent = parse_request(frame)
        return sent, data

    def close(self) -> None:
        self.writer.close()


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


async def prepare_target(target: str, recording: Recording, state: ReplayState, create: bool,
                         timeout: float = 30.0) -> list[str]:
    """Learn the target's topic ids and create the recording's topics that it lacks.

    Partition counts come from the recording (highest partition index seen + 1,
    or the recorded Metadata when responses were captured); a topic that
    exists with fewer partitions is left alone and noted.
    """
    host, port = _hostport(target)
    cli = await _RawClient.connect(host, port, timeout)
    created: list[str] = []
    conn = ConnState()
    try:
        sent, resp = await cli.call(3, 12, topics=None, allow_auto_topic_creation=False,
                                    include_topic_authorized_operations=False)
        learn_from_response(sent, resp, state, conn)
        md = decode_response(sent, resp)
        existing = {t.name: len(t.partitions or ()) for t in md.topics or () if t.error_code == 0}
        wanted = {state.map_topic(t) or t: n for t, n in recording.topics.items()}
        for name, n in wanted.items():
            if name in existing and n > existing[name]:
                state.note(f"topic_has_fewer_partitions_on_target:{name}")
        missing = {t: max(1, n) for t, n in wanted.items() if t not in existing}
        if missing and create:
            CT = message_class(19, True)
            topics = [CT.CreatableTopic(version=7, name=t, num_partitions=n, replication_factor=-1, assignments=[],
                                        configs=[]) for t, n in sorted(missing.items())]
            sent, resp = await cli.call(19, 7, topics=topics, timeout_ms=int(timeout * 1000), validate_only=False)
            learn_from_response(sent, resp, state, conn)
            body = decode_response(sent, resp)
            for t in body.topics or ():
                if t.error_code == 0:
                    created.append(t.name)
                else:
                    state.note(f"create_topic_failed:{t.name}:{t.error_code}")
            # ready = the target reports every partition of every created topic with a leader
            # (and its topic id): the origin's topics were ready when the session was recorded
            for _ in range(80):
                sent, resp = await cli.call(3, 12, topics=None, allow_auto_topic_creation=False,
                                            include_topic_authorized_operations=False)
                learn_from_response(sent, resp, state, conn)
                ready = {t.name for t in decode_response(sent, resp).topics or ()
                         if t.error_code == 0 and t.partitions
                         and all(p.error_code == 0 and p.leader_id >= 0 for p in t.partitions)}
                if all(t in state.target_topic_ids and t in ready for t in created):
                    break
                await asyncio.sleep(0.25)
            else:
                state.note("created_topics_not_ready")
            await _await_partition_leaders(cli, {t: missing[t] for t in created}, state, timeout)
        elif missing:
            state.note("topics_missing_on_target", len(missing))
        await _await_coordinators(cli, recording.groups, state, timeout)
        if any(r.frame.api_key == 22 for c in recording.connections for r in c.requests):
            await _await_producer_ids(cli, state, timeout)
    finally:
        cli.close()
    return created


async def _await_partition_leaders(cli: _RawClient, topics: dict[str, int], state: ReplayState,
                                   timeout: float) -> None:
    """Wait until the target's replica manager leads every created partition.

    Why: KRaft publishes a new topic's leader in Metadata a moment before the
    broker itself has become leader, and a Produce in that gap is answered
    NOT_LEADER_OR_FOLLOWER. ListOffsets(latest) has no side effect and answers
    0 only once the partition is really led.
    """
    if not topics:
        return
    LO = message_class(2, True)
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        wanted = [LO.ListOffsetsTopic(version=4, name=t, partitions=[
            LO.ListOffsetsTopic.ListOffsetsPartition(version=4, partition_index=i, current_leader_epoch=-1,
                                                     timestamp=-1) for i in range(n)]) for t, n in topics.items()]
        sent, resp = await cli.call(2, 4, replica_id=-1, isolation_level=0, topics=wanted)
        body = decode_response(sent, resp)
        if all(p.error_code == 0 for t in body.topics or () for p in t.partitions or ()):
            return
        await asyncio.sleep(0.2)
    state.note("created_partitions_not_led", len(topics))


async def _await_coordinators(cli: _RawClient, groups: set[str], state: ReplayState, timeout: float) -> None:
    """Wait until the target has a coordinator for every recorded group (FindCoordinator answers 0).

    Why: a fresh broker creates __consumer_offsets on the first FindCoordinator
    and answers COORDINATOR_NOT_AVAILABLE / NOT_COORDINATOR for a few seconds;
    the origin's coordinator was up when the session was recorded, so a
    faithful replay starts once the target's is too.
    """
    if not groups:
        return
    deadline = asyncio.get_running_loop().time() + timeout
    pending = set(groups)
    while pending and asyncio.get_running_loop().time() < deadline:
        for g in sorted(pending):
            sent, resp = await cli.call(10, 2, key=g, key_type=0)
            if decode_response(sent, resp).error_code == 0:
                pending.discard(g)
        if pending:
            await asyncio.sleep(0.5)
    if pending:
        state.note("group_coordinator_not_ready", len(pending))


async def _await_producer_ids(cli: _RawClient, state: ReplayState, timeout: float) -> None:
    """Wait until the target hands out producer ids (InitProducerId answers 0).

    A fresh KRaft broker answers COORDINATOR_LOAD_IN_PROGRESS until it got its
    first block of producer ids from the controller; the origin was past that.
    Costs one producer id on the target.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        sent, resp = await cli.call(22, 4, transactional_id=None, transaction_timeout_ms=0, producer_id=-1,
                                    producer_epoch=-1)
        if decode_response(sent, resp).error_code == 0:
            return
        await asyncio.sleep(0.5)
    state.note("producer_ids_not_ready")


# --------------------------------------------------------------------------- the replay
class Replayer:
    """Runs one replay on the current event loop (see the module docstring)."""

    def __init__(self, recording: Recording, options: ReplayOptions) -> None:
        self.rec = recording
        self.opt = options
        self.state = ReplayState(topic_map=dict(options.topic_map), fetch_mode=options.fetch_mode,
                                 recorded_topic_ids=dict(recording.recorded_topic_ids),
                                 sasl_mechanism="PLAIN" if options.sasl_plain else None)
        self.result = ReplayResult(connections=len(recording.connections))
        self.result.skipped.update(recording.skipped)
        self._changed = asyncio.Condition()
        self._dispatched = [False] * recording.requests  # global index → sent/skipped/failed (max-speed gate)
        self._dispatch_ptr = 0
        self._t0_rec = recording.start_ns or 0
        self._t0 = 0.0
        self._progress_task: asyncio.Task | None = None

    # -- notifications -------------------------------------------------------
    async def _settle(self, done: list[bool], pos: int, index: int) -> None:
        """A request is finished without a response to wait for (skipped, failed, or fire-and-forget)."""
        done[pos] = True
        self._dispatch(index)
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _wait_for(self, pred: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until pred() holds (re-checked after every response/dispatch); False on timeout."""
        if pred():
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        async with self._changed:
            while not pred():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except asyncio.TimeoutError:
                    return pred()
        return True

    def _dispatch(self, index: int) -> None:
        self._dispatched[index] = True
        while self._dispatch_ptr < len(self._dispatched) and self._dispatched[self._dispatch_ptr]:
            self._dispatch_ptr += 1

    # -- timing ----------------------------------------------------------------
    def _at(self, ts_ns: int) -> float:
        """Loop time at which something recorded at ts_ns happens in the replay."""
        assert self.opt.speed
        return self._t0 + (ts_ns - self._t0_rec) / 1e9 / self.opt.speed

    async def _sleep_until(self, when: float) -> None:
        delay = when - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)

    # -- run -------------------------------------------------------------------
    async def run(self, host: str, port: int) -> ReplayResult:
        loop = asyncio.get_running_loop()
        self.result.started_ns = time.time_ns()
        self._t0 = loop.time() + 0.05
        if self.opt.progress is not None:
            self._progress_task = asyncio.create_task(self._progress())
        try:
            outcomes = await asyncio.gather(*(self._run_conn(c, host, port) for c in self.rec.connections),
                                            return_exceptions=True)
            for c, out in zip(self.rec.connections, outcomes):
                if isinstance(out, BaseException):  # a bug must cost one connection, not the replay
                    log.error("replay connection failed", conn_id=c.conn_id, error=f"{type(out).__name__}: {out}")
                    self.result.failures[f"internal error: {type(out).__name__}"] += 1
        finally:
            if self._progress_task is not None:
                self._progress_task.cancel()
                self._print_progress(final=True)
        self.result.notes = dict(self.state.notes)
        self.result.finished_ns = time.time_ns()
        r = self.result
        log.info("replay finished", connections=r.connections, sent=r.sent, answered=r.answered, failed=r.failed,
                 skipped=dict(r.skipped), closed_by_target=len(r.closed_by_target), span_s=round(r.span_s, 3))
        return self.result

    async def _run_conn(self, rc: RecordedConnection, host: str, port: int) -> None:
        res = self.result
        cs = ConnState(rc.client_id)
        reqs = rc.requests
        done = [False] * len(reqs)  # answered, failed or skipped: what deps wait on
        first = reqs[0]
        if self.opt.speed:
            await self._sleep_until(self._at(rc.opened_ns))
        else:
            await self._wait_for(lambda: self._dispatch_ptr >= first.index, None)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), self.opt.connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            for r in reqs:
                res.failed += 1
                res.failures[f"connect_failed: {exc}"] += 1
                self._dispatch(r.index)
            await self._notify()
            return
        inflight: dict[int, tuple[int | None, Any]] = {}  # new correlation id → (position or None, sent frame)
        closed = asyncio.Event()
        waiters: dict[int, asyncio.Future] = {}

        async def read_loop() -> None:
            try:
                while True:
                    head = await reader.readexactly(4)
                    size = int.from_bytes(head, "big", signed=True)
                    if size < 4 or size > _MAX_FRAME:
                        raise ValueError(f"bad response size {size}")
                    data = head + await reader.readexactly(size)
                    cid = response_correlation_id(data)
                    hit = inflight.pop(cid, None)
                    if hit is None:
                        self.state.note("response_unmatched")
                        continue
                    pos, sent = hit
                    learn_from_response(sent, data, self.state, cs)
                    if pos is not None:  # None: an extra request of our own (member id negotiation)
                        res.answered += 1
                        done[pos] = True
                    fut = waiters.pop(cid, None)
                    if fut is not None and not fut.done():
                        fut.set_result(data)
                    await self._notify()
            except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
                pass
            finally:
                closed.set()
                for cid, (pos, _sent) in list(inflight.items()):
                    if pos is None:
                        continue
                    res.failed += 1
                    res.failures["unanswered: target closed the connection"] += 1
                    done[pos] = True
                inflight.clear()
                for fut in waiters.values():
                    if not fut.done():
                        fut.set_result(None)
                await self._notify()

        reader_task = asyncio.create_task(read_loop())
        next_cid = 0
        last_sent_at = asyncio.get_running_loop().time()
        try:
            for pos, r in enumerate(reqs):
                if self.opt.speed:
                    scheduled = self._at(r.ts_ns)
                    await self._sleep_until(scheduled)
                else:
                    scheduled = None
                    await self._wait_for(lambda r=r: self._dispatch_ptr >= r.index, None)
                deps = r.deps
                ok = await self._wait_for(lambda deps=deps: all(done[j] for j in deps) or closed.is_set(),
                                          self.opt.response_timeout)
                if not ok:
                    self.state.note("sent_before_recorded_response_arrived")
                if closed.is_set():
                    res.failed += 1
                    res.failures["not sent: target closed the connection"] += 1
                    await self._settle(done, pos, r.index)
                    continue
                outcome = rewrite_request(r.frame, self.state, cs)
                if isinstance(outcome, Pending):
                    got: list[Any] = [outcome]

                    def settled(r: Any = r, got: list[Any] = got) -> bool:
                        got[0] = rewrite_request(r.frame, self.state, cs)
                        return not isinstance(got[0], Pending) or closed.is_set()

                    await self._wait_for(settled, self.opt.pending_timeout)
                    outcome = got[0]
                    if isinstance(outcome, Pending):
                        outcome = Skip(outcome.reason)
                if isinstance(outcome, Skip):
                    res.skipped[outcome.reason] += 1
                    await self._settle(done, pos, r.index)
                    continue
                assert isinstance(outcome, Send)
                if "member_id_negotiate" in outcome.rewrites:
                    next_cid += 1
                    outcome = await self._negotiate_member(r, outcome, cs, writer, inflight, waiters, next_cid)
                    if isinstance(outcome, Skip):
                        res.skipped[outcome.reason] += 1
                        await self._settle(done, pos, r.index)
                        continue
                next_cid += 1
                data = set_correlation_id(outcome.data, next_cid)
                sent = parse_request(data)
                if outcome.expects_response:
                    inflight[next_cid] = (pos, sent)
                if scheduled is not None and asyncio.get_running_loop().time() - scheduled > 0.05:
                    res.late += 1
                for what in outcome.rewrites:
                    res.rewrites[what] += 1
                try:
                    writer.write(data)
                    await writer.drain()
                except (ConnectionError, OSError):
                    inflight.pop(next_cid, None)
                    res.failed += 1
                    res.failures["not sent: target closed the connection"] += 1
                    await self._settle(done, pos, r.index)
                    continue
                now = time.time_ns()
                last_sent_at = asyncio.get_running_loop().time()
                res.sent += 1
                if res.first_sent_ns is None:
                    res.first_sent_ns = now
                res.last_sent_ns = now
                if not outcome.expects_response:
                    res.no_response += 1
                    done[pos] = True
                self._dispatch(r.index)
                await self._notify()
                if sent.api_key == SASL_HANDSHAKE and self.opt.sasl_plain is not None:
                    await self._sasl_authenticate(rc, writer, inflight, waiters, pos, next_cid, closed)
                    next_cid += 1
            # wait for outstanding responses, then close when the recorded client closed
            await self._wait_for(lambda: not inflight or closed.is_set(), self.opt.response_timeout)
            if self.opt.speed and rc.closed_ns and rc.end_by == "client":
                # the recorded close time, but never sooner after our last request than the client waited
                # (a broker that hangs up after an acks=0 produce must get the same chance to do so)
                gap = max(0, rc.closed_ns - reqs[-1].ts_ns) / 1e9 / self.opt.speed
                close_at = max(self._at(rc.closed_ns), last_sent_at + gap)
                try:
                    await asyncio.wait_for(closed.wait(), max(0.0, close_at - asyncio.get_running_loop().time()))
                except asyncio.TimeoutError:
                    pass
            elif not self.opt.speed and rc.closed_ns and not expects_response(reqs[-1].frame):
                # nothing to wait for after an acks=0 produce: give the target the recorded gap (≤ 1 s) to hang up
                gap = min(1.0, max(0, rc.closed_ns - reqs[-1].ts_ns) / 1e9)
                try:
                    await asyncio.wait_for(closed.wait(), gap)
                except asyncio.TimeoutError:
                    pass
            if closed.is_set() and reqs and not writer.is_closing():
                res.closed_by_target.append(rc.conn_id)
            if inflight:
                for _cid, (pos, _s) in list(inflight.items()):
                    if pos is not None:
                        res.failed += 1
                        res.failures["unanswered: response timeout"] += 1
                inflight.clear()
        finally:
            # whatever happened, this connection's requests must not hold up the global order (--speed max)
            for r in reqs:
                if not self._dispatched[r.index]:
                    self._dispatch(r.index)
            await self._notify()
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), 2.0)
            except (asyncio.TimeoutError, ConnectionError, OSError):
                pass
            reader_task.cancel()
            try:
                await reader_task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass

    async def _negotiate_member(self, r: Any, outcome: Send, cs: ConnState, writer: asyncio.StreamWriter,
                                inflight: dict[int, tuple[int | None, Any]], waiters: dict[int, asyncio.Future],
                                cid: int) -> Send | Skip:
        """Send the join with an empty member id, learn the target's id, then rewrite the recorded join."""
        data = set_correlation_id(outcome.data, cid)
        fut = asyncio.get_running_loop().create_future()
        waiters[cid] = fut
        inflight[cid] = (None, parse_request(data))
        try:
            writer.write(data)
            await writer.drain()
            got = await asyncio.wait_for(fut, self.opt.response_timeout)
        except (ConnectionError, OSError, asyncio.TimeoutError):
            got = None
        self.state.note("join_group_extra_member_id_round")
        if got is None:
            return Skip("member_id_negotiation_failed")
        again = rewrite_request(r.frame, self.state, cs)
        if isinstance(again, Send) and "member_id_negotiate" not in again.rewrites:
            return again
        return Skip(getattr(again, "reason", "member_id_unmapped"))

    async def _sasl_authenticate(self, rc: RecordedConnection, writer: asyncio.StreamWriter,
                                 inflight: dict[int, tuple[int, Any]], waiters: dict[int, asyncio.Future],
                                 pos: int, handshake_cid: int, closed: asyncio.Event) -> None:
        """After a replayed SaslHandshake, authenticate with the user's PLAIN credentials."""
        assert self.opt.sasl_plain is not None
        fut = asyncio.get_running_loop().create_future()
        waiters[handshake_cid] = fut
        try:
            if handshake_cid in inflight:
                await asyncio.wait_for(fut, self.opt.response_timeout)
        except asyncio.TimeoutError:
            self.state.note("sasl_handshake_unanswered")
            return
        cid = handshake_cid + 1
        frame = sasl_plain_authenticate(rc.sasl_version if rc.sasl_version is not None else 1,
                                        self.opt.sasl_plain[0], self.opt.sasl_plain[1], rc.client_id, cid)
        fut2 = asyncio.get_running_loop().create_future()
        waiters[cid] = fut2
        inflight[cid] = (None, parse_request(frame))  # our own request: not one of the recorded ones
        try:
            writer.write(frame)
            await writer.drain()
            got = await asyncio.wait_for(fut2, self.opt.response_timeout)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            got = None
        if got is None:
            self.state.note("sasl_authenticate_failed")
            return
        sent = parse_request(frame)
        try:
            err = decode_response(sent, got).error_code if len(got) > 8 else 0
        except Exception:  # noqa: BLE001
            err = 0
        self.state.note("sasl_authenticated_with_given_credentials" if err == 0 else f"sasl_authenticate_error_{err}")

    # -- progress ----------------------------------------------------------------
    def _print_progress(self, final: bool = False) -> None:
        out = self.opt.progress
        if out is None:
            return
        r = self.result
        total = self.rec.requests + sum(self.rec.skipped.values())
        line = (f"replay: sent {r.sent}/{self.rec.requests}  answered {r.answered}  failed {r.failed}  "
                f"skipped {sum(r.skipped.values())}  (of {total})")
        tty = getattr(out, "isatty", lambda: False)()
        if tty:
            out.write("\r" + line + ("\n" if final else ""))
        else:
            out.write(line + "\n")
        out.flush()

    async def _progress(self) -> None:
        tty = getattr(self.opt.progress, "isatty", lambda: False)()
        while True:
            await asyncio.sleep(0.2 if tty else 5.0)
            self._print_progress()


async def replay_async(recording: Recording, options: ReplayOptions) -> ReplayResult:
    replayer = Replayer(recording, options)
    created = await prepare_target(options.target, recording, replayer.state, options.create_topics,
                                   options.connect_timeout)
    replayer.result.topics_created = created
    if options.record_dir is None:
        host, port = _hostport(options.target)
        return await replayer.run(host, port)
    from proxy.recording import build_sinks
    from proxy.server import ProxyServer

    sink, hooks = build_sinks(options.record_dir, options.proxy_id, capture="requests",
                              flush_interval_s=options.flush_interval_s, compact_interval_s=0)
    for h in hooks:
        await h.start()
    server = ProxyServer([f"127.0.0.1:0={options.target}"], sink=sink, proxy_id=options.proxy_id,
                         capture="requests", tcp_info_interval=None)
    await server.start()
    try:
        host, port = server.listen_addr
        result = await replayer.run(host, port)
    finally:
        await server.stop(timeout=5.0)
        for h in reversed(hooks):
            await h.stop()
    result.record_dir = options.record_dir
    return result


def run_replay(recording: Recording, options: ReplayOptions) -> ReplayResult:
    """Run a replay to completion on a fresh uvloop loop (the synchronous entry point)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(replay_async(recording, options))


def default_progress() -> TextIO:
    return sys.stderr
