"""KafkaStream on frames built by kafka-python's encoders."""

from __future__ import annotations

import struct

import pytest

from protocol.events import Direction, RequestSeen, ResponseSeen, StreamClosed, StreamOpaque
from protocol.stream import KafkaStream
from protocol_frames import (
    fetch_response,
    metadata_response,
    produce_request,
    records,
    request,
    response,
)
from protocol_helpers import feed, strip_times

FETCH_REQ = {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 1,
             "session_id": 0, "session_epoch": -1, "topics": []}
META_REQ = {"topics": None, "allow_auto_topic_creation": True, "include_topic_authorized_operations": False}


def conversation() -> tuple[bytes, bytes]:
    reqs = (
        request(18, 3, {"client_software_name": "kafkatap-test", "client_software_version": "1.2.3"}, 1)
        + produce_request(cid=2, acks=1)
        + produce_request(cid=3, acks=0)
        + request(1, 12, FETCH_REQ, 4)
        + request(3, 12, META_REQ, 5)
    )
    resps = (
        response(18, 3, {"error_code": 0, "api_keys": [], "throttle_time_ms": 0}, 1)
        + response(0, 9, {"responses": [], "throttle_time_ms": 5}, 2)
        + fetch_response(cid=4, part_bytes=30000)
        + metadata_response(cid=5, topics=5, bad_topic="missing")
    )
    return reqs, resps


def test_conversation_pairs_and_summaries() -> None:
    reqs, resps = conversation()
    evs = feed(reqs, resps)
    kinds = [type(e).__name__ for e in evs]
    assert kinds == ["RequestSeen"] * 5 + ["ResponseSeen"] * 4 + ["StreamClosed"]
    api, prod1, prod0, fetch, meta = evs[:5]
    assert api.summary.client_software_name == "kafkatap-test"
    assert api.summary.client_software_version == "1.2.3"
    assert prod1.expects_response and not prod0.expects_response
    assert prod1.summary.acks == 1 and prod1.summary.topics == ["orders"]
    assert prod1.summary.batches[0].record_count == 3
    assert fetch.summary.max_wait_ms == 500 and fetch.summary.isolation_level == 1
    for resp, req in zip(evs[5:9], (api, prod1, fetch, meta)):
        assert resp.request is req
        assert resp.decode_note is None, resp.decode_note
    assert evs[6].summary.throttle_ms == 5
    fsum = evs[7].summary
    assert [p.partition for p in fsum.fetched] == [0, 1, 2, 3]
    assert all(p.topic == "orders" and p.records_bytes > 0 for p in fsum.fetched)
    msum = evs[8].summary
    assert [(e.code, e.name, e.topic) for e in msum.errors] == [(3, "UNKNOWN_TOPIC_OR_PARTITION", "missing")]
    assert len(msum.brokers) == 3 and msum.partitions == 15
    closed = evs[-1]
    assert isinstance(closed, StreamClosed) and closed.unanswered == [] and closed.truncated == {}


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 0, 4096])
def test_chunking_gives_same_events(chunk: int) -> None:
    reqs, resps = conversation()
    whole = strip_times(feed(reqs, resps))
    assert strip_times(feed(reqs, resps, chunk=chunk, seed=chunk)) == whole


def test_timestamps_first_and_last_chunk() -> None:
    frame = produce_request(cid=9)
    s = KafkaStream()
    s.receive_request_data(frame[:2], 100)
    s.receive_request_data(frame[2:50], 200)
    assert s.next_event() is None
    s.receive_request_data(frame[50:], 300)
    ev = s.next_event()
    assert isinstance(ev, RequestSeen) and (ev.first_byte_ns, ev.last_byte_ns) == (100, 300)
    assert ev.size == len(frame) and ev.offset == 0


def test_unknown_correlation_id_and_unanswered() -> None:
    s = KafkaStream()
    s.receive_request_data(request(3, 12, META_REQ, 41), 1)
    s.receive_response_data(response(0, 9, {"responses": [], "throttle_time_ms": 0}, 99), 2)
    s.close(3)
    req, resp, closed = list(s.events())
    assert isinstance(resp, ResponseSeen) and resp.request is None and "99" in resp.decode_note
    assert closed.unanswered == [req]


def test_opaque_frame_for_unknown_api_still_paired() -> None:
    # key 93 is newer than the committed specs: header fields, pairing, no summary
    body = b"\x00\x05group\x00"  # whatever follows the header is not interpreted
    hdr = struct.pack(">hhih", 93, 1, 77, 3) + b"cli" + b"\x00"
    frame = struct.pack(">i", len(hdr) + len(body)) + hdr + body
    resp_body = struct.pack(">i", 77) + b"\x00" + b"\x00" * 10
    s = KafkaStream()
    s.receive_request_data(frame, 1)
    s.receive_response_data(struct.pack(">i", len(resp_body)) + resp_body, 2)
    req, resp = list(s.events())
    assert req.api_name == "Unknown93" and req.summary is None
    assert req.client_id == "cli" and "no schema" in req.decode_note
    assert resp.request is req and resp.summary is None
    # a version newer than the schemas is an opaque frame too
    hdr = struct.pack(">hhih", 3, 99, 78, 0) + b"\x00"
    s.receive_request_data(struct.pack(">i", len(hdr)) + hdr, 3)
    ev = s.next_event()
    assert ev.api_name == "Metadata" and ev.summary is None and "v99" in ev.decode_note
    assert not s.is_opaque(Direction.REQUEST)


@pytest.mark.parametrize(
    "data,kind",
    [
        (bytes.fromhex("16030100c4010000c00303") + b"\x00" * 60, "tls"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "http"),
        (struct.pack(">i", -5) + b"\x00" * 20, "negative_size"),
        (struct.pack(">i", 200 << 20) + b"\x00" * 20, "oversize"),
        (struct.pack(">i", 3) + b"abc", "garbage"),
        (struct.pack(">i", 12) + struct.pack(">hhih", 3, 1, 1, 40) + b"xx", "garbage"),
    ],
)
def test_stream_level_failures(data: bytes, kind: str) -> None:
    for chunk in (None, 1):
        evs = feed(data + produce_request(), b"", chunk=chunk)
        opaque = [e for e in evs if isinstance(e, StreamOpaque)]
        assert len(opaque) == 1 and opaque[0].kind == kind and opaque[0].offset == 0
        assert "opaque from byte 0" in opaque[0].reason
        assert not any(isinstance(e, RequestSeen) for e in evs)


def test_body_overrun_and_trailing_bytes() -> None:
    good = produce_request(cid=5)
    # trailing bytes: frame declares 3 more bytes than the body uses
    trailing = struct.pack(">i", len(good) - 4 + 3) + good[4:] + b"xyz"
    # (kept parsed: real librdkafka Metadata v13 requests carry 3 trailing bytes the broker ignores)
    for chunk in (None, 1):
        evs = feed(trailing + produce_request(cid=6), b"", chunk=chunk)
        assert [type(e).__name__ for e in evs] == ["RequestSeen", "RequestSeen", "StreamClosed"]
        assert evs[0].decode_note == "trailing_bytes: 3 bytes left over after the body decoded"
        assert evs[0].summary is not None and evs[0].summary.acks == 1
    # body overrun: cut the last 10 bytes of the body but keep the frame consistent
    cut = good[:-10]
    overrun = struct.pack(">i", len(cut) - 4) + cut[4:]
    for chunk in (None, 1, 0):
        evs = feed(overrun + good, b"", chunk=chunk)
        assert [type(e).__name__ for e in evs] == ["RequestSeen", "StreamOpaque", "StreamClosed"]
        assert evs[1].kind == "body_overrun"
        assert evs[0].expects_response  # acks=1 was read before the failure
    # frame-level option keeps parsing
    evs = feed(overrun + produce_request(cid=6), b"", body_errors="frame")
    assert [type(e).__name__ for e in evs] == ["RequestSeen", "RequestSeen", "StreamClosed"]
    assert evs[0].decode_note.startswith("body_overrun") and evs[1].summary is not None


def test_truncated_at_close_and_opaque_counts_bytes() -> None:
    good = produce_request()
    s = KafkaStream()
    s.receive_request_data(good + good[:30], 1)
    s.close(2)
    req, closed = list(s.events())
    assert closed.truncated == {Direction.REQUEST: 30}
    assert closed.unanswered == [req]
    s = KafkaStream()
    s.receive_request_data(b"GET / HTTP/1.1\r\n", 1)
    s.receive_request_data(b"x" * 1000, 2)
    assert s.request_bytes == 1016
    assert [type(e).__name__ for e in s.events()] == ["StreamOpaque"]


def test_huge_frames_are_walked_incrementally_with_bounded_buffers() -> None:
    batch = records(n=200, value_size=50_000)  # ~10 MB batch
    big = produce_request(topics={"big": {0: batch, 1: batch}}, cid=1)
    s = KafkaStream()
    peak = 0
    for i in range(0, len(big), 65536):
        s.receive_request_data(big[i:i + 65536], i)
        fr = s._req.frame
        if fr is not None and fr.body is not None:
            peak = max(peak, len(fr.body.buf), len(fr.hbuf))
    ev = s.next_event()
    assert ev.summary.records == 400 and len(ev.summary.batches) == 2
    assert peak <= 64 * 1024
    fetch = fetch_response(parts=4, part_bytes=4 << 20, cid=1)  # ~16 MiB response
    s = KafkaStream()
    s.receive_request_data(request(1, 12, FETCH_REQ, 1), 0)
    s.next_event()
    for i in range(0, len(fetch), 65536):
        s.receive_response_data(fetch[i:i + 65536], i)
    ev = s.next_event()
    assert ev.decode_note is None and len(ev.summary.fetched) == 4


def test_apiversions_error_answer_is_v0() -> None:
    s = KafkaStream()
    s.receive_request_data(request(18, 4, {"client_software_name": "x", "client_software_version": "1"}, 3), 1)
    # broker does not know v4: answers v0 with UNSUPPORTED_VERSION and header v0
    from protocol.deep import message_class

    av = message_class(18, False)._struct.fields["api_keys"].data_class
    keys = [av(api_key=18, min_version=0, max_version=3)]
    s.receive_response_data(response(18, 0, {"error_code": 35, "api_keys": keys}, 3), 2)
    _, resp = list(s.events())
    assert resp.decode_note is None
    assert [(e.code, e.name) for e in resp.summary.errors] == [(35, "UNSUPPORTED_VERSION")]


def test_apiversions_invalid_request_answer_is_read_at_the_request_version() -> None:
    """Kafka answers a v3 request with a bad client software name with INVALID_REQUEST in the v3 layout."""
    s = KafkaStream()
    s.receive_request_data(request(18, 3, {"client_software_name": "bad name!", "client_software_version": "1"}, 7), 1)
    kafkas_own = bytes.fromhex("002a010000000000")
    s.receive_response_data(struct.pack(">ii", 4 + len(kafkas_own), 7) + kafkas_own, 2)
    events = list(s.events())
    assert not any(isinstance(e, StreamOpaque) for e in events)
    resp = events[-1]
    assert isinstance(resp, ResponseSeen) and resp.decode_note is None
    assert [(e.code, e.name) for e in resp.summary.errors] == [(42, "INVALID_REQUEST")]


@pytest.mark.parametrize("chunk", [None, 1])
def test_controlled_shutdown_v0_request_is_decoded_whole_or_byte_by_byte(chunk: int | None) -> None:
    """ControlledShutdown v0 has request header v0 (no client_id): read as v1, its body would overrun."""
    kafkas_own = struct.pack(">i", 12) + bytes.fromhex("000700000000000500000001")
    events = feed(kafkas_own, b"", chunk=chunk)
    assert not any(isinstance(e, StreamOpaque) for e in events)
    seen = [e for e in events if isinstance(e, RequestSeen)]
    assert len(seen) == 1 and seen[0].decode_note is None and seen[0].correlation_id == 5


def test_data_after_close_raises_documented_error() -> None:
    from protocol.errors import ProtocolError

    s = KafkaStream()
    s.close(1)
    s.close(2)  # idempotent
    with pytest.raises(ProtocolError):
        s.receive_request_data(b"x", 3)


def test_response_errors_are_located_with_the_request_group() -> None:
    from protocol.deep import message_class

    join = message_class(11, True)
    proto = join._struct.fields["protocols"].data_class
    req = request(11, 5, {"group_id": "payments", "session_timeout_ms": 10000, "rebalance_timeout_ms": 10000,
                          "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                          "protocols": [proto(name="range", metadata=b"")]}, 4)
    resp = response(11, 5, {"throttle_time_ms": 0, "error_code": 79, "generation_id": -1, "protocol_name": "",
                            "leader": "", "member_id": "m-1", "members": []}, 4)
    evs = feed(req, resp)
    assert evs[0].summary.group_id == "payments"
    assert [(e.name, e.resource) for e in evs[1].summary.errors] == [("MEMBER_ID_REQUIRED", "payments")]


# ---------------------------------------------------------------- hardening (issue 19)
def _tiny_request(key: int, ver: int, cid: int, client_id: bytes = b"c") -> bytes:
    body = struct.pack(">hhih", key, ver, cid, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


def test_in_flight_cap_and_reused_correlation_id_are_reported_not_lost() -> None:
    from protocol.events import RequestDropped

    reqs = b"".join(_tiny_request(18, 0, cid) for cid in (1, 2, 3, 4, 5)) + _tiny_request(18, 0, 5)
    for chunk in (None, 1):
        evs = feed(reqs, b"", chunk=chunk, max_in_flight=3)
        dropped = [(e.request.correlation_id, e.reason) for e in evs if isinstance(e, RequestDropped)]
        # cap 3: 1 and 2 are given up when 4 and 5 arrive; the second 5 reuses an id still in flight
        assert dropped == [(1, "in_flight_cap"), (2, "in_flight_cap"), (5, "correlation_id_reused")]
        (closed,) = [e for e in evs if isinstance(e, StreamClosed)]
        seen = [e for e in evs if isinstance(e, RequestSeen)]
        assert len(seen) == 6 == len(closed.unanswered) + len(dropped)  # every request accounted for once
        assert [r.correlation_id for r in closed.unanswered] == [3, 4, 5]
        assert closed.unanswered[-1] is seen[4]  # the older request with id 5 keeps its place


def test_caches_keyed_by_client_versions_stay_bounded() -> None:
    from protocol.stream_state import FAST_REQ, FAST_RESP, KNOWN

    s = KafkaStream()
    # versions no schema describes, whole frames and split frames: nothing is cached for them
    data = b"".join(_tiny_request(3, v, v) for v in range(200, 30_200))
    s.receive_request_data(data, 1)
    s.receive_request_data(data[:7], 2)  # a split frame takes the incremental path
    s.receive_request_data(data[7:60], 3)
    assert sum(1 for _ in s.events()) >= 30_000
    for cache in (KNOWN, FAST_REQ, FAST_RESP):
        assert all(v < 200 for _, v in cache), "a version no schema describes was cached"
        assert len(cache) < 2_000


def test_oversize_header_tags_make_the_direction_opaque_instead_of_buffering() -> None:
    from protocol.framing import MAX_HEADER_BYTES

    # Metadata v12 has a v2 (flexible) request header: one tagged field of 100 KiB
    tag_len = 100 * 1024
    tag = b"\x01" + b"\x00" + bytes([0x80 | (tag_len & 0x7F), 0x80 | ((tag_len >> 7) & 0x7F), tag_len >> 14]) + b"x" * tag_len
    body = struct.pack(">hhih", 3, 12, 9, 1) + b"c" + tag + b"\x00" * 8
    frame = struct.pack(">i", len(body)) + body
    for chunk in (None, 1000):
        s = KafkaStream()
        held = 0
        step = chunk or len(frame)
        for i in range(0, len(frame), step):
            s.receive_request_data(frame[i:i + step], i)
            fr = s._req.frame
            held = max(held, len(fr.hbuf) if fr is not None else 0)
        evs = list(s.events())
        assert [(type(e).__name__, getattr(e, "kind", None)) for e in evs] == [("StreamOpaque", "oversize_header")]
        assert evs[0].offset == 0
        assert held <= MAX_HEADER_BYTES + step


def test_legacy_sasl_v0_raw_tokens_are_never_parsed_as_frames() -> None:
    handshake = request(17, 0, {"mechanism": "PLAIN"}, 1, client_id="app")
    token = b"\x00alice\x00s3cret-password-that-is-long"
    raw = struct.pack(">i", len(token)) + token  # unframed: no Kafka header
    after = request(18, 0, {}, 2, client_id="app")  # after auth, Kafka frames again
    hs_resp = response(17, 0, {"error_code": 0, "mechanisms": ["PLAIN"]}, 1)
    server_token = struct.pack(">i", 0)
    for chunk in (None, 1):
        evs = feed(handshake + raw + after, hs_resp + server_token, chunk=chunk)
        seen = [e for e in evs if isinstance(e, RequestSeen)]
        assert [(e.api_key, e.client_id) for e in seen] == [(17, "app")]
        assert not any("s3cret" in repr(e) or "alice" in repr(e) for e in evs)
        opaque = {e.direction: (e.kind, e.offset) for e in evs if isinstance(e, StreamOpaque)}
        assert opaque == {Direction.REQUEST: ("sasl_v0", len(handshake)), Direction.RESPONSE: ("sasl_v0", len(hs_resp))}
        assert [e.request is seen[0] for e in evs if isinstance(e, ResponseSeen)] == [True]


@pytest.mark.parametrize("seed", range(6))
def test_frames_end_cuts_whole_frames_wherever_a_chunk_starts(seed):
    """The fair scheduler slices a queued chunk with `frames_end`: each cut must fall on a frame boundary and
    hold exactly `k` frame ends (fewer only at the chunk's end), whatever frame the stream is in the middle of
    and however the bytes were chunked before; and decoding by those cuts gives the events of one feed."""
    import random

    rnd = random.Random(seed)
    reqs, _ = conversation()
    data = reqs * 3 + b"".join(request(18, 0, {}, 100 + i) for i in range(40))
    ends, pos = set(), 0
    while pos < len(data):
        pos += 4 + struct.unpack_from(">i", data, pos)[0]
        ends.add(pos)
    st = KafkaStream()
    at = 0
    while at < len(data):
        chunk = data[at:at + rnd.choice([1, 2, 3, 5, 40, 300, 5000, 100_000])]
        done = 0
        while done < len(chunk):
            k = rnd.choice([1, 2, 4, 16])
            end = st.frames_end(True, chunk, done, k)
            assert done < end <= len(chunk)
            inside = [e for e in ends if at + done < e <= at + end]
            if end < len(chunk):
                assert at + end in ends and len(inside) == k, (at, done, end, k)
            else:
                assert len(inside) <= k
            st.receive_request_data(chunk[done:end], 0)
            done = end
        at += len(chunk)
    whole = KafkaStream()
    whole.receive_request_data(data, 0)
    assert strip_times(list(st.events())) == strip_times(list(whole.events()))
    assert st.request_bytes == len(data)


def test_frames_end_leaves_garbage_and_opaque_streams_whole():
    st = KafkaStream()
    assert st.frames_end(True, b"\xff\xff\xff\xff" + b"x" * 60, 0, 4) == 64  # a negative size: the decoder judges
    st.receive_request_data(b"\x16\x03\x01\x00\x10" + b"x" * 20, 0)  # TLS: opaque from here on
    assert st.is_opaque(Direction.REQUEST)
    assert st.frames_end(True, request(18, 0, {}, 1) * 5, 0, 1) == len(request(18, 0, {}, 1)) * 5


@pytest.mark.parametrize("chunk", [None, 1, 0])
def test_cluster_id_of_metadata_and_describe_cluster_answers_is_summarized(chunk: int | None) -> None:
    """The proxy names the recording's cluster from the answers it relays: Metadata v2+ and DescribeCluster
    carry the id (Metadata v0/v1 and a null id do not); whole frames, one byte at a time and random chunks."""
    from protocol.deep import encode_request, encode_response

    md = {"brokers": [], "controller_id": 1, "topics": []}  # v1: no throttle time, no cluster id yet
    dc = {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "endpoint_type": 1, "cluster_id": "dc-id",
          "controller_id": 1, "brokers": [], "cluster_authorized_operations": -2147483648}
    dc_req = {"include_cluster_authorized_operations": False, "endpoint_type": 1}
    md8 = {**md, "throttle_time_ms": 0}
    answers = [(3, 1, {"topics": None}, md), (3, 2, {"topics": None}, {**md, "cluster_id": "v2-id"}),
               (3, 8, META_REQ, {**md8, "cluster_id": "v8-id"}), (3, 12, META_REQ, {**md8, "cluster_id": "v12-id"}),
               (3, 12, META_REQ, {**md8, "cluster_id": None}), (60, 1, dc_req, dc)]
    reqs = b"".join(encode_request(key, v, cid, "c", body) for cid, (key, v, body, _) in enumerate(answers, 1))
    resps = b"".join(encode_response(key, v, cid, body) for cid, (key, v, _, body) in enumerate(answers, 1))
    got = [ev.summary.extra.get("cluster_id") for ev in feed(reqs, resps, chunk=chunk) if isinstance(ev, ResponseSeen)]
    assert got == [None, "v2-id", "v8-id", "v12-id", None, "dc-id"]


@pytest.mark.parametrize("chunk", [None, 1, 0])
def test_topic_id_name_pairs_of_metadata_create_topics_and_describe_topic_partitions_answers(chunk: int | None) -> None:
    """The proxy names the topic ids modern clients send from the answers it relays: Metadata v10+ (every version
    with ids, a null name from v12), CreateTopics v7+ and DescribeTopicPartitions pair each topic's name with its
    id, kept as the id's 16 bytes; the older versions, a topic without an id (the null id) or without a name pair
    nothing. Whole frames, one byte at a time and random chunks."""
    import uuid

    from protocol.deep import encode_request, encode_response

    def tid(name: str) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_DNS, name))

    zero = "00000000-0000-0000-0000-000000000000"

    def md_topic(name: str | None, topic_id: str, error: int = 0) -> dict:
        return {"error_code": error, "name": name, "topic_id": topic_id, "is_internal": False, "partitions": [
            {"error_code": 0, "partition_index": 0, "leader_id": 1, "leader_epoch": 0, "replica_nodes": [1],
             "isr_nodes": [1], "offline_replicas": []}], "topic_authorized_operations": -2147483648}

    def md(version: int, *topics: dict) -> tuple:
        ask = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
        body = {"throttle_time_ms": 0, "brokers": [], "cluster_id": "c", "controller_id": 1, "topics": list(topics)}
        return 3, version, ask, body

    def ct_topic(name: str, topic_id: str) -> dict:
        return {"name": name, "topic_id": topic_id, "error_code": 0, "error_message": None, "num_partitions": 1,
                "replication_factor": 1, "configs": []}

    ct_ask = {"topics": [], "timeout_ms": 1000, "validate_only": False}
    dtp_ask = {"topics": [{"name": "a"}], "response_partition_limit": 10, "cursor": None}
    answers = [
        md(9, {k: v for k, v in md_topic("old", tid("old")).items() if k != "topic_id"}),  # v9: no ids yet
        md(10, md_topic("m10", tid("m10")), md_topic("missing", zero, error=3)),
        md(11, md_topic("m11", tid("m11"))),
        md(12, md_topic("m12", tid("m12")), md_topic(None, tid("by-id-only"))),
        md(13, md_topic("m13a", tid("m13a")), md_topic("m13b", tid("m13b"))),
        (19, 6, ct_ask, {"throttle_time_ms": 0, "topics": [  # CreateTopics v6: no ids yet
            {k: v for k, v in ct_topic("c6", tid("c6")).items() if k != "topic_id"}]}),
        (19, 7, ct_ask, {"throttle_time_ms": 0, "topics": [ct_topic("c7", tid("c7"))]}),
        (75, 0, dtp_ask, {"throttle_time_ms": 0, "topics": [md_topic("d0", tid("d0"))], "next_cursor": None}),
    ]
    reqs = b"".join(encode_request(key, v, cid, "c", ask) for cid, (key, v, ask, _) in enumerate(answers, 1))
    resps = b"".join(encode_response(key, v, cid, body) for cid, (key, v, _, body) in enumerate(answers, 1))
    got = [[(str(uuid.UUID(bytes=raw)), name) for raw, name in ev.summary.extra.get("topic_pairs", ())]
           for ev in feed(reqs, resps, chunk=chunk) if isinstance(ev, ResponseSeen)]
    assert got == [[], [(tid("m10"), "m10")], [(tid("m11"), "m11")], [(tid("m12"), "m12")],
                   [(tid("m13a"), "m13a"), (tid("m13b"), "m13b")], [], [(tid("c7"), "c7")], [(tid("d0"), "d0")]]


@pytest.mark.parametrize("api_key, version, body", [
    # ApiVersions v0: error_code, then api_keys claiming 2^31 - 1 entries of (key, min, max)
    (18, 0, struct.pack(">hi", 0, 0x7FFFFFFF)),
    # Fetch v11: throttle, error, session, one topic, one partition whose aborted_transactions claim 2^31 - 1
    (1, 11, struct.pack(">ihii", 0, 0, 0, 1) + struct.pack(">h", 1) + b"t" + struct.pack(">iihqqq", 1, 0, 0, 0, 0, 0)
     + struct.pack(">i", 0x7FFFFFFF)),
])
def test_a_huge_count_of_skipped_elements_is_an_overrun_at_once_whole_or_split(api_key: int, version: int,
                                                                               body: bytes) -> None:
    """Elements read by nothing were skipped one by one without a bounds check in the incremental walker (which
    does not know the frame's end): a 20-byte answer held the event loop for minutes, every connection with it."""
    import time

    req = request(api_key, version, {} if api_key == 18 else dict(FETCH_REQ, topics=[]), 7)
    resp = struct.pack(">ii", len(body) + 4, 7) + body
    for chunk in (None, 1):
        started = time.monotonic()
        evs = feed(req, resp, chunk=chunk)
        assert time.monotonic() - started < 2.0, chunk
        assert any(type(e).__name__ == "StreamOpaque" and e.kind == "body_overrun" for e in evs) or any(
            type(e).__name__ == "ResponseSeen" and (e.decode_note or "").startswith("body_overrun") for e in evs), evs
