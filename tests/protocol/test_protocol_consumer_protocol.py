"""Topic renames inside Kafka's consumer protocol bytes (`protocol.consumer_protocol`), byte by byte."""

from __future__ import annotations

import pytest

from protocol.consumer_protocol import rename_consumer_assignment, rename_consumer_subscription

TMAP = {"probe": "probe-staging"}


def test_subscriptions_and_assignments_as_recorded_from_real_clients() -> None:
    """Subscriptions (v0 and librdkafka's v3) and assignments."""
    v0 = b"\x00\x00\x00\x00\x00\x01\x00\x05probe\x00\x00\x00\x00"  # kafka-python
    assert rename_consumer_subscription(v0, TMAP) == b"\x00\x00\x00\x00\x00\x01\x00\x0dprobe-staging\x00\x00\x00\x00"
    v3 = b"\x00\x03\x00\x00\x00\x01\x00\x05probe\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00"  # librdkafka
    assert rename_consumer_subscription(v3, TMAP) == v3.replace(b"\x00\x05probe", b"\x00\x0dprobe-staging")
    owned = (b"\x00\x01\x00\x00\x00\x01\x00\x05probe\xff\xff\xff\xff"
             b"\x00\x00\x00\x01\x00\x05probe\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01")
    assert rename_consumer_subscription(owned, TMAP).count(b"probe-staging") == 2
    asg = b"\x00\x00\x00\x00\x00\x01\x00\x05probe\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x00"
    assert rename_consumer_assignment(asg, TMAP) == asg.replace(b"\x00\x05probe", b"\x00\x0dprobe-staging")
    assert rename_consumer_subscription(v0, {}) == v0
    with pytest.raises(ValueError):
        rename_consumer_subscription(v0[:-3], TMAP)
