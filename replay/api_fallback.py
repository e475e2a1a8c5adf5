"""A request of an API the target lacks, sent as the client falls back to sending it there.

Why: a client newer than the broker does not give up on a feature an older API also serves. Kafka's admin
client (3.8 and later) describes topics by name with DescribeTopicPartitions (KIP-966); a broker without it
answers UNSUPPORTED_VERSION, and the client asks Metadata instead: the same topics by name, no automatic
creation. A Kafka 3.7 broker closes the connection a DescribeTopicPartitions comes on, so a replay that sent it
as recorded lost the rest of that admin session (Kafka Streams' own admin client describes its internal topics
this way). Replay sends the Metadata request the client would have: same correlation id and client id, at the
newest Metadata version the target serves. The client asks once for all its topics, so the later pages of a
paginated describe (a request with a cursor) have nothing left to ask.

Pure functions over the spec codec; `replay.rewrite` applies them, `replay.versions` words the set-up's note.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol.apis import DESCRIBE_TOPIC_PARTITIONS, METADATA
from protocol.deep import decode_request, encode_request
from protocol.frames import RequestFrame, parse_request

__all__ = ["FALLBACK_APIS", "SENT_AS_METADATA", "PAGE_COVERED", "falls_back", "as_fallback"]

FALLBACK_APIS: Mapping[int, int] = {DESCRIBE_TOPIC_PARTITIONS: METADATA}  # the API a client asks instead
SENT_AS_METADATA = "sent_as_metadata"  # the rewrite's name in the replay summary
PAGE_COVERED = "describe_page_covered_by_metadata"  # the skip reason of a later page
_NO_AUTO_CREATION = 4  # the first Metadata version that can ask without creating the topics it names
_AUTHORIZED_OPERATIONS = 8  # the first with include_topic_authorized_operations


def falls_back(api_key: int, served: Mapping[int, tuple[int, int]]) -> int | None:
    """The API a client of a target serving `served` sends instead of `api_key`, when the target lacks `api_key`
    and serves that one; else None."""
    instead = FALLBACK_APIS.get(api_key)
    if instead is None or api_key in served or instead not in served:
        return None
    lo, hi = served[instead]
    return instead if lo <= hi else None


def as_fallback(frame: RequestFrame, served: Mapping[int, tuple[int, int]]) -> RequestFrame | None:
    """`frame` (an API with a fallback, see `falls_back`) as the request the client sends instead, or None for a
    request the fallback's one answer already covered (a later page of a paginated describe)."""
    body = decode_request(frame.data)["body"]
    if body.get("cursor") is not None:
        return None
    version = served[METADATA][1]
    every = None if version >= 1 else []  # Metadata's every topic: null (v1+), an empty list (v0)
    if version < _NO_AUTO_CREATION:  # it could create topics by asking: the client asks for every topic instead
        return _metadata(frame, version, {"topics": every})
    # no topics: DescribeTopicPartitions describes every topic
    topics = [{"name": t["name"]} for t in body.get("topics") or ()] or every
    fields = {"topics": topics, "allow_auto_topic_creation": False}
    if version >= _AUTHORIZED_OPERATIONS:
        fields["include_topic_authorized_operations"] = False
    return _metadata(frame, version, fields)


def _metadata(frame: RequestFrame, version: int, body: dict[str, Any]) -> RequestFrame:
    return parse_request(encode_request(METADATA, version, frame.correlation_id, frame.client_id, body))
