"""Replay against real brokers: record real client sessions through the proxy on broker A, replay on B.

B is a fresh broker with message.max.bytes=20000, so the recorded acks=0
produce of 60 kB (accepted by A) makes B hang up, which the replay's own
recording and `analyze --compare` must show.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

from recording.reader import read_recording
from replay_sessions import OVERSIZE_BYTES, RecordedSession, record_clients_session, record_paced_producer
from harness.kafka import LocalKafka, free_port
from replay.cli import replay
from replay.engine import ReplayOptions, run_replay
from replay.load import Filters, load_recording

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@dataclass
class Brokers:
    a: LocalKafka
    a_listen: str  # the proxy address A advertises
    b: LocalKafka

    @property
    def a_upstream(self) -> str:
        return f"127.0.0.1:{self.a.port}"


@pytest.fixture(scope="module")
def brokers() -> Iterator[Brokers]:
    port = free_port()
    a = LocalKafka(broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}"})
    b = LocalKafka(broker_props={"message.max.bytes": 20000})
    a.start()
    try:
        b.start()
        try:
            yield Brokers(a, f"127.0.0.1:{port}", b)
        finally:
            b.stop()
            b.cleanup()
    finally:
        a.stop()
        a.cleanup()


@pytest.fixture(scope="module")
def session(brokers: Brokers, tmp_path_factory: pytest.TempPathFactory) -> RecordedSession:
    out = tmp_path_factory.mktemp("replay") / "rec"
    return record_clients_session(brokers.a_upstream, brokers.a_listen, out, "orders")


@dataclass
class Replayed:
    out: Path
    stdout: str


@pytest.fixture(scope="module")
def replayed(brokers: Brokers, session: RecordedSession) -> Replayed:
    out = session.path.parent / "replay-out"
    res = CliRunner().invoke(replay, [str(session.path), "--target", brokers.b.bootstrap, "--record", str(out), "--yes"])
    assert res.exit_code == 0, res.output
    print(res.output)  # the plan and the summary, visible with -s
    return Replayed(out, res.output)


def _committed(bootstrap: str, group: str, topic: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return sum(c.committed(TopicPartition(topic, p)) or 0 for p in range(3))
    finally:
        c.close()


def test_replay_on_b_produces_joins_and_is_recorded(brokers: Brokers, session: RecordedSession, replayed: Replayed):
    from kafka import KafkaConsumer

    assert "Replay plan" in replayed.stdout and "skipped" in replayed.stdout
    assert "producer_id_unmapped" not in replayed.stdout, replayed.stdout
    # produced records arrive on B (idempotent producers: producer ids rewritten, CRCs valid)
    c = KafkaConsumer(session.topic, bootstrap_servers=brokers.b.bootstrap, auto_offset_reset="earliest",
                      consumer_timeout_ms=5000)
    values = sorted(m.value for m in c)
    c.close()
    expected = sorted([b"kafka-python %d" % i for i in range(5)] + [b"confluent %d" % i for i in range(5)])
    assert values == expected
    # both groups joined on B and committed what the recorded consumers committed
    assert _committed(brokers.b.bootstrap, session.group_kp, session.topic) == 5
    assert _committed(brokers.b.bootstrap, session.group_ck, session.topic) == 10
    req = read_recording(replayed.out, "requests").to_pylist()
    syncs = [r for r in req if r["api_name"] == "SyncGroup"]
    assert {r["client_id"] for r in syncs} == {"kp-consumer", "ck-consumer"}
    assert all(r["answered"] and not r["error_count"] for r in syncs)
    produced = [r for r in req if r["api_name"] == "Produce" and r["acks"] != 0]
    assert produced and all(r["answered"] and not r["error_count"] for r in produced)
    # the oversize acks=0 produce: B hung up, A had not
    ends = {(r["proxy_id"], r["conn_id"]): r for r in read_recording(replayed.out, "connections").to_pylist() if r["final"]}
    big = [r for r in ends.values() if r["last_request_acks"] == 0 and (r["last_request_bytes"] or 0) > OVERSIZE_BYTES]
    assert len(big) == 1 and big[0]["end_by"] == "broker", big
    orig = [r for r in read_recording(session.path, "connections").to_pylist()
            if r["final"] and r["last_request_acks"] == 0 and (r["last_request_bytes"] or 0) > OVERSIZE_BYTES]
    assert len(orig) == 1 and orig[0]["end_by"] == "client"
    assert "the target closed 1 connection(s)" in replayed.stdout
    # every replayed session goes through replay's own proxy, whatever B advertises: no bypass is reported
    assert "around the proxy" not in replayed.stdout, replayed.stdout
    assert not [r for r in req if r["bypass"]]


@pytest.mark.spark
def test_analyze_compare_reports_the_connection_b_closed(session: RecordedSession, replayed: Replayed):
    """The compare half of `kafkatap analyze --compare REC OUT`, on the real recording and its replay.

    Uses the analytics job's own compare plan (analytics.job.compare_plan) so
    that this test checks what replay must provide: the replay recording pairs
    with the original (sequence matching: fresh correlation ids) and the
    connection B hung up on shows as ending differently.
    """
    from analytics.job import compare_plan
    from analytics.load import Filters as AFilters
    from analytics.progress import Progress
    from analytics.session import get_spark

    spark = get_spark(None, None)
    with Progress(spark, enabled=False) as prog:
        mode, plan = compare_plan(spark, str(session.path), str(replayed.out),
                                  (AFilters(None, None, (), (), ()),) * 2, "auto", 10.0, prog)
        ends = [r.asDict() for r in plan["compare_ends"]().collect()]
        summary = [r.asDict() for r in plan["compare_summary"]().collect()]
    assert mode == "sequence"
    differ = [r for r in ends if r["same"] is False]
    assert any(r["client_id"] == "kp-oversize" and r["end_by_a"] == "client" and r["end_by_b"] == "broker"
               for r in differ), ends
    by_api = {r["api_name"]: r for r in summary}
    assert by_api["Produce"]["matched"] >= 5 and by_api["SyncGroup"]["matched"] == 2, summary


def _span(path: Path, client: str) -> float:
    t = read_recording(path, "requests")
    t = t.filter(pc.equal(t["client_id"], client))
    ts = t["req_first_ns"]
    return (pc.max(ts).as_py() - pc.min(ts).as_py()).total_seconds()  # timestamps since format 3


def test_speed_two_halves_the_span(brokers: Brokers, tmp_path: Path):
    rec = tmp_path / "paced"
    record_paced_producer(brokers.a_upstream, brokers.a_listen, rec, "paced", sends=8, gap_s=0.25)
    recorded = _span(rec, "paced-producer")
    assert recorded > 1.5
    ratios = {}
    for speed in (1.0, 2.0):
        out = tmp_path / f"out-{speed}"
        result = run_replay(load_recording(rec, Filters(clients=("paced-producer",))),
                            ReplayOptions(target=brokers.b.bootstrap, speed=speed, record_dir=out))
        assert result.failed == 0 and not result.skipped, result.summary()
        ratios[speed] = _span(out, "paced-producer") / recorded
    print(f"span ratios (replay/recorded): {ratios}")
    assert abs(ratios[1.0] - 1.0) <= 0.10, ratios
    assert abs(ratios[2.0] - 0.5) <= 0.05, ratios  # half the span, within 10 %


def test_real_recording_without_raw_capture_is_refused(brokers: Brokers, tmp_path: Path):
    rec = tmp_path / "nocapture"
    record_paced_producer(brokers.a_upstream, brokers.a_listen, rec, "nocap", sends=1, gap_s=0, capture="none")
    assert read_recording(rec, "requests").num_rows > 0
    res = CliRunner().invoke(replay, [str(rec), "--target", brokers.b.bootstrap, "--yes"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--capture requests" in lines[0], res.output


def test_max_speed_with_topic_map(brokers: Brokers, session: RecordedSession, tmp_path: Path):
    """--speed max and --topic-map: the session lands on the renamed topic (topic ids re-mapped too)."""
    from kafka import KafkaConsumer

    renamed = f"{session.topic}-staging"
    out = tmp_path / "max-out"
    res = CliRunner().invoke(replay, [str(session.path), "--target", brokers.b.bootstrap, "--speed", "max",
                                      "--topic-map", f"{session.topic}={renamed}", "--record", str(out), "--yes"])
    assert res.exit_code == 0, res.output
    assert "speed        max" in res.output and f"{session.topic}→{renamed}(3p)" in res.output
    assert "topic_id_unmapped" not in res.output and "producer_id_unmapped" not in res.output, res.output
    req = read_recording(out, "requests").to_pylist()
    produce = [(r["client_id"], r["status"], [e["name"] for e in r["errors"] or []]) for r in req if r["api_name"] == "Produce"]
    c = KafkaConsumer(renamed, bootstrap_servers=brokers.b.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    assert len(list(c)) == 10, (produce, res.output)
    c.close()
    assert _committed(brokers.b.bootstrap, session.group_ck, renamed) == 10
    fetches = [r for r in req if r["api_name"] == "Fetch" and r["client_id"] == "ck-consumer"]
    assert fetches and all(r["answered"] and not r["error_count"] for r in fetches)
    assert not any(session.topic in (r["topics"] or []) for r in req if r["api_name"] in ("Produce", "Metadata"))


def test_a_topic_the_target_refuses_to_create_is_noted_by_kafkas_error_name(brokers: Brokers, session: RecordedSession,
                                                                           tmp_path: Path):
    """The note was `create_topic_failed:<topic>:17`: a bare code an operator had to look up. It names the error."""
    refused = "no/such/topic"  # '/' is not legal in a Kafka topic name: the target refuses to create it
    res = CliRunner().invoke(replay, [str(session.path), "--target", brokers.b.bootstrap, "--speed", "max",
                                      "--topic-map", f"{session.topic}={refused}", "--yes"])
    assert f"create_topic_failed:{refused}:INVALID_TOPIC_EXCEPTION" in res.output, res.output
