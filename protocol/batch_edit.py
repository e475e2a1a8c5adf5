"""Edit v2 record-batch headers in place, never touching (or decompressing) the records.

Why here: replay must hand a target broker the producer id it allocated, and
Kafka-aware fault injection will want to corrupt a base offset or a sequence
on purpose. Both are edits of fixed fields in the 61-byte v2 header (layout
and offsets in `protocol.records`); the only subtlety is the CRC-32C, which
covers everything from the attributes field to the end of the batch and so
must be recomputed after an edit of any field behind it (producer id, epoch,
base sequence, timestamps …) but not after one of the base offset or the
partition leader epoch, which sit in front of it (the broker rewrites those).

Everything works on bytes: no sockets, no clocks. Legacy magic 0/1 message
sets and a partial trailing batch are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from struct import Struct

from kafka.record.util import calc_crc32c

from protocol.records import (
    ATTRIBUTES_AT,
    BASE_OFFSET_AT,
    BASE_SEQUENCE_AT,
    BATCH_LENGTH_AT,
    CRC_AT,
    LAST_OFFSET_DELTA_AT,
    LEADER_EPOCH_AT,
    LOG_OVERHEAD,
    MAGIC_AT,
    PRODUCER_EPOCH_AT,
    PRODUCER_ID_AT,
    V2_HEADER,
    V2_HEADER_BYTES,
)

__all__ = ["BatchHeader", "crc32c", "batch_crc", "crc_valid", "read_header", "edit_batch", "iter_batches",
           "records_producer_ids", "rewrite_records_producer"]

_I16 = Struct(">h")
_I32 = Struct(">i")
_I64 = Struct(">q")
_U32 = Struct(">I")


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli), as Kafka's v2 record batches use.

    Why kafka-python's: it ships a table-driven pure-Python implementation
    (and uses the `crc32c` C extension when installed); a second copy here
    would only be a second place for a bug.
    """
    return calc_crc32c(memoryview(data)) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """Every field of a v2 batch header, in layout order."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int


def _check_v2(batch: bytes | bytearray | memoryview) -> None:
    if len(batch) < V2_HEADER_BYTES or batch[MAGIC_AT] != 2:
        raise ValueError("not a magic v2 record batch")


def read_header(batch: bytes | bytearray | memoryview) -> BatchHeader:
    """The header of the v2 batch at the start of `batch` (ValueError for anything else)."""
    _check_v2(batch)
    return BatchHeader(*V2_HEADER.unpack_from(batch, 0))


def batch_crc(batch: bytes | bytearray | memoryview) -> int:
    """The CRC-32C a v2 batch should carry: over attributes … end of the batch."""
    size = LOG_OVERHEAD + _I32.unpack_from(batch, BATCH_LENGTH_AT)[0]
    return crc32c(memoryview(batch)[ATTRIBUTES_AT:size])


def crc_valid(batch: bytes | bytearray | memoryview) -> bool:
    """Does the stored CRC match the batch's bytes? (what a broker checks before appending)."""
    _check_v2(batch)
    return _U32.unpack_from(batch, CRC_AT)[0] == batch_crc(batch)


def edit_batch(batch: bytes | bytearray | memoryview, *, base_offset: int | None = None,
               partition_leader_epoch: int | None = None, producer_id: int | None = None,
               producer_epoch: int | None = None, base_sequence: int | None = None,
               fix_crc: bool = True) -> bytes:
    """One v2 record batch with the given header fields replaced and, by default, its CRC-32C recomputed.

    `fix_crc=False` keeps the stored CRC (a deliberately corrupt batch, for
    fault injection). Fields left as None are copied; the records are never
    touched, compressed or not.
    """
    b = bytearray(batch)
    _check_v2(b)
    if base_offset is not None:
        _I64.pack_into(b, BASE_OFFSET_AT, base_offset)
    if partition_leader_epoch is not None:
        _I32.pack_into(b, LEADER_EPOCH_AT, partition_leader_epoch)
    if producer_id is not None:
        _I64.pack_into(b, PRODUCER_ID_AT, producer_id)
    if producer_epoch is not None:
        _I16.pack_into(b, PRODUCER_EPOCH_AT, producer_epoch)
    if base_sequence is not None:
        _I32.pack_into(b, BASE_SEQUENCE_AT, base_sequence)
    if fix_crc:
        _U32.pack_into(b, CRC_AT, batch_crc(b))
    return bytes(b)


def iter_batches(records: bytes | bytearray | memoryview) -> Iterator[tuple[int, int]]:
    """(offset, size) of every complete batch (or legacy message) in a records field."""
    p, n = 0, len(records)
    while n - p >= MAGIC_AT + 1:
        length = _I32.unpack_from(records, p + BATCH_LENGTH_AT)[0]
        size = LOG_OVERHEAD + length
        if length < 0 or p + size > n:
            return
        yield p, size
        p += size


def _producer(records: bytes, p: int, size: int) -> tuple[int, int] | None:
    """(producer id, epoch) of the batch at p when it is v2 and has one (idempotent/transactional)."""
    if size < V2_HEADER_BYTES or records[p + MAGIC_AT] != 2:
        return None
    pid = _I64.unpack_from(records, p + PRODUCER_ID_AT)[0]
    if pid < 0:
        return None
    return pid, _I16.unpack_from(records, p + PRODUCER_EPOCH_AT)[0]


def records_producer_ids(records: bytes | None) -> list[tuple[int, int]]:
    """(producer_id, epoch) of every v2 batch with a producer id, in order."""
    if not records:
        return []
    return [got for p, size in iter_batches(records) if (got := _producer(records, p, size)) is not None]


def rewrite_records_producer(records: bytes, mapping: Callable[[int, int], tuple[int, int] | None],
                             sequence: Callable[[int, int], int] | None = None) -> tuple[bytes, int]:
    """Give every v2 batch whose (pid, epoch) `mapping` maps the new pair; returns (records, batches changed).

    `sequence`, when given, maps such a batch's (base sequence, record count) to the base sequence it gets
    (replay continues a producer's sequences where the target kept its epoch and the origin did not).
    Batches without a producer id (pid -1), legacy magic 0/1 messages, a
    partial trailing batch and batches `mapping` answers None for are copied
    unchanged; when nothing changed, `records` itself is returned.
    """
    parts: list[bytes] = []
    changed = 0
    last = 0
    for p, size in iter_batches(records):
        got = _producer(records, p, size)
        target = mapping(*got) if got is not None else None
        if target is None:
            continue
        seq = None
        if sequence is not None:
            count = _I32.unpack_from(records, p + LAST_OFFSET_DELTA_AT)[0] + 1
            seq = sequence(_I32.unpack_from(records, p + BASE_SEQUENCE_AT)[0], count)
        parts.append(records[last:p])
        parts.append(edit_batch(records[p:p + size], producer_id=target[0], producer_epoch=target[1], base_sequence=seq))
        last = p + size
        changed += 1
    if not changed:
        return records, 0
    parts.append(records[last:])
    return b"".join(parts), changed
