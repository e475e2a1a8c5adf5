"""Build request/response frames and record batches with kafka-python's codec, for the rewrite tests.

Why kafka-python: the frames must be what real clients send; its classes are
compiled from Kafka's JSON specs, independently of our rewrite code.
"""

from __future__ import annotations

from typing import Any

from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from protocol.deep import message_class


def request(api_key: int, version: int, cid: int = 7, client_id: str | None = "test-client", **fields: Any) -> bytes:
    msg = message_class(api_key, True)(version=version, **fields)
    msg.with_header(correlation_id=cid, client_id=client_id)
    return bytes(msg.encode(version=version, header=True, framed=True))


def response(api_key: int, version: int, cid: int = 1, **fields: Any) -> bytes:
    msg = message_class(api_key, False)(version=version, **fields)
    msg.with_header(correlation_id=cid)
    return bytes(msg.encode(header=True, framed=True))  # version set at construction (a response header has none)


def cls(api_key: int, request: bool = True) -> Any:
    return message_class(api_key, request)


def batch(producer_id: int = -1, epoch: int = -1, base_sequence: int = -1, records: int = 3,
          compression: int = 0, transactional: bool = False, key: bytes = b"k") -> bytes:
    """One v2 record batch as a producer builds it."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=transactional,
                                  producer_id=producer_id, producer_epoch=epoch, base_sequence=base_sequence,
                                  batch_size=1 << 20)
    for i in range(records):
        b.append(i, timestamp=1_700_000_000_000 + i, key=key + b"%d" % i, value=b"value-%d" % i, headers=[])
    return bytes(b.build())


def parse_batch(data: bytes) -> DefaultRecordBatch:
    return DefaultRecordBatch(bytearray(data))


def produce(records_by_partition: dict[int, bytes], topic: str = "orders", version: int = 9, acks: int = -1,
            transactional_id: str | None = None, cid: int = 7, client_id: str = "test-client") -> bytes:
    P = cls(0)
    return request(0, version, cid, client_id, transactional_id=transactional_id, acks=acks, timeout_ms=1000,
                   topic_data=[P.TopicProduceData(version=version, name=topic, partition_data=[
                       P.TopicProduceData.PartitionProduceData(version=version, index=p, records=r)
                       for p, r in records_by_partition.items()])])
