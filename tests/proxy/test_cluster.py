"""Cluster mode on a real 3-node KRaft cluster with default advertised listeners (issue 15).

The brokers advertise their own addresses, so without rewriting every client
would leave the proxy after its first Metadata response. Each test proves the
opposite with what was *recorded*: every record produced shows up in a
recorded Produce request, consumers' Fetch requests reach every broker's
listener, and no client ever holds a real broker address.

The full path runs on 4.3.1; a shorter one on 3.7.2 (`test_cluster_37`).
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from cluster_helpers import PROXY, cluster_proxy, free_port_run, kcat_brokers, proxy_ports, three_nodes
from harness.java_clients import JavaClients
from harness.kafka import LocalKafka, partition_states
from harness.wire import WireClient
from protocol.apis import METADATA

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalKafka]:
    yield from three_nodes()


def _records_produced(sink, topic: str) -> int:
    return sum(r["records"] or 0 for r in sink.requests if r["api_name"] == "Produce" and topic in r["topics"]
               and r["status"] == "answered")


def _broker_addrs(kafka: LocalKafka) -> set[str]:
    return {f"{kafka.host}:{n.port}" for n in kafka.nodes}


def test_kcat_lists_only_proxy_addresses_and_every_broker_gets_a_listener(cluster, sink) -> None:
    with cluster_proxy(cluster, sink) as p:
        listen = p.listen_addr[1]
        brokers = kcat_brokers(p.bootstrap)
        assert sorted(b[0] for b in brokers) == [1, 2, 3]
        assert {(h, port) for _, h, port in brokers} == {("127.0.0.1", listen + 1 + n) for n in (1, 2, 3)}
        assert {port for _, _, port in brokers} <= proxy_ports(p)
        assert not {f"{h}:{port}" for _, h, port in brokers} & _broker_addrs(cluster)
        sink.wait_for(lambda s: any(r["api_name"] == "Metadata" and r["edit"] for r in s.requests))
    meta = [r for r in sink.requests if r["api_name"] == "Metadata"]
    assert all(r["edit"] == "rewrite addresses 3" for r in meta if r["status"] == "answered")
    # the `stats` the /metrics page reads
    assert p.cluster.stats.rewritten_responses >= 1 and p.cluster.stats.rewrite_failures == 0


def test_brokers_first_seen_in_a_response_get_their_listener_before_it_is_forwarded(cluster, sink, topic_name) -> None:
    """No discovery at start (as with a SASL listener): the first Metadata answer binds every broker's listener."""
    from kafka import KafkaProducer

    cluster.create_topic(topic_name, partitions=3, replication=1)
    with cluster_proxy(cluster, sink, discovery_timeout=1e-9) as p:
        assert len(p.listen_addrs) == 1 and p.cluster.stats.brokers_seen == 0
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, acks="all")
        for i in range(30):
            prod.send(topic_name, b"v%d" % i, partition=i % 3)
        prod.flush(30)
        prod.close()
        assert p.cluster.stats.brokers_seen == 3 and len(p.listen_addrs) == 4
        sink.wait_for(lambda s: _records_produced(s, topic_name) >= 30)
    assert _records_produced(sink, topic_name) == 30


def _hold(port: int) -> socket.socket:
    """Another program on `port` (listening, without SO_REUSEPORT): no proxy can bind it."""
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen(1)
    return s


def test_a_broker_port_taken_at_start_stops_the_proxy_with_the_fix(cluster, tmp_path) -> None:
    """Else broker 2's clients would be told its own address and go around the proxy, unrecorded."""
    listen = free_port_run(5)
    node = cluster.nodes[0]
    with _hold(listen + 1 + 2):
        out = subprocess.run([*PROXY, "--cluster", f"{cluster.host}:{node.port}", "--listen", f"127.0.0.1:{listen}",
                              "--workers", "1", "--record", str(tmp_path / "rec")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    errors = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{") and '"error"' in line]
    said = " ".join(str(e.get("error")) for e in errors if e.get("event") == "cannot listen")
    assert f"broker 2 ({cluster.host}:{cluster.nodes[1].port})" in said, out.stderr
    assert f"127.0.0.1:{listen + 3}" in said and "--broker-port 2=PORT" in said, said
    # with workers, each meets the same cause: said once, and the parent says the proxy did not start (it said
    # "worker did not start … exit: still starting" of workers that had exited 2)
    with _hold(listen + 1 + 2):
        out = subprocess.run([*PROXY, "--cluster", f"{cluster.host}:{node.port}", "--listen", f"127.0.0.1:{listen}",
                              "--workers", "2", "--record", str(tmp_path / "rec2")], capture_output=True, text=True,
                             timeout=120)
    assert out.returncode == 2, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    errors = [e["event"] for e in lines if e.get("level") == "error"]
    assert errors[-1] == "the proxy did not start" and len(errors) == 3, out.stderr
    assert {errors[0], errors[1]} == {"cannot listen", "cannot listen for a broker: its address is left as it is, so its "
                                      "clients would bypass the proxy"}, out.stderr
    assert "still starting" not in out.stderr


def test_a_broker_without_a_listener_later_is_counted_as_a_bypass(cluster, sink) -> None:
    """No discovery at start, and broker 3's port taken: its address goes out as it is, and that is loud."""
    with cluster_proxy(cluster, sink, discovery_timeout=1e-9) as p:
        with _hold(p.listen_addr[1] + 1 + 3):
            brokers = kcat_brokers(p.bootstrap)
            real = f"{cluster.host}:{cluster.nodes[2].port}"
            assert (3, cluster.host, cluster.nodes[2].port) in brokers  # what the bypass looks like from a client
            sink.wait_for(lambda s: any(r.get("bypass") for r in s.requests))
            assert p.cluster.stats.brokers_unlistened == 1 and p.cluster.stats.brokers_seen == 3
    bypassed = {a for r in sink.requests for a in (r.get("bypass") or [])}
    assert bypassed == {real}, bypassed


def test_metadata_through_the_proxy_differs_from_the_broker_only_in_the_ports(cluster, sink) -> None:
    """Byte for byte on a real response: same host length, so only the four port bytes per broker may differ."""
    node = cluster.nodes[0]
    with cluster_proxy(cluster, sink) as p:
        for version in (1, 9, 12):
            body = {"topics": [], "allow_auto_topic_creation": False} if version >= 4 else {"topics": []}
            with WireClient(cluster.host, node.port) as direct, WireClient(*p.listen_addr) as proxied:
                # a KRaft broker names a random live broker as controller_id in each answer: ask until both agree
                for _ in range(50):
                    ea, eb = direct.exchange(METADATA, version, body), proxied.exchange(METADATA, version, body)
                    if ea.body["controller_id"] == eb.body["controller_id"]:
                        break
                a, b = ea.response, eb.response
            assert len(a) == len(b)
            allowed: set[int] = set()
            for n in cluster.nodes:
                needle = struct.pack(">i", n.port)
                i = a.find(needle)
                while i >= 0:
                    allowed.update(range(i, i + 4))
                    i = a.find(needle, i + 1)
            diff = {i for i, (x, y) in enumerate(zip(a, b)) if x != y}
            assert diff and diff <= allowed, (version, sorted(diff - allowed))


def test_tls_hello_in_cluster_mode_closes_the_connection_and_the_give_up_is_recorded(cluster, sink) -> None:
    """TLS where Kafka framing should be, on an editing connection: the proxy could not rewrite the addresses
    inside, so it closes the connection rather than relay it (the chunk already written reaches the broker as it
    was), and the connection row says why editing stopped."""
    hello = bytes.fromhex("160301020001") + bytes(range(256)) * 2  # a ClientHello's first bytes: size 0x16030102
    with cluster_proxy(cluster, sink) as p:
        with socket.create_connection(p.listen_addr, timeout=30) as s:
            s.sendall(hello)
            while s.recv(65536):  # the proxy closes: EOF, not a hang
                pass
        end = sink.wait_for(lambda k: [c for c in k.connections if c["final"]], timeout=30)[0]
    assert end["edit_stopped"] and "TLS ClientHello" in end["edit_stopped"], end["edit_stopped"]
    assert end["end_reason"] == "edit_stopped" and end["end_by"] == "proxy", end
    assert end["bytes_from_client"] == len(hello) and end["edit_oversize_frames"] is None
    assert end["mode"] == "cluster"


def test_python_clients_produce_consume_in_a_group_and_admin_only_through_the_proxy(cluster, sink, topic_name) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    import confluent_kafka as ck
    from confluent_kafka.admin import AdminClient

    with cluster_proxy(cluster, sink) as p:
        admin = KafkaAdminClient(bootstrap_servers=p.bootstrap, client_id="kp-admin")
        try:
            admin.create_topics([NewTopic(topic_name, 6, 3)])
            cluster.wait_for_topic(topic_name, 6, 3)
            described = admin.describe_cluster()
            assert {b["port"] for b in described["brokers"]} <= proxy_ports(p)
        finally:
            admin.close()
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, acks="all", linger_ms=5)
        for i in range(300):
            prod.send(topic_name, key=str(i % 6).encode(), value=b"kp-%d" % i)
        prod.flush(30)
        prod.close()
        cp = ck.Producer({"bootstrap.servers": p.bootstrap, "acks": "all", "linger.ms": 5})
        for i in range(300):
            cp.produce(topic_name, key=str(i).encode(), value=b"ck-%d" % i)
        assert cp.flush(30) == 0
        # librdkafka consumer in a group
        cons = ck.Consumer({"bootstrap.servers": p.bootstrap, "group.id": f"ck-{topic_name}",
                            "auto.offset.reset": "earliest", "enable.auto.commit": True})
        cons.subscribe([topic_name])
        got = 0
        deadline = time.monotonic() + 60
        while got < 600 and time.monotonic() < deadline:
            m = cons.poll(1.0)
            if m is not None and m.error() is None:
                got += 1
        cons.commit(asynchronous=False)
        cons.close()
        assert got == 600
        # kafka-python consumer in a group
        kc = KafkaConsumer(topic_name, bootstrap_servers=p.bootstrap, group_id=f"kp-{topic_name}",
                           auto_offset_reset="earliest", consumer_timeout_ms=15000)
        seen = sum(1 for _ in zip(range(600), kc))
        kc.close()
        assert seen == 600
        ck_admin = AdminClient({"bootstrap.servers": p.bootstrap})
        groups = ck_admin.list_consumer_groups().result(30)
        assert f"ck-{topic_name}" in {g.group_id for g in groups.valid}
        desc = ck_admin.describe_consumer_groups([f"ck-{topic_name}"])[f"ck-{topic_name}"].result(30)
        assert desc.coordinator.port in proxy_ports(p)
        sink.wait_for(lambda s: _records_produced(s, topic_name) >= 600)
    # every record went through the proxy: no producer ever reached a broker directly
    assert _records_produced(sink, topic_name) == 600
    by_broker = Counter(r["broker_addr"] for r in sink.requests if r["api_name"] == "Fetch")
    assert set(by_broker) == _broker_addrs(cluster)  # six partitions: every broker leads some
    rewritten = {r["api_name"] for r in sink.requests if r["edit"]}
    assert {"Metadata", "FindCoordinator"} <= rewritten
    assert all(r["edit"].startswith("rewrite addresses") for r in sink.requests if r["edit"])


def test_java_clients_produce_consume_and_admin_through_the_proxy(cluster, sink, topic_name) -> None:
    with cluster_proxy(cluster, sink) as p:
        j = JavaClients(p.bootstrap, cluster.version)
        j.run(j.topics("--create", "--topic", topic_name, "--partitions", "3", "--replication-factor", "3")).check()
        cluster.wait_for_topic(topic_name, 3, 3)
        j.run(j.producer_perf(topic_name, records=500, props={"acks": "all"})).check()
        out = j.run(j.console_consumer(topic_name, group=f"j-{topic_name}", max_messages=500,
                                       protocol="consumer")).check()
        assert "Processed a total of 500 messages" in out.stderr + out.stdout
        desc = j.run(j.consumer_groups("--describe", "--group", f"j-{topic_name}")).check()
        assert topic_name in desc.stdout
        sink.wait_for(lambda s: _records_produced(s, topic_name) >= 500)
    assert _records_produced(sink, topic_name) == 500
    assert {r["broker_addr"] for r in sink.requests if r["api_name"] == "Produce"} <= _broker_addrs(cluster)
    leaders = {f"{cluster.host}:{n.port}" for n in cluster.nodes
               if n.node_id in {leader for leader, _ in partition_states(cluster.host, cluster.port, topic_name)[1]}}
    assert leaders <= {r["broker_addr"] for r in sink.requests if r["api_name"] == "Fetch"}
    apis = {r["api_name"] for r in sink.requests}
    assert {"ConsumerGroupHeartbeat", "CreateTopics", "DescribeGroups"} & apis
    # what the client was told: only proxy addresses in every coordinator lookup
    found = [r for r in sink.requests if r["api_name"] == "FindCoordinator" and r["status"] == "answered"
             and not r["error_count"]]  # a coordinator not available yet comes with node -1 and no address
    assert found and all(r["edit"] == "rewrite addresses 1" for r in found)


def _leader(kafka: LocalKafka, topic: str, port: int) -> int:
    _, parts = partition_states(kafka.host, port, topic)
    return parts[0][0]


def test_broker_killed_and_restarted_leadership_moves_traffic_keeps_flowing(cluster, sink, topic_name) -> None:
    from kafka import KafkaProducer

    cluster.create_topic(topic_name, partitions=1, replication=3)
    with cluster_proxy(cluster, sink) as p:
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, acks="all", retries=20, retry_backoff_ms=200,
                             request_timeout_ms=10000, max_block_ms=30000)
        for i in range(50):
            prod.send(topic_name, b"before-%d" % i)
        prod.flush(30)
        leader = _leader(cluster, topic_name, cluster.nodes[0].port)
        idx = next(i for i, n in enumerate(cluster.nodes) if n.node_id == leader)
        cluster.kill(idx)
        other = next(n for n in cluster.nodes if n.node_id != leader)
        deadline = time.monotonic() + 60
        while _leader(cluster, topic_name, other.port) in (leader, -1):
            assert time.monotonic() < deadline, "leadership did not move"
            time.sleep(0.2)  # polling the brokers' own view: there is no event to await from outside
        new_leader = _leader(cluster, topic_name, other.port)
        for i in range(50):
            prod.send(topic_name, b"during-%d" % i)
        prod.flush(60)
        cluster.restart(idx)
        for i in range(50):
            prod.send(topic_name, b"after-%d" % i)
        prod.flush(60)
        prod.close()
        # the restarted broker is back under its own listener: the proxy lists all three, nothing else
        brokers = kcat_brokers(p.bootstrap)
        assert len(brokers) == 3 and {port for _, _, port in brokers} <= proxy_ports(p)
        sink.wait_for(lambda s: _records_produced(s, topic_name) >= 150)
    produced = [r for r in sink.requests if r["api_name"] == "Produce" and topic_name in r["topics"]
                and r["status"] == "answered"]
    assert sum(r["records"] for r in produced if not r["error_count"]) == 150
    new_addr = f"{cluster.host}:{next(n.port for n in cluster.nodes if n.node_id == new_leader)}"
    assert any(r["broker_addr"] == new_addr for r in produced)


@pytest.fixture(scope="module")
def cluster_37() -> Iterator[LocalKafka]:
    from harness.jars import INCIDENT_VERSION

    yield from three_nodes(version=INCIDENT_VERSION)


def test_cluster_37(cluster_37, sink) -> None:
    """The shorter path on 3.7.2: kcat, kafka-python in a group, the 3.7 Java producer."""
    from kafka import KafkaConsumer, KafkaProducer

    topic = f"t37-{uuid.uuid4().hex[:8]}"
    cluster_37.create_topic(topic, partitions=3, replication=3)
    with cluster_proxy(cluster_37, sink) as p:
        brokers = kcat_brokers(p.bootstrap)
        assert {port for _, _, port in brokers} <= proxy_ports(p) and len(brokers) == 3
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, acks="all")
        for i in range(90):
            prod.send(topic, key=str(i % 3).encode(), value=b"v%d" % i)
        prod.flush(30)
        prod.close()
        j = JavaClients(p.bootstrap, cluster_37.version)
        j.run(j.producer_perf(topic, records=60, props={"acks": "all"})).check()
        kc = KafkaConsumer(topic, bootstrap_servers=p.bootstrap, group_id=f"g-{topic}",
                           auto_offset_reset="earliest", consumer_timeout_ms=15000)
        seen = sum(1 for _ in zip(range(150), kc))
        kc.close()
        assert seen == 150
        sink.wait_for(lambda s: _records_produced(s, topic) >= 150)
    assert _records_produced(sink, topic) == 150
    assert {r["broker_addr"] for r in sink.requests if r["api_name"] == "Fetch"} == _broker_addrs(cluster_37)
