"""A transactions-v2 session lowered onto a target without it (replay.txn_partitions, TargetProducer's sequences),
without a broker: the AddPartitionsToTxn that goes first, its retry and its answer, and sequences that go on where
the target kept the epoch the origin bumped."""

from __future__ import annotations

from protocol.apis import ADD_OFFSETS_TO_TXN, ADD_PARTITIONS_TO_TXN, END_TXN, PRODUCE, TXN_OFFSET_COMMIT
from protocol.deep import decode_request, decode_response, encode_request, encode_response
from protocol.errors import CONCURRENT_TRANSACTIONS
from protocol.frames import parse_request, produce_transactional
from replay.messages import decode_request_body
from replay.rewrite import rewrite_request
from replay.state import ConnState, ReplayState, Send, TargetProducer
from replay.txn_partitions import learn_added, learn_added_offsets, must_retry, partitions_first
from replay.versions import transactions_v2
from replay_frames import batch, parse_batch, produce


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
    # only a transaction still completing (or a coordinator loading) is asked again; a refusal is not
    fenced = encode_response(ADD_PARTITIONS_TO_TXN, 3, 2, {"throttle_time_ms": 0, "results_by_topic_v3_and_below": [
        {"name": "orders", "results_by_partition": [{"partition_index": 0, "partition_error_code": 47}]}]})
    asked = encode_request(ADD_PARTITIONS_TO_TXN, 3, 2, None, {
        "v3_and_below_transactional_id": "tx-1", "v3_and_below_producer_id": 5, "v3_and_below_producer_epoch": 2,
        "v3_and_below_topics": [{"name": "orders", "partitions": [0]}]})
    assert parse_request(txn).api_key == PRODUCE and not must_retry(parse_request(asked), fenced)


def test_sequences_wrap_as_kafkas_do_and_a_resent_batch_does_not_move_them_back():
    t = TargetProducer(producer_id=5, epoch=2)
    t.for_recorded(7)
    top = (1 << 31) - 50
    assert t.sequence_for(("orders", 0), top, 10) == top
    assert t.sequence_for(("orders", 0), 0, 5) == 0  # an earlier re-sent batch
    t.answered(5, 2)
    t.for_recorded(8)
    assert t.sequence_for(("orders", 0), 45, 10) == 5  # (2³¹ − 40) + 45 wraps to 5


def test_a_lowered_transactions_v2_produce_adds_its_partitions_first_and_carries_its_sequences_on():
    """rewrite_request end to end: Produce v12 onto a target serving v10, after an EndTxn v3 answer (epoch kept)."""
    recorded_topic = {"name": "orders"}
    state = ReplayState(target_versions={PRODUCE: (0, 10), ADD_PARTITIONS_TO_TXN: (0, 3)})
    t = state.transactional["tx-1"] = TargetProducer(producer_id=77, epoch=0)
    state.producers[5] = t
    first_txn = produce({0: batch(5, 1, 0, records=4, transactional=True)}, version=12, transactional_id="tx-1")
    out = rewrite_request(parse_request(first_txn), state, ConnState("java-txn"))
    assert isinstance(out, Send) and {"version_lowered", "add_partitions_to_txn", "producer_id"} <= set(out.rewrites)
    assert len(out.first) == 1 and decode_request(out.first[0])["body"]["v3_and_below_producer_id"] == 77
    sent = parse_batch(_records(out.data))
    assert (sent.producer_id, sent.producer_epoch, sent.base_sequence) == (77, 0, 0) and sent.validate_crc()
    t.added.add(("orders", 0))
    t.answered(77, 0)  # EndTxn v3: the target kept epoch 0; the origin's broker moved to epoch 2 (transactions v2)
    second_txn = produce({0: batch(5, 2, 0, records=3, transactional=True)}, version=12, transactional_id="tx-1")
    out = rewrite_request(parse_request(second_txn), state, ConnState("java-txn"))
    sent = parse_batch(_records(out.data))
    assert (sent.producer_epoch, sent.base_sequence) == (0, 4), recorded_topic  # sequences go on from 4
    assert len(out.first) == 1  # answered() emptied the transaction's partitions


def _records(frame: bytes) -> bytes:
    return decode_request(frame, exact=True)["body"]["topic_data"][0]["partition_data"][0]["records"]


def test_a_target_without_transactions_v2_gets_what_its_clients_send():
    """A Kafka 4 target still on transaction.version 1 serves Produce v13 and EndTxn v5, but a client sends it no
    newer than v11 and v4 within a transaction: replay lowers those (and adds the partitions first), and leaves a
    Produce outside any transaction as recorded."""
    state = ReplayState(target_versions={PRODUCE: (3, 13), END_TXN: (0, 5), ADD_PARTITIONS_TO_TXN: (0, 5)},
                        target_transactions_v2=False)
    t = state.transactional["tx-1"] = state.producers[5] = TargetProducer(producer_id=77, epoch=0)
    txn = produce({0: batch(5, 1, 0, transactional=True)}, version=12, transactional_id="tx-1")
    out = rewrite_request(parse_request(txn), state, ConnState("java-txn"))
    assert parse_request(out.data).api_version == 11 and len(out.first) == 1
    plain = produce({0: batch()}, version=12)
    assert parse_request(rewrite_request(parse_request(plain), state, ConnState()).data).api_version == 12
    end = encode_request(END_TXN, 5, 3, "java-txn", {"transactional_id": "tx-1", "producer_id": 5, "producer_epoch": 1,
                                                     "committed": True})
    out = rewrite_request(parse_request(end), state, ConnState("java-txn"))
    assert parse_request(out.data).api_version == 4 and "version_lowered" in out.rewrites
    assert decode_request(out.data)["body"]["producer_id"] == 77
    state.target_transactions_v2 = True  # a target with it: everything as recorded
    assert parse_request(rewrite_request(parse_request(txn), state, ConnState("java-txn")).data).api_version == 12
    assert t.producer_id == 77


def test_transactions_v2_is_read_from_the_targets_finalized_features():
    def answer(level: int | None) -> dict:
        features = [{"name": "metadata.version", "max_version_level": 27, "min_version_level": 27}]
        if level is not None:
            features.append({"name": "transaction.version", "max_version_level": level, "min_version_level": level})
        return {"error_code": 0, "api_keys": [], "finalized_features": features}
    assert transactions_v2(answer(2)) and not transactions_v2(answer(1)) and not transactions_v2(answer(0))
    assert not transactions_v2(answer(None)) and not transactions_v2({"api_keys": []})  # a 3.x broker: no such feature


def test_a_produce_names_its_transactional_id_or_not():
    for version in (3, 8, 9, 12):  # non-flexible and flexible string forms
        assert produce_transactional(parse_request(produce({0: batch()}, version=version, transactional_id="tx-1")))
        assert not produce_transactional(parse_request(produce({0: batch()}, version=version)))
    assert not produce_transactional(parse_request(produce({0: batch()}, version=9, transactional_id="")))


def test_a_lowered_txn_offset_commit_adds_its_groups_offsets_first():
    """TxnOffsetCommit v5 (transactions v2 adds the group's offsets to the transaction itself) onto a target without
    transactions v2: sent as v4, after an AddOffsetsToTxn with the target's producer id and epoch; once the target
    added the group, not again in that transaction; retried while the last transaction completes."""
    state = ReplayState(target_versions={TXN_OFFSET_COMMIT: (0, 5), ADD_OFFSETS_TO_TXN: (0, 4)},
                        target_transactions_v2=False)
    t = state.transactional["tx-1"] = state.producers[5] = TargetProducer(producer_id=77, epoch=3)
    commit = encode_request(TXN_OFFSET_COMMIT, 5, 4, "copier", {
        "transactional_id": "tx-1", "group_id": "copy-group", "producer_id": 5, "producer_epoch": 1,
        "generation_id": -1, "member_id": "", "group_instance_id": None,
        "topics": [{"name": "orders", "partitions": [{"partition_index": 0, "committed_offset": 42,
                                                      "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
    out = rewrite_request(parse_request(commit), state, ConnState("copier"))
    assert parse_request(out.data).api_version == 4 and "add_offsets_to_txn" in out.rewrites
    first = decode_request(out.first[0])
    assert (first["api_key"], first["api_version"]) == (ADD_OFFSETS_TO_TXN, 4)
    assert first["body"] == {"transactional_id": "tx-1", "producer_id": 77, "producer_epoch": 3, "group_id": "copy-group"}
    busy = encode_response(ADD_OFFSETS_TO_TXN, 4, 1, {"throttle_time_ms": 0, "error_code": CONCURRENT_TRANSACTIONS})
    done = encode_response(ADD_OFFSETS_TO_TXN, 4, 1, {"throttle_time_ms": 0, "error_code": 0})
    assert must_retry(parse_request(out.first[0]), busy) and not must_retry(parse_request(out.first[0]), done)
    assert learn_added_offsets(first["body"], {"error_code": 0}, state) == ["added_offsets=copy-group"]
    assert not rewrite_request(parse_request(commit), state, ConnState("copier")).first  # the group is in it
    t.answered(77, 3)  # the transaction ended
    assert rewrite_request(parse_request(commit), state, ConnState("copier")).first
