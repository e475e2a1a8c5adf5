"""Tagged fields no spec knows, spliced into real encoded frames — what a broker newer than the specs sends.

Why by hand and not through the codec: the tests check that the codec keeps
such fields, so the codec writes only the fields the specs know and the rest
is spliced into its output here. A tagged-field section
is `uvarint count` then `uvarint tag, uvarint size, value` per field, in
ascending tag order (KIP-482).
"""

from __future__ import annotations

import struct

from protocol.apis import METADATA
from protocol.deep import encode_response
from protocol.summaries.varint import uv

TOPIC_OPS = 0x0BADF00D  # a topic_authorized_operations value that marks where the topic entry ends
BROKER_TAGS = {7: b"new-broker-field", 300: b"\x00\x01"}  # 300: a two-byte tag number
TOPIC_TAGS = {1: b"\xff" * 130}  # a value longer than a one-byte size
TOP_TAGS = {0: b"", 42: b"x"}


def uvarint(n: int) -> bytes:
    """An unsigned varint as Kafka writes it (7 bits a byte, low bits first); not the codec's, which is tested."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def section_after(frame: bytes, marker: bytes) -> int:
    """Where the tagged-field section right after the one occurrence of `marker` starts."""
    assert frame.count(marker) == 1, f"{marker!r} is not unique in the frame"
    return frame.index(marker) + len(marker)


def with_unknown_tags(frame: bytes, at: int, extra: dict[int, bytes]) -> bytes:
    """`frame` (size prefix included) with `extra` added to the tagged-field section at `at`.

    The fields already there are kept; all are written in ascending tag order,
    and the size prefix is fixed. The section must not sit inside another
    tagged field (whose size would then be wrong).
    """
    count, p = uv(frame, at, len(frame))
    fields = []
    for _ in range(count):
        tag, p = uv(frame, p, len(frame))
        size, p = uv(frame, p, len(frame))
        fields.append((tag, frame[p:p + size]))
        p += size
    assert not set(extra) & {tag for tag, _ in fields}
    fields = sorted(fields + list(extra.items()))
    section = uvarint(len(fields)) + b"".join(uvarint(tag) + uvarint(len(v)) + v for tag, v in fields)
    out = frame[:at] + section + frame[p:]
    return struct.pack(">i", len(out) - 4) + out[4:]


def metadata_frame(version: int) -> bytes:
    """A Metadata response as a newer broker might send it: unknown tags in a broker, a topic and the body."""
    frame = encode_response(METADATA, version, 11, {
        "throttle_time_ms": 0, "cluster_id": "clu", "controller_id": 1,
        "brokers": [{"node_id": i, "host": "10.0.0.1", "port": 9092 + i, "rack": f"r{i}"} for i in (1, 2, 3)],
        "topics": [{"error_code": 0, "name": "orders", "topic_id": "6f1f0bc4-6c1a-4f3e-9b1b-7c2d7e0d0a11",
                    "is_internal": False, "topic_authorized_operations": TOPIC_OPS,
                    "partitions": [{"error_code": 0, "partition_index": 0, "leader_id": 2, "leader_epoch": 4,
                                    "replica_nodes": [1, 2], "isr_nodes": [1, 2], "offline_replicas": []}]}]})
    frame = with_unknown_tags(frame, len(frame) - 1, TOP_TAGS)  # the body's own section ends the frame
    frame = with_unknown_tags(frame, section_after(frame, TOPIC_OPS.to_bytes(4, "big")), TOPIC_TAGS)
    return with_unknown_tags(frame, section_after(frame, b"\x03r2"), BROKER_TAGS)
