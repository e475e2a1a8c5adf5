"""What the recording says about one connection, as plain data.

Why a separate object: the relay (sockets, transports, timers) and the rows
it records change for different reasons. The relay updates a
`ConnectionFacts`; `proxy.rows` and `proxy.inference` read it. Neither needs a
socket, so every column and every inference rule can be tested from facts
written by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from protocol.apis import APIS, BROKER_SENT_APIS
from proxy.inference import EndFacts


@dataclass(slots=True)
class FlowCounts:
    """Counters of one direction: bytes read from its source and frames parsed from them."""

    bytes: int = 0
    frames: int = 0


@dataclass(slots=True)
class End:
    """How a connection ended: the first end event wins."""

    reason: str  # schema vocabulary: client_fin | broker_rst | upstream_connect_failed | fault | …
    by: str  # client | broker | proxy
    detail: str | None
    idle_ms: int | None
    at_ns: int


@dataclass(slots=True)
class LastRequest:
    """The last request seen before the end: the evidence the close-cause rules weigh."""

    api: str | None = None
    size: int | None = None
    acks: int | None = None
    topics: list[str] = field(default_factory=list)
    batch_bytes: int | None = None  # largest record batch of a Produce
    at_ns: int | None = None  # its last byte
    key: int | None = None
    version: int | None = None


# API key → the oldest version a Kafka 4.x broker serves, for the APIs whose older versions Kafka 4.0 removed
# (KIP-896; the protocol table's `legacy_below`), as a client sends them. The APIs only brokers send are left out
# (WriteTxnMarkers, AlterPartition: an old broker's inter-broker protocol, not a client to upgrade), and so are the
# whole APIs it removed (ZooKeeper mode's LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown).
KAFKA_4_OLDEST: dict[int, int] = {k: i.legacy_below for k, i in APIS.items()
                                  if 0 < i.legacy_below <= i.max_version and k not in BROKER_SENT_APIS}
REMOVED_KEPT = 16  # distinct removed API versions named per connection


def removed_in_kafka_4(key: int | None, version: int | None) -> int | None:
    """The oldest version of API `key` a Kafka 4.x broker serves, when `version` is older (KIP-896); else None."""
    if key is None or version is None:
        return None
    oldest = KAFKA_4_OLDEST.get(key)
    return oldest if oldest is not None and version < oldest else None


PIPELINE_NS = 1_000_000_000  # how far before the last request an acks=0 Produce can still be what the broker refused


@dataclass(slots=True)
class ConnectionFacts:
    """Identity, counters, decode state and end of one proxied connection."""

    proxy_id: str
    conn_id: str
    listener: str
    mode: str  # explicit | transparent | cluster
    opened_ns: int
    client_addr: str | None = None
    original_dst: str | None = None
    broker_addr: str | None = None
    upstream_connect_us: int | None = None
    closed_ns: int | None = None
    from_client: FlowCounts = field(default_factory=FlowCounts)
    from_broker: FlowCounts = field(default_factory=FlowCounts)
    requests: int = 0
    responses: int = 0
    inflight: int = 0  # requests that expect a response and have none yet
    rows: int = 0  # request rows handed to the sink
    # requests seen that get no row, by reason (in_flight_cap, correlation_id_reused, decoder_failed):
    # requests == rows + sum(dropped) once the connection ended
    dropped: dict[str, int] = field(default_factory=dict)
    skipped_bytes: int = 0  # bytes relayed but never decoded (observation backlog over its bound)
    unanswered_at_end: int = 0
    client_ids: list[str] = field(default_factory=list)
    # "Produce v2": each API version this connection sent that Kafka 4.0 removed (KIP-896), in first-sent order
    removed_in_kafka_4: list[str] = field(default_factory=list)
    removed_first_ns: int | None = None  # last byte of the first such request
    # the broker answered that request or one sent after it: it serves them (a 3.x broker), so no close of this
    # connection is a 4.x broker's refusal of them
    removed_served: bool = False
    software_name: str | None = None
    software_version: str | None = None
    tls: bool = False
    opaque_kind: str | None = None
    opaque_reason: str | None = None
    last: LastRequest = field(default_factory=LastRequest)
    # the largest acks=0 Produce that no answer to a later request has cleared (`blamed_request`)
    acks0_suspect: LastRequest | None = None
    too_large: int = 0  # Produce answers with MESSAGE_TOO_LARGE / RECORD_LIST_TOO_LARGE
    too_large_example: str | None = None
    sasl_seen: bool = False  # a SaslHandshake or SaslAuthenticate request
    sasl_error: str | None = None  # the first refused SASL step: "SaslAuthenticate: SASL_AUTHENTICATION_FAILED"
    answered_beyond_versions: bool = False  # a request other than ApiVersions was answered
    fault_detail: str | None = None  # set when an injected fault ends the connection
    # what a frame editor (proxy.intercept: cluster rewriting, Kafka faults) did, by correlation id, until the
    # request's row takes it; bounded like the in-flight map (the editor notes only requests it saw)
    edits: dict[int, str] = field(default_factory=dict)
    edit_stopped: str | None = None  # why the editor gave up (TLS, garbage, …): relayed as is, or closed (cluster)
    edit_oversize: int = 0  # frames an interceptor wanted but too large to edit: forwarded unedited
    end: End | None = None
    inferred: str | None = None
    tcp_client_open: dict[str, Any] | None = None
    tcp_broker_open: dict[str, Any] | None = None
    tcp_client_close: dict[str, Any] | None = None
    tcp_broker_close: dict[str, Any] | None = None

    def blamed_request(self) -> LastRequest:
        """The request an end most likely answers: the last one, or the largest recent acks=0 Produce.

        Why: a client pipelines acks=0 Produces without waiting, so when the broker closes on reading one
        it refuses (a batch over message.max.bytes), smaller ones sent after it are already on the wire,
        and "the last request" named a 300-byte Produce to another topic. Only when the broker ended the
        connection, the suspect is larger than the last request, no answer to a later request cleared it,
        and it went out within `PIPELINE_NS` of the last request.
        """
        last, suspect, end = self.last, self.acks0_suspect, self.end
        if (suspect is None or end is None or end.by != "broker" or (suspect.size or 0) <= (last.size or 0)
                or (last.at_ns or 0) - (suspect.at_ns or 0) > PIPELINE_NS):
            return last
        return suspect

    def end_facts(self) -> EndFacts:
        """The evidence `proxy.inference.inferred_cause` weighs (call once the end is known)."""
        end = self.end
        assert end is not None
        ms_since_last = ((end.at_ns - self.last.at_ns) // 1_000_000) if self.last.at_ns else None
        last = self.blamed_request()
        return EndFacts(
            end_reason=end.reason, end_by=end.by, idle_before_end_ms=end.idle_ms,
            unanswered=self.unanswered_at_end, last_api=last.api, last_request_bytes=last.size,
            last_request_acks=last.acks, last_request_topics=last.topics, last_request_batch_bytes=last.batch_bytes,
            ms_since_last_request=ms_since_last,
            fault_detail=self.fault_detail, end_detail=end.detail, opaque_kind=self.opaque_kind,
            too_large_rejections=self.too_large, too_large_example=self.too_large_example,
            sasl_seen=self.sasl_seen, sasl_error=self.sasl_error, answered_beyond_versions=self.answered_beyond_versions,
            last_api_version=last.version, oldest_served_by_4=removed_in_kafka_4(last.key, last.version),
            removed_unserved=self.removed_first_ns is not None and not self.removed_served,
        )
