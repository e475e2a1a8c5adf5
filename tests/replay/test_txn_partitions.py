"""A transactions-v2 session lowered onto a target without it (replay.txn_partitions, TargetProducer's sequences),
without a broker: the AddPartitionsToTxn that goes first, its retry and its answer, and sequences that go on where
the target kept the epoch the origin bumped."""

from __future__ import annotations

from protocol.apis import ADD_PARTITIONS_TO_TXN, PRODUCE
from protocol.deep import decode_request, decode_response, encode_response
from protocol.errors import CONCURRENT_TRANSACTIONS
from protocol.frames import parse_request
from replay.messages import decode_request_body
from replay.state import ReplayState, TargetProducer
from replay.txn_partitions import learn_added, must_retry, partitions_first
from replay_frames import batch, produce


def test_sequences_go_on_where_the_target_kept_the_epoch_the_origin_bumped():
    t = TargetProducer(producer_id=5, epoch=2)
    assert t.for_recorded(7) == (5, 2)
    assert [t.sequence_for(("orders", 0), 0, 5), t.sequence_for(("orders", 0), 5, 3)] == [0, 5]
    t.answered(5, 2)  # an EndTxn v3 answer: the target kept the epoch
    assert t.for_recorded(8) == (5, 2)  # the origin's broker had bumped it (transactions v2): sequences began at 0
    assert t.sequence_for(("orders", 0), 0, 4) == 8  # the target expects 8: they go on
    assert t.sequence_for(("orders", 1), 0, 1) == 0  # a partition the producer had not written to yet
    t.answered(5, 3)  # a target that bumps too (EndTxn v5): its sequences begin again
    assert t.for_recorded(9) == (5, 3) and t.sequence_for(("orders", 0), 0, 2) == 0


def test_sequences_the_origin_carried_on_are_not_shifted():
    """Transactions v1 at the origin too: the same recorded epoch after the EndTxn, sequences already going on."""
    t = TargetProducer(producer_id=5, epoch=2)
    t.for_recorded(7)
    t.sequence_for(("orders", 0), 0, 5)
    t.answered(5, 2)
    assert t.for_recorded(7) == (5, 2) and t.sequence_for(("orders", 0), 5, 2) == 5


def _msg(frame: bytes):
    return decode_request_body(parse_request(frame))


def _answer_body(answer: bytes) -> dict:
    return decode_response(answer, ADD_PARTITIONS_TO_TXN, 3, exact=True)["body"]


def test_the_partitions_not_yet_in_the_transaction_are_added_first():
    state = ReplayState(target_versions={ADD_PARTITIONS_TO_TXN: (0, 4)})
    target = state.transactional["tx-1"] = TargetProducer(producer_id=5, epoch=2)
    frame = produce({0: batch(5, 2, 0, transactional=True), 1: batch(5, 2, 0, transactional=True)}, version=10,
                    transactional_id="tx-1", client_id="java-txn")
    first = partitions_first(12, 10, "java-txn", _msg(frame), state)
    assert first is not None
    sent = decode_request(first)
    assert (sent["api_key"], sent["api_version"], sent["client_id"]) == (ADD_PARTITIONS_TO_TXN, 3, "java-txn")
    assert sent["body"] == {"v3_and_below_transactional_id": "tx-1", "v3_and_below_producer_id": 5,
                            "v3_and_below_producer_epoch": 2,
                            "v3_and_below_topics": [{"name": "orders", "partitions": [0, 1]}]}
    # the target's answer: partition 0 added, partition 1 still completing the last transaction
    answer = encode_response(ADD_PARTITIONS_TO_TXN, 3, 9, {"throttle_time_ms": 0, "results_by_topic_v3_and_below": [
        {"name": "orders", "results_by_partition": [{"partition_index": 0, "partition_error_code": 0},
                                                    {"partition_index": 1,
                                                     "partition_error_code": CONCURRENT_TRANSACTIONS}]}]})
    asked = parse_request(first)
    assert must_retry(asked, answer) and not must_retry(asked, None)
    assert learn_added(sent["body"], _answer_body(answer), state) == ["added=orders-0"]
    again = decode_request(partitions_first(12, 10, "java-txn", _msg(frame), state))["body"]
    assert again["v3_and_below_topics"] == [{"name": "orders", "partitions": [1]}]
    target.added.add(("orders", 1))
    assert partitions_first(12, 10, "java-txn", _msg(frame), state) is None  # all in the transaction
    target.answered(5, 2)  # the transaction ended: the next one starts with none
    assert partitions_first(12, 10, "java-txn", _msg(frame), state) is not None


def test_nothing_goes_first_unless_a_transactions_v2_produce_was_lowered():
    state = ReplayState()
    state.transactional["tx-1"] = TargetProducer(producer_id=5, epoch=2)
    txn = produce({0: batch(5, 2, 0, transactional=True)}, version=10, transactional_id="tx-1")
    assert partitions_first(11, 10, None, _msg(txn), state) is None  # recorded below v12: the client added them
    assert partitions_first(12, 12, None, _msg(produce({0: batch(5, 2, 0, transactional=True)}, version=12,
                                                        transactional_id="tx-1")), state) is None  # not lowered
    plain = produce({0: batch(5, 2, 0)}, version=10)
    assert partitions_first(12, 10, None, _msg(plain), state) is None  # no transaction
    unknown = produce({0: batch(6, 0, 0, transactional=True)}, version=10, transactional_id="tx-2")
    assert partitions_first(12, 10, None, _msg(unknown), state) is None  # a producer the target does not know yet
    assert parse_request(txn).api_key == PRODUCE and not must_retry(parse_request(txn), b"\x00" * 8)  # not an add
