"""`kafkatap analyze` of a recording with errors kafkatap injected: they are not reported as the broker's.

An audit found 57 injected NOT_LEADER_OR_FOLLOWER reported as a warning hot spot ("not a burst it rode
out") and counted in the summary's retriable rate: read as a broker in trouble. Here a real `kafkatap
proxy` injects that error on one topic's Produce for a kafka-python producer, records, and a real
`kafkatap analyze` must leave them out of the hot spots and the rates, list them apart in the errors
table, and still report them in the faults section.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harness.kafka import free_port
from protocol.error_kinds import RETRIABLE, error_kind
from test_kafka_faults import KAFKATAP, _cli_proxy

pytestmark = [pytest.mark.kafka]
NLOF = "NOT_LEADER_OR_FOLLOWER"
MESSAGES = 30


def test_injected_errors_are_no_broker_hotspot_nor_in_the_error_rates(proxied_kafka, topic_name, tmp_path: Path) -> None:
    from kafka import KafkaProducer

    rec, out = tmp_path / "rec", tmp_path / "out"
    proc = _cli_proxy(proxied_kafka, free_port(), "--record", str(rec), "--proxy-id", "inj",
                      "--fault", f"error=Produce:{NLOF},topic={topic_name},nth=2")
    try:
        proxied_kafka.kafka.create_topic(topic_name, partitions=1)  # the broker advertises the proxy: after its start
        prod = KafkaProducer(bootstrap_servers=f"127.0.0.1:{proxied_kafka.proxy_port}", client_id="kp-prod-orders",
                             acks=1, linger_ms=0, retries=100, retry_backoff_ms=20)
        for i in range(MESSAGES):
            prod.send(topic_name, f"m{i}".encode()).get(timeout=30)  # one Produce each; every 2nd is refused
        prod.close()
    finally:
        proc.terminate()
        assert proc.wait(60) == 0, proc.stderr.read()[-3000:]  # a clean stop flushes the recording

    rows = pq.read_table(rec / "requests").to_pylist()
    injected = [r for r in rows if (r.get("edit") or "").startswith("fault#1 ")]
    assert len(injected) >= MESSAGES // 2 - 1 and all([e["name"] for e in r["errors"]] == [NLOF] for r in injected)
    broker_retriable = sum(1 for r in rows if not r.get("edit") and any(
        error_kind(r["api_name"], e["name"]) == RETRIABLE for e in r.get("errors") or ()))

    res = subprocess.run(KAFKATAP + ["analyze", str(rec), "--out", str(out), "-q", "--no-csv"], capture_output=True,
                         text=True, timeout=600, env=dict(os.environ))
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "findings.json").read_text())
    hotspots = [f for f in report["findings"] if f["id"] == "error_hotspot"]
    assert not [f for f in hotspots if NLOF in f["title"]], hotspots  # kafkatap's own errors are no broker hot spot
    assert any(f["id"] == "kafka_fault_reactions" and NLOF in f["title"] for f in report["findings"]), \
        [f["title"] for f in report["findings"]]  # the faults section still tells them
    ov = report["overview"]
    assert ov["requests_retriable"] == broker_retriable < len(injected)  # the rates are the broker's errors only
    assert ov["retriable_rate"] == round(broker_retriable / ov["requests"], 5)
    table = pq.read_table(out / "tables" / "errors_by_name.parquet").to_pylist()
    listed = sum(r["count"] for r in table if r["injected"] and r["error_name"] == NLOF)
    assert listed == len(injected)  # listed apart, reconciling with the recorded rows
    assert f"+{broker_retriable / ov['requests']:.3%} retriable" in res.stdout, res.stdout
