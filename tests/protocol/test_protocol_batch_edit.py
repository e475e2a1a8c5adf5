"""v2 record-batch header edits byte by byte (`protocol.batch_edit`).

Batches are built by kafka-python's record builder and read back by its
DefaultRecordBatch reader, whose `validate_crc()` is an independent check of
our CRC-32C.
"""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch

from protocol.batch_edit import (
    batch_crc,
    crc32c,
    crc_valid,
    edit_batch,
    iter_batches,
    read_header,
    records_producer_ids,
    rewrite_records_producer,
)
from protocol.records import (
    ATTRIBUTES_AT,
    BASE_OFFSET_AT,
    BASE_SEQUENCE_AT,
    BASE_TIMESTAMP_AT,
    BATCH_LENGTH_AT,
    CRC_AT,
    LAST_OFFSET_DELTA_AT,
    LEADER_EPOCH_AT,
    MAGIC_AT,
    MAX_TIMESTAMP_AT,
    PRODUCER_EPOCH_AT,
    PRODUCER_ID_AT,
    RECORD_COUNT_AT,
    V2_HEADER,
    V2_HEADER_BYTES,
)
from protocol_frames import records


def batch(producer_id: int = -1, epoch: int = -1, base_sequence: int = -1, n: int = 3, compression: int = 0,
          transactional: bool = False) -> bytes:
    return records(n=n, value_size=20, compression=compression, producer_id=producer_id, producer_epoch=epoch,
                   base_sequence=base_sequence, transactional=transactional, seed=b"0123456789abcdef")


def parse(data: bytes) -> DefaultRecordBatch:
    return DefaultRecordBatch(bytearray(data))


def batches_of(data: bytes) -> list[DefaultRecordBatch]:
    return [parse(data[p:p + size]) for p, size in iter_batches(data)]


def test_field_offsets_agree_with_the_header_layout() -> None:
    fmt = V2_HEADER.format.lstrip(">")
    assert [struct.calcsize(">" + fmt[:i]) for i in range(len(fmt))] == [
        BASE_OFFSET_AT, BATCH_LENGTH_AT, LEADER_EPOCH_AT, MAGIC_AT, CRC_AT, ATTRIBUTES_AT, LAST_OFFSET_DELTA_AT,
        BASE_TIMESTAMP_AT, MAX_TIMESTAMP_AT, PRODUCER_ID_AT, PRODUCER_EPOCH_AT, BASE_SEQUENCE_AT, RECORD_COUNT_AT]
    assert V2_HEADER.size == V2_HEADER_BYTES


def test_crc32c_known_vectors() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the Castagnoli check value
    assert crc32c(b"") == 0


def test_read_header_matches_kafka_pythons_reader() -> None:
    data = batch(producer_id=5, epoch=2, base_sequence=7, n=4, transactional=True)
    h, b = read_header(data), parse(data)
    assert (h.magic, h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) == (2, 5, 2, 7, 4)
    assert (h.base_offset, h.crc, h.last_offset_delta) == (b.base_offset, b.crc, b.last_offset_delta)
    assert h.attributes & 0x10 and h.batch_length == len(data) - 12
    assert crc_valid(data) and batch_crc(data) == h.crc
    with pytest.raises(ValueError):
        read_header(records(magic=1))  # a legacy message set is not a v2 batch
    with pytest.raises(ValueError):
        read_header(data[:V2_HEADER_BYTES - 1])


@pytest.mark.parametrize("compression", [0, 1])  # none, gzip: records stay untouched either way
def test_batch_producer_rewrite_keeps_records_and_crc_valid(compression: int) -> None:
    original = batch(producer_id=5, epoch=0, base_sequence=0, n=4, compression=compression)
    new = edit_batch(original, producer_id=987654321, producer_epoch=7)
    b = parse(new)
    assert b.validate_crc()
    assert (b.producer_id, b.producer_epoch, b.base_sequence) == (987654321, 7, 0)
    assert [r.value for r in b] == [r.value for r in parse(original)]
    assert len(new) == len(original) and new[V2_HEADER_BYTES:] == original[V2_HEADER_BYTES:]
    assert new[:CRC_AT] == original[:CRC_AT]  # nothing in front of the CRC moved
    assert not parse(original[:17] + b"\0\0\0\0" + original[21:]).validate_crc()  # the reader does check


def test_fields_in_front_of_the_crc_leave_it_alone() -> None:
    original = batch(producer_id=5, epoch=0, base_sequence=0)
    moved = edit_batch(original, base_offset=1234, partition_leader_epoch=9)
    h = read_header(moved)
    assert (h.base_offset, h.partition_leader_epoch) == (1234, 9)
    assert h.crc == read_header(original).crc and crc_valid(moved)
    assert moved[21:] == original[21:]


def test_base_sequence_edit_recomputes_crc_unless_told_not_to() -> None:
    original = batch(producer_id=5, epoch=0, base_sequence=0)
    seq = edit_batch(original, base_sequence=100)
    assert parse(seq).base_sequence == 100 and parse(seq).validate_crc() and crc_valid(seq)
    corrupt = edit_batch(original, base_sequence=100, fix_crc=False)  # fault injection: a batch the broker rejects
    assert not crc_valid(corrupt) and not parse(corrupt).validate_crc()
    assert corrupt[CRC_AT:CRC_AT + 4] == original[CRC_AT:CRC_AT + 4]


def test_records_rewrite_touches_only_idempotent_batches() -> None:
    idem = batch(producer_id=5, epoch=1, base_sequence=0)
    plain = batch(producer_id=-1)
    other = batch(producer_id=6, epoch=0, base_sequence=3)
    data = idem + plain + other
    assert records_producer_ids(data) == [(5, 1), (6, 0)]
    new, changed = rewrite_records_producer(data, lambda pid, ep: (100, 2) if pid == 5 else None)
    assert changed == 1
    a, b, c = batches_of(new)
    assert a.validate_crc() and (a.producer_id, a.producer_epoch) == (100, 2)
    assert b.producer_id == -1 and new[len(idem):len(idem) + len(plain)] == plain
    assert c.producer_id == 6 and new[-len(other):] == other
    same, none = rewrite_records_producer(data, lambda pid, ep: None)
    assert (same, none) == (data, 0)


def test_records_rewrite_can_renumber_sequences() -> None:
    """Replay continues a producer's sequences (replay.state.TargetProducer): the base sequence each batch gets is
    asked with its record count (kafka-python's reader checks the CRC and reads the new sequence)."""
    data = batch(producer_id=5, epoch=1, base_sequence=0, n=3) + batch(producer_id=5, epoch=1, base_sequence=3, n=2)
    asked: list[tuple[int, int]] = []

    def sequence(seq: int, count: int) -> int:
        asked.append((seq, count))
        return seq + 40

    new, changed = rewrite_records_producer(data, lambda pid, ep: (100, 2), sequence)
    assert changed == 2 and asked == [(0, 3), (3, 2)]
    assert [(b.base_sequence, b.producer_id, b.validate_crc()) for b in batches_of(new)] == [(40, 100, True), (43, 100, True)]


def test_partial_trailing_batch_and_legacy_messages_are_copied() -> None:
    idem = batch(producer_id=5, epoch=1, base_sequence=0)
    legacy = records(magic=1, n=1)
    data = legacy + idem + idem[:30]  # a Fetch-style partial batch at the end
    assert [size for _, size in iter_batches(data)] == [len(legacy), len(idem)]
    assert records_producer_ids(data) == [(5, 1)]
    new, changed = rewrite_records_producer(data, lambda pid, ep: (7, 7))
    assert changed == 1 and new[:len(legacy)] == legacy and new[-30:] == idem[:30]
    assert int.from_bytes(new[len(legacy) + PRODUCER_ID_AT:len(legacy) + PRODUCER_ID_AT + 8], "big") == 7
    assert records_producer_ids(None) == [] and records_producer_ids(b"") == []
