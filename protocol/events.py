"""Events the sans-I/O decoder emits, and the summaries they carry.

This module is the contract between `protocol/` and its callers (the proxy,
the recorder, replay). Timestamps are whatever integer clock the caller passes
in (the proxy uses epoch nanoseconds); the decoder never reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Direction(str, Enum):
    """Which way bytes flow: client→broker carries requests, broker→client responses."""

    REQUEST = "request"
    RESPONSE = "response"


@dataclass(slots=True)
class ErrorSeen:
    """One non-zero error code in a response and where it occurred."""

    code: int
    name: str
    topic: str | None = None
    partition: int | None = None
    resource: str | None = None  # group id, transactional id, … when not a partition


@dataclass(slots=True)
class BatchSeen:
    """Facts read from one record-batch header, without decompressing it."""

    topic: str
    partition: int
    magic: int
    base_offset: int
    record_count: int
    batch_bytes: int
    compression: str  # none | gzip | snappy | lz4 | zstd | unknown
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    transactional: bool = False
    control: bool = False


@dataclass(slots=True)
class PartitionFetched:
    """One partition in a Fetch response."""

    topic: str  # name, or topic id (uuid string) for Fetch v13+
    partition: int
    error_code: int
    high_watermark: int
    records_bytes: int


@dataclass(slots=True)
class Summary:
    """What the hot path extracts from a request or response body.

    Every field is optional: a summarizer fills what its API carries. Fields a
    caller does not find here can be had from the full decode (`deep`).
    """

    # requests
    topics: list[str] = field(default_factory=list)  # names, or topic ids as uuid strings
    partitions: int = 0  # topic-partitions touched
    acks: int | None = None
    timeout_ms: int | None = None
    transactional_id: str | None = None
    batches: list[BatchSeen] = field(default_factory=list)
    records: int = 0
    record_bytes: int = 0
    max_wait_ms: int | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    isolation_level: int | None = None
    fetch_session_id: int | None = None
    fetch_session_epoch: int | None = None
    group_id: str | None = None
    member_id: str | None = None
    generation_id: int | None = None
    coordinator_key: str | None = None
    client_software_name: str | None = None
    client_software_version: str | None = None
    sasl_mechanism: str | None = None
    # responses
    throttle_ms: int | None = None
    errors: list[ErrorSeen] = field(default_factory=list)
    fetched: list[PartitionFetched] = field(default_factory=list)
    coordinator: str | None = None  # "host:port" (FindCoordinator response)
    brokers: list[str] = field(default_factory=list)  # "id@host:port" (Metadata response)
    producer_id: int | None = None  # InitProducerId response
    producer_epoch: int | None = None
    # anything API-specific that has no column of its own: small values, and on the answers that pair topic names
    # with ids (Metadata v10+, CreateTopics v7+, DescribeTopicPartitions) "topic_pairs", one (16-byte id, name)
    # per topic, which the proxy takes out (`proxy.observer`) before the row is built
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class RequestSeen:
    """A whole request frame arrived from the client."""

    offset: int  # stream offset of the frame's first byte (the size prefix)
    size: int  # whole frame including the 4-byte size prefix
    first_byte_ns: int
    last_byte_ns: int
    api_key: int
    api_version: int
    api_name: str
    correlation_id: int
    client_id: str | None
    expects_response: bool  # False for Produce acks=0
    summary: Summary | None  # None when the body was not decoded (see decode_note)
    decode_note: str | None = None  # why the body is opaque, e.g. "no schema for api 68 v1"


@dataclass(slots=True)
class ResponseSeen:
    """A whole response frame arrived from the broker, paired with its request."""

    offset: int
    size: int
    first_byte_ns: int
    last_byte_ns: int
    correlation_id: int
    request: RequestSeen | None  # None: no in-flight request had this correlation id
    summary: Summary | None
    decode_note: str | None = None


@dataclass(slots=True)
class StreamOpaque:
    """From `offset` on, one direction is no longer parsed: bytes are only counted.

    Emitted once per direction. `kind` is a stable machine-readable label
    (tls, http, oversize, negative_size, garbage, truncated, body_overrun,
    desync); `reason` is the human sentence for the log line.
    """

    direction: Direction
    offset: int
    kind: str
    reason: str


@dataclass(slots=True)
class StreamClosed:
    """The caller reported the end of the connection.

    `unanswered` holds every request still waiting for a response;
    `truncated` names the directions that ended in the middle of a frame.
    """

    unanswered: list[RequestSeen]
    truncated: dict[Direction, int]  # direction -> bytes of the unfinished frame
    at_ns: int


@dataclass(slots=True)
class RequestDropped:
    """A request the decoder saw but stopped waiting for, so it will get no row of its own.

    `reason`: `in_flight_cap` (the pairing map was full; the oldest request
    is given up), `correlation_id_reused` (a request reused the correlation id
    of one still in flight; the newer one is given up, the broker answers the
    older first). Callers count these so that requests seen == rows + drops.
    """

    request: RequestSeen
    reason: str


Event = RequestSeen | ResponseSeen | StreamOpaque | StreamClosed | RequestDropped
