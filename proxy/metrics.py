"""LiveStats: in-process counters behind `/metrics` and `/clients`.

Why a sink of its own and no prometheus_client: the relay hands every row to
every sink on the event loop thread, so updating statistics must be a few dict
operations per row (O(1): a histogram bucket is found by bisect over a fixed
list of ~20 bounds) and must not take locks. Rendering the Prometheus text
format (done at scrape time, also on the loop) is a few dozen lines; a
dependency for it would be the only one the proxy host needs beyond the relay.

All latencies are **microseconds**, matching the recording columns.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any

Row = dict[str, Any]

# µs bucket bounds: 50 µs … 30 s, roughly 1-2.5-5 per decade.
LATENCY_BUCKETS_US: tuple[float, ...] = (
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000,
)

# Which role an API implies for the client connection that sends it.
PRODUCER, CONSUMER, GROUP_MEMBER, ADMIN = 1, 2, 4, 8
ROLE_NAMES = ((PRODUCER, "producer"), (CONSUMER, "consumer"), (GROUP_MEMBER, "group-member"), (ADMIN, "admin"))
API_ROLE: dict[int, int] = {
    0: PRODUCER, 22: PRODUCER, 24: PRODUCER, 25: PRODUCER, 26: PRODUCER, 28: PRODUCER,  # Produce, txn APIs
    1: CONSUMER, 2: CONSUMER, 23: CONSUMER,  # Fetch, ListOffsets, OffsetForLeaderEpoch
    8: GROUP_MEMBER, 9: GROUP_MEMBER, 11: GROUP_MEMBER, 12: GROUP_MEMBER, 13: GROUP_MEMBER, 14: GROUP_MEMBER,
    68: GROUP_MEMBER,  # OffsetCommit/Fetch, Join/Heartbeat/Leave/SyncGroup, ConsumerGroupHeartbeat
    **{k: ADMIN for k in (15, 16, 19, 20, 21, 29, 30, 31, 32, 33, 34, 35, 37, 42, 43, 44, 45, 46, 47, 48, 49,
                          50, 51, 60, 61, 65, 66, 69, 71, 74, 75)},
}
MAX_TOPICS_PER_CLIENT = 64  # /clients shows at most this many topics per connection (memory bound)
CLOSED_RETENTION_S = 300.0  # closed connections stay visible in /clients this long


def role_names(mask: int) -> list[str]:
    return [name for bit, name in ROLE_NAMES if mask & bit]


class _Histogram:
    __slots__ = ("counts", "total", "n")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_US) + 1)  # last = +Inf
        self.total = 0
        self.n = 0

    def observe(self, v: int) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS_US, v)] += 1
        self.total += v
        self.n += 1


class _Client:
    """Live facts about one client connection."""

    __slots__ = ("conn_id", "client_id", "software", "software_version", "client_addr", "broker_addr", "roles",
                 "topics", "requests", "errors", "bytes_in", "bytes_out", "first_seen_ns", "last_seen_ns",
                 "open", "closed_mono", "end_reason", "opaque", "client_ids")

    def __init__(self, conn_id: str, now_ns: int) -> None:
        self.conn_id = conn_id
        self.client_id: str | None = None
        self.client_ids: set[str] = set()
        self.software: str | None = None
        self.software_version: str | None = None
        self.client_addr: str | None = None
        self.broker_addr: str | None = None
        self.roles = 0
        self.topics: set[str] = set()
        self.requests = 0
        self.errors = 0
        self.bytes_in = 0  # client → broker (request frames)
        self.bytes_out = 0  # broker → client (response frames)
        self.first_seen_ns = now_ns
        self.last_seen_ns = now_ns
        self.open = True
        self.closed_mono = 0.0
        self.end_reason: str | None = None
        self.opaque = False

    def as_json(self, now_ns: int) -> dict[str, Any]:
        roles = role_names(self.roles)
        return {
            "conn_id": self.conn_id,
            "client_id": self.client_id,
            "client_ids": sorted(self.client_ids),
            "software": self.software,
            "software_version": self.software_version,
            "role": "+".join(roles) if roles else ("opaque" if self.opaque else "other"),
            "roles": roles,
            "client_addr": self.client_addr,
            "broker_addr": self.broker_addr,
            "topics": sorted(self.topics),
            "requests": self.requests,
            "errors": self.errors,
            "bytes_from_client": self.bytes_in,
            "bytes_from_broker": self.bytes_out,
            "first_seen_ns": self.first_seen_ns,
            "last_seen_ns": self.last_seen_ns,
            "last_seen_s_ago": round(max(0, now_ns - self.last_seen_ns) / 1e9, 3),
            "open": self.open,
            "end_reason": self.end_reason,
            "opaque": self.opaque,
        }


class LiveStats:
    """A RecordSink that keeps counters for `/metrics` and a per-connection table for `/clients`.

    `recorder_stats` (optional) is called at scrape time for recording drops
    and queue depth, so the hot path never touches the recorder.
    """

    def __init__(self, proxy_id: str = "", clock_ns: Callable[[], int] = time.time_ns,
                 recorder_stats: Callable[[], dict[str, Any]] | None = None) -> None:
        self.proxy_id = proxy_id
        self._clock_ns = clock_ns
        self.recorder_stats = recorder_stats
        self.started_ns = clock_ns()
        self.requests: dict[tuple[str, int], int] = {}
        self.errors: dict[tuple[str, int, str], int] = {}  # (api, version, error name)
        self.failed_requests: dict[tuple[str, int], int] = {}  # requests with ≥1 error code
        self.unanswered: dict[tuple[str, str], int] = {}  # (api, status)
        self.latency: dict[tuple[str, str], _Histogram] = {}  # (api, broker) client-visible
        self.broker_latency: dict[tuple[str, str], _Histogram] = {}  # (api, broker) broker only
        self.bytes_in: dict[str, int] = {}  # api → request bytes
        self.bytes_out: dict[str, int] = {}  # api → response bytes
        self.conn_ends: dict[tuple[str, str], int] = {}  # (reason, by)
        self.opaque_total = 0
        self.connections_total = 0
        self.clients: dict[str, _Client] = {}
        self.open_count = 0
        self.tcp_samples = 0
        self.frames = 0

    # -- RecordSink (event loop thread) ------------------------------------------------
    def _client(self, row: Row, now: int) -> _Client:
        conn_id = row.get("conn_id") or "?"
        c = self.clients.get(conn_id)
        if c is None:
            c = self.clients[conn_id] = _Client(conn_id, now)
            self.open_count += 1
            self.connections_total += 1
            c.client_addr = row.get("client_addr")
            c.broker_addr = row.get("broker_addr")
        return c

    def request(self, row: Row) -> None:
        now = self._clock_ns()
        api = row.get("api_name") or str(row.get("api_key"))
        ver = row.get("api_version") or 0
        key = (api, ver)
        self.requests[key] = self.requests.get(key, 0) + 1
        broker = row.get("broker_addr") or ""
        req_b = row.get("request_bytes") or 0
        resp_b = row.get("response_bytes") or 0
        self.bytes_in[api] = self.bytes_in.get(api, 0) + req_b
        self.bytes_out[api] = self.bytes_out.get(api, 0) + resp_b
        status = row.get("status")
        if status and status != "answered":
            k2 = (api, status)
            self.unanswered[k2] = self.unanswered.get(k2, 0) + 1
        lat = row.get("latency_us")
        if lat is not None:
            lk = (api, broker)
            h = self.latency.get(lk)
            if h is None:
                h = self.latency[lk] = _Histogram()
            h.observe(lat)
            blat = row.get("broker_latency_us")
            if blat is not None:
                h = self.broker_latency.get(lk)
                if h is None:
                    h = self.broker_latency[lk] = _Histogram()
                h.observe(blat)
        errs = row.get("errors")
        if errs:
            self.failed_requests[key] = self.failed_requests.get(key, 0) + 1
            for e in errs[:16]:  # bounded: a response can carry an error per partition
                name = (e.get("name") if isinstance(e, dict) else None) or "UNKNOWN"
                ek = (api, ver, name)
                self.errors[ek] = self.errors.get(ek, 0) + 1
        c = self._client(row, now)
        c.last_seen_ns = now
        c.requests += 1
        if c.client_addr is None:
            c.client_addr = row.get("client_addr")
            c.broker_addr = broker
        c.bytes_in += req_b
        c.bytes_out += resp_b
        if errs:
            c.errors += 1
        cid = row.get("client_id")
        if cid is not None:
            c.client_id = cid
            if len(c.client_ids) < 8:
                c.client_ids.add(cid)
        c.roles |= API_ROLE.get(row.get("api_key", -1), 0)
        topics = row.get("topics")
        if topics and len(c.topics) < MAX_TOPICS_PER_CLIENT:
            c.topics.update(topics[:MAX_TOPICS_PER_CLIENT])
        sw = row.get("client_software_name")
        if sw:
            c.software = sw
            c.software_version = row.get("client_software_version")

    def connection(self, row: Row) -> None:
        now = self._clock_ns()
        c = self._client(row, now)
        c.last_seen_ns = now
        if c.client_addr is None:  # created from a TCP sample, which carries no addresses
            c.client_addr = row.get("client_addr")
            c.broker_addr = row.get("broker_addr")
        if row.get("client_software_name"):
            c.software = row["client_software_name"]
            c.software_version = row.get("client_software_version")
        if row.get("opaque") and not c.opaque:
            c.opaque = True
            self.opaque_total += 1
        if row.get("final") and c.open:
            c.open = False
            c.closed_mono = time.monotonic()
            self.open_count -= 1
            reason = row.get("end_reason") or "unknown"
            c.end_reason = reason
            k = (reason, row.get("end_by") or "unknown")
            self.conn_ends[k] = self.conn_ends.get(k, 0) + 1

    def tcp(self, row: Row) -> None:
        self.tcp_samples += 1
        # the accept-time sample makes a connection visible before its first request
        if row.get("phase") == "open" and row.get("conn_id") not in self.clients:
            self._client(row, self._clock_ns())

    def frame(self, row: Row) -> None:
        self.frames += 1

    def close(self) -> None:
        pass

    # -- scrape time -----------------------------------------------------------------
    def prune(self) -> None:
        """Forget connections closed more than CLOSED_RETENTION_S ago (bounds memory)."""
        cutoff = time.monotonic() - CLOSED_RETENTION_S
        for cid in [k for k, c in self.clients.items() if not c.open and c.closed_mono < cutoff]:
            del self.clients[cid]

    def clients_json(self) -> dict[str, Any]:
        self.prune()
        now = self._clock_ns()
        rows = sorted((c.as_json(now) for c in self.clients.values()),
                      key=lambda r: (not r["open"], -r["last_seen_ns"]))
        return {"proxy_id": self.proxy_id, "now_ns": now, "open_connections": self.open_count, "clients": rows}

    def render_prometheus(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        out: list[str] = []
        proxy = {"proxy": self.proxy_id}

        def family(name: str, kind: str, help_: str, samples: Iterable[tuple[str, dict[str, Any], float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            for suffix, labels, value in samples:
                out.append(f"{name}{suffix}{_labels({**proxy, **labels})} {_num(value)}")

        family("kafkatap_requests_total", "counter", "Requests seen, by API and version.",
               (("", {"api": a, "version": v}, n) for (a, v), n in sorted(self.requests.items())))
        family("kafkatap_request_errors_total", "counter",
               "Non-zero error codes in responses, by API, version and error name.",
               (("", {"api": a, "version": v, "error": e}, n) for (a, v, e), n in sorted(self.errors.items())))
        family("kafkatap_failed_requests_total", "counter", "Requests whose response carried at least one error.",
               (("", {"api": a, "version": v}, n) for (a, v), n in sorted(self.failed_requests.items())))
        family("kafkatap_requests_unanswered_total", "counter",
               "Requests without a response: unanswered (connection ended first) or no_response (acks=0).",
               (("", {"api": a, "status": s}, n) for (a, s), n in sorted(self.unanswered.items())))
        for name, hists, help_ in (
            ("kafkatap_request_latency_us", self.latency,
             "Client-visible request latency in microseconds (first request byte in to last response byte out)."),
            ("kafkatap_broker_latency_us", self.broker_latency,
             "Broker latency in microseconds (request sent to first response byte)."),
        ):
            family(name, "histogram", help_, _histogram_samples(hists))
        family("kafkatap_request_bytes_total", "counter", "Request frame bytes, client to broker, by API.",
               (("", {"api": a}, n) for a, n in sorted(self.bytes_in.items())))
        family("kafkatap_response_bytes_total", "counter", "Response frame bytes, broker to client, by API.",
               (("", {"api": a}, n) for a, n in sorted(self.bytes_out.items())))
        family("kafkatap_open_connections", "gauge", "Client connections currently open.",
               [("", {}, self.open_count)])
        family("kafkatap_connections_total", "counter", "Client connections seen since start.",
               [("", {}, self.connections_total)])
        family("kafkatap_connection_ends_total", "counter", "Connection ends by reason and by whom.",
               (("", {"reason": r, "by": b}, n) for (r, b), n in sorted(self.conn_ends.items())))
        family("kafkatap_opaque_connections_total", "counter",
               "Connections whose stream stopped being parsed (TLS, garbage, unknown framing).",
               [("", {}, self.opaque_total)])
        rs = self.recorder_stats() if self.recorder_stats else None
        if rs is not None:
            family("kafkatap_recording_dropped_rows_total", "counter",
                   "Recording rows dropped (queue full, write failure, disk nearly full), by dataset.",
                   (("", {"dataset": d}, n) for d, n in sorted(rs["dropped"].items())))
            family("kafkatap_recording_queue_rows", "gauge", "Rows waiting for the recording writer, by dataset.",
                   (("", {"dataset": d}, n) for d, n in sorted(rs["queued"].items())))
            family("kafkatap_recording_rows_written_total", "counter", "Rows written to Parquet, by dataset.",
                   (("", {"dataset": d}, n) for d, n in sorted(rs["rows_written"].items())))
            family("kafkatap_recording_frames_redacted_total", "counter",
                   "Raw frames refused by the recorder (SaslAuthenticate or unverifiable header).",
                   [("", {}, rs["frames_redacted"])])
        family("kafkatap_start_time_seconds", "gauge", "When the proxy started (Unix seconds).",
               [("", {}, self.started_ns / 1e9)])
        return "\n".join(out) + "\n"


def _histogram_samples(hists: dict[tuple[str, str], _Histogram]) -> Iterable[tuple[str, dict[str, Any], float]]:
    for (api, broker), h in sorted(hists.items()):
        labels = {"api": api, "broker": broker}
        cum = 0
        for bound, count in zip(LATENCY_BUCKETS_US, h.counts):
            cum += count
            yield "_bucket", {**labels, "le": _num(bound)}, cum
        yield "_bucket", {**labels, "le": "+Inf"}, h.n
        yield "_sum", labels, h.total
        yield "_count", labels, h.n


def _escape(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, Any]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _num(v: float) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v) if isinstance(v, float) else str(v)
