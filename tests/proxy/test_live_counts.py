"""/metrics' request accounting includes open connections: a long-lived producer's requests are counted now."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from kafka import KafkaProducer

from harness.kafka import free_port
from protocol.apis import API_VERSIONS
from protocol.deep import message_class
from proxy.live import parse_metrics
from proxy_procs import wait_listening

KAFKATAP = [sys.executable, "-m", "kafkatap.cli", "--log-format", "json"]


def _metrics(status: str) -> dict:
    with urllib.request.urlopen(f"http://{status}/metrics", timeout=10) as resp:
        return parse_metrics(resp.read().decode())


def _total(metrics: dict, name: str) -> float:
    return sum(v for _, v in metrics.get(name, []))


def _wait_metrics(status: str, pred, what: str, timeout: float = 60):  # noqa: ANN001, ANN202
    """Scrape until `pred(metrics)` (rows are made after forwarding, so a scrape may come just before them)."""
    deadline = time.monotonic() + timeout
    while True:
        m = _metrics(status)
        if pred(m):
            return m
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.1)


def test_requests_seen_counts_open_connections_and_never_goes_back(proxied_kafka, topic_name):
    status = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(KAFKATAP + ["proxy", "--route", proxied_kafka.route, "--workers", "2",
                                        "--status-addr", status],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(proxied_kafka.proxy_port, proc)
        producer = KafkaProducer(bootstrap_servers=proxied_kafka.listen, acks=1, linger_ms=0)
        try:
            for n in range(30):
                producer.send(topic_name, f"m{n}".encode()).get(timeout=30)
            # the producer's connections are open: before, only closed ones counted (the produce requests not)
            live = _wait_metrics(status, lambda m: _total(m, "kafkatap_request_rows_total") >= 30, "30 rows")
            assert _total(live, "kafkatap_open_connections") >= 1
            seen = _total(live, "kafkatap_requests_seen_total")
            rows = _total(live, "kafkatap_request_rows_total")
            assert seen >= rows >= 30
            # request_rows_total is the relay's count of what /metrics' own per-API counts saw
            assert rows <= _total(live, "kafkatap_requests_total")
        finally:
            producer.close(timeout=10)
        done = _wait_metrics(status, lambda m: _total(m, "kafkatap_open_connections") == 0, "every connection closed")
        after = _total(done, "kafkatap_requests_seen_total")
        assert after >= seen  # a closing connection's requests move from open to closed: the counter never drops
        dropped = _total(done, "kafkatap_requests_dropped_total")
        assert after == _total(done, "kafkatap_request_rows_total") + dropped == _total(done, "kafkatap_requests_total")
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.mark.parametrize("option", [["--workers", "2"], ["--workers", "1", "--no-tcp-info"]],
                         ids=["two-workers", "no-tcp-info"])
def test_a_client_waiting_on_its_first_answer_is_named_in_clients(proxied_kafka, option: list[str]):
    """Rows name a client once an answer ends its request: one stuck on its first (a broker that does not answer;
    here a fault's 60 s delay) showed as "-" in top, and without TCP_INFO samples not at all."""
    status = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(KAFKATAP + ["proxy", "--route", proxied_kafka.route, "--status-addr", status,
                                        "--fault", "latency=to-client:60000", *option],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(proxied_kafka.proxy_port, proc)
        with socket.create_connection(("127.0.0.1", proxied_kafka.proxy_port), timeout=10) as client:
            msg = message_class(API_VERSIONS, True)(version=3, client_software_name="stuck-sw",
                                                    client_software_version="1.0")
            msg.with_header(correlation_id=1, client_id="stuck-client")
            client.sendall(bytes(msg.encode(version=3, header=True, framed=True)))
            deadline = time.monotonic() + 30
            while True:  # a subprocess's endpoint: polled (the request crosses the relay first)
                with urllib.request.urlopen(f"http://{status}/clients", timeout=10) as resp:
                    doc = json.load(resp)
                named = [c for c in doc["clients"] if c["client_id"] == "stuck-client"]
                if named:
                    break
                assert time.monotonic() < deadline, doc
                time.sleep(0.1)
            (c,) = named
            assert c["open"] and c["requests"] == 0 and c["software"] == "stuck-sw", c  # no answer yet
            assert c["client_addr"] == "%s:%d" % client.getsockname() and c["bytes_from_client"] > 0
            # /metrics counts it too, and reading /clients again changes no count (no TCP_INFO sample counted it)
            opened = [_total(_metrics(status), name) for name in ("kafkatap_open_connections", "kafkatap_connections_total")]
            assert opened[0] >= 1, opened
            urllib.request.urlopen(f"http://{status}/clients", timeout=10).read()
            assert [_total(_metrics(status), n) for n in ("kafkatap_open_connections", "kafkatap_connections_total")] == opened
    finally:
        proc.terminate()
        proc.wait(60)
