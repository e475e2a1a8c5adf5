"""Frame builders for protocol tests: kafka-python's encoders, never hand-typed bytes."""

from __future__ import annotations

import os
import uuid
from typing import Any

from kafka.record.memory_records import MemoryRecordsBuilder

from protocol.deep import message_class


def records(n: int = 3, value_size: int = 100, compression: int = 0, magic: int = 2,
            producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
            transactional: bool = False, seed: bytes | None = None) -> bytes:
    """One record batch (or legacy message set) of n records."""
    b = MemoryRecordsBuilder(magic, compression, batch_size=1 << 30, producer_id=producer_id,
                             producer_epoch=producer_epoch, base_sequence=base_sequence,
                             transactional=transactional)
    val = (seed or os.urandom(16)) * (value_size // 16 + 1)
    for i in range(n):
        b.append(1_700_000_000_000 + i, key=b"k%d" % i, value=val[:value_size])
    b.close()
    return bytes(b.buffer())


def request(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 7,
            client_id: str | None = "test-client") -> bytes:
    cls = message_class(api_key, True)
    msg = cls[version](**body)
    msg.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(msg.encode(framed=True, header=True))


def response(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 7) -> bytes:
    cls = message_class(api_key, False)
    msg = cls[version](**body)
    msg.with_header(correlation_id=correlation_id)
    return bytes(msg.encode(framed=True, header=True))


def produce_request(version: int = 9, acks: int = 1, topics: dict[str, dict[int, bytes]] | None = None,
                    transactional_id: str | None = None, cid: int = 7) -> bytes:
    topics = topics or {"orders": {0: records()}}
    cls = message_class(0, True)
    td = []
    for name, parts in topics.items():
        pd = [cls.TopicProduceData.PartitionProduceData(index=p, records=r) for p, r in parts.items()]
        kw: dict[str, Any] = {"partition_data": pd}
        if version >= 13:
            kw["topic_id"] = uuid.uuid5(uuid.NAMESPACE_DNS, name)
        else:
            kw["name"] = name
        td.append(cls.TopicProduceData(**kw))
    body = {"acks": acks, "timeout_ms": 30000, "topic_data": td}
    if version >= 3:
        body["transactional_id"] = transactional_id
    return request(0, version, body, cid)


def fetch_response(version: int = 12, parts: int = 4, part_bytes: int = 256 * 1024, topic: str = "orders",
                   error_code: int = 0, cid: int = 7) -> bytes:
    cls = message_class(1, False)
    T = cls.FetchableTopicResponse
    P = T.PartitionData
    blob = records(n=max(1, part_bytes // 1024), value_size=1000)
    # pad/trim to the requested size with whole batches
    reps = max(1, part_bytes // len(blob))
    data = blob * reps
    plist = [P(partition_index=i, error_code=error_code, high_watermark=1000 + i, last_stable_offset=1000 + i,
               log_start_offset=0, aborted_transactions=None if version >= 4 else None,
               preferred_read_replica=-1, records=data) for i in range(parts)]
    tkw: dict[str, Any] = {"partitions": plist}
    if version >= 13:
        tkw["topic_id"] = uuid.uuid5(uuid.NAMESPACE_DNS, topic)
    else:
        tkw["topic"] = topic
    body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 12, "responses": [T(**tkw)]}
    return response(1, version, body, cid)


def metadata_response(version: int = 12, topics: int = 50, partitions: int = 3, cid: int = 7,
                      bad_topic: str | None = None) -> bytes:
    cls = message_class(3, False)
    B = cls.MetadataResponseBroker
    T = cls.MetadataResponseTopic
    P = T.MetadataResponsePartition
    brokers = [B(node_id=i, host=f"broker-{i}.example", port=9092, rack=None) for i in range(3)]
    tl = []
    for t in range(topics):
        name = f"topic-{t:03d}"
        plist = [P(error_code=0, partition_index=p, leader_id=p % 3, leader_epoch=1,
                   replica_nodes=[0, 1, 2], isr_nodes=[0, 1, 2], offline_replicas=[]) for p in range(partitions)]
        tl.append(T(error_code=0, name=name, topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, name), is_internal=False,
                    partitions=plist))
    if bad_topic:
        tl.append(T(error_code=3, name=bad_topic, topic_id=None, is_internal=False, partitions=[]))
    body = {"throttle_time_ms": 0, "brokers": brokers, "cluster_id": "abc", "controller_id": 0, "topics": tl}
    return response(3, version, body, cid)
