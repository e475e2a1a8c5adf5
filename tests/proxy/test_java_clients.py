"""Apache Kafka's own Java clients (4.3.1 and 3.7.2) through the proxy (issue 14; librdkafka's Fetch v16:
test_explicit_kafka.test_confluent_kafka_produce_consume).

What must hold for every one of them: nothing they send is opaque where the
codec has a schema for that API version (the assertion follows
`protocol.apis`, so it tightens as schemas are added), and no recorded topic
is a topic id — every `topics` entry is a real topic name.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.java_clients import JavaClients, JavaTool
from harness.jars import INCIDENT_VERSION
from protocol.apis import APIS
from proxy.running import RunningProxy
from proxy.topics import is_topic_id

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "protocol"))
from protocol_capture import Capture, have_capture_tools, tshark_oracle  # noqa: E402

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def proxied_kafka_37():
    """A 3.7.2 broker advertising the proxy's port (the 3.7.2 tools must talk to their own broker line)."""
    from harness.kafka import LocalKafka, free_port

    port = free_port()
    kafka = LocalKafka(version=INCIDENT_VERSION, broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}"})
    kafka.start()
    try:
        yield SimpleNamespace(kafka=kafka, proxy_port=port, route=f"127.0.0.1:{port}=127.0.0.1:{kafka.port}")
    finally:
        kafka.stop()
        kafka.cleanup()


def opaque_with_schema(sink: Any) -> list[tuple[str, int, str]]:
    """Requests recorded without a summary although a schema describes their API version."""
    return [(r["api_name"], r["api_version"], r["decode_note"]) for r in sink.requests
            if r["decode_note"] and (info := APIS.get(r["api_key"])) is not None and info.decodable(r["api_version"])]


def opaque_apis(sink: Any) -> set[tuple[str, int]]:
    """Every API/version recorded without a summary (printed: the report lists what was still opaque)."""
    return {(r["api_name"], r["api_version"]) for r in sink.requests if r["decode_note"]}


def topic_ids_left(sink: Any) -> list[tuple[str, list[str]]]:
    """Rows whose topics still hold an id after the late resolution analytics applies (learned pairs)."""
    names = sink.topic_names()
    return [(r["api_name"], r["topics"]) for r in sink.requests
            if any(is_topic_id(names.get(t, t)) for t in r["topics"])]


def _run_all(j: JavaClients, *tools) -> None:
    for tool in tools:
        j.run(tool).check()


def _run_until_done(j: JavaClients, tool: JavaTool, sink: Any, ready: Any, late: JavaTool) -> None:
    """Start `tool` (a consumer), wait until the rows show it `ready`, run `late` (the producer it waits for), then
    wait for `tool` to end by itself: it must exit 0 (killed if anything before fails)."""
    proc = j.start(tool)
    err = ""
    try:
        sink.wait_for(ready, timeout=60)
        j.run(late).check()
        _, err = proc.communicate(timeout=tool.timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]


def check_with_tshark(pcap: Path, port: int, min_headers: int, min_topics: int) -> None:
    """The tshark oracle over the Java clients' connections (captured on the proxy's client side).

    tshark 4.0's dissector knows Kafka up to about 3.x: it still dissects every
    request header (api key, version, correlation id, client id), but leaves
    the bodies of the newest versions undecoded; those are printed, and the
    topics are compared wherever it does name them.
    """
    assert have_capture_tools(), "needs root, dumpcap and tshark (apt-get install tshark)"
    rep = tshark_oracle(pcap, port)
    print(f"tshark oracle: {rep.requests} requests, {rep.headers_compared} headers and {rep.topics_compared} "
          f"topic lists compared; bodies tshark leaves undecoded: {sorted(rep.undecoded)}")
    assert rep.mismatches == [], rep.mismatches[:10]
    assert rep.headers_compared >= min_headers and rep.headers_compared >= 0.9 * rep.requests, rep
    assert rep.topics_compared >= min_topics, rep


def test_java_4x_clients_through_the_proxy(proxied_kafka, topic_name, sink, tmp_path):
    pcap = tmp_path / "java4.pcap"
    with Capture(proxied_kafka.proxy_port, pcap), RunningProxy([proxied_kafka.route], sink=sink) as p:
        j = JavaClients(p.bootstrap)
        _run_all(
            j,
            j.topics("--create", "--topic", topic_name, "--partitions", "2", "--replication-factor", "1"),
            j.producer_perf(topic_name, 200, props={"compression.type": "zstd", "enable.idempotence": "true",
                                                    "acks": "all", "client.id": "java-idem"}),
            j.producer_perf(topic_name, 100, props={"client.id": "java-txn"}, transactional_id=f"tx-{topic_name}",
                            transaction_duration_ms=200),
            j.console_consumer(topic_name, group=f"g848-{topic_name}", protocol="consumer", max_messages=50,
                               props={"client.id": "java-848"}),
            j.console_consumer(topic_name, group=f"gcl-{topic_name}", protocol="classic", max_messages=50,
                               props={"client.id": "java-classic"}),
            j.consumer_groups("--describe", "--all-groups"),
            j.topics("--describe", "--topic", topic_name),
        )
        # share consumer: a share group starts at the latest offset, so produce once it is running
        share = j.share_consumer(topic_name, f"gsh-{topic_name}", max_messages=5,
                                 props={"client.id": "java-share"}, timeout_ms=60_000)
        _run_until_done(j, share, sink, lambda s: any(r["api_name"] == "ShareFetch" for r in s.requests),
                        j.producer_perf(topic_name, 20, props={"client.id": "java-late"}))
    apis = Counter((r["api_name"], r["client_id"]) for r in sink.requests)
    print("opaque APIs:", sorted(opaque_apis(sink)),
          "rows named only late:", sum(any(is_topic_id(t) for t in r["topics"]) for r in sink.requests))
    assert apis[("Produce", "java-idem")] and apis[("Produce", "java-txn")]
    assert apis[("ConsumerGroupHeartbeat", "java-848")] and apis[("JoinGroup", "java-classic")]
    assert apis[("ShareGroupHeartbeat", "java-share")] and apis[("ShareFetch", "java-share")]
    produce = [r for r in sink.requests if r["api_name"] == "Produce" and r["client_id"] == "java-idem"]
    assert all(r["api_version"] >= 13 and r["topic_ids"] for r in produce)  # modern: topics by id on the wire
    assert {r["compression"] for r in produce} == {"zstd"} and all(r["producer_id"] >= 0 for r in produce)
    assert any(r["transactional_id"] == f"tx-{topic_name}" for r in sink.requests if r["api_name"] == "EndTxn")
    assert opaque_with_schema(sink) == []
    assert topic_ids_left(sink) == []
    touched = {t for r in sink.requests if r["api_name"] in ("Produce", "Fetch", "ShareFetch") for t in r["topics"]}
    assert touched == {topic_name}
    check_with_tshark(pcap, proxied_kafka.proxy_port, min_headers=100, min_topics=0)


def test_java_37_clients_through_the_proxy(proxied_kafka_37, topic_name, sink, tmp_path):
    pcap = tmp_path / "java37.pcap"
    with Capture(proxied_kafka_37.proxy_port, pcap), RunningProxy([proxied_kafka_37.route], sink=sink) as p:
        j = JavaClients(p.bootstrap, INCIDENT_VERSION)
        _run_all(
            j,
            j.topics("--create", "--topic", topic_name, "--partitions", "1", "--replication-factor", "1"),
            j.producer_perf(topic_name, 100, props={"compression.type": "zstd", "enable.idempotence": "true",
                                                    "acks": "all", "client.id": "java37-prod"}),
            j.console_consumer(topic_name, group=f"g37-{topic_name}", max_messages=100,
                               props={"client.id": "java37-cons"}),
            j.consumer_groups("--describe", "--group", f"g37-{topic_name}"),
        )
    apis = {(r["api_name"], r["client_id"]) for r in sink.requests}
    assert {("Produce", "java37-prod"), ("Fetch", "java37-cons"), ("JoinGroup", "java37-cons")} <= apis
    print("opaque APIs:", sorted(opaque_apis(sink)))
    assert opaque_with_schema(sink) == []
    assert topic_ids_left(sink) == []
    assert {t for r in sink.requests if r["api_name"] in ("Produce", "Fetch") for t in r["topics"]} == {topic_name}
    check_with_tshark(pcap, proxied_kafka_37.proxy_port, min_headers=30, min_topics=0)



def test_records_an_idle_consumer_long_poll_receives_are_filed_under_their_topic(proxied_kafka, topic_name, sink):
    """A Java consumer's Fetch in an incremental session (KIP-227) names only partitions whose position changed.

    So an idle consumer's long poll names no topic, and the records that arrive while it waits come back on it:
    the row names the topic its response carried records of, or the report files them under no topic.
    """
    with RunningProxy([proxied_kafka.route], sink=sink) as p:
        j = JavaClients(p.bootstrap)
        j.run(j.topics("--create", "--topic", topic_name, "--partitions", "1", "--replication-factor", "1")).check()
        cons = j.console_consumer(topic_name, group=f"gidle-{topic_name}", protocol="consumer", max_messages=3,
                                  props={"client.id": "java-idle", "fetch.max.wait.ms": 5000})
        # idle: its long polls name nothing once the session holds the partition
        _run_until_done(j, cons, sink, lambda s: any(r["api_name"] == "Fetch" and r["client_id"] == "java-idle"
                                                     and not r["topics"] and r["fetch_session_epoch"] > 0
                                                     for r in s.requests),
                        j.producer_perf(topic_name, 3, throughput=1, props={"client.id": "java-late"}))
    fetches = [r for r in sink.requests if r["api_name"] == "Fetch" and r["client_id"] == "java-idle"]
    delivered = [r for r in fetches if r["record_bytes"]]
    assert delivered, [(r["topics"], r["record_bytes"]) for r in fetches]
    assert [r["topics"] for r in delivered] == [[topic_name]] * len(delivered)
    # the polls that carried nothing still name nothing: the report's "(incremental fetch …)" row, with no bytes
    assert any(not r["topics"] and not r["record_bytes"] for r in fetches)
