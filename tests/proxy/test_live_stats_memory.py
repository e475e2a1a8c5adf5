"""The live stats forget closed connections as they close, whoever scrapes (no network)."""

from __future__ import annotations

import pytest

import proxy.metrics as metrics
from proxy.metrics import CLOSED_RETENTION_S, LiveStats


def _conn(stats: LiveStats, cid: str, final: bool) -> None:
    stats.connection({"conn_id": cid, "client_addr": "127.0.0.1:5000", "broker_addr": "127.0.0.1:9092",
                      "final": final, "end_reason": "client_fin" if final else None, "end_by": "client"})


def test_closed_connections_are_forgotten_with_only_metrics_scraped(monkeypatch: pytest.MonkeyPatch) -> None:
    """prune() ran only for /clients: a proxy scraped by Prometheus alone kept every closed connection for its
    life (100,000 health checks: ~138 MiB)."""
    now = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: now[0])
    stats = LiveStats("p")
    for i in range(500):
        _conn(stats, f"c{i}", False)
        _conn(stats, f"c{i}", True)
    _conn(stats, "open-one", False)
    stats.render_prometheus()
    assert len(stats.clients) == 501  # closed ones stay visible for CLOSED_RETENTION_S
    now[0] += CLOSED_RETENTION_S + 1
    _conn(stats, "late", False)
    _conn(stats, "late", True)  # any close prunes what is past retention
    stats.render_prometheus()
    assert set(stats.clients) == {"open-one", "late"}
    assert stats.clients_json()["open_connections"] == 1


def test_clients_name_topic_ids_learned_after_the_row_left() -> None:
    """With --workers the answer naming an id can pass through another worker: the row left with the id, and
    /clients (and `top`) showed the uuid beside the name for good. The map is asked again at each render."""
    tid = "8f4c9b1e-1111-4000-8000-000000000001"
    learned: dict[str, str] = {}
    stats = LiveStats("p")
    stats.topic_name = learned.get
    _conn(stats, "c1", False)
    for topics in ([tid], ["orders"]):
        stats.request({"conn_id": "c1", "api_name": "Produce", "api_key": 0, "topics": topics, "status": "ok",
                       "latency_us": 100, "errors": []})
    (client,) = stats.clients_json()["clients"]
    assert client["topics"] == sorted([tid, "orders"])  # not known yet: the id is all there is
    learned[tid] = "orders"
    (client,) = stats.clients_json()["clients"]
    assert client["topics"] == ["orders"]


def test_clients_show_the_bytes_of_connections_never_decoded() -> None:
    """--no-decode, TLS passed through, opaque streams: no request rows, so /clients and `top` showed 0 B for a
    connection that carried 200 kB. The connection rows' own counts are the floor."""
    stats = LiveStats("p")
    stats.connection({"conn_id": "c1", "client_addr": "127.0.0.1:5000", "broker_addr": "127.0.0.1:9092",
                      "final": False, "opaque": True, "bytes_from_client": 200_003, "bytes_from_broker": 7})
    (client,) = stats.clients_json()["clients"]
    assert (client["bytes_from_client"], client["bytes_from_broker"]) == (200_003, 7)
    stats.request({"conn_id": "c1", "api_name": "Produce", "api_key": 0, "status": "ok", "latency_us": 1,
                   "errors": [], "request_bytes": 10, "response_bytes": 5})
    (client,) = stats.clients_json()["clients"]
    assert (client["bytes_from_client"], client["bytes_from_broker"]) == (200_013, 12)  # rows add on top
