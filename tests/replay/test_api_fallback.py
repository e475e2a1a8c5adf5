"""An API the target lacks, sent as the API its clients fall back to there (replay.api_fallback), without a broker.

The Metadata request is read back with the spec codec and with kafka-python's own MetadataRequest (an independent
reader of the same layout); the replay against a real 3.7.2 broker is in test_replay_java_clients.py (a Kafka
Streams session's admin client)."""

from __future__ import annotations

import pytest

from protocol.apis import DESCRIBE_TOPIC_PARTITIONS, METADATA
from protocol.deep import decode_request, encode_request, message_class
from protocol.frames import parse_request
from replay.api_fallback import PAGE_COVERED, SENT_AS_METADATA, as_metadata, falls_back
from replay.rewrite import rewrite_request
from replay.schedule import note_hint
from replay.state import ConnState, ReplayState, Send, Skip
from replay.versions import FALLBACK, MISSING, unserved

KAFKA_37 = {METADATA: (0, 12)}  # a 3.7 broker: Metadata up to v12, no DescribeTopicPartitions


def describe(topics: list[str], cursor: dict | None = None, correlation_id: int = 9) -> bytes:
    return encode_request(DESCRIBE_TOPIC_PARTITIONS, 0, correlation_id, "app-admin", {
        "topics": [{"name": t} for t in topics], "response_partition_limit": 2000, "cursor": cursor})


def test_only_a_target_lacking_the_api_but_serving_its_fallback_gets_it():
    assert falls_back(DESCRIBE_TOPIC_PARTITIONS, 0, KAFKA_37) == METADATA
    assert falls_back(DESCRIBE_TOPIC_PARTITIONS, 0, {**KAFKA_37, DESCRIBE_TOPIC_PARTITIONS: (0, 0)}) is None  # 3.8+
    assert falls_back(DESCRIBE_TOPIC_PARTITIONS, 0, {}) is None  # versions unknown: sent as recorded
    assert falls_back(DESCRIBE_TOPIC_PARTITIONS, 1, KAFKA_37) is None  # a version no spec here describes
    assert falls_back(METADATA, 12, KAFKA_37) is None


def test_a_describe_goes_out_as_the_metadata_request_kafkas_admin_client_sends_instead():
    frame = as_metadata(parse_request(describe(["orders", "eosapp-repartition"])), KAFKA_37)
    assert frame is not None and (frame.api_key, frame.api_version) == (METADATA, 12)
    assert (frame.correlation_id, frame.client_id) == (9, "app-admin")
    body = decode_request(frame.data, exact=True)["body"]
    assert [t["name"] for t in body["topics"]] == ["orders", "eosapp-repartition"]
    assert body["allow_auto_topic_creation"] is False and body["include_topic_authorized_operations"] is False
    msg = message_class(METADATA, True).decode(bytes(frame.body), version=12)  # kafka-python reads the same
    assert [t.name for t in msg.topics] == ["orders", "eosapp-repartition"] and msg.allow_auto_topic_creation is False


def test_no_topics_describes_every_topic_and_a_later_page_is_covered():
    every = decode_request(as_metadata(parse_request(describe([])), KAFKA_37).data)["body"]
    assert every["topics"] is None  # Metadata's null: all topics, as DescribeTopicPartitions' empty list
    # a broker before Metadata v4 would create the topics it is asked about: the client asks for every topic
    assert decode_request(as_metadata(parse_request(describe(["orders"])), {METADATA: (0, 3)}).data)["body"] == {
        "topics": None}
    assert decode_request(as_metadata(parse_request(describe(["orders"])), {METADATA: (0, 0)}).data)["body"] == {
        "topics": []}
    page = parse_request(describe(["orders"], cursor={"topic_name": "orders", "partition_index": 2000}))
    assert as_metadata(page, KAFKA_37) is None


def test_replay_sends_the_fallback_and_skips_a_covered_page():
    state = ReplayState(target_versions=dict(KAFKA_37))
    out = rewrite_request(parse_request(describe(["orders"])), state, ConnState("app-admin"))
    assert isinstance(out, Send) and out.rewrites == (SENT_AS_METADATA,) and out.expects_response
    assert parse_request(out.data).api_key == METADATA
    page = parse_request(describe(["orders"], cursor={"topic_name": "orders", "partition_index": 2000}))
    assert rewrite_request(page, state, ConnState("app-admin")) == Skip(PAGE_COVERED)
    renamed = ReplayState(target_versions=dict(KAFKA_37), topic_map={"orders": "orders-copy"})
    out = rewrite_request(parse_request(describe(["orders"])), renamed, ConnState("app-admin"))
    assert [t["name"] for t in decode_request(out.data)["body"]["topics"]] == ["orders-copy"]  # --topic-map applies
    served = ReplayState(target_versions={**KAFKA_37, DESCRIBE_TOPIC_PARTITIONS: (0, 0)})
    recorded = describe(["orders"])
    assert rewrite_request(parse_request(recorded), served, ConnState("app-admin")).data == recorded


def test_a_describe_the_codec_cannot_read_goes_out_as_recorded():
    """A truncated body (or a version no spec here describes) is sent as recorded and counted, as any other request
    replay cannot read; it does not end the connection's replay."""
    state = ReplayState(target_versions=dict(KAFKA_37))
    whole = describe(["orders"])
    cut = whole[:-3]
    truncated = (len(cut) - 4).to_bytes(4, "big") + cut[4:]
    out = rewrite_request(parse_request(truncated), state, ConnState("app-admin"))
    assert isinstance(out, Send) and out.data == truncated and out.rewrites == ()
    assert state.notes == {"sent_undecodable_body": 1}


@pytest.mark.parametrize("served, prefix", [(KAFKA_37, FALLBACK), ({}, MISSING)])
def test_the_set_up_names_the_fallback(served: dict, prefix: str):
    (u,) = unserved([(DESCRIBE_TOPIC_PARTITIONS, 0, "app-admin")] * 2, served)
    assert u.requests == 2 and u.note.startswith(f"{prefix}DescribeTopicPartitions v0"), u.note
    if prefix == FALLBACK:
        assert u.note == f"{FALLBACK}DescribeTopicPartitions v0 → Metadata (clients: app-admin)"
        assert "sent_as_metadata" in (note_hint(u.note) or "")
