"""Synthetic recordings with exactly the recorder's schema and partition layout.

Tests and the scale benchmark need recordings before (and independently of) the
real recorder. Everything goes through `recording.schema.arrow_schema`, so a file
written here is indistinguishable in shape from a proxy's. Two entry points:

* `write_rows(root, dataset, rows)` — a handful of explicit rows (tests).
* `generate(root, n_requests)` — a realistic mix at scale, built column-wise
  with pyarrow.compute (no numpy on the proxy image), including one instance
  of every incident in docs/incidents.md so the findings have something to find.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recording import schema as rec
from recording.timestamps import from_epoch_ns, ingest_schema, timestamp_columns
from recording.layout import TIME_COLUMN, merged_name, new_run_id  # the recorder's partitioning column and file names
from recording.rollups import merge_hour, write_rollups

# files are named as a writer's compacted files are (one run, rising sequence numbers), so an hour's rollups
# merge as a proxy's do (recording.rollups.merge_hour)
RUN = new_run_id()
_SEQ = itertools.count(1)
NS = 1_000_000_000
HOUR_NS = 3600 * NS
_UTC_NS = pa.timestamp("ns", tz="UTC")


def write_table(root: str | Path, dataset: str, table: pa.Table, row_group_size: int = 1 << 20,
                rollups: bool = True) -> list[Path]:
    """Write `table` (the dataset's columns) Hive-partitioned proxy=/date=/hour=.

    Its timestamp columns may come as the proxy's rows carry them (int64 epoch ns, `ingest_schema`) or
    as a recording stores them (TIMESTAMP, e.g. a table read back from one), in any unit or time zone.
    A requests file gets its rollups beside it, as the proxy's final files do (`rollups=False`: a
    recording as an older proxy, or one with compaction off, left it).
    """
    schema = rec.arrow_schema(dataset)
    table = _epoch_ns(table.select(schema.names), dataset).cast(ingest_schema(dataset))  # as the proxy's rows
    ts = table.column(TIME_COLUMN[dataset])
    if dataset == "connections":
        ts = pc.coalesce(ts, table.column("opened_ns"))
    hour = pc.divide(pc.fill_null(ts, 0), pa.scalar(HOUR_NS, pa.int64()))
    keys = pa.table({"proxy": pc.fill_null(table.column("proxy_id"), "unknown"), "h": hour})
    written: list[Path] = []
    for key in keys.group_by(["proxy", "h"]).aggregate([]).to_pylist():
        mask = pc.and_(pc.equal(keys.column("proxy"), key["proxy"]), pc.equal(keys.column("h"), key["h"]))
        part = from_epoch_ns(table.filter(mask), dataset)  # on disk: timestamp[us, UTC], as the recorder writes
        start = dt.datetime.fromtimestamp(key["h"] * 3600, tz=dt.timezone.utc)
        d = Path(root) / dataset / f"proxy={key['proxy']}" / f"date={start:%Y-%m-%d}" / f"hour={start:%H}"
        d.mkdir(parents=True, exist_ok=True)
        seq = next(_SEQ)
        path = d / merged_name(RUN, seq, seq)
        pq.write_table(part.replace_schema_metadata(schema.metadata), path, row_group_size=row_group_size, compression="zstd")
        if dataset == "requests" and rollups:
            write_rollups(path, fsync=False)
        written.append(path)
    return written


def _epoch_ns(table: pa.Table, dataset: str) -> pa.Table:
    """The dataset's timestamp-typed columns as int64 epoch ns; integer ones are taken as epoch ns already.

    Why not cast straight to int64: that gives the count of the type's own unit, so a recording's
    timestamp[us] column would be read as nanoseconds, a thousand times too early (1970, not 2026).
    """
    for name in timestamp_columns(dataset):
        col = table.column(name)
        if pa.types.is_timestamp(col.type):
            table = table.set_column(table.schema.get_field_index(name), name, col.cast(_UTC_NS).cast(pa.int64()))
    return table


def write_rows(root: str | Path, dataset: str, rows: Iterable[Mapping[str, Any]]) -> list[Path]:
    """Write explicit rows (missing columns are null) — the tests' way to build a recording."""
    schema = ingest_schema(dataset)
    rows = [{name: r.get(name) for name in schema.names} for r in rows]
    if not rows:
        return []
    return write_table(root, dataset, pa.Table.from_pylist(rows, schema=schema))


def tcp_info(wscale: bool = True, rtt_us: int = 500, retrans: int = 0, timestamps: bool = True, sack: bool = True,
             bytes_acked: int = 0, bytes_received: int = 0, state: str = "ESTABLISHED") -> dict[str, Any]:
    """One TCP_INFO struct value as the recorder stores it."""
    return {
        "wscale_ok": wscale, "snd_wscale": 7 if wscale else 0, "rcv_wscale": 7 if wscale else 0,
        "timestamps_ok": timestamps, "sack_ok": sack, "rtt_us": rtt_us, "rttvar_us": rtt_us // 4,
        "retrans_total": retrans, "lost": 0, "snd_cwnd": 10, "snd_mss": 1448, "rcv_space": 65535 if not wscale else 262144,
        "delivery_rate_bps": None, "bytes_acked": bytes_acked, "bytes_received": bytes_received, "state": state,
    }


# ---------------------------------------------------------------- scale generator

APIS = {  # name -> (key, version)
    "Produce": (0, 9), "Fetch": (1, 13), "ListOffsets": (2, 7), "Metadata": (3, 12), "OffsetCommit": (8, 8),
    "OffsetFetch": (9, 8), "FindCoordinator": (10, 4), "JoinGroup": (11, 9), "Heartbeat": (12, 4),
    "SyncGroup": (14, 5), "ApiVersions": (18, 3), "CreateTopics": (19, 7), "DescribeConfigs": (32, 4),
    "InitProducerId": (22, 4),
}
ROLE_MIX = {
    "producer": [("Produce", 0.88), ("Metadata", 0.1), ("InitProducerId", 0.02)],
    "consumer": [("Fetch", 0.78), ("Heartbeat", 0.1), ("OffsetCommit", 0.07), ("Metadata", 0.03), ("OffsetFetch", 0.02)],
    "admin": [("Metadata", 0.5), ("DescribeConfigs", 0.3), ("ListOffsets", 0.15), ("CreateTopics", 0.05)],
}
SOFTWARE = [("apache-kafka-java", "3.7.0"), ("librdkafka", "2.4.0"), ("kafka-python", "3.0.0"), ("franz-go", "1.17.0")]
TOPIC_APIS = {"Produce", "Fetch", "ListOffsets", "OffsetCommit", "CreateTopics", "DescribeConfigs"}


@dataclass
class Conn:
    """One synthetic connection and everything needed to emit its requests and rows."""

    conn_id: str
    client_id: str
    client_addr: str
    broker: str
    role: str
    topics: list[str]
    opened: int
    closed: int | None
    n: int
    software: tuple[str, str]
    end_reason: str = "open"
    end_by: str = "none"
    idle_ms: int | None = None
    inferred: str | None = None
    last: dict[str, Any] = field(default_factory=dict)
    wscale: bool = True
    rtt_us: int = 400
    lat_mult_after: tuple[int, float] | None = None
    error_rate: float = 0.003
    throttle: bool = False


def _cast(arr: Any, t: pa.DataType) -> Any:
    """Cast dropping fractions (the generator works in floats, the schema in ints)."""
    return pc.cast(arr, t, safe=False)


def _rand(n: int, rng: random.Random) -> pa.DoubleArray:
    return pc.random(n, initializer=rng.getrandbits(62))


def _conn_requests(c: Conn, proxy: str, rng: random.Random) -> pa.Table:
    """All requests of one connection, vectorized; the first is ApiVersions."""
    k = c.n
    end = c.closed if c.closed is not None else c.opened + 1
    span = max(end - c.opened - NS // 10, k)
    idx = pa.array(range(k), pa.int64())
    u0, u1, u2, u3 = (_rand(k, rng) for _ in range(4))
    start = pc.add(_cast(pc.divide(pc.multiply(pc.add(_cast(idx, pa.float64()), pc.multiply(u0, 0.9)), span), k), pa.int64()), c.opened)
    # api choice by thresholds on u1
    mix = ROLE_MIX[c.role]
    choice = pa.repeat(pa.scalar(0, pa.int32()), k)
    acc = 0.0
    for i, (_, w) in enumerate(mix[:-1]):
        acc += w
        choice = pc.add(choice, _cast(pc.greater(u1, acc), pa.int32()))
    names = pa.array([m[0] for m in mix])
    api_name = pc.take(names, choice)
    if k:
        api_name = pa.concat_arrays([pa.array(["ApiVersions"]), api_name.slice(1)])
    key = pc.take(pa.array([APIS[m[0]][0] for m in mix] + [18], pa.int16()), choice)
    ver = pc.take(pa.array([APIS[m[0]][1] for m in mix] + [3], pa.int16()), choice)
    is_av = pc.equal(api_name, "ApiVersions")
    key = pc.if_else(is_av, pa.scalar(18, pa.int16()), key)
    ver = pc.if_else(is_av, pa.scalar(3, pa.int16()), ver)
    is_produce = pc.equal(api_name, "Produce")
    is_fetch = pc.equal(api_name, "Fetch")
    # broker latency: heavy-tailed around 1-3 ms; fetch long polls wait max_wait
    base = pc.add(pc.multiply(pc.power(u2, 6.0), 40_000.0), pc.add(pc.multiply(u3, 1500.0), 300.0))
    if c.lat_mult_after is not None:
        t0, mult = c.lat_mult_after
        base = pc.multiply(base, pc.if_else(pc.greater(start, t0), mult, 1.0))
    empty_fetch = pc.and_(is_fetch, pc.less(u0, 0.35))
    broker_lat = _cast(pc.if_else(empty_fetch, pc.add(pc.multiply(u3, 3000.0), 500_000.0), base), pa.int64())
    proxy_req = _cast(pc.add(pc.multiply(u2, 60.0), 15.0), pa.int64())
    proxy_resp = _cast(pc.add(pc.multiply(u3, 60.0), 20.0), pa.int64())
    batch = _cast(pc.add(pc.multiply(pc.power(u3, 3.0), 60_000.0), 300.0), pa.int64())
    req_bytes = _cast(pc.if_else(is_produce, pc.add(batch, 120), pa.scalar(90 + c.n % 40, pa.int64())), pa.int32())
    fetched = pc.if_else(pc.and_(is_fetch, pc.invert(empty_fetch)), pc.multiply(batch, 4), pa.scalar(0, pa.int64()))
    resp_bytes = _cast(pc.add(fetched, pc.if_else(is_fetch, 80, 60)), pa.int32())
    req_last = pc.add(start, _cast(pc.divide(req_bytes, 50), pa.int64()))
    req_sent = pc.add(req_last, pc.multiply(proxy_req, 1000))
    resp_first = pc.add(req_sent, pc.multiply(broker_lat, 1000))
    # response transfer time: ~100 MB/s normally; without window scaling 64 KiB per RTT (incident 5)
    rate = 100e6 if c.wscale else 65535 / (c.rtt_us / 1e6) * 0.95
    resp_last = pc.add(resp_first, _cast(pc.multiply(resp_bytes, 1e9 / rate), pa.int64()))
    resp_sent = pc.add(resp_last, pc.multiply(proxy_resp, 1000))
    latency = pc.divide(pc.subtract(resp_sent, start), 1000)
    topic_idx = _cast(pc.floor(pc.multiply(u1, len(c.topics) * 0.9999)), pa.int32())
    topic = pc.take(pa.array(c.topics), topic_idx)
    has_topic = pc.is_in(api_name, pa.array(sorted(TOPIC_APIS)))
    topic_counts = _cast(has_topic, pa.int32())
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(topic_counts)])
    topics = pa.ListArray.from_arrays(offsets, topic.filter(has_topic))
    # errors
    err_mask = pc.less(u2, c.error_rate) if c.error_rate else pa.repeat(pa.scalar(False), k)
    err_mask = pc.and_(err_mask, pc.invert(is_av))
    err_topics = topic.filter(err_mask)
    err_names = pc.if_else(pc.equal(api_name.filter(err_mask), "Fetch"), "OFFSET_OUT_OF_RANGE", "NOT_LEADER_OR_FOLLOWER")
    err_codes = pc.if_else(pc.equal(err_names, "OFFSET_OUT_OF_RANGE"), pa.scalar(1, pa.int16()), pa.scalar(6, pa.int16()))
    n_err = len(err_topics)
    err_struct = pa.StructArray.from_arrays(
        [err_codes, err_names, err_topics, pa.repeat(pa.scalar(0, pa.int32()), n_err), pa.nulls(n_err, pa.string())],
        fields=list(rec.ERROR_STRUCT),
    )
    eoff = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(_cast(err_mask, pa.int32()))])
    errors = pa.ListArray.from_arrays(eoff, err_struct)
    acks = pc.if_else(is_produce, pa.scalar(-1 if c.n % 3 else 1, pa.int8()), pa.scalar(None, pa.int8()))
    recs = pc.if_else(is_produce, pc.add(pc.divide(batch, 200), 1), pa.scalar(0, pa.int64()))
    throttle = pc.if_else(pc.less(u0, 0.2), pa.scalar(120 if c.throttle else 0, pa.int32()), pa.scalar(0, pa.int32()))
    rep = lambda v, t=pa.string(): pa.repeat(pa.scalar(v, t), k)  # noqa: E731
    cols: dict[str, Any] = {
        "proxy_id": rep(proxy), "conn_id": rep(c.conn_id), "correlation_id": _cast(idx, pa.int32()),
        "api_key": key, "api_name": api_name, "api_version": ver, "client_id": rep(c.client_id),
        "client_addr": rep(c.client_addr), "broker_addr": rep(c.broker), "status": rep("answered"),
        "answered": rep(True, pa.bool_()), "request_bytes": req_bytes, "response_bytes": resp_bytes,
        "req_first_ns": start, "req_last_ns": req_last, "req_sent_ns": req_sent, "resp_first_ns": resp_first,
        "resp_last_ns": resp_last, "resp_sent_ns": resp_sent, "latency_us": _cast(latency, pa.int64()),
        "broker_latency_us": broker_lat, "proxy_req_delay_us": proxy_req, "proxy_resp_delay_us": proxy_resp,
        "acks": acks, "timeout_ms": pc.if_else(is_produce, pa.scalar(30000, pa.int32()), pa.scalar(None, pa.int32())),
        "topics": topics, "partitions": topic_counts, "batches": _cast(is_produce, pa.int32()), "records": recs,
        "record_bytes": pc.if_else(is_produce, batch, fetched),
        "compression": pc.if_else(is_produce, pa.scalar(["lz4", "zstd", "none", "snappy"][c.n % 4]), pa.scalar(None, pa.string())),
        "max_wait_ms": pc.if_else(is_fetch, pa.scalar(500, pa.int32()), pa.scalar(None, pa.int32())),
        "min_bytes": pc.if_else(is_fetch, pa.scalar(1, pa.int32()), pa.scalar(None, pa.int32())),
        "max_bytes": pc.if_else(is_fetch, pa.scalar(52428800, pa.int32()), pa.scalar(None, pa.int32())),
        "group_id": rep(c.client_id.rsplit("-", 1)[0] + "-group" if c.role == "consumer" else None),
        "client_software_name": pc.if_else(is_av, pa.scalar(c.software[0]), pa.scalar(None, pa.string())),
        "client_software_version": pc.if_else(is_av, pa.scalar(c.software[1]), pa.scalar(None, pa.string())),
        "throttle_ms": throttle, "error_count": _cast(_cast(err_mask, pa.int32()), pa.int16()), "errors": errors,
    }
    schema = ingest_schema("requests")
    arrays = [cols[n] if n in cols else pa.nulls(k, schema.field(n).type) for n in schema.names]
    return pa.Table.from_arrays([pa.array(a) if not isinstance(a, (pa.Array, pa.ChunkedArray)) else a for a in arrays], schema=schema)


def _conn_row(c: Conn, proxy: str, final: bool, at: int) -> dict[str, Any]:
    end = c.closed if final and c.closed is not None else at
    dur_s = max((end - c.opened) / NS, 0.001)
    moved = int(min(65535 / (c.rtt_us / 1e6), 50e6) * dur_s * (0.8 if not c.wscale else 0.05))
    row: dict[str, Any] = {
        "proxy_id": proxy, "conn_id": c.conn_id, "final": final, "snapshot_ns": at, "listener": "0.0.0.0:9092",
        "mode": "explicit", "client_addr": c.client_addr, "broker_addr": c.broker, "opened_ns": c.opened,
        "upstream_connect_us": 800, "closed_ns": c.closed if final else None, "duration_us": (end - c.opened) // 1000,
        "bytes_from_client": c.n * 2000, "bytes_from_broker": moved + c.n * 100, "frames_from_client": c.n,
        "frames_from_broker": c.n, "requests": c.n, "responses": c.n, "client_ids": [c.client_id],
        "client_software_name": c.software[0], "client_software_version": c.software[1], "tls": False, "opaque": False,
        "end_reason": c.end_reason if final else "open", "end_by": c.end_by if final else "none",
        "idle_before_end_ms": c.idle_ms if final else None, "unanswered": 0, "inferred_cause": c.inferred if final else None,
        "tcp_client_open": tcp_info(c.wscale, c.rtt_us, timestamps=c.wscale), "tcp_broker_open": tcp_info(True, 300),
        "tcp_client_close": tcp_info(c.wscale, c.rtt_us, retrans=0 if c.wscale else 12, timestamps=c.wscale, bytes_acked=moved),
        "tcp_broker_close": tcp_info(True, 300, bytes_received=moved),
    }
    if final:
        row.update(c.last)
    return row


def build_connections(n_requests: int, start_ns: int, span_s: int, seed: int = 7, n_clients: int = 240,
                      n_brokers: int = 3, n_topics: int = 48) -> list[Conn]:
    """The connection plan: steady clients, churners, and one instance of each incident."""
    rng = random.Random(seed)
    brokers = [f"10.0.0.{i + 1}:9092" for i in range(n_brokers)]
    topics = [f"{d}.{e}" for d in ("orders", "payments", "clicks", "audit", "inventory", "users", "metrics", "logs")
              for e in ("events", "commands", "changelog", "dlq", "v2", "raw")][:n_topics]
    end_ns = start_ns + span_s * NS
    conns: list[Conn] = []
    weights: list[float] = []
    seq = iter(range(10**9))

    def add(c: Conn, w: float) -> None:
        conns.append(c)
        weights.append(w)

    for i in range(n_clients):
        role = rng.choices(["producer", "consumer", "admin"], [0.45, 0.48, 0.07])[0]
        app = rng.choice(["orders", "payments", "clicks", "audit", "inventory", "users", "metrics", "logs"])
        cid = f"{app}-{role}-{i}"
        host = f"10.1.{i // 200}.{i % 200 + 10}"
        sw = rng.choice(SOFTWARE)
        mytopics = [t for t in topics if t.startswith(app)][:3] or topics[:2]
        activity = rng.paretovariate(1.2)
        for b in rng.sample(brokers, k=min(len(brokers), rng.choice([1, 2, 3]))):
            add(Conn(f"c{next(seq)}", cid, f"{host}:{40000 + rng.randrange(20000)}", b, role, mytopics, start_ns + rng.randrange(NS * 5),
                     None, 0, sw, throttle=(i % 50 == 7)), activity)
    # incident 5: cross-ocean consumer without window scaling
    for j in range(6):
        add(Conn(f"c{next(seq)}", "connect-hk-replicator", f"203.0.113.7:{50000 + j}", brokers[0], "consumer", topics[:2],
                 start_ns + j * NS, None, 0, SOFTWARE[0], wscale=j % 2 == 1, rtt_us=180_000), 2.0)
    # incident 2: producers reset by an idle-timeout firewall every ~5 min idle
    t = start_ns + 30 * NS
    for j in range(4):
        tt = t + j * 7 * NS
        while tt + 400 * NS < end_ns:
            life = 60 * NS + rng.randrange(60 * NS)
            idle = 300_000 + rng.randrange(900)
            add(Conn(f"c{next(seq)}", f"billing-producer-{j}", f"10.9.0.{j + 5}:{30000 + rng.randrange(30000)}", brokers[j % n_brokers],
                     "producer", topics[6:8], tt, tt + life + idle * 1_000_000, 0, SOFTWARE[1], "client_rst", "client", idle), 0.02)
            tt += life + idle * 1_000_000 + 2 * NS
    # incident 1: acks=0 produce larger than message.max.bytes -> broker closes
    for j in range(3):
        o = start_ns + (600 + j * 900) * NS
        add(Conn(f"c{next(seq)}", "bulk-loader", f"10.7.0.3:{41000 + j}", brokers[1], "producer", ["audit.raw"], o, o + 2 * NS,
                 0, SOFTWARE[2], "broker_fin", "broker", 5,
                 "batch larger than message.max.bytes (RecordBatchTooLarge)",
                 {"last_api": "Produce", "last_request_bytes": 2_400_000 + j, "last_request_acks": 0, "last_request_topics": ["audit.raw"]}), 0.0)
    # incident 4: connection surge on the last broker in the last quarter, latency rising
    surge_at = start_ns + int(span_s * 0.7) * NS
    for c in conns:
        if c.broker == brokers[-1]:
            c.lat_mult_after = (surge_at, 6.0)
    for j in range(max(200, n_clients)):
        o = surge_at + rng.randrange(int(span_s * 0.05) * NS + 1)
        add(Conn(f"c{next(seq)}", f"surge-app-{j % 40}", f"10.20.{j // 200}.{j % 200}:{20000 + j}", brokers[-1], rng.choice(["producer", "consumer"]),
                 topics[12:15], o, None, 0, SOFTWARE[0], lat_mult_after=(surge_at, 6.0)), 0.05)
    for c in conns:
        if c.closed is None:
            c.closed = end_ns - rng.randrange(NS)
            c.end_reason, c.end_by, c.idle_ms = "proxy_shutdown", "proxy", 10
    # distribute requests by weight x lifetime
    life = [(c.closed - c.opened) / NS for c in conns]
    ws = [w * max(lf, 1) for w, lf in zip(weights, life)]
    total = sum(ws)
    for c, w in zip(conns, ws):
        c.n = max(3, int(n_requests * w / total))
    # the oversize produce is the last request of its connection
    for c in conns:
        if c.client_id == "bulk-loader":
            c.n = 3
    fix = n_requests - 5 - sum(c.n for c in conns)  # keep the requested total exact (5 = rejected produces)
    for c in sorted(conns, key=lambda c: -c.n):
        if fix == 0:
            break
        if c.client_id == "bulk-loader":
            continue
        delta = fix if fix > 0 else max(fix, 3 - c.n)
        c.n += delta
        fix -= delta
    return conns


def _rejected_produce(proxy: str, start_ns: int, broker: str) -> pa.Table:
    """acks=1 Produce answered with MESSAGE_TOO_LARGE (incident 1, second half)."""
    rows = []
    for j in range(5):
        t = start_ns + (1200 + j * 30) * NS
        rows.append({
            "proxy_id": proxy, "conn_id": "big-1", "correlation_id": 10 + j, "api_key": 0, "api_name": "Produce", "api_version": 9,
            "client_id": "big-producer", "client_addr": "10.7.0.9:43000", "broker_addr": broker, "status": "answered", "answered": True,
            "request_bytes": 1_500_000, "response_bytes": 70, "req_first_ns": t, "req_last_ns": t + 5_000_000, "req_sent_ns": t + 5_050_000,
            "resp_first_ns": t + 9_000_000, "resp_last_ns": t + 9_001_000, "resp_sent_ns": t + 9_050_000, "latency_us": 9050,
            "broker_latency_us": 3950, "proxy_req_delay_us": 50, "proxy_resp_delay_us": 49, "acks": 1, "topics": ["audit.raw"],
            "partitions": 1, "batches": 1, "records": 900, "record_bytes": 1_499_000, "compression": "none", "error_count": 1,
            "errors": [{"code": 10, "name": "MESSAGE_TOO_LARGE", "topic": "audit.raw", "partition": 0, "resource": None}],
        })
    schema = ingest_schema("requests")
    return pa.Table.from_pylist([{n: r.get(n) for n in schema.names} for r in rows], schema=schema)


def generate(root: str | Path, n_requests: int, *, seed: int = 7, proxy: str = "synth-1",
             start: dt.datetime | None = None, span_s: int = 7200, flush_rows: int = 1_000_000,
             rollups: bool = True) -> dict[str, int]:
    """Write a synthetic recording of about `n_requests` requests; returns row counts per dataset.

    `rollups=False`: without the rollups a proxy writes beside its requests files (recording.rollups),
    as an older proxy's recording, so the analysis computes everything from the requests.
    """
    start = start or dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.timezone.utc)
    start_ns = int(start.timestamp()) * NS
    rng = random.Random(seed)
    conns = build_connections(n_requests, start_ns, span_s, seed)
    counts = {"requests": 0, "connections": 0, "tcp": 0}
    pending: list[pa.Table] = []
    pending_rows = 0

    def flush() -> None:
        nonlocal pending, pending_rows
        if pending:
            tbl = pa.concat_tables(pending).combine_chunks()
            write_table(root, "requests", tbl, rollups=rollups)
            counts["requests"] += tbl.num_rows
        pending, pending_rows = [], 0

    for c in conns:
        t = _conn_requests(c, proxy, rng)
        if c.client_id == "bulk-loader":  # ApiVersions, Metadata, then the oversize acks=0 Produce
            t = _bulk_loader(t, c)
        pending.append(t)
        pending_rows += t.num_rows
        if pending_rows >= flush_rows:
            flush()
    pending.append(_rejected_produce(proxy, start_ns, conns[0].broker))
    flush()
    if rollups:  # each hour's rollups merged, as a proxy does when it leaves the hour
        for directory in sorted({p.parent for p in (Path(root) / "requests").rglob("*.parquet")}):
            merge_hour(directory, RUN, fsync=False)
    conn_rows = []
    tcp_rows = []
    for c in conns:
        mid = c.opened + (c.closed - c.opened) // 2  # type: ignore[operator]
        if (c.closed - c.opened) > 120 * NS:  # type: ignore[operator]
            conn_rows.append(_conn_row(c, proxy, False, mid))  # a periodic snapshot to de-duplicate
        conn_rows.append(_conn_row(c, proxy, True, c.closed))  # type: ignore[arg-type]
        for side, info, ts in (("client", tcp_info(c.wscale, c.rtt_us, timestamps=c.wscale), c.opened),
                               ("broker", tcp_info(True, 300), c.opened),
                               ("client", tcp_info(c.wscale, c.rtt_us, retrans=0 if c.wscale else 12, timestamps=c.wscale), c.closed)):
            tcp_rows.append({"proxy_id": proxy, "conn_id": c.conn_id, "side": side, "phase": "open" if ts == c.opened else "close", "ts_ns": ts, **info})
    conn_rows.append({**_conn_row(Conn("big-1", "big-producer", "10.7.0.9:43000", conns[0].broker, "producer", ["audit.raw"],
                                       start_ns + 1190 * NS, start_ns + 1400 * NS, 5, SOFTWARE[0], "client_fin", "client", 30000), proxy, True, start_ns + 1400 * NS)})
    write_rows(root, "connections", conn_rows)
    write_rows(root, "tcp", tcp_rows)
    counts["connections"] = len(conn_rows)
    counts["tcp"] = len(tcp_rows)
    return counts


def _bulk_loader(t: pa.Table, c: Conn) -> pa.Table:
    """Rewrite the 3 requests of a bulk-loader connection into ApiVersions, Metadata, Produce acks=0."""
    rows = t.to_pylist()
    rows[1].update(api_name="Metadata", api_key=3, api_version=12, topics=[], errors=[], error_count=0)
    big = c.last["last_request_bytes"]
    rows[2].update(api_name="Produce", api_key=0, api_version=9, acks=0, status="no_response", answered=False, request_bytes=big,
                   response_bytes=None, resp_first_ns=None, resp_last_ns=None, resp_sent_ns=None, latency_us=None,
                   broker_latency_us=None, proxy_resp_delay_us=None, topics=["audit.raw"], records=20000, record_bytes=big - 200,
                   batches=1, errors=[], error_count=0)
    return pa.Table.from_pylist(rows, schema=t.schema)
