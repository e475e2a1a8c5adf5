"""Replay one recorded connection: open it, send its requests in order, read the target's answers.

Why apart from `replay.engine`: the engine decides *when* (the recorded
offsets scaled by the speed, or the global order at --speed max) and keeps the
totals; this module is what happens on one TCP connection — the rewrite of
each request (`replay.rewrite`), renumbered correlation ids, the recorded
pipelining (a request waits for exactly the responses its client had), what
the target's answers teach (`replay.learn`), and the two extra requests of
our own a connection may need (a JoinGroup member-id round, SASL PLAIN).
Every request ends counted in the result: sent, answered, failed or skipped.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from harness.wire import AsyncWireClient
from protocol.apis import SASL_HANDSHAKE
from protocol.frames import expects_response, parse_request, response_correlation_id, set_correlation_id
from replay.learn import learn_from_response
from replay.load import RecordedConnection
from replay.messages import decode_response
from replay.rewrite import rewrite_request, sasl_plain_authenticate
from replay.schedule import ReplaySchedule
from replay.state import ConnState, Pending, Send, Skip


__all__ = ["replay_connection"]


async def replay_connection(rp: ReplaySchedule, rc: RecordedConnection, host: str, port: int) -> None:
    res = rp.result
    cs = ConnState(rc.client_id)
    reqs = rc.requests
    done = [False] * len(reqs)  # answered, failed or skipped: what deps wait on
    first = reqs[0]
    if rp.opt.speed:
        await rp.sleep_until(rp.at(rc.opened_ns))
    else:
        await rp.wait_for(lambda: rp.dispatch_ptr >= first.index, None)
    try:
        wire = await AsyncWireClient.connect(host, port, client_id=rc.client_id, timeout=None,
                                             connect_timeout=rp.opt.connect_timeout)
    except (OSError, asyncio.TimeoutError) as exc:
        for r in reqs:
            res.failed += 1
            res.failures[f"connect_failed: {exc}"] += 1
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
                learn_from_response(sent, data, rp.state, cs)
                if pos is not None:  # None: an extra request of our own (member id negotiation)
                    res.answered += 1
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
    last_sent_at = asyncio.get_running_loop().time()
    try:
        for pos, r in enumerate(reqs):
            if rp.opt.speed:
                scheduled = rp.at(r.ts_ns)
                await rp.sleep_until(scheduled)
            else:
                scheduled = None
                await rp.wait_for(lambda r=r: rp.dispatch_ptr >= r.index, None)
            deps = r.deps
            ok = await rp.wait_for(lambda deps=deps: all(done[j] for j in deps) or closed.is_set(),
                               rp.opt.response_timeout)
            if not ok:
                rp.state.note("sent_before_recorded_response_arrived")
            if closed.is_set():
                res.failed += 1
                res.failures["not sent: target closed the connection"] += 1
                await rp.settle(done, pos, r.index)
                continue
            outcome = rewrite_request(r.frame, rp.state, cs)
            if isinstance(outcome, Pending):
                got: list[Any] = [outcome]

                def settled(r: Any = r, got: list[Any] = got) -> bool:
                    got[0] = rewrite_request(r.frame, rp.state, cs)
                    return not isinstance(got[0], Pending) or closed.is_set()

                await rp.wait_for(settled, rp.opt.pending_timeout)
                outcome = got[0]
                if isinstance(outcome, Pending):
                    outcome = Skip(outcome.reason)
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
                await rp.settle(done, pos, r.index)
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
            rp.dispatch(r.index)
            await rp.notify()
            if sent.api_key == SASL_HANDSHAKE and rp.opt.sasl_plain is not None:
                await _sasl_authenticate(rp, rc, writer, inflight, waiters, pos, next_cid, closed)
                next_cid += 1
        # wait for outstanding responses, then close when the recorded client closed
        await rp.wait_for(lambda: not inflight or closed.is_set(), rp.opt.response_timeout)
        if rp.opt.speed and rc.closed_ns and rc.end_by == "client":
            # the recorded close time, but never sooner after our last request than the client waited
            # (a broker that hangs up after an acks=0 produce must get the same chance to do so)
            gap = max(0, rc.closed_ns - reqs[-1].ts_ns) / 1e9 / rp.opt.speed
            close_at = max(rp.at(rc.closed_ns), last_sent_at + gap)
            try:
                await asyncio.wait_for(closed.wait(), max(0.0, close_at - asyncio.get_running_loop().time()))
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
        if inflight:
            for _cid, (pos, _s) in list(inflight.items()):
                if pos is not None:
                    res.failed += 1
                    res.failures["unanswered: response timeout"] += 1
            inflight.clear()
    finally:
        # whatever happened, this connection's requests must not hold up the global order (--speed max)
        for r in reqs:
            if not rp.dispatched[r.index]:
                rp.dispatch(r.index)
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


async def _sasl_authenticate(rp: ReplaySchedule, rc: RecordedConnection, writer: asyncio.StreamWriter,
                             inflight: dict[int, tuple[int, Any]], waiters: dict[int, asyncio.Future],
                             pos: int, handshake_cid: int, closed: asyncio.Event) -> None:
    """After a replayed SaslHandshake, authenticate with the user's PLAIN credentials."""
    assert rp.opt.sasl_plain is not None
    fut = asyncio.get_running_loop().create_future()
    waiters[handshake_cid] = fut
    try:
        if handshake_cid in inflight:
            await asyncio.wait_for(fut, rp.opt.response_timeout)
    except asyncio.TimeoutError:
        rp.state.note("sasl_handshake_unanswered")
        return
    cid = handshake_cid + 1
    frame = sasl_plain_authenticate(rc.sasl_version if rc.sasl_version is not None else 1,
                                    rp.opt.sasl_plain[0], rp.opt.sasl_plain[1], rc.client_id, cid)
    fut2 = asyncio.get_running_loop().create_future()
    waiters[cid] = fut2
    inflight[cid] = (None, parse_request(frame))  # our own request: not one of the recorded ones
    try:
        writer.write(frame)
        await writer.drain()
        got = await asyncio.wait_for(fut2, rp.opt.response_timeout)
    except (asyncio.TimeoutError, ConnectionError, OSError):
        got = None
    if got is None:
        rp.state.note("sasl_authenticate_failed")
        return
    sent = parse_request(frame)
    try:
        err = decode_response(sent, got).error_code if len(got) > 8 else 0
    except Exception:  # noqa: BLE001
        err = 0
    rp.state.note("sasl_authenticated_with_given_credentials" if err == 0 else f"sasl_authenticate_error_{err}")
