"""Real client sessions recorded through the kafkatap proxy, for the replay tests.

Why a helper module (not fixtures only): the same recorded session feeds
several tests and a manual probe; recording it is the slow part (a broker,
two client libraries, a consumer group join), so tests share one recording.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.running import RunningProxy
from proxy.sinks import FanOut, NullSink, build_sinks

OVERSIZE_BYTES = 60_000  # above the replay target's message.max.bytes, below the origin's default


@dataclass
class RecordedSession:
    """What the tests need to know about a recording they made."""

    path: Path
    topic: str
    group_kp: str
    group_ck: str
    produced_kp: int
    produced_ck: int
    oversize_topic: str
    origin: str


def _run_proxy(upstream: str, listen: str, out: Path, capture: str, proxy_id: str,
               also: Any = None) -> RunningProxy:
    sink = build_sinks(out, proxy_id, capture=capture, flush_interval_s=0.2, compact_interval_s=0).sink
    if also is not None:
        sink = FanOut(sink, also)
    return RunningProxy(upstream=upstream, listen=listen, sink=sink, proxy_id=proxy_id, capture=capture).start()


class RequestWaiter(NullSink):
    """Beside the recorder: wakes a test when a request row it waits for has passed (an event, not a sleep)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self._cv = threading.Condition()

    def request(self, row: dict[str, Any]) -> None:
        with self._cv:
            self.rows.append(row)
            self._cv.notify_all()

    def wait_for(self, what: str, pred: Callable[[dict[str, Any]], bool], timeout: float = 90, since: int = 0) -> None:
        """Until a row from the `since`-th on matches `pred` (`len(self.rows)` before: one that passes after now)."""
        with self._cv:
            assert self._cv.wait_for(lambda: any(pred(r) for r in self.rows[since:]), timeout), \
                f"no {what} within {timeout} s"


def _stop_proxy(p: RunningProxy) -> None:
    p.stop()  # the proxy owns the sink: stopping it flushes and closes the recording


def create_topics_via_proxy(origin: str, listen: str, topics: dict[str, int]) -> None:
    """Create topics through an unrecorded proxy (the broker advertises the proxy's address)."""
    from kafka.admin import KafkaAdminClient, NewTopic

    p = RunningProxy(upstream=origin, listen=listen).start()
    try:
        admin = KafkaAdminClient(bootstrap_servers=p.bootstrap, client_id="setup")
        try:
            admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()])
        finally:
            admin.close()
    finally:
        p.stop()


def record_clients_session(origin: str, listen: str, out: Path, topic: str, *, capture: str = "requests",
                           records: int = 5) -> RecordedSession:
    """Record a kafka-python and a confluent-kafka session through a proxy in front of `origin`.

    `listen` must be the address the origin broker advertises (advertised.listeners),
    so that every connection the clients open after bootstrap goes through the proxy.

    kafka-python: idempotent producer, consumer group (join, commit, leave),
    one acks=0 produce of OVERSIZE_BYTES to its own topic.
    confluent-kafka: idempotent producer and consumer group.
    """
    from confluent_kafka import Consumer, Producer
    from kafka import KafkaConsumer, KafkaProducer

    group_kp, group_ck = f"{topic}-g-kp", f"{topic}-g-ck"
    oversize_topic = f"{topic}-big"
    create_topics_via_proxy(origin, listen, {topic: 3, oversize_topic: 1})
    p = _run_proxy(origin, listen, out, capture, "origin")
    try:
        boot = p.bootstrap
        kp = KafkaProducer(bootstrap_servers=boot, enable_idempotence=True, acks="all", client_id="kp-producer",
                           linger_ms=0)
        for i in range(records):
            kp.send(topic, key=b"k%d" % i, value=b"kafka-python %d" % i, partition=i % 3)
        kp.flush(10)
        kp.close(5)

        kc = KafkaConsumer(topic, bootstrap_servers=boot, group_id=group_kp, client_id="kp-consumer",
                           auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=8000)
        got = 0
        for _ in kc:
            got += 1
            if got >= records:
                break
        kc.commit()
        kc.close()

        big = KafkaProducer(bootstrap_servers=boot, acks=0, client_id="kp-oversize", max_request_size=1 << 20,
                            linger_ms=0)
        big.send(oversize_topic, value=b"x" * OVERSIZE_BYTES, partition=0)
        big.flush(10)
        # not a synchronization: the idle time the replay reproduces before this client closes, within which the
        # replay target (smaller message.max.bytes) must hang up on the batch; a replay stops waiting when it does
        time.sleep(1.5)
        big.close(5)

        cp = Producer({"bootstrap.servers": boot, "enable.idempotence": True, "client.id": "ck-producer",
                       "linger.ms": 0})
        for i in range(records):
            cp.produce(topic, key=b"c%d" % i, value=b"confluent %d" % i, partition=i % 3)
        cp.flush(10)

        cc = Consumer({"bootstrap.servers": boot, "group.id": group_ck, "client.id": "ck-consumer",
                       "auto.offset.reset": "earliest", "enable.auto.commit": False})
        cc.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 20
        while got < 2 * records and time.monotonic() < deadline:
            m = cc.poll(0.5)
            if m is not None and not m.error():
                got += 1
        cc.commit(asynchronous=False)
        cc.close()
        del cp
    finally:
        _stop_proxy(p)
    return RecordedSession(out, topic, group_kp, group_ck, records, records, oversize_topic, origin)


def record_paced_producer(origin: str, listen: str, out: Path, topic: str, *, sends: int = 8, gap_s: float = 0.25,
                          capture: str = "requests", client_id: str = "paced-producer",
                          api_version: tuple[int, ...] | None = None) -> None:
    """A producer that sends one record every `gap_s` (acks=1, each awaited): a known rhythm for --speed.
    `api_version`: kafka-python speaks that Kafka release's versions instead of negotiating (an old client)."""
    from kafka import KafkaProducer

    create_topics_via_proxy(origin, listen, {topic: 1})
    p = _run_proxy(origin, listen, out, capture, "origin")
    try:
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, acks=1, linger_ms=0, client_id=client_id,
                             api_version=api_version)
        for i in range(sends):
            prod.send(topic, value=b"tick %d" % i).get(10)
            time.sleep(gap_s)
        prod.close(5)
    finally:
        _stop_proxy(p)


@dataclass
class JavaSession:
    """A recording of Apache Kafka's own Java clients: a transactional producer, then a KIP-848 consumer."""

    path: Path
    topic: str
    group: str
    records: int
    origin: str
    committed: dict[int, int | None] = field(default_factory=dict)  # the group's offsets on the origin, by partition


def record_java_session(origin: str, listen: str, out: Path, topic: str, *, version: str, records: int = 60,
                        partitions: int = 2) -> JavaSession:
    """Record Kafka `version`'s Java clients through a proxy in front of `origin` (which advertises `listen`).

    java-txn: ProducerPerformance with a transactional id, a transaction every 100 ms, so one producer
    ends several transactions (a Kafka 4.x producer on a 4.x-formatted cluster: transactions v2, the
    broker bumps the epoch at every EndTxn). java-848: ConsoleConsumer with group.protocol=consumer,
    reading every record and committing on close. Before it, java-warmup joins and leaves the same
    group without committing, so that the origin's member epochs run ahead of a fresh target's (a
    replay that sent the recorded epochs would be refused); a replay leaves java-warmup out.
    """
    from harness.java_clients import JavaClients

    group = f"{topic}-g848"
    create_topics_via_proxy(origin, listen, {topic: partitions})
    p = _run_proxy(origin, listen, out, "requests", "origin")
    try:
        j = JavaClients(p.bootstrap, version)
        j.run(j.producer_perf(topic, records, 50, throughput=records * 2, props={"client.id": "java-txn"},
                              transactional_id=f"{topic}-tx", transaction_duration_ms=100)).check()
        j.run(j.console_consumer(topic, group=group, protocol="consumer", max_messages=1,
                                 props={"client.id": "java-warmup", "enable.auto.commit": "false"})).check()
        j.run(j.console_consumer(topic, group=group, protocol="consumer", max_messages=records,
                                 props={"client.id": "java-848", "enable.auto.commit": "true"})).check()
    finally:
        _stop_proxy(p)
    unrecorded = RunningProxy(upstream=origin, listen=listen).start()  # the origin advertises only `listen`
    try:
        committed = committed_offsets(unrecorded.bootstrap, group, topic, partitions)
    finally:
        unrecorded.stop()
    return JavaSession(out, topic, group, records, origin, committed=committed)


def record_share_session(origin: str, listen: str, out: Path, topic: str, group: str, *, records: int = 30) -> None:
    """Record a KIP-932 share group through a proxy in front of `origin` (Kafka 4.x, which advertises `listen`).

    java-share-prod: ProducerPerformance writes `records` records; java-share: ConsoleShareConsumer reads them
    in group `group` (ShareGroupHeartbeat, ShareFetch with topic ids and acknowledgements, ShareAcknowledge).
    Before them, java-share-warmup joins the group and leaves it with nothing read, so that the origin's member
    epochs run ahead of a fresh target's (a replay that sent the recorded epochs would be fenced); a replay
    leaves java-share-warmup out.
    """
    from harness.java_clients import JavaClients

    create_topics_via_proxy(origin, listen, {topic: 1})
    p = _run_proxy(origin, listen, out, "requests", "origin")
    try:
        j = JavaClients(p.bootstrap)
        # it times out with nothing to read: exit status 1 by design, its session is what counts
        j.run(j.share_consumer(topic, group, max_messages=1, timeout_ms=3_000, props={"client.id": "java-share-warmup"}))
        j.run(j.producer_perf(topic, records, 50, throughput=records * 4, props={"client.id": "java-share-prod"})).check()
        j.run(j.share_consumer(topic, group, max_messages=records, timeout_ms=15_000,
                               props={"client.id": "java-share"})).check()
    finally:
        _stop_proxy(p)


STREAMS_INPUT, STREAMS_OUTPUT = "streams-plaintext-input", "streams-wordcount-output"  # fixed by WordCountDemo


def record_streams_session(origin: str, listen: str, out: Path, app: str, work: Path, *, words: int = 50,
                           exactly_once: bool = False) -> None:
    """Record Kafka Streams' WordCountDemo as a KIP-1071 streams-group member (group.protocol=streams, Kafka 4.x).

    It joins group `app` (StreamsGroupHeartbeat), then `words` lines are produced (client id "words") and
    the app counts them and writes its output; SIGTERM closes it (it leaves the group). `work` holds its
    configuration file and state directory. `exactly_once`: a classic-group member (JoinGroup, SyncGroup) with
    processing.guarantee=exactly_once_v2, whose offsets are committed inside its transactions (TxnOffsetCommit,
    v5 on a transactions-v2 broker); the recording ends once one was answered after the count was written. Its
    group's coordinator is loaded first (an OffsetFetch of the group's, client id "warmup"): on a fresh origin the
    app's first join was refused as the coordinator loaded (COORDINATOR_LOAD_IN_PROGRESS, or NOT_COORDINATOR and a
    new connection), which changed the recorded session from run to run.
    """
    from harness.java_clients import JavaClients

    seen = RequestWaiter()
    p = _run_proxy(origin, listen, out, "requests", "origin", also=seen)
    try:
        j = JavaClients(p.bootstrap)
        for t in (STREAMS_INPUT, STREAMS_OUTPUT):
            j.run(j.topics("--create", "--if-not-exists", "--topic", t, "--partitions", "2",
                           "--replication-factor", "1")).check()
        group: dict[str, object] = ({"processing.guarantee": "exactly_once_v2"} if exactly_once
                                    else {"group.protocol": "streams"})
        joined = "SyncGroup" if exactly_once else "StreamsGroupHeartbeat"
        if exactly_once:
            committed_offsets(p.bootstrap, app, STREAMS_INPUT, 1, client_id="warmup")
        proc = j.start(j.word_count_demo(work / "wordcount.properties", {
            "application.id": app, **group, "state.dir": work / "state", "commit.interval.ms": 200}))
        try:
            seen.wait_for(f"answered {joined}", lambda r: r["api_name"] == joined
                          and r["status"] == "answered" and not r["errors"])
            j.run(j.producer_perf(STREAMS_INPUT, words, record_size=20, props={"client.id": "words"})).check()
            seen.wait_for("count written", lambda r: r["api_name"] == "Produce" and STREAMS_OUTPUT in r["topics"]
                          and (r["client_id"] or "").startswith(app))
            if exactly_once:
                seen.wait_for("offsets committed", lambda r: r["api_name"] == "TxnOffsetCommit"
                              and r["status"] == "answered", since=len(seen.rows))
        finally:
            proc.send_signal(signal.SIGTERM)  # the demo's shutdown hook closes the app (it leaves the group)
            try:
                proc.communicate(timeout=60)
            except Exception:  # noqa: BLE001 — a hung JVM is killed; the recording stands
                proc.kill()
                proc.communicate()
    finally:
        _stop_proxy(p)


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int,
                      client_id: str = "kafka-python") -> dict[int, int | None]:
    """A group's committed offsets by partition (kafka-python's OffsetFetch names no member: it joins nothing)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, client_id=client_id)
    try:
        return {p: c.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        c.close()
