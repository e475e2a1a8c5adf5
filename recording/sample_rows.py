"""Synthetic rows shaped like the relay's, for recorder tests and the recording benchmark.

Why here and not in tests/: the benchmark (bench/recording_cost.py), the tests
and anyone checking the on-disk size need the *same* "typical produce/fetch
mix", so bytes-per-row figures are comparable. The shapes follow
`recording.schema` exactly (keys = column names, absent keys = null), with the
jitter a real session has (timestamps, sizes, sessions), because perfectly
regular rows would compress unrealistically well.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

Row = dict[str, Any]

_TOPICS = ["orders", "payments", "clicks", "inventory", "audit-log"]
_TOPIC_IDS = {t: str(uuid.UUID(int=random.Random(t).getrandbits(128))) for t in _TOPICS}


class SessionMix:
    """A deterministic stream of request rows: ~48 % Produce, ~47 % Fetch, the rest metadata/group APIs.

    A handful of long-lived connections (producers and consumers) with
    monotonically increasing correlation ids, as a real client pool produces.
    """

    def __init__(self, proxy_id: str = "p1", connections: int = 24, seed: int = 7, start_ns: int | None = None,
                 rate_per_s: float = 20_000.0) -> None:
        self.rng = random.Random(seed)
        self.proxy_id = proxy_id
        self.now_ns = start_ns if start_ns is not None else time.time_ns()
        self.step_ns = int(1e9 / rate_per_s)
        self.conns = []
        for i in range(connections):
            role = "producer" if i % 2 == 0 else "consumer"
            self.conns.append({
                "conn_id": f"c{i:05d}",
                "role": role,
                "client_id": f"{role}-{i % 6}",
                "client_addr": f"10.0.{i % 4}.{10 + i}:{40000 + i * 7}",
                "broker_addr": f"10.1.0.{1 + i % 3}:9092",
                "corr": self.rng.randrange(1, 1000),
                "topic": _TOPICS[i % len(_TOPICS)],
                "session": self.rng.randrange(1, 2**31),
                "epoch": 1,
            })

    def rows(self, n: int) -> list[Row]:
        return [self.next_row() for _ in range(n)]

    def __iter__(self) -> Iterator[Row]:
        while True:
            yield self.next_row()

    def next_row(self) -> Row:
        rng = self.rng
        c = self.conns[rng.randrange(len(self.conns))]
        self.now_ns += self.step_ns + rng.randrange(-self.step_ns // 2, self.step_ns // 2 + 1)
        c["corr"] += 1
        r = rng.random()
        if r < 0.05:
            return self._misc(c, rng)
        if c["role"] == "producer":
            return self._produce(c, rng)
        return self._fetch(c, rng)

    def _base(self, c: dict, api_key: int, api_name: str, version: int, req_bytes: int, resp_bytes: int,
              broker_us: int) -> Row:
        first = self.now_ns
        last = first + self.rng.randrange(1_000, 30_000)
        sent = last + self.rng.randrange(3_000, 25_000)
        rfirst = sent + broker_us * 1000
        rlast = rfirst + self.rng.randrange(1_000, 20_000)
        rsent = rlast + self.rng.randrange(3_000, 25_000)
        return {
            "proxy_id": self.proxy_id, "conn_id": c["conn_id"], "correlation_id": c["corr"],
            "api_key": api_key, "api_name": api_name, "api_version": version,
            "client_id": c["client_id"], "client_addr": c["client_addr"], "broker_addr": c["broker_addr"],
            "status": "answered", "answered": True,
            "request_bytes": req_bytes, "response_bytes": resp_bytes,
            "req_first_ns": first, "req_last_ns": last, "req_sent_ns": sent,
            "resp_first_ns": rfirst, "resp_last_ns": rlast, "resp_sent_ns": rsent,
            "latency_us": (rsent - first) // 1000, "broker_latency_us": (rfirst - sent) // 1000,
            "proxy_req_delay_us": (sent - last) // 1000, "proxy_resp_delay_us": (rsent - rlast) // 1000,
            "topics": [c["topic"]], "partitions": 1, "throttle_ms": 0, "error_count": 0, "errors": [],
        }

    def _produce(self, c: dict, rng: random.Random) -> Row:
        records = rng.randrange(1, 200)
        rb = records * rng.randrange(80, 120) + 61
        row = self._base(c, 0, "Produce", 9, rb + 90, 60, rng.randrange(300, 3000))
        row.update(acks=-1, timeout_ms=30000, batches=1, records=records, record_bytes=rb, compression="lz4",
                   producer_id=1000 + int(c["conn_id"][1:]), producer_epoch=0)
        if rng.random() < 0.002:
            row.update(error_count=1, errors=[{"code": 6, "name": "NOT_LEADER_OR_FOLLOWER", "topic": c["topic"],
                                              "partition": 0, "resource": None}])
        return row

    def _fetch(self, c: dict, rng: random.Random) -> Row:
        empty = rng.random() < 0.4
        fetched = 0 if empty else rng.randrange(1_000, 200_000)
        c["epoch"] += 1
        row = self._base(c, 1, "Fetch", 13, 120, 80 + fetched,
                         rng.randrange(400_000, 500_000) if empty else rng.randrange(200, 5000))
        row.update(topics=[_TOPIC_IDS[c["topic"]]], record_bytes=fetched, max_wait_ms=500, min_bytes=1,
                   max_bytes=52428800, isolation_level=0, fetch_session_id=c["session"],
                   fetch_session_epoch=c["epoch"])
        return row

    def _misc(self, c: dict, rng: random.Random) -> Row:
        kind = rng.choice(["Metadata", "Heartbeat", "OffsetCommit", "ApiVersions"])
        if kind == "Metadata":
            return self._base(c, 3, "Metadata", 12, 60, 900, rng.randrange(100, 800))
        if kind == "ApiVersions":
            row = self._base(c, 18, "ApiVersions", 3, 70, 450, rng.randrange(50, 300))
            row.update(topics=[], partitions=0, client_software_name="apache-kafka-java",
                       client_software_version="3.7.2")
            return row
        key = 12 if kind == "Heartbeat" else 8
        row = self._base(c, key, kind, 4 if key == 12 else 9, 90, 30, rng.randrange(100, 2000))
        row.update(group_id="billing", member_id=f"{c['client_id']}-{c['conn_id']}", generation_id=3)
        if key == 12:
            row.update(topics=[], partitions=0)
        return row


def connection_row(proxy_id: str, conn_id: str, final: bool = True, **extra: Any) -> Row:
    """One connection end (or snapshot) row with the usual facts filled."""
    now = time.time_ns()
    row: Row = {
        "proxy_id": proxy_id, "conn_id": conn_id, "final": final, "snapshot_ns": now,
        "listener": "127.0.0.1:19092", "mode": "explicit", "client_addr": "127.0.0.1:50000",
        "broker_addr": "127.0.0.1:9092", "opened_ns": now - 5_000_000_000, "upstream_connect_us": 250,
        "closed_ns": now if final else None, "duration_us": 5_000_000, "bytes_from_client": 1234,
        "bytes_from_broker": 5678, "frames_from_client": 10, "frames_from_broker": 10, "requests": 10,
        "responses": 10, "client_ids": ["app"], "tls": False, "opaque": False,
        "end_reason": "client_fin" if final else "open", "end_by": "client" if final else "none",
        "unanswered": 0,
        "tcp_client_open": {"wscale_ok": True, "snd_wscale": 7, "rcv_wscale": 7, "timestamps_ok": True,
                            "sack_ok": True, "rtt_us": 40, "rttvar_us": 20, "state": "ESTABLISHED"},
    }
    row.update(extra)
    return row


def tcp_row(proxy_id: str, conn_id: str, side: str = "client", phase: str = "open") -> Row:
    return {"proxy_id": proxy_id, "conn_id": conn_id, "side": side, "phase": phase, "ts_ns": time.time_ns(),
            "wscale_ok": True, "snd_wscale": 7, "rcv_wscale": 7, "timestamps_ok": True, "sack_ok": True,
            "rtt_us": 45, "rttvar_us": 12, "retrans_total": 0, "lost": 0, "snd_cwnd": 10, "snd_mss": 65483,
            "rcv_space": 65483, "delivery_rate_bps": 10**9, "bytes_acked": 1000, "bytes_received": 2000,
            "state": "ESTABLISHED"}


def frame_row(proxy_id: str, conn_id: str, api_key: int, data: bytes, direction: str = "request",
              api_version: int = 0, correlation_id: int = 1) -> Row:
    now = time.time_ns()
    return {"proxy_id": proxy_id, "conn_id": conn_id, "direction": direction, "ts_ns": now,
            "conn_offset_ns": 1000, "correlation_id": correlation_id, "api_key": api_key,
            "api_version": api_version, "client_addr": "127.0.0.1:50000", "broker_addr": "127.0.0.1:9092",
            "data": data}
