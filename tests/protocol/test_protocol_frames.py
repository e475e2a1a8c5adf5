"""Frame edits byte by byte (`protocol.frames`): header fields, correlation ids, Produce acks, Fetch sessions.

Frames are built by kafka-python's encoders (`protocol_frames`), never by the
code under test, and every edit is checked against the original bytes: the
field changed, and nothing else.
"""

from __future__ import annotations

import pytest

from protocol.apis import API_VERSIONS, FETCH, METADATA, PRODUCE
from protocol.deep import decode_request, encode_request, encode_response
from protocol.frames import (
    expects_response,
    fetch_response_session,
    parse_request,
    produce_acks,
    produce_acks_at,
    response_body,
    response_correlation_id,
    set_correlation_id,
    set_produce_acks,
    set_response_correlation_id,
)
from protocol_frames import fetch_response, produce_request, records, request, response


def test_correlation_id_and_header_fields() -> None:
    data = request(API_VERSIONS, 3, {"client_software_name": "x", "client_software_version": "1"}, 41, "abc")
    f = parse_request(data)
    assert (f.api_key, f.api_version, f.correlation_id, f.client_id) == (18, 3, 41, "abc")
    assert f.header == data[4:f.body_offset] and data[f.body_offset - 1] == 0  # header v2: empty tagged fields
    g = parse_request(set_correlation_id(data, 9))
    assert g.correlation_id == 9 and g.client_id == "abc" and g.data[12:] == data[12:] and g.data[:8] == data[:8]
    resp = response(API_VERSIONS, 3, {"error_code": 0, "api_keys": [], "throttle_time_ms": 0}, 9)
    assert response_correlation_id(resp) == 9
    moved = set_response_correlation_id(resp, -5)
    assert response_correlation_id(moved) == -5 and moved[:4] == resp[:4] and moved[8:] == resp[8:]
    with pytest.raises(ValueError):
        parse_request(data[:-1])  # size prefix no longer matches
    with pytest.raises(ValueError):
        parse_request(data[:10])


def test_null_client_id_and_non_flexible_header() -> None:
    data = request(METADATA, 1, {"topics": None}, 3, None)
    f = parse_request(data)
    assert f.client_id is None and f.body_offset == 4 + 10 and f.body.tobytes() == b"\xff\xff\xff\xff"


@pytest.mark.parametrize("version,txn", [(0, None), (2, None), (3, None), (3, "tx"), (8, "tx"), (9, None), (9, "a-tx")])
def test_produce_acks_read_and_edited_in_place(version: int, txn: str | None) -> None:
    data = produce_request(version=version, acks=1, transactional_id=txn)
    f = parse_request(data)
    assert produce_acks(f) == 1 and expects_response(f)
    at = produce_acks_at(f)
    assert data[at:at + 2] == b"\x00\x01"
    zero = set_produce_acks(f, 0)
    assert len(zero) == len(data) and zero[:at] == data[:at] and zero[at + 2:] == data[at + 2:]
    z = parse_request(zero)
    assert produce_acks(z) == 0 and not expects_response(z)
    assert decode_request(zero)["body"]["acks"] == 0  # the independent decoder agrees on the position
    assert produce_acks(parse_request(set_produce_acks(f, -1))) == -1


def test_acks_only_for_produce_and_short_bodies_refused() -> None:
    md = parse_request(request(METADATA, 1, {"topics": None}))
    assert expects_response(md)
    with pytest.raises(ValueError):
        produce_acks(md)
    cut = produce_request(version=9, acks=1)
    f = parse_request(cut)
    short = (f.body_offset + 1 - 4).to_bytes(4, "big") + cut[4:f.body_offset + 1]  # body holds one byte
    with pytest.raises(ValueError):
        produce_acks(parse_request(short))


def test_response_body_skips_the_right_header() -> None:
    body = {"throttle_time_ms": 0, "brokers": [], "cluster_id": None, "controller_id": 1, "topics": []}
    flexible = encode_response(METADATA, 12, 5, body)  # header v1: correlation id + empty tags
    assert response_body(flexible, METADATA, 12).tobytes() == flexible[9:]
    old = encode_response(METADATA, 8, 5, body)  # header v0
    assert response_body(old, METADATA, 8).tobytes() == old[8:]
    av = encode_response(API_VERSIONS, 3, 5, {"error_code": 0, "api_keys": [], "throttle_time_ms": 0})
    assert response_body(av, API_VERSIONS, 3).tobytes() == av[8:]  # ApiVersions: always header v0


def test_fetch_response_session_read_without_decoding_records() -> None:
    resp = fetch_response(version=12, parts=2, part_bytes=4096)
    assert fetch_response_session(12, resp) == (0, 12)
    err = encode_response(FETCH, 7, 1, {"throttle_time_ms": 0, "error_code": 71, "session_id": 0, "responses": []})
    assert fetch_response_session(7, err) == (71, 0)
    assert fetch_response_session(6, resp) is None  # no sessions before v7


def test_frames_from_our_encoder_parse_back() -> None:
    frame = encode_request(PRODUCE, 9, 77, "me", {"transactional_id": None, "acks": -1, "timeout_ms": 5,
                                                  "topic_data": [{"name": "t", "partition_data": [
                                                      {"index": 0, "records": records(n=2)}]}]})
    f = parse_request(frame)
    assert (f.api_key, f.api_version, f.correlation_id, f.client_id) == (PRODUCE, 9, 77, "me")
    assert produce_acks(f) == -1
