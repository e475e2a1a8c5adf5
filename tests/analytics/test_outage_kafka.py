"""A real broker stopped and started again on its port while kafka-python producers keep trying through a recording
proxy: `analyze` names the outage once (broker_unreachable, with its stretch, the closes before it and the return),
gives the broker's closes that cause, and makes no reconnect storm or connection surge of the refused connects."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka import KafkaProducer

from analytics.job import run_analysis, summary
from harness.kafka import LocalKafka, free_port
from proxy.running import RunningProxy
from recording.reader import read_recording
from recording.writer import ParquetRecorder

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]


class OutageBroker:
    """A broker of this module's own (the tests stop it), advertising the proxy's port: clients stay on the proxy."""

    def __init__(self) -> None:
        self.proxy_port = free_port()
        self.kafka = LocalKafka(broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.proxy_port}"})
        self.route = f"127.0.0.1:{self.proxy_port}=127.0.0.1:{{port}}"


@pytest.fixture(scope="module")
def outage_broker() -> Iterator[OutageBroker]:
    b = OutageBroker()
    b.kafka.start()
    try:
        yield b
    finally:
        b.kafka.stop()
        b.kafka.cleanup()


def wait_for(pred: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """The proxy's counters have no event to await from this thread: poll them, briefly."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.05)


def test_a_broker_restart_is_one_outage_not_a_storm_nor_a_surge(outage_broker, spark, tmp_path: Path) -> None:
    kafka, record = outage_broker.kafka, tmp_path / "rec"
    topic = "outage-orders"
    rec = ParquetRecorder(record, "outage", flush_interval_s=0.2, fsync=False).start()  # the proxy closes it
    with RunningProxy([outage_broker.route.format(port=kafka.port)], sink=rec, proxy_id="outage") as proxy:
        kafka.create_topic(topic)  # the broker advertises the proxy: its admin client needs the proxy up
        producers = [KafkaProducer(bootstrap_servers=f"127.0.0.1:{outage_broker.proxy_port}", acks=1, linger_ms=0,
                                   client_id=f"outage-{n}", reconnect_backoff_ms=50, reconnect_backoff_max_ms=200,
                                   request_timeout_ms=60_000, retries=1_000) for n in range(3)]
        for p in producers:
            p.send(topic, b"before").get(timeout=60)
        stopped_s = time.time()
        kafka.stop()
        pending = [p.send(topic, b"while down") for p in producers]  # the producers keep trying to reach it
        wait_for(lambda: proxy.server.stats["connect_failed"] >= 30, "refused connects through the proxy")
        kafka.restart()
        for f in pending:
            f.get(timeout=90)  # delivered once the broker is back
        for p in producers:
            p.send(topic, b"after").get(timeout=60)
            p.close(timeout=10)

    rows = read_recording(record, "connections").to_pylist()
    finals = [r for r in rows if r["final"]]
    refused = [r for r in finals if r["end_reason"] == "upstream_connect_failed"]
    closed = [r for r in finals if r["end_reason"] in ("broker_fin", "broker_rst")]
    assert len(refused) >= 30 and all(r["end_detail"].startswith("refused:") for r in refused), refused[:3]
    assert len(closed) >= 3, closed  # each producer's connection(s) to the broker, closed as it stopped

    res = run_analysis([record], tmp_path / "out", spark=spark, progress=False)
    found = res.by_id("broker_unreachable")
    assert len(found) == 1, [f.title for f in res.findings]
    e = found[0].evidence
    assert e["attempts"] == len(refused) and e["failure_kinds"] == ["refused"] and e["broker_closes_before"] == len(closed)
    first_try = min(r["opened_ns"] for r in refused)  # read back as a timestamp
    assert stopped_s <= first_try.timestamp() and e["first_failure"] < e["back_at"] and e["last_failure"] < e["back_at"]
    assert found[0].severity == "critical" and "went away" in found[0].summary
    assert not res.by_id("reconnect_storm") and not res.by_id("connection_surge"), [f.title for f in res.findings]
    # the closes the proxy gave no cause get the outage's; one it did give is kept — a connection the stopping broker
    # accepted and then reset under its first request ("broker reset the connection … broker restart, crash …")
    # happens when a producer reconnects in the moment the broker is going down
    by_close = {r["conn_id"]: r["inferred_cause"] for r in res.tables["broker_closes"]}
    outage = {c for c in by_close.values() if c.startswith("broker went away: it refused new connections from ")}
    kept = {cid for cid, c in by_close.items() if c not in outage}
    assert len(outage) == 1 and len(kept) < len(by_close), by_close
    own = {r["conn_id"]: r["inferred_cause"] for r in closed}
    assert all(own[cid] and "broker restart" in own[cid] and by_close[cid] == own[cid] for cid in kept), (kept, own)
    facts = {r["conn_id"]: r["inferred_cause"] for r in res.tables["connection_facts"]}  # the pages of referenced connections
    shown = [(facts[r["conn_id"]], by_close[r["conn_id"]]) for r in closed if r["conn_id"] in facts]
    assert shown and all(page == table for page, table in shown), shown
    assert f"({len(refused):,} of them connects the broker refused or never answered" in summary(res)
    assert 0 < sum(r["connections"] for r in res.tables["connection_lifetimes"]) <= res.overview["connections"] - len(refused)
    recon = res.tables["reconnects_by_client"]
    ids = {r["client_id"] for r in recon}
    assert "(none)" not in ids and {f"outage-{n}" for n in range(3)} <= ids, ids  # no failed connect is a client's
    assert sum(r["closed_by_broker"] for r in recon) == len(closed)
