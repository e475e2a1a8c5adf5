"""The relay's socket-free units: send stamps, frame capture, the observer, rows from facts.

Everything here runs without a socket or an event loop: bytes, clocks and
"the kernel took N bytes" notices are passed in by hand, which is exactly how
the relay drives these units.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from protocol.deep import message_class
from protocol.stream import KafkaStream
from proxy import rows
from proxy.capture import FrameCapture
from proxy.facts import ConnectionFacts, End
from proxy.observer import Observer
from proxy.timing import SendStamps
from recording.schema import CONNECTION_COLUMNS, REQUEST_COLUMNS


def _request(api_key: int, version: int, body: dict[str, Any], corr: int) -> bytes:
    msg = message_class(api_key, True)[version](**body)
    msg.with_header(correlation_id=corr, client_id="unit")
    return bytes(msg.encode(framed=True, header=True))


def _response(api_key: int, version: int, body: dict[str, Any], corr: int) -> bytes:
    msg = message_class(api_key, False)[version](**body)
    msg.with_header(correlation_id=corr)
    return bytes(msg.encode(framed=True, header=True))


def _api_versions(corr: int) -> tuple[bytes, bytes]:
    return _request(18, 0, {}, corr), _response(18, 0, {"error_code": 0, "api_keys": []}, corr)


def _acks0_produce(corr: int) -> bytes:
    cls = message_class(0, True)
    topic = cls.TopicProduceData(name="orders", partition_data=[])
    return _request(0, 3, {"transactional_id": None, "acks": 0, "timeout_ms": 1000, "topic_data": [topic]}, corr)


# ---------------------------------------------------------------- SendStamps
def test_stamps_flush_at_hand_over_unless_blocked_then_at_drain():
    s: SendStamps[str] = SendStamps()
    s.handed(10, now_ns=100)
    assert (s.flushed, s.flushed_ns) == (10, 100)
    assert s.sent_at(10, "a") == 100  # already flushed: stamped at once, nothing queued
    assert not s.waiting
    s.block()
    s.handed(5, now_ns=200)  # the kernel did not take it all
    assert s.flushed == 10
    assert s.sent_at(15, "b") is None and s.sent_at(15, "c") is None and s.waiting
    assert list(s.settled()) == []
    s.drained(now_ns=300)
    assert list(s.settled()) == [("b", 300), ("c", 300)]
    assert not s.waiting


def test_stamps_settle_in_offset_order_and_forget_one():
    s: SendStamps[str] = SendStamps()
    s.block()
    s.handed(30, 1)
    for end, name in ((10, "x"), (20, "y"), (30, "z")):
        assert s.sent_at(end, name) is None
    s.forget("y")
    s.drained(50)
    assert list(s.settled()) == [("x", 50), ("z", 50)]
    s.block()
    s.handed(10, 60)
    s.sent_at(40, "left")
    assert list(s.drain_all()) == ["left"] and not s.waiting


# ---------------------------------------------------------------- FrameCapture
def test_capture_cuts_frames_across_chunks_and_releases_what_it_took():
    cap = FrameCapture()
    stream = b"AAAA" + b"BBBBBB" + b"CC"
    for i in range(0, len(stream), 3):  # chunk boundaries fall inside frames
        cap.append(stream[i:i + 3])
    assert cap.take(0, 4, api_key=18) == b"AAAA"
    assert cap.take(4, 6, api_key=3) == b"BBBBBB"
    assert cap.held == 2  # only the unfinished frame stays
    assert cap.take(10, 2, api_key=3) == b"CC" and cap.held == 0


def test_capture_cuts_every_frame_whatever_the_chunking_and_never_aliases_a_mutable_chunk():
    """Chunks are kept without a copy while nothing is left over (issue 16): frames must still come out exact,
    for bytes, read-only views and bytearrays (copied: the caller may reuse one), frames skipped or not."""
    import random

    rnd = random.Random(5)
    for _ in range(200):
        frames = [rnd.randbytes(rnd.randrange(1, 300)) for _ in range(rnd.randrange(1, 30))]
        stream = b"".join(frames)
        ends, pos = [], 0
        for f in frames:
            pos += len(f)
            ends.append(pos)
        cap, fed, k = FrameCapture(), 0, 0
        while fed < len(stream):
            chunk = stream[fed:fed + rnd.randrange(1, 400)]
            kind = rnd.randrange(3)
            if kind == 2:
                mutable = bytearray(chunk)
                cap.append(mutable)
                mutable[:] = b"\xff" * len(mutable)  # reused by its owner right after
            else:
                cap.append(chunk if kind == 0 else memoryview(chunk))
            fed += len(chunk)
            while k < len(frames) and ends[k] <= fed:
                if rnd.random() < 0.1 and k + 1 < len(frames):  # a frame nobody takes (decoder skipped it)
                    k += 1
                    continue
                got = cap.take(ends[k] - len(frames[k]), len(frames[k]), api_key=0)
                assert type(got) is bytes and got == frames[k]
                k += 1
        assert cap.held <= len(stream) - ends[k - 1]


def test_capture_never_keeps_sasl_authenticate_but_moves_past_it():
    cap = FrameCapture()
    cap.append(b"secret" + b"next")
    assert cap.take(0, 6, api_key=36) is None
    assert cap.take(6, 4, api_key=18) == b"next"


# ---------------------------------------------------------------- Observer
class _Rows:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.frames: list[dict[str, Any]] = []

    def request(self, row: dict[str, Any]) -> None:
        self.requests.append(row)

    def frame(self, row: dict[str, Any]) -> None:
        self.frames.append(row)


def _observer(capture: str = "none") -> tuple[Observer, SendStamps, SendStamps, _Rows, list]:
    facts = ConnectionFacts(proxy_id="p", conn_id="c1", listener="127.0.0.1:1", mode="explicit", opened_ns=0,
                            client_addr="127.0.0.1:2", broker_addr="127.0.0.1:3")
    req, resp, out, logged = SendStamps(), SendStamps(), _Rows(), []
    obs = Observer(KafkaStream(), facts, req, resp, out, lambda level, event, **kw: logged.append((level, event)),
                   capture=capture)
    return obs, req, resp, out, logged


def _relay(obs: Observer, stamps: SendStamps, request: bool, data: bytes, read_ns: int, written_ns: int,
           step: int | None = None) -> None:
    """What the relay does with a chunk: write it (the kernel takes it at written_ns), then observe it."""
    step = step or len(data)
    for i in range(0, len(data), step):
        chunk = data[i:i + step]
        stamps.handed(len(chunk), written_ns)
        obs.feed(request, chunk, read_ns)


@pytest.mark.parametrize("step", [None, 1], ids=["whole", "byte-by-byte"])
def test_observer_pairs_and_stamps_the_six_times(step):
    obs, req, resp, out, _ = _observer(capture="all")
    q, a = _api_versions(corr=41)
    _relay(obs, req, True, q, read_ns=1_000, written_ns=1_500, step=step)
    assert out.requests == [] and obs.facts.inflight == 1
    _relay(obs, resp, False, a, read_ns=9_000, written_ns=9_700, step=step)
    (row,) = out.requests
    assert set(row) == {c.name for c in REQUEST_COLUMNS}
    assert (row["status"], row["correlation_id"], row["api_name"]) == ("answered", 41, "ApiVersions")
    assert (row["req_first_ns"], row["req_sent_ns"], row["resp_first_ns"], row["resp_sent_ns"]) == (1_000, 1_500, 9_000, 9_700)
    assert row["latency_us"] == 8 and row["broker_latency_us"] == 7
    assert obs.facts.inflight == 0 and obs.facts.from_client.frames == 1 and obs.facts.from_broker.frames == 1
    assert [f["data"] for f in out.frames] == [q, a]


def test_observer_reports_the_first_cluster_id_a_response_carries_before_its_row():
    """Metadata v0/v1 carries no cluster id; the first answer that does (here v12) is reported once, before the
    request's row leaves (so the row's way out finds the broker's id known and asks the broker nothing)."""
    from protocol.deep import encode_request, encode_response

    facts = ConnectionFacts(proxy_id="p", conn_id="c1", listener="127.0.0.1:1", mode="explicit", opened_ns=0)
    req, resp, out, told = SendStamps(), SendStamps(), _Rows(), []
    obs = Observer(KafkaStream(), facts, req, resp, out, lambda *a, **k: None,
                   on_cluster=lambda cluster: told.append((cluster, len(out.requests))))
    md = {"brokers": [], "controller_id": 1, "topics": []}
    md12 = {**md, "throttle_time_ms": 0, "cluster_id": "the-cluster"}
    ask12 = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
    dc = {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "endpoint_type": 1, "cluster_id": "another",
          "controller_id": 1, "brokers": [], "cluster_authorized_operations": -2147483648}
    for corr, (key, version, ask, answer) in enumerate([
            (3, 1, {"topics": None}, md), (3, 12, ask12, md12), (3, 12, ask12, md12),
            (60, 1, {"include_cluster_authorized_operations": False, "endpoint_type": 1}, dc)], 1):
        _relay(obs, req, True, encode_request(key, version, corr, "unit", ask), read_ns=corr * 10, written_ns=corr * 10)
        _relay(obs, resp, False, encode_response(key, version, corr, answer), read_ns=corr * 10 + 5,
               written_ns=corr * 10 + 5)
    assert len(out.requests) == 4
    assert told == [("the-cluster", 1)]  # once per connection, while the v1 answer's row was the only one out


def test_observer_reports_each_answers_topic_pairs_after_the_cluster_id_and_before_its_row():
    """Every Metadata (v10+) / CreateTopics (v7+) answer's topic id ↔ name pairs are reported, each time (a map that
    forgot a pair learns it again), after the connection's cluster id (the `topics/` rows of those pairs carry it)
    and before the request's row leaves (the rows after it name those ids). Metadata v9 carries no ids: nothing."""
    import uuid

    from protocol.deep import encode_request, encode_response

    facts = ConnectionFacts(proxy_id="p", conn_id="c1", listener="127.0.0.1:1", mode="explicit", opened_ns=0)
    req, resp, out, told = SendStamps(), SendStamps(), _Rows(), []
    obs = Observer(KafkaStream(), facts, req, resp, out, lambda *a, **k: None,
                   on_cluster=lambda cluster: told.append(("cluster", cluster, len(out.requests))),
                   on_topics=lambda pairs: told.append(
                       ("topics", [(str(uuid.UUID(bytes=raw)), name) for raw, name in pairs], len(out.requests))))
    orders, new = str(uuid.uuid4()), str(uuid.uuid4())

    def md(version: int) -> dict[str, Any]:
        topic = {"error_code": 0, "name": "orders", "topic_id": orders, "is_internal": False, "partitions": [],
                 "topic_authorized_operations": -2147483648}
        if version < 10:
            del topic["topic_id"]
        return {"throttle_time_ms": 0, "brokers": [], "cluster_id": "the-cluster", "controller_id": 1,
                "topics": [topic]}

    ask = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
    created = {"throttle_time_ms": 0, "topics": [{"name": "new", "topic_id": new, "error_code": 0, "error_message": None,
                                                   "num_partitions": 1, "replication_factor": 1, "configs": []}]}
    for corr, (key, version, q, answer) in enumerate([
            (3, 9, ask, md(9)), (3, 12, ask, md(12)), (3, 12, ask, md(12)),
            (19, 7, {"topics": [], "timeout_ms": 1000, "validate_only": False}, created)], 1):
        _relay(obs, req, True, encode_request(key, version, corr, "unit", q), read_ns=corr * 10, written_ns=corr * 10)
        _relay(obs, resp, False, encode_response(key, version, corr, answer), read_ns=corr * 10 + 5,
               written_ns=corr * 10 + 5)
    assert len(out.requests) == 4
    assert told == [("cluster", "the-cluster", 0), ("topics", [(orders, "orders")], 1),
                    ("topics", [(orders, "orders")], 2), ("topics", [(new, "new")], 3)]


def test_observer_waits_for_the_drain_when_the_broker_socket_is_full():
    obs, req, resp, out, _ = _observer()
    q, a = _api_versions(corr=5)
    req.block()  # the broker's socket buffer is full: the request is not sent yet
    _relay(obs, req, True, q, read_ns=100, written_ns=100)
    req.drained(400)
    obs.settle(True)
    _relay(obs, resp, False, a, read_ns=900, written_ns=950)
    (row,) = out.requests
    assert row["req_sent_ns"] == 400


def test_observer_acks0_produce_is_recorded_once_flushed_without_response():
    obs, req, _, out, _ = _observer()
    frame = _acks0_produce(corr=9)
    req.block()
    _relay(obs, req, True, frame, read_ns=10, written_ns=10)
    assert out.requests == []  # not sent yet
    req.drained(70)
    obs.settle(True)
    (row,) = out.requests
    assert (row["status"], row["acks"], row["req_sent_ns"]) == ("no_response", 0, 70)
    assert obs.facts.inflight == 0


def test_observer_close_reports_unanswered_and_truncated():
    obs, req, _, out, logged = _observer()
    q, _ = _api_versions(corr=3)
    _relay(obs, req, True, q + q[:5], read_ns=10, written_ns=20)
    obs.close(now_ns=99)
    (row,) = out.requests
    assert row["status"] == "unanswered" and row["req_sent_ns"] == 20
    assert obs.facts.unanswered_at_end == 1
    assert "truncated" in obs.facts.opaque_reason and logged.count(("warning", "stream not parsed from here on; bytes still relayed unchanged")) == 1


def test_an_opaque_stream_on_a_connection_closed_for_it_is_not_said_to_be_relayed():
    """Cluster mode closes a connection whose editing stopped (TLS, garbage): the log said 'bytes still relayed
    unchanged' right after 'editing stopped, connection closed'."""
    from proxy.facts import End

    obs, req, _, _, logged = _observer()
    obs.facts.end = End("edit_stopped", "proxy", "editing stopped (TLS)", None, 5)
    _relay(obs, req, True, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40), read_ns=10, written_ns=20)
    said = [e for level, e in logged if level == "warning" and e.startswith("stream not parsed")]
    assert said == ["stream not parsed from here on; the connection is closed (its editing stopped)"], logged


def test_observer_decoder_failure_makes_the_connection_opaque_once():
    obs, req, _, _, logged = _observer()

    class Broken(KafkaStream):
        def receive_request_data(self, data: bytes, now_ns: int) -> None:
            raise RuntimeError("boom")

    obs.stream = Broken()
    obs.feed(True, b"\x00\x00\x00\x01x", 1)
    obs.feed(True, b"more", 2)  # no second failure: observation stopped
    assert not obs.parsing and obs.facts.opaque_kind == "decoder_error"
    assert [lvl for lvl, _ in logged] == ["error"]


# ---------------------------------------------------------------- rows from facts
def test_connection_row_is_built_from_plain_facts():
    f = ConnectionFacts(proxy_id="p", conn_id="c9", listener="l", mode="transparent", opened_ns=1_000_000,
                        client_addr="10.0.0.1:5", original_dst="10.0.0.2:9092", broker_addr="10.0.0.2:9092")
    f.from_client.bytes, f.from_broker.bytes = 10, 20
    f.last.api, f.last.acks, f.last.topics = "Produce", 0, ["t"]
    f.closed_ns = 5_000_000
    f.end = End("broker_fin", "broker", None, 3, 5_000_000)
    f.inferred = f"because {f.end_facts().end_by}"
    row = rows.connection_row(f, True, now_ns=5_000_000)
    assert set(row) == {c.name for c in CONNECTION_COLUMNS}
    assert (row["end_reason"], row["end_by"], row["duration_us"]) == ("broker_fin", "broker", 4_000)
    assert (row["bytes_from_client"], row["bytes_from_broker"], row["last_request_acks"]) == (10, 20, 0)
    assert row["inferred_cause"] == "because broker"
    snap = rows.connection_row(f, False, now_ns=2_000_000)
    assert snap["end_reason"] == "open" and snap["inferred_cause"] is None and snap["duration_us"] == 1_000


@pytest.mark.parametrize("mode", ["explicit", "transparent"])
def test_upstream_connect_tries_each_address_and_bounds_the_lookup(mode: str) -> None:
    """A name with several addresses is tried address by address (only the first was); a resolver that does
    not answer is bounded by --connect-timeout (the lookup ran outside it). Connections of every mode connect
    through the loop guard (`proxy.loop_guard`), which keeps only the socket that connected."""
    import socket
    import time
    from types import SimpleNamespace

    from proxy.connection import Connection
    from proxy.loop_guard import RedirectLoopGuard

    with socket.create_server(("127.0.0.1", 0)) as up:
        port = up.getsockname()[1]
        loop = asyncio.new_event_loop()
        guard = RedirectLoopGuard()
        try:
            conn = object.__new__(Connection)
            conn.ctx = SimpleNamespace(loop=loop, settings=SimpleNamespace(connect_timeout=1.0, so_mark=None), hub=None,
                                       loop_guard=guard)
            conn.facts = SimpleNamespace(mode=mode, end=None)

            async def two_addresses(host, port_, **kw):  # nobody listens on 127.0.0.2
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port_)) for a in ("127.0.0.2", "127.0.0.1")]

            loop.getaddrinfo = two_addresses  # type: ignore[method-assign]
            sock = loop.run_until_complete(conn._connected_socket("broker.example", port))
            assert sock.getpeername() == ("127.0.0.1", port)
            # every mode connects through the guard (an explicit upstream can be the proxy's own listener too):
            # the refused 127.0.0.2 attempt is forgotten, the connected socket is known
            me, broker = sock.getsockname(), ("127.0.0.1", port)
            assert len(guard) == 1 and guard.owner_of(me, broker) is conn and conn._upstream_key == (me, broker)
            # a client from the same local address to another broker is not this socket (Linux shares source
            # ports across destinations: 632 of 3,000 local clients were refused as loops when keyed by address)
            assert guard.owner_of(me, ("127.0.0.1", port + 1)) is None
            conn._close_unused(sock)  # dropped unused (the client left as the connect returned): entry gone
            assert len(guard) == 0
            sock.close()

            async def never(host, port_, **kw):
                await asyncio.Event().wait()

            loop.getaddrinfo = never  # type: ignore[method-assign]
            t0 = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                loop.run_until_complete(conn._connected_socket("broker.example", port))
            assert time.monotonic() - t0 < 5
        finally:
            loop.close()


def test_the_loop_guard_forgets_only_its_own_entry() -> None:
    """Two owners under one key (a port reused after an entry outlived its socket): the first one's forget must not
    drop the second's."""
    from proxy.loop_guard import RedirectLoopGuard

    guard = RedirectLoopGuard()
    key = (("10.0.0.1", 40000), ("10.0.0.2", 9092))
    a, b = object(), object()
    guard._owners[key] = a
    guard._owners[key] = b
    guard.forget(key, a)
    assert guard.owner_of(("::ffff:10.0.0.1", 40000), ("10.0.0.2", 9092)) is b  # IPv4-mapped peers read as IPv4
    guard.forget(key, b)
    assert len(guard) == 0


def test_transparent_listeners_on_both_wildcards_are_bound_once(sink) -> None:
    """`--listen 0.0.0.0:P --listen [::]:P` in transparent mode: the 0.0.0.0 route added its own [::]:P listener
    as well, and the proxy failed on "address in use" (with --workers, each worker bound [::]:P twice)."""
    import socket

    from harness.kafka import free_port
    from proxy.running import RunningProxy

    port = free_port("0.0.0.0")
    with RunningProxy([f"0.0.0.0:{port}", f"[::]:{port}"], sink=sink) as p:
        bound = sorted(p.server._listen_addrs)
        for host in ("127.0.0.1", "::1"):  # both families accepted (and reset: nothing redirected them)
            try:
                socket.create_connection((host, port), timeout=5).close()
            except ConnectionResetError:
                pass
        finals = sink.wait_final(2)
    assert bound == [("0.0.0.0", port), ("::", port)]
    assert sorted(f["listener"] for f in finals) == [f"0.0.0.0:{port}", f"[::]:{port}"]


def test_the_blamed_request_is_the_big_pipelined_acks0_produce_only_when_the_broker_closed_soon_after() -> None:
    """`blamed_request`: the largest acks=0 Produce not answered past, for a broker's close within PIPELINE_NS;
    the last request otherwise (a client's close, a suspect from long before, a suspect no larger)."""
    from proxy.facts import PIPELINE_NS, End, LastRequest

    facts = ConnectionFacts(proxy_id="p", conn_id="c1", listener="127.0.0.1:1", mode="explicit", opened_ns=0)
    facts.last = LastRequest("Produce", 300, 0, ["small"], 200, 2_000_000)
    facts.acks0_suspect = LastRequest("Produce", 50_000, 0, ["big"], 49_900, 1_000_000)
    facts.end = End("broker_fin", "broker", None, None, 3_000_000)
    assert facts.blamed_request().topics == ["big"]
    assert facts.end_facts().last_request_topics == ["big"] and facts.end_facts().ms_since_last_request == 1
    facts.end = End("client_fin", "client", None, None, 3_000_000)
    assert facts.blamed_request() is facts.last
    facts.end = End("broker_fin", "broker", None, None, 3_000_000)
    facts.acks0_suspect.at_ns = facts.last.at_ns - PIPELINE_NS - 1
    assert facts.blamed_request() is facts.last
