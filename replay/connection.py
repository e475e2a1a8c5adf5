"""Replay one recorded connection: open it, send its requests in order, read the target's answers.

Why apart from `replay.engine`: the engine decides *when* (the recorded
offsets scaled by the speed, or the global order at --speed max) and keeps the
totals; this module is what happens on one TCP connection — the rewrite of
each request (`replay.rewrite`), renumbered correlation ids, the recorded
pipelining (a request waits for exactly the responses its client had), what
the target's answers teach (`replay.learn`), and the extra requests of our
own a connection may need (a JoinGroup member-id round, SASL/PLAIN after a
recorded SaslHandshake or, for a session that recorded none, before its first
request, and again before the session lifetime the target set runs out,
`replay.reauth`). Every request ends counted in the result: sent, answered,
failed or skipped; our own requests are not counted, what came of them is a note.

At --speed N a session's clock starts once its connection is ready: the
connect and the SASL round trips replay adds before the first request are not
in the recording, and counting them would make its first requests "late".
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from harness.wire import AsyncWireClient
from protocol.apis import API_VERSIONS, SASL_HANDSHAKE, api_name
from protocol.errors import error_name
from protocol.frames import RequestFrame, expects_response, parse_request, response_correlation_id, set_correlation_id
from protocol.sasl import AUTHENTICATE_VERSION
from replay.learn import learn_from_response
from replay.load import RecordedConnection, RecordedRequest
from replay.messages import answer_errors, decode_response
from replay.reauth import renewal_time, session_lifetime_ms
from replay.rewrite import rewrite_request, sasl_plain_authenticate, sasl_plain_handshake
from replay.schedule import LATE_AFTER_S, NO_SOURCE_LEFT, ReplaySchedule, learning_key
from replay.state import ConnState, Pending, Send, Skip
from replay.txn_partitions import ATTEMPTS, RETRY_BACKOFF_S, must_retry


__all__ = ["replay_connection", "GAVE_UP", "NO_ANSWER"]

NO_ANSWER = "unanswered: no answer within --response-timeout"
GAVE_UP = "not sent: replay gave up on the connection (an answer took longer than --response-timeout)"


class Finished:
    """Which of a connection's requests are finished (answered, failed or skipped), told to the schedule too.

    Why the schedule must know: a Pending request on another connection waits only while a request that
    could teach what it needs is unfinished (`ReplaySchedule.can_still_learn`).
    """

    def __init__(self, rp: ReplaySchedule, reqs: list[RecordedRequest]) -> None:
        self._rp = rp
        self.keys = [learning_key(r.frame) for r in reqs]  # what each one can teach (`ReplaySchedule.unfinished`)
        self._flags = [False] * len(reqs)

    def __getitem__(self, pos: int) -> bool:
        return self._flags[pos]

    def __setitem__(self, pos: int, finished: bool) -> None:
        if finished and not self._flags[pos]:
            self._rp.unfinished[self.keys[pos]] -= 1
        self._flags[pos] = finished


def answer_allowance(reqs: list[RecordedRequest], positions: Any, response_timeout: float) -> float:
    """How long the answers at `positions` may take: --response-timeout beyond the slowest recorded one.

    Why beyond the recorded: a JoinGroup the origin's rebalance held for 40 s may be held as long on the target,
    and a client waits for it (Kafka's clients stretch their request timeout by the rebalance timeout).
    """
    recorded = [(reqs[j].resp_ns - reqs[j].ts_ns) / 1e9 for j in positions if reqs[j].resp_ns is not None]
    return response_timeout + max(recorded, default=0.0)


async def replay_connection(rp: ReplaySchedule, rc: RecordedConnection, host: str, port: int) -> None:
    res = rp.result
    cs = ConnState(rc.client_id, broker=rc.broker_addr)
    reqs = rc.requests
    done = Finished(rp, reqs)  # answered, failed or skipped: what deps wait on
    first = reqs[0]
    if rp.opt.speed:
        await rp.sleep_until(rp.at(rc.opened_ns))
    else:
        await rp.wait_for(lambda: rp.dispatch_ptr >= first.index, None)
    try:
        wire = await AsyncWireClient.connect(host, port, client_id=rc.client_id, timeout=None,
                                             connect_timeout=rp.opt.connect_timeout)
    except (OSError, asyncio.TimeoutError) as exc:
        for pos, r in enumerate(reqs):
            res.failed += 1
            res.failures[f"connect_failed: {exc}"] += 1
            done[pos] = True
            rp.dispatch(r.index)
        await rp.notify()
        return
    writer = wire.writer
    inflight: dict[int, tuple[int | None, Any]] = {}  # new correlation id → (position or None, sent frame)
    closed = asyncio.Event()
    waiters: dict[int, asyncio.Future] = {}

    async def read_loop() -> None:
        try:
            while True:
                data = await wire.read_frame()  # recorded frames go out through wire.writer, pipelined
                cid = response_correlation_id(data)
                hit = inflight.pop(cid, None)
                if hit is None:
                    rp.state.note("response_unmatched")
                    continue
                pos, sent = hit
                learn_from_response(sent, data, rp.state, cs, None if pos is None else reqs[pos].recorded_pid)
                if pos is not None:  # None: an extra request of our own (member id negotiation)
                    res.answered += 1
                    for name in answer_errors(sent, data):
                        res.answer_errors[f"{api_name(sent.api_key)} {name}"] += 1
                    done[pos] = True
                fut = waiters.pop(cid, None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
                await rp.notify()
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
            await rp.notify()

    reader_task = asyncio.create_task(read_loop())
    next_cid = 0
    loop = asyncio.get_running_loop()
    gave_up = False  # an answer took longer than allowed: the connection was closed, as a client closes it

    def give_up() -> None:
        """Fail what is in flight and close the connection: a target that stopped answering one request costs
        the replay one --response-timeout per connection, not one per request (it waited 30 s for each)."""
        nonlocal gave_up
        gave_up = True
        for _cid, (pos, _s) in list(inflight.items()):
            if pos is not None:
                res.failed += 1
                res.failures[NO_ANSWER] += 1
                done[pos] = True
        inflight.clear()
        writer.close()

    async def reauthenticate() -> None:
        """Renew the SASL session (`replay.reauth`), once the answers in flight are in (bounded by the timeout)."""
        nonlocal next_cid
        await rp.wait_for(lambda: not inflight or closed.is_set(), rp.opt.response_timeout)
        if closed.is_set() or gave_up:
            cs.reauth_at = None  # nothing left to renew
            return
        next_cid = await _sasl_own(rp, rc, cs, next_cid + 1, writer, inflight, waiters, closed,
                                   "sasl_reauthenticated")

    async def until_scheduled(r: RecordedRequest, scheduled: float | None) -> None:
        """Wait for r's turn (its time at --speed N, the global order at max), renewing the session when due."""
        while True:
            due = cs.reauth_at
            if scheduled is not None:
                if due is None or due >= scheduled:
                    await rp.sleep_until(scheduled)
                    return
                await rp.sleep_until(due)
            elif await rp.wait_for(lambda: rp.dispatch_ptr >= r.index,
                                   None if due is None else max(0.0, due - loop.time())):
                return
            await reauthenticate()

    try:
        if authenticates_first(reqs, rp.opt.sasl_plain is not None, rp.state.target_takes_sasl):
            rp.state.note("sasl_added_where_recording_had_none")
            next_cid = await _sasl_own(rp, rc, cs, 1, writer, inflight, waiters, closed,
                                       "sasl_authenticated_with_given_credentials")
        # the session's clock starts now that its connection is ready (see the module docstring)
        setup_s = loop.time() - rp.at(rc.opened_ns) if rp.opt.speed else 0.0
        last_sent_at = loop.time()
        for pos, r in enumerate(reqs):
            scheduled = rp.at(r.ts_ns) + setup_s if rp.opt.speed else None
            await until_scheduled(r, scheduled)
            deps = r.deps
            if not gave_up and not await rp.wait_for(lambda deps=deps: all(done[j] for j in deps) or closed.is_set(),
                                                     answer_allowance(reqs, deps, rp.opt.response_timeout)):
                give_up()
            if cs.reauth_at is not None and loop.time() >= cs.reauth_at and not closed.is_set() and not gave_up:
                await reauthenticate()  # came due while the request waited for its dependencies
            if closed.is_set() or gave_up:
                res.failed += 1
                res.failures[GAVE_UP if gave_up else "not sent: target closed the connection"] += 1
                await rp.settle(done, pos, r.index)
                continue
            outcome = rewrite_request(r.frame, rp.state, cs)
            if isinstance(outcome, Pending):
                got: list[Any] = [outcome]

                def settled(r: Any = r, got: list[Any] = got) -> bool:
                    got[0] = rewrite_request(r.frame, rp.state, cs)
                    return (not isinstance(got[0], Pending) or closed.is_set()
                            or not rp.can_still_learn(got[0].reason, done.keys[pos]))

                await rp.wait_for(settled, rp.opt.pending_timeout)
                outcome = got[0]
                if isinstance(outcome, Pending):
                    hopeless = not rp.can_still_learn(outcome.reason, done.keys[pos])
                    outcome = Skip(f"{outcome.reason}: {NO_SOURCE_LEFT}" if hopeless else outcome.reason)
            if isinstance(outcome, Skip):
                res.skipped[outcome.reason] += 1
                await rp.settle(done, pos, r.index)
                continue
            assert isinstance(outcome, Send)
            if "member_id_negotiate" in outcome.rewrites:
                next_cid += 1
                outcome = await _negotiate_member(rp, r, outcome, cs, writer, inflight, waiters, next_cid)
                if isinstance(outcome, Skip):
                    res.skipped[outcome.reason] += 1
                    await rp.settle(done, pos, r.index)
                    continue
            for extra in outcome.first:  # replay's own, answered before the request that needs it (txn_partitions)
                next_cid = await _send_first(rp, extra, next_cid, writer, inflight, waiters, closed)
            if closed.is_set():  # the target closed the connection during that exchange
                res.failed += 1
                res.failures["not sent: target closed the connection"] += 1
                await rp.settle(done, pos, r.index)
                continue
            next_cid += 1
            data = set_correlation_id(outcome.data, next_cid)
            sent = parse_request(data)
            if outcome.expects_response:
                inflight[next_cid] = (pos, sent)
            # the handshake's answer decides whether the credentials go out; waited for from before it is sent, so
            # it cannot arrive unseen (a closed connection's read loop has answered its waiters, and will not this one)
            handshake: asyncio.Future | None = None
            if (sent.api_key == SASL_HANDSHAKE and rp.opt.sasl_plain is not None and outcome.expects_response
                    and not closed.is_set()):
                handshake = waiters[next_cid] = asyncio.get_running_loop().create_future()
            if scheduled is not None and loop.time() - scheduled > LATE_AFTER_S:
                res.late += 1
            for what in outcome.rewrites:
                res.rewrites[what] += 1
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                inflight.pop(next_cid, None)
                waiters.pop(next_cid, None)
                res.failed += 1
                res.failures["not sent: target closed the connection"] += 1
                await rp.settle(done, pos, r.index)
                continue
            now = time.time_ns()
            last_sent_at = loop.time()
            res.sent += 1
            if res.first_sent_ns is None:
                res.first_sent_ns = now
            res.last_sent_ns = now
            if not outcome.expects_response:
                res.no_response += 1
                done[pos] = True
            rp.dispatch(r.index)
            await rp.notify()
            if handshake is not None:
                answer = await _answer(rp, handshake, next_cid, waiters)
                next_cid = await _sasl_authenticate(rp, rc, cs, sent, answer, writer, inflight, waiters, closed,
                                                    "sasl_authenticated_with_given_credentials")
        # wait for outstanding responses, then close when the recorded client closed
        if not gave_up and not await rp.wait_for(
                lambda: not inflight or closed.is_set(),
                answer_allowance(reqs, [p for p, _ in inflight.values() if p is not None], rp.opt.response_timeout)):
            give_up()
        if gave_up or not rc.closes_as_recorded:
            pass  # closed already, or the recorded close ends requests the filters left out: close after the answers
        elif rp.opt.speed and rc.closed_ns and rc.end_by == "client":
            # the recorded close time, but never sooner after our last request than the client waited
            # (a broker that hangs up after an acks=0 produce must get the same chance to do so)
            gap = max(0, rc.closed_ns - reqs[-1].ts_ns) / 1e9 / rp.opt.speed
            close_at = max(rp.at(rc.closed_ns) + setup_s, last_sent_at + gap)
            try:
                await asyncio.wait_for(closed.wait(), max(0.0, close_at - loop.time()))
            except asyncio.TimeoutError:
                pass
        elif not rp.opt.speed and rc.closed_ns and not expects_response(reqs[-1].frame):
            # nothing to wait for after an acks=0 produce: give the target the recorded gap (≤ 1 s) to hang up
            gap = min(1.0, max(0, rc.closed_ns - reqs[-1].ts_ns) / 1e9)
            try:
                await asyncio.wait_for(closed.wait(), gap)
            except asyncio.TimeoutError:
                pass
        if closed.is_set() and reqs and not writer.is_closing():
            res.closed_by_target.append(rc.conn_id)
    finally:
        # whatever happened, this connection's requests must not hold up the global order (--speed max), nor
        # keep another connection's Pending request waiting for an answer they will not get
        for pos, r in enumerate(reqs):
            if not rp.dispatched[r.index]:
                rp.dispatch(r.index)
            done[pos] = True
        await rp.notify()
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


async def _negotiate_member(rp: ReplaySchedule, r: Any, outcome: Send, cs: ConnState, writer: asyncio.StreamWriter,
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
        got = await asyncio.wait_for(fut, rp.opt.response_timeout)
    except (ConnectionError, OSError, asyncio.TimeoutError):
        got = None
    rp.state.note("join_group_extra_member_id_round")
    if got is None:
        return Skip("member_id_negotiation_failed")
    again = rewrite_request(r.frame, rp.state, cs)
    if isinstance(again, Send) and "member_id_negotiate" not in again.rewrites:
        return again
    return Skip(getattr(again, "reason", "member_id_unmapped"))


async def _send_first(rp: ReplaySchedule, frame: bytes, cid: int, writer: asyncio.StreamWriter,
                      inflight: dict[int, tuple[int | None, Any]], waiters: dict[int, asyncio.Future],
                      closed: asyncio.Event) -> int:
    """Send a request of replay's own that must be answered before a recorded one goes out, retrying it with a
    client's backoff while the target asks for that (`txn_partitions.must_retry`); count the errors of its last
    answer as "API ERROR (replay's own)". Returns the last correlation id used."""
    answer: bytes | None = None
    sent = parse_request(frame)
    for attempt in range(ATTEMPTS):
        if attempt:
            await asyncio.sleep(RETRY_BACKOFF_S * 2 ** (attempt - 1))  # a client's retry backoff, not a wait for an event
        cid += 1
        own = set_correlation_id(frame, cid)
        answer = await _own_request(rp, own, writer, inflight, waiters, closed)
        if not must_retry(sent, answer):
            break
    if answer is not None:
        for name in answer_errors(sent, answer):
            rp.result.answer_errors[f"{api_name(sent.api_key)} {name} (replay's own)"] += 1
    return cid


def authenticates_first(reqs: list[RecordedRequest], credentials: bool, target_takes_sasl: bool) -> bool:
    """Must this replayed session authenticate with the --sasl-plain credentials before its first request?

    Why: a SASL listener serves nothing but ApiVersions and the SASL requests before a
    connection has authenticated, and closes it at the first other request. A session that
    replays a SaslHandshake of its own authenticates after it (`_sasl_authenticate`); one whose
    recording has none before its first such request — recorded on a listener without SASL, or
    its handshake left out by --api, --since or --until — was closed at once, and the replay
    ended with only "target closed the connection" counts. So when the set-up found that the
    target authenticates (`ReplayState.target_takes_sasl`; a PLAINTEXT target gets no extra
    requests), such a session authenticates first. A v0 handshake does not count: it is
    skipped (`sasl_handshake_v0_unsupported`).
    """
    if not (credentials and target_takes_sasl):
        return False
    for r in reqs:
        if r.frame.api_key == SASL_HANDSHAKE and r.frame.api_version >= 1:
            return False
        if r.frame.api_key != API_VERSIONS:
            return True
    return False  # only ApiVersions: served before authentication


async def _answer(rp: ReplaySchedule, fut: asyncio.Future, cid: int,
                  waiters: dict[int, asyncio.Future]) -> bytes | None:
    """The answer `fut` waits for (registered before its request went out); None on close or after the timeout."""
    try:
        return await asyncio.wait_for(fut, rp.opt.response_timeout)
    except asyncio.TimeoutError:
        waiters.pop(cid, None)
        return None


async def _own_request(rp: ReplaySchedule, frame: bytes, writer: asyncio.StreamWriter,
                       inflight: dict[int, tuple[int | None, Any]], waiters: dict[int, asyncio.Future],
                       closed: asyncio.Event) -> bytes | None:
    """Send a request of our own (not a recorded one, so never counted) and wait for its answer; None without one."""
    if closed.is_set():  # the read loop has answered its waiters already: nobody would answer this one
        return None
    sent = parse_request(frame)
    cid = sent.correlation_id
    fut = waiters[cid] = asyncio.get_running_loop().create_future()
    inflight[cid] = (None, sent)
    try:
        writer.write(frame)
        await writer.drain()
    except (ConnectionError, OSError):
        inflight.pop(cid, None)
        waiters.pop(cid, None)
        return None
    got = await _answer(rp, fut, cid, waiters)
    if got is None:
        inflight.pop(cid, None)  # not one to wait for when the connection winds down
    return got


def sasl_refusal(step: str, sent: RequestFrame, answer: bytes) -> str | None:
    """The note for a SASL step (`handshake`, `authenticate`) the target refused; None when it succeeded.

    `sasl_<step>_error:<NAME>`, NAME being Kafka's own (`protocol.errors.error_name`, as broker
    logs and the set-up's refusal line spell it): a bare code left the operator to look it up,
    and the summary's hint (`replay.schedule.note_hint`) goes by the name. The answer is the
    broker's; the request's token is never part of a note.
    """
    try:
        code = decode_response(sent, answer).error_code
    except Exception:  # noqa: BLE001 — an answer that cannot be read is no authentication either
        return f"sasl_{step}_answer_undecodable"
    return None if code == 0 else f"sasl_{step}_error:{error_name(code)}"


async def _sasl_own(rp: ReplaySchedule, rc: RecordedConnection, cs: ConnState, cid: int,
                    writer: asyncio.StreamWriter, inflight: dict[int, tuple[int | None, Any]],
                    waiters: dict[int, asyncio.Future], closed: asyncio.Event, success_note: str) -> int:
    """A SaslHandshake of our own (correlation id `cid`), then SaslAuthenticate; the last correlation id used.

    Before the first recorded request (see `authenticates_first`), and to renew a session whose
    lifetime runs out (`replay.reauth`): Kafka re-authenticates with the same two requests on the
    same connection.
    """
    frame = sasl_plain_handshake(rc.client_id, cid)
    answer = await _own_request(rp, frame, writer, inflight, waiters, closed)
    return await _sasl_authenticate(rp, rc, cs, parse_request(frame), answer, writer, inflight, waiters, closed,
                                    success_note)


async def _sasl_authenticate(rp: ReplaySchedule, rc: RecordedConnection, cs: ConnState, handshake: RequestFrame,
                             answer: bytes | None, writer: asyncio.StreamWriter,
                             inflight: dict[int, tuple[int | None, Any]], waiters: dict[int, asyncio.Future],
                             closed: asyncio.Event, success_note: str) -> int:
    """After a SaslHandshake (replayed, or our own) answered `answer`, authenticate with the user's PLAIN credentials.

    The credentials go out only after a handshake the target accepted: one that refused PLAIN
    (UNSUPPORTED_SASL_MECHANISM) or takes no SASL at all (ILLEGAL_SASL_STATE: a PLAINTEXT
    listener answers every SASL request so) gets no password. Every outcome is a note
    (`success_note` for an accepted one). An accepted one sets when the session must be renewed
    (`cs.reauth_at`, from the lifetime the target answered); any other outcome clears it. Returns
    the last correlation id used on the connection.
    """
    assert rp.opt.sasl_plain is not None
    cs.reauth_at = None
    cid = handshake.correlation_id
    if answer is None:
        rp.state.note("sasl_handshake_unanswered")
        return cid
    refused = sasl_refusal("handshake", handshake, answer)
    if refused is not None:
        rp.state.note(refused)
        return cid
    user, password = rp.opt.sasl_plain
    version = rc.sasl_version if rc.sasl_version is not None else AUTHENTICATE_VERSION
    frame = sasl_plain_authenticate(version, user, password, rc.client_id, cid + 1)
    got = await _own_request(rp, frame, writer, inflight, waiters, closed)
    if got is None:
        rp.state.note("sasl_authenticate_unanswered")
        return cid + 1
    sent = parse_request(frame)
    refused = sasl_refusal("authenticate", sent, got)
    rp.state.note(refused or success_note)
    if refused is None:
        cs.authenticated = True
        cs.reauth_at = renewal_time(asyncio.get_running_loop().time(), session_lifetime_ms(sent, got))
    return cid + 1
