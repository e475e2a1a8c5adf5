"""Incidents for real through the proxy: RecordBatchTooLarge (1), idle resets (2), a broker crash.

All use `proxied_kafka` (message.max.bytes=20000, advertising the proxy port).
The broker-kill test stays last in this module: it restarts the shared broker.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

from proxy.faults import Faults
from proxy.running import RunningProxy

pytestmark = pytest.mark.kafka
BIG = 50_000  # > message.max.bytes=20000


def test_incident1_acks0_oversize_broker_closes_and_cause_inferred(proxied_kafka, topic_name, sink):
    def hung_up_on_big(c: dict) -> bool:
        return c["final"] and c["end_by"] == "broker" and (c["last_request_bytes"] or 0) > BIG

    with RunningProxy([proxied_kafka.route], sink=sink) as p:
        # created and led first (the broker advertises the proxy): an acks=0 Produce racing an auto-created
        # topic's leader is refused by a hang-up too, and that would be the wrong connection's end
        proxied_kafka.kafka.create_topic(topic_name)
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, acks=0, linger_ms=0)
        prod.send(topic_name, b"small").get(10)
        prod.send(topic_name, b"x" * BIG)
        prod.flush(10)
        sink.wait_for(lambda s: any(hung_up_on_big(c) for c in s.connections))
        prod.close(timeout=5)
    closed = [c for c in sink.finals() if hung_up_on_big(c)]
    assert closed, sink.finals()
    c = closed[0]
    assert c["end_reason"] in ("broker_fin", "broker_rst")
    assert c["last_api"] == "Produce" and c["last_request_acks"] == 0
    assert c["last_request_topics"] == [topic_name]
    assert c["last_request_bytes"] > BIG
    cause = c["inferred_cause"]
    assert f"acks=0 Produce of {c['last_request_bytes']} bytes to {topic_name}" in cause
    assert "batch larger than message.max.bytes (RecordBatchTooLarge)" in cause
    big = [r for r in sink.requests if r["api_name"] == "Produce" and r["request_bytes"] > BIG]
    assert big and big[0]["status"] == "no_response" and big[0]["acks"] == 0


def test_incident1_pipelined_acks0_blames_the_oversize_produce_not_the_last_one(proxied_kafka, topic_name, sink):
    """librdkafka pipelines acks=0 Produces: small ones to another topic were already on the wire when the broker
    closed on the big one, and the connection's end named "an acks=0 Produce of 328 B to small-topic". The big
    one goes by topic id, as a Java 4.x producer's does: the inferred cause named the uuid."""
    from kafka.record.memory_records import MemoryRecordsBuilder

    import uuid

    from harness.wire import WireClient
    from protocol.apis import METADATA, PRODUCE
    from protocol.deep import encode_request

    def produce(cid: int, topic: str, value_size: int, topic_id: str | None = None) -> bytes:
        """Produce v9 by name, or v13 by id (a Java 4.x producer's)."""
        batch = MemoryRecordsBuilder(2, 0, batch_size=1 << 30)
        batch.append(1_700_000_000_000, key=None, value=b"v" * value_size)
        batch.close()
        named = {"name": topic} if topic_id is None else {"topic_id": topic_id}
        body = {"transactional_id": None, "acks": 0, "timeout_ms": 30000, "topic_data": [
            {**named, "partition_data": [{"index": 0, "records": bytes(batch.buffer())}]}]}
        return encode_request(PRODUCE, 9 if topic_id is None else 13, cid, "pipelined", body)

    small = f"{topic_name}-small"
    with RunningProxy([proxied_kafka.route], sink=sink) as p:
        for t in (topic_name, small):  # through the proxy: the broker advertises its port
            proxied_kafka.kafka.create_topic(t)
        host, port = p.bootstrap.rsplit(":", 1)
        with WireClient(host, int(port)) as c:  # its answer pairs the name with the id, as a client's metadata does
            (meta,) = c.call(METADATA, 12, {"topics": [{"name": topic_name, "topic_id": uuid.UUID(int=0)}],
                                            "allow_auto_topic_creation": False,
                                            "include_topic_authorized_operations": False})["topics"]
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(produce(1, topic_name, BIG, str(meta["topic_id"]))
                         + b"".join(produce(2 + i, small, 100) for i in range(3)))
            assert sock.recv(1) == b""  # the broker hung up
        sink.wait_for(lambda s: any(c["final"] and c["client_ids"] == ["pipelined"] for c in s.connections))
    (c,) = [c for c in sink.finals() if c["client_ids"] == ["pipelined"]]
    assert (c["end_by"], c["last_api"], c["last_request_acks"]) == ("broker", "Produce", 0)
    assert c["last_request_topics"] == [topic_name] and c["last_request_bytes"] > BIG
    assert f"acks=0 Produce of {c['last_request_bytes']} bytes to {topic_name}" in c["inferred_cause"]


def test_a_request_version_kafka_4_removed_is_named_as_the_cause_of_the_close(proxied_kafka, topic_name, sink):
    """kafka-python pinned to api_version=(0, 10, 2) sends Produce v2, which Kafka 4 no longer serves: the broker
    closes every connection, and the end read "likely a SASL listener … or a broker restart"."""
    from kafka.record.memory_records import MemoryRecordsBuilder

    from protocol.apis import PRODUCE
    from protocol.deep import encode_request

    batch = MemoryRecordsBuilder(1, 0, batch_size=1 << 20)  # message format v1, as a 0.10 client writes
    batch.append(1_700_000_000_000, key=None, value=b"old")
    batch.close()
    body = {"acks": 1, "timeout_ms": 30000,
            "topic_data": [{"name": topic_name, "partition_data": [{"index": 0, "records": bytes(batch.buffer())}]}]}
    with RunningProxy([proxied_kafka.route], sink=sink) as p:
        proxied_kafka.kafka.create_topic(topic_name)
        host, port = p.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(encode_request(PRODUCE, 2, 1, "old-client", body))
            assert sock.recv(1) == b""  # a 4.x broker hangs up
        sink.wait_for(lambda s: any(c["final"] and c["client_ids"] == ["old-client"] for c in s.connections))
    (c,) = [c for c in sink.finals() if c["client_ids"] == ["old-client"]]
    assert c["end_by"] == "broker" and c["unanswered"] == 1 and c["removed_in_kafka_4"] == ["Produce v2"]
    assert c["inferred_cause"].startswith("broker closed the connection at a Produce v2 request, a version Kafka 4.0 "
                                          "removed (a 4.x broker serves Produce from v3 on"), c["inferred_cause"]


def test_incident1_acks1_error_recorded_connection_stays(proxied_kafka, topic_name, sink):
    with RunningProxy([proxied_kafka.route], sink=sink) as p:
        proxied_kafka.kafka.create_topic(topic_name)  # led before the first Produce, which has no retries
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, acks=1, linger_ms=0, retries=0)
        prod.send(topic_name, b"small").get(10)
        with pytest.raises(KafkaError):
            prod.send(topic_name, b"x" * BIG).get(10)
        prod.send(topic_name, b"after").get(10)  # same connection still works
        assert not any(c["end_by"] == "broker" for c in sink.finals())
        prod.close(timeout=5)
    rejected = [r for r in sink.requests if r["api_name"] == "Produce" and r["error_count"]]
    assert len(rejected) == 1
    r = rejected[0]
    assert r["status"] == "answered" and r["request_bytes"] > BIG
    assert r["errors"][0]["name"] in ("MESSAGE_TOO_LARGE", "RECORD_LIST_TOO_LARGE")
    assert r["errors"][0]["topic"] == topic_name
    ok_after = [x for x in sink.requests if x["api_name"] == "Produce" and x["conn_id"] == r["conn_id"]
                and x["req_first_ns"] > r["req_first_ns"]]
    assert ok_after and ok_after[0]["error_count"] == 0
    assert all(c["end_by"] != "broker" for c in sink.finals())
    conn = next(c for c in sink.finals() if c["conn_id"] == r["conn_id"])
    assert conn["inferred_cause"].startswith("1 Produce request(s) rejected by the broker (connection stayed open)")
    assert f"acks=1 Produce of {r['request_bytes']} bytes to {topic_name} rejected: " in conn["inferred_cause"]
    assert "(MESSAGE_TOO_LARGE)" in conn["inferred_cause"] or "(RECORD_LIST_TOO_LARGE)" in conn["inferred_cause"]


def _api_versions(corr: int) -> bytes:
    body = struct.pack(">hhih", 18, 0, corr, 4) + b"idle"
    return struct.pack(">i", len(body)) + body


def _read_frame(s: socket.socket) -> bytes:
    head = b""
    while len(head) < 4:
        head += s.recv(4 - len(head))
    n = struct.unpack(">i", head)[0]
    data = b""
    while len(data) < n:
        data += s.recv(n - len(data))
    return data


def test_incident2_idle_reset_fault_recorded_as_not_by_broker(proxied_kafka, sink):
    """A firewall (fault proxy) resets an idle connection; both the fault proxy and a
    recording proxy behind it record a reset after N s idle, not sent by the broker."""
    behind = type(sink)()
    with RunningProxy([proxied_kafka.route], sink=behind) as rec, \
            RunningProxy(upstream=rec.bootstrap, sink=sink, faults=Faults(idle_reset_s=1.0)) as fw:
        c = socket.create_connection(fw.listen_addr)
        c.sendall(_api_versions(1))
        assert struct.unpack(">i", _read_frame(c)[:4])[0] == 1
        c.settimeout(10)
        with pytest.raises(ConnectionResetError):
            c.recv(10)  # blocks until the injected reset
        c.close()
        (front,) = sink.wait_final(1)
        (back,) = behind.wait_final(1)
    assert front["end_reason"] == "fault" and front["end_by"] == "proxy"
    assert front["idle_before_end_ms"] >= 1000
    assert "not sent by the broker" in front["inferred_cause"]
    assert back["end_reason"] == "client_rst"  # what a proxy in front of the broker sees
    assert back["idle_before_end_ms"] >= 1000
    assert back["inferred_cause"].startswith("reset after 1.")
    assert "not sent by the broker" in back["inferred_cause"]
    assert back["requests"] == 1 and back["unanswered"] == 0


def test_garbage_to_broker_other_connections_unaffected(proxied_kafka, topic_name, sink):
    with RunningProxy([proxied_kafka.route], sink=sink) as p:
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, acks=1)
        prod.send(topic_name, b"a").get(10)
        g = socket.create_connection(p.listen_addr)
        g.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 10)
        g.settimeout(10)
        try:
            while g.recv(1000):
                pass
        except ConnectionResetError:
            pass
        g.close()
        prod.send(topic_name, b"b").get(10)
        prod.close()
    garbage = [c for c in sink.finals() if c["opaque"]]
    assert len(garbage) == 1 and garbage[0]["end_by"] == "broker"
    assert "http" in garbage[0]["opaque_reason"] or "garbage" in garbage[0]["opaque_reason"] or garbage[0]["opaque_reason"]


def test_broker_killed_mid_request_and_restarted(proxied_kafka, topic_name, sink):
    kafka = proxied_kafka.kafka
    with RunningProxy([proxied_kafka.route], sink=sink) as p:
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, acks=1)
        prod.send(topic_name, b"before").get(10)
        prod.close()
        stop = threading.Event()

        def consume() -> None:
            cons = KafkaConsumer(topic_name, bootstrap_servers=p.bootstrap, auto_offset_reset="earliest",
                                 fetch_max_wait_ms=2000, reconnect_backoff_max_ms=500)
            while not stop.is_set():
                try:
                    cons.poll(200)
                except Exception:  # noqa: BLE001 — the broker is gone for a while
                    pass
            cons.close()

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        # the consumer long-polls (fetch_max_wait_ms=2000) once two Fetches were answered; kill the broker while
        # the proxy holds one of them unanswered (the consumer thread may not have sent the next one yet)
        sink.wait_for(lambda s: sum(r["api_name"] == "Fetch" for r in s.requests) >= 2)
        deadline = time.monotonic() + 10
        def held() -> bool:  # a request in flight, counted by an observer that has caught up (decoding lingers)
            conns = p.server.conns
            return sum(c.inflight for c in conns) > 0 and not any(c.observer and c.observer.behind for c in conns)

        while not p.call(held):  # proxy state: no event to await
            assert time.monotonic() < deadline, "no request in flight through the proxy"
            time.sleep(0.01)
        kafka.kill()
        sink.wait_for(lambda s: any(c["final"] and c["end_by"] == "broker" and c["unanswered"] for c in s.connections))
        kafka.restart()
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, acks=1)
        prod.send(topic_name, b"after").get(30)  # the same proxy serves again
        prod.close()
        stop.set()
        t.join(15)
    ends = [c for c in sink.finals() if c["end_by"] == "broker"]
    assert ends and all(c["end_reason"] in ("broker_fin", "broker_rst") for c in ends)
    lost = [c for c in ends if c["unanswered"]]
    assert lost and "unanswered" in lost[0]["inferred_cause"]
    unanswered = [r for r in sink.requests if r["status"] == "unanswered"]
    assert unanswered and unanswered[0]["answered"] is False
