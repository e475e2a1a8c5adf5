"""Which error codes in a response are trouble, which a client retries, and which are the protocol's own steps.

Why: every non-zero code used to count as an error. On a healthy cluster that is misleading from the
first minute. A dynamic member's first JoinGroup in the classic group protocol is answered
MEMBER_ID_REQUIRED (KIP-394: the coordinator hands out the member id that way), a rebalance is
announced to the group's members as REBALANCE_IN_PROGRESS on their Heartbeat, and a client newer
than its broker learns the broker's ApiVersions range from an UNSUPPORTED_VERSION answer (KIP-511).
A new operator's first report showed an error rate where nothing was wrong.

Three kinds, so a headline can count what matters and still show the rest:

- ``protocol_step``: the answer is how the protocol works; a correct client on a healthy cluster gets
  it. Only the (API, error) pairs in `PROTOCOL_STEPS`. Many of them still say something (many joins,
  many rebalances), so the errors table keeps them, and the hot-spot finding warns only when the
  same connections got them again and again.
- ``retriable``: Kafka's own clients retry it (the exception is a `RetriableException` in
  kafka-clients: a coordinator still loading, a leader moving, a topic being created). Normal in
  bursts (start-up, a broker restart), a problem when it lasts (a misspelt topic's
  UNKNOWN_TOPIC_OR_PARTITION, NOT_ENOUGH_REPLICAS, KAFKA_STORAGE_ERROR are retriable too): the
  report shows its rate beside the error rate, never hides it.
- ``error``: everything else.

Pure data and functions: the analytics turn the same sets into Spark expressions, and the proxy's
live counters call `error_kind`, so the report and `top` agree.
"""

from __future__ import annotations

from collections.abc import Iterable

ERROR = "error"
RETRIABLE = "retriable"
PROTOCOL_STEP = "protocol_step"

# worst first: a response with one real error among retriable ones is an error response
KIND_ORDER = (ERROR, RETRIABLE, PROTOCOL_STEP)

PROTOCOL_STEPS: frozenset[tuple[str, str]] = frozenset({
    ("JoinGroup", "MEMBER_ID_REQUIRED"),        # KIP-394: a dynamic member's first join (classic protocol)
    ("Heartbeat", "REBALANCE_IN_PROGRESS"),     # how the coordinator tells a member to rejoin, at each rebalance
    ("SyncGroup", "REBALANCE_IN_PROGRESS"),     # a member joined while the others synced: they rejoin (Java, librdkafka
                                                # log it at info level), at a healthy group's start too
    ("ApiVersions", "UNSUPPORTED_VERSION"),     # KIP-511: a newer client learns the broker's range
})

# Errors whose exception in kafka-clients 4.3.1 extends RetriableException (directly or through
# InvalidMetadataException / RefreshRetriableException). tests/protocol/test_error_kinds.py derives
# the same set from the kafka-clients sources jar (Errors.java and common/errors/), so a Kafka
# release that changes it fails there instead of drifting here.
RETRIABLE_ERRORS: frozenset[str] = frozenset({
    "CORRUPT_MESSAGE", "UNKNOWN_TOPIC_OR_PARTITION", "LEADER_NOT_AVAILABLE", "NOT_LEADER_OR_FOLLOWER",
    "REQUEST_TIMED_OUT", "REPLICA_NOT_AVAILABLE", "NETWORK_EXCEPTION", "COORDINATOR_LOAD_IN_PROGRESS",
    "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR", "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "NOT_CONTROLLER", "CONCURRENT_TRANSACTIONS", "KAFKA_STORAGE_ERROR", "FETCH_SESSION_ID_NOT_FOUND",
    "INVALID_FETCH_SESSION_EPOCH", "LISTENER_NOT_FOUND", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
    "OFFSET_NOT_AVAILABLE", "PREFERRED_LEADER_NOT_AVAILABLE", "ELIGIBLE_LEADERS_NOT_AVAILABLE",
    "ELECTION_NOT_NEEDED", "UNSTABLE_OFFSET_COMMIT", "THROTTLING_QUOTA_EXCEEDED", "UNKNOWN_TOPIC_ID",
    "INCONSISTENT_TOPIC_ID", "FETCH_SESSION_TOPIC_ID_ERROR", "SHARE_SESSION_NOT_FOUND",
    "INVALID_SHARE_SESSION_EPOCH", "SHARE_SESSION_LIMIT_REACHED",
})


def error_kind(api_name: str | None, error_name: str | None) -> str:
    """`protocol_step`, `retriable` or `error` for one error code's name in one API's response."""
    if error_name is None:
        return ERROR
    if (api_name, error_name) in PROTOCOL_STEPS:
        return PROTOCOL_STEP
    if error_name in RETRIABLE_ERRORS:
        return RETRIABLE
    return ERROR


def response_kind(api_name: str | None, error_names: Iterable[str | None]) -> str | None:
    """The worst kind among a response's error names (error > retriable > protocol_step); None without any."""
    kinds = {error_kind(api_name, n) for n in error_names}
    for kind in KIND_ORDER:
        if kind in kinds:
            return kind
    return None
