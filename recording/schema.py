"""The recording format, defined once.

Every dataset a proxy writes (requests, connections, tcp, frames) is described
here with pyarrow types and a one-line meaning per column. The recorder writes
these schemas, analytics derives its Spark schema from them, and the README's
schema table is generated from the `doc` strings (`python -m recording.schema`).

Timestamps (the columns named `*_ns` whose unit is "timestamp") are
`timestamp[us, UTC]` since format 3, so Spark, DuckDB and pandas read them as
times; the proxy's rows carry them as int epoch ns and the writer converts in
bulk (`recording.timestamps`). Durations are integers: microseconds unless
the column name says otherwise (`_ms`, and `conn_offset_ns` in ns).
Hive partition columns (`proxy`, `date`, `hour`) are in the directory names,
not in the files.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pyarrow as pa

# the names, pyarrow-free for the proxy process (recording.datasets), re-exported: importers of the schema see one module
from recording.datasets import (  # noqa: F401
    DATASETS,
    DERIVED_DATASETS,
    FIRST_ROLLUP_VERSION,
    FORMAT_KEY,
    FORMAT_VERSION,
    PARTITION_COLUMNS,
    RECORDED,
    ROLLUP_KEY,
    ROLLUP_VERSION,
)

TIMESTAMP = pa.timestamp("us", tz="UTC")  # what every Parquet reader (Spark included) reads as a timestamp


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    unit: str
    doc: str


ERROR_STRUCT = pa.struct(
    [
        ("code", pa.int16()),
        ("name", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("resource", pa.string()),
    ]
)

TCP_FIELDS: list[Column] = [
    Column("wscale_ok", pa.bool_(), "", "window scaling negotiated (TCPI_OPT_WSCALE)"),
    Column("snd_wscale", pa.int8(), "shift", "send window scale shift"),
    Column("rcv_wscale", pa.int8(), "shift", "receive window scale shift"),
    Column("timestamps_ok", pa.bool_(), "", "TCP timestamps negotiated (TCPI_OPT_TIMESTAMPS)"),
    Column("sack_ok", pa.bool_(), "", "SACK negotiated (TCPI_OPT_SACK)"),
    Column("rtt_us", pa.int32(), "µs", "smoothed round-trip time"),
    Column("rttvar_us", pa.int32(), "µs", "round-trip time variance"),
    Column("retrans_total", pa.int32(), "segments", "retransmitted segments over the socket's life"),
    Column("lost", pa.int32(), "segments", "segments currently considered lost"),
    Column("snd_cwnd", pa.int32(), "segments", "congestion window"),
    Column("snd_mss", pa.int32(), "bytes", "sender maximum segment size"),
    Column("rcv_space", pa.int32(), "bytes", "receive space advertised by autotuning"),
    Column("delivery_rate_bps", pa.int64(), "bytes/s", "most recent delivery-rate estimate"),
    Column("bytes_acked", pa.int64(), "bytes", "bytes acknowledged by the peer"),
    Column("bytes_received", pa.int64(), "bytes", "bytes received from the peer"),
    Column("state", pa.string(), "", "kernel TCP state name (ESTABLISHED, CLOSE_WAIT, …)"),
]
TCP_STRUCT = pa.struct([(c.name, c.type) for c in TCP_FIELDS])

REQUEST_COLUMNS: list[Column] = [
    Column("proxy_id", pa.string(), "", "id of the proxy instance that saw the request"),
    Column("conn_id", pa.string(), "", "connection id, unique per proxy run"),
    Column("correlation_id", pa.int32(), "", "correlation id from the request header"),
    Column("api_key", pa.int16(), "", "Kafka API key"),
    Column("api_name", pa.string(), "", "Kafka API name (Produce, Fetch, …)"),
    Column("api_version", pa.int16(), "", "API version of the request"),
    Column("client_id", pa.string(), "", "client_id from the request header"),
    Column("client_addr", pa.string(), "host:port", "client address as the proxy saw it"),
    Column("broker_addr", pa.string(), "host:port", "upstream broker address"),
    Column("status", pa.string(), "", "answered | unanswered (connection ended first) | no_response (acks=0)"),
    Column("answered", pa.bool_(), "", "a response was paired with this request"),
    Column("request_bytes", pa.int32(), "bytes", "request frame size including the size prefix"),
    Column("response_bytes", pa.int32(), "bytes", "response frame size including the size prefix"),
    Column("req_first_ns", TIMESTAMP, "timestamp", "first byte of the request read from the client"),
    Column("req_last_ns", TIMESTAMP, "timestamp", "last byte of the request read from the client"),
    Column("req_sent_ns", TIMESTAMP, "timestamp", "last byte of the request written to the broker"),
    Column("resp_first_ns", TIMESTAMP, "timestamp", "first byte of the response read from the broker"),
    Column("resp_last_ns", TIMESTAMP, "timestamp", "last byte of the response read from the broker"),
    Column("resp_sent_ns", TIMESTAMP, "timestamp", "last byte of the response written to the client"),
    Column("latency_us", pa.int64(), "µs", "client-visible latency: resp_sent - req_first"),
    Column("broker_latency_us", pa.int64(), "µs", "broker latency: resp_first - req_sent"),
    Column("proxy_req_delay_us", pa.int64(), "µs", "proxy-added delay on the request: req_sent - req_last"),
    Column("proxy_resp_delay_us", pa.int64(), "µs", "proxy-added delay on the response: resp_sent - resp_last"),
    Column("acks", pa.int16(), "", "Produce acks (0, 1, -1; int16 on the wire, any value is kept)"),
    Column("timeout_ms", pa.int32(), "ms", "Produce/other request timeout"),
    Column("transactional_id", pa.string(), "", "Produce/InitProducerId/EndTxn transactional id"),
    Column("topics", pa.list_(pa.string()), "", "topics touched, by name (a Fetch's or ShareFetch's: those its request named, then those its response carried records of, since an incremental fetch names only what changed); a topic id (uuid) only when the proxy could not name it yet (analytics names it from `topics/`)"),
    Column("topic_ids", pa.list_(pa.string()), "", "topic ids the request (or a Fetch's response, for the topics it added) used instead of names (Produce v13, Fetch v13+, OffsetCommit/Fetch v10, ShareFetch …), as sent"),
    Column("partitions", pa.int32(), "", "topic-partitions touched"),
    Column("batches", pa.int32(), "", "record batches in a Produce request"),
    Column("records", pa.int64(), "records", "records produced (batch headers) or 0"),
    Column("record_bytes", pa.int64(), "bytes", "record-batch bytes produced, or fetched for Fetch and ShareFetch responses"),
    Column("topic_record_bytes", pa.list_(pa.int64()), "bytes", "when a row names several topics, the record-batch bytes of each entry of `topics`, in its order: those a Fetch's or ShareFetch's response carried (null when it carried none), those a Produce sent (null unless its batch headers add up to `record_bytes`); null for one topic (its bytes are the row's) and other APIs"),
    Column("topic_records", pa.list_(pa.int64()), "records", "a Produce naming several topics: the records of each entry of `topics`, in its order (its batch headers' counts; null unless they add up to `records`); null otherwise"),
    Column("compression", pa.string(), "", "compression codec(s) of produced batches, comma separated"),
    Column("producer_id", pa.int64(), "", "producer id (batch header or InitProducerId response)"),
    Column("producer_epoch", pa.int16(), "", "producer epoch"),
    Column("max_wait_ms", pa.int32(), "ms", "Fetch / ShareFetch max_wait"),
    Column("min_bytes", pa.int32(), "bytes", "Fetch min_bytes"),
    Column("max_bytes", pa.int32(), "bytes", "Fetch max_bytes"),
    Column("isolation_level", pa.int8(), "", "Fetch/ListOffsets isolation level (0 read_uncommitted, 1 read_committed)"),
    Column("fetch_session_id", pa.int32(), "", "Fetch session id"),
    Column("fetch_session_epoch", pa.int32(), "", "Fetch session epoch"),
    Column("group_id", pa.string(), "", "consumer group id (group APIs, OffsetCommit/Fetch, FindCoordinator key)"),
    Column("member_id", pa.string(), "", "group member id"),
    Column("generation_id", pa.int32(), "", "group generation"),
    Column("client_software_name", pa.string(), "", "ApiVersions v3+ client software name"),
    Column("client_software_version", pa.string(), "", "ApiVersions v3+ client software version"),
    Column("sasl_mechanism", pa.string(), "", "SaslHandshake mechanism (never credentials)"),
    Column("throttle_ms", pa.int32(), "ms", "throttle_time_ms from the response"),
    Column("error_count", pa.int32(), "", "non-zero error codes in the response"),
    Column("errors", pa.list_(ERROR_STRUCT), "", "every non-zero error code with its name and place"),
    Column("decode_note", pa.string(), "", "why the request or response body was not decoded, if it was not"),
    Column("edit", pa.string(), "", "what the proxy changed, on request (address rewriting, injected fault); null: nothing"),
    Column("advertised", pa.list_(pa.string()), "node_id@host:port",
           "broker addresses the response told the client: node_id@host:port for brokers (Metadata, DescribeCluster), "
           "host:port for a coordinator (FindCoordinator); null: none"),
    Column("bypass", pa.list_(pa.string()), "host:port",
           "of `advertised`, those this proxy does not listen for: the client goes there around the proxy "
           "(explicit mode; use --cluster)"),
]

CONNECTION_COLUMNS: list[Column] = [
    Column("proxy_id", pa.string(), "", "id of the proxy instance"),
    Column("conn_id", pa.string(), "", "connection id, unique per proxy run: `<run>-<n>`, the run's 6 hex digits (new at "
                                       "every start of a proxy or worker) and a counter"),
    Column("final", pa.bool_(), "", "true for the row written at the end, false for periodic snapshots"),
    Column("snapshot_ns", TIMESTAMP, "timestamp", "when this row was taken"),
    Column("listener", pa.string(), "host:port", "proxy listener that accepted the connection"),
    Column("mode", pa.string(), "", "explicit | transparent | cluster (addresses rewritten, proxy.cluster)"),
    Column("client_addr", pa.string(), "host:port", "client address"),
    Column("original_dst", pa.string(), "host:port", "original destination (transparent mode)"),
    Column("broker_addr", pa.string(), "host:port", "upstream broker address"),
    Column("opened_ns", TIMESTAMP, "timestamp", "client connection accepted"),
    Column("upstream_connect_us", pa.int64(), "µs", "time to connect to the broker"),
    Column("closed_ns", TIMESTAMP, "timestamp", "both sides closed (null while open)"),
    Column("duration_us", pa.int64(), "µs", "closed_ns - opened_ns (or up to the snapshot)"),
    Column("bytes_from_client", pa.int64(), "bytes", "bytes read from the client"),
    Column("bytes_from_broker", pa.int64(), "bytes", "bytes read from the broker"),
    Column("frames_from_client", pa.int64(), "", "request frames seen"),
    Column("frames_from_broker", pa.int64(), "", "response frames seen"),
    Column("requests", pa.int64(), "", "requests seen"),
    Column("responses", pa.int64(), "", "responses paired"),
    Column("client_ids", pa.list_(pa.string()), "", "distinct client_id values seen"),
    Column("client_software_name", pa.string(), "", "from ApiVersions v3+"),
    Column("client_software_version", pa.string(), "", "from ApiVersions v3+"),
    Column("tls", pa.bool_(), "", "a TLS ClientHello was seen (the stream is opaque)"),
    Column("opaque", pa.bool_(), "", "some direction stopped being parsed"),
    Column("opaque_reason", pa.string(), "", "why, with the stream offset"),
    Column("end_reason", pa.string(), "", "client_fin | broker_fin | client_rst | broker_rst | upstream_connect_failed | proxy_shutdown | idle_timeout | protocol_error | fault | edit_stopped | open"),
    Column("end_by", pa.string(), "", "client | broker | proxy | none (still open)"),
    Column("end_detail", pa.string(), "", "errno text or fault description; whether the end came during the proxy's shutdown drain, or the shutdown closed a half-open rest"),
    Column("idle_before_end_ms", pa.int64(), "ms", "time since the last byte either way when the connection ended; for a reset from the broker's side that answered the first request after a pause of 1 s or more, that pause"),
    Column("unanswered", pa.int32(), "", "requests without a response at the end"),
    Column("last_api", pa.string(), "", "API of the last request before the end (when the broker closed with acks=0 Produces pipelined, the largest of those it had not answered past, sent within 1 s of the last: the one it most likely refused; so for the four last_request columns)"),
    Column("last_request_bytes", pa.int32(), "bytes", "size of the last request before the end"),
    Column("last_request_acks", pa.int16(), "", "acks of the last request, when it was a Produce"),
    Column("last_request_topics", pa.list_(pa.string()), "", "topics of the last request"),
    Column("inferred_cause", pa.string(), "", "plain-language cause when the evidence supports one"),
    Column("removed_in_kafka_4", pa.list_(pa.string()), "",
           "request versions this connection sent that Kafka 4.0 removed (KIP-896), e.g. \"Produce v2\": a 4.x broker "
           "closes the connection at the first one; null: none"),
    Column("edit_stopped", pa.string(), "",
           "why the proxy stopped editing this connection (cluster rewriting, Kafka faults): TLS or not Kafka "
           "framing, a stray response, a reused correlation id, an oversize request head. Kafka faults relay the "
           "rest unchanged; cluster mode closes the connection (end_reason edit_stopped); null: it did not"),
    Column("edit_oversize_frames", pa.int32(), "",
           "frames the proxy was asked to edit but that exceeded the edit bound (64 MiB): forwarded unedited"),
    Column("tcp_client_open", TCP_STRUCT, "", "TCP_INFO of the client socket at accept"),
    Column("tcp_broker_open", TCP_STRUCT, "", "TCP_INFO of the broker socket after connect"),
    Column("tcp_client_close", TCP_STRUCT, "", "TCP_INFO of the client socket at the end"),
    Column("tcp_broker_close", TCP_STRUCT, "", "TCP_INFO of the broker socket at the end"),
]

TCP_COLUMNS: list[Column] = [
    Column("proxy_id", pa.string(), "", "id of the proxy instance"),
    Column("conn_id", pa.string(), "", "connection id"),
    Column("side", pa.string(), "", "client | broker: which of the proxy's two sockets"),
    Column("phase", pa.string(), "", "open | periodic | close"),
    Column("ts_ns", TIMESTAMP, "timestamp", "when the sample was taken"),
    *TCP_FIELDS,
]

FRAME_COLUMNS: list[Column] = [
    Column("proxy_id", pa.string(), "", "id of the proxy instance"),
    Column("conn_id", pa.string(), "", "connection id"),
    Column("direction", pa.string(), "", "request | response"),
    Column("ts_ns", TIMESTAMP, "timestamp", "first byte of the frame"),
    Column("conn_offset_ns", pa.int64(), "ns", "ts_ns minus the connection's opened_ns (replay rhythm)"),
    Column("correlation_id", pa.int32(), "", "correlation id"),
    Column("api_key", pa.int16(), "", "API key"),
    Column("api_version", pa.int16(), "", "API version"),
    Column("client_addr", pa.string(), "host:port", "client address"),
    Column("broker_addr", pa.string(), "host:port", "broker address"),
    Column("data", pa.binary(), "bytes", "the whole frame including its size prefix (never for frames that may carry credentials: "
           "`protocol.apis.CREDENTIAL_APIS`)"),
]

TOPIC_COLUMNS: list[Column] = [
    Column("proxy_id", pa.string(), "", "id of the proxy instance that learned the pair"),
    Column("topic_id", pa.string(), "", "topic id (uuid)"),
    Column("name", pa.string(), "", "topic name the broker gave for that id"),
    Column("first_seen_ns", TIMESTAMP, "timestamp", "when this proxy first learned the pair"),
    Column("broker_addr", pa.string(), "host:port", "broker whose Metadata answer named it (a row without a pair: whose cluster id was learned)"),
    Column("cluster_id", pa.string(), "", "that broker's cluster id, from a Metadata / DescribeCluster answer a client got through the proxy or the proxy's own: `kafkatap replay` refuses a target of the same cluster"),
]

# Two rows per run of a proxy process (a `--workers` worker is a process of its own): analytics needs them to tell
# a proxy that died (SIGKILL, OOM, host down) from one still running, and a worker's first connections from a start.
RUN_COLUMNS: list[Column] = [
    Column("proxy_id", pa.string(), "", "id of the proxy instance (a worker's own: `<id>-w1`, …)"),
    Column("run", pa.string(), "", "the run's 6 hex digits, the prefix of every conn_id it gives (`<run>-<n>`)"),
    Column("event", pa.string(), "", "start (the run listens and records) | stop (it stopped cleanly: every "
                                     "connection's end handed to the recorder) | launch (a `--workers` worker's, "
                                     "written with its start: ts_ns and pid are its parent's)"),
    Column("ts_ns", TIMESTAMP, "timestamp", "when"),
    Column("pid", pa.int32(), "", "process id of the run"),
    Column("version", pa.string(), "", "kafkatap version of the run"),
    Column("faults", pa.string(), "", "the TCP faults the run injected (`--fault`: latency, bandwidth, a close after "
                                      "N bytes, idle resets, refused connections), as its start line says them; "
                                      "null: none (Kafka faults are noted per request, in `requests.edit`)"),
]

# Derived, not observed (DERIVED_DATASETS): written beside each final requests file (recording.rollups), read by
# analytics in its place when every requests file has them. Deleting them loses nothing: analytics reads the requests.
LATENCY_CELL_COLUMNS: list[Column] = [
    Column("dim", pa.string(), "", "latency view: api_version, client, time, broker_time, api, long_poll_wait, topic, produce_topic"),
    Column("k1", pa.string(), "", "the view's first key (API, client id, broker, topic; for `time` the bucket start, epoch s)"),
    Column("k2", pa.string(), "", "the view's second key or empty (API version, API; for `broker_time` the bucket start, epoch s)"),
    Column("metric", pa.string(), "", "latency | broker_latency | proxy_delay | request_bytes"),
    Column("bin", pa.int32(), "", "log bin of the values: ceil(ln v / ln 1.02), 1.10 for the time views; 0 for v <= 1"),
    Column("n", pa.int64(), "", "values in the cell"),
    Column("s", pa.int64(), "µs or bytes", "their sum"),
    Column("mx", pa.int64(), "µs or bytes", "their maximum (a percentile is the maximum of its bin)"),
]

_SUM_NOTE = "summed over the file's requests of the group"
REQUEST_SUM_COLUMNS: list[Column] = [
    *[Column(n, pa.string(), u, d) for n, u, d in (
        ("proxy_id", "", "id of the proxy instance"), ("conn_id", "", "connection id"),
        ("client_id", "", "client_id ((none) when the request had none)"), ("client_addr", "host:port", "client address"),
        ("broker_addr", "host:port", "broker address"), ("api_name", "", "Kafka API name"),
        ("group_id", "", "consumer group id"))],
    Column("acks", pa.int16(), "", "Produce acks"),
    Column("compression", pa.string(), "", "compression codec(s)"),
    Column("status", pa.string(), "", "answered | unanswered | no_response"),
    Column("requests", pa.int64(), "", "requests in the group"),
    Column("first_ns", TIMESTAMP, "timestamp", "first request's first byte"),
    Column("last_ns", TIMESTAMP, "timestamp", "last request's first byte"),
    Column("request_bytes", pa.int64(), "bytes", "request bytes, " + _SUM_NOTE),
    Column("response_bytes", pa.int64(), "bytes", "response bytes, " + _SUM_NOTE),
    Column("max_request_bytes", pa.int32(), "bytes", "largest request"),
    Column("records", pa.int64(), "records", "records produced, " + _SUM_NOTE + " (0 for Fetch: a fetched batch's records are not counted, its bytes are in `record_bytes`)"),
    Column("record_bytes", pa.int64(), "bytes", "record-batch bytes, " + _SUM_NOTE),
    Column("requests_with_errors", pa.int64(), "", "requests whose worst error is a real error (protocol.error_kinds)"),
    Column("requests_retriable", pa.int64(), "", "requests whose worst error is retriable"),
    Column("protocol_steps", pa.int64(), "", "requests answered with a protocol step only"),
    Column("long_polls", pa.int64(), "", "Fetch and ShareFetch requests that only waited (no data, broker latency >= 80 % of max_wait)"),
    Column("max_wait_ms", pa.int32(), "ms", "largest Fetch / ShareFetch max_wait"),
    Column("throttled_requests", pa.int64(), "", "answers with throttle_time_ms > 0"),
    Column("throttle_ms", pa.int64(), "ms", "throttle time, " + _SUM_NOTE),
    Column("max_throttle_ms", pa.int32(), "ms", "longest throttle"),
    Column("first_throttled_ns", TIMESTAMP, "timestamp", "first throttled request"),
    Column("peak_response_bytes_per_s", pa.float64(), "bytes/s", "fastest transfer of a response of 65,535 bytes or more (an unscaled TCP window)"),
    Column("faults_injected", pa.int64(), "", "requests the proxy injected a Kafka fault into"),
]
TOPIC_SUM_COLUMNS: list[Column] = [
    Column("client_id", pa.string(), "", "client_id ((none) when the request had none)"),
    Column("client_host", pa.string(), "", "client host (client_addr without the port)"),
    Column("api_name", pa.string(), "", "Produce | Fetch | ShareFetch"),
    Column("topic", pa.string(), "", "topic as recorded (an id when the proxy did not know the name yet); null: none"),
    Column("compression", pa.string(), "", "compression codec(s)"),
    Column("b", pa.int64(), "epoch s", "start of the request's 60 s bucket"),
    Column("requests", pa.int64(), "", "requests (a request with n topics counts in each)"),
    Column("first_ns", TIMESTAMP, "timestamp", "first request's first byte"),
    Column("last_ns", TIMESTAMP, "timestamp", "last request's first byte"),
    Column("records", pa.int64(), "records", "records of the whole requests, " + _SUM_NOTE),
    Column("requests_with_records", pa.int64(), "", "requests that carried a record count"),
    Column("record_bytes", pa.int64(), "bytes", "record-batch bytes of the whole requests, " + _SUM_NOTE),
    Column("fetch_bytes_split", pa.float64(), "bytes", "record-batch bytes per topic: as the request row gives them (`topic_record_bytes`), otherwise split evenly over the request's topics"),
    Column("split_records", pa.float64(), "records", "records per topic: as the request row gives them (`topic_records`), otherwise split evenly over the request's topics"),
    Column("max_request_bytes", pa.int32(), "bytes", "largest request"),
    Column("empty", pa.int64(), "", "requests that brought the topic no record bytes (a fetch that brought another topic's only is empty for this one)"),
    Column("long_polls", pa.int64(), "", "Fetch and ShareFetch requests that only waited"),
]
TRAFFIC_SUM_COLUMNS: list[Column] = [
    Column("broker_addr", pa.string(), "host:port", "broker address"),
    Column("client_id", pa.string(), "", "client_id ((none) when the request had none)"),
    Column("b", pa.int64(), "epoch s", "start of the requests' 60 s bucket"),
    Column("requests", pa.int64(), "", "requests"),
    Column("request_bytes", pa.int64(), "bytes", "request bytes"),
    Column("sized_requests", pa.int64(), "", "requests with a size"),
    Column("response_bytes", pa.int64(), "bytes", "response bytes"),
    Column("produced_records", pa.int64(), "records", "records produced"),
]
_NOTABLE = ("proxy_id", "conn_id", "client_id", "api_name", "broker_addr", "req_first_ns", "request_bytes", "acks", "topics",
            "group_id", "errors", "error_count", "edit", "bypass", "advertised", "topic_ids")
NOTABLE_REQUEST_COLUMNS: list[Column] = [
    (Column("ts_ns", c.type, c.unit, c.doc) if c.name == "req_first_ns" else c)
    for c in sorted((c for c in REQUEST_COLUMNS if c.name in _NOTABLE), key=lambda c: _NOTABLE.index(c.name))
]
_SLOWEST = ("proxy_id", "conn_id", "correlation_id", "req_first_ns", "api_name", "api_version", "client_id", "broker_addr",
            "topics", "topic_ids", "latency_us", "broker_latency_us", "request_bytes", "response_bytes", "status", "errors",
            "error_count")
SLOWEST_REQUEST_COLUMNS: list[Column] = [
    (Column("ts_ns", c.type, c.unit, c.doc) if c.name == "req_first_ns" else c)
    for c in sorted((c for c in REQUEST_COLUMNS if c.name in _SLOWEST), key=lambda c: _SLOWEST.index(c.name))
]

COLUMNS: dict[str, list[Column]] = {
    "requests": REQUEST_COLUMNS,
    "connections": CONNECTION_COLUMNS,
    "tcp": TCP_COLUMNS,
    "frames": FRAME_COLUMNS,
    "topics": TOPIC_COLUMNS,
    "runs": RUN_COLUMNS,
    "latency_cells": LATENCY_CELL_COLUMNS,
    "request_sums": REQUEST_SUM_COLUMNS,
    "topic_sums": TOPIC_SUM_COLUMNS,
    "traffic_sums": TRAFFIC_SUM_COLUMNS,
    "notable_requests": NOTABLE_REQUEST_COLUMNS,
    "slowest_requests": SLOWEST_REQUEST_COLUMNS,
}


def arrow_schema(dataset: str) -> pa.Schema:
    """The pyarrow schema of one dataset, with the format version in its metadata."""
    cols = COLUMNS[dataset]
    return pa.schema(
        [pa.field(c.name, c.type) for c in cols],
        metadata={FORMAT_KEY: str(FORMAT_VERSION).encode(), b"kafkatap.dataset": dataset.encode()},
    )


def markdown_table(dataset: str) -> str:
    """A README table for one dataset: column, type, unit, meaning."""
    lines = ["| column | type | unit | meaning |", "|---|---|---|---|"]
    for c in COLUMNS[dataset]:
        doc = c.doc.replace("|", "\\|")  # "explicit | transparent" must not split the table's cells
        lines.append(f"| `{c.name}` | {c.type} | {c.unit} | {doc} |")
    return "\n".join(lines)


def column_names_module() -> str:
    """The text of `recording/column_names.py`: every dataset's column names, and the tcp struct's fields."""
    lines = [
        '"""Every dataset\'s column names in schema order, for processes that need no Arrow types (the proxy).',
        "",
        "Generated from recording/schema.py by `python -m recording.schema --names > recording/column_names.py`:",
        "do not edit; tests/recording/test_column_names.py fails when it is stale.",
        '"""',
        "",
        "COLUMN_NAMES: dict[str, tuple[str, ...]] = {",
    ]
    for name, cols in COLUMNS.items():
        lines.append(f'    "{name}": (')
        lines += [f'        "{c.name}",' for c in cols]
        lines.append("    ),")
    lines += ["}", "", "TCP_FIELD_NAMES: tuple[str, ...] = ("]
    lines += [f'    "{c.name}",' for c in TCP_FIELDS]
    lines += [")", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--names"]:
        print(column_names_module(), end="")
    else:
        for name in DATASETS:
            print(f"### `{name}/`\n\n{markdown_table(name)}\n")
