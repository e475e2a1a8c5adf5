"""DescribeTopicPartitions onto a target without it, sent as the Metadata request the client asks there instead.

Why: Kafka's admin client (3.8 and later) describes topics by name with DescribeTopicPartitions (KIP-966).
It reads the broker's ApiVersions first, and where the broker lacks that API it never sends it: it asks
Metadata instead, for the same topics by name, without automatic creation (`KafkaAdminClient`'s fallback on
its own UnsupportedVersionException). A Kafka 3.7 broker closes the connection a DescribeTopicPartitions comes
on, so a replay that sent it as recorded lost the rest of that admin session (Kafka Streams' own admin client
describes its internal topics this way). Replay sends the Metadata request the client would have: same
correlation id and client id, at the newest Metadata version the target serves. A page of a paginated
describe that continues a topic (a request with a cursor) is skipped: the client's one Metadata request asked
for every partition. A page that starts at a new topic carries no cursor and goes out as another Metadata
request for its topics, one the client would not have sent (only a describe of over 2,000 partitions pages).

One API only: no other API the Java clients send has such a fallback in Kafka's clients. Pure functions over
the spec codec; `replay.rewrite` applies them, `replay.versions` words the set-up's note.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol.apis import APIS, DESCRIBE_TOPIC_PARTITIONS, METADATA
from protocol.deep import decode_request, encode_request
from protocol.frames import RequestFrame, parse_request

__all__ = ["SENT_AS_METADATA", "PAGE_COVERED", "falls_back", "as_metadata"]

SENT_AS_METADATA = "sent_as_metadata"  # the rewrite's name in the replay summary
PAGE_COVERED = "describe_page_covered_by_metadata"  # the skip reason of a page that continues a topic
_NO_AUTO_CREATION = 4  # the first Metadata version that can ask without creating the topics it names
_AUTHORIZED_OPERATIONS = 8  # the first with include_topic_authorized_operations


def falls_back(api_key: int, version: int, served: Mapping[int, tuple[int, int]]) -> int | None:
    """METADATA for a DescribeTopicPartitions the codec reads, onto a target that lacks that API and serves
    Metadata (`served`: the target's ApiVersions ranges); else None (sent as recorded)."""
    if api_key != DESCRIBE_TOPIC_PARTITIONS or api_key in served or not APIS[api_key].decodable(version):
        return None
    lo, hi = served.get(METADATA, (0, -1))
    return METADATA if lo <= hi else None


def as_metadata(frame: RequestFrame, served: Mapping[int, tuple[int, int]]) -> RequestFrame | None:
    """The Metadata request a client sends instead of this DescribeTopicPartitions (`falls_back` said so), or None
    for a page that continues a topic. Raises `protocol.errors.ProtocolError` for a body the codec cannot read."""
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
