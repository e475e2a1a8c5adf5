"""End to end with the real proxy and a real broker: session → Parquet → Spark; SIGTERM; SASL redaction."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest
from kafka import KafkaConsumer, KafkaProducer

from harness.recorded_secrets import values_holding
from proxy.metrics import LiveStats
from recording.writer import ParquetRecorder
from recording.reader import read_recording
from proxy.running import RunningProxy
from proxy.sinks import FanOut

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).parents[2]


def _metadata_v1(corr: int) -> bytes:
    body = struct.pack(">hhih", 3, 1, corr, 3) + b"raw" + struct.pack(">i", -1)
    return struct.pack(">i", len(body)) + body


def _read_frame(s: socket.socket) -> bytes:
    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    (size,) = struct.unpack(">i", exact(4))
    return exact(size)


def _produce_consume(bootstrap: str, topic: str, n: int, **client_kw) -> list[bytes]:
    prod = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=5, **client_kw)
    for i in range(n):
        prod.send(topic, f"message-{i}".encode())
    prod.flush()
    prod.close()
    cons = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=f"g-{topic}",
                         consumer_timeout_ms=3000, **client_kw)
    got = [m.value for m in cons]
    cons.close()
    return got


@pytest.mark.spark
def test_proxied_session_to_parquet_to_spark(rec_broker, topic_name, tmp_path: Path) -> None:
    root = tmp_path / "rec"
    rec = ParquetRecorder(root, "e2e", flush_interval_s=0.2, fsync=False).start()
    stats = LiveStats("e2e", recorder_stats=rec.stats)
    with RunningProxy([rec_broker.route], sink=FanOut(rec, stats), proxy_id="e2e") as p:
        got = _produce_consume(p.bootstrap, topic_name, 200)
    assert len(got) == 200
    assert rec.stats()["dropped"]["requests"] == 0

    req = read_recording(root, "requests")
    conns = read_recording(root, "connections")
    finals = [c for c in conns.to_pylist() if c["final"]]
    per_conn = Counter(req["conn_id"].to_pylist())
    for c in finals:  # every request the proxy counted on a connection is a row
        assert per_conn.get(c["conn_id"], 0) == c["requests"], c
    produce = [r for r in req.to_pylist() if r["api_name"] == "Produce" and r["error_count"] == 0]
    assert sum(r["records"] for r in produce) == 200  # a Produce retried after an error is two rows
    assert all(topic_name in r["topics"] for r in produce)
    assert {"ApiVersions", "Metadata", "Produce", "Fetch", "JoinGroup"} <= set(req["api_name"].to_pylist())
    assert len(read_recording(root, "tcp")) > 0

    from analytics.session import get_spark
    from analytics.spark_schema import spark_schema
    from pyspark.sql import functions as F

    spark = get_spark(master="local[1]")
    sdf = spark.read.schema(spark_schema("requests")).parquet(str(root / "requests"))
    assert sdf.count() == req.num_rows
    recs = sdf.where((F.col("api_name") == "Produce") & (F.col("error_count") == 0)).agg(F.sum("records")).first()[0]
    assert recs == 200
    lat = sdf.where(F.col("status") == "answered").agg(F.min("latency_us"), F.max("latency_us")).first()
    assert 0 <= lat[0] <= lat[1]
    sconn = spark.read.schema(spark_schema("connections")).parquet(str(root / "connections"))
    assert sconn.where(F.col("final")).count() == len(finals)


def test_sigterm_requests_made_equal_rows_recorded(rec_broker, topic_name, tmp_path: Path) -> None:
    root = tmp_path / "rec"
    proc = subprocess.Popen([sys.executable, "-m", "tests.recording.proxy_proc", rec_broker.route, str(root), "term"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline() or "{}")
        assert info, proc.stderr.read()[-3000:]
        bootstrap = f"127.0.0.1:{info['listen'][1]}"
        got = _produce_consume(bootstrap, topic_name, 100)
        assert len(got) == 100
        # a raw client whose exact request count we know: 300 answered, then 50 pipelined at SIGTERM time
        a = socket.create_connection(("127.0.0.1", info["listen"][1]))
        for corr in range(300):
            a.sendall(_metadata_v1(corr))
            assert struct.unpack(">i", _read_frame(a)[:4])[0] == corr
        b = socket.create_connection(("127.0.0.1", info["listen"][1]))
        b.sendall(b"".join(_metadata_v1(1000 + i) for i in range(50)))
        # SIGTERM once b is relaying (its first response is back): requests still in the listen backlog or
        # waiting for the upstream connect are a separate shutdown question (see the recorder report)
        deadline = time.monotonic() + 20
        while True:
            clients = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{info['status']}/clients").read())
            if sum(c["requests"] for c in clients["clients"] if c["client_id"] == "raw") > 300:
                break
            assert time.monotonic() < deadline, clients
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        answered_b = 0
        try:
            while True:
                _read_frame(b)
                answered_b += 1
        except (ConnectionError, OSError):
            pass
        _, err = proc.communicate(timeout=60)
        a.close()
        b.close()
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    req = read_recording(root, "requests")
    raw = [r for r in req.to_pylist() if r["client_id"] == "raw"]
    conns_dbg = [(c["conn_id"], c["final"], c["end_reason"], c["requests"], c["bytes_from_client"], c["client_ids"])
                 for c in read_recording(root, "connections").to_pylist()]
    assert len(raw) == 350, (Counter(r["status"] for r in raw), answered_b, clients, conns_dbg, err[-4000:])
    assert sorted(r["correlation_id"] for r in raw) == list(range(300)) + list(range(1000, 1050))
    assert sum(1 for r in raw if r["answered"]) >= 300 + answered_b
    produce = [r for r in req.to_pylist() if r["api_name"] == "Produce" and r["error_count"] == 0]
    assert sum(r["records"] for r in produce) == 100  # retried Produce requests (topic auto-creation) failed first
    conns = read_recording(root, "connections").to_pylist()
    finals = {c["conn_id"]: c for c in conns if c["final"]}
    per_conn = Counter(r["conn_id"] for r in req.to_pylist())
    for cid, c in finals.items():
        assert per_conn.get(cid, 0) == c["requests"], c
    assert any(c["end_reason"] == "proxy_shutdown" for c in finals.values())
    frames = read_recording(root, "frames")  # --capture requests
    assert frames.num_rows == req.num_rows - sum(1 for r in req.to_pylist() if r["api_key"] == 36)
    assert '"recording closed"' in err or "recording closed" in err


def test_sasl_plain_password_never_recorded_or_logged(rec_broker, topic_name, tmp_path: Path, capfd) -> None:
    from recording.logs import configure_logging

    SASL_USER, SASL_PASSWORD = rec_broker.sasl_user, rec_broker.sasl_password
    configure_logging("json", "debug")  # the per-request debug lines are the ones a leak would be in
    root = tmp_path / "rec"
    rec = ParquetRecorder(root, "sasl", capture="all", flush_interval_s=0.2, fsync=False).start()
    stats = LiveStats("sasl", recorder_stats=rec.stats)
    sasl = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                sasl_plain_username=SASL_USER, sasl_plain_password=SASL_PASSWORD)
    with RunningProxy([rec_broker.sasl_route], sink=FanOut(rec, stats), proxy_id="sasl", capture="all",
                      log_requests=True) as p:
        got = _produce_consume(p.bootstrap, topic_name, 20, **sasl)
        import confluent_kafka as ck
        cp = ck.Producer({"bootstrap.servers": p.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                          "sasl.mechanisms": "PLAIN", "sasl.username": SASL_USER, "sasl.password": SASL_PASSWORD})
        for i in range(10):
            cp.produce(topic_name, f"ck-{i}".encode())
        assert cp.flush(15) == 0
        del cp
        # read on the proxy's loop, which is the thread that updates LiveStats
        clients_json = json.dumps(p.call(stats.clients_json))
        metrics_text = p.call(stats.render_prometheus)
    assert len(got) == 20
    req = read_recording(root, "requests")
    names = Counter(req["api_name"].to_pylist())
    assert names["SaslHandshake"] >= 2 and names["SaslAuthenticate"] >= 2  # metadata of the exchange is kept
    assert set(req.filter(pc.equal(req["api_key"], 17))["sasl_mechanism"].to_pylist()) == {"PLAIN"}
    frames = read_recording(root, "frames")
    assert frames.num_rows > 0 and 36 not in set(frames["api_key"].to_pylist())
    secret = SASL_PASSWORD.encode()
    files = [f for f in root.rglob("*") if f.is_file()]
    assert files
    assert not values_holding(root, secret)
    out, err = capfd.readouterr()
    assert '"api": "SaslAuthenticate"' in err  # the debug lines were written, so the next line checks them
    assert SASL_PASSWORD not in out and SASL_PASSWORD not in err
    assert SASL_PASSWORD not in clients_json and SASL_PASSWORD not in metrics_text
    assert topic_name in clients_json and 'api="SaslAuthenticate"' in metrics_text  # the views did see the exchange


def test_credentials_set_through_the_proxy_are_never_captured(rec_broker, tmp_path: Path) -> None:
    """kafka-configs sends secrets in clear: AlterUserScramCredentials a salt and a salted password (enough to log in
    with SCRAM), IncrementalAlterConfigs a config's value (here a keystore password, which the broker may refuse:
    the frame went through the proxy either way). With --capture all their frames are left out like
    SaslAuthenticate's, while their request rows are kept."""
    from harness.java_clients import JavaClients
    from protocol.apis import CREDENTIAL_APIS

    root = tmp_path / "rec"
    rec = ParquetRecorder(root, "creds", capture="all", flush_interval_s=0.2, fsync=False).start()
    scram, keystore = "scram-PW-4d1e-never-record-me", "keystore-PW-77b0-never-record-me"
    with RunningProxy([rec_broker.route], sink=rec, proxy_id="creds", capture="all") as p:
        j = JavaClients(p.bootstrap, rec_broker.kafka.version)
        JavaClients.run(j.configs("--alter", "--entity-type", "users", "--entity-name", "carol", "--add-config",
                                  f"SCRAM-SHA-256=[iterations=8192,password={scram}]")).check()
        JavaClients.run(j.configs("--alter", "--entity-type", "brokers", "--entity-name", "1", "--add-config",
                                  f"listener.name.internal.ssl.keystore.password={keystore}"))
    rec.close()
    req = read_recording(root, "requests")
    assert {44, 51} <= set(req["api_key"].to_pylist())  # the requests were seen and recorded (their metadata)
    frames = read_recording(root, "frames")
    assert frames.num_rows > 0 and not {44, 51} & set(frames["api_key"].to_pylist())
    assert CREDENTIAL_APIS >= {44, 51}
    for secret in (scram.encode(), keystore.encode()):
        assert not values_holding(root, secret), secret
    assert not any(b"carol" in data for data in frames["data"].to_pylist())  # neither way's frame was kept

