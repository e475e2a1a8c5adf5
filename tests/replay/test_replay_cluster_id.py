"""The same-cluster guard against a real broker: the recording names the cluster, replay refuses it.

Found by an audit: a recording made through a cluster-mode proxy named no cluster id (the topic
names came from the relayed Metadata responses, so the proxy never asked the broker itself), and
the guard then compared addresses only: a replay against a second listener of the recorded cluster
wrote its Produce requests into that cluster. Now the proxy learns the cluster id of every broker
whose Metadata passes through it, and a recording that names none is refused unless the operator
passes --yes-same-cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.kafka import LocalKafka, free_port, port_is_free
from proxy.cluster import ClusterConfig, ClusterMode
from proxy.running import RunningProxy
from proxy.sinks import build_sinks
from recording.reader import read_recording
from replay.cli import replay
from replay.load import load_recording

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
RECORDS = 200


def _listen_run(nodes: int) -> int:
    """A port p with p .. p + 1 + nodes free: cluster mode's --listen, then broker N on p + 1 + N."""
    for _ in range(200):
        p = free_port()
        if p + nodes + 2 < 65000 and all(port_is_free("127.0.0.1", p + i) for i in range(nodes + 2)):
            return p
    raise RuntimeError("no run of free ports")


def _traffic(bootstrap: str, topic: str) -> None:
    """kafka-python produces RECORDS records to a new topic, then reads them back (no group)."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    prod = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, client_id="cid-producer")
    for i in range(RECORDS):
        prod.send(topic, value=b"v%d" % i)
    prod.flush(20)
    prod.close(5)
    cons = KafkaConsumer(bootstrap_servers=bootstrap, client_id="cid-consumer", consumer_timeout_ms=5000)
    tp = TopicPartition(topic, 0)
    cons.assign([tp])
    cons.seek_to_beginning(tp)
    got = sum(1 for _ in zip(range(RECORDS), cons))
    cons.close()
    assert got == RECORDS


def record_through_cluster_proxy(kafka: LocalKafka, out: Path, topic: str, *, resolve_topics: bool = True) -> Path:
    """Record `_traffic` through a cluster-mode proxy in front of `kafka`, as in the audit.

    The topic exists before the proxy starts (created on the broker itself), so the first relayed
    Metadata answer already names it: the proxy learns the pair from that answer and, without the
    fix, never sends a Metadata request of its own, so it never learned the cluster id.
    """
    kafka.create_topic(topic, 1)
    sink = build_sinks(out, "origin", capture="requests", flush_interval_s=0.2, compact_interval_s=0).sink
    listen = _listen_run(max(n.node_id for n in kafka.nodes))
    mode = ClusterMode(ClusterConfig(bootstrap=("127.0.0.1", kafka.port), listen=("127.0.0.1", listen)))
    with RunningProxy(routes=[f"127.0.0.1:{listen}=127.0.0.1:{kafka.port}"], sink=sink, capture="requests",
                      proxy_id="origin", cluster=mode, resolve_topics=resolve_topics) as p:
        _traffic(p.bootstrap, topic)  # stopping the proxy flushes and closes the recording
    return out


@dataclass
class Recorded:
    kafka: LocalKafka
    named: Path  # recorded through a cluster-mode proxy, as in the audit
    unnamed: Path  # the same traffic with --no-resolve-topics: the proxy learns no cluster id


@pytest.fixture(scope="module")
def recorded(kafka_broker: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    root = tmp_path_factory.mktemp("cluster-id")
    named = record_through_cluster_proxy(kafka_broker, root / "named", "cid-named")
    unnamed = record_through_cluster_proxy(kafka_broker, root / "unnamed", "cid-unnamed", resolve_topics=False)
    return Recorded(kafka_broker, named, unnamed)


@pytest.fixture
def second_listener(kafka_broker: LocalKafka) -> Iterator[str]:
    """Another way into the recorded cluster: an unrecorded proxy, as `kafkatap proxy --upstream` was in the audit."""
    with RunningProxy(upstream=f"127.0.0.1:{kafka_broker.port}") as p:
        yield p.bootstrap


def test_a_cluster_mode_recording_names_the_cluster_id(recorded: Recorded):
    rows = read_recording(recorded.named, "topics").to_pylist()
    assert any(r["cluster_id"] == recorded.kafka.cluster_id and r["broker_addr"] for r in rows), rows
    assert load_recording(recorded.named).cluster_ids == {recorded.kafka.cluster_id}


def test_replay_to_another_listener_of_the_recorded_cluster_is_refused(recorded: Recorded, second_listener: str):
    res = CliRunner().invoke(replay, [str(recorded.named), "--target", second_listener, "--speed", "max", "--yes"])
    assert res.exit_code == 2, res.output
    assert f"it belongs to the recorded cluster {recorded.kafka.cluster_id}" in res.output
    assert "replayed" not in res.output


def test_a_recording_without_a_cluster_id_needs_the_flag(recorded: Recorded, second_listener: str):
    assert load_recording(recorded.unnamed).cluster_ids == set()
    args = [str(recorded.unnamed), "--target", second_listener, "--speed", "max", "--yes"]
    res = CliRunner().invoke(replay, args)
    assert res.exit_code == 2, res.output
    assert "names no cluster id" in res.output and "pass --yes-same-cluster" in res.output
    assert "replayed" not in res.output
    res = CliRunner().invoke(replay, [*args, "--yes-same-cluster"])
    assert res.exit_code == 0, res.output
    assert "replayed" in res.output and "cluster      not checked (--yes-same-cluster)" in res.output
