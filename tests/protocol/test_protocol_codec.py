"""The encode side of `protocol.deep`: dict bodies → whole frames, and back.

Every api/version/direction with a schema: random valid messages, built and
framed by kafka-python (`protocol_random`), decoded to the exact dict form,
re-encoded by our encoders — the bytes must be the original ones, and
decoding our frame must give the same dict (decode(encode(x)) == x). Real
client traffic is re-encoded the same way in test_protocol_real_traffic.
The request builders the harness used to pack by hand are pinned byte for
byte, so the wire client sends what they sent.
"""

from __future__ import annotations

import struct
import uuid

import pytest

from protocol.apis import API_VERSIONS, APIS, CREATE_TOPICS, METADATA, PRODUCE, SASL_AUTHENTICATE
from protocol.deep import decode_request, decode_response, encode_body, encode_request, encode_response
from protocol.errors import EncodeError, UnknownApi
from protocol_frames import records
from protocol_random import pair

from protocol_cases import KP_CASES as CASES
from protocol_cases import case_id


@pytest.mark.parametrize("api_key,version", CASES, ids=[case_id(c) for c in CASES])
def test_encode_reproduces_every_version(api_key: int, version: int) -> None:
    for seed in range(3):
        req, resp = pair(api_key, version, seed, full=seed == 0)
        d = decode_request(req, exact=True)
        again = encode_request(d["api_key"], d["api_version"], d["correlation_id"], d["client_id"], d["body"])
        if api_key != SASL_AUTHENTICATE:  # its auth_bytes are never decoded (credentials are not kept)
            assert again == req
        assert decode_request(again, exact=True) == d
        r = decode_response(resp, api_key, version, exact=True)
        again = encode_response(api_key, version, r["correlation_id"], r["body"])
        if api_key != SASL_AUTHENTICATE:
            assert again == resp
        assert decode_response(again, api_key, version, exact=True) == r


def test_exact_form_keeps_bytes_and_uuids_as_given() -> None:
    tid = uuid.uuid4()
    recs = records(n=2)
    body = {"transactional_id": "tx", "acks": -1, "timeout_ms": 100, "topic_data": [
        {"topic_id": str(tid), "partition_data": [{"index": 3, "records": recs}]}]}
    frame_ = encode_request(PRODUCE, 13, 9, None, body)
    got = decode_request(frame_, exact=True)
    assert got == {"api_key": PRODUCE, "api_version": 13, "correlation_id": 9, "client_id": None, "body": body}
    assert got["body"]["topic_data"][0]["partition_data"][0]["records"] == recs
    shown = decode_request(frame_)["body"]["topic_data"][0]["partition_data"][0]["records"]
    assert isinstance(shown, str)  # the display form: text, not for encoding back
    same = encode_request(PRODUCE, 13, 9, None, {**body, "topic_data": [
        {"topic_id": tid, "partition_data": [{"index": 3, "records": bytearray(recs)}]}]})
    assert same == frame_  # uuid.UUID and any bytes-like are taken too


def test_header_versions_follow_the_specs() -> None:
    old = encode_request(METADATA, 8, 1, "c", {"topics": None, "allow_auto_topic_creation": True,
                                               "include_cluster_authorized_operations": False,
                                               "include_topic_authorized_operations": False})
    assert old[4:14 + 1] == struct.pack(">hhih", 3, 8, 1, 1) + b"c"  # header v1 …
    assert old[15:19] == b"\xff\xff\xff\xff"  # … and the body right behind client_id
    new = encode_request(METADATA, 9, 1, "c", {"topics": None, "allow_auto_topic_creation": True,
                                               "include_topic_authorized_operations": False})
    assert new[15] == 0 and new[16] == 0  # header v2: empty tagged fields, then the compact null array
    av = encode_response(API_VERSIONS, 3, 4, {"error_code": 0, "api_keys": [], "throttle_time_ms": 0})
    assert av[4:8] == b"\x00\x00\x00\x04" and av[8:10] == b"\x00\x00"  # ApiVersions: response header v0 always
    md = encode_response(METADATA, 12, 4, {"throttle_time_ms": 0, "brokers": [], "cluster_id": None,
                                          "controller_id": 1, "topics": []})
    assert md[8] == 0 and len(md) == 4 + int.from_bytes(md[:4], "big")  # header v1 tags; size prefix right


def test_api_versions_error_answer_is_written_as_v0() -> None:
    resp = encode_response(API_VERSIONS, 3, 2, {"error_code": 35, "api_keys": [
        {"api_key": 18, "min_version": 0, "max_version": 3}]})
    assert resp == struct.pack(">iihi", 4 + 2 + 4 + 6, 2, 35, 1) + struct.pack(">hhh", 18, 0, 3)
    assert decode_response(resp, API_VERSIONS, 3, exact=True)["body"]["error_code"] == 35


def test_api_versions_other_errors_keep_the_request_version() -> None:
    """A broker writes only UNSUPPORTED_VERSION as v0; INVALID_REQUEST (a bad client software name) comes at v3."""
    kafkas_own = bytes.fromhex("002a010000000000")  # Kafka 4.3.1's ApiVersionsResponseData v3: error 42, no keys
    resp = struct.pack(">ii", 4 + len(kafkas_own), 9) + kafkas_own
    body = decode_response(resp, API_VERSIONS, 3, exact=True)["body"]
    assert body["error_code"] == 42 and body["api_keys"] == [] and body["throttle_time_ms"] == 0
    assert encode_response(API_VERSIONS, 3, 9, body) == resp


def test_controlled_shutdown_v0_has_request_header_v0() -> None:
    """The one request whose header has no client_id; Kafka 3.7.2's own bytes for broker 1, correlation id 5."""
    kafkas_own = struct.pack(">i", 12) + bytes.fromhex("000700000000000500000001")
    assert decode_request(kafkas_own, exact=True) == {"api_key": 7, "api_version": 0, "correlation_id": 5,
                                                      "client_id": None, "body": {"broker_id": 1}}
    assert encode_request(7, 0, 5, None, {"broker_id": 1}) == kafkas_own
    assert encode_request(7, 1, 5, None, {"broker_id": 1})[12:14] == b"\xff\xff"  # v1: header v1, a null client_id


def test_the_hand_packed_requests_it_replaces_are_reproduced() -> None:
    """harness/kafka.py (Metadata v1), scenarios/runner.py (CreateTopics v2), the surge driver (ApiVersions v0, Metadata v1)."""
    def hand(key: int, ver: int, cid: int, client: bytes, body: bytes) -> bytes:
        payload = struct.pack(">hhih", key, ver, cid, len(client)) + client + body
        return struct.pack(">i", len(payload)) + payload

    assert encode_request(METADATA, 1, 7, "kafkatap-harness", {"topics": None}) == hand(
        3, 1, 7, b"kafkatap-harness", struct.pack(">i", -1))
    assert encode_request(METADATA, 1, 7, "kafkatap-harness", {"topics": [{"name": "orders"}]}) == hand(
        3, 1, 7, b"kafkatap-harness", struct.pack(">ih", 1, 6) + b"orders")
    assert encode_request(API_VERSIONS, 0, 0, "surge", {}) == hand(18, 0, 0, b"surge", b"")
    assert encode_request(METADATA, 1, 5, "surge", {"topics": []}) == hand(3, 1, 5, b"surge", struct.pack(">i", 0))
    topics = {"a": 3, "bb": 1}
    body = struct.pack(">i", len(topics))
    for name, parts in topics.items():
        body += struct.pack(">h", len(name)) + name.encode() + struct.pack(">ihii", parts, 1, 0, 0)
    body += struct.pack(">i?", 30000, False)
    ours = encode_request(CREATE_TOPICS, 2, 1, "kafkatap-scenario-setup", {
        "topics": [{"name": n, "num_partitions": p, "replication_factor": 1, "assignments": [], "configs": []}
                   for n, p in topics.items()], "timeout_ms": 30000, "validate_only": False})
    assert ours == hand(19, 2, 1, b"kafkatap-scenario-setup", body)


def test_bodies_that_do_not_fit_the_schema_are_refused() -> None:
    with pytest.raises(EncodeError, match="no_such_field"):
        encode_body(METADATA, 1, True, {"topics": None, "no_such_field": 1})
    with pytest.raises(EncodeError, match="allow_auto_topic_creation: no such field in v1"):
        encode_body(METADATA, 1, True, {"topics": None, "allow_auto_topic_creation": True})  # v4+
    with pytest.raises(EncodeError, match="bytes expected"):
        encode_body(PRODUCE, 3, True, {"topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": "x"}]}]})
    with pytest.raises(EncodeError, match="not a UUID"):
        encode_body(METADATA, 12, True, {"topics": [{"topic_id": "nope", "name": "t"}]})
    with pytest.raises(EncodeError):
        encode_body(METADATA, 1, True, {"topics": "orders"})  # a struct array needs dicts
    with pytest.raises(UnknownApi):
        encode_body(METADATA, APIS[METADATA].max_version + 1, True, {})
    with pytest.raises(UnknownApi):
        encode_body(1000, 0, True, {})


def test_fields_left_out_take_the_specs_defaults() -> None:
    got = decode_request(encode_request(CREATE_TOPICS, 7, 1, "c", {"topics": []}), exact=True)["body"]
    assert got == {"topics": [], "timeout_ms": 60000, "validate_only": False}
