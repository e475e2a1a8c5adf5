"""The small parts: api table, error names, headers, record batches, deep decode, summarize()."""

from __future__ import annotations

import struct

import pytest

from protocol.apis import API_NAMES, APIS, api_info, api_name
from protocol.deep import decode_request, decode_response
from protocol.errors import BodyOverrun, DecodeError, ProtocolError, UnknownApi, error_name
from protocol.framing import check_size, sniff_non_kafka
from protocol.headers import parse_request_header, request_header_flexible, response_header_flexible
from protocol.records import read_batch, scan
from protocol.summaries import summarize
from protocol_frames import produce_request, records, request, response


def test_api_table_from_schemas_and_hand_names() -> None:
    assert len(API_NAMES) == 93 and api_name(68) == "ConsumerGroupHeartbeat" and api_name(500) == "Unknown500"
    assert APIS[0].max_version >= 13 and APIS[0].flexible_from == 9
    assert APIS[18].flexible_from == 3 and APIS[17].flexible_from == 0x7FFF  # SaslHandshake never flexible
    # every key Kafka 4.3.1 assigns has a spec (share groups, telemetry, KIP-848 …); a newer key has none
    assert all(APIS[k].has_schema for k in API_NAMES) and APIS[78].decodable(1) and api_info(93) is None
    assert APIS[0].decodable(0) and APIS[0].legacy_below == 3  # Produce v0-2: 3.7.2's layout
    assert request_header_flexible(3, 9) and not request_header_flexible(3, 8)
    assert not response_header_flexible(18, 4) and response_header_flexible(3, 12)


def test_error_names() -> None:
    assert error_name(10) == "MESSAGE_TOO_LARGE" and error_name(18) == "RECORD_LIST_TOO_LARGE"
    assert error_name(3) == "UNKNOWN_TOPIC_OR_PARTITION" and error_name(9999) == "UNKNOWN_CODE_9999"
    assert issubclass(BodyOverrun, DecodeError) and issubclass(UnknownApi, ProtocolError)


def test_sniffing() -> None:
    assert sniff_non_kafka(bytes.fromhex("160301")) [0] == "tls"
    assert sniff_non_kafka(b"POST /x")[0] == "http"
    assert sniff_non_kafka(b"\x00\x00\x00\x10") is None
    assert check_size(b"\x00\x00\x00\x10", 16, 100, 1 << 20) is None
    assert check_size(b"\x7f\x00\x00\x00", 0x7F000000, 100, 1 << 20)[0] == "oversize"


def test_request_header_v1_and_v2_and_null_client() -> None:
    f = request(3, 12, {"topics": None, "allow_auto_topic_creation": True,
                        "include_topic_authorized_operations": False}, 5, client_id=None)
    assert parse_request_header(f, 4, len(f))[:4] == (3, 12, 5, None)
    f = request(3, 4, {"topics": None, "allow_auto_topic_creation": True}, 6)
    assert parse_request_header(f, 4, len(f))[:4] == (3, 4, 6, "test-client")


@pytest.mark.parametrize("compression,codec", [(0, "none"), (1, "gzip")])
def test_record_batch_header(compression: int, codec: str) -> None:
    b = records(n=5, compression=compression, producer_id=77, producer_epoch=3, base_sequence=10,
                transactional=True)
    batch, size = read_batch(b, 0, len(b), "t", 2)
    assert size == len(b)
    assert (batch.magic, batch.record_count, batch.compression, batch.producer_id, batch.producer_epoch,
            batch.base_sequence, batch.transactional, batch.control) == (2, 5, codec, 77, 3, 10, True, False)
    out: list = []
    assert scan(b + b, 0, 2 * len(b), 2 * len(b), "t", 2, out) == 10 and len(out) == 2
    # a partial trailing batch (as in Fetch responses) is not counted
    out = []
    assert scan(b + b[:40], 0, len(b) + 40, len(b) + 40, "t", 2, out) == 5


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_message_sets(magic: int) -> None:
    b = records(n=3, magic=magic, compression=1)
    out: list = []
    scan(b, 0, len(b), len(b), "t", 0, out)
    assert out and all(x.magic == magic and x.compression == "gzip" for x in out)
    f = produce_request(version=2, topics={"t": {0: records(n=2, magic=1)}})
    ev_summary, trailing = summarize(0, 2, True, f[4 + 10 + len("test-client"):])
    assert trailing == 0 and ev_summary.batches[0].magic == 1


def test_summarize_and_errors() -> None:
    f = produce_request(version=9, acks=-1, transactional_id="tx-1")
    body = f[4 + 10 + len("test-client") + 1:]
    s, trailing = summarize(0, 9, True, body)
    assert (s.acks, s.transactional_id, s.topics, trailing) == (-1, "tx-1", ["orders"], 0)
    with pytest.raises(BodyOverrun):
        summarize(0, 9, True, body[:-5])
    with pytest.raises(UnknownApi):
        summarize(93, 0, True, body)  # a key newer than the specs


def test_deep_decode_and_sasl_payload_dropped() -> None:
    f = request(36, 2, {"auth_bytes": b"\x00user\x00secret"}, 3)
    d = decode_request(f)
    assert d["api_key"] == 36 and "auth_bytes" not in d["body"]
    r = response(17, 1, {"error_code": 0, "mechanisms": ["PLAIN"]}, 3)
    assert decode_response(r, 17, 1)["body"]["mechanisms"] == ["PLAIN"]
    with pytest.raises(DecodeError):
        decode_request(struct.pack(">ihhih", 8, 3, 12, 1, -1))


def test_sasl_summaries_keep_no_credentials() -> None:
    from protocol_helpers import feed

    reqs = request(17, 1, {"mechanism": "SCRAM-SHA-512"}, 1) + request(36, 2, {"auth_bytes": b"n,,n=user,r=secretnonce"}, 2)
    resps = response(17, 1, {"error_code": 0, "mechanisms": ["SCRAM-SHA-512"]}, 1) + response(
        36, 2, {"error_code": 58, "error_message": "bad", "auth_bytes": b"server-secret", "session_lifetime_ms": 0}, 2)
    evs = feed(reqs, resps)
    assert evs[0].summary.sasl_mechanism == "SCRAM-SHA-512"
    assert "secret" not in repr(evs)
    assert [e.name for e in evs[3].summary.errors] == ["SASL_AUTHENTICATION_FAILED"]


def test_identifying_fields_of_group_txn_admin_apis() -> None:
    from protocol_helpers import feed
    from protocol_random import frame, random_message

    def req(key: int, ver: int, seed: int = 1):
        return feed(frame(random_message(key, ver, True, seed, need_response=True), 1), b"")[0]

    def resp(key: int, ver: int, seed: int = 2):
        rq = frame(random_message(key, ver, True, seed, need_response=True), 1)
        return feed(rq, frame(random_message(key, ver, False, seed), 1))[1]

    from protocol.deep import decode_request as dr

    for key, ver in ((11, 9), (14, 5), (12, 4), (8, 9), (9, 7)):  # JoinGroup SyncGroup Heartbeat OffsetCommit OffsetFetch
        ev = req(key, ver)
        body = dr(frame(random_message(key, ver, True, 1, need_response=True), 1))["body"]
        assert ev.summary.group_id == body["group_id"], (key, ver)
        if "member_id" in body:
            assert ev.summary.member_id == body["member_id"]
        if "generation_id" in body:
            assert ev.summary.generation_id == body["generation_id"]
    ev = req(26, 4)  # EndTxn
    assert ev.summary.transactional_id is not None or ev.summary.producer_id is not None
    ev = req(2, 7)  # ListOffsets
    assert ev.summary.isolation_level is not None
    for seed in range(5):  # FindCoordinator v4: the first of CoordinatorKeys
        ev = req(10, 4, seed)
        keys = dr(frame(random_message(10, 4, True, seed, need_response=True), 1))["body"]["coordinator_keys"]
        assert ev.summary.coordinator_key == (keys[0] if keys else None)
    r = resp(22, 4)  # InitProducerId response
    assert r.summary.producer_id is not None and r.summary.producer_epoch is not None
    r = resp(10, 4)  # FindCoordinator v4 response: Coordinators[]
    d = decode_response(frame(random_message(10, 4, False, 2), 1), 10, 4)["body"]
    if d["coordinators"]:
        c = d["coordinators"][0]
        assert r.summary.coordinator == f"{c['host']}:{c['port']}"
    r = resp(19, 7)  # CreateTopics response: topics and per-topic errors
    d = decode_response(frame(random_message(19, 7, False, 2), 1), 19, 7)["body"]
    assert sorted(r.summary.topics) == sorted({t["name"] for t in d["topics"] if t["name"] is not None})
