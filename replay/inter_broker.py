"""Which recorded connections are a broker's own, not a client's: replay leaves them out.

Why: a proxy on a listener the brokers also use between themselves (a single
listener for clients and brokers, advertised as the proxy's address) records
the cluster's internal traffic beside its clients': a partition leader's
AddPartitionsToTxn verifications, the coordinator's WriteTxnMarkers, a
follower's Fetch. Replayed against another cluster, those requests come from
no broker of it: the target refuses them (CLUSTER_AUTHORIZATION_FAILED, an
unknown replica), and the replay's figures count refusals no client ever met.
A connection is a broker's when its requests are ones only brokers send
(`protocol.apis.BROKER_SENT_APIS`, AddPartitionsToTxn v4+, a Fetch or
OffsetForLeaderEpoch naming a replica), besides the few every connection
sends (ApiVersions, FindCoordinator, SASL): the whole connection is left out
and the plan counts its requests. One such request is not enough: Kafka's
Admin client aborts a hanging transaction with WriteTxnMarkers itself
(KIP-664, `kafka-transactions abort`), on a connection that also asks for
Metadata and DescribeProducers.
"""

from __future__ import annotations

from collections.abc import Iterable

from protocol.apis import (ADD_PARTITIONS_TO_TXN, ANY_CONNECTION_APIS, BROKER_ADD_PARTITIONS_MIN_VERSION,
                           BROKER_SENT_APIS, REPLICA_ID_APIS)
from protocol.frames import RequestFrame
from replay.messages import decode_spec_request

__all__ = ["SKIP_REASON", "SKIP_NOTE", "sent_by_broker", "broker_connection"]

# The plan's and the summary's reason for these requests, and what it means
SKIP_REASON = "inter_broker_connection"
SKIP_NOTE = ("a broker's own connections, recorded because the brokers also talk through this listener: transaction "
             "markers, a partition leader's AddPartitionsToTxn, a follower's Fetch, share-group state; the target's "
             "brokers would refuse them")


def _replica_id(frame: RequestFrame) -> int | None:
    """The replica a Fetch or OffsetForLeaderEpoch names (None: unreadable, or a version without one)."""
    try:
        body = decode_spec_request(frame)
    except Exception:  # noqa: BLE001 — an unreadable body says nothing about its sender; replay reports it elsewhere
        return None
    state = body.get("replica_state")  # Fetch v15+ (KIP-903): the id moved into a tagged struct
    value = state.get("replica_id") if isinstance(state, dict) else body.get("replica_id")
    return value if isinstance(value, int) else None


def sent_by_broker(frame: RequestFrame) -> bool:
    """A request only a broker or a controller sends (module docstring)."""
    key = frame.api_key
    if key in BROKER_SENT_APIS:
        return True
    if key == ADD_PARTITIONS_TO_TXN:
        return frame.api_version >= BROKER_ADD_PARTITIONS_MIN_VERSION
    if key in REPLICA_ID_APIS:
        replica = _replica_id(frame)
        return replica is not None and replica >= 0
    return False


def broker_connection(frames: Iterable[RequestFrame]) -> bool:
    """A connection's requests are a broker's (at least one), besides those any connection sends (module docstring)."""
    seen = False
    for f in frames:
        if f.api_key in ANY_CONNECTION_APIS:
            continue
        if not sent_by_broker(f):
            return False
        seen = True
    return seen
