"""A broker's own connections, recorded on a listener the brokers share with clients, are left out of a replay.

The requests are built with kafka-python's classes (compiled from Kafka's JSON specs), independently of
the classifier, which reads them with the project's spec codec.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from replay_frames import cls, request
from replay_synthetic import SynthConn, SynthRequest, api_versions, metadata, write_recording

from protocol.frames import parse_request
from replay.cli import format_plan
from replay.inter_broker import SKIP_REASON, sent_by_broker
from replay.load import Filters, load_recording

FETCH = cls(1)


@pytest.mark.parametrize(("api_key", "version", "fields", "broker"), [
    (1, 12, {"replica_id": 3}, True),  # a follower's fetch: its broker id
    (1, 12, {"replica_id": -1}, False),  # a consumer's
    (1, 15, {"replica_state": FETCH.ReplicaState(version=15, replica_id=2, replica_epoch=5)}, True),  # KIP-903
    (1, 17, {}, False),  # v15+ consumer: the tagged ReplicaState left out (-1)
    (23, 4, {"replica_id": 1}, True),  # OffsetForLeaderEpoch from a follower
    (23, 4, {"replica_id": -1}, False),  # … from a consumer
    (24, 3, {}, False),  # AddPartitionsToTxn v3: a producer's
    (24, 4, {}, True),  # v4+: a partition leader verifying a batch of transactions (KIP-890)
    (27, 1, {}, True),  # WriteTxnMarkers: the transaction coordinator's
    (18, 3, {"client_software_name": "x", "client_software_version": "1"}, False),
], ids=lambda v: str(v) if not isinstance(v, dict) else "")
def test_which_requests_only_a_broker_sends(api_key: int, version: int, fields: dict, broker: bool):
    defaults = {1: {"max_wait_ms": 500, "min_bytes": 1}}.get(api_key, {})
    assert sent_by_broker(parse_request(request(api_key, version, **defaults, **fields))) is broker


def _markers(cid: int) -> SynthRequest:
    return SynthRequest(0.01 * cid, request(27, 1, cid, "broker-1-txn-marker-sender", markers=[]), 27, 1, cid)


def test_a_brokers_connection_is_skipped_whole_and_the_plan_says_why(tmp_path: Path):
    broker = SynthConn("b1", 0.0, [api_versions(1, "broker-1-txn-marker-sender"), _markers(2), _markers(3)],
                       client_id="broker-1-txn-marker-sender")
    client = SynthConn("c1", 0.0, [api_versions(1), metadata(2, 0.1)])
    write_recording(tmp_path, [broker, client])
    rec = load_recording(tmp_path)
    assert [c.conn_id for c in rec.connections] == ["c1"]
    assert rec.skipped == {SKIP_REASON: 3}  # its ApiVersions too: the connection is the broker's
    plan = format_plan(rec, "127.0.0.1:9", 1.0, {}, None, "track")
    assert f"will skip    3 request(s): {SKIP_REASON} (a broker's own connections" in plan
    from replay.schedule import ReplayResult

    result = ReplayResult(connections=1)
    result.skipped.update(rec.skipped)
    assert f"skipped     3  {SKIP_REASON} (a broker's own connections" in result.summary()  # the end says it too
    # a filter that leaves the broker's connection out does not call it skipped
    assert load_recording(tmp_path, Filters(clients=("synthetic",))).skipped == {}
    # nor what --api leaves out of it: only the requests the filters keep are "skipped", the rest filtered out
    rec = load_recording(tmp_path, Filters(apis=(3,)))
    assert (rec.skipped, rec.requests, rec.dropped_by_filter) == ({}, 1, 4)
    rec = load_recording(tmp_path, Filters(apis=(18,)))
    assert (rec.skipped, rec.requests, rec.dropped_by_filter) == ({SKIP_REASON: 1}, 1, 3)


def test_an_admin_aborting_a_transaction_is_a_client_not_a_broker(tmp_path: Path):
    """Kafka's Admin client sends WriteTxnMarkers itself to abort a hanging transaction (KIP-664, kafka-transactions
    abort), beside Metadata and DescribeProducers: one broker-only request does not make a connection a broker's."""
    admin = SynthConn("a1", 0.0, [api_versions(1, "adminclient-1"), metadata(2, 0.1, "adminclient-1"), _markers(3)],
                      client_id="adminclient-1")
    write_recording(tmp_path, [admin])
    rec = load_recording(tmp_path)
    assert [c.conn_id for c in rec.connections] == ["a1"] and rec.skipped == {}
