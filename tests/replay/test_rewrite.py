"""Pure-function tests for every replay rewrite (no broker, no sockets).

Frames are built with kafka-python's codec (tests/replay/replay_frames.py) and the
results re-parsed with kafka-python: record batches through its
DefaultRecordBatch reader, whose `validate_crc()` checks our CRC-32C. The
byte-level edits themselves (frames, batches, consumer protocol) are tested
in tests/protocol.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from protocol.consumer_protocol import rename_consumer_assignment
from protocol.deep import decode_request, encode_request, encode_response
from protocol.errors import MEMBER_ID_REQUIRED, UNKNOWN_MEMBER_ID
from protocol.frames import expects_response, parse_request, produce_acks
from replay.learn import learn_from_response
from replay.messages import decode_request_body
from replay.rewrite import rewrite_request, sasl_plain_authenticate
from replay.state import ConnState, Pending, ReplayState, Send, Skip
from replay.topics import parse_topic_map, request_topics
from replay_frames import batch, cls, parse_batch, produce, request, response


def body(data: bytes):
    return decode_request_body(parse_request(data))


def batches_of(records: bytes) -> list:
    out, p = [], 0
    while p < len(records):
        size = 12 + int.from_bytes(records[p + 8:p + 12], "big")
        out.append(parse_batch(records[p:p + size]))
        p += size
    return out


def test_acks_zero_expects_no_response():
    for version in (3, 9):
        f = parse_request(produce({0: batch()}, acks=0, version=version, transactional_id="t" if version == 9 else None))
        assert produce_acks(f) == 0 and not expects_response(f)
        f1 = parse_request(produce({0: batch()}, acks=1, version=version))
        assert produce_acks(f1) == 1 and expects_response(f1)
    out = rewrite_request(parse_request(produce({0: batch()}, acks=0)), ReplayState(), ConnState())
    assert isinstance(out, Send) and not out.expects_response


def test_unchanged_request_is_sent_byte_for_byte():
    data = request(3, 12, topics=[cls(3).MetadataRequestTopic(version=12, name="orders", topic_id=None)],
                   allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    out = rewrite_request(parse_request(data), ReplayState(), ConnState())
    assert isinstance(out, Send) and out.data == data and out.rewrites == ()


# ----------------------------------------------------------------------------- producers
def init_producer_response(pid: int, epoch: int, error: int = 0) -> bytes:
    return response(22, 4, producer_id=pid, producer_epoch=epoch, error_code=error, throttle_time_ms=0)


def test_produce_producer_id_mapped_from_the_targets_init_producer_id():
    state, conn = ReplayState(), ConnState("test-client")
    init = parse_request(request(22, 4, transactional_id=None, transaction_timeout_ms=0, producer_id=-1, producer_epoch=-1))
    assert isinstance(rewrite_request(init, state, conn), Send)
    data = produce({0: batch(producer_id=5, epoch=0, base_sequence=0), 1: batch(producer_id=5, epoch=0, base_sequence=0)})
    assert rewrite_request(parse_request(data), state, conn) == Pending("producer_id_unmapped")
    learn_from_response(init, init_producer_response(0, 0, error=51), state, conn)  # CONCURRENT_TRANSACTIONS-ish: no id
    assert isinstance(rewrite_request(parse_request(data), state, conn), Pending)
    learn_from_response(init, init_producer_response(4242, 3), state, conn)
    out = rewrite_request(parse_request(data), state, conn)
    assert isinstance(out, Send) and "producer_id" in out.rewrites
    f = parse_request(out.data)
    assert (f.correlation_id, f.client_id) == (7, "test-client")
    for part in body(out.data).topic_data[0].partition_data:
        (b,) = batches_of(bytes(part.records))
        assert b.validate_crc() and (b.producer_id, b.producer_epoch) == (4242, 3)
        assert [r.value for r in b] == [b"value-0", b"value-1", b"value-2"]
    # the mapping sticks for later batches of the same recorded producer
    again = rewrite_request(parse_request(produce({2: batch(producer_id=5, epoch=0, base_sequence=3)})), state, conn)
    assert isinstance(again, Send)
    (b,) = batches_of(bytes(body(again.data).topic_data[0].partition_data[0].records))
    assert (b.producer_id, b.base_sequence) == (4242, 3) and b.validate_crc()


def test_newest_init_of_the_client_wins():
    """A retried InitProducerId allocates a new id; the client produces with the last one."""
    state, conn = ReplayState(), ConnState("test-client")
    init = parse_request(request(22, 4, transactional_id=None, transaction_timeout_ms=0, producer_id=-1, producer_epoch=-1))
    learn_from_response(init, init_producer_response(10, 0), state, conn)
    learn_from_response(init, init_producer_response(11, 0), state, conn)
    out = rewrite_request(parse_request(produce({0: batch(producer_id=5, epoch=0, base_sequence=0)})), state, conn)
    (b,) = batches_of(bytes(body(out.data).topic_data[0].partition_data[0].records))
    assert b.producer_id == 11
    # another client's init is not used for this client's producer
    other = parse_request(produce({0: batch(producer_id=9, epoch=0, base_sequence=0)}, client_id="other"))
    assert isinstance(rewrite_request(other, state, ConnState("other")), Pending)


def test_transactional_apis_use_the_transactional_ids_producer():
    state, conn = ReplayState(), ConnState("test-client")
    init = parse_request(request(22, 4, transactional_id="tx-1", transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1))
    learn_from_response(init, init_producer_response(777, 4), state, conn)
    A = cls(24)
    add = request(24, 3, v3_and_below_transactional_id="tx-1", v3_and_below_producer_id=12,
                  v3_and_below_producer_epoch=0,
                  v3_and_below_topics=[A.AddPartitionsToTxnTopic(version=3, name="orders", partitions=[0])])
    out = rewrite_request(parse_request(add), state, conn)
    assert isinstance(out, Send)
    m = body(out.data)
    assert (m.v3_and_below_producer_id, m.v3_and_below_producer_epoch) == (777, 4)
    end = request(26, 3, transactional_id="tx-1", producer_id=12, producer_epoch=0, committed=True)
    m = body(rewrite_request(parse_request(end), state, conn).data)
    assert (m.producer_id, m.producer_epoch) == (777, 4)
    data = produce({0: batch(producer_id=12, epoch=0, base_sequence=0, transactional=True)}, transactional_id="tx-1")
    (b,) = batches_of(bytes(body(rewrite_request(parse_request(data), state, conn).data).topic_data[0].partition_data[0].records))
    assert b.validate_crc() and (b.producer_id, b.producer_epoch) == (777, 4) and b.is_transactional


def end_txn_response(version: int, pid: int = -1, epoch: int = -1, error: int = 0) -> bytes:
    if version >= 5:
        return response(26, version, throttle_time_ms=0, error_code=error, producer_id=pid, producer_epoch=epoch)
    return response(26, version, throttle_time_ms=0, error_code=error)


def _txn_state(pid: int = 777, epoch: int = 4) -> tuple[ReplayState, ConnState]:
    state, conn = ReplayState(), ConnState("test-client")
    init = parse_request(request(22, 5, transactional_id="tx-1", transaction_timeout_ms=60000, producer_id=-1,
                                 producer_epoch=-1))
    learn_from_response(init, response(22, 5, producer_id=pid, producer_epoch=epoch, error_code=0, throttle_time_ms=0),
                        state, conn)
    return state, conn


def _txn_produce_epoch(state: ReplayState, conn: ConnState, recorded_pid: int, recorded_epoch: int) -> tuple[int, int]:
    data = produce({0: batch(producer_id=recorded_pid, epoch=recorded_epoch, base_sequence=0, transactional=True)},
                   transactional_id="tx-1")
    (b,) = batches_of(bytes(body(rewrite_request(parse_request(data), state, conn).data).topic_data[0].partition_data[0].records))
    assert b.validate_crc()
    return b.producer_id, b.producer_epoch


def _end_txn(state: ReplayState, conn: ConnState, version: int, recorded_pid: int, recorded_epoch: int) -> Any:
    out = rewrite_request(parse_request(request(26, version, transactional_id="tx-1", producer_id=recorded_pid,
                                                producer_epoch=recorded_epoch, committed=True)), state, conn)
    assert isinstance(out, Send)
    return parse_request(out.data)


def test_transactional_epochs_follow_the_targets_end_txn_answers():
    """KIP-890 part 2 (transactions v2): every EndTxn (v5+) bumps the epoch and answers it; the next transaction
    carries it. A target that does not bump is followed as well."""
    state, conn = _txn_state()
    assert _txn_produce_epoch(state, conn, 12, 0) == (777, 4)
    sent = _end_txn(state, conn, 5, 12, 0)
    assert (body(sent.data).producer_id, body(sent.data).producer_epoch) == (777, 4)
    learn_from_response(sent, end_txn_response(5, 777, 5), state, conn)
    # the origin bumped too (recorded epoch 1): every transaction API and batch goes out with the target's 5
    assert _txn_produce_epoch(state, conn, 12, 1) == (777, 5)
    add = request(25, 4, transactional_id="tx-1", producer_id=12, producer_epoch=1, group_id="g1")
    m = body(rewrite_request(parse_request(add), state, conn).data)
    assert (m.producer_id, m.producer_epoch) == (777, 5)
    sent = _end_txn(state, conn, 5, 12, 1)
    assert body(sent.data).producer_epoch == 5
    # the epoch ran out on the target: its answer names a new producer id, which the next batches carry
    learn_from_response(sent, end_txn_response(5, 778, 0), state, conn)
    assert _txn_produce_epoch(state, conn, 12, 2) == (778, 0)
    # an EndTxn the target refused changes nothing
    learn_from_response(_end_txn(state, conn, 5, 12, 2), end_txn_response(5, error=48), state, conn)
    assert _txn_produce_epoch(state, conn, 12, 2) == (778, 0)

    # transactions v1 (EndTxn v4 and older: no epoch in the answer), or a target that answered the same epoch
    # although the origin had bumped: the next transaction uses the epoch the target has, not the origin's step
    state, conn = _txn_state()
    learn_from_response(_end_txn(state, conn, 4, 12, 0), end_txn_response(4), state, conn)
    assert _txn_produce_epoch(state, conn, 12, 0) == (777, 4)
    learn_from_response(_end_txn(state, conn, 5, 12, 0), end_txn_response(5, 777, 4), state, conn)
    assert _txn_produce_epoch(state, conn, 12, 1) == (777, 4)


def test_an_idempotent_producers_own_epoch_bump_is_kept():
    """KIP-360: an idempotent Java producer bumps its epoch itself (no broker answer): the target's epoch + 1."""
    state, conn = ReplayState(), ConnState("test-client")
    init = parse_request(request(22, 4, transactional_id=None, transaction_timeout_ms=0, producer_id=-1, producer_epoch=-1))
    learn_from_response(init, init_producer_response(4242, 3), state, conn)
    for recorded_epoch, target_epoch in ((0, 3), (1, 4), (1, 4)):
        out = rewrite_request(parse_request(produce({0: batch(producer_id=5, epoch=recorded_epoch, base_sequence=0)})),
                              state, conn)
        (b,) = batches_of(bytes(body(out.data).topic_data[0].partition_data[0].records))
        assert (b.producer_id, b.producer_epoch) == (4242, target_epoch) and b.validate_crc()


# ----------------------------------------------------------------------------- fetch sessions
def fetch(session_id: int, epoch: int, version: int = 12, topic: str = "orders", topic_id: uuid.UUID | None = None) -> bytes:
    return fetch_of(session_id, epoch, {topic_id if version >= 13 else topic: {0: 0}}, version=version)


def fetch_of(session_id: int, epoch: int, parts: dict[Any, dict[int, int]], forgotten: dict[Any, list[int]] | None = None,
             version: int = 12) -> bytes:
    """A Fetch naming `parts` ({topic name, or id from v13: {partition: fetch offset}}) and forgetting `forgotten`."""
    F = cls(1)

    def named(struct: Any, key: Any) -> Any:
        if version >= 13:
            struct.topic_id = key
        else:
            struct.topic = key
        return struct

    topics = [named(F.FetchTopic(version=version, partitions=[F.FetchTopic.FetchPartition(
        version=version, partition=p, current_leader_epoch=-1, fetch_offset=off, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=1 << 20) for p, off in ps.items()]), key) for key, ps in parts.items()]
    gone = [named(F.ForgottenTopic(version=version, partitions=ps), key) for key, ps in (forgotten or {}).items()]
    return request(1, version, replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                   session_id=session_id, session_epoch=epoch, topics=topics, forgotten_topics_data=gone, rack_id="")


def fetched(data: bytes) -> tuple[tuple[int, int], dict[Any, dict[int, int]], list]:
    """A sent Fetch's session, what it names ({topic: {partition: fetch offset}}) and what it forgets."""
    m = body(data)
    return ((m.session_id, m.session_epoch),
            {t.topic_id or t.topic: {p.partition: p.fetch_offset for p in t.partitions} for t in m.topics},
            list(m.forgotten_topics_data))


def fetch_response(session_id: int, error: int = 0, version: int = 12) -> bytes:
    return response(1, version, throttle_time_ms=0, error_code=error, session_id=session_id, responses=[])


def test_fetch_sessions_follow_the_target():
    state, conn = ReplayState(), ConnState()
    create = parse_request(fetch(0, 0))
    out = rewrite_request(create, state, conn)
    assert isinstance(out, Send) and out.data == create.data  # creating a session: as recorded
    assert rewrite_request(parse_request(fetch(555, 1)), state, conn) == Pending("fetch_session_unmapped")
    learn_from_response(create, fetch_response(9001), state, conn)
    for epoch in (1, 2):
        m = body(rewrite_request(parse_request(fetch(555, epoch)), state, conn).data)
        assert (m.session_id, m.session_epoch) == (9001, epoch)
    sessionless = parse_request(fetch(0, -1))
    assert rewrite_request(sessionless, state, conn).data == sessionless.data


def test_fetch_session_not_granted_goes_out_sessionless_naming_its_whole_session():
    state, conn = ReplayState(), ConnState()
    create = parse_request(fetch_of(0, 0, {"orders": {0: 0, 1: 0}}))
    assert rewrite_request(create, state, conn).data == create.data
    learn_from_response(create, fetch_response(0), state, conn)
    out = rewrite_request(parse_request(fetch_of(555, 3, {"orders": {1: 40}})), state, conn)
    assert fetched(out.data) == ((0, -1), {"orders": {0: 0, 1: 40}}, [])
    assert "fetch_session_set" in out.rewrites and not state.notes


def test_fetch_full_mode_sends_every_fetch_sessionless():
    state = ReplayState(fetch_mode="full")
    for sid, ep in ((0, 0), (555, 4)):
        m = body(rewrite_request(parse_request(fetch(sid, ep)), state, ConnState()).data)
        assert (m.session_id, m.session_epoch) == (0, -1)
    # the second went out with no session known to this connection: only what it changed, noted
    assert state.notes == {"fetch_session_began_before_replay": 1}


def test_fetch_full_mode_names_the_origin_sessions_whole_set():
    """An incremental fetch names only what changed since its session's last request; sent sessionless it names
    every partition the origin session held, at the offsets its client last sent, and forgets nothing."""
    state, conn = ReplayState(fetch_mode="full"), ConnState()

    def send(sid: int, epoch: int, parts: dict, forgotten: dict | None = None) -> tuple:
        out = rewrite_request(parse_request(fetch_of(sid, epoch, parts, forgotten)), state, conn)
        assert isinstance(out, Send)
        return fetched(out.data)

    assert send(0, 0, {"orders": {0: 0, 1: 0}, "audit": {0: 7}}) == ((0, -1), {"orders": {0: 0, 1: 0}, "audit": {0: 7}}, [])
    # changed: orders-0 moved on, payments-2 added, audit-0 forgotten
    assert send(555, 1, {"orders": {0: 10}, "payments": {2: 0}}, {"audit": [0]}) == (
        (0, -1), {"orders": {0: 10, 1: 0}, "payments": {2: 0}}, [])
    assert send(555, 2, {}) == ((0, -1), {"orders": {0: 10, 1: 0}, "payments": {2: 0}}, [])  # nothing changed
    # the client closes the session: a whole fetch of what it names, as recorded; the session's set is gone
    assert send(555, -1, {"orders": {0: 12}}) == ((0, -1), {"orders": {0: 12}}, [])
    assert send(555, 3, {}) == ((0, -1), {}, [])
    assert state.notes == {"fetch_session_began_before_replay": 1}
    # two connections keep their own sessions
    other = ConnState()
    rewrite_request(parse_request(fetch_of(0, 0, {"audit": {3: 1}})), state, other)
    out = rewrite_request(parse_request(fetch_of(777, 1, {})), state, other)
    assert fetched(out.data)[1] == {"audit": {3: 1}}


def test_a_session_reopened_with_its_old_id_is_followed_in_both_modes():
    """A Java consumer's first fetch on a new connection after a disconnect (and after a session error) is epoch 0 with
    the id of the session it closes (KIP-227): a new session. Replay followed only id 0 as creating one, so the next
    incremental fetch found no set (full) or waited for a session never mapped (track)."""
    state, conn = ReplayState(fetch_mode="full"), ConnState()

    def send(sid: int, epoch: int, parts: dict) -> tuple:
        return fetched(rewrite_request(parse_request(fetch_of(sid, epoch, parts)), state, conn).data)

    assert send(555, 0, {"orders": {0: 100, 1: 200, 2: 300}}) == ((0, -1), {"orders": {0: 100, 1: 200, 2: 300}}, [])
    assert send(777, 1, {"orders": {1: 250}}) == ((0, -1), {"orders": {0: 100, 1: 250, 2: 300}}, [])
    assert send(777, 0, {"orders": {0: 101}}) == ((0, -1), {"orders": {0: 101}}, [])  # same connection: a fresh set
    assert send(888, 1, {}) == ((0, -1), {"orders": {0: 101}}, [])
    assert not state.notes
    # track: the reopening request goes out as the target's own (closing its session for the old id, if any)
    state, conn = ReplayState(), ConnState()
    reopen = parse_request(fetch_of(555, 0, {"orders": {0: 100}}))
    out = rewrite_request(reopen, state, conn)
    assert fetched(out.data)[0] == (0, 0)  # no target session for 555 on this connection: it just opens one
    learn_from_response(parse_request(out.data), fetch_response(9001), state, conn)
    assert fetched(rewrite_request(parse_request(fetch_of(777, 1, {})), state, conn).data)[0] == (9001, 1)
    again = rewrite_request(parse_request(fetch_of(777, 0, {"orders": {0: 102}})), state, conn)
    assert fetched(again.data)[0] == (9001, 0)  # the target's session 9001 is closed and a new one opened


def test_a_target_session_is_closed_from_the_clients_next_connection():
    """A fetch session is the broker's, not the connection's: a Java consumer that reconnects reopens it (epoch 0 with
    its id) on the new connection, which closes it on the broker. The replay's new connection closed nothing, and
    each reconnect left a target session open until the target evicted it."""
    state = ReplayState()
    a, b, other_broker = ConnState(broker="10.0.0.1:9092"), ConnState(broker="10.0.0.1:9092"), ConnState(broker="10.0.0.2:9092")
    create = parse_request(fetch_of(0, 0, {"orders": {0: 0}}))
    learn_from_response(parse_request(rewrite_request(create, state, a).data), fetch_response(9001), state, a)
    assert fetched(rewrite_request(parse_request(fetch_of(555, 1, {})), state, a).data)[0] == (9001, 1)
    other = rewrite_request(parse_request(fetch_of(555, 0, {"orders": {0: 5}})), state, other_broker)
    assert fetched(other.data)[0] == (0, 0)  # the same id on another broker is another session
    reopened = rewrite_request(parse_request(fetch_of(555, 0, {"orders": {0: 5}})), state, b)
    assert fetched(reopened.data)[0] == (9001, 0)  # closes the target's 9001 and opens a new one
    assert not state.fetch_sessions
    # a close (epoch -1) of a session this connection never saw goes out at once: the target's, or none
    state.fetch_sessions[("10.0.0.1:9092", 777)] = 9002
    assert fetched(rewrite_request(parse_request(fetch_of(777, -1, {})), state, ConnState(broker="10.0.0.1:9092")).data)[0] == (9002, -1)
    assert fetched(rewrite_request(parse_request(fetch_of(888, -1, {})), state, ConnState(broker="10.0.0.1:9092")).data)[0] == (0, -1)
    assert not state.fetch_sessions


def test_fetch_full_mode_whole_set_by_topic_id_is_translated_to_the_targets_ids():
    rec_a, rec_b, tgt_a, tgt_b = (uuid.uuid4() for _ in range(4))
    state = ReplayState(fetch_mode="full", recorded_topic_ids={str(rec_a): "orders", str(rec_b): "audit"},
                        target_topic_ids={"orders": str(tgt_a), "audit": str(tgt_b)})
    conn = ConnState()
    created = rewrite_request(parse_request(fetch_of(0, 0, {rec_a: {0: 0}, rec_b: {0: 0}}, version=16)), state, conn)
    assert fetched(created.data)[1] == {tgt_a: {0: 0}, tgt_b: {0: 0}}
    for epoch, offset in ((1, 5), (2, 9)):  # twice: the set keeps the recorded ids, the walk maps each request's
        out = rewrite_request(parse_request(fetch_of(99, epoch, {rec_b: {0: offset}}, version=16)), state, conn)
        assert fetched(out.data) == ((0, -1), {tgt_a: {0: 0}, tgt_b: {0: offset}}, [])


def test_fetch_topic_ids_translated_through_names():
    rec_id, tgt_id = uuid.uuid4(), uuid.uuid4()
    state = ReplayState(recorded_topic_ids={str(rec_id): "orders"}, target_topic_ids={"orders": str(tgt_id)})
    out = rewrite_request(parse_request(fetch(0, -1, version=16, topic_id=rec_id)), state, ConnState())
    assert isinstance(out, Send) and body(out.data).topics[0].topic_id == tgt_id
    assert request_topics(parse_request(fetch(0, -1, version=16, topic_id=rec_id))) == {f"id:{rec_id}": {0}}
    unknown = rewrite_request(parse_request(fetch(0, -1, version=16, topic_id=uuid.uuid4())), state, ConnState())
    assert unknown == Skip("topic_id_unmapped")
    state.target_topic_ids.clear()
    assert rewrite_request(parse_request(fetch(0, -1, version=16, topic_id=rec_id)), state, ConnState()) == Skip("topic_missing_on_target")


def test_metadata_response_teaches_target_topic_ids():
    state, conn = ReplayState(), ConnState()
    tid = uuid.uuid4()
    R = cls(3, False)
    md = parse_request(request(3, 12, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    resp = response(3, 12, throttle_time_ms=0, brokers=[], cluster_id="c", controller_id=1, topics=[
        R.MetadataResponseTopic(version=12, error_code=0, name="orders", topic_id=tid, is_internal=False, partitions=[],
                                authorized_operations=None)])
    learn_from_response(md, resp, state, conn)
    assert state.target_topic_ids == {"orders": str(tid)}


# ----------------------------------------------------------------------------- consumer groups
def join(member: str, version: int = 7) -> bytes:
    J = cls(11)
    return request(11, version, group_id="g1", session_timeout_ms=45000, rebalance_timeout_ms=300000, member_id=member,
                   group_instance_id=None, protocol_type="consumer",
                   protocols=[J.JoinGroupRequestProtocol(version=version, name="range", metadata=b"\x00\x00meta")])


def join_response(member: str, generation: int, error: int = 0, version: int = 7) -> bytes:
    return response(11, version, throttle_time_ms=0, error_code=error, generation_id=generation, protocol_type="consumer",
                    protocol_name="range", leader=member, member_id=member, members=[])


def test_group_member_id_and_generation_come_from_the_target():
    state, conn = ReplayState(topic_map={"range": "should-not-apply"}), ConnState()
    first = parse_request(join(""))
    assert rewrite_request(first, state, conn).data == first.data
    learn_from_response(first, join_response("target-m1", -1, MEMBER_ID_REQUIRED), state, conn)
    out = rewrite_request(parse_request(join("origin-m1")), state, conn)
    m = body(out.data)
    assert m.member_id == "target-m1" and m.protocols[0].name == "range"
    learn_from_response(parse_request(out.data), join_response("target-m1", 5), state, conn)
    assert state.generations["g1"] == 5

    S = cls(14)
    sync = request(14, 5, group_id="g1", generation_id=1, member_id="origin-m1", group_instance_id=None,
                   protocol_type="consumer", protocol_name="range",
                   assignments=[S.SyncGroupRequestAssignment(version=5, member_id="origin-m1", assignment=b"\x00\x01")])
    m = body(rewrite_request(parse_request(sync), state, conn).data)
    assert (m.member_id, m.generation_id, m.assignments[0].member_id) == ("target-m1", 5, "target-m1")
    hb = request(12, 4, group_id="g1", generation_id=1, member_id="origin-m1", group_instance_id=None)
    m = body(rewrite_request(parse_request(hb), state, conn).data)
    assert (m.member_id, m.generation_id) == ("target-m1", 5)
    C = cls(8)
    commit = request(8, 8, group_id="g1", generation_id_or_member_epoch=1, member_id="origin-m1", group_instance_id=None,
                     topics=[C.OffsetCommitRequestTopic(version=8, name="orders", partitions=[
                         C.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                             version=8, partition_index=0, committed_offset=3, committed_leader_epoch=-1,
                             committed_metadata="")])])
    m = body(rewrite_request(parse_request(commit), state, conn).data)
    assert (m.member_id, m.generation_id_or_member_epoch, m.topics[0].partitions[0].committed_offset) == ("target-m1", 5, 3)
    L = cls(13)
    leave = request(13, 5, group_id="g1", members=[L.MemberIdentity(version=5, member_id="origin-m1", group_instance_id=None, reason=None)])
    assert body(rewrite_request(parse_request(leave), state, conn).data).members[0].member_id == "target-m1"


def test_group_requests_wait_for_the_join_and_unknown_rejoin_negotiates():
    state, conn = ReplayState(), ConnState()
    hb = parse_request(request(12, 4, group_id="g1", generation_id=1, member_id="origin-m1", group_instance_id=None))
    assert isinstance(rewrite_request(hb, state, conn), Pending)
    out = rewrite_request(parse_request(join("origin-m1")), state, conn)
    assert isinstance(out, Send) and out.rewrites == ("member_id_negotiate",) and body(out.data).member_id == ""
    # a simple (group-less generation -1) commit needs nothing from the target
    commit = request(8, 8, group_id="g1", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None, topics=[])
    assert rewrite_request(parse_request(commit), state, conn).data == commit


# ----------------------------------------------------------------------------- KIP-848 consumer groups
# kafka-python has no ConsumerGroupHeartbeat class: these frames come from the spec codec (protocol.deep)
def heartbeat(member: str, epoch: int, version: int = 1, owned: list[str] | None = None,
              topics: list[str] | None = None) -> bytes:
    return encode_request(68, version, 7, "test-client", {
        "group_id": "g1", "member_id": member, "member_epoch": epoch, "instance_id": None, "rack_id": None,
        "rebalance_timeout_ms": 300000 if epoch == 0 else -1, "subscribed_topic_names": topics,
        "server_assignor": None, "topic_partitions": [{"topic_id": t, "partitions": [0]} for t in owned or ()]})


def heartbeat_response(member: str | None, epoch: int, error: int = 0, version: int = 1) -> bytes:
    return encode_response(68, version, 1, {"throttle_time_ms": 0, "error_code": error, "error_message": None,
                                            "member_id": member, "member_epoch": epoch, "heartbeat_interval_ms": 5000,
                                            "assignment": None})


def hb_body(data: bytes) -> dict:
    return decode_request(data, exact=True)["body"]


def commit(member: str, epoch: int, version: int = 9) -> bytes:
    C = cls(8)
    return request(8, version, group_id="g1", generation_id_or_member_epoch=epoch, member_id=member,
                   group_instance_id=None, topics=[C.OffsetCommitRequestTopic(version=version, name="orders", partitions=[
                       C.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                           version=version, partition_index=0, committed_offset=3, committed_leader_epoch=-1,
                           committed_metadata="")])])


def offset_fetch(member: str, epoch: int) -> bytes:
    F = cls(9)
    return request(9, 9, require_stable=True, groups=[F.OffsetFetchRequestGroup(
        version=9, group_id="g1", member_id=member, member_epoch=epoch,
        topics=[F.OffsetFetchRequestGroup.OffsetFetchRequestTopics(version=9, name="orders", partition_indexes=[0])])])


def test_kip848_member_epochs_come_from_the_targets_heartbeat_answers():
    """v1+ (KIP-1082): the client chose its member id, the target takes it; the epochs are the target's."""
    state, conn = ReplayState(), ConnState("test-client")
    join = parse_request(heartbeat("m-uuid", 0, topics=["orders"]))
    assert isinstance(rewrite_request(parse_request(heartbeat("m-uuid", 7)), state, conn), Pending)
    out = rewrite_request(join, state, conn)
    assert isinstance(out, Send) and out.data == join.data  # the target takes the client's id as it is
    assert rewrite_request(parse_request(heartbeat("m-uuid", 7)), state, conn) == Pending("member_epoch_unknown")
    learn_from_response(join, heartbeat_response("m-uuid", 1), state, conn)
    # the origin's group had history (epoch 7), the target's is fresh (epoch 1)
    out = rewrite_request(parse_request(heartbeat("m-uuid", 7)), state, conn)
    assert hb_body(out.data)["member_epoch"] == 1 and out.rewrites == ("member_epoch",)
    m = body(rewrite_request(parse_request(commit("m-uuid", 7)), state, conn).data)
    assert (m.member_id, m.generation_id_or_member_epoch, m.topics[0].partitions[0].committed_offset) == ("m-uuid", 1, 3)
    g = body(rewrite_request(parse_request(offset_fetch("m-uuid", 7)), state, conn).data).groups[0]
    assert (g.member_id, g.member_epoch) == ("m-uuid", 1)
    # a refused heartbeat teaches nothing; a later answer moves the epoch on
    learn_from_response(parse_request(heartbeat("m-uuid", 1)), heartbeat_response(None, 0, error=110), state, conn)
    assert body(rewrite_request(parse_request(commit("m-uuid", 8)), state, conn).data).generation_id_or_member_epoch == 1
    learn_from_response(parse_request(heartbeat("m-uuid", 1)), heartbeat_response("m-uuid", 2), state, conn)
    assert hb_body(rewrite_request(parse_request(heartbeat("m-uuid", 8)), state, conn).data)["member_epoch"] == 2
    assert body(rewrite_request(parse_request(commit("m-uuid", 8)), state, conn).data).generation_id_or_member_epoch == 2
    leave = parse_request(heartbeat("m-uuid", -1))
    assert rewrite_request(leave, state, conn).data == leave.data  # a leave keeps its epoch
    # a classic member's commit in another group still takes its JoinGroup generation
    state.generations["g2"] = 4
    state.members[("g2", "classic")] = "classic"
    classic = request(8, 9, group_id="g2", generation_id_or_member_epoch=1, member_id="classic", group_instance_id=None,
                      topics=[])
    assert body(rewrite_request(parse_request(classic), state, conn).data).generation_id_or_member_epoch == 4


def test_kip848_v0_member_id_is_the_targets_choice():
    """v0: the join carries no member id and the broker chooses one; the recorded later requests carry the
    origin's choice, bound to the target's (as after a classic JoinGroup)."""
    state, conn = ReplayState(), ConnState("test-client")
    join = parse_request(heartbeat("", 0, version=0, topics=["orders"]))
    assert rewrite_request(join, state, conn).data == join.data
    assert rewrite_request(parse_request(heartbeat("origin-m", 3, version=0)), state, conn) == Pending("member_id_unmapped")
    learn_from_response(join, heartbeat_response("target-m", 1, version=0), state, conn)
    out = rewrite_request(parse_request(heartbeat("origin-m", 3, version=0)), state, conn)
    assert {k: hb_body(out.data)[k] for k in ("member_id", "member_epoch")} == {"member_id": "target-m", "member_epoch": 1}
    m = body(rewrite_request(parse_request(commit("origin-m", 3)), state, conn).data)
    assert (m.member_id, m.generation_id_or_member_epoch) == ("target-m", 1)
    # a rejoin (epoch 0) with the origin's id, and a leave, name the target's member
    assert hb_body(rewrite_request(parse_request(heartbeat("origin-m", 0, version=0)), state, conn).data)["member_id"] == "target-m"
    assert hb_body(rewrite_request(parse_request(heartbeat("origin-m", -1, version=0)), state, conn).data)["member_id"] == "target-m"


def test_kip848_heartbeat_topics_follow_the_target():
    """Owned partitions are named by topic id (the target's differ); subscriptions by name (--topic-map)."""
    rec_id, tgt_id = uuid.uuid4(), uuid.uuid4()
    state = ReplayState(topic_map={"orders": "orders-staging"}, recorded_topic_ids={str(rec_id): "orders"},
                        target_topic_ids={"orders-staging": str(tgt_id)})
    conn = ConnState("test-client")
    out = rewrite_request(parse_request(heartbeat("m", 0, topics=["orders"])), state, conn)
    assert hb_body(out.data)["subscribed_topic_names"] == ["orders-staging"] and out.rewrites == ("topic_renamed",)
    state.member_epochs[("g1", "m")] = 2
    out = rewrite_request(parse_request(heartbeat("m", 2, owned=[str(rec_id)])), state, conn)
    assert hb_body(out.data)["topic_partitions"] == [{"topic_id": str(tgt_id), "partitions": [0]}]
    unknown = rewrite_request(parse_request(heartbeat("m", 2, owned=[str(uuid.uuid4())])), state, conn)
    assert unknown == Skip("topic_id_unmapped")


def share_heartbeat(member: str, epoch: int, topics: list[str] | None = None) -> bytes:
    return encode_request(76, 1, 7, "test-client", {"group_id": "gs", "member_id": member, "member_epoch": epoch,
                                                     "rack_id": None, "subscribed_topic_names": topics})


def share_heartbeat_response(member: str, epoch: int) -> bytes:
    return encode_response(76, 1, 1, {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
                                      "member_id": member, "member_epoch": epoch, "heartbeat_interval_ms": 5000,
                                      "assignment": None})


def share_fetch(member: str, topic_id: str, session_epoch: int = 0, api_key: int = 78) -> bytes:
    acks = [{"first_offset": 0, "last_offset": 4, "acknowledge_types": [1]}]
    parts = [{"partition_index": 0, "acknowledgement_batches": acks}]
    fetch = {"max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20, "max_records": 500, "batch_size": 500,
             "share_acquire_mode": 0, "forgotten_topics_data": [{"topic_id": topic_id, "partitions": [1]}]}
    return encode_request(api_key, 2, 9, "test-client", {
        "group_id": "gs", "member_id": member, "share_session_epoch": session_epoch, "is_renew_ack": False,
        "topics": [{"topic_id": topic_id, "partitions": parts}], **(fetch if api_key == 78 else {})})


def test_kip932_share_members_follow_the_target():
    """A share member's epoch comes from the target's ShareGroupHeartbeat answers; its ShareFetch and
    ShareAcknowledge name the target's topic ids (the recorded offsets and session epochs stay as recorded)."""
    rec_id, tgt_id = uuid.uuid4(), uuid.uuid4()
    state = ReplayState(recorded_topic_ids={str(rec_id): "orders"}, target_topic_ids={"orders": str(tgt_id)})
    conn = ConnState("test-client")
    assert rewrite_request(parse_request(share_fetch("s-uuid", str(rec_id))), state, conn) == Pending(
        "member_epoch_unknown")  # not a member on the target yet
    join = parse_request(share_heartbeat("s-uuid", 0, ["orders"]))
    assert rewrite_request(join, state, conn).data == join.data  # the member chose its id: the target takes it
    assert rewrite_request(parse_request(share_heartbeat("s-uuid", 9)), state, conn) == Pending("member_epoch_unknown")
    learn_from_response(join, share_heartbeat_response("s-uuid", 1), state, conn)
    out = rewrite_request(parse_request(share_heartbeat("s-uuid", 9)), state, conn)
    assert hb_body(out.data)["member_epoch"] == 1 and out.rewrites == ("member_epoch",)
    # a ShareAcknowledge cannot open a share session: none is open on this connection yet
    assert rewrite_request(parse_request(share_fetch("s-uuid", str(rec_id), 3, 79)), state, conn) == Skip(
        "share_session_not_open")
    # the session epochs are counted again over what is sent: a window that starts inside a session (recorded 3)
    # opens its own, and a request left out (recorded 5) leaves no gap
    for api_key, recorded, sent_epoch in ((78, 3, 0), (79, 4, 1), (78, 6, 2)):  # ShareFetch, ShareAcknowledge
        out = rewrite_request(parse_request(share_fetch("s-uuid", str(rec_id), recorded, api_key)), state, conn)
        sent = hb_body(out.data)
        assert sent["topics"][0]["topic_id"] == str(tgt_id) and sent["share_session_epoch"] == sent_epoch, sent
        assert sent["topics"][0]["partitions"][0]["acknowledgement_batches"][0]["last_offset"] == 4
        assert [t["topic_id"] for t in sent.get("forgotten_topics_data") or ()] == ([str(tgt_id)] if api_key == 78 else [])
    closing = parse_request(share_fetch("s-uuid", str(rec_id), -1, 79))
    assert hb_body(rewrite_request(closing, state, conn).data)["share_session_epoch"] == -1  # and the count ends
    assert hb_body(rewrite_request(parse_request(share_fetch("s-uuid", str(rec_id), 9)), state, conn).data)[
        "share_session_epoch"] == 0  # a new session
    unknown = rewrite_request(parse_request(share_fetch("s-uuid", str(uuid.uuid4()))), state, conn)
    assert unknown == Skip("topic_id_unmapped")
    # the plan, the --topic filter and topic creation read their topics (by id, and the subscription by name)
    assert request_topics(parse_request(share_fetch("s-uuid", str(rec_id)))) == {f"id:{rec_id}": {0, 1}}
    assert request_topics(parse_request(share_heartbeat("s-uuid", 0, ["orders"]))) == {"orders": set()}


def streams_heartbeat(member: str, epoch: int, source: str = "orders") -> bytes:
    from protocol.codec import plan

    body = plan(88, True, 0).defaults()
    info = {"name": "app-store-changelog", "partitions": 2, "replication_factor": -1, "topic_configs": []}
    topology = {"epoch": 0, "subtopologies": [{
        "subtopology_id": "0", "source_topics": [source], "source_topic_regex": [], "state_changelog_topics": [info],
        "repartition_sink_topics": [source], "repartition_source_topics": [], "copartition_groups": []}]}
    body.update(group_id="app", member_id=member, member_epoch=epoch, process_id="p-1",
                topology=topology if epoch == 0 else None)
    return encode_request(88, 0, 7, "test-client", body)


def test_kip1071_streams_members_follow_the_target():
    """A streams member's epoch comes from the target's StreamsGroupHeartbeat answers; --topic-map renames the
    topics its topology names (source, changelog, repartition)."""
    state = ReplayState(topic_map={"orders": "orders-staging", "app-store-changelog": "app2-store-changelog"})
    conn = ConnState("test-client")
    join = parse_request(streams_heartbeat("st-uuid", 0))
    out = rewrite_request(join, state, conn)
    sub = hb_body(out.data)["topology"]["subtopologies"][0]
    assert (sub["source_topics"], sub["repartition_sink_topics"], sub["state_changelog_topics"][0]["name"]) == (
        ["orders-staging"], ["orders-staging"], "app2-store-changelog")
    assert out.rewrites == ("topic_renamed",)
    assert request_topics(join) == {"orders": set(), "app-store-changelog": set()}
    assert rewrite_request(parse_request(streams_heartbeat("st-uuid", 5)), state, conn) == Pending("member_epoch_unknown")
    from protocol.codec import plan

    answer = plan(88, False, 0).defaults()
    answer.update(member_id="st-uuid", member_epoch=2)
    learn_from_response(join, encode_response(88, 0, 1, answer), state, conn)
    out = rewrite_request(parse_request(streams_heartbeat("st-uuid", 5)), state, conn)
    assert hb_body(out.data)["member_epoch"] == 2 and out.rewrites == ("member_epoch",)


# ----------------------------------------------------------------------------- topics, SASL
def test_topic_map_renames_every_topic_field():
    state = ReplayState(topic_map={"orders": "orders-staging"})
    data = produce({0: batch()}, topic="orders")
    out = rewrite_request(parse_request(data), state, ConnState())
    assert body(out.data).topic_data[0].name == "orders-staging" and out.rewrites == ("topic_renamed",)
    assert body(rewrite_request(parse_request(fetch(0, -1)), state, ConnState()).data).topics[0].topic == "orders-staging"
    md = request(3, 12, topics=[cls(3).MetadataRequestTopic(version=12, name="orders", topic_id=None)],
                 allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    assert body(rewrite_request(parse_request(md), state, ConnState()).data).topics[0].name == "orders-staging"
    assert body(rewrite_request(parse_request(join("")), state, ConnState()).data).protocols[0].name == "range"
    assert parse_topic_map(["a=b", "c=d"]) == {"a": "b", "c": "d"}
    with pytest.raises(ValueError):
        parse_topic_map(["nope"])


def test_sasl_needs_credentials_and_uses_plain():
    hs = parse_request(request(17, 1, mechanism="SCRAM-SHA-256"))
    assert rewrite_request(hs, ReplayState(), ConnState()) == Skip("sasl_needs_credentials")
    out = rewrite_request(hs, ReplayState(sasl_mechanism="PLAIN"), ConnState())
    assert body(out.data).mechanism == "PLAIN"
    auth = parse_request(sasl_plain_authenticate(2, "alice", "s3cret", "cli", 5))
    assert (auth.api_key, auth.api_version, auth.correlation_id, auth.client_id) == (36, 2, 5, "cli")
    assert body(auth.data).auth_bytes == b"\x00alice\x00s3cret"
    assert rewrite_request(auth, ReplayState(sasl_mechanism="PLAIN"), ConnState()) == Skip("sasl_authenticate_not_recorded")


def test_a_recorded_sasl_renewal_is_left_to_replays_own():
    """A client's KIP-368 renewals, replayed at --speed max, came under a second apart (Kafka: ILLEGAL_SASL_STATE)
    and on top of replay's own renewal: once a session authenticated on the target, its recorded handshakes wait."""
    hs = parse_request(request(17, 1, mechanism="PLAIN"))
    state = ReplayState(sasl_mechanism="PLAIN")
    assert not isinstance(rewrite_request(hs, state, ConnState()), Skip)
    assert rewrite_request(hs, state, ConnState(authenticated=True)) == Skip("recorded_sasl_renewal_replay_renews_itself")


def test_topic_map_inside_consumer_group_metadata():
    """JoinGroup subscriptions and SyncGroup assignments of consumer groups (the bytes: tests/protocol)."""
    tmap = {"probe": "probe-staging"}
    v0 = b"\x00\x00\x00\x00\x00\x01\x00\x05probe\x00\x00\x00\x00"  # kafka-python
    asg = b"\x00\x00\x00\x00\x00\x01\x00\x05probe\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x00"
    state, conn = ReplayState(topic_map=tmap), ConnState()
    J = cls(11)
    data = request(11, 7, group_id="g1", session_timeout_ms=45000, rebalance_timeout_ms=300000, member_id="",
                   group_instance_id=None, protocol_type="consumer",
                   protocols=[J.JoinGroupRequestProtocol(version=7, name="range", metadata=v0)])
    m = body(rewrite_request(parse_request(data), state, conn).data)
    assert m.protocols[0].name == "range" and b"probe-staging" in bytes(m.protocols[0].metadata)
    state.members[("g1", "m")] = "m"
    state.generations["g1"] = 1
    S = cls(14)
    sync = request(14, 3, group_id="g1", generation_id=1, member_id="m", group_instance_id=None,
                   assignments=[S.SyncGroupRequestAssignment(version=3, member_id="m", assignment=asg)])
    m = body(rewrite_request(parse_request(sync), state, conn).data)  # v3 has no protocol_type: remembered from the join
    assert bytes(m.assignments[0].assignment) == rename_consumer_assignment(asg, tmap)
    connect = request(11, 7, group_id="g2", session_timeout_ms=45000, rebalance_timeout_ms=300000, member_id="",
                      group_instance_id=None, protocol_type="connect",
                      protocols=[J.JoinGroupRequestProtocol(version=7, name="sessioned", metadata=v0)])
    assert rewrite_request(parse_request(connect), state, conn).data == connect


def test_a_window_without_a_members_join_skips_its_heartbeats_at_once(tmp_path):
    """Only a join (member epoch 0) can make a member of one the target does not know: a window that left the join
    out had the member's later heartbeats (and its ShareFetch requests) wait for each other, --pending-timeout each
    (a 10-minute replay that sent nothing). They are skipped at once, "nothing left to learn it from"."""
    from replay_synthetic import SynthConn, SynthRequest, write_recording

    from replay.load import Filters, load_recording
    from replay.schedule import GROUP_JOIN, ReplayOptions, ReplaySchedule, learning_key

    beats = [SynthRequest(0.1 * i, share_heartbeat("s-uuid", e), 76, 1, 7) for i, e in enumerate((0, 4, 5), 1)]
    write_recording(tmp_path, [SynthConn("c1", 0.0, beats)])
    assert [learning_key(parse_request(r.frame)) for r in beats] == [GROUP_JOIN, 76, 76]
    for since, hopeless in ((None, False), (0.15, True)):  # the whole recording, a window after the join
        rec = load_recording(tmp_path, Filters(since_ns=None if since is None else
                                                load_recording(tmp_path).start_ns + int(since * 1e9)))
        rp = ReplaySchedule(rec, ReplayOptions(target="127.0.0.1:9"))
        assert rp.can_still_learn("member_epoch_unknown", 76) is not hopeless, since


def test_a_join_the_origin_refused_before_any_member_id_carries_the_id_the_target_gave():
    """The origin answered the first join COORDINATOR_LOAD_IN_PROGRESS (no id), the target MEMBER_ID_REQUIRED with
    one: the recording's retry has no id, and goes out with the target's, as the client would have sent it. Sent
    empty, it left a second pending member on the target, which held the group's next rebalance until it expired.
    Once a recorded member is bound to that id, an empty join (a member that reset its id) goes out empty."""
    state, conn = ReplayState(), ConnState()
    first = parse_request(join(""))
    assert rewrite_request(first, state, conn).data == first.data
    learn_from_response(first, join_response("target-m1", -1, MEMBER_ID_REQUIRED), state, conn)
    retry = rewrite_request(parse_request(join("")), state, conn)
    assert isinstance(retry, Send) and retry.rewrites == ("member_id",) and body(retry.data).member_id == "target-m1"
    learn_from_response(parse_request(retry.data), join_response("target-m1", 1), state, conn)
    rejoin = rewrite_request(parse_request(join("origin-m1")), state, conn)  # the id the origin gave at its retry
    assert body(rejoin.data).member_id == "target-m1" and state.members[("g1", "origin-m1")] == "target-m1"
    fresh = parse_request(join(""))
    assert rewrite_request(fresh, state, conn).data == fresh.data
    # the same target id bound in another group does not count as bound in this one
    other = ReplayState(members={("g0", "origin-m0"): "target-m1"})
    conn = ConnState()
    learn_from_response(first, join_response("target-m1", -1, MEMBER_ID_REQUIRED), other, conn)
    assert body(rewrite_request(parse_request(join("")), other, conn).data).member_id == "target-m1"


def test_a_member_id_the_target_forgot_is_neither_sent_nor_bound():
    """A pending member expires on the target after its session timeout: its UNKNOWN_MEMBER_ID answer to a join
    carrying the id drops it, and the next recorded join goes out empty (the target gives a fresh id)."""
    state, conn = ReplayState(), ConnState()
    first = parse_request(join(""))
    learn_from_response(first, join_response("target-m1", -1, MEMBER_ID_REQUIRED), state, conn)
    retry = rewrite_request(parse_request(join("")), state, conn)
    assert body(retry.data).member_id == "target-m1"
    learn_from_response(parse_request(retry.data), join_response("", -1, UNKNOWN_MEMBER_ID), state, conn)
    assert "g1" not in conn.pending_member
    again = parse_request(join(""))
    assert rewrite_request(again, state, conn).data == again.data
