"""Optimistic walkers skip runs of leaf structs with one regex match (`runtime.LeafRun`).

The run replaces a per-partition Python loop in the fast path (Metadata's
partitions, per-partition responses); it must change speed only. These
frames put every shape the run's pattern draws a line on — element counts
0, 1, 3, 40, 130 (a two-byte count, matched in chunks), replica lists of
0..16 items and longer ones, a non-zero error code, a non-empty tagged
section, null / short / long strings — through the optimistic walker and
the plain one: same Summary, or a bail-out where the plain walker must
decide (an error, tags, a count or length of more than one varint byte, as
before runs). Lists and strings longer than the run's 16 do not bail: the
run fails and the loop walks them.
"""

from __future__ import annotations

import re
import struct
from typing import Any, Callable

import pytest

from protocol.deep import encode_response
from protocol.events import Summary
from protocol.summaries.codegen import source, walker
from protocol.summaries.runtime import RUN_CHUNK, LeafRun

MARK = 0x7A6B5C4D  # partition index of the element a case edits; found in the frame by its bytes
UNKNOWN_TAG = b"\x01\x63\x00"  # a tagged section with one (unknown) tag 99 of zero bytes


def metadata(parts: int, replicas: int = 3, error: int = 0) -> dict[str, Any]:
    plist = [{"error_code": 0, "partition_index": p, "leader_id": p % 3, "leader_epoch": 1,
              "replica_nodes": list(range(replicas)), "isr_nodes": list(range(replicas)), "offline_replicas": []}
             for p in range(parts)]
    if plist:
        plist[-1].update(partition_index=MARK, error_code=error)
    topics = [{"error_code": 0, "name": f"topic-{t}", "topic_id": "00000000-0000-0000-0000-00000000000%d" % (t + 1),
               "is_internal": False, "partitions": plist if t == 1 else plist[:1], "topic_authorized_operations": 0}
              for t in range(3)]
    return {"throttle_time_ms": 0, "cluster_id": "c", "controller_id": 0, "topics": topics,
            "brokers": [{"node_id": 0, "host": "b0", "port": 9092, "rack": None}]}


def metadata_element_size(replicas: int) -> int:
    return 14 + 3 * 1 + 2 * 4 * replicas + 1  # fixed, three compact arrays (offline empty), tags


def offset_commit(parts: int, error: int = 0) -> dict[str, Any]:
    plist = [{"partition_index": p, "error_code": 0} for p in range(parts)]
    if plist:
        plist[-1].update(partition_index=MARK, error_code=error)
    return {"throttle_time_ms": 0, "topics": [{"name": "orders", "partitions": plist}]}


def elect_leaders(parts: int, message: str | None = None, error: int = 0) -> dict[str, Any]:
    plist = [{"partition_id": p, "error_code": 0, "error_message": None} for p in range(parts)]
    if plist:
        plist[-1].update(partition_id=MARK, error_code=error, error_message=message)
    return {"throttle_time_ms": 0, "error_code": 0,
            "replica_election_results": [{"topic": "orders", "partition_result": plist}]}


def frame(api_key: int, version: int, body: dict[str, Any], size_of_marked: int | None = None) -> memoryview:
    """The response frame; with `size_of_marked`, the marked element's tagged section made non-empty."""
    data = bytearray(encode_response(api_key, version, 9, body))
    if size_of_marked is not None:
        at = data.index(struct.pack(">i", MARK))
        start = at - 2 if api_key == 3 else at  # Metadata: ErrorCode comes before PartitionIndex
        end = start + size_of_marked - 1
        assert data[end] == 0
        data[end:end + 1] = UNKNOWN_TAG
        data[:4] = struct.pack(">i", len(data) - 4)
    return memoryview(bytes(data))


def walk(api_key: int, version: int, fr: memoryview, fn: Callable[..., Any]) -> Summary | None:
    """The walker's Summary, or None when it bails out (raises, or ends anywhere but the frame end)."""
    s = Summary()
    try:
        end = fn(fr, 9, len(fr), s)
    except Exception:  # noqa: BLE001 - a bail-out: the stream redoes the frame with the plain walker
        return None
    return s if end == len(fr) else None


def runs_of(api_key: int, version: int) -> list[LeafRun]:
    fn = walker(api_key, version=version, request=False, optimistic=True)
    return [v for v in fn.__globals__.values() if isinstance(v, LeafRun)]


RESPONSE_CASES: list[tuple[str, int, int, dict[str, Any], int | None, bool]] = []  # id, api, v, body, tags at, bails
for n in (0, 1, 2, 3, 40, 130):
    RESPONSE_CASES.append((f"metadata-{n}parts", 3, 12, metadata(n), None, False))
    RESPONSE_CASES.append((f"offsetcommit-{n}parts", 8, 9, offset_commit(n), None, False))
    RESPONSE_CASES.append((f"electleaders-{n}parts", 43, 2, elect_leaders(n), None, False))
for r in (*range(17), 17, 20, 126, 127):  # 127 items: a two-byte count, which optimistic walkers leave alone
    RESPONSE_CASES.append((f"metadata-{r}replicas", 3, 12, metadata(3, replicas=r), None, r > 126))
for n in (1, 3, 40):
    RESPONSE_CASES += [
        (f"metadata-error-{n}parts", 3, 12, metadata(n, error=6), None, True),
        (f"metadata-tags-{n}parts", 3, 12, metadata(n), metadata_element_size(3), True),
        (f"offsetcommit-error-{n}parts", 8, 9, offset_commit(n, error=3), None, True),
        (f"offsetcommit-tags-{n}parts", 8, 9, offset_commit(n), 7, True),
        (f"electleaders-error-{n}parts", 43, 2, elect_leaders(n, "no leader", error=84), None, True),
        (f"electleaders-message-{n}parts", 43, 2, elect_leaders(n, "m" * 15), None, False),
        (f"electleaders-long-message-{n}parts", 43, 2, elect_leaders(n, "m" * 100), None, False),
        (f"electleaders-longer-message-{n}parts", 43, 2, elect_leaders(n, "m" * 200), None, True),
        (f"electleaders-tags-{n}parts", 43, 2, elect_leaders(n), 8, True),
    ]


@pytest.mark.parametrize("api_key,version,body,tags_at,bails", [c[1:] for c in RESPONSE_CASES],
                         ids=[c[0] for c in RESPONSE_CASES])
def test_leaf_runs_give_the_plain_walkers_summary_or_bail(api_key: int, version: int, body: dict[str, Any],
                                                          tags_at: int | None, bails: bool) -> None:
    fr = frame(api_key, version, body, tags_at)
    want = walk(api_key, version, fr, walker(api_key, False, version))
    assert want is not None
    got = walk(api_key, version, fr, walker(api_key, False, version, optimistic=True))
    if bails:  # an error to report, tags to read, a multi-byte count: only the plain walker may answer
        assert got is None
    else:
        assert got == want
    assert runs_of(api_key, version), "this API's leaf struct is walked by a run"


def test_clean_runs_are_taken_by_the_regex() -> None:
    """Counts of 2+ clean elements go through the run's compiled patterns (else the loop would hide a dead run)."""
    fr = frame(3, 12, metadata(40))
    assert walk(3, 12, fr, walker(3, False, 12, optimistic=True)) is not None
    (run,) = runs_of(3, 12)
    assert 40 in run
    fr = frame(8, 9, offset_commit(130))  # above RUN_CHUNK: chunks, and a two-byte count
    assert walk(8, 9, fr, walker(8, False, 9, optimistic=True)) is not None
    (run,) = runs_of(8, 9)
    assert RUN_CHUNK in run and 130 % RUN_CHUNK in run and 130 not in run


def test_metadata_v12_optimistic_source_has_the_partition_run() -> None:
    """The Metadata fast path's partitions are a regex run; a change that drops it must fail here."""
    src, globs = source(3, False, 12, optimistic=True)
    m = re.search(r"if (n\d+) > 1 and \(m\d+ := (_rx\d+)\[\1\]\(d, p, lim\)\) is not None: p = m\d+\.end\(\); npart \+= \1",
                  src)
    assert m, src
    run = globs[m.group(2)]
    assert isinstance(run, LeafRun)
    assert run.element.startswith(rb"\x00\x00.{12}(?:\x00|\x01|\x02.{4}|") and run.element.endswith(rb"\x11.{64})\x00")


def test_leaf_run_chunks_long_counts_and_stays_bounded() -> None:
    """A count above RUN_CHUNK matches like one long pattern would, and compiles nothing per count."""
    run = LeafRun(rb"\x00\x00.{4}\x00")
    element = b"\x00\x00abcd\x00"
    data = element * 200 + b"tail"
    for n in (1, 63, 64, 65, 128, 200):
        m = run[n](data, 0, len(data))
        assert m is not None and m.end() == n * len(element)
    assert run[200](data, 0, len(data) - 5) is None  # the end bound is kept
    bad = bytearray(data)
    bad[150 * len(element)] = 1  # a non-zero error code in element 151
    assert run[200](bytes(bad), 0, len(bad)) is None and run[150](bytes(bad), 0, len(bad)) is not None
    assert set(run) <= set(range(RUN_CHUNK + 1))


def metadata_partition(error: int = 0, replicas: int = 3, tags: bytes = b"\x00") -> bytes:
    """One Metadata v12 partition as on the wire (error, index, leader, epoch, replicas, isr, offline, tags)."""
    nodes = bytes([replicas + 1]) + b"".join(struct.pack(">i", i) for i in range(replicas))
    return struct.pack(">hiii", error, 7, 1, 5) + nodes + nodes + b"\x01" + tags


@pytest.mark.parametrize("bad,why", [(metadata_partition(error=6), "error code"),
                                     (metadata_partition(error=256), "error code, high byte"),
                                     (metadata_partition(tags=UNKNOWN_TAG), "tagged section"),
                                     (metadata_partition(replicas=17), "17 replicas")])
def test_metadata_partition_run_matches_clean_elements_only(bad: bytes, why: str) -> None:
    """The run itself, on hand-built partitions: clean ones to their exact end, anything else not at all."""
    (run,) = runs_of(3, 12)
    clean = [metadata_partition(replicas=r) for r in range(17)] + [metadata_partition(replicas=3, tags=b"\x00")]
    data = b"".join(clean) + b"after"
    m = run[len(clean)](data, 0, len(data))
    assert m is not None and m.end() == len(data) - 5
    for at in (0, 5, len(clean)):
        elements = clean[:at] + [bad] + clean[at:]
        data = b"".join(elements)
        assert run[len(elements)](data, 0, len(data)) is None, why


def elect_leaders_partition(message: bytes | None, error: int = 0) -> bytes:
    """One ElectLeaders v2 partition result as on the wire (partition, error, compact nullable message, tags)."""
    text = b"\x00" if message is None else bytes([len(message) + 1]) + message
    return struct.pack(">ih", 3, error) + text + b"\x00"


def test_string_run_matches_short_strings_to_their_end() -> None:
    """A skipped string is one length byte and that many bytes: null, empty and 1..16 bytes match, 17 falls back."""
    (run,) = runs_of(43, 2)
    clean = [elect_leaders_partition(None)] + [elect_leaders_partition(b"x" * k) for k in range(17)]
    data = b"".join(clean) + b"\x00\x00"
    m = run[len(clean)](data, 0, len(data))
    assert m is not None and m.end() == len(data) - 2
    long = b"".join(clean[:3]) + elect_leaders_partition(b"x" * 17)
    assert run[4](long, 0, len(long)) is None
    bad = elect_leaders_partition(None, error=84) + elect_leaders_partition(None)
    assert run[2](bad, 0, len(bad)) is None
