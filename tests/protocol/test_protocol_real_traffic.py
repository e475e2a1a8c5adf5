"""Real clients against the real broker: every frame decoded or explained, every response paired.

Traffic from kafka-python, confluent-kafka (librdkafka) and kcat is captured on
loopback (see `protocol_capture`), fed to `KafkaStream` segment by segment as
the packets arrived, and checked three ways:
  * the decoder's own invariants (no opaque stream, every response paired,
    every body decoded or an opaque frame with a reason);
  * kafka-python's full decode of the same frames (errors, throttle, acks,
    record batches, fetched partitions, topics, client software);
  * our encoders (`protocol.deep.encode_*`) re-encode every decoded frame to
    the very bytes the client or broker sent;
  * tshark's Kafka dissector (api key, version, correlation id, client id of
    every request it understands).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kafka.record.memory_records import MemoryRecords

from protocol.apis import APIS, API_VERSIONS, FETCH, METADATA, PRODUCE, SASL_AUTHENTICATE
from protocol.deep import decode_request, decode_response, encode_request, encode_response, message_class
from protocol.events import Direction, RequestSeen, ResponseSeen, StreamClosed, StreamOpaque
from protocol.headers import parse_request_header, response_header_flexible, skip_request_header_tags
from protocol.stream import KafkaStream
from protocol.summaries.varint import skip_tags
from protocol_capture import Capture, Conn, connections, have_capture_tools, tshark_requests
from protocol_oracle import actual, expected
from protocol_workloads import ALL

pytestmark = [
    pytest.mark.netns,  # captures on loopback: needs root
    pytest.mark.timeout(300),
]


def test_capture_tools_are_installed() -> None:
    """dumpcap and tshark come with Debian's tshark package, which ./go installs."""
    assert have_capture_tools(), "needs root, dumpcap and tshark (apt-get install tshark)"


CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def decode_conn(conn: Conn, byte_at_a_time: bool = False, step: int = 1) -> tuple[list[Any], bytes, bytes]:
    """Feed the segments as they were captured (or each in `step`-byte pieces, same timestamps)."""
    s = KafkaStream()
    ts = 0
    for seg in conn.segments:
        ts = seg.ts_ns
        feed = s.receive_request_data if seg.to_broker else s.receive_response_data
        if byte_at_a_time:
            for i in range(0, len(seg.payload), step):
                feed(seg.payload[i:i + step], ts)
        else:
            feed(seg.payload, ts)
    s.close(ts + 1)
    return list(s.events()), conn.bytes(True), conn.bytes(False)


def raw_body(frame: bytes, req: RequestSeen | None) -> tuple[memoryview, int]:
    d = memoryview(frame)
    if req is None:
        key, ver, _, _, p = parse_request_header(d, 4, len(d))
        return d[skip_request_header_tags(d, p, len(d), key, ver):], ver
    p = 8
    if response_header_flexible(req.api_key, req.api_version):
        p = skip_tags(d, p, len(d))
    return d[p:], req.api_version


def check_against_kafka_python(ev: RequestSeen | ResponseSeen, frame: bytes, stats: Counter) -> None:
    if isinstance(ev, RequestSeen):
        deep = decode_request(frame)["body"]
        assert actual(ev.summary)["errors"] == expected(deep)["errors"]
        if ev.api_key == PRODUCE:
            assert ev.summary.acks == deep["acks"]
            body, ver = raw_body(frame, None)
            msg = message_class(PRODUCE, True).decode(body, version=ver)
            want = []
            for t in msg.topic_data:
                for pd in t.partition_data:
                    recs = MemoryRecords(bytes(pd.records))
                    while (b := recs.next_batch()) is not None:
                        want.append((pd.index, b.base_offset, b.records_count if b.magic >= 2 else 1,
                                     CODECS.get(b.compression_type, "unknown"), b.producer_id if b.magic >= 2 else -1))
            got = [(b.partition, b.base_offset, b.record_count, b.compression, b.producer_id) for b in ev.summary.batches]
            assert got == want
            stats.update(f"codec:{b.compression}" for b in ev.summary.batches)
            stats[f"acks:{ev.summary.acks}"] += 1
        if ev.api_key == API_VERSIONS and ev.api_version >= 3:
            assert ev.summary.client_software_name == deep["client_software_name"]
            stats[f"software:{ev.summary.client_software_name}"] += 1
        return
    req = ev.request
    assert req is not None
    deep = decode_response(frame, req.api_key, req.api_version)["body"]
    assert actual(ev.summary) == expected(deep), (req.api_name, req.api_version)
    stats.update(f"error:{e.name}" for e in ev.summary.errors)
    if req.api_key == FETCH:
        body, ver = raw_body(frame, req)
        msg = message_class(FETCH, False).decode(body, version=ver)
        want = [(p.partition_index, p.error_code, p.high_watermark, len(p.records) if p.records else 0)
                for t in msg.responses for p in t.partitions]
        got = [(p.partition, p.error_code, p.high_watermark, p.records_bytes) for p in ev.summary.fetched]
        assert got == want
    if req.api_key == METADATA:
        names = [t["name"] for t in deep["topics"] if t.get("name")]
        assert sorted(ev.summary.topics) == sorted(set(names))
        assert len(ev.summary.brokers) == len(deep["brokers"])


def check_reencoded(ev: RequestSeen | ResponseSeen, frame: bytes, stats: Counter) -> None:
    """Our encoders give back the very bytes the real client / broker sent (decode exact → encode)."""
    if isinstance(ev, RequestSeen):
        if ev.api_key == SASL_AUTHENTICATE:
            return  # its credentials are never decoded, so they cannot be encoded back
        d = decode_request(frame, exact=True)
        again = encode_request(d["api_key"], d["api_version"], d["correlation_id"], d["client_id"], d["body"])
        name = ev.api_name
    else:
        req = ev.request
        assert req is not None
        d = decode_response(frame, req.api_key, req.api_version, exact=True)
        again = encode_response(req.api_key, req.api_version, d["correlation_id"], d["body"])
        name = req.api_name
    assert again == frame, (name, frame[:120].hex(), again[:120].hex())
    stats["reencoded"] += 1


def run_and_check(kafka: Any, tmp_path: Path, topic: str) -> Counter:
    pcap = tmp_path / "traffic.pcap"
    with Capture(kafka.port, pcap):
        for workload in ALL:
            workload(kafka.bootstrap, topic)
    conns = connections(pcap, kafka.port)
    assert len(conns) >= 10, "expected many client connections"
    assert max(len(c.bytes(False)) for c in conns) > 1 << 20, "expected a bulk consumer connection"
    stats: Counter = Counter()
    ours: dict[int, list[tuple[int, int, int, str]]] = {}
    for conn in conns:
        events, req_bytes, resp_bytes = decode_conn(conn)
        # one byte at a time (big bulk connections: 997-byte pieces, to keep the test fast)
        step = 1 if len(req_bytes) + len(resp_bytes) < 256 * 1024 else 997
        assert decode_conn(conn, True, step)[0] == events, f"chunking changed events of stream {conn.stream}"
        stats["bytes"] += len(req_bytes) + len(resp_bytes)
        opaque = [e for e in events if isinstance(e, StreamOpaque)]
        if opaque:
            data = req_bytes if opaque[0].direction.value == "request" else resp_bytes
            frame = data[opaque[0].offset:opaque[0].offset + 4 + int.from_bytes(data[opaque[0].offset:opaque[0].offset + 4], "big")]
            (tmp_path / "bad_frame.bin").write_bytes(frame)
            head = parse_request_header(frame, 4, len(frame)) if opaque[0].direction.value == "request" else None
            raise AssertionError(f"{opaque[0]} header={head} frame={frame[:200].hex()}")
        closed = events[-1]
        assert isinstance(closed, StreamClosed)
        # a consumer may close while a big Fetch response is still arriving
        if closed.truncated:
            assert set(closed.truncated) == {Direction.RESPONSE} and closed.unanswered, closed
            stats["truncated_responses"] += 1
        ours[conn.stream] = []
        for ev in events:
            if isinstance(ev, RequestSeen):
                stats["requests"] += 1
                stats[f"api:{ev.api_name}"] += 1
                ours[conn.stream].append((ev.api_key, ev.api_version, ev.correlation_id, ev.client_id or ""))
                frame = req_bytes[ev.offset:ev.offset + ev.size]
                info = APIS.get(ev.api_key)
                if info is None or not info.decodable(ev.api_version):
                    assert ev.summary is None and ev.decode_note and ev.decode_note.startswith("no schema")
                    stats[f"opaque:{ev.api_name}v{ev.api_version}"] += 1
                    continue
                if ev.decode_note is not None:  # see KafkaStream._end_mismatch
                    assert ev.decode_note.startswith("trailing_bytes"), ev.decode_note
                    stats[f"trailing:{ev.api_name}v{ev.api_version}:{ev.client_id}"] += 1
                else:
                    assert ev.decode_note is None, ev.decode_note
                    check_reencoded(ev, frame, stats)  # trailing bytes are not part of any body
                check_against_kafka_python(ev, frame, stats)
            elif isinstance(ev, ResponseSeen):
                stats["responses"] += 1
                assert ev.request is not None, f"unpaired response {ev}"
                if ev.request.summary is None:
                    assert ev.summary is None and ev.decode_note
                    continue
                assert ev.decode_note is None, (ev.request.api_name, ev.decode_note)
                check_against_kafka_python(ev, resp_bytes[ev.offset:ev.offset + ev.size], stats)
                check_reencoded(ev, resp_bytes[ev.offset:ev.offset + ev.size], stats)
        # A broker answers a connection's requests in order, so whatever a close leaves unanswered is the tail of
        # the requests that wait for an answer: an unanswered request before an answered one is a pairing bug. (Which
        # APIs a client happens to have in flight when it closes is the client's timing, not the decoder's.)
        waiting = [ev.offset for ev in events if isinstance(ev, RequestSeen) and ev.expects_response]
        left = sorted(r.offset for r in closed.unanswered)
        assert left == waiting[len(waiting) - len(left):], (conn.stream, left, waiting[-len(left) - 2:])
        for r in closed.unanswered:
            stats[f"unanswered:{r.api_name}"] += 1
    # the independent oracle: tshark's Kafka dissector on the same packets
    theirs = tshark_requests(pcap, kafka.port)
    compared = 0
    for stream, tuples in theirs.items():
        mine = ours.get(stream, [])
        missing = [t for t in tuples if t not in mine]
        assert not missing, f"stream {stream}: tshark saw requests we did not: {missing[:5]}"
        compared += len(tuples)
    stats["tshark_compared"] = compared
    assert compared >= 0.5 * stats["requests"], (compared, stats["requests"])
    return stats


def test_real_clients_every_frame_decoded(kafka_any_version: Any, tmp_path: Path, topic_name: str) -> None:
    stats = run_and_check(kafka_any_version, tmp_path, topic_name)
    print(f"\n{kafka_any_version.version}: " + ", ".join(f"{k}={v}" for k, v in sorted(stats.items())))
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        assert stats[f"codec:{codec}"] > 0, codec
    for acks in (0, 1, -1):
        assert stats[f"acks:{acks}"] > 0
    assert stats["reencoded"] > 0.9 * (stats["requests"] + stats["responses"])
    # the committed specs know every API/version these clients send (newer than the specs: opaque)
    assert not [k for k in stats if k.startswith("opaque:")], stats
    for api in ("Produce", "Fetch", "Metadata", "ApiVersions", "FindCoordinator", "JoinGroup", "SyncGroup",
                "OffsetCommit", "OffsetFetch", "InitProducerId", "EndTxn", "CreateTopics", "DeleteTopics"):
        assert stats[f"api:{api}"] > 0, api


def test_tee_recv_chunks_decode(kafka_broker: Any) -> None:
    """Bootstrap connections through a TCP tee: the exact recv() chunks a proxy sees."""
    import subprocess

    from protocol_capture import Tee

    host, port = kafka_broker.bootstrap.split(",")[0].rsplit(":", 1)
    tee = Tee((host, int(port)))
    try:
        subprocess.run(["kcat", "-b", f"127.0.0.1:{tee.port}", "-L", "-X", "client.id=kcat-tee"],
                       check=True, timeout=30, capture_output=True)
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{tee.port}", client_id="kp-tee")
        admin.list_topics()
        admin.close()
    finally:
        tee.close()
    assert tee.sessions
    for log in list(tee.sessions):
        s = KafkaStream()
        for to_broker, chunk, ns in list(log):
            (s.receive_request_data if to_broker else s.receive_response_data)(chunk, ns)
        s.close(0)
        events = list(s.events())
        reqs = [e for e in events if isinstance(e, RequestSeen)]
        resps = [e for e in events if isinstance(e, ResponseSeen)]
        assert reqs and all(r.decode_note is None for r in reqs)
        assert resps and all(r.request is not None and r.decode_note is None for r in resps)
        assert not [e for e in events if isinstance(e, StreamOpaque)]
