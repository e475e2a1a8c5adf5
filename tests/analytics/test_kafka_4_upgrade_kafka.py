"""The upgrade check for real: through a recording proxy in front of a 3.7.2 broker, a kafka-python producer pinned
to Kafka 0.10.1's request versions and an unpinned one; the broker serves both. The recording names the versions Kafka
4.0 removed (KIP-896) on the pinned client's connections only, and `analyze` lists that client to upgrade first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaProducer

from analytics.job import run_analysis
from harness.jars import INCIDENT_VERSION
from harness.kafka import LocalKafka, free_port
from proxy.running import RunningProxy
from recording.reader import read_recording
from recording.writer import ParquetRecorder

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

TOPIC = "upgrade-orders"


@pytest.fixture(scope="module")
def broker_37() -> Iterator[tuple[LocalKafka, int]]:
    """A 3.7.2 broker advertising the proxy's port (clients stay on the proxy); yields it and that port."""
    port = free_port()
    kafka = LocalKafka(version=INCIDENT_VERSION, broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}"})
    kafka.start()
    try:
        yield kafka, port
    finally:
        kafka.stop()
        kafka.cleanup()


def test_a_client_pinned_to_removed_versions_is_named_before_the_upgrade(broker_37, spark, tmp_path: Path) -> None:
    kafka, port = broker_37
    record = tmp_path / "rec"
    rec = ParquetRecorder(record, "upgrade", flush_interval_s=0.2, fsync=False).start()  # the proxy closes it
    with RunningProxy([f"127.0.0.1:{port}=127.0.0.1:{kafka.port}"], sink=rec, proxy_id="upgrade"):
        kafka.create_topic(TOPIC)
        for client, pin in (("pinned-0.10", (0, 10, 1)), ("unpinned", None)):
            p = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", acks=1, client_id=client, api_version=pin)
            p.send(TOPIC, b"served by 3.7").get(timeout=30)  # a 3.x broker serves both
            p.close(timeout=10)

    finals = [r for r in read_recording(record, "connections").to_pylist() if r["final"] and r["client_ids"]]
    named = {r["client_ids"][0]: r["removed_in_kafka_4"] for r in finals if r["removed_in_kafka_4"]}
    assert set(named) == {"pinned-0.10"} and "Produce v2" in named["pinned-0.10"], finals
    assert not [r for r in finals if r["end_by"] == "broker"], finals  # 3.7 closed none of them

    res = run_analysis([record], tmp_path / "out", spark=spark, progress=False)
    (row,) = res.tables["kafka_4_upgrade"]
    assert row["client_id"] == "pinned-0.10" and "Produce v2" in row["versions"] and row["closed_by_broker"] == 0
    (found,) = [f for f in res.findings if f.id == "kafka_4_removed_versions"]
    assert found.severity == "warning" and "pinned-0.10 sent" in found.summary and "unpinned" not in found.summary
