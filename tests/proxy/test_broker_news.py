"""Cluster mode's broker news between `--workers` (proxy.broker_news), with real sockets in one process.

The registries' side is pure bookkeeping (a clock and a bind callback given); two `BrokerNews`
over one `Mailboxes` stand for two workers. The end-to-end test, a broker that moves under
`kafkatap proxy --workers 2`, is in test_cluster_workers.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Iterator

import pytest
from structlog.testing import capture_logs

from proxy.broker_news import BrokerNews, decode, encode
from proxy.cluster import BrokerRegistry, ClusterConfig
from proxy.mailboxes import Mailboxes, MailSpec

_OPENED: list[Mailboxes | BrokerNews] = []


@pytest.fixture(autouse=True)
def _close_what_was_opened() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def _registry(clock: Callable[[], int] | None = None) -> tuple[BrokerRegistry, list[int]]:
    """A registry whose binds are recorded (node ids), on a clock the test may give."""
    bound: list[int] = []
    kw = {"clock": clock} if clock is not None else {}
    reg = BrokerRegistry("proxy", ClusterConfig(("b", 1), ("proxy", 19092)).port_for,
                         bind=lambda r: bound.append(r.node_id) or r.listen_port, **kw)
    return reg, bound


def _ticks(start: int = 100) -> Callable[[], int]:
    now = [start]

    def clock() -> int:
        now[0] += 1
        return now[0]

    return clock


def test_a_worker_announces_only_what_is_new_or_moved_and_never_what_a_sibling_said() -> None:
    reg, bound = _registry(_ticks())
    told: list[tuple[int, str, int, int]] = []
    reg.on_learned = lambda *learning: told.append(learning)
    reg.learn(1, "10.0.0.1", 9092)
    reg.learn(1, "10.0.0.1", 9092)  # the same again: nothing new
    reg.learn(1, "10.0.0.9", 9092)  # moved
    assert told == [(1, "10.0.0.1", 9092, 101), (1, "10.0.0.9", 9092, 103)]
    assert reg.learn_from_sibling(2, "10.0.0.2", 9092, 50)  # a broker it had not seen: listener bound, not told on
    assert bound == [1, 2] and reg.upstream(2) == ("10.0.0.2", 9092) and len(told) == 2
    assert reg.learn_from_sibling(1, "10.0.0.7", 9092, 500)  # a later move elsewhere: followed, not told on
    assert reg.upstream(1) == ("10.0.0.7", 9092) and reg.by_upstream[("10.0.0.7", 9092)] == 1 and len(told) == 2


def test_the_later_learning_wins_whichever_worker_made_it() -> None:
    reg, _ = _registry(_ticks(1000))
    reg.learn(1, "10.0.0.1", 9092)  # at 1001, here
    assert not reg.learn_from_sibling(1, "10.0.0.0", 9092, 900)  # a sibling's older news waited in the mailbox
    assert reg.upstream(1) == ("10.0.0.1", 9092)
    assert not reg.learn_from_sibling(1, "10.0.0.1", 9092, 2000)  # the same address, said later: its time counts
    assert not reg.learn_from_sibling(1, "10.0.0.5", 9092, 1500)  # older than that
    assert reg.learn_from_sibling(1, "10.0.0.5", 9092, 2001)
    assert reg.upstream(1) == ("10.0.0.5", 9092) and ("10.0.0.1", 9092) not in reg.by_upstream
    assert reg.stats.brokers_seen == 1


def test_an_address_seen_again_here_is_newer_than_a_siblings_older_news() -> None:
    """This worker relays node 1 at X again after a sibling saw it at Y: the sibling's news, read later from the
    mailbox, is older than this worker's own latest sight and must not move the node back."""
    times = iter((1001, 1007))
    reg, _ = _registry(lambda: next(times))
    reg.learn(1, "10.0.0.1", 9092)  # at 1001
    reg.learn(1, "10.0.0.1", 9092)  # at 1007: the same address, seen again
    assert not reg.learn_from_sibling(1, "10.0.0.9", 9092, 1005)  # said by a sibling at 1005, read only now
    assert reg.upstream(1) == ("10.0.0.1", 9092)


def test_messages_decode_only_as_lists_of_learnings() -> None:
    assert decode(encode([(1, "h", 9092, 5)])) == [(1, "h", 9092, 5)]
    for bad in (b"", b"\xff", b"{}", b'[[1, "h", 9092]]', b'[[1, 2, 3, 4]]', b'[["1", "h", 1, 2]]',
                b'[[true, "h", 1, 2]]', b'[[1, "", 1, 2]]', b'[[1, "h", 70000, 2]]'):
        with pytest.raises(ValueError):
            decode(bad)


def _two_workers() -> tuple[Mailboxes, BrokerNews, BrokerNews]:
    boxes = Mailboxes(2)
    _OPENED.append(boxes)
    news = []
    for i in range(2):
        spec = boxes.spec(i)  # each worker owns its copies of what it would inherit
        one = BrokerNews(MailSpec(i, os.dup(spec.mailbox_fd), tuple(os.dup(fd) for fd in spec.inbox_fds)))
        _OPENED.append(one)
        news.append(one)
    return boxes, news[0], news[1]


def _applying(reg: BrokerRegistry, arrived: asyncio.Event) -> Callable[[int, str, int, int], bool]:
    def apply(node: int, host: str, port: int, at: int) -> bool:
        changed = reg.learn_from_sibling(node, host, port, at)
        arrived.set()
        return changed

    return apply


def test_what_one_worker_learns_reaches_the_other_in_one_message_and_stops_there() -> None:
    async def run() -> None:
        _, n0, n1 = _two_workers()
        (r0, _), (r1, bound1) = _registry(), _registry()
        r0.on_learned, r1.on_learned = n0.announce, n1.announce
        r0.learn(1, "10.0.0.1", 9092)  # discovery at start, before the loop's news start: waits, then goes out
        loop, got0, got1 = asyncio.get_running_loop(), asyncio.Event(), asyncio.Event()
        n0.start(loop, _applying(r0, got0))
        n1.start(loop, _applying(r1, got1))
        await asyncio.wait_for(got1.wait(), 5)
        assert r1.upstream(1) == ("10.0.0.1", 9092) and bound1 == [1]
        got1.clear()
        for node in (1, 2, 3):  # one Metadata answer: a move and two new brokers
            r0.learn(node, f"10.0.1.{node}", 9092)
        await asyncio.wait_for(got1.wait(), 5)
        assert [r1.upstream(n) for n in (1, 2, 3)] == [(f"10.0.1.{n}", 9092) for n in (1, 2, 3)]
        assert bound1 == [1, 2, 3]
        assert n0.stats() == {"sent": 4, "applied": 0, "lost": 0}
        assert n1.stats() == {"sent": 0, "applied": 4, "lost": 0}  # applied, never told back
        assert not got0.is_set()

    asyncio.run(run())


async def _next_turn() -> None:
    """Return after the callbacks already scheduled with call_soon (the announcements' flush) have run."""
    loop = asyncio.get_running_loop()
    turn = loop.create_future()
    loop.call_soon(turn.set_result, None)
    await turn


def test_a_broken_channel_is_counted_and_logged_once_and_the_worker_goes_on() -> None:
    async def run() -> None:
        boxes, n0, n1 = _two_workers()
        r1, _ = _registry()
        loop, got1 = asyncio.get_running_loop(), asyncio.Event()
        n0.start(loop, lambda *_: False)
        n1.start(loop, _applying(r1, got1))
        inbox1 = boxes.pairs[1][0]
        inbox1.send(b"not json")
        inbox1.send(b'[[1, "10.0.0.1", 9092]]')
        inbox1.send(b'[[-1, "10.0.0.1", 9092, 5]]')  # names no broker
        inbox1.send(encode([(2, "10.0.0.2", 9092, 7)]))
        while 2 not in r1.nodes:  # the good message after the bad ones
            got1.clear()
            await asyncio.wait_for(got1.wait(), 5)
        assert n1.stats()["lost"] == 3 and list(r1.nodes) == [2] and r1.upstream(2) == ("10.0.0.2", 9092)
        n1.stop()  # worker 1 stuck: its mailbox fills up
        while True:
            try:
                inbox1.send(b"x" * 4096)
            except BlockingIOError:
                break
        n0.announce(3, "10.0.0.3", 9092, 9)
        n0.announce(4, "10.0.0.4", 9092, 9)
        await _next_turn()
        assert n0.stats() == {"sent": 2, "applied": 0, "lost": 2}  # one message of two learnings, not delivered
        n0.announce(5, "10.0.0.5", 9092, 9)
        await _next_turn()
        assert n0.stats()["lost"] == 3

    with capture_logs() as logs:
        asyncio.run(run())
    events = [e["event"] for e in logs]
    assert sum("unreadable broker news" in e for e in events) == 1
    assert sum("could not be told of a broker change" in e for e in events) == 1


def test_the_parent_gives_each_worker_its_mailbox_and_every_inbox() -> None:
    boxes = Mailboxes(3)
    _OPENED.append(boxes)
    spec = boxes.spec(1)
    assert MailSpec.parse(spec.render()) == spec
    assert boxes.fds(1) == (spec.mailbox_fd, *spec.inbox_fds) and len(spec.inbox_fds) == 3
    boxes.pairs[1][0].send(b"to worker 2")
    with socket.socket(fileno=os.dup(spec.mailbox_fd)) as mailbox:
        assert mailbox.recv(100) == b"to worker 2"
