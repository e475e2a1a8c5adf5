"""Kafka-aware faults on a real broker, with real clients: what each injection does to them, and what is recorded.

Every test runs the proxy in front of the session's proxied broker with a
fault rule, drives a real client (kafka-python, confluent-kafka/librdkafka,
Apache Kafka's Java producer, or the harness wire client where exact timing is
the point) and asserts both the client-visible effect and the recorded rows
(`edit` names the injected fault; the rows show what the client did next).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest

from harness.java_clients import JavaClients
from harness.wire import WireClient
from protocol.apis import API_VERSIONS, FIND_COORDINATOR, HEARTBEAT, METADATA, OFFSET_COMMIT, PRODUCE
from proxy.kafka_faults import FaultRules, KafkaFaultLayer
from proxy.running import RunningProxy
from proxy_procs import wait_listening

pytestmark = [pytest.mark.kafka]
KAFKATAP = [sys.executable, "-m", "kafkatap.cli"]


def _proxy(proxied_kafka, sink, *specs: str, control: bool = False):
    rules = FaultRules.from_specs(list(specs), seed=3, control=control)
    layer = KafkaFaultLayer(rules)
    p = _Named(layer, [proxied_kafka.route], sink=sink, interceptors=[layer])
    return p, rules, layer


class _Named(RunningProxy):
    """A RunningProxy whose fault layer names topic ids with the server's topic map (as `kafkatap proxy` does)."""

    def __init__(self, layer: KafkaFaultLayer, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self._layer = layer

    def start(self) -> "_Named":
        super().start()
        self._layer.names = self.server.topics.name
        return self


def _assert_closed(call) -> None:
    """A dropped request ends the connection: end of stream or a reset, not a read that timed out.

    Why not just OSError: a socket timeout is one, so a proxy that swallowed the request and left
    the client hanging would pass as "dropped".
    """
    with pytest.raises((OSError, EOFError, ConnectionError)) as caught:
        call()
    assert not isinstance(caught.value, TimeoutError), "the connection stayed open (read timed out)"


def _consume_all(bootstrap: str, topic: str, expect: int) -> list[bytes]:
    from kafka import KafkaConsumer

    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=8000)
    try:
        out = []
        for m in c:
            out.append(m.value)
            if len(out) >= expect + 5:  # enough to see duplicates, bounded
                break
        return out
    finally:
        c.close()


def _codes(row: dict) -> set[int]:
    return {e["code"] for e in row.get("errors") or ()}


def _after(rows: list[dict], row: dict) -> list[dict]:
    """Requests of the same client sent after `row` (any connection)."""
    return sorted((r for r in rows if r["client_id"] == row["client_id"] and r["req_first_ns"] > row["req_first_ns"]),
                  key=lambda r: r["req_first_ns"])


def _looked_up_after(rows: list[dict], rule: int) -> bool:
    """Has the client that fault #`rule` hit sent a FindCoordinator since?"""
    hit = [r for r in rows if (r.get("edit") or "").startswith(f"fault#{rule} ")]
    return bool(hit) and FIND_COORDINATOR in [r["api_key"] for r in _after(rows, hit[0])]


def test_in_place_not_leader_kafka_python_refreshes_metadata_retries_no_duplicates(proxied_kafka, topic_name, sink) -> None:
    from kafka import KafkaProducer

    p, rules, _ = _proxy(proxied_kafka, sink, f"error=Produce:NOT_LEADER_OR_FOLLOWER,topic={topic_name},nth=2,once")
    with p:
        proxied_kafka.kafka.create_topic(topic_name, partitions=1)
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, client_id="kp-leader", acks=1, linger_ms=0)
        for i in range(6):
            prod.send(topic_name, f"m{i}".encode()).get(timeout=30)  # one Produce each
        prod.close()
        got = _consume_all(p.bootstrap, topic_name, 6)
        sink.wait_for(lambda s: any((r.get("edit") or "").startswith("fault#1") for r in s.requests))
    assert sorted(got) == [f"m{i}".encode() for i in range(6)]  # in place: the broker never saw it, no duplicate
    assert rules.rules[0].injected == 1
    note = f"fault#1 error=NOT_LEADER_OR_FOLLOWER in-place on={topic_name}"  # on=: the topic the rule matched
    faulted = [r for r in sink.requests if (r.get("edit") or "") == note]
    assert len(faulted) == 1 and faulted[0]["api_key"] == PRODUCE and faulted[0]["answered"]
    assert _codes(faulted[0]) == {6}  # the row shows what the client received
    nxt = [r["api_key"] for r in _after(sink.requests, faulted[0])]
    assert METADATA in nxt and PRODUCE in nxt[nxt.index(METADATA):]  # refresh, then the retry


def test_rewrite_makes_a_non_idempotent_retry_duplicate_and_an_idempotent_one_not(proxied_kafka, topic_name, sink) -> None:
    from kafka import KafkaProducer

    p, rules, _ = _proxy(proxied_kafka, sink, "error=Produce:NOT_LEADER_OR_FOLLOWER,rewrite,client-id=kp-.*,once")
    with p:
        proxied_kafka.kafka.create_topic(topic_name, partitions=1)
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, client_id="kp-dup", acks=1, enable_idempotence=False,
                             linger_ms=0)
        prod.send(topic_name, b"once").get(timeout=30)
        prod.close()
        rules.add("error=Produce:NOT_LEADER_OR_FOLLOWER,rewrite,client-id=idem-.*,once")
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, client_id="idem-1", acks="all", enable_idempotence=True,
                             linger_ms=0)
        prod.send(topic_name, b"idempotent").get(timeout=30)
        prod.close()
        got = _consume_all(p.bootstrap, topic_name, 3)
    assert got.count(b"once") == 2  # the broker wrote it, the client heard NOT_LEADER and sent it again
    assert got.count(b"idempotent") == 1  # the retry carried the same sequence: the broker dropped it
    rewritten = [r for r in sink.requests if "rewrite" in (r.get("edit") or "")]
    assert [r["client_id"] for r in rewritten] == ["kp-dup", "idem-1"]
    assert all(_codes(r) == {6} for r in rewritten)


def _topic_with_records(proxied_kafka, bootstrap: str, topic: str, n: int) -> None:
    """A one-partition topic holding `n` records, produced through the proxy by librdkafka."""
    from confluent_kafka import Producer

    proxied_kafka.kafka.create_topic(topic, partitions=1)
    prod = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        prod.produce(topic, f"v{i}".encode())
    assert prod.flush(30) == 0


def test_confluent_consumer_finds_a_new_coordinator_after_not_coordinator(proxied_kafka, topic_name, sink) -> None:
    from confluent_kafka import Consumer

    p, rules, _ = _proxy(proxied_kafka, sink, "error=OffsetCommit:NOT_COORDINATOR,once",
                         "error=Heartbeat:NOT_COORDINATOR,once")
    with p:
        _topic_with_records(proxied_kafka, p.bootstrap, topic_name, 20)
        group = f"g-{uuid.uuid4().hex[:6]}"
        c = Consumer({"bootstrap.servers": p.bootstrap, "group.id": group, "client.id": "rd-coord",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False, "heartbeat.interval.ms": 300,
                      "session.timeout.ms": 6000})
        c.subscribe([topic_name])
        got, commits, deadline = 0, 0, time.monotonic() + 40
        try:
            while time.monotonic() < deadline and (got < 20 or rules.rules[1].injected == 0 or commits < 3):
                m = c.poll(0.3)
                if m is not None and m.error() is None:
                    got += 1
                    try:
                        c.commit(m, asynchronous=False)
                        commits += 1
                    except Exception:  # noqa: BLE001 — the injected NOT_COORDINATOR: the client must recover
                        pass
            # the loop ends when the Heartbeat fault was answered; librdkafka's lookup follows on its own thread
            sink.wait_for(lambda s: _looked_up_after(s.requests, 2))
        finally:
            c.close()
    assert got == 20 and [r.injected for r in rules.rules] == [1, 1]
    rows = sink.requests
    for api, rule in ((OFFSET_COMMIT, 1), (HEARTBEAT, 2)):
        hit = [r for r in rows if (r.get("edit") or "").startswith(f"fault#{rule} ")]
        assert len(hit) == 1 and hit[0]["api_key"] == api and _codes(hit[0]) == {16}
        assert _looked_up_after(rows, rule), "no coordinator lookup after the fault"


def test_librdkafka_reads_an_in_place_fetch_error_and_looks_up_the_leader(proxied_kafka, topic_name, sink) -> None:
    """The built Fetch answer had a null record set, which librdkafka refuses ('Protocol parse failure … invalid
    MessageSetSize -1'): the client never saw the error the recording said it got. Brokers send an empty set."""
    import logging

    from confluent_kafka import Consumer

    class Lines(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    lines = Lines()
    log = logging.getLogger(f"rdkafka-{topic_name}")
    log.addHandler(lines)
    p, rules, _ = _proxy(proxied_kafka, sink, f"error=Fetch:NOT_LEADER_OR_FOLLOWER,topic={topic_name},nth=2,once")
    with p:
        _topic_with_records(proxied_kafka, p.bootstrap, topic_name, 10)
        c = Consumer({"bootstrap.servers": p.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}", "client.id": "rd-fetch",
                      "auto.offset.reset": "latest", "fetch.wait.max.ms": 100}, logger=log)
        c.subscribe([topic_name])
        deadline = time.monotonic() + 40
        try:
            while time.monotonic() < deadline and rules.rules[0].injected == 0:
                c.poll(0.2)
            hit = lambda s: [r for r in s.requests if (r.get("edit") or "").startswith("fault#1 ")]  # noqa: E731
            sink.wait_for(lambda s: bool(hit(s)) and METADATA in [r["api_key"] for r in _after(s.requests, hit(s)[0])])
        finally:
            c.close()
    assert rules.rules[0].injected == 1
    assert not [ln for ln in lines.lines if "parse failure" in ln.lower() or "MessageSetSize" in ln], lines.lines


def test_java_producer_recovers_from_not_leader(proxied_kafka, topic_name, sink) -> None:
    p, rules, _ = _proxy(proxied_kafka, sink, f"error=Produce:NOT_LEADER_OR_FOLLOWER,topic={topic_name},nth=2,once")
    with p:
        proxied_kafka.kafka.create_topic(topic_name, partitions=1)
        j = JavaClients(p.bootstrap, proxied_kafka.kafka.version)
        run = j.run(j.producer_perf(topic_name, 200, 100, throughput=200,
                                    props={"client.id": "java-leader", "linger.ms": 0, "batch.size": 200}))
        run.check()
        got = _consume_all(p.bootstrap, topic_name, 200)
    assert "200 records sent" in run.stdout and len(got) == 200
    hit = [r for r in sink.requests if (r.get("edit") or "").startswith("fault#1")]
    assert len(hit) == 1 and hit[0]["client_id"] == "java-leader" and _codes(hit[0]) == {6}
    assert METADATA in [r["api_key"] for r in _after(sink.requests, hit[0])]


def test_delay_throttle_and_drop_as_the_wire_sees_them(proxied_kafka, sink) -> None:
    p, rules, _ = _proxy(proxied_kafka, sink, "delay=Metadata:400,client-id=slow", "throttle=Metadata:500,client-id=thr",
                         "drop=Metadata,client-id=drop")
    with p:
        host, port = p.bootstrap.rsplit(":", 1)
        with WireClient(host, int(port), client_id="slow") as c:
            t0 = time.monotonic()
            c.call(METADATA, 12, {"topics": [], "allow_auto_topic_creation": False,
                                  "include_topic_authorized_operations": False})
            slow = time.monotonic() - t0
        with WireClient(host, int(port), client_id="thr") as c:
            first = c.call(METADATA, 12, {"topics": [], "allow_auto_topic_creation": False,
                                          "include_topic_authorized_operations": False})
            t0 = time.monotonic()
            c.call(API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
            muted = time.monotonic() - t0
        with WireClient(host, int(port), client_id="drop") as c:
            _assert_closed(lambda: c.call(METADATA, 12, {"topics": [], "allow_auto_topic_creation": False,
                                                         "include_topic_authorized_operations": False}))
        sink.wait_for(lambda s: any((r.get("edit") or "").startswith("fault#3") for r in s.requests)
                      and any((r.get("edit") or "").startswith("fault pause") for r in s.requests))
    assert slow >= 0.4
    assert first["throttle_time_ms"] == 500 and muted >= 0.4  # the broker-like pause after a throttled response
    notes = {r["client_id"]: r["edit"] for r in sink.requests if r.get("edit")}
    assert notes["slow"] == "fault#1 delay=400ms" and notes["drop"] == "fault#3 drop"
    assert [r.injected for r in rules.rules] == [1, 1, 1]


def test_delay_and_throttle_pause_are_recorded_as_the_proxys_time_not_the_brokers(proxied_kafka, topic_name,
                                                                                  sink) -> None:
    """The time a Kafka fault holds a frame is proxy time (resp_sent / req_sent), as with a TCP latency= fault.

    It was recorded as broker latency: the held frames reached the observer stamped with their
    release time, so resp_first ("first byte read from the broker") moved 300 ms later and the
    report blamed the broker for the injected delay.
    """
    from kafka import KafkaProducer

    p, rules, _ = _proxy(proxied_kafka, sink, "delay=Produce:300,client-id=held",
                         "throttle=Metadata:400,client-id=thr")
    with p:
        proxied_kafka.kafka.create_topic(topic_name, partitions=1)
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, client_id="held", linger_ms=0, acks=1)
        for i in range(3):
            prod.send(topic_name, f"v{i}".encode()).get(timeout=30)
        prod.close()
        host, port = p.bootstrap.rsplit(":", 1)
        meta = {"topics": [], "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
        with WireClient(host, int(port), client_id="thr") as c:
            c.call(METADATA, 12, meta)  # throttled: the broker-like pause holds the next request
            c.call(API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        sink.wait_for(lambda s: sum(1 for r in s.requests if (r.get("edit") or "").startswith("fault#1")) == 3
                      and any((r.get("edit") or "").startswith("fault pause") for r in s.requests))

    def us(row: dict, a: str, b: str) -> float:
        return (row[a] - row[b]) / 1000

    held = [r for r in sink.requests if (r.get("edit") or "").startswith("fault#1")]
    for r in held:
        hold = us(r, "resp_sent_ns", "resp_last_ns")
        assert hold >= 300_000  # the delay: the proxy's, on the response
        # the broker's part excludes the hold (a loaded machine may still make it slow, so no fixed bound)
        assert us(r, "resp_first_ns", "req_sent_ns") < hold
        assert us(r, "resp_sent_ns", "req_first_ns") >= 300_000  # what the client waited, all of it
    paused = next(r for r in sink.requests if (r.get("edit") or "").startswith("fault pause"))
    assert paused["client_id"] == "thr" and paused["api_key"] == API_VERSIONS
    pause = us(paused, "req_sent_ns", "req_last_ns")
    assert pause >= 300_000  # held on its way to the broker (400 ms less the RTT)
    assert us(paused, "resp_first_ns", "req_sent_ns") < pause
    assert [r.injected for r in rules.rules] == [3, 1]


# --------------------------------------------------------------------------- runtime control, the real CLI


def _fault_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(KAFKATAP + ["fault", *args], capture_output=True, text=True, timeout=60)


def _cli_proxy(proxied_kafka, status_port: int, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(KAFKATAP + ["proxy", "--route", proxied_kafka.route, "--status-addr", str(status_port),
                                        *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, KAFKATAP_LOG_FORMAT="json"))
    wait_listening(status_port, proc)
    wait_listening(proxied_kafka.proxy_port, proc)
    return proc


def test_fault_add_list_clear_reach_a_live_connection(proxied_kafka) -> None:
    from harness.kafka import free_port

    status = free_port()
    proc = _cli_proxy(proxied_kafka, status, "--fault-control")
    try:
        with WireClient("127.0.0.1", proxied_kafka.proxy_port, client_id="live") as c:  # opened before the rule
            hb = {"group_id": "nobody", "generation_id": 1, "member_id": "m", "group_instance_id": None}
            # on a fresh broker the group coordinator (__consumer_offsets) is created by the first lookup: until it
            # is loaded the broker itself answers NOT_COORDINATOR, so wait for it before telling faults apart
            deadline = time.monotonic() + 60
            while c.call(FIND_COORDINATOR, 3, {"key": "nobody", "key_type": 0})["error_code"] != 0:
                assert time.monotonic() < deadline, "the broker never found a coordinator for the group"
                time.sleep(0.2)  # a broker-side state with no event to await: poll it
            while (own := c.call(HEARTBEAT, 4, hb)["error_code"]) in (14, 15, 16):  # loading / not available / not coordinator
                assert time.monotonic() < deadline, f"the broker's coordinator never loaded (error {own})"
                time.sleep(0.2)
            added = _fault_cli("add", "--addr", str(status), "error=Heartbeat:NOT_COORDINATOR,nth=2")
            assert added.returncode == 0 and added.stdout.strip() == "added fault #1: error=Heartbeat:NOT_COORDINATOR,nth=2"
            codes = [c.call(HEARTBEAT, 4, hb)["error_code"] for _ in range(4)]
            assert [x == 16 for x in codes] == [False, True, False, True]
            listed = json.loads(_fault_cli("list", "--addr", str(status), "--json").stdout)
            assert listed["installed"] and listed["faults"][0] | {"added": 0} == {
                "id": 1, "spec": "error=Heartbeat:NOT_COORDINATOR,nth=2", "api": "Heartbeat", "kind": "error",
                "added": 0, "matched": 4, "injected": 2, "skipped": 0, "active": True, "state": "active",
                "state_changes_in_s": None}
            table = _fault_cli("list", "--addr", str(status)).stdout.splitlines()
            assert table[1].split() == ["1", "active", "4", "2", "0", "error=Heartbeat:NOT_COORDINATOR,nth=2"]
            bad = _fault_cli("add", "--addr", str(status), "error=Heartbeat:NOT_COORDNATOR")
            assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
                "Error: proxy answered 400: bad fault spec 'error=Heartbeat:NOT_COORDNATOR': unknown Kafka error "
                "'NOT_COORDNATOR'; did you mean NOT_COORDINATOR?"]
            tcp = _fault_cli("add", "--addr", str(status), "latency=both:5")
            assert tcp.returncode == 1 and "TCP faults are set when the proxy starts" in tcp.stderr
            # a web page on this host may POST to loopback without a preflight: refused, nothing added
            page = urllib.request.Request(f"http://127.0.0.1:{status}/faults?spec=drop%3DProduce", method="POST",
                                          headers={"Origin": "http://example.invalid"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(page, timeout=10)
            assert refused.value.code == 403 and b"no requests from web pages" in refused.value.read()
            assert len(json.loads(_fault_cli("list", "--addr", str(status), "--json").stdout)["faults"]) == 1
            with urllib.request.urlopen(f"http://127.0.0.1:{status}/healthz", timeout=10) as health:
                assert "/faults" in json.loads(health.read())["routes"]  # where `kafkatap fault` reaches the proxy
            cleared = _fault_cli("clear", "--addr", str(status))
            assert cleared.stdout.strip() == "cleared 1 fault(s)"
            assert all(c.call(HEARTBEAT, 4, hb)["error_code"] != 16 for _ in range(3))
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_a_proxy_without_the_layer_refuses_fault_add(proxied_kafka) -> None:
    from harness.kafka import free_port

    status = free_port()
    proc = _cli_proxy(proxied_kafka, status)
    try:
        out = _fault_cli("add", "--addr", str(status), "error=Heartbeat:NOT_COORDINATOR")
        assert out.returncode == 1
        assert out.stderr.strip().splitlines() == [
            "Error: proxy answered 409: this proxy has no Kafka fault layer: restart it with --fault-control "
            "(or with a Kafka --fault) to add faults at run time"]
        assert "no Kafka fault layer" in _fault_cli("list", "--addr", str(status)).stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{status}/faults", timeout=5) as r:
            assert json.loads(r.read()) == {"installed": False, "faults": []}
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_a_proxy_started_with_a_kafka_fault_keeps_its_layer_after_the_last_clear(proxied_kafka) -> None:
    """`--fault error=…` without --fault-control takes `fault add`; clearing its last rule must not take that back.

    It did: the layer counted as installed only while a rule existed, so after `fault clear` the
    proxy answered `fault add` with "restart it … with a Kafka --fault" (it had one), `fault list`
    said it had no layer, and connections accepted from then on got none.
    """
    from harness.kafka import free_port

    status = free_port()
    meta = {"topics": [], "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
    proc = _cli_proxy(proxied_kafka, status, "--fault", "drop=Metadata,client-id=nobody")
    try:
        assert _fault_cli("clear", "--addr", str(status)).stdout.strip() == "cleared 1 fault(s)"
        assert _fault_cli("list", "--addr", str(status)).stdout.strip() == "no faults"
        with WireClient("127.0.0.1", proxied_kafka.proxy_port, client_id="late") as c:  # accepted after the clear
            c.call(METADATA, 12, meta)
            added = _fault_cli("add", "--addr", str(status), "drop=Metadata,client-id=late")
            assert added.returncode == 0, added.stderr
            assert added.stdout.strip() == "added fault #2: drop=Metadata,client-id=late"
            _assert_closed(lambda: c.call(METADATA, 12, meta))
        listed = json.loads(_fault_cli("list", "--addr", str(status), "--json").stdout)
        assert listed["installed"] and [(r["id"], r["injected"]) for r in listed["faults"]] == [(2, 1)]
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_java_kip848_consumer_recovers_from_not_coordinator_on_its_heartbeat(proxied_kafka, topic_name, sink) -> None:
    """The newest group protocol (KIP-848 ConsumerGroupHeartbeat), answered in the broker's place from the specs.

    The first heartbeat (the join) is refused: the consumer must find the coordinator again before it reads.
    """
    from kafka import KafkaProducer

    p, rules, _ = _proxy(proxied_kafka, sink, "error=ConsumerGroupHeartbeat:NOT_COORDINATOR,once")
    with p:
        proxied_kafka.kafka.create_topic(topic_name, partitions=1)
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, linger_ms=0)
        for i in range(10):
            prod.send(topic_name, f"k{i}".encode())
        prod.flush()
        prod.close()
        j = JavaClients(p.bootstrap, proxied_kafka.kafka.version)
        run = j.run(j.console_consumer(topic_name, group=f"g848-{uuid.uuid4().hex[:6]}", protocol="consumer",
                                       max_messages=10, timeout_ms=30_000, props={"client.id": "java-848"}))
        run.check()
        sink.wait_for(lambda s: any((r.get("edit") or "").startswith("fault#1") for r in s.requests))
    got = [ln for ln in run.stdout.splitlines() if ln.startswith("k")]  # the tool also prints notices
    assert sorted(got) == sorted(f"k{i}" for i in range(10))
    hit = [r for r in sink.requests if (r.get("edit") or "").startswith("fault#1")]
    assert len(hit) == 1 and hit[0]["client_id"] == "java-848" and _codes(hit[0]) == {16}
    assert FIND_COORDINATOR in [r["api_key"] for r in _after(sink.requests, hit[0])]
    assert rules.rules[0].injected == 1


# --------------------------------------------------------------------------- the analysis of a fault that lasts


def _findings_of(rows: list[dict]) -> list:
    """The fault tables and findings `kafkatap analyze` makes of these request rows (Spark local mode)."""
    from analytics.findings import run_rules
    from analytics.session import get_spark
    from analytics.spark_schema import loaded_schema
    from analytics.transforms.common import prepare_requests
    from analytics.transforms.faults import fault_reactions, fault_reactions_by_library
    from recording import schema as rec

    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
                                   "spark.driver.memory": "1g"}, app_name="kafkatap-tests")
    names = [c.name for c in rec.COLUMNS["requests"]]
    df = spark.createDataFrame([tuple(r.get(n) for n in names) for r in rows],
                               loaded_schema("requests", with_partitions=False))
    r = prepare_requests(df)
    tables = {"fault_reactions": fault_reactions(r).toArrow().to_pylist(),
              "fault_reactions_by_library": fault_reactions_by_library(fault_reactions(r)).toArrow().to_pylist()}
    return run_rules(tables)


def test_a_for_burst_that_clients_ride_out_is_reported_recovered(proxied_kafka, topic_name, sink) -> None:
    """`for=` NOT_LEADER on Produce: every retry meets the fault again until the window closes, then succeeds.

    The analysis said "N not recovered" (each faulted retry counted as a fault never recovered from)
    for a burst every client rode out with no record lost; it must say one episode, recovered.
    """
    from confluent_kafka import Producer
    from kafka import KafkaProducer

    p, rules, _ = _proxy(proxied_kafka, sink, control=True)
    with p:
        proxied_kafka.kafka.create_topic(topic_name, partitions=1)
        kp = KafkaProducer(bootstrap_servers=p.bootstrap, client_id="burst-kp", acks=1, linger_ms=0, retries=1000,
                           retry_backoff_ms=100)
        rd = Producer({"bootstrap.servers": p.bootstrap, "client.id": "burst-rd", "linger.ms": 0,
                       "retry.backoff.ms": 100})
        try:  # closed even when an assertion fails: they would reconnect into the next test's proxy on this port
            kp.send(topic_name, b"kp-0").get(timeout=30)  # connected and warm before the fault
            rd.produce(topic_name, b"rd-0")
            assert rd.flush(30) == 0
            rules.add(f"error=Produce:NOT_LEADER_OR_FOLLOWER,topic={topic_name},client-id=burst-.*,for=2s")
            kp_sent = kp.send(topic_name, b"kp-1")
            rd.produce(topic_name, b"rd-1")
            kp_sent.get(timeout=60)  # rides the burst out: retries until the window closes, then succeeds
            assert rd.flush(60) == 0
        finally:
            kp.close(timeout=10)
            del rd  # librdkafka's producer has no close: it ends with its last reference

        def recovered(s, client: str) -> bool:
            rows = [r for r in s.requests if r["client_id"] == client and r["api_key"] == PRODUCE]
            hit = [r["req_first_ns"] for r in rows if (r.get("edit") or "").startswith("fault#1")]
            return len(hit) >= 2 and any(r["req_first_ns"] > max(hit) and not r.get("edit") and r["answered"]
                                         and not r["error_count"] for r in rows)

        sink.wait_for(lambda s: recovered(s, "burst-kp") and recovered(s, "burst-rd"))
        rows = [r for r in sink.requests if r["client_id"] in ("burst-kp", "burst-rd")]
        got = _consume_all(p.bootstrap, topic_name, 4)
    assert sorted(got) == [b"kp-0", b"kp-1", b"rd-0", b"rd-1"]  # in place: nothing lost, nothing twice
    injected = [r for r in rows if (r.get("edit") or "").startswith("fault#1")]
    assert len(injected) == rules.rules[0].injected >= 4  # a burst: both clients met the fault more than once

    f = next(f for f in _findings_of(rows)
             if f.id == "kafka_fault_reactions" and f.evidence["detail"] == "NOT_LEADER_OR_FOLLOWER")
    assert f.severity == "info", f.title
    assert f.title == f"Injected NOT_LEADER_OR_FOLLOWER on Produce ×{len(injected)} in 2 episodes: all recovered"
    libs = f.evidence["libraries"]
    assert sorted(libs) == ["confluent-kafka-python", "kafka-python"]  # librdkafka names its wrapper
    for name, v in libs.items():
        assert (v["episodes"], v["episodes_recovered"], v["faults"], v["recovered"]) == (1, 1, v["faults"], v["faults"])
        assert v["recover_p50_ms"] >= v["after_last_p50_ms"]  # the outage includes the time back after the last
        assert f"{name}: 1/1 episode recovered" in f.summary
    assert "fault_retry_duplicates" not in [x.id for x in _findings_of(rows)]


def test_a_rewritten_produce_the_client_gave_up_on_is_no_duplicate(proxied_kafka, topic_name, sink) -> None:
    """`fault_retry_duplicates` counted any later Produce as a retry: a producer that gives up (retries=0) and
    sends its next batch stored nothing twice, and the finding said it had."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    p, rules, _ = _proxy(proxied_kafka, sink, "error=Produce:NOT_LEADER_OR_FOLLOWER,rewrite,client-id=kp-giveup,once")
    with p:
        proxied_kafka.kafka.create_topic(topic_name, partitions=1)
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, client_id="kp-giveup", acks=1, enable_idempotence=False,
                             linger_ms=0, retries=0)
        with pytest.raises(KafkaError):
            prod.send(topic_name, b"a").get(timeout=30)  # written by the broker, the client heard NOT_LEADER
        prod.send(topic_name, b"next").get(timeout=30)  # a new batch, not a resend
        prod.close()
        sink.wait_for(lambda s: sum(1 for r in s.requests if r["client_id"] == "kp-giveup" and r["api_key"] == PRODUCE
                                    and r["answered"]) >= 2)
        rows = [r for r in sink.requests if r["client_id"] == "kp-giveup"]
        got = _consume_all(p.bootstrap, topic_name, 2)
    assert sorted(got) == [b"a", b"next"]  # each stored once
    assert rules.rules[0].injected == 1
    findings = _findings_of(rows)
    assert "fault_retry_duplicates" not in [f.id for f in findings]
    f = next(f for f in findings if f.id == "kafka_fault_reactions")
    assert f.evidence["episodes"] == 1 and f.evidence["not_recovered"] == 0  # the next batch went through


def test_a_rewrite_over_the_brokers_own_refusal_is_recorded_and_its_resend_is_no_duplicate(proxied_kafka, topic_name,
                                                                                          sink) -> None:
    """max.message.bytes=200: the broker refuses a larger batch (MESSAGE_TOO_LARGE) and writes nothing. The rewrite
    kept only the injected error, and the client's resend of the batch was reported as records stored twice."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    p, rules, _ = _proxy(proxied_kafka, sink,
                         f"error=Produce:NOT_LEADER_OR_FOLLOWER,rewrite,topic={topic_name},client-id=kp-refused,once")
    with p:
        proxied_kafka.kafka.create_topic(topic_name, partitions=1, config={"max.message.bytes": "200"})
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, client_id="kp-refused", acks=1, enable_idempotence=False,
                             linger_ms=0, retries=1, retry_backoff_ms=50)
        with pytest.raises(KafkaError):
            prod.send(topic_name, b"x" * 1000).get(timeout=30)  # NOT_LEADER (injected), resent, refused by the broker
        prod.close()
        sink.wait_for(lambda s: sum(1 for r in s.requests if r["client_id"] == "kp-refused" and r["api_key"] == PRODUCE
                                    and r["answered"]) >= 2)
        rows = [r for r in sink.requests if r["client_id"] == "kp-refused"]
    hit = [r for r in rows if (r.get("edit") or "").startswith("fault#1")]
    assert [r["edit"] for r in hit] == [
        f"fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite on={topic_name} broker-error=MESSAGE_TOO_LARGE"]
    assert _codes(hit[0]) == {6}  # the client heard the injected error only
    findings = _findings_of(rows)
    assert "fault_retry_duplicates" not in [f.id for f in findings]  # the broker wrote nothing: the resend is no copy
    f = next(f for f in findings if f.id == "kafka_fault_reactions")
    assert f.evidence["over_broker_error"] == 1
