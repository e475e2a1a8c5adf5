"""Kafka's consumer protocol: the bytes classic consumer groups carry inside JoinGroup and SyncGroup.

Why in `protocol/`: the broker treats these as opaque bytes, but members and
tools (DescribeGroups) read them, so anything that renames topics on the wire
(replay's --topic-map) must rename them here too. The layouts are Kafka's
ConsumerProtocolSubscription / ConsumerProtocolAssignment: non-flexible,
big-endian, with a leading i16 version:

  Subscription: version | topics [string] | user_data bytes | v1+: owned
                partitions [topic, [i32]] | v2+: generation i32 | v3+: rack
  Assignment:   version | [topic, [i32]] | user_data bytes

Only the topic-bearing parts are rebuilt; every other byte is copied.
"""

from __future__ import annotations

from struct import Struct

__all__ = ["rename_consumer_subscription", "rename_consumer_assignment"]

_I16 = Struct(">h")
_I32 = Struct(">i")


class _Buf:
    """A cursor over consumer-protocol bytes."""

    def __init__(self, data: bytes) -> None:
        self.d, self.p = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.p + n > len(self.d):
            raise ValueError("truncated consumer protocol bytes")
        out = self.d[self.p:self.p + n]
        self.p += n
        return out

    def i16(self) -> int:
        return _I16.unpack(self.take(2))[0]

    def i32(self) -> int:
        return _I32.unpack(self.take(4))[0]

    def string(self) -> str:
        n = self.i16()
        if n < 0:
            raise ValueError("null topic name")
        return self.take(n).decode()


def _str(name: str) -> bytes:
    raw = name.encode()
    return _I16.pack(len(raw)) + raw


def _topic_partitions(b: _Buf, topic_map: dict[str, str]) -> bytes:
    """[topic string, [partition i32]] with topics renamed."""
    n = b.i32()
    out = [_I32.pack(n)]
    for _ in range(max(0, n)):
        t = b.string()
        k = b.i32()
        out.append(_str(topic_map.get(t, t)) + _I32.pack(k) + b.take(4 * max(0, k)))
    return b"".join(out)


def rename_consumer_subscription(data: bytes, topic_map: dict[str, str]) -> bytes:
    """ConsumerProtocolSubscription (JoinGroup metadata) with topics renamed; ValueError if unparsable."""
    b = _Buf(bytes(data))
    version = b.i16()
    n = b.i32()
    out = [_I16.pack(version), _I32.pack(n)]
    for _ in range(max(0, n)):
        t = b.string()
        out.append(_str(topic_map.get(t, t)))
    ud = b.i32()
    out.append(_I32.pack(ud) + (b.take(ud) if ud > 0 else b""))
    if version >= 1 and b.p < len(b.d):
        out.append(_topic_partitions(b, topic_map))
    out.append(b.d[b.p:])
    return b"".join(out)


def rename_consumer_assignment(data: bytes, topic_map: dict[str, str]) -> bytes:
    """ConsumerProtocolAssignment (SyncGroup assignment) with topics renamed; ValueError if unparsable."""
    b = _Buf(bytes(data))
    version = b.i16()
    head = _I16.pack(version) + _topic_partitions(b, topic_map)
    return head + b.d[b.p:]
