"""The real broker harness: both pinned versions serve real clients."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from confluent_kafka import Consumer, Producer
from kafka import KafkaConsumer, KafkaProducer

from harness.kafka import KafkaHarnessError, LocalKafka


pytestmark = pytest.mark.kafka  # every test here starts (or tries to start) a real broker

def test_produce_consume_kafka_python_and_confluent(kafka_any_version: LocalKafka, topic_name: str) -> None:
    kafka = kafka_any_version
    kafka.create_topic(topic_name, partitions=2)

    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    for i in range(10):
        producer.send(topic_name, f"kp-{i}".encode())
    producer.flush(30)
    producer.close()

    cp = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all"})
    for i in range(10):
        cp.produce(topic_name, f"ck-{i}".encode())
    assert cp.flush(30) == 0

    consumer = KafkaConsumer(topic_name, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest",
                             group_id=f"g-{topic_name}", consumer_timeout_ms=15000)
    got = set()
    for msg in consumer:
        got.add(msg.value.decode())
        if len(got) == 20:
            break
    consumer.close()
    assert got == {f"kp-{i}" for i in range(10)} | {f"ck-{i}" for i in range(10)}

    cc = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"c-{topic_name}", "auto.offset.reset": "earliest"})
    cc.subscribe([topic_name])
    seen = 0
    for _ in range(60):
        msg = cc.poll(1.0)
        if msg is not None and msg.error() is None:
            seen += 1
            if seen == 20:
                break
    cc.close()
    assert seen == 20


def test_kcat_lists_the_broker(kafka_broker: LocalKafka) -> None:
    kcat = shutil.which("kcat")
    assert kcat, "kcat must be installed (apt-get install kcat)"
    out = subprocess.run([kcat, "-b", kafka_broker.bootstrap, "-L", "-J"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    listing = json.loads(out.stdout)
    assert [b["name"] for b in listing["brokers"]] == [kafka_broker.bootstrap]


def test_broker_properties_reach_the_broker(tmp_path) -> None:
    with LocalKafka(broker_props={"message.max.bytes": 12345, "num.network.threads": 1}, workdir=tmp_path) as k:
        text = (k.nodes[0].dir / "server.properties").read_text()
        assert "message.max.bytes=12345" in text
        # the broker logs its effective config at start-up
        assert "message.max.bytes = 12345" in k.nodes[0].log_file.read_text()


def test_three_node_cluster_replicates(tmp_path) -> None:
    with LocalKafka(nodes=3, workdir=tmp_path) as k:
        k.create_topic("replicated", partitions=1, replication=3)
        from kafka import KafkaAdminClient
        admin = KafkaAdminClient(bootstrap_servers=k.bootstrap)
        desc = admin.describe_topics(["replicated"])
        admin.close()
        part = desc[0]["partitions"][0]
        assert sorted(part["replica_nodes"]) == [1, 2, 3]
        assert sorted(part["isr_nodes"]) == [1, 2, 3]


def test_port_taken_is_a_one_line_error() -> None:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(KafkaHarnessError, match=f"port 127.0.0.1:{port} is taken"):
            LocalKafka(port=port).start()


@pytest.mark.parametrize("listener", ["CONTROLLER", "SASL_PLAINTEXT"])
def test_every_listener_port_is_checked_before_the_start(tmp_path, listener: str) -> None:
    """The controller's port (drawn free when the broker is made, bound seconds later) and an extra listener's: a
    taken one is named, with the process holding it (this one), and nothing is formatted or launched."""
    import os
    import socket

    from harness.kafka import free_port

    sasl_port = free_port()
    kafka = LocalKafka(workdir=tmp_path, broker_props={"listeners": (
        "PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}," f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}")})
    port = kafka.nodes[0].controller_port if listener == "CONTROLLER" else sasl_port
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(KafkaHarnessError) as err:
            kafka.start()
    assert str(err.value).startswith(f"the {listener} listener's port 127.0.0.1:{port} is taken by pid {os.getpid()} ")
    assert not kafka.nodes[0].dir.exists() and kafka.nodes[0].proc is None


def test_broker_that_exits_reports_its_log(tmp_path) -> None:
    bad = LocalKafka(broker_props={"num.network.threads": "not-a-number"}, workdir=tmp_path, start_timeout=60)
    with pytest.raises(KafkaHarnessError) as err:
        bad.start()
    assert "exited" in str(err.value) or "formatting" in str(err.value)


def test_a_property_storage_formatting_rejects_is_named_not_a_stack_frame(tmp_path) -> None:
    """`kafka up --prop message.max.bytes=abc` said `['\\tat kafka.tools.StorageTool.main(…)']`."""
    bad = LocalKafka(broker_props={"message.max.bytes": "abc"}, workdir=tmp_path, start_timeout=60)
    with pytest.raises(KafkaHarnessError, match="formatting storage failed: .*Invalid value abc for configuration "
                                                "message.max.bytes"):
        bad.start()
