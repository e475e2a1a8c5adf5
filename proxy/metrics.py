"""LiveStats: in-process counters behind `/metrics` and `/clients`.

Why a sink of its own and no prometheus_client: the relay hands every row to
every sink on the event loop thread, so updating statistics must be a few dict
operations per row (O(1): a histogram bucket is found by bisect over a fixed
list of ~20 bounds) and must not take locks. Rendering the Prometheus text
format (done at scrape time, also on the loop) is a few dozen lines; a
dependency for it would be the only one the proxy host needs beyond the relay.

Latencies are observed in **microseconds** (integers, as the recording columns) and exposed in
**seconds**, Prometheus's base unit: `*_latency_seconds` histograms whose bucket bounds (`le`) and
`_sum` are seconds, so `histogram_quantile()` and Grafana's duration units need no conversion.

Bounds (label values come from what clients send — api keys, versions, error
codes — so a hostile client could otherwise grow memory and `/metrics`
without limit): each counter family keeps at most `MAX_LABEL_SETS` (256)
label sets and each latency histogram family `MAX_HISTOGRAMS` (64); what
arrives after that is folded into one label set whose values are "other".
`/metrics` therefore stays under ~5,000 lines whatever the traffic, and
`/clients` keeps `MAX_TOPICS_PER_CLIENT` topics and 8 client ids per
connection, each cut to `MAX_CLIENT_ID_CHARS` (and counts up to `MAX_TOPICS_MORE` more topics: `topics_more`),
closed connections for `CLOSED_RETENTION_S`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

import re

from protocol.api_keys import (ADD_PARTITIONS_TO_TXN, ANY_CONNECTION_APIS, BROKER_ADD_PARTITIONS_MIN_VERSION,
                               BROKER_SENT_APIS, FOLLOWER_CLIENT_ID_PATTERN)
from protocol.error_kinds import ERROR, PROTOCOL_STEP, RETRIABLE, error_kind, response_kind
from proxy.topics import is_topic_id
from recording.fault_notes import injected_error_names

Row = dict[str, Any]

# µs bucket bounds: 50 µs … 30 s, roughly 1-2.5-5 per decade.
LATENCY_BUCKETS_US: tuple[float, ...] = (
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000,
)
LATENCY_BUCKETS_S: tuple[float, ...] = tuple(b / 1e6 for b in LATENCY_BUCKETS_US)  # the same bounds as exposed

# Which role an API implies for the client connection that sends it.
PRODUCER, CONSUMER, GROUP_MEMBER, ADMIN, KIP848_CONSUMER, SHARE_CONSUMER, STREAMS_MEMBER = 1, 2, 4, 8, 16, 32, 64
# A broker's own connection (the brokers also talk through this listener): requests only brokers send. Named only
# when the connection sent nothing else but what any connection sends (ApiVersions, FindCoordinator, SASL): an Admin
# client aborting a transaction sends WriteTxnMarkers too (KIP-664), beside Metadata. CLIENT marks a request only a
# client sends that names no role of its own (Metadata, …): never shown, it only keeps "broker" off
BROKER, CLIENT = 128, 256
ROLE_NAMES = ((PRODUCER, "producer"), (CONSUMER, "consumer"), (GROUP_MEMBER, "group-member"), (ADMIN, "admin"),
              (KIP848_CONSUMER, "kip848-consumer"), (SHARE_CONSUMER, "share-consumer"),
              (STREAMS_MEMBER, "streams-member"), (BROKER, "broker"))
API_ROLE: dict[int, int] = {
    0: PRODUCER, 22: PRODUCER, 24: PRODUCER, 25: PRODUCER, 26: PRODUCER, 28: PRODUCER,  # Produce, txn APIs
    1: CONSUMER, 2: CONSUMER, 23: CONSUMER,  # Fetch, ListOffsets, OffsetForLeaderEpoch
    8: GROUP_MEMBER, 9: GROUP_MEMBER, 11: GROUP_MEMBER, 12: GROUP_MEMBER, 13: GROUP_MEMBER, 14: GROUP_MEMBER,
    # OffsetCommit/Fetch, Join/Heartbeat/Leave/SyncGroup (classic); the new group protocols name their member kind
    68: KIP848_CONSUMER, 76: SHARE_CONSUMER, 78: SHARE_CONSUMER, 79: SHARE_CONSUMER, 88: STREAMS_MEMBER,
    **{k: ADMIN for k in (15, 16, 19, 20, 21, 29, 30, 31, 32, 33, 34, 35, 37, 42, 43, 44, 45, 46, 47, 48, 49,
                          50, 51, 60, 61, 65, 66, 69, 71, 74, 75)},
    **dict.fromkeys(BROKER_SENT_APIS, BROKER),
}
_FOLLOWER = re.compile(FOLLOWER_CLIENT_ID_PATTERN)


def request_role(row: Row) -> int:
    """The role a request row implies: API_ROLE's, but a partition leader's AddPartitionsToTxn (v4+) is a broker's."""
    key = row.get("api_key", -1)
    if key == ADD_PARTITIONS_TO_TXN and (row.get("api_version") or 0) >= BROKER_ADD_PARTITIONS_MIN_VERSION:
        return BROKER
    role = API_ROLE.get(key)
    if role is None:
        return 0 if key in ANY_CONNECTION_APIS else CLIENT
    return role
MAX_LABEL_SETS = 256  # label sets per counter family; later ones are folded into "other"
MAX_HISTOGRAMS = 64  # label sets per histogram family (each renders ~22 lines)
OTHER = "other"
MAX_TOPICS_PER_CLIENT = 64  # /clients shows at most this many topics per connection (memory bound)
MAX_CLIENT_ID_CHARS = 256  # /clients and top keep a client id this long at most (a header may carry 32 KiB)
# distinct topics counted past those (as hashes, ~45 KiB per connection at most): /clients' topics_more
MAX_TOPICS_MORE = 1_024
CLOSED_RETENTION_S = 300.0  # closed connections stay visible in /clients this long


def _bump(d: dict[Any, int], key: Any, n: int = 1) -> None:
    """d[key] += n, folding a new key into the all-"other" label set once d holds MAX_LABEL_SETS."""
    if key not in d and len(d) >= MAX_LABEL_SETS:
        key = (OTHER,) * len(key) if isinstance(key, tuple) else OTHER
    d[key] = d.get(key, 0) + n


def _histogram(d: dict[tuple[str, str], _Histogram], key: tuple[str, str]) -> _Histogram:
    h = d.get(key)
    if h is None:
        if len(d) >= MAX_HISTOGRAMS:
            key = (OTHER, OTHER)
            h = d.get(key)
        if h is None:
            h = d[key] = _Histogram()
    return h


def _order(key: Any) -> Any:
    """Sort key that puts the folded "other" label set last (its values are str where others are int)."""
    parts = key if isinstance(key, tuple) else (key,)
    return tuple((1, "") if x == OTHER else (0, x) for x in parts)


def _sorted(d: dict[Any, Any]) -> list[tuple[Any, Any]]:
    return sorted(d.items(), key=lambda kv: _order(kv[0]))


def _fill(c: _Client, row: Row) -> None:
    """What the relay knows of an open connection no request row has named yet (`ProxyServer.requests_so_far`):
    its addresses (an open TCP sample carries none), client ids and software, bytes so far, and the role of the
    request it waits on (roles otherwise come from answered requests)."""
    if c.client_addr is None:
        c.client_addr, c.broker_addr = row["client_addr"], row["broker_addr"]
    c.bytes_in = max(c.bytes_in, row["bytes_from_client"])
    c.bytes_out = max(c.bytes_out, row["bytes_from_broker"])
    c.roles |= API_ROLE.get(row["last_api_key"], 0)  # None (no request yet): no role
    if c.client_id is None:
        for cid in row["client_ids"]:
            c.name(cid)
    if row["client_software_name"] and not c.software:
        c.software = row["client_software_name"]
        c.software_version = row["client_software_version"]


def is_follower(client_id: str | None) -> bool:
    """Whether `client_id` is the one Kafka gives a follower broker's replica fetcher (FOLLOWER_CLIENT_ID_PATTERN)."""
    return client_id is not None and _FOLLOWER.match(client_id) is not None


def role_names(mask: int, client_id: str | None = None) -> list[str]:
    """The roles of a connection's `mask`. A follower's fetcher (FOLLOWER_CLIENT_ID_PATTERN) fetches as a broker;
    "broker" is named only alone (see BROKER)."""
    if mask & CONSUMER and is_follower(client_id):
        mask = (mask & ~CONSUMER) | BROKER
    if mask & BROKER and mask != BROKER:  # with anything but what every connection sends: a client's connection
        mask &= ~BROKER
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
                 "topics", "more_topics", "requests", "errors", "retriable", "injected", "bytes_in", "bytes_out", "first_seen_ns", "last_seen_ns",
                 "open", "closed_mono", "end_reason", "opaque", "client_ids", "edit_stopped", "edit_oversize", "removed")

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
        self.more_topics: set[int] | None = None  # hashes of the distinct topics past MAX_TOPICS_PER_CLIENT
        self.requests = 0
        self.errors = 0  # requests answered with an error (protocol.error_kinds), as top's header counts them
        self.retriable = 0  # requests whose errors were all retriable
        self.injected = 0  # requests answered with an error kafkatap's own Kafka fault put there (not in the two above)
        self.bytes_in = 0  # client → broker (request frames)
        self.bytes_out = 0  # broker → client (response frames)
        self.first_seen_ns = now_ns
        self.last_seen_ns = now_ns
        self.open = True
        self.closed_mono = 0.0
        self.end_reason: str | None = None
        self.opaque = False
        self.edit_stopped = False
        self.edit_oversize = 0  # the latest row's count (rows are snapshots: the total adds the growth)
        self.removed: list[str] = []  # request versions Kafka 4.0 removed that it sent (its latest connection row's)

    def name(self, cid: str) -> None:
        """The connection's latest client_id, and one more of its distinct ones (at most 8 kept)."""
        if len(cid) > MAX_CLIENT_ID_CHARS:  # a header may carry 32 KiB: 8 such per connection made /clients
            cid = cid[: MAX_CLIENT_ID_CHARS - 1] + "…"  # megabytes, rendered on the relaying loop each poll
        self.client_id = cid
        if len(self.client_ids) < 8:
            self.client_ids.add(cid)

    def add_topics(self, topics: Iterable[str]) -> None:
        """Name the first MAX_TOPICS_PER_CLIENT distinct topics, count the others.

        Why counted: a consumer of 150 topics showed 64 with nothing saying the list was cut.
        Set operations in C: a connection's every request names its topics again.
        """
        if self.more_topics is not None and len(self.more_topics) >= MAX_TOPICS_MORE:
            return  # both full: nothing more to learn
        new = set(topics).difference(self.topics)
        if not new:
            return
        room = MAX_TOPICS_PER_CLIENT - len(self.topics)
        if room >= len(new):
            self.topics |= new
            return
        if room > 0:
            named = sorted(new)[:room]
            self.topics.update(named)
            new.difference_update(named)
        more = self.more_topics
        if more is None:
            more = self.more_topics = set()
        if len(more) < MAX_TOPICS_MORE:
            more.update(islice(map(hash, new), MAX_TOPICS_MORE - len(more)))

    def as_json(self, now_ns: int) -> dict[str, Any]:
        roles = role_names(self.roles, self.client_id)
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
            "topics_more": len(self.more_topics or ()),  # distinct topics not listed (at least, past MAX_TOPICS_MORE)
            "requests": self.requests,
            "errors": self.errors,
            "retriable": self.retriable,
            "injected": self.injected,
            "bytes_from_client": self.bytes_in,
            "bytes_from_broker": self.bytes_out,
            "first_seen_ns": self.first_seen_ns,
            "last_seen_ns": self.last_seen_ns,
            "last_seen_s_ago": round(max(0, now_ns - self.last_seen_ns) / 1e9, 3),
            "open": self.open,
            "end_reason": self.end_reason,
            "opaque": self.opaque,
            "removed_in_kafka_4": self.removed,
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
        self.errors: dict[tuple[str, int, str], int] = {}  # (api, version, error name): the broker's
        self.injected_errors: dict[tuple[str, int, str], int] = {}  # (api, version, error name): Kafka faults' error=
        self.injected_requests: dict[tuple[str, int], int] = {}  # (api, version): answers carrying such an error
        # requests whose answer carried an error, by (api, version, worst kind): protocol steps are not counted
        self.failed_requests: dict[tuple[str, int, str], int] = {}
        self.unanswered: dict[tuple[str, str], int] = {}  # (api, status)
        self.latency: dict[tuple[str, str], _Histogram] = {}  # (api, broker) client-visible
        self.broker_latency: dict[tuple[str, str], _Histogram] = {}  # (api, broker) broker only
        self.bytes_in: dict[str, int] = {}  # api → request bytes
        self.bytes_out: dict[str, int] = {}  # api → response bytes
        self.conn_ends: dict[tuple[str, str], int] = {}  # (reason, by)
        # The server's request accounting, read at scrape time (`kafkatap proxy` wires ProxyServer.accounting_now):
        # (requests_seen, request_rows, skipped_bytes) and requests dropped by reason, open connections included
        self.relay_accounting: Callable[[], tuple[dict[str, int], dict[str, int]]] = lambda: ({}, {})
        # The process's topic id → name lookup (`kafkatap proxy` wires ProxyServer.topics.name), read when /clients
        # is rendered: a row can leave before its ids are named (with --workers, another worker relayed the answer)
        self.topic_name: Callable[[str], str | None] = lambda _: None
        # Who the open connections are from their requests so far (`kafkatap proxy` wires
        # ProxyServer.requests_so_far), read when /clients is rendered: rows name a connection's client only once
        # an answer ends a request, so a client waiting on its first one (a broker that does not answer, a fault's
        # delay) showed as "-" in top, or not at all without TCP_INFO samples
        self.open_requests_so_far: Callable[[], list[Row]] = lambda: []
        self.opaque_total = 0
        self.edit_stopped_total = 0  # connections whose frame editor gave up (proxy.intercept)
        self.edit_oversize_total = 0  # frames wanted for editing but over its bound, forwarded unedited
        self.connections_total = 0
        # reason → count of connections never accepted (EMFILE, fd reserve); the server's dict (proxy.listener)
        self.accept_failures: dict[str, int] = {}
        self.clients: dict[str, _Client] = {}
        self._closed: deque[tuple[float, str]] = deque()  # (closed at, conn_id), oldest first: what prune forgets
        # advertised address → responses that sent clients there, around the proxy (proxy.bypass; explicit mode)
        self.bypass: dict[str, int] = {}
        # cluster mode's counters (proxy.cluster.ClusterStats), read at scrape time; `kafkatap proxy` wires them
        self.cluster_stats: Any = None
        # a --workers worker's connection passing (proxy.balance.Balancer.stats), read at scrape time
        self.balance_stats: Callable[[], dict[str, int]] | None = None
        # a cluster-mode --workers worker's broker news (proxy.broker_news.BrokerNews.stats), read at scrape time
        self.broker_news_stats: Callable[[], dict[str, int]] | None = None
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
        _bump(self.requests, key)
        broker = row.get("broker_addr") or ""
        req_b = row.get("request_bytes") or 0
        resp_b = row.get("response_bytes") or 0
        _bump(self.bytes_in, api, req_b)
        _bump(self.bytes_out, api, resp_b)
        status = row.get("status")
        if status and status != "answered":
            _bump(self.unanswered, (api, status))
        lat = row.get("latency_us")
        if lat is not None:
            lk = (api, broker)
            _histogram(self.latency, lk).observe(lat)
            blat = row.get("broker_latency_us")
            if blat is not None:
                _histogram(self.broker_latency, lk).observe(blat)
        errs = row.get("errors")
        kind = None
        mine: list[str] = []  # the error names a Kafka fault's error= put in the answer: kafkatap's, not the broker's
        if errs:
            names = [(e.get("name") if isinstance(e, dict) else None) or "UNKNOWN" for e in errs]
            ours = injected_error_names(row.get("edit"))
            if ours:
                mine = [n for n in names if n in ours]
                names = [n for n in names if n not in ours]
            if mine:
                _bump(self.injected_requests, (api, ver))
                for name in mine[:16]:
                    _bump(self.injected_errors, (api, ver, name))
            if names:
                kind = response_kind(api, names)  # from every broker error, as the report does
                if kind != PROTOCOL_STEP:  # a first JoinGroup's MEMBER_ID_REQUIRED is the protocol, not a failure
                    _bump(self.failed_requests, (api, ver, kind))
            for name in names[:16]:  # bounded: a response can carry an error per partition
                _bump(self.errors, (api, ver, name))
        bypass = row.get("bypass")
        if bypass:
            for addr in bypass[:16]:
                _bump(self.bypass, addr)
        c = self._client(row, now)
        c.last_seen_ns = now
        c.requests += 1
        if c.client_addr is None:
            c.client_addr = row.get("client_addr")
            c.broker_addr = broker
        c.bytes_in += req_b
        c.bytes_out += resp_b
        if kind == ERROR:
            c.errors += 1
        elif kind == RETRIABLE:
            c.retriable += 1
        if mine:
            c.injected += 1
        cid = row.get("client_id")
        if cid is not None:
            c.name(cid)
        c.roles |= request_role(row)
        topics = row.get("topics")
        if topics:
            c.add_topics(topics)
        sw = row.get("client_software_name")
        if sw:
            c.software = sw
            c.software_version = row.get("client_software_version")

    def connection(self, row: Row) -> None:
        now = self._clock_ns()
        c = self._client(row, now)
        if row.get("final") or (row.get("bytes_from_client") or 0) > c.bytes_in or (
                row.get("bytes_from_broker") or 0) > c.bytes_out:
            c.last_seen_ns = now  # its end, or bytes since: not a quiet connection's periodic snapshot (SEEN)
        if c.client_addr is None:  # created from a TCP sample, which carries no addresses
            c.client_addr = row.get("client_addr")
            c.broker_addr = row.get("broker_addr")
        # the relay's own byte counts: a connection never decoded (--no-decode, TLS passed through, opaque) has no
        # request rows to add them up from, and showed 0 B however much it carried
        c.bytes_in = max(c.bytes_in, row.get("bytes_from_client") or 0)
        c.bytes_out = max(c.bytes_out, row.get("bytes_from_broker") or 0)
        if row.get("client_software_name"):
            c.software = row["client_software_name"]
            c.software_version = row.get("client_software_version")
        if row.get("opaque") and not c.opaque:
            c.opaque = True
            self.opaque_total += 1
        if row.get("edit_stopped") and not c.edit_stopped:
            c.edit_stopped = True
            self.edit_stopped_total += 1
        removed = row.get("removed_in_kafka_4")
        if removed and len(removed) > len(c.removed):  # rows are snapshots: the latest names all so far
            c.removed = list(removed)
        oversize = row.get("edit_oversize_frames") or 0
        if oversize > c.edit_oversize:
            self.edit_oversize_total += oversize - c.edit_oversize
            c.edit_oversize = oversize
        if row.get("final") and c.open:
            c.open = False
            c.closed_mono = time.monotonic()
            self.open_count -= 1
            reason = row.get("end_reason") or "unknown"
            c.end_reason = reason
            _bump(self.conn_ends, (reason, row.get("end_by") or "unknown"))
            self._closed.append((c.closed_mono, c.conn_id))
            self.prune()  # here, not only when /clients is asked: Prometheus alone never asks, and ~1.4 KB a
            # connection (health checks included) stayed for the proxy's life

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
        """Forget connections closed more than CLOSED_RETENTION_S ago (bounds memory); amortized O(1) a close."""
        cutoff = time.monotonic() - CLOSED_RETENTION_S
        closed = self._closed
        while closed and closed[0][0] < cutoff:
            _, cid = closed.popleft()
            c = self.clients.get(cid)
            if c is not None and not c.open:
                del self.clients[cid]

    def _unseen(self, now: int) -> list[_Client]:
        """The open connections no row has shown yet (with --no-tcp-info, no open sample announces them), from the
        relay's facts, as entries of their own: not kept, so that reading /clients or /metrics changes no count.
        Known connections without a request row get what the relay knows of them filled in (`_fill`)."""
        unseen = []
        for row in self.open_requests_so_far():
            c = self.clients.get(row["conn_id"])
            if c is None:
                c = _Client(row["conn_id"], row["opened_ns"] or now)  # `_fill` gives it its addresses
                unseen.append(c)
            elif not c.open:
                continue
            _fill(c, row)
        return unseen

    def clients_json(self) -> dict[str, Any]:
        self.prune()
        now = self._clock_ns()
        unseen = self._unseen(now)
        rows = sorted((c.as_json(now) for c in (*self.clients.values(), *unseen)),
                      key=lambda r: (not r["open"], -r["last_seen_ns"]))
        for row in rows:
            if any(is_topic_id(t) for t in row["topics"]):  # named now if the map has learned it since
                row["topics"] = sorted({self.topic_name(t) or t if is_topic_id(t) else t for t in row["topics"]})
        return {"proxy_id": self.proxy_id, "now_ns": now, "open_connections": self.open_count + len(unseen),
                "clients": rows}

    def render_prometheus(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        out: list[str] = []
        proxy = {"proxy": self.proxy_id}
        unseen = len(self._unseen(self._clock_ns()))  # open, and shown by no row yet: counted here, not kept

        def family(name: str, kind: str, help_: str, samples: Iterable[tuple[str, dict[str, Any], float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            for suffix, labels, value in samples:
                out.append(sample_line(f"{name}{suffix}", {**proxy, **labels}, value))

        family("kafkatap_requests_total", "counter", "Requests seen, by API and version.",
               (("", {"api": a, "version": v}, n) for (a, v), n in _sorted(self.requests)))
        family("kafkatap_request_errors_total", "counter",
               "Non-zero error codes in responses, by API, version, error name and kind "
               "(error, retriable: Kafka's clients retry it, protocol_step: how the protocol works).",
               (("", {"api": a, "version": v, "error": e, "kind": error_kind(a, e)}, n) for (a, v, e), n in _sorted(self.errors)))
        family("kafkatap_failed_requests_total", "counter",
               "Requests whose response carried an error, by API, version and worst kind (error, or retriable when every "
               "error was one Kafka's clients retry); answers with only protocol steps (a first JoinGroup's "
               "MEMBER_ID_REQUIRED …) are not counted.",
               (("", {"api": a, "version": v, "kind": k}, n) for (a, v, k), n in _sorted(self.failed_requests)))
        family("kafkatap_injected_errors_total", "counter",
               "Error codes kafkatap's own Kafka faults (error= rules) put in responses, by API, version and error "
               "name; the two error families above count only the broker's.",
               (("", {"api": a, "version": v, "error": e}, n) for (a, v, e), n in _sorted(self.injected_errors)))
        family("kafkatap_injected_requests_total", "counter",
               "Requests whose answer carried an error kafkatap's own Kafka fault put there, by API and version; "
               "kafkatap_failed_requests_total counts a request only for the broker's own errors.",
               (("", {"api": a, "version": v}, n) for (a, v), n in _sorted(self.injected_requests)))
        family("kafkatap_requests_unanswered_total", "counter",
               "Requests without a response: unanswered (connection ended first) or no_response (acks=0).",
               (("", {"api": a, "status": s}, n) for (a, s), n in _sorted(self.unanswered)))
        for name, hists, help_ in (
            ("kafkatap_request_latency_seconds", self.latency,
             "Client-visible request latency in seconds (first request byte in to last response byte out)."),
            ("kafkatap_broker_latency_seconds", self.broker_latency,
             "Broker latency in seconds (request sent to first response byte)."),
        ):
            family(name, "histogram", help_, _histogram_samples(hists))
        family("kafkatap_request_bytes_total", "counter", "Request frame bytes, client to broker, by API.",
               (("", {"api": a}, n) for a, n in _sorted(self.bytes_in)))
        family("kafkatap_response_bytes_total", "counter", "Response frame bytes, broker to client, by API.",
               (("", {"api": a}, n) for a, n in _sorted(self.bytes_out)))
        family("kafkatap_open_connections", "gauge", "Client connections currently open.",
               [("", {}, self.open_count + unseen)])
        family("kafkatap_connections_total", "counter", "Client connections seen since start.",
               [("", {}, self.connections_total + unseen)])
        family("kafkatap_connection_ends_total", "counter", "Connection ends by reason and by whom.",
               (("", {"reason": r, "by": b}, n) for (r, b), n in _sorted(self.conn_ends)))
        acc, dropped = self.relay_accounting()
        family("kafkatap_requests_seen_total", "counter", "Requests the decoder saw (open connections included).",
               [("", {}, acc.get("requests_seen", 0))])
        family("kafkatap_request_rows_total", "counter", "Request rows the relay produced (open connections included).",
               [("", {}, acc.get("request_rows", 0))])
        family("kafkatap_requests_dropped_total", "counter",
               "Requests seen but given no row, by reason (in_flight_cap, correlation_id_reused, decoder_failed, "
               "observation_backlog): seen = rows + these + requests still waiting for their answer.",
               (("", {"reason": r}, n) for r, n in _sorted(dropped)))
        family("kafkatap_observation_skipped_bytes_total", "counter",
               "Bytes relayed but not decoded because a connection's observation backlog exceeded its bound.",
               [("", {}, acc.get("skipped_bytes", 0))])
        family("kafkatap_opaque_connections_total", "counter",
               "Connections whose stream stopped being parsed (TLS, garbage, unknown framing).",
               [("", {}, self.opaque_total)])
        family("kafkatap_edit_stopped_connections_total", "counter",
               "Connections where the proxy was asked to edit (cluster rewriting, Kafka faults) but gave up (TLS, "
               "not Kafka framing, a stray response, a reused correlation id): Kafka faults relay the rest "
               "unchanged, cluster mode closes the connection (end_reason edit_stopped). The reason is on the "
               "connection row (edit_stopped) and in one log line.",
               [("", {}, self.edit_stopped_total)])
        family("kafkatap_edit_oversize_frames_total", "counter",
               "Frames the proxy was asked to edit but larger than its 64 MiB edit bound: forwarded unedited.",
               [("", {}, self.edit_oversize_total)])
        family("kafkatap_accept_failures_total", "counter",
               "Client connections not accepted (emfile: out of descriptors; fd_reserve: refused to keep "
               "descriptors for the recorder), by reason.",
               (("", {"reason": r}, n) for r, n in sorted(self.accept_failures.items())))
        family("kafkatap_bypass_advertised_total", "counter",
               "Responses (Metadata, FindCoordinator, DescribeCluster) that told a client to connect to a broker "
               "address this proxy does not listen for, by address: that traffic goes around the proxy and is not "
               "recorded (use --cluster, or advertise the proxy's listeners).",
               (("", {"address": a}, n) for a, n in _sorted(self.bypass)))
        if self.balance_stats is not None:
            family("kafkatap_balanced_connections_total", "counter",
                   "--workers N: connections a worker passed to a less loaded one (passed), took from another "
                   "(taken), gave back because it had no listener for them yet (returned), or lost because it was "
                   "out of descriptors (lost).",
                   (("", {"how": k}, n) for k, n in self.balance_stats().items()))
        if self.broker_news_stats is not None:
            family("kafkatap_cluster_broker_news_total", "counter",
                   "Cluster mode, --workers N: new or moved brokers a worker learned and told the others (sent), "
                   "learnings of another worker that changed a worker's map (applied), and learnings not delivered "
                   "or not readable (lost: that worker follows when a response through it names the broker).",
                   (("", {"how": k}, n) for k, n in self.broker_news_stats().items()))
        cs = self.cluster_stats
        if cs is not None:
            family("kafkatap_cluster_rewritten_responses_total", "counter",
                   "Cluster mode: responses whose broker addresses were rewritten to the proxy's listeners.",
                   [("", {}, cs.rewritten_responses)])
            family("kafkatap_cluster_rewrite_failures_total", "counter",
                   "Cluster mode: responses that carry addresses but could not be rewritten (forwarded as they were).",
                   [("", {}, cs.rewrite_failures)])
            family("kafkatap_cluster_capped_version_answers_total", "counter",
                   "Cluster mode: ApiVersions answers in which APIs that carry broker addresses offered versions "
                   "newer than kafkatap's specs, lowered to the newest whose addresses it rewrites.",
                   [("", {}, cs.capped_version_answers)])
            family("kafkatap_cluster_brokers", "gauge", "Cluster mode: brokers known that have a listener of the proxy's.",
                   [("", {}, cs.brokers_seen - cs.brokers_unlistened)])
            family("kafkatap_cluster_brokers_unlistened", "gauge",
                   "Cluster mode: brokers known that have no listener (port taken or out of range): their "
                   "addresses go to clients as they are, so their traffic goes around the proxy.",
                   [("", {}, cs.brokers_unlistened)])
        rs = self.recorder_stats() if self.recorder_stats else None
        if rs is not None:
            family("kafkatap_recording_dropped_rows_total", "counter",
                   "Recording rows dropped (queue full, write failure, disk nearly full), by dataset.",
                   (("", {"dataset": d}, n) for d, n in sorted(rs["dropped"].items())))
            family("kafkatap_recording_queue_rows", "gauge", "Rows waiting for the recording writer, by dataset.",
                   (("", {"dataset": d}, n) for d, n in sorted(rs["queued"].items())))
            family("kafkatap_recording_rows_written_total", "counter", "Rows written to Parquet, by dataset.",
                   (("", {"dataset": d}, n) for d, n in sorted(rs["rows_written"].items())))
            family("kafkatap_recording_errors_total", "counter",
                   "Recording errors by kind: write (rows dropped), compaction (flush files kept), rollups "
                   "(derived data missing; the analysis reads the requests), writer_process, retention (an "
                   "old hour not deleted).",
                   (("", {"kind": k}, n) for k, n in sorted(rs.get("errors", {}).items())))
            family("kafkatap_recording_frames_redacted_total", "counter",
                   "Raw frames refused by the recorder (SaslAuthenticate or unverifiable header).",
                   [("", {}, rs["frames_redacted"])])
        family("kafkatap_start_time_seconds", "gauge", "When the proxy started (Unix seconds).",
               [("", {}, self.started_ns / 1e9)])
        return "\n".join(out) + "\n"


def _histogram_samples(hists: dict[tuple[str, str], _Histogram]) -> Iterable[tuple[str, dict[str, Any], float]]:
    for (api, broker), h in _sorted(hists):
        labels = {"api": api, "broker": broker}
        cum = 0
        for bound, count in zip(LATENCY_BUCKETS_S, h.counts):
            cum += count
            yield "_bucket", {**labels, "le": _num(bound)}, cum
        yield "_bucket", {**labels, "le": "+Inf"}, h.n
        yield "_sum", labels, h.total / 1e6  # observed in µs, exposed in seconds
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


def sample_line(name: str, labels: dict[str, Any], value: float) -> str:
    """One exposition sample, labels escaped and the value exact (`{v:g}` kept six digits: 1.23457e+06)."""
    return f"{name}{_labels(labels)} {_num(value)}"


# -- several worker processes, one status address (proxy.workers) ----------------------------------
# The parent of `kafkatap proxy --workers N` scrapes each worker's own endpoint and serves the merge.
# Merging works on the exposition text, generically over metric families, so a family added or
# renamed here (or a unit change) needs no change below: counters and gauges are summed per label set
# (the `proxy` label becomes the parent's id), histogram `_bucket`/`_sum`/`_count` samples are summed
# bucket-wise (cumulative counts of equal bounds add up to the merged histogram), the few gauges
# that are instants rather than amounts (MERGE_MIN_SUFFIXES) take the earliest value, and the gauges
# that every worker measures of the same shared thing (MERGE_MAX_FAMILIES: each worker discovers the
# whole cluster) take the largest.
MERGE_MIN_SUFFIXES = ("_start_time_seconds",)
CARRIED_KINDS = ("counter", "histogram")  # what a process that died leaves to the merges after it (merge_prometheus)
MERGE_MAX_FAMILIES = ("kafkatap_cluster_brokers", "kafkatap_cluster_brokers_unlistened")


def parse_exposition(text: str) -> list[tuple[str, str, str, list[tuple[str, str]], float]]:
    """Our own exposition text → [(family, kind, sample name, [(label, value)], value)], in order.

    `family` and `kind` come from the last `# TYPE` line. The HELP and TYPE lines themselves are
    returned as records of kind "help" / "type" (their text in the name slot) so a merge keeps
    them, also for families without samples yet.
    """
    out: list[tuple[str, str, str, list[tuple[str, str]], float]] = []
    family, kind = "", "untyped"
    # "\n" only: a label value may hold a \r, \f or U+2028 (a hostname a broker advertised), which the
    # format leaves unescaped and str.splitlines() would break the sample at (the scrape then failed)
    for line in text.split("\n"):
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                family, kind = parts[2], parts[3].strip()
                out.append((family, "type", kind, [], 0.0))
            elif len(parts) >= 3 and parts[1] == "HELP":
                out.append((parts[2], "help", parts[3] if len(parts) > 3 else "", [], 0.0))
            continue
        head, _, value = line.rpartition(" ")
        name, brace, body = head.partition("{")
        labels = _parse_labels(body[:-1]) if brace else []
        try:
            num = float(value)
        except ValueError:
            continue
        fam = family if name.startswith(family) else name
        out.append((fam, kind if fam == family else "untyped", name, labels, num))
    return out


def _parse_labels(body: str) -> list[tuple[str, str]]:
    labels: list[tuple[str, str]] = []
    i, n = 0, len(body)
    while i < n:
        eq = body.index("=", i)
        key = body[i:eq].strip().lstrip(",").strip()
        j = eq + 2  # past '="'
        val: list[str] = []
        while j < n and body[j] != '"':
            if body[j] == "\\" and j + 1 < n:
                j += 1
                val.append({"n": "\n"}.get(body[j], body[j]))
            else:
                val.append(body[j])
            j += 1
        labels.append((key, "".join(val)))
        i = j + 1
        while i < n and body[i] in ", ":
            i += 1
    return labels


def merge_prometheus(texts: Iterable[str], proxy_id: str, only: tuple[str, ...] | None = None) -> str:
    """Merge several processes' `/metrics` texts into one, as if one proxy `proxy_id` had served it.

    `only`: the families of these types alone. CARRIED_KINDS is what a worker process that died
    leaves for the merges after it (proxy.workers): what it counted happened, and its successor starts from
    zero, so its last counters keep the proxy's totals from going down (rate() reads any drop as a reset and
    counts the surviving workers' whole history again); gauges say how things are now and die with it.
    """
    helps: dict[str, str] = {}
    kinds: dict[str, str] = {}
    order: list[str] = []  # families, first seen first
    samples: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for fam, kind, name, labels, value in parse_exposition(text):
            if fam not in samples:
                samples[fam] = {}
                order.append(fam)
            if kind == "help":
                helps.setdefault(fam, name)
                continue
            if kind == "type":
                kinds.setdefault(fam, name)
                continue
            key = (name, tuple((k, proxy_id if k == "proxy" else v) for k, v in labels))
            have = samples[fam].get(key)
            if have is None:
                samples[fam][key] = value
            elif fam.endswith(MERGE_MIN_SUFFIXES):
                samples[fam][key] = min(have, value)
            elif fam in MERGE_MAX_FAMILIES:
                samples[fam][key] = max(have, value)
            else:
                samples[fam][key] = have + value
    out: list[str] = []
    for fam in order:
        if only is not None and kinds.get(fam) not in only:
            continue
        if fam in helps:
            out.append(f"# HELP {fam} {helps[fam]}")
        if fam in kinds:
            out.append(f"# TYPE {fam} {kinds[fam]}")
        for (name, labels), value in samples[fam].items():
            out.append(sample_line(name, dict(labels), value))
    return "\n".join(out) + "\n"


def merge_clients(parts: Iterable[dict[str, Any]], proxy_id: str) -> dict[str, Any]:
    """Merge several processes' `/clients` answers: connections concatenated, counts summed.

    Each connection keeps the worker it lives on as `worker` (that worker's proxy id).
    """
    rows: list[dict[str, Any]] = []
    open_connections = 0
    now = 0
    for part in parts:
        open_connections += int(part.get("open_connections") or 0)
        now = max(now, int(part.get("now_ns") or 0))
        for row in part.get("clients") or ():
            rows.append({**row, "worker": part.get("proxy_id")})
    rows.sort(key=lambda r: (not r.get("open"), -(r.get("last_seen_ns") or 0)))
    return {"proxy_id": proxy_id, "now_ns": now or time.time_ns(), "open_connections": open_connections,
            "clients": rows}
