"""Row builders for analytics tests: one request / connection row with sensible defaults."""

from __future__ import annotations

import datetime as dt
from typing import Any

# Which rules diagnose which incident of docs/incidents.md (the end-to-end test and the docs test both hold to it).
INCIDENT_RULES: dict[int, set[str]] = {
    1: {"broker_closed_after_acks0_produce", "produce_rejected_too_large"},
    2: {"idle_resets_not_from_broker", "reconnect_storm"},
    3: {"client_inventory"},
    4: {"connection_surge"},
    5: {"window_scaling_off"},
}

T0 = int(dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.timezone.utc).timestamp()) * 1_000_000_000
S = 1_000_000_000


def req(conn: str, cid: int, api: str = "Produce", t_s: float = 0.0, lat_us: int | None = 1000, client: str = "app-1",
        broker: str = "10.0.0.1:9092", topics: list[str] | None = None, **kw: Any) -> dict[str, Any]:
    """One request row: sensible defaults, timestamps derived from t_s and lat_us."""
    keys = {"Produce": 0, "Fetch": 1, "Metadata": 3, "ApiVersions": 18, "JoinGroup": 11, "Heartbeat": 12, "CreateTopics": 19}
    start = T0 + int(t_s * S)
    row: dict[str, Any] = {
        "proxy_id": "p1", "conn_id": conn, "correlation_id": cid, "api_key": keys.get(api, 3), "api_name": api, "api_version": 9,
        "client_id": client, "client_addr": "10.1.0.5:40000", "broker_addr": broker, "status": "answered", "answered": True,
        "request_bytes": 500, "response_bytes": 100, "req_first_ns": start, "req_last_ns": start, "req_sent_ns": start,
        "topics": topics if topics is not None else (["orders"] if api in ("Produce", "Fetch") else []),
        "records": 10 if api == "Produce" else 0, "record_bytes": 400 if api in ("Produce", "Fetch") else 0,
        "acks": -1 if api == "Produce" else None, "errors": [], "error_count": 0, "throttle_ms": 0,
        "proxy_req_delay_us": 10, "proxy_resp_delay_us": 10,
    }
    if lat_us is not None:
        row.update(resp_first_ns=start + lat_us * 1000, resp_last_ns=start + lat_us * 1000, resp_sent_ns=start + lat_us * 1000,
                   latency_us=lat_us, broker_latency_us=lat_us - 20)
    else:
        row.update(status="unanswered", answered=False)
    row.update(kw)
    return row


def conn(conn_id: str, opened_s: float, closed_s: float | None, client: str = "app-1", broker: str = "10.0.0.1:9092",
         end_reason: str = "client_fin", end_by: str = "client", idle_ms: int | None = 10, **kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "proxy_id": "p1", "conn_id": conn_id, "final": closed_s is not None, "snapshot_ns": T0 + int((closed_s or opened_s) * S),
        "client_addr": kw.pop("client_addr", "10.1.0.5:40000"), "broker_addr": broker, "opened_ns": T0 + int(opened_s * S),
        "closed_ns": T0 + int(closed_s * S) if closed_s is not None else None,
        "duration_us": int(((closed_s or opened_s) - opened_s) * 1e6), "client_ids": [client],
        "end_reason": end_reason if closed_s is not None else "open", "end_by": end_by if closed_s is not None else "none",
        "idle_before_end_ms": idle_ms, "unanswered": 0, "requests": 1, "responses": 1, "bytes_from_client": 1000, "bytes_from_broker": 1000,
    }
    row.update(kw)
    return row
