"""TLS termination and origination against a real broker's SSL and SASL_SSL (SCRAM) listeners (issue 15).

One 4.3.1 broker with three listeners: PLAINTEXT (the harness's own probes),
SSL that *requires* a client certificate (so origination's client certificate
is exercised on every connection), and SASL_SSL with SCRAM-SHA-256 users made
at format time. The CA and every certificate are generated per run
(`harness.tls`). Clients (kafka-python, librdkafka, Kafka's Java tools) speak
TLS to the proxy, which speaks TLS to the broker, so what they do is decoded
and recorded like plaintext traffic.
"""

from __future__ import annotations

import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pyarrow.dataset as ds
import pytest

from cluster_helpers import PROXY, CliProxy, free_port_run
from harness.java_clients import JavaClients, JavaTool
from harness.kafka import LocalKafka, free_port
from harness.recorded_secrets import values_holding
from harness.tls import SCRAM_MECHANISM, Pki, scram_format_args, ssl_listener_props
from proxy.cluster import ClusterConfig, ClusterMode
from proxy.running import RunningProxy
from proxy.tls import UpstreamTls, client_context, server_context

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

USER, PASSWORD = "alice", "Tr0ub4dor-and-3-horses-kafkatap"


@pytest.fixture(scope="module")
def tls_kafka(tmp_path_factory) -> Iterator[SimpleNamespace]:
    d = tmp_path_factory.mktemp("pki")
    pki = Pki.create(d)
    broker_cert = pki.issue("broker")
    proxy_cert = pki.issue("proxy")  # what the proxy shows its clients
    proxy_client = pki.issue("proxy-client", client=True)  # what the proxy shows the broker's SSL listener
    client = pki.issue("client", client=True)  # an application's certificate (mutual TLS to the proxy)
    ssl_port, sasl_port = free_port(), free_port()
    kafka = LocalKafka(broker_props=ssl_listener_props(broker_cert, pki, ssl_port=ssl_port, sasl_ssl_port=sasl_port,
                                                       require_client_cert=True),
                       format_args=scram_format_args({USER: PASSWORD}))
    kafka.start()
    try:
        yield SimpleNamespace(kafka=kafka, pki=pki, proxy_cert=proxy_cert, proxy_client=proxy_client, client=client,
                              ssl_port=ssl_port, sasl_port=sasl_port)
    finally:
        kafka.stop()
        kafka.cleanup()


def _cluster_proxy(t: SimpleNamespace, upstream_port: int, sink, client_ca: Path | None = None) -> RunningProxy:
    listen = free_port_run(3)
    mode = ClusterMode(ClusterConfig(bootstrap=("127.0.0.1", upstream_port), listen=("127.0.0.1", listen)))
    return RunningProxy(
        routes=[f"127.0.0.1:{listen}=127.0.0.1:{upstream_port}"], sink=sink, cluster=mode,
        tls_server=server_context(t.proxy_cert.cert, t.proxy_cert.key, client_ca),
        upstream_tls=UpstreamTls(client_context(t.pki.ca, t.proxy_client.cert, t.proxy_client.key)))


def _records(rows, topic: str) -> int:
    return sum(r["records"] or 0 for r in rows if r["api_name"] == "Produce" and topic in (r["topics"] or [])
               and r["status"] == "answered")


def test_ssl_cluster_decoded_with_java_librdkafka_and_kafka_python(tls_kafka, sink, topic_name) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    import confluent_kafka as ck

    t = tls_kafka
    t.kafka.create_topic(topic_name, partitions=2)
    with _cluster_proxy(t, t.ssl_port, sink) as p:
        ca = str(t.pki.ca)
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, security_protocol="SSL", ssl_cafile=ca, acks="all")
        for i in range(50):
            prod.send(topic_name, b"kp-%d" % i)
        prod.flush(30)
        prod.close()
        cp = ck.Producer({"bootstrap.servers": p.bootstrap, "security.protocol": "ssl", "ssl.ca.location": ca})
        for i in range(50):
            cp.produce(topic_name, b"ck-%d" % i)
        assert cp.flush(30) == 0
        j = JavaClients(p.bootstrap, t.kafka.version)
        java_ssl = {"security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.location": ca}
        j.run(j.producer_perf(topic_name, records=50, props={**java_ssl, "acks": "all"})).check()
        out = j.run(j.console_consumer(topic_name, group=f"j-{topic_name}", max_messages=150, props=java_ssl)).check()
        assert "Processed a total of 150 messages" in out.stdout + out.stderr
        cons = ck.Consumer({"bootstrap.servers": p.bootstrap, "security.protocol": "ssl", "ssl.ca.location": ca,
                            "group.id": f"ck-{topic_name}", "auto.offset.reset": "earliest"})
        cons.subscribe([topic_name])
        got, deadline = 0, time.monotonic() + 60
        while got < 150 and time.monotonic() < deadline:
            m = cons.poll(1.0)
            got += m is not None and m.error() is None
        cons.close()
        assert got == 150
        kc = KafkaConsumer(topic_name, bootstrap_servers=p.bootstrap, security_protocol="SSL", ssl_cafile=ca,
                           group_id=f"kp-{topic_name}", auto_offset_reset="earliest", consumer_timeout_ms=15000)
        assert sum(1 for _ in zip(range(150), kc)) == 150
        kc.close()
        sink.wait_for(lambda s: _records(s.requests, topic_name) >= 150)
    assert _records(sink.requests, topic_name) == 150
    assert not [c for c in sink.finals() if c["opaque"] or c["tls"]]  # nothing left opaque: all decoded
    assert {"Produce", "Fetch", "JoinGroup", "SyncGroup", "OffsetCommit"} <= {r["api_name"] for r in sink.requests}
    assert any(r["edit"] for r in sink.requests if r["api_name"] == "Metadata")


def test_sasl_ssl_scram_recorded_and_the_password_is_nowhere(tls_kafka, topic_name, tmp_path) -> None:
    """The real CLI, debug logging and every raw frame captured: still no password in logs or recording."""
    from kafka import KafkaConsumer, KafkaProducer

    import confluent_kafka as ck

    t = tls_kafka
    t.kafka.create_topic(topic_name)
    listen, status, rec = free_port_run(3), free_port(), tmp_path / "rec"
    p = CliProxy(["--cluster", f"127.0.0.1:{t.sasl_port}", "--listen", f"127.0.0.1:{listen}", "--record", str(rec),
                  "--capture", "all", "--tls-cert", str(t.proxy_cert.cert), "--tls-key", str(t.proxy_cert.key),
                  "--upstream-tls-ca", str(t.pki.ca)], status, tmp_path, log_level="debug")
    bootstrap, ca = f"127.0.0.1:{listen}", str(t.pki.ca)
    try:
        sasl = dict(security_protocol="SASL_SSL", ssl_cafile=ca, sasl_mechanism=SCRAM_MECHANISM,
                    sasl_plain_username=USER, sasl_plain_password=PASSWORD)
        prod = KafkaProducer(bootstrap_servers=bootstrap, acks="all", **sasl)
        for i in range(30):
            prod.send(topic_name, b"kp-%d" % i)
        prod.flush(30)
        prod.close()
        cp = ck.Producer({"bootstrap.servers": bootstrap, "security.protocol": "sasl_ssl", "ssl.ca.location": ca,
                          "sasl.mechanism": SCRAM_MECHANISM, "sasl.username": USER, "sasl.password": PASSWORD})
        for i in range(30):
            cp.produce(topic_name, b"ck-%d" % i)
        assert cp.flush(30) == 0
        j = JavaClients(bootstrap, t.kafka.version)
        jaas = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{USER}" password="{PASSWORD}";'
        java = {"security.protocol": "SASL_SSL", "ssl.truststore.type": "PEM", "ssl.truststore.location": ca,
                "sasl.mechanism": SCRAM_MECHANISM, "sasl.jaas.config": jaas}
        # the JAAS line holds '=' signs, which --producer-props cannot carry: a config file instead
        config = tmp_path / "producer.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in {**java, "acks": "all"}.items()))
        tool = j.producer_perf(topic_name, records=30)
        j.run(JavaTool([*tool.argv, "--producer.config", str(config)], tool.timeout_s)).check()
        kc = KafkaConsumer(topic_name, bootstrap_servers=bootstrap, group_id=f"g-{topic_name}",
                           auto_offset_reset="earliest", consumer_timeout_ms=15000, **sasl)
        assert sum(1 for _ in zip(range(90), kc)) == 90
        kc.close()
    finally:
        p.stop()
    files = [f for f in rec.rglob("*") if f.is_file()]
    rows = ds.dataset(rec / "requests", format="parquet", partitioning="hive").to_table().to_pylist()
    assert _records(rows, topic_name) == 90, [(r["client_id"], r["records"], r["status"], r["decode_note"], r["api_version"])
                                              for r in rows if r["api_name"] == "Produce"]
    assert {"SaslHandshake", "SaslAuthenticate"} <= {r["api_name"] for r in rows}
    frames = ds.dataset(rec / "frames", format="parquet", partitioning="hive").to_table().to_pylist()
    assert frames and not [f for f in frames if f["api_key"] == 36]  # SaslAuthenticate frames never kept
    assert files and not values_holding(rec, PASSWORD.encode())
    assert PASSWORD.encode() not in p.err_path.read_bytes()
    # every line of a --log-format json log is JSON: nothing of asyncio's own (it warned once per TLS close
    # when a protocol asked to keep a TLS connection half-open)
    stray = [line for line in p.err_path.read_text().splitlines() if line.strip() and not line.startswith("{")]
    assert not stray, stray[:5]
    for dataset in ("requests", "connections", "frames"):
        table = ds.dataset(rec / dataset, format="parquet", partitioning="hive").to_table()
        assert PASSWORD not in str(table.to_pylist()), dataset
    # the proxy's own Metadata query is refused before SASL: the clients' relayed answers named the cluster
    topics = ds.dataset(rec / "topics", format="parquet", partitioning="hive").to_table().to_pylist()
    own = [r for r in topics if r["topic_id"] is None]
    assert own and {r["cluster_id"] for r in own} == {t.kafka.cluster_id}, topics


def test_client_certificates_required_when_asked(tls_kafka, sink, topic_name) -> None:
    import socket

    from kafka import KafkaProducer

    t = tls_kafka
    with _cluster_proxy(t, t.ssl_port, sink, client_ca=t.pki.ca) as p:
        ca = str(t.pki.ca)
        # no client certificate: with TLS 1.3 the refusal shows on the first read (an alert or the close)
        with socket.create_connection(p.listen_addr, timeout=10) as raw:
            tls = ssl.create_default_context(cafile=ca).wrap_socket(raw, server_hostname="127.0.0.1")
            try:
                tls.sendall(b"\x00\x00\x00\x00")
                got = tls.recv(1)
            except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
                got = b""
            assert got == b""
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, security_protocol="SSL", ssl_cafile=ca,
                             ssl_certfile=str(t.client.cert), ssl_keyfile=str(t.client.key), acks="all")
        prod.send(topic_name, b"with a certificate").get(30)
        prod.close()
        assert p.server.accept_failures.get("tls_handshake", 0) >= 1
        sink.wait_for(lambda s: _records(s.requests, topic_name) == 1)


def test_upstream_certificate_is_verified(tls_kafka, sink) -> None:
    """A broker whose certificate the given CA did not sign is refused (the client's connection ends)."""
    t = tls_kafka
    other = Pki.create(t.pki.dir / "other")
    with RunningProxy(routes=[f"127.0.0.1:0=127.0.0.1:{t.ssl_port}"], sink=sink,
                      upstream_tls=UpstreamTls(client_context(other.ca))) as p:
        out = subprocess.run(["kcat", "-b", p.bootstrap, "-L", "-m", "5"], capture_output=True, text=True, timeout=30)
        assert out.returncode != 0
        ends = sink.wait_final(1)
    assert ends[0]["end_reason"] == "upstream_connect_failed" and "CERTIFICATE_VERIFY_FAILED" in (ends[0]["end_detail"] or "")


def test_a_client_certificate_the_broker_refuses_is_the_connections_inferred_cause(tls_kafka, sink) -> None:
    """The broker requires a client certificate and the proxy gives none: with TLS 1.3 the refusal is an alert after
    the handshake, so the client's first request is relayed and the connection ends as a broker reset. Its cause
    read "broker restart, crash or a request it rejected"."""
    t = tls_kafka
    with RunningProxy(routes=[f"127.0.0.1:0=127.0.0.1:{t.ssl_port}"], sink=sink,
                      upstream_tls=UpstreamTls(client_context(t.pki.ca))) as p:
        out = subprocess.run(["kcat", "-b", p.bootstrap, "-L", "-m", "5"], capture_output=True, text=True, timeout=30)
        assert out.returncode != 0
        ends = sink.wait_final(1)
    assert ends[0]["end_by"] == "broker" and "ALERT" in (ends[0]["end_detail"] or "")
    assert ends[0]["inferred_cause"].startswith("the broker refused the proxy's TLS client certificate, or its lack")


def test_the_start_up_probe_completes_the_tls_handshake_and_says_why_it_fails(tls_kafka, tmp_path) -> None:
    """The probe of an explicit --upstream was a TCP connect only: a CA that does not sign the broker's certificate,
    a server name it does not carry, a broker that wants a client certificate, or a PLAINTEXT listener dialled with
    TLS all started cleanly, and the first client's connection was the first to fail. Probed against the real SSL
    listener (which requires client certificates) with the context the proxy's own connections use."""
    from proxy.upstream_probe import connect_problem

    t = tls_kafka
    other = Pki.create(t.pki.dir / "probe-other")
    mine = (t.pki.ca, t.proxy_client.cert, t.proxy_client.key)
    assert connect_problem("127.0.0.1", t.ssl_port, 10.0, UpstreamTls(client_context(*mine))) is None
    assert connect_problem("127.0.0.1", t.ssl_port, 10.0) is None  # no TLS asked: TCP only, as before
    wrong_ca = connect_problem("127.0.0.1", t.ssl_port, 10.0,
                               UpstreamTls(client_context(other.ca, t.proxy_client.cert, t.proxy_client.key)))
    assert wrong_ca is not None and wrong_ca.startswith("TLS handshake failed: the broker's certificate was refused")
    assert "unable to get local issuer certificate" in wrong_ca and "--upstream-tls-ca" in wrong_ca
    wrong_name = connect_problem("127.0.0.1", t.ssl_port, 10.0, UpstreamTls(client_context(*mine), "kafka.example"))
    assert wrong_name is not None and "Hostname mismatch" in wrong_name and "'kafka.example'" in wrong_name
    no_cert = connect_problem("127.0.0.1", t.ssl_port, 10.0, UpstreamTls(client_context(t.pki.ca)))
    assert no_cert is not None and "client certificate" in no_cert and "--upstream-tls-cert" in no_cert
    plain = connect_problem("127.0.0.1", t.kafka.port, 10.0, UpstreamTls(client_context(*mine)))
    assert plain is not None and plain.startswith("TLS handshake failed") and "PLAINTEXT" in plain

    # the command: one warning at start naming the upstream, its listener and the reason; none when all is right
    bad = CliProxy(["--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{t.ssl_port}", "--upstream-tls-ca",
                    str(other.ca), "--upstream-tls-cert", str(t.proxy_client.cert), "--upstream-tls-key",
                    str(t.proxy_client.key)], free_port(), tmp_path)
    said = bad.wait_log(lambda e: "TLS handshake fails" in str(e.get("event")))
    assert said["upstream"] == f"127.0.0.1:{t.ssl_port}" and "unable to get local issuer certificate" in said["error"]
    bad.stop()
    good = CliProxy(["--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{t.ssl_port}", "--upstream-tls-ca",
                     str(t.pki.ca), "--upstream-tls-cert", str(t.proxy_client.cert), "--upstream-tls-key",
                     str(t.proxy_client.key)], free_port(), tmp_path, log_level="debug")
    good.wait_log(lambda e: e.get("event") == "upstream probed" and e.get("upstream") == f"127.0.0.1:{t.ssl_port}")
    assert not [e for e in good.stop() if e.get("error") and "upstream" in str(e.get("event"))]


def test_cluster_discovery_names_a_client_certificate_the_broker_refused(tls_kafka) -> None:
    """A TLS 1.3 broker refuses a missing client certificate only after the handshake, with an alert the discovery's
    read gets: the warning gave OpenSSL's bare `SSLV3_ALERT_BAD_CERTIFICATE`. It now says what to give."""
    import asyncio

    import uvloop
    from structlog.testing import capture_logs

    t = tls_kafka
    mode = ClusterMode(ClusterConfig(bootstrap=("127.0.0.1", t.ssl_port), listen=("127.0.0.1", free_port())))
    mode.upstream_tls = UpstreamTls(client_context(t.pki.ca))  # the CA, but no --upstream-tls-cert/--upstream-tls-key
    for run in (uvloop.run, asyncio.run):  # the proxy's loop, and asyncio's own
        with capture_logs() as logs:
            run(mode._discover_brokers())
        said = [e for e in logs if e["event"].startswith("broker discovery at start failed")]
        assert len(said) == 1 and "client certificate" in said[0]["error"], (run, logs)
        assert "--upstream-tls-cert" in said[0]["error"] and "SASL" not in said[0]["error"]


def test_tls_pass_through_stays_available(tls_kafka, sink) -> None:
    """No TLS options: TLS is relayed byte for byte and recorded as opaque, as before."""
    t = tls_kafka
    with RunningProxy(routes=[f"127.0.0.1:0=127.0.0.1:{t.ssl_port}"], sink=sink) as p:
        out = subprocess.run(["kcat", "-b", p.bootstrap, "-L", "-m", "15", "-X", "security.protocol=ssl",
                              "-X", f"ssl.ca.location={t.pki.ca}", "-X", f"ssl.certificate.location={t.client.cert}",
                              "-X", f"ssl.key.location={t.client.key}"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert f"127.0.0.1:{t.ssl_port}" in out.stdout
        ends = sink.wait_final(1)
    assert ends[0]["tls"] and ends[0]["opaque"] and ends[0]["bytes_from_broker"] > 0
    assert not sink.requests


def test_two_workers_terminate_tls_on_connections_they_were_passed(tls_kafka, topic_name, tmp_path) -> None:
    """--workers 2: a TLS client's connection may be passed to the other worker before its handshake
    (proxy.balance); that worker does the handshake and serves it. 12 held connections end up 6 and 6,
    every one answers, and a kafka-python producer's records are all recorded."""
    import json
    import socket
    import struct
    import urllib.request

    from kafka import KafkaProducer

    from proxy.live import parse_metrics

    t = tls_kafka
    t.kafka.create_topic(topic_name)
    listen, status, rec = free_port_run(3), free_port(), tmp_path / "rec"
    p = CliProxy(["--cluster", f"127.0.0.1:{t.ssl_port}", "--listen", f"127.0.0.1:{listen}", "--record", str(rec),
                  "--tls-cert", str(t.proxy_cert.cert), "--tls-key", str(t.proxy_cert.key),
                  "--upstream-tls-ca", str(t.pki.ca), "--upstream-tls-cert", str(t.proxy_client.cert),
                  "--upstream-tls-key", str(t.proxy_client.key)], status, tmp_path, workers=2)
    ca = str(t.pki.ca)
    held = []
    try:
        context = ssl.create_default_context(cafile=ca)
        for corr in range(12):
            tls = context.wrap_socket(socket.create_connection(("127.0.0.1", listen), timeout=15),
                                      server_hostname="127.0.0.1")
            body = struct.pack(">hhih", 18, 0, corr, 7) + b"held-tl"
            tls.sendall(struct.pack(">i", len(body)) + body)
            head = tls.recv(8)
            assert struct.unpack(">i", head[4:8])[0] == corr  # the broker's answer, through either worker
            held.append(tls)
        metrics = parse_metrics(urllib.request.urlopen(f"http://127.0.0.1:{status}/metrics", timeout=10).read().decode())
        per_worker = sorted(v for _, v in metrics["kafkatap_worker_open_connections"])
        assert per_worker == [6, 6], per_worker
        moved = {labels["how"]: v for labels, v in metrics["kafkatap_balanced_connections_total"]}
        assert moved["passed"] == moved["taken"] and moved["lost"] == 0, moved
        clients = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{status}/clients", timeout=10).read())
        assert len({c["worker"] for c in clients["clients"]}) == 2
        top = subprocess.run([*PROXY[:-1], "top", "--addr", f"127.0.0.1:{status}", "--once"], capture_output=True,
                             text=True, timeout=60)
        assert "open connections 12 (per worker 6 / 6" in top.stdout, top.stdout + top.stderr
        prod = KafkaProducer(bootstrap_servers=f"127.0.0.1:{listen}", security_protocol="SSL", ssl_cafile=ca, acks="all")
        for i in range(20):
            prod.send(topic_name, b"w-%d" % i)
        prod.flush(30)
        prod.close()
    finally:
        for s in held:
            s.close()
        p.stop()
    rows = ds.dataset(rec / "requests", format="parquet", partitioning="hive").to_table().to_pylist()
    assert _records(rows, topic_name) == 20
    assert sum(1 for r in rows if r["api_name"] == "ApiVersions" and r["client_id"] == "held-tl") == 12


def test_an_encrypted_key_takes_its_passphrase_from_a_file_and_never_prompts(tmp_path) -> None:
    """An encrypted key once stopped at OpenSSL's terminal prompt (twice), then crashed with a traceback."""
    import subprocess

    from harness.tls import Pki
    from proxy.tls import TlsConfigError, server_context, tls_setup

    pki = Pki.create(tmp_path / "pki")
    cert = pki.issue("proxy")
    enc = tmp_path / "enc.key"
    subprocess.run(["openssl", "pkcs8", "-topk8", "-in", str(cert.key), "-out", str(enc), "-passout", "pass:s3cret",
                    "-v2", "aes-256-cbc"], check=True, capture_output=True)
    with pytest.raises(TlsConfigError, match="enc.key is encrypted: give its passphrase with --tls-key-password-file"):
        server_context(cert.cert, enc)
    with pytest.raises(TlsConfigError, match="wrong passphrase"):
        server_context(cert.cert, enc, key_password="nope")
    (tmp_path / "pw").write_text("s3cret\n")
    setup = tls_setup({"tls_cert": cert.cert, "tls_key": enc, "tls_key_password_file": tmp_path / "pw"})
    assert setup.server is not None
    (tmp_path / "empty").write_text("")
    with pytest.raises(TlsConfigError, match="is empty"):
        tls_setup({"tls_cert": cert.cert, "tls_key": enc, "tls_key_password_file": tmp_path / "empty"})


def test_a_plaintext_client_on_a_tls_listener_is_told_apart(tmp_path) -> None:
    """`WRONG_VERSION_NUMBER` alone left the operator to know that it means a plaintext client."""
    import asyncio

    from structlog.testing import capture_logs

    from harness.tls import Pki
    from proxy.server import ProxyServer

    pki = Pki.create(tmp_path / "pki")
    cert = pki.issue("proxy")

    async def run() -> None:
        server = ProxyServer(["127.0.0.1:0=127.0.0.1:9"], tcp_info=False, tls_server=server_context(cert.cert, cert.key))
        await server.start()
        reader, writer = await asyncio.open_connection(*server.listen_addr)
        writer.write(b"\x00\x00\x00\x15\x00\x12\x00\x03\x00\x00\x00\x01\x00\x03abc" + bytes(8))  # ApiVersions, plain
        assert await reader.read() == b""
        writer.close()
        async with asyncio.timeout(10):  # a regression fails here, not at pytest's 600 s timeout
            while server.accept_failures.get("tls_handshake", 0) == 0:
                await asyncio.sleep(0.01)  # counted after the close the client saw: nothing to await on
        await server.stop()

    with capture_logs() as logs:
        asyncio.run(run())
    failed = [e for e in logs if e.get("reason") == "tls_handshake"]
    assert failed and "spoke plaintext to this TLS listener" in failed[0]["event"], failed
