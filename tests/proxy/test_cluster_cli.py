"""`kafkatap proxy` as a user runs it, against a broker with default advertised.listeners (issue 15).

* Plain explicit mode (what `kafka up` used to suggest): clients are sent to the
  broker directly. The proxy must say so: one log line naming the address and
  what to do, `/metrics`, `top`, the recording's `bypass` column, and the
  report's finding.
* Cluster mode (what `kafka up` suggests now): the same clients stay on the
  proxy, and every record they produce is in the recording.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from cluster_helpers import CliProxy, free_port_run, kcat_brokers
from harness.kafka import free_port

pytestmark = [pytest.mark.kafka]

def _produce(bootstrap: str, topic: str, n: int) -> None:
    from kafka import KafkaProducer

    prod = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i in range(n):
        prod.send(topic, b"v%d" % i)
    prod.flush(30)
    prod.close()


def _requests(rec: Path) -> list[dict]:
    return ds.dataset(rec / "requests", format="parquet", partitioning="hive").to_table().to_pylist()


@pytest.mark.spark
@pytest.mark.slow
def test_explicit_mode_warns_loudly_when_clients_bypass_the_proxy(kafka_broker, topic_name, tmp_path) -> None:
    listen, status = free_port(), free_port()
    broker = f"127.0.0.1:{kafka_broker.port}"
    rec = tmp_path / "rec"
    p = CliProxy(["--listen", f"127.0.0.1:{listen}", "--upstream", broker, "--record", str(rec)], status, tmp_path)
    try:
        assert [(h, port) for _, h, port in kcat_brokers(f"127.0.0.1:{listen}")] == [("127.0.0.1", kafka_broker.port)]
        _produce(f"127.0.0.1:{listen}", topic_name, 20)  # goes straight to the broker after its first Metadata
        warn = p.wait_log(lambda e: "around the proxy" in str(e.get("event")))
        assert warn["addresses"] == [broker] and warn["level"] == "warning"
        assert "--cluster" in warn["event"] and "advertised.listeners" in warn["event"]
        text = p.metrics()
        assert 'kafkatap_bypass_advertised_total{proxy="' in text and f'address="{broker}"}}' in text
        top = subprocess.run([sys.executable, "-m", "kafkatap.cli", "top", "--addr", f"127.0.0.1:{status}", "--once"],
                             capture_output=True, text=True, timeout=60)
        assert top.returncode == 0, top.stderr
        assert "BYPASS" in top.stdout and broker in top.stdout
    finally:
        lines = p.stop()
    # one line per address, however many clients asked
    assert sum("around the proxy" in str(e.get("event")) for e in lines) == 1
    rows = _requests(rec)
    assert not [r for r in rows if r["api_name"] == "Produce"]  # the proof: the records went around the proxy
    bypass = [r for r in rows if r["bypass"]]
    assert bypass and all(r["bypass"] == [broker] and r["advertised"] for r in bypass)
    assert {r["api_name"] for r in bypass} <= {"Metadata", "FindCoordinator", "DescribeCluster"}
    # and the report says it first
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "kafkatap.cli", "analyze", str(rec), "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    findings = json.loads((out / "findings.json").read_text())
    items = findings["findings"] if isinstance(findings, dict) else findings
    first = items[0]
    assert first["id"] == "clients_bypass_proxy" and broker in first["title"], [f["id"] for f in items]
    assert "clients_bypass_proxy" in (out / "report.html").read_text()


def test_two_workers_log_one_warning_per_address(kafka_broker, tmp_path) -> None:
    """Both workers relay the broker's own address (the kernel spreads kcat's connections over them); one line says so."""
    from proxy.live import parse_metrics

    listen, status = free_port(), free_port()
    broker = f"127.0.0.1:{kafka_broker.port}"
    p = CliProxy(["--listen", f"127.0.0.1:{listen}", "--upstream", broker], status, tmp_path, workers=2)
    try:
        workers: set = set()
        runs = 0
        while len(workers) < 2 and runs < 40:  # SO_REUSEPORT hashes each connection to a worker
            kcat_brokers(f"127.0.0.1:{listen}")
            runs += 1
            clients = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{status}/clients", timeout=5).read())
            workers = {c.get("worker") for c in clients["clients"]}
        assert len(workers) == 2, f"one worker served all {runs} connections"
        deadline = time.monotonic() + 30
        seen = 0.0
        while seen < runs and time.monotonic() < deadline:  # every kcat's Metadata answer counted, by its worker
            seen = sum(v for _, v in parse_metrics(p.metrics()).get("kafkatap_bypass_advertised_total", []))
            time.sleep(0.05)  # a subprocess's counters: no event to await
        assert seen >= runs
    finally:
        lines = p.stop()
    warned = [e for e in lines if "around the proxy" in str(e.get("event"))]
    assert len(warned) == 1 and warned[0]["addresses"] == [broker], warned


@pytest.mark.parametrize("workers", [1, 2])
def test_cluster_mode_cli_records_everything_and_never_warns(kafka_broker, topic_name, tmp_path, workers) -> None:
    """With --workers 2 each worker discovers the brokers and binds their listeners with SO_REUSEPORT."""
    listen, status = free_port_run(3), free_port()
    rec = tmp_path / "rec"
    p = CliProxy(["--cluster", f"127.0.0.1:{kafka_broker.port}", "--listen", f"127.0.0.1:{listen}",
                  "--record", str(rec)], status, tmp_path, workers=workers)
    try:
        p.wait_log(lambda e: e.get("event") == "cluster discovered", count=workers)
        assert kcat_brokers(f"127.0.0.1:{listen}") == [(1, "127.0.0.1", listen + 2)]
        _produce(f"127.0.0.1:{listen}", topic_name, 20)
        deadline = time.monotonic() + 30
        while "kafkatap_cluster_rewritten_responses_total" not in p.metrics():
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        lines = p.stop()
    assert not any("around the proxy" in str(e.get("event")) for e in lines)
    rows = _requests(rec)
    produced = [r for r in rows if r["api_name"] == "Produce" and topic_name in (r["topics"] or [])]
    # the topic is auto-created: a batch racing its leader is refused and sent again, so count what was taken
    assert sum(r["records"] for r in produced if r["status"] == "answered" and not r["error_count"]) == 20
    assert {r["edit"] for r in rows if r["api_name"] == "Metadata" and r["status"] == "answered"} == {
        "rewrite addresses 1"}
    assert not any(r["bypass"] for r in rows)
