"""Tagged fields no spec knows survive decode → encode (`protocol.codec.UNKNOWN_TAGS`).

A broker newer than the committed specs may add a tagged field to any flexible
struct; the proxy's rewrites decode such a response exactly and encode it
again, so those fields must come back byte for byte, at every depth, among the
known tagged fields in ascending tag order. The frames are real codec output
with the unknown fields spliced in by hand (`protocol_tags`).
"""

from __future__ import annotations

import pytest

from protocol.apis import METADATA, PRODUCE
from protocol.codec import UNKNOWN_TAGS
from protocol.deep import decode_body, decode_response, encode_body, encode_response
from protocol.errors import EncodeError
from protocol_tags import BROKER_TAGS, TOP_TAGS, TOPIC_TAGS, metadata_frame


@pytest.mark.parametrize("version", [10, 12, 13])
def test_metadata_with_unknown_tags_round_trips_byte_for_byte(version: int) -> None:
    frame = metadata_frame(version)
    body = decode_response(frame, METADATA, version, exact=True)["body"]
    assert body[UNKNOWN_TAGS] == TOP_TAGS
    assert body["topics"][0][UNKNOWN_TAGS] == TOPIC_TAGS
    assert [UNKNOWN_TAGS in b for b in body["brokers"]] == [False, True, False]
    assert body["brokers"][1][UNKNOWN_TAGS] == BROKER_TAGS
    assert UNKNOWN_TAGS not in body["topics"][0]["partitions"][0]
    assert encode_response(METADATA, version, 11, body) == frame
    # the display form shows what the specs describe, as before
    shown = decode_response(frame, METADATA, version)["body"]
    assert UNKNOWN_TAGS not in repr(shown) and shown["brokers"][1]["host"] == "10.0.0.1"


def test_unknown_tags_are_merged_with_known_ones_in_ascending_order() -> None:
    body = {"responses": [{"name": "t", "partition_responses": [{
        "index": 0, "error_code": 6, "base_offset": -1, "current_leader": {"leader_id": 3, "leader_epoch": 1},
        UNKNOWN_TAGS: {9: b"nine", 1: b"one"}}]}], "throttle_time_ms": 0}
    data = encode_body(PRODUCE, 10, False, body)
    leader = encode_body(PRODUCE, 10, False, {"responses": [{"name": "t", "partition_responses": [{
        "index": 0, "error_code": 6, "base_offset": -1, "current_leader": {"leader_id": 3, "leader_epoch": 1}}]}],
        "throttle_time_ms": 0})
    # the partition's section: tag 0 (the known current_leader), then 1 and 9 — whatever the dict's order
    assert b"\x03\x00\x09\x00\x00\x00\x03" in data  # 3 fields; tag 0: 9 bytes of current leader (id 3 …)
    assert data.index(b"\x01\x03one") < data.index(b"\x09\x04nine")
    assert len(data) == len(leader) + len(b"\x01\x03one\x09\x04nine")
    assert decode_body(PRODUCE, 10, False, data, exact=True)["responses"][0]["partition_responses"][0][
        UNKNOWN_TAGS] == {1: b"one", 9: b"nine"}


def test_unknown_tags_that_could_not_have_been_read_are_refused() -> None:
    with pytest.raises(EncodeError, match="tag 0 is the field node_endpoints"):
        encode_body(PRODUCE, 10, False, {"responses": [], UNKNOWN_TAGS: {0: b""}})
    with pytest.raises(EncodeError, match="not flexible"):
        encode_body(PRODUCE, 8, False, {"responses": [], UNKNOWN_TAGS: {5: b""}})
    with pytest.raises(EncodeError, match="bytes expected"):
        encode_body(PRODUCE, 10, False, {"responses": [], UNKNOWN_TAGS: {5: "text"}})
    with pytest.raises(EncodeError, match="not a tag number"):
        encode_body(PRODUCE, 10, False, {"responses": [], UNKNOWN_TAGS: {-1: b""}})
    with pytest.raises(EncodeError, match="tag -> bytes"):
        encode_body(PRODUCE, 10, False, {"responses": [], UNKNOWN_TAGS: [b""]})
