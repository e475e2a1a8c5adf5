"""protocol.addresses: every host/port pair found from the specs, rewritten with every other byte kept.

The byte-for-byte checks use same-length replacement hosts, so a rewritten frame
has the original's length and the differing positions can be compared with the
exact positions of the original host strings and ports.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest

from protocol import addresses as A
from protocol.apis import APIS
from protocol.codec import UNKNOWN_TAGS
from protocol.deep import decode_response, encode_response
from protocol.errors import ProtocolError
from protocol_tags import BROKER_TAGS, TOP_TAGS, TOPIC_TAGS, metadata_frame, section_after, with_unknown_tags

PRODUCE, FETCH, METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER, SHARE_FETCH, SHARE_ACK = 0, 1, 3, 10, 60, 78, 79


def test_spec_walk_finds_the_client_facing_broker_addresses_at_their_kip_versions() -> None:
    apis = A.address_apis()
    # the ones the issue names, at the versions the specs introduce them (KIP-951: Produce 10+, Fetch 16+)
    assert apis[METADATA][0] == 0 and apis[FIND_COORDINATOR][0] == 0 and apis[DESCRIBE_CLUSTER][0] == 0
    assert apis[PRODUCE][0] == 10 and apis[FETCH][0] == 16
    assert SHARE_FETCH in apis and SHARE_ACK in apis
    # found, not listed: KRaft quorum endpoints and Kafka Streams user endpoints are pairs too
    assert {52, 55, 88, 89} <= set(apis)
    for key, (lo, hi) in apis.items():
        assert APIS[key].min_version <= lo <= hi <= APIS[key].max_version


def test_only_real_pairs_count_and_broker_ids_come_from_entity_types() -> None:
    # ClientHost (no ClientPort) and ACL hosts (no port) are not addresses
    for key in (15, 29, 31, 69, 77):
        info = APIS[key]
        assert not any(A.endpoints(key, False, v) for v in range(info.min_version, info.max_version + 1))
    (coord_old,) = A.endpoints(FIND_COORDINATOR, False, 3)
    (coord_new,) = A.endpoints(FIND_COORDINATOR, False, 4)
    assert coord_old.path == () and coord_old.node_id == "node_id"
    assert coord_new.path == ("coordinators",)
    (dc,) = A.endpoints(DESCRIBE_CLUSTER, False, 1)
    assert dc.node_id == "broker_id" and dc.broker
    streams = [e for e in A.endpoints(89, False, 0)]
    assert streams and not any(e.broker for e in streams)  # an application's endpoint, not a broker's
    assert A.endpoints(PRODUCE, False, 9) == ()


def _metadata_body(v: int) -> dict[str, Any]:
    return {
        "throttle_time_ms": 7,
        "brokers": [{"node_id": i, "host": "10.0.0.1", "port": 9092 + i, "rack": "r1" if v >= 1 else None}
                    for i in (1, 2, 3)],
        "cluster_id": "clu" if v >= 2 else None,
        "controller_id": 2,
        "topics": [{"error_code": 0, "name": "orders", "topic_id": "6f1f0bc4-6c1a-4f3e-9b1b-7c2d7e0d0a11",
                    "is_internal": False,
                    "partitions": [{"error_code": 0, "partition_index": p, "leader_id": 1 + p % 3,
                                    "leader_epoch": 4, "replica_nodes": [1, 2, 3], "isr_nodes": [1, 2],
                                    "offline_replicas": []} for p in range(4)],
                    "topic_authorized_operations": -2147483648}],
    }


def _clean(body: dict[str, Any], v: int) -> dict[str, Any]:
    """Keep only the fields version `v` has (the codec rejects unknown keys)."""
    from protocol import codec

    def fit(st: Any, value: Any) -> Any:
        if isinstance(value, list):
            return [fit(st, x) for x in value]
        out = {}
        for k, x in value.items():
            f = st.by_key.get(k)
            if f is None:
                continue
            out[k] = fit(f.struct, x) if f.struct is not None and x is not None else x
        return out
    return fit(codec.plan(METADATA, False, v), body)


def _positions(frame: bytes, needle: bytes) -> set[int]:
    out, i = set(), frame.find(needle)
    while i >= 0:
        out.update(range(i, i + len(needle)))
        i = frame.find(needle, i + 1)
    return out


def _assert_only_the_brokers_addresses_differ(frame: bytes, rewritten: bytes | None) -> None:
    """Same length, and every changed byte is in a host `10.0.0.1` or a port 9093-9095 of the original."""
    assert rewritten is not None and len(rewritten) == len(frame)
    allowed = _positions(frame, b"10.0.0.1")
    for port in (9093, 9094, 9095):
        allowed |= _positions(frame, struct.pack(">i", port))
    diff = {i for i, (a, b) in enumerate(zip(frame, rewritten)) if a != b}
    assert diff and diff <= allowed


@pytest.mark.parametrize("version", [0, 1, 9, 12, 13])
def test_metadata_rewrite_changes_exactly_the_address_bytes(version: int) -> None:
    frame = encode_response(METADATA, version, 42, _clean(_metadata_body(version), version))
    mapping = {("10.0.0.1", 9093): ("10.9.9.9", 19002), ("10.0.0.1", 9094): ("10.9.9.9", 19003),
               ("10.0.0.1", 9095): ("10.9.9.9", 19004)}
    seen_nodes = []

    def mapper(addr: A.SeenAddress) -> tuple[str, int] | None:
        seen_nodes.append(addr.node_id)
        return mapping.get((addr.host, addr.port))

    out = A.rewrite_response(frame, METADATA, version, mapper)
    assert out.changed == 3 and seen_nodes == [1, 2, 3]
    _assert_only_the_brokers_addresses_differ(frame, out.frame)
    got = decode_response(out.frame, METADATA, version, exact=True)["body"]
    assert [(b["host"], b["port"]) for b in got["brokers"]] == [("10.9.9.9", p) for p in (19002, 19003, 19004)]
    assert got["topics"] == decode_response(frame, METADATA, version, exact=True)["body"]["topics"]


def test_longer_hosts_keep_every_other_field_and_the_header() -> None:
    v = 12
    frame = encode_response(METADATA, v, 7, _clean(_metadata_body(v), v))
    out = A.rewrite_response(frame, METADATA, v, lambda a: ("kafkatap-proxy.example.internal", 30000 + a.node_id))
    assert out.frame is not None and out.changed == 3
    assert struct.unpack(">i", out.frame[:4])[0] == len(out.frame) - 4
    assert out.frame[4:9] == frame[4:9]  # correlation id and the header's tagged fields
    before, after = (decode_response(f, METADATA, v, exact=True)["body"] for f in (frame, out.frame))
    for b in after["brokers"]:
        assert (b["host"], b["port"]) == ("kafkatap-proxy.example.internal", 30000 + b["node_id"])
        b["host"], b["port"] = "10.0.0.1", 9092 + b["node_id"]
    assert after == before


def test_unchanged_when_the_mapper_keeps_everything() -> None:
    frame = encode_response(METADATA, 9, 1, _clean(_metadata_body(9), 9))
    out = A.rewrite_response(frame, METADATA, 9, lambda a: None)
    assert out.frame is None and out.changed == 0 and len(out.seen) == 3


def test_fetch_node_endpoints_tagged_field_next_to_records() -> None:
    v = 16
    records = bytes(range(256)) * 8
    body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 5,
            "responses": [{"topic_id": "6f1f0bc4-6c1a-4f3e-9b1b-7c2d7e0d0a11",
                           "partitions": [{"partition_index": 0, "error_code": 6, "high_watermark": 10,
                                           "last_stable_offset": 10, "log_start_offset": 0,
                                           "aborted_transactions": [], "preferred_read_replica": -1,
                                           "records": records,
                                           "current_leader": {"leader_id": 2, "leader_epoch": 3}}]}],
            "node_endpoints": [{"node_id": 2, "host": "10.0.0.2", "port": 9092, "rack": None}]}
    frame = encode_response(FETCH, v, 99, body)
    out = A.rewrite_response(frame, FETCH, v, lambda a: ("10.7.7.7", 19003) if a.node_id == 2 else None)
    assert out.frame is not None and len(out.frame) == len(frame)
    diff = {i for i, (a, b) in enumerate(zip(frame, out.frame)) if a != b}
    assert diff <= _positions(frame, b"10.0.0.2") | _positions(frame, struct.pack(">i", 9092))
    assert records in out.frame
    # without node endpoints (the usual Fetch) nothing is asked and nothing changes
    body["node_endpoints"] = None
    plain = encode_response(FETCH, v, 100, body)
    out = A.rewrite_response(plain, FETCH, v, lambda a: ("x", 1))
    assert (out.frame, out.changed, out.seen) == (None, 0, ())


def test_produce_find_coordinator_and_describe_cluster() -> None:
    produce = encode_response(PRODUCE, 10, 3, {
        "responses": [{"name": "t", "partition_responses": [{"index": 0, "error_code": 6, "base_offset": -1,
                                                             "current_leader": {"leader_id": 3, "leader_epoch": 1}}]}],
        "throttle_time_ms": 0, "node_endpoints": [{"node_id": 3, "host": "b3", "port": 9092, "rack": None}]})
    out = A.rewrite_response(produce, PRODUCE, 10, lambda a: ("p3", 19004))
    assert decode_response(out.frame, PRODUCE, 10)["body"]["node_endpoints"][0]["host"] == "p3"
    for v, body in ((3, {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "node_id": 1,
                         "host": "b1", "port": 9092}),
                    (6, {"throttle_time_ms": 0, "coordinators": [
                        {"key": "g", "node_id": 1, "host": "b1", "port": 9092, "error_code": 0,
                         "error_message": None}]})):
        fc = encode_response(FIND_COORDINATOR, v, 4, body)
        out = A.rewrite_response(fc, FIND_COORDINATOR, v, lambda a: ("p1", 19002))
        assert out.changed == 1 and b"b1" not in out.frame
    dc = encode_response(DESCRIBE_CLUSTER, 1, 5, {
        "throttle_time_ms": 0, "error_code": 0, "error_message": None, "endpoint_type": 1, "cluster_id": "c",
        "controller_id": 1, "brokers": [{"broker_id": 1, "host": "b1", "port": 9092, "rack": None}],
        "cluster_authorized_operations": 0})
    out = A.rewrite_response(dc, DESCRIBE_CLUSTER, 1, lambda a: ("p1", 19002) if a.node_id == 1 else None)
    assert out.changed == 1


def test_a_port_that_does_not_fit_or_a_frame_that_is_not_exact_is_never_rewritten() -> None:
    frame = encode_response(METADATA, 9, 1, _clean(_metadata_body(9), 9))
    assert A.rewrite_response(frame, METADATA, 9, lambda a: ("h", 1 << 40)).frame is None
    trailing = frame + b"\x00\x01"
    trailing = struct.pack(">i", len(trailing) - 4) + trailing[4:]
    with pytest.raises(A.NotExact):
        A.rewrite_response(trailing, METADATA, 9, lambda a: ("h", 1))
    with pytest.raises(ProtocolError):
        A.rewrite_response(frame[:40], METADATA, 9, lambda a: ("h", 1))


@pytest.mark.parametrize("version", [10, 13])
def test_a_newer_brokers_unknown_tags_are_kept_and_its_addresses_still_rewritten(version: int) -> None:
    """Unknown tags in a broker entry, a topic and the body: the addresses change, nothing else does."""
    frame = metadata_frame(version)
    out = A.rewrite_response(frame, METADATA, version, lambda a: ("10.9.9.9", 19000 + a.node_id))
    assert out.changed == 3
    _assert_only_the_brokers_addresses_differ(frame, out.frame)
    got = decode_response(out.frame, METADATA, version, exact=True)["body"]
    assert [(b["host"], b["port"]) for b in got["brokers"]] == [("10.9.9.9", 19000 + i) for i in (1, 2, 3)]
    assert (got[UNKNOWN_TAGS], got["topics"][0][UNKNOWN_TAGS], got["brokers"][1][UNKNOWN_TAGS]) == (
        TOP_TAGS, TOPIC_TAGS, BROKER_TAGS)


def test_produce_node_endpoints_next_to_an_unknown_top_level_tag() -> None:
    """KIP-951 endpoints (tag 0) with a newer tag after them, and one in the partition entry: rewritten."""
    frame = encode_response(PRODUCE, 10, 3, {
        "responses": [{"name": "t", "partition_responses": [{"index": 0, "error_code": 6, "base_offset": -1,
                                                             "error_message": "moved",
                                                             "current_leader": {"leader_id": 3, "leader_epoch": 1}}]}],
        "throttle_time_ms": 4321, "node_endpoints": [{"node_id": 3, "host": "b3", "port": 9092, "rack": None}]})
    frame = with_unknown_tags(frame, section_after(frame, struct.pack(">i", 4321)), {5: b"later"})
    frame = with_unknown_tags(frame, section_after(frame, b"\x06moved"), {3: b"\x01\x02"})
    out = A.rewrite_response(frame, PRODUCE, 10, lambda a: ("p3", 19004))
    assert out.changed == 1 and out.frame is not None and len(out.frame) == len(frame)
    diff = {i for i, (a, b) in enumerate(zip(frame, out.frame)) if a != b}
    assert diff and diff <= _positions(frame, b"b3") | _positions(frame, struct.pack(">i", 9092))


@pytest.mark.parametrize("with_endpoints", [True, False])
def test_fast_skip_over_big_fetch_bodies_agrees_with_the_full_decode(with_endpoints: bool) -> None:
    """The skip to the top-level tags walks nested tagged fields, nulls and aborted transactions correctly."""
    v = 17
    parts = [{"partition_index": i, "error_code": 0, "high_watermark": 100 + i, "last_stable_offset": 90,
              "log_start_offset": 0, "preferred_read_replica": -1, "records": bytes([i]) * (50 + i),
              "aborted_transactions": [{"producer_id": 7, "first_offset": 3}] if i % 2 else None,
              "diverging_epoch": {"epoch": 2, "end_offset": 5} if i == 1 else None,
              "current_leader": {"leader_id": 3, "leader_epoch": 9} if i == 2 else None}
             for i in range(3)]
    body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 11,
            "responses": [{"topic_id": "6f1f0bc4-6c1a-4f3e-9b1b-7c2d7e0d0a11", "partitions": parts},
                          {"topic_id": "7f1f0bc4-6c1a-4f3e-9b1b-7c2d7e0d0a12", "partitions": parts[:1]}],
            "node_endpoints": [{"node_id": 3, "host": "b3", "port": 9092, "rack": "r"}] if with_endpoints else None}
    frame = encode_response(FETCH, v, 5, body)
    asked: list[int | None] = []

    def mapper(a: A.SeenAddress) -> tuple[str, int]:
        asked.append(a.node_id)
        return "p3", 19004

    out = A.rewrite_response(frame, FETCH, v, mapper)
    if with_endpoints:
        assert asked == [3] and out.changed == 1
        got = decode_response(out.frame, FETCH, v, exact=True)["body"]
        assert got["node_endpoints"][0]["host"] == "p3" and got["responses"] == decode_response(
            frame, FETCH, v, exact=True)["body"]["responses"]
    else:
        assert asked == [] and out.frame is None and out.body is None  # skipped, never decoded


def _fetch_frame(with_endpoints: bool, v: int = 17) -> bytes:
    parts = [{"partition_index": i, "error_code": 6 if i == 2 else 0, "high_watermark": 100, "last_stable_offset": 100,
              "log_start_offset": 0, "preferred_read_replica": -1, "records": bytes([i]) * (70_000 + i),
              "aborted_transactions": None,
              "current_leader": {"leader_id": 3, "leader_epoch": 9} if i == 2 else None}
             for i in range(3)]
    body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 11,
            "responses": [{"topic_id": "6f1f0bc4-6c1a-4f3e-9b1b-7c2d7e0d0a11", "partitions": parts}],
            "node_endpoints": [{"node_id": 3, "host": "b3", "port": 9092, "rack": None}] if with_endpoints else None}
    return encode_response(FETCH, v, 5, body)


@pytest.mark.parametrize("with_endpoints", [False, True])
def test_no_addresses_in_reads_a_frame_still_in_its_pieces(with_endpoints: bool) -> None:
    """The check the editor makes before joining a Fetch response's reads: the same answer on the pieces,
    however they were cut, as on the joined frame; the pieces read as the frame does."""
    import random

    from protocol.pieces import Pieces

    frame = _fetch_frame(with_endpoints)
    assert A.no_addresses_in(frame, FETCH, 17) is not with_endpoints
    for seed in range(8):
        rng = random.Random(seed)
        cuts = sorted({0, len(frame), *(rng.randrange(len(frame)) for _ in range(rng.randint(1, 40)))})
        cuts += [cuts[-1]] if seed == 3 else []  # an empty piece at the end changes nothing
        pieces = Pieces([memoryview(frame)[a:b] for a, b in zip(cuts, cuts[1:])])
        assert len(pieces) == len(frame) and bytes(pieces) == frame
        assert A.no_addresses_in(pieces, FETCH, 17) is not with_endpoints
        for _ in range(200):
            i = rng.randrange(len(frame))
            k = rng.randint(0, 9)
            assert pieces[i] == frame[i] and pieces[i:i + k] == frame[i:i + k]
        assert pieces[-1] == frame[-1]
        with pytest.raises(IndexError):
            pieces[len(frame)]
    # what it cannot vouch for, it does not: a truncated frame, an API whose addresses are not in tags
    assert not A.no_addresses_in(frame[:-30], FETCH, 17)
    assert not A.no_addresses_in(Pieces([frame[:1000], frame[1000:-1]]), FETCH, 17)
    assert not A.no_addresses_in(encode_response(METADATA, 12, 1, _clean(_metadata_body(12), 12)), METADATA, 12)
