"""The AddPartitionsToTxn a transactional producer sends a broker without transactions v2, for a replay onto one.

Why: with transactions v2 (KIP-890, Produce v12 and later, Kafka 4's default) a partition joins the open
transaction when its leader takes the producer's first batch for it, so a recording made on such a cluster
holds no AddPartitionsToTxn. A broker without it (Kafka 3.x, or an older target's Produce version) takes a
transactional batch only for a partition added to the transaction first and refuses the rest
(INVALID_TXN_STATE, INVALID_PRODUCER_EPOCH), which is why a client that negotiates an older Produce sends
AddPartitionsToTxn before its first batch to each partition of a transaction. When replay lowers such a
Produce (`replay.lower`), it does the same: the partitions not yet added go first, in one request of replay's
own on the same connection, with the producer id and epoch the batches carry; the target's answer records
which were added (`TargetProducer.added`, emptied when the transaction ends). Offsets committed inside a
transaction are alike: with transactions v2 a TxnOffsetCommit (v5+) adds its group to the transaction itself,
and a lowered one is preceded by the AddOffsetsToTxn a client of an older broker sends (`offsets_first`).

The request goes to the connection of the Produce, as replay sends every session to the one target
broker; a target of several brokers whose coordinator is another answers NOT_COORDINATOR. The errors of
the last answer to it are counted with the answers' errors as "AddPartitionsToTxn (replay's own)", and
the Produce goes out either way (the target's refusal of it is what the operator then sees). A Kafka 4
target still on transaction.version 1 (a cluster upgraded from 3.x) serves Produce v12 and EndTxn v5, but
its clients send no newer than v11 and v4 within a transaction (`transactional_ceiling`): replay lowers
those as well. Pure functions: the engine sends the frame, `replay.learn` feeds the answer back.
"""

from __future__ import annotations

from typing import Any

from protocol.apis import ADD_OFFSETS_TO_TXN, ADD_PARTITIONS_TO_TXN, END_TXN, PRODUCE, TXN_OFFSET_COMMIT
from protocol.batch_edit import records_producer_ids
from protocol.deep import encode_request
from protocol.errors import CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS, ProtocolError
from protocol.frames import RequestFrame, produce_transactional
from replay.messages import decode_spec_response
from replay.state import ReplayState, TargetProducer

__all__ = ["TV2_PRODUCE", "TV2_END_TXN", "TV2_TXN_OFFSET_COMMIT", "transactional_ceiling", "requests_first",
           "partitions_first", "offsets_first", "learn_added", "learn_added_offsets", "must_retry", "ADD_PARTITIONS",
           "ADD_OFFSETS"]

TV2_PRODUCE = 12  # the first Produce version whose client relies on transactions v2 (KIP-890)
TV2_END_TXN = 5  # the first EndTxn version whose answer carries the epoch the broker bumped
TV2_TXN_OFFSET_COMMIT = 5  # the first TxnOffsetCommit version that adds its group's offsets itself (no AddOffsetsToTxn)
CLIENT_VERSIONS = 3  # AddPartitionsToTxn v4 and later are the brokers' own batched form
OFFSETS_VERSION = 3  # AddOffsetsToTxn for a target whose ApiVersions were not read (every version is a client's)
ADD_PARTITIONS = "add_partitions_to_txn"  # the rewrites' names in the replay summary
ADD_OFFSETS = "add_offsets_to_txn"
RETRIED = frozenset({CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS})
# How a client paces those retries: Kafka's Java producer retries AddPartitionsToTxn after 20 ms when the
# previous transaction is still completing; replay doubles that up to ATTEMPTS tries (~5 s of waits in all).
RETRY_BACKOFF_S = 0.02
ATTEMPTS = 9


def transactional_ceiling(frame: RequestFrame, state: ReplayState) -> int | None:
    """The newest version a client sends this request at on a target without transactions v2 (finalized
    transaction.version below 2) that still serves the newer ones, or None when there is no such limit: a
    transactional Produce goes no higher than v11 there and EndTxn than v4 (Kafka's ProduceRequest.json: "if V2 is
    disabled, the client can't use produce request version higher than 11 within a transaction")."""
    if state.target_transactions_v2 is not False:
        return None
    if frame.api_key == END_TXN:
        return TV2_END_TXN - 1
    if frame.api_key == TXN_OFFSET_COMMIT:
        return TV2_TXN_OFFSET_COMMIT - 1
    if frame.api_key == PRODUCE and produce_transactional(frame):
        return TV2_PRODUCE - 1
    return None


def requests_first(api_key: int, recorded_version: int, sent_version: int, client_id: str | None, msg: Any,
                   state: ReplayState) -> tuple[bytes, str] | None:
    """The request of replay's own to send before this rewritten one (and the rewrite's name), or None: a lowered
    transactions-v2 Produce adds its partitions to the transaction, a lowered TxnOffsetCommit its group's offsets."""
    if api_key == PRODUCE:
        frame = partitions_first(recorded_version, sent_version, client_id, msg, state)
        return (frame, ADD_PARTITIONS) if frame else None
    if api_key == TXN_OFFSET_COMMIT:
        frame = offsets_first(recorded_version, sent_version, client_id, msg, state)
        return (frame, ADD_OFFSETS) if frame else None
    return None


def offsets_first(recorded_version: int, sent_version: int, client_id: str | None, msg: Any,
                  state: ReplayState) -> bytes | None:
    """The AddOffsetsToTxn frame to send before this (rewritten) TxnOffsetCommit, or None.

    With transactions v2 a TxnOffsetCommit (v5+) adds its group's offsets to the transaction itself, and the client
    sends no AddOffsetsToTxn; below v5 the coordinator must have been asked first, or the offsets are not part of the
    transaction (its commit writes no marker to the group's partition). Only for one recorded at v5+ and sent below,
    of a producer the target knows, whose group is not yet in its open transaction."""
    if recorded_version < TV2_TXN_OFFSET_COMMIT or sent_version >= TV2_TXN_OFFSET_COMMIT:
        return None
    target = state.transactional.get(msg.transactional_id or "")
    if target is None or msg.group_id in target.added_groups:
        return None
    served = state.target_versions.get(ADD_OFFSETS_TO_TXN)
    return encode_request(ADD_OFFSETS_TO_TXN, served[1] if served else OFFSETS_VERSION, 0, client_id, {
        "transactional_id": msg.transactional_id, "producer_id": msg.producer_id,
        "producer_epoch": msg.producer_epoch, "group_id": msg.group_id})


def partitions_first(recorded_version: int, sent_version: int, client_id: str | None, msg: Any,
                     state: ReplayState) -> bytes | None:
    """The AddPartitionsToTxn frame to send before this (rewritten) Produce, or None when nothing must go first.

    Only for a transactional Produce recorded at v12 or later and sent below v12, of a producer the target
    knows, naming partitions not yet in its open transaction."""
    if recorded_version < TV2_PRODUCE or sent_version >= TV2_PRODUCE or not msg.transactional_id:
        return None
    target = state.transactional.get(msg.transactional_id)
    if target is None:
        return None
    wanted: dict[str, list[int]] = {}
    ids: tuple[int, int] | None = None
    for topic in msg.topic_data or ():
        for part in topic.partition_data or ():
            found = records_producer_ids(bytes(part.records)) if part.records else []
            if not found:
                continue
            ids = ids or found[0]
            if (topic.name, part.index) not in target.added:
                wanted.setdefault(topic.name, []).append(part.index)
    if not wanted or ids is None:
        return None
    served = state.target_versions.get(ADD_PARTITIONS_TO_TXN)
    version = min(CLIENT_VERSIONS, served[1]) if served else CLIENT_VERSIONS
    return encode_request(ADD_PARTITIONS_TO_TXN, version, 0, client_id, {
        "v3_and_below_transactional_id": msg.transactional_id, "v3_and_below_producer_id": ids[0],
        "v3_and_below_producer_epoch": ids[1],
        "v3_and_below_topics": [{"name": name, "partitions": parts} for name, parts in wanted.items()]})


def must_retry(sent: RequestFrame, answer: bytes | None) -> bool:
    """True when the target asks for this AddPartitionsToTxn again later: the previous transaction is still being
    completed (CONCURRENT_TRANSACTIONS, as right after an EndTxn) or its coordinator is loading. Kafka's clients
    retry these; any other request, no answer or one that cannot be read: False."""
    if answer is None or not (sent.api_key == ADD_OFFSETS_TO_TXN or (sent.api_key == ADD_PARTITIONS_TO_TXN
                                                                     and sent.api_version <= CLIENT_VERSIONS)):
        return False
    try:
        got = decode_spec_response(sent, answer)
    except (ProtocolError, ValueError):
        return False
    if sent.api_key == ADD_OFFSETS_TO_TXN:
        return got["error_code"] in RETRIED
    return any(p["partition_error_code"] in RETRIED for t in got.get("results_by_topic_v3_and_below") or ()
               for p in t["results_by_partition"] or ())


def learn_added_offsets(request: dict[str, Any], response: dict[str, Any], state: ReplayState) -> list[str]:
    """Mark the group the target added (AddOffsetsToTxn answered 0) as in the producer's open transaction."""
    target = state.transactional.get(request.get("transactional_id") or "")
    if target is None or response.get("error_code") != 0:
        return []
    target.added_groups.add(request["group_id"])
    return [f"added_offsets={request['group_id']}"]


def learn_added(request: dict[str, Any], response: dict[str, Any], state: ReplayState) -> list[str]:
    """Mark the partitions the target added (error 0) as in the producer's open transaction; what was learned."""
    target: TargetProducer | None = state.transactional.get(request.get("v3_and_below_transactional_id") or "")
    if target is None:
        return []
    added = [(t["name"], p["partition_index"]) for t in response.get("results_by_topic_v3_and_below") or ()
             for p in t["results_by_partition"] or () if p["partition_error_code"] == 0]
    target.added.update(added)
    return [f"added={name}-{index}" for name, index in added]

