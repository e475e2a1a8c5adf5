"""The same-cluster guard against a real broker: the recording names the cluster, replay refuses it.

Found by an audit: a recording made through a cluster-mode proxy named no cluster id (the topic
names came from the relayed Metadata responses, so the proxy never asked the broker itself), and
the guard then compared addresses only: a replay against a second listener of the recorded cluster
wrote its Produce requests into that cluster. Now the proxy learns the cluster id from the Metadata
and DescribeCluster answers it relays (its own query is only the fallback), so a recording made on a
SASL listener, where that query is refused before authentication, or with --no-resolve-topics names
its cluster too; a recording that names none (no answer carried one) is refused unless the operator
passes --yes-same-cluster.

A SASL target: with --sasl-plain, replay's own two connections (the guard's query and the set-up)
authenticate before their first request. They did not, so a SASL-only listener hung up on them: the
guard said the cluster id "could not be read" and the set-up ended in click's bare "Aborted!".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.kafka import LocalKafka, free_port, port_is_free
from harness.wire import WireClient
from protocol.apis import API_VERSIONS, PRODUCE
from proxy.cluster import ClusterConfig, ClusterMode
from proxy.running import RunningProxy
from proxy.sinks import build_sinks
from recording.reader import read_recording
from replay.cli import read_cluster_id, replay, target_cluster_id
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


def record_without_metadata(kafka: LocalKafka, out: Path, topic: str) -> Path:
    """A client that never asks for metadata (it knows its broker and its topic): no answer carries a cluster id.

    ApiVersions, then Produce v9 (the topic by name) through an explicit-mode proxy, topic resolution on:
    nothing names a topic the proxy would have to look up, so it asks the broker nothing either.
    """
    from kafka.record.memory_records import MemoryRecordsBuilder

    kafka.create_topic(topic, 1)
    sink = build_sinks(out, "origin", capture="requests", flush_interval_s=0.2, compact_interval_s=0).sink
    with RunningProxy(upstream=f"127.0.0.1:{kafka.port}", sink=sink, capture="requests", proxy_id="origin") as p:
        host, port = p.bootstrap.rsplit(":", 1)
        with WireClient(host, int(port), client_id="cid-no-metadata") as c:
            c.call(API_VERSIONS, 3, {"client_software_name": "wire", "client_software_version": "1"})
            for i in range(10):
                batch = MemoryRecordsBuilder(2, 0, batch_size=1 << 20)
                batch.append(1_700_000_000_000 + i, key=None, value=b"v%d" % i)
                batch.close()
                body = c.call(PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 10000, "topic_data": [
                    {"name": topic, "partition_data": [{"index": 0, "records": bytes(batch.buffer())}]}]})
                assert body["responses"][0]["partition_responses"][0]["error_code"] == 0, body
    return out


@dataclass
class Recorded:
    kafka: LocalKafka
    named: Path  # recorded through a cluster-mode proxy, as in the audit
    unresolved: Path  # the same traffic with --no-resolve-topics: only the relayed answers can name the cluster
    unnamed: Path  # a client that never asks for metadata: no answer carries a cluster id


@pytest.fixture(scope="module")
def recorded(kafka_broker: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    root = tmp_path_factory.mktemp("cluster-id")
    named = record_through_cluster_proxy(kafka_broker, root / "named", "cid-named")
    unresolved = record_through_cluster_proxy(kafka_broker, root / "unresolved", "cid-unresolved", resolve_topics=False)
    unnamed = record_without_metadata(kafka_broker, root / "unnamed", "cid-unnamed")
    return Recorded(kafka_broker, named, unresolved, unnamed)


@pytest.fixture
def second_listener(kafka_broker: LocalKafka) -> Iterator[str]:
    """Another way into the recorded cluster: an unrecorded proxy, as `kafkatap proxy --upstream` was in the audit."""
    with RunningProxy(upstream=f"127.0.0.1:{kafka_broker.port}") as p:
        yield p.bootstrap


def test_a_cluster_mode_recording_names_the_cluster_id(recorded: Recorded):
    rows = read_recording(recorded.named, "topics").to_pylist()
    assert any(r["cluster_id"] == recorded.kafka.cluster_id and r["broker_addr"] for r in rows), rows
    assert load_recording(recorded.named).cluster_ids == {recorded.kafka.cluster_id}


def test_without_topic_resolution_the_relayed_answers_name_the_cluster(recorded: Recorded):
    """--no-resolve-topics: the proxy asks the broker nothing, yet the clients' Metadata answers carried the id."""
    rows = read_recording(recorded.unresolved, "topics").to_pylist()
    assert [(r["broker_addr"], r["cluster_id"]) for r in rows if r["topic_id"] is None] == \
        [(f"127.0.0.1:{recorded.kafka.port}", recorded.kafka.cluster_id)], rows
    assert load_recording(recorded.unresolved).cluster_ids == {recorded.kafka.cluster_id}


def test_replay_to_another_listener_of_the_recorded_cluster_is_refused(recorded: Recorded, second_listener: str):
    res = CliRunner().invoke(replay, [str(recorded.named), "--target", second_listener, "--speed", "max", "--yes"])
    assert res.exit_code == 2, res.output
    assert f"it belongs to the recorded cluster {recorded.kafka.cluster_id}" in res.output
    assert "replayed" not in res.output


def test_a_recording_without_a_cluster_id_needs_the_flag(recorded: Recorded, second_listener: str):
    assert not (recorded.unnamed / "topics").exists()  # no answer carried an id, and the proxy asked for none
    assert load_recording(recorded.unnamed).cluster_ids == set()
    args = [str(recorded.unnamed), "--target", second_listener, "--speed", "max", "--yes"]
    res = CliRunner().invoke(replay, args)
    assert res.exit_code == 2, res.output
    assert "names no cluster id" in res.output and "pass --yes-same-cluster" in res.output
    assert "replayed" not in res.output
    res = CliRunner().invoke(replay, [*args, "--yes-same-cluster"])
    assert res.exit_code == 0, res.output
    assert "replayed" in res.output and "cluster      not checked (--yes-same-cluster)" in res.output


# -- a SASL listener: the proxy's own query is refused before authentication ------------------------------

@dataclass
class SaslRecorded:
    broker: Any  # tests/conftest.py's RecBroker
    path: Path
    cluster_id: str  # the broker's own answer on its PLAINTEXT listener


@pytest.fixture(scope="module")
def sasl_recorded(rec_broker: Any, tmp_path_factory: pytest.TempPathFactory) -> SaslRecorded:
    """kafka-python produces through an explicit-mode proxy in front of the broker's SASL_PLAINTEXT (PLAIN) listener."""
    from kafka import KafkaProducer

    out = tmp_path_factory.mktemp("cluster-id-sasl") / "rec"
    topic = "cid-sasl"  # created by the producer's first Metadata request (the broker advertises the proxy only)
    sink = build_sinks(out, "sasl-origin", capture="requests", flush_interval_s=0.2, compact_interval_s=0).sink
    with RunningProxy([rec_broker.sasl_route], sink=sink, capture="requests", proxy_id="sasl-origin") as p:
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, linger_ms=0, client_id="cid-sasl-producer",
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                             sasl_plain_username=rec_broker.sasl_user, sasl_plain_password=rec_broker.sasl_password)
        for i in range(RECORDS):
            prod.send(topic, value=b"v%d" % i)
        prod.flush(20)
        prod.close(5)
    cluster = target_cluster_id(f"127.0.0.1:{rec_broker.kafka.port}")
    assert cluster is not None
    return SaslRecorded(rec_broker, out, cluster)


def _sasl_args(s: SaslRecorded, target: str) -> list[str]:
    return [str(s.path), "--target", target, "--speed", "max", "--sasl-plain",
            f"{s.broker.sasl_user}:{s.broker.sasl_password}"]


def test_a_sasl_listener_recording_names_the_brokers_cluster_id(sasl_recorded: SaslRecorded):
    s = sasl_recorded
    assert target_cluster_id(s.broker.sasl_upstream) is None  # the listener the proxy fronts answers nothing before SASL
    assert s.cluster_id == s.broker.kafka.cluster_id
    rows = read_recording(s.path, "topics").to_pylist()
    assert [(r["broker_addr"], r["cluster_id"]) for r in rows if r["topic_id"] is None] == \
        [(s.broker.sasl_upstream, s.cluster_id)], rows
    assert load_recording(s.path, sasl_credentials=True).cluster_ids == {s.cluster_id}


def test_a_sasl_recording_is_refused_on_another_listener_of_its_cluster(sasl_recorded: SaslRecorded):
    """The broker's PLAINTEXT listener is not the recorded address: only the cluster id tells it is the origin."""
    s = sasl_recorded
    res = CliRunner().invoke(replay, [*_sasl_args(s, f"127.0.0.1:{s.broker.kafka.port}"), "--yes"])
    assert res.exit_code == 2, res.output
    assert f"it belongs to the recorded cluster {s.cluster_id}" in res.output
    assert "replayed" not in res.output


def test_a_sasl_recording_replays_into_another_cluster_and_with_the_flag(sasl_recorded: SaslRecorded,
                                                                          kafka_broker: LocalKafka):
    """Another cluster passes the guard; so does the recorded one with --yes-same-cluster. Both targets are PLAINTEXT
    listeners: replay's own connections find no SASL there (the handshake is answered ILLEGAL_SASL_STATE) and go on
    as they are, and the brokers answer the replayed sessions' SaslHandshake with that error too. The note said
    `sasl_authenticate_error_34` (the password had gone out after the refused handshake); it names the error now,
    the summary says what it means, and no SaslAuthenticate follows a refused handshake."""
    s = sasl_recorded
    res = CliRunner().invoke(replay, [*_sasl_args(s, f"127.0.0.1:{kafka_broker.port}"), "--yes"])
    assert res.exit_code == 0, res.output
    assert f"cluster      target {kafka_broker.cluster_id}, recorded {s.cluster_id}" in res.output
    assert re.search(r"replayed \d+ connections: \d+ requests sent, \d+ answered, 0 without response \(acks=0\), 0 failed",
                     res.output), res.output
    assert re.search(r"note +1  target_listener_without_sasl", res.output), res.output
    assert re.search(r"note +\d+  sasl_handshake_error:ILLEGAL_SASL_STATE — the target's listener takes no SASL "
                     r"\(PLAINTEXT or SSL\) and serves these sessions unauthenticated; point --target at its SASL "
                     r"listener to replay them with SASL\n", res.output), res.output
    assert "sasl_authenticate" not in res.output  # no credentials after a refused handshake
    res = CliRunner().invoke(replay, [*_sasl_args(s, f"127.0.0.1:{s.broker.kafka.port}"), "--yes-same-cluster", "--yes"])
    assert res.exit_code == 0, res.output
    assert "replayed " in res.output and "cluster      not checked (--yes-same-cluster)" in res.output


# -- a SASL target: replay's own connections authenticate with --sasl-plain -------------------------------

def _no_password(s: SaslRecorded, *outputs: str) -> None:
    for out in outputs:
        assert s.broker.sasl_password not in out
        assert "wrong-PW-5d1e" not in out


@pytest.fixture
def sasl_second_listener(rec_broker: Any) -> Iterator[str]:
    """Another SASL listener of the recorded cluster: an unrecorded proxy in front of the broker's SASL listener."""
    with RunningProxy(upstream=rec_broker.sasl_upstream) as p:
        yield p.bootstrap


def test_the_guard_reads_a_sasl_listeners_cluster_id_with_the_credentials(sasl_recorded: SaslRecorded,
                                                                         sasl_second_listener: str, capfd):
    """A replay into another SASL listener of the recorded cluster is refused as that cluster's, not as unreadable."""
    s = sasl_recorded
    res = CliRunner().invoke(replay, [*_sasl_args(s, sasl_second_listener), "--yes"])
    assert res.exit_code == 2, res.output
    assert f"refusing to replay against {sasl_second_listener}: it belongs to the recorded cluster {s.cluster_id}" \
        in res.output
    assert "could not be read" not in res.output and "replayed" not in res.output
    _no_password(s, res.output, *capfd.readouterr())
    assert read_cluster_id(sasl_second_listener, sasl_plain=(s.broker.sasl_user, s.broker.sasl_password)) == \
        (s.cluster_id, "")
    cluster, why = read_cluster_id(sasl_second_listener)  # without credentials: the SASL listener hangs up
    assert cluster is None
    assert why == (f"the target {sasl_second_listener} closed the connection before answering Metadata: a SASL or TLS "
                   "listener? pass --sasl-plain USER:PASSWORD, or point --target at a PLAINTEXT listener")


def test_a_sasl_recording_replays_into_another_clusters_sasl_listener(sasl_recorded: SaslRecorded, sasl_broker: Any,
                                                                      capfd):
    """The whole way through SASL: guard, set-up and replayed sessions authenticate; the target gets every record."""
    s, target = sasl_recorded, sasl_broker.sasl_addr
    res = CliRunner().invoke(replay, [*_sasl_args(s, target), "--yes"])
    assert res.exit_code == 0, res.output
    assert f"cluster      target {sasl_broker.kafka.cluster_id}, recorded {s.cluster_id}" in res.output
    m = re.search(r"replayed \d+ connections: (\d+) requests sent, (\d+) answered, 0 without response \(acks=0\), "
                  r"0 failed, 0 skipped", res.output)
    assert m and int(m[1]) == int(m[2]) > 0, res.output  # every request sent and answered
    assert re.search(r"note +\d+  sasl_authenticated_with_given_credentials", res.output), res.output
    assert "sasl_authenticate_error" not in res.output and "target_listener_without_sasl" not in res.output
    assert "topics created on the target: cid-sasl" in res.output
    assert sorted(_read_back_over_sasl(sasl_broker, "cid-sasl")) == sorted(b"v%d" % i for i in range(RECORDS))
    _no_password(s, res.output, *capfd.readouterr())


def _read_back_over_sasl(sasl_broker: Any, topic: str) -> list[bytes]:
    """Every record of `topic`'s partition 0 on the SASL cluster, in order, read with kafka-python over SASL/PLAIN."""
    from kafka import KafkaConsumer, TopicPartition

    cons = KafkaConsumer(bootstrap_servers=sasl_broker.sasl_addr, client_id=f"{topic}-check", consumer_timeout_ms=5000,
                         security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                         sasl_plain_username=sasl_broker.sasl_user, sasl_plain_password=sasl_broker.sasl_password)
    tp = TopicPartition(topic, 0)
    cons.assign([tp])
    cons.seek_to_beginning(tp)
    got = [r.value for r in cons]
    cons.close()
    return got


def test_a_recording_without_sasl_replays_into_a_sasl_listener(recorded: Recorded, sasl_broker: Any, tmp_path: Path,
                                                               capfd):
    """A recording made on a PLAINTEXT listener, replayed into a SASL-only one with --sasl-plain.

    Found by an audit: the set-up authenticated, but only sessions whose recording had a SaslHandshake did, so the
    target closed every replayed session at its first request after ApiVersions, and the replay ended (exit 0)
    with "failed … target closed the connection" counts and no word of SASL. Each session now authenticates
    first; kafka-python reads every recorded record back from the target, and the replay's own recording (which
    now has a SaslAuthenticate on every session) holds no password. (Without --sasl-plain the set-up stops
    at the SASL listener with the line naming the option:
    test_without_credentials_a_sasl_only_target_is_one_clear_line.)
    """
    target = sasl_broker.sasl_addr
    out = tmp_path / "replayed"
    res = CliRunner().invoke(replay, [str(recorded.named), "--target", target, "--speed", "max", "--yes",
                                      "--record", str(out),
                                      "--sasl-plain", f"{sasl_broker.sasl_user}:{sasl_broker.sasl_password}"])
    assert res.exit_code == 0, res.output
    m = re.search(r"replayed (\d+) connections: (\d+) requests sent, (\d+) answered, 0 without response \(acks=0\), "
                  r"0 failed, 0 skipped", res.output)
    assert m and int(m[2]) == int(m[3]) > 0, res.output  # every request sent and answered
    assert "the target closed" not in res.output
    # every session that asks more than ApiVersions (served before authentication) authenticated first
    sessions = sum(1 for c in load_recording(recorded.named).connections
                   if any(r.frame.api_key != API_VERSIONS for r in c.requests))
    assert sessions > 0
    assert re.search(rf"note +{sessions}  sasl_added_where_recording_had_none — ", res.output), res.output
    assert re.search(rf"note +{sessions}  sasl_authenticated_with_given_credentials\n", res.output), res.output
    assert "topics created on the target: cid-named" in res.output
    assert _read_back_over_sasl(sasl_broker, "cid-named") == [b"v%d" % i for i in range(RECORDS)]
    assert sasl_broker.sasl_password not in res.output and sasl_broker.sasl_password not in "".join(capfd.readouterr())
    requests = read_recording(out, "requests").to_pylist()
    assert sum(1 for r in requests if r["api_name"] == "SaslAuthenticate") == sessions
    for dataset in ("requests", "frames", "connections", "topics"):
        if (out / dataset).exists():
            assert sasl_broker.sasl_password not in repr(read_recording(out, dataset).to_pylist()), dataset


def test_a_wrong_password_is_one_clear_line(sasl_recorded: SaslRecorded, sasl_broker: Any, capfd):
    """Refused by the guard's connection, or (guard skipped) by the set-up's: the same line, exit 3, no password."""
    s, target = sasl_recorded, sasl_broker.sasl_addr
    args = [str(s.path), "--target", target, "--speed", "max", "--sasl-plain", f"{s.broker.sasl_user}:wrong-PW-5d1e",
            "--yes"]
    line = (f"kafkatap replay: the target {target} refused SASL/PLAIN authentication: SaslAuthenticate answered "
            "SASL_AUTHENTICATION_FAILED (Authentication failed: Invalid username or password)")
    for extra in ([], ["--yes-same-cluster"]):
        res = CliRunner().invoke(replay, [*args, *extra])
        assert res.exit_code == 3, res.output
        assert res.output.strip().splitlines()[-1] == line, res.output
        assert "replayed" not in res.output and "Aborted" not in res.output
        assert ("Replay plan" in res.output) == bool(extra)  # the guard stops before the plan, the set-up after
    _no_password(s, res.output, *capfd.readouterr())


def test_without_credentials_a_sasl_only_target_is_one_clear_line(recorded: Recorded, sasl_broker: Any, capfd):
    """No --sasl-plain: the guard's refusal and (guard skipped) the set-up's error say what the listener wants.

    The set-up's Metadata request met the SASL listener's hang-up as an uncaught asyncio.IncompleteReadError,
    which click turned into "Aborted!".
    """
    target = sasl_broker.sasl_addr
    why = (f"the target {target} closed the connection before answering Metadata: a SASL or TLS listener? pass "
           "--sasl-plain USER:PASSWORD, or point --target at a PLAINTEXT listener")
    args = [str(recorded.named), "--target", target, "--speed", "max", "--yes"]
    res = CliRunner().invoke(replay, args)
    assert res.exit_code == 2, res.output
    assert res.output.strip() == (f"kafkatap replay: refusing to replay against {target}: its cluster id could not be "
                                  f"read ({why}), so nothing shows it is not the recorded cluster; pass "
                                  "--yes-same-cluster to replay there anyway"), res.output
    res = CliRunner().invoke(replay, [*args, "--yes-same-cluster"])
    assert res.exit_code == 3, res.output
    assert res.output.strip().splitlines()[-1] == f"kafkatap replay: {why}", res.output
    assert "Aborted" not in res.output and "replayed" not in res.output


def test_a_sasl_recording_without_credentials_says_to_pass_them(sasl_recorded: SaslRecorded):
    """Every recorded connection authenticated: without --sasl-plain there is nothing to replay, and the line says why."""
    res = CliRunner().invoke(replay, [str(sasl_recorded.path), "--target", "127.0.0.1:9", "--speed", "max", "--yes"])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == ("kafkatap replay: nothing to replay without credentials (every recorded connection "
                                  "authenticated with SASL): pass --sasl-plain USER:PASSWORD"), res.output
