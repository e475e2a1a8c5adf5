"""Cluster ids the harness passes to kafka-storage (no broker needed)."""

from __future__ import annotations

import base64

from harness.kafka import _kafka_uuid


def test_cluster_ids_never_look_like_an_option() -> None:
    """kafka-storage's parser takes an id starting with '-' for a flag; 1 in 64 random ids would (a CI failure)."""
    ids = [_kafka_uuid() for _ in range(3000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids)
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids[:50])
