"""Record-batch header reader: facts from the batch header, never decompressing.

Why only headers: a Produce request may carry megabytes of compressed records,
but everything the recorder needs (magic, base offset, record count, codec,
producer id/epoch, base sequence, transactional/control flags) sits in the
first 61 bytes of each v2 batch (the first 26 bytes of a legacy magic 0/1
message). The rest of each batch is skipped by its length.

Layout (KIP-98, magic 2):
  baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 |
  crc u32 | attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 |
  maxTimestamp i64 | producerId i64 | producerEpoch i16 | baseSequence i32 |
  recordCount i32                                         = 61 bytes
Legacy (magic 0/1): offset i64 | messageSize i32 | crc i32 | magic i8 |
  attributes i8 | [timestamp i64 if magic 1] | key bytes | value bytes
"""

from __future__ import annotations

from struct import Struct
from typing import Any, Generator

from protocol.events import BatchSeen

V2_HEADER_BYTES = 61
LOG_OVERHEAD = 12  # offset + length that precede every batch / legacy message
V2_HEADER = Struct(">qiibIhiqqqhii")  # the whole v2 header, in the order of the layout above
_V2 = V2_HEADER.unpack_from
# Byte offsets of the v2 header fields inside a batch (`protocol.batch_edit` edits them in place).
BASE_OFFSET_AT, BATCH_LENGTH_AT, LEADER_EPOCH_AT, MAGIC_AT, CRC_AT, ATTRIBUTES_AT = 0, 8, 12, 16, 17, 21
LAST_OFFSET_DELTA_AT, BASE_TIMESTAMP_AT, MAX_TIMESTAMP_AT = 23, 27, 35
PRODUCER_ID_AT, PRODUCER_EPOCH_AT, BASE_SEQUENCE_AT, RECORD_COUNT_AT = 43, 51, 53, 57
_PREFIX = Struct(">qiib").unpack_from  # offset, length, epoch-or-crc, magic

CODECS = ("none", "gzip", "snappy", "lz4", "zstd", "unknown", "unknown", "unknown")
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20


def read_batch(d: Any, p: int, remain: int, topic: str, partition: int) -> tuple[BatchSeen | None, int]:
    """Read the batch that starts at `d[p]`, with `remain` bytes left in the records field.

    `d` must hold at least min(61, remain) bytes from `p`. Returns the batch
    (None for a partial trailing batch, as brokers send in Fetch responses)
    and the number of bytes the batch occupies (0 when partial).
    """
    if remain >= V2_HEADER_BYTES and d[p + 16] == 2:  # MAGIC_AT; the common case: one unpack
        (base_offset, length, _, magic, _crc, attrs, _lod, _bts, _mts, pid, pep, bseq, count) = _V2(d, p)
        size = LOG_OVERHEAD + length
        if length < V2_HEADER_BYTES - LOG_OVERHEAD or size > remain:
            return None, 0
        return (
            BatchSeen(
                topic, partition, magic, base_offset, count, size, CODECS[attrs & 7],
                pid, pep, bseq, bool(attrs & TRANSACTIONAL_BIT), bool(attrs & CONTROL_BIT),
            ),
            size,
        )
    if remain < 17:
        return None, 0
    base_offset, length, _epoch, magic = _PREFIX(d, p)
    size = LOG_OVERHEAD + length
    if length < 0 or size > remain:
        return None, 0
    if magic >= 2:  # a v2 batch cut short, or a future magic: not read
        return None, 0
    if remain < 18:
        return None, 0
    attrs = d[p + 17]
    return BatchSeen(topic, partition, magic, base_offset, 1, size, CODECS[attrs & 3]), size


def scan(d: Any, p: int, n: int, lim: int, topic: str, partition: int, out: list[BatchSeen]) -> int:
    """Append every batch of the records field `d[p:p+n]` to `out`; return records seen.

    Stops quietly at a partial trailing batch or at `lim` (the frame end):
    the caller's own bounds check reports an overrun.
    """
    records = 0
    end = min(p + n, lim)
    while end - p >= 17:
        batch, size = read_batch(d, p, end - p, topic, partition)
        if batch is None:
            break
        out.append(batch)
        records += batch.record_count
        p += size
    return records


def scan_incremental(
    d: Any, p: int, lim: int, n: int, topic: str, partition: int, out: list[BatchSeen]
) -> Generator[tuple[int, int], tuple[Any, int, int], tuple[Any, int, int, int]]:
    """Same as `scan` for a records field that may extend past the bytes at hand.

    Yields (p, k) when it needs k bytes at p (the stream's incremental walker
    protocol, see `protocol.stream`), skips batch bodies without asking for
    them, and returns (d, p, lim, records) with p just past the field.
    """
    records = 0
    remain = n
    while remain >= 17:
        k = V2_HEADER_BYTES if remain >= V2_HEADER_BYTES else remain
        if p + k > lim:
            d, p, lim = yield (p, k)
        batch, size = read_batch(d, p, remain, topic, partition)
        if batch is None:
            break
        out.append(batch)
        records += batch.record_count
        p += size
        remain -= size
    return d, p + remain, lim, records
