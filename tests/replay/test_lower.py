"""Lowering a recorded request to the target's newest version (replay.lower), without a broker.

The lowered frame is checked by decoding it with the spec codec at the lower version and, for Produce, with
kafka-python's own classes (an independent reader of the same layout).
"""

from __future__ import annotations

import uuid

import pytest

from protocol.apis import FETCH, METADATA, PRODUCE
from protocol.deep import decode_request, encode_request
from protocol.frames import parse_request
from replay.lower import CannotLower, lower_request

TOPIC_ID = str(uuid.UUID("6f1c2b0e-8a53-4f7e-9d0e-2f6c4a1b3c5d"))
NAMES = {TOPIC_ID: "orders"}
RECORDS = b"\x00" * 61  # opaque to the codec: carried as recorded


def _produce(version: int, topic: dict) -> bytes:
    return encode_request(PRODUCE, version, 7, "java-producer", {
        "transactional_id": None, "acks": -1, "timeout_ms": 30000,
        "topic_data": [{**topic, "partition_data": [{"index": 0, "records": RECORDS}]}]})


def test_a_produce_by_topic_id_is_lowered_to_names():
    """Produce v13 (topic ids) onto a target serving v10: the same request, the topic named as recorded."""
    frame = parse_request(_produce(13, {"topic_id": TOPIC_ID}))
    low = lower_request(frame, 10, NAMES)
    assert (low.api_key, low.api_version, low.correlation_id, low.client_id) == (PRODUCE, 10, 7, "java-producer")
    body = decode_request(low.data, exact=True)["body"]
    assert body["topic_data"] == [{"name": "orders", "partition_data": [{"index": 0, "records": RECORDS}]}]
    assert (body["acks"], body["timeout_ms"], body["transactional_id"]) == (-1, 30000, None)
    # flexible at both versions (v9+): the header keeps its tagged-field byte and the body its compact form
    assert low.data == _produce(10, {"name": "orders"})


def test_lowering_below_the_flexible_versions_changes_the_header_too():
    frame = parse_request(_produce(9, {"name": "orders"}))
    low = lower_request(frame, 8, NAMES)
    assert low.data == _produce(8, {"name": "orders"})  # header v1: no tagged fields; body non-compact
    assert low.body_offset == frame.body_offset - 1


def test_a_topic_id_the_recording_never_named_is_not_guessed():
    frame = parse_request(_produce(13, {"topic_id": str(uuid.uuid4())}))
    with pytest.raises(CannotLower, match="not named in the recording"):
        lower_request(frame, 12, NAMES)


def test_a_consumer_fetch_keeps_its_ids_or_names_its_topics_by_version():
    """Fetch v17 onto v16 (both identify topics by id, KIP-516): the same bytes a v16 client writes. Fetch v13 onto
    v12: the topic is named, as a v12 client names it."""
    def fetch(version: int, **top: object) -> bytes:
        return encode_request(FETCH, version, 3, "consumer-1", {
            "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 52428800, "isolation_level": 0, "session_id": 0,
            "session_epoch": -1, "rack_id": "", **top,
            "topics": [{"topic_id": TOPIC_ID, "partitions": [{"partition": 0, "current_leader_epoch": 0,
                                                               "fetch_offset": 5, "last_fetched_epoch": -1,
                                                               "log_start_offset": -1,
                                                               "partition_max_bytes": 1048576}]}],
            "forgotten_topics_data": []})
    low = lower_request(parse_request(fetch(17)), 16, NAMES)
    assert decode_request(low.data)["body"]["topics"][0]["topic_id"] == TOPIC_ID  # ids at both: kept
    assert low.data == fetch(16)
    low12 = decode_request(lower_request(parse_request(fetch(13)), 12, NAMES).data)["body"]
    assert low12["topics"][0]["topic"] == "orders"


def test_a_field_set_at_the_higher_version_only_stops_the_lowering():
    """Metadata v4 added allow_auto_topic_creation (default true): a v4 request that turned it off cannot be v3."""
    def metadata(version: int, auto: bool) -> bytes:
        return encode_request(METADATA, version, 1, "admin", {"topics": [{"name": "orders"}],
                                                              "allow_auto_topic_creation": auto})
    assert lower_request(parse_request(metadata(4, True)), 3, NAMES).data == encode_request(
        METADATA, 3, 1, "admin", {"topics": [{"name": "orders"}]})
    with pytest.raises(CannotLower, match="allow_auto_topic_creation is set"):
        lower_request(parse_request(metadata(4, False)), 3, NAMES)


def test_a_metadata_request_by_name_drops_its_zero_topic_id_below_v10():
    """Metadata v10+ clients send the zero topic id (the field's default) beside each name: nothing to carry."""
    zero = "00000000-0000-0000-0000-000000000000"
    recorded = encode_request(METADATA, 12, 1, "admin", {"topics": [{"topic_id": zero, "name": "orders"}]})
    body = decode_request(lower_request(parse_request(recorded), 9, NAMES).data)["body"]
    assert body["topics"] == [{"name": "orders"}]


def test_only_lower_versions():
    frame = parse_request(_produce(10, {"name": "orders"}))
    with pytest.raises(CannotLower):
        lower_request(frame, 10, NAMES)


def test_kafka_python_reads_the_lowered_produce():
    """An independent reader: kafka-python's ProduceRequest at v10 decodes what lowering wrote."""
    from protocol.deep import message_class

    low = lower_request(parse_request(_produce(13, {"topic_id": TOPIC_ID})), 10, NAMES)
    msg = message_class(PRODUCE, True).decode(bytes(low.body), version=10)
    topics = msg.topic_data
    assert [t.name for t in topics] == ["orders"]
    assert [p.index for p in topics[0].partition_data] == [0]


def test_replay_sends_a_newer_request_at_the_targets_version_and_notes_one_it_cannot_lower():
    """rewrite_request: with the target's ApiVersions read, a Produce v13 goes out as v10 (rewrite `version_lowered`,
    the topic by name); a Metadata v4 that turned auto-creation off goes out as recorded, noted with the field."""
    from replay.rewrite import rewrite_request
    from replay.state import ConnState, ReplayState, Send
    from replay.versions import NOT_LOWERED

    state = ReplayState(target_versions={PRODUCE: (0, 10), METADATA: (0, 3)}, recorded_topic_ids=dict(NAMES))
    out = rewrite_request(parse_request(_produce(13, {"topic_id": TOPIC_ID})), state, ConnState("java-producer"))
    assert isinstance(out, Send) and "version_lowered" in out.rewrites
    sent = parse_request(out.data)
    assert sent.api_version == 10 and decode_request(out.data)["body"]["topic_data"][0]["name"] == "orders"
    recorded = encode_request(METADATA, 4, 1, "admin", {"topics": [{"name": "orders"}], "allow_auto_topic_creation": False})
    out = rewrite_request(parse_request(recorded), state, ConnState("admin"))
    assert isinstance(out, Send) and out.data == recorded and "version_lowered" not in out.rewrites
    assert [n for n in state.notes if n.startswith(NOT_LOWERED)] == [
        f"{NOT_LOWERED}Metadata v4 → v3: MetadataRequest.allow_auto_topic_creation is set and v3 has no place for it"]
    # a request retried while Pending (here: its producer id not mapped yet) is noted once
    pending = parse_request(_produce(13, {"topic_id": str(uuid.uuid4())}))
    for _ in range(3):
        rewrite_request(pending, state, ConnState("java-producer"))
    assert sum(n for note, n in state.notes.items() if note.startswith(f"{NOT_LOWERED}Produce")) == 1, state.notes
    served = ReplayState(target_versions={PRODUCE: (0, 13)}, recorded_topic_ids=dict(NAMES),
                         target_topic_ids={"orders": TOPIC_ID})
    frame = _produce(13, {"topic_id": TOPIC_ID})
    assert "version_lowered" not in rewrite_request(parse_request(frame), served, ConnState("p")).rewrites


def test_an_ignorable_field_is_left_out_as_kafkas_serializer_leaves_it():
    """ListOffsets v10 added timeout_ms, which Kafka marks ignorable: a Java 4.x client sends it to a 3.7 broker at v8
    without it (its serializer drops an ignorable field the version lacks, whatever it holds). Lowering does the same
    and names it; a field not marked ignorable still stops the lowering (above)."""
    from protocol.apis import LIST_OFFSETS

    body = {"replica_id": -1, "isolation_level": 1, "timeout_ms": 30000,
            "topics": [{"name": "orders", "partitions": [{"partition_index": 0, "current_leader_epoch": 3,
                                                          "timestamp": -1}]}]}
    recorded = parse_request(encode_request(LIST_OFFSETS, 11, 5, "java-consumer", body))
    dropped: list[str] = []
    low = lower_request(recorded, 8, NAMES, dropped)
    assert dropped == ["ListOffsetsRequest.timeout_ms"]
    assert low.api_version == 8
    assert decode_request(low.data)["body"] == {k: v for k, v in body.items() if k != "timeout_ms"}
    # at its default (0) there is nothing to name
    dropped.clear()
    lower_request(parse_request(encode_request(LIST_OFFSETS, 11, 5, "c", {**body, "timeout_ms": 0})), 8, NAMES, dropped)
    assert dropped == []


def test_replay_notes_the_ignorable_fields_it_left_out_once_per_request():
    from protocol.apis import LIST_OFFSETS
    from replay.rewrite import rewrite_request
    from replay.schedule import note_hint
    from replay.state import ConnState, ReplayState, Send
    from replay.versions import LEFT_OUT

    state = ReplayState(target_versions={LIST_OFFSETS: (0, 8)})
    frame = parse_request(encode_request(LIST_OFFSETS, 11, 5, "java-consumer", {
        "replica_id": -1, "isolation_level": 0, "timeout_ms": 30000,
        "topics": [{"name": "orders", "partitions": [{"partition_index": 0, "timestamp": -1}]}]}))
    for _ in range(2):  # a request sent again (a Pending one retried) is noted once
        out = rewrite_request(frame, state, ConnState("java-consumer"))
        assert isinstance(out, Send) and "version_lowered" in out.rewrites and parse_request(out.data).api_version == 8
    note = f"{LEFT_OUT}ListOffsets v11 → v8: ListOffsetsRequest.timeout_ms"
    assert state.notes == {note: 1}, state.notes
    assert "ignorable" in (note_hint(note) or "")
