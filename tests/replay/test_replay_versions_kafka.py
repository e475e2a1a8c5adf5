"""Replay as an upgrade check: a client speaking versions Kafka 4 no longer serves (KIP-896), recorded on a 3.7.2
broker and replayed onto the session's 4.3.1 one (real brokers on both sides).

The set-up reads the target's ApiVersions and names the recorded versions it would refuse, with the clients that
sent them; the target then closes the replayed session at the first of them, as it would the client's own.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from harness.jars import INCIDENT_VERSION
from harness.kafka import LocalKafka, free_port
from protocol.apis import API_NAMES
from replay.engine import ReplayOptions, run_replay
from replay.load import load_recording
from replay.versions import MISSING, RETIRED, TOO_NEW
from replay_sessions import record_paced_producer

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CLIENT = "legacy-producer"
KAFKA_0_10 = (0, 10, 1)  # kafka-python sends Produce v2 and Metadata v2, as a Kafka 0.10.1 client does


@pytest.fixture(scope="module")
def legacy_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("legacy") / "rec"
    port = free_port()
    origin = LocalKafka(version=INCIDENT_VERSION, broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}"})
    origin.start()
    try:
        record_paced_producer(f"127.0.0.1:{origin.port}", f"127.0.0.1:{port}", out, "legacy-produce-v2", sends=4, gap_s=0,
                              client_id=CLIENT, api_version=KAFKA_0_10)
    finally:
        origin.stop()
        origin.cleanup()
    return out


def test_the_versions_kafka_4_no_longer_serves_are_named_with_their_clients(legacy_recording: Path,
                                                                          kafka_broker: LocalKafka):
    rec = load_recording(legacy_recording)
    recorded = Counter((r.frame.api_key, r.frame.api_version) for c in rec.connections for r in c.requests
                       if c.client_id == CLIENT)
    assert recorded[(0, 2)] == 4, recorded  # Produce v2, which 4.x no longer serves
    result = run_replay(rec, ReplayOptions(target=kafka_broker.bootstrap, speed=None))
    print(result.summary())
    retired = {n: k for n, k in result.notes.items() if n.startswith(RETIRED)}
    produce = [n for n in retired if n.startswith(f"{RETIRED}Produce v2 (the target serves v3–")]
    assert len(produce) == 1 and f"clients: {CLIENT})" in produce[0], result.summary()
    assert retired[produce[0]] == recorded[(0, 2)]
    # every note names a version the recording holds, and no other kind is claimed
    for note in retired:
        api, version = note[len(RETIRED):].split(" (")[0].rsplit(" v", 1)
        assert recorded[(next(k for k, v in API_NAMES.items() if v == api), int(version))], note
    assert not [n for n in result.notes if n.startswith((TOO_NEW, MISSING))], result.summary()
    assert result.closed_by_target, result.summary()  # as it would have closed the client's own connection
    assert "KIP-896" in result.summary()
