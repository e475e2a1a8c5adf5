"""µs per operation of the protocol/ hot path vs kafka-python's full decode of the same frame.

    .venv/bin/python bench/parse.py            # table to stdout
    .venv/bin/python bench/parse.py --markdown # the same as a Markdown table
    .venv/bin/python bench/parse.py --runs 5   # best of 5 whole passes (noisy shared hosts)

Frames are built with kafka-python's encoders (real record batches built by
its MemoryRecordsBuilder). Each figure is the best of 7 repeats of a timed
loop, timed with the process CPU clock (min is the least noisy estimate on a
shared machine; CPU time excludes the time spent waiting for a core).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.deep import decode_body, message_class  # noqa: E402
from protocol.events import Summary  # noqa: E402
from protocol.headers import parse_request_header, skip_request_header_tags  # noqa: E402
from protocol.stream import KafkaStream  # noqa: E402
from protocol.summaries.codegen import walker  # noqa: E402
from tests.protocol.protocol_frames import fetch_response, metadata_response, produce_request, records  # noqa: E402


def best_us(fn, min_time: float = 0.2) -> float:
    # CPU time of this process, not wall time: on a shared, oversubscribed host
    # wall time mostly measures how long we waited for a core.
    t = timeit.Timer(fn, timer=time.process_time)
    n, _ = t.autorange()
    n = max(1, int(n * min_time / 0.2))
    return min(t.repeat(7, n)) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--runs", type=int, default=1, help="repeat the whole table, keep each row's best (shared hosts)")
    args = ap.parse_args()
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.runs):
        for name, ours, theirs in measure():
            o, t = best.get(name, (ours, theirs))
            best[name] = (min(o, ours), min(t, theirs))
    rows = [(name, o, t) for name, (o, t) in best.items()]
    if args.markdown:
        print("| operation | kafkatap µs | kafka-python full decode µs | speed-up |")
        print("|---|---:|---:|---:|")
        for name, ours, theirs in rows:
            print(f"| {name} | {ours:.2f} | {theirs:.1f} | {theirs / ours:.1f}× |")
    else:
        print(f"{'operation':<70} {'kafkatap µs':>12} {'kafka-python µs':>16} {'ratio':>7}")
        for name, ours, theirs in rows:
            print(f"{name:<70} {ours:>12.2f} {theirs:>16.1f} {theirs / ours:>6.1f}×")


def measure() -> list[tuple[str, float, float]]:
    """One pass over every row: (operation, our µs, kafka-python µs)."""

    batch = records(n=16, value_size=1000, seed=os.urandom(16))  # ≈16 KiB, one v2 batch
    produce = produce_request(version=9, acks=-1, topics={"orders": {0: batch}})
    fetch = fetch_response(version=12, parts=4, part_bytes=256 * 1024)
    meta = metadata_response(version=12, topics=50, partitions=3)
    meta1 = memoryview(metadata_response(version=12, topics=50, partitions=1))

    key, ver, cid, client, p = parse_request_header(produce, 4, len(produce))
    body_pos = skip_request_header_tags(produce, p, len(produce), key, ver)
    pv = memoryview(produce)
    fv = memoryview(fetch)
    mv = memoryview(meta)
    Produce = message_class(0, True)
    Fetch = message_class(1, False)
    Meta = message_class(3, False)
    ReqHdr = Produce  # header decode path of kafka-python

    # the walkers KafkaStream's whole-frame fast path uses (optimistic: the plain walker redoes the
    # rare frame they bail out on), and the plain one beside them for the before/after comparison
    w_produce = walker(0, True, 9, optimistic=True)
    w_fetch = walker(1, False, 12, optimistic=True)
    w_meta = walker(3, False, 12, optimistic=True)
    w_meta_plain = walker(3, False, 12)

    rows = []

    rows.append((
        f"request header only (Produce v9, {len(produce)} B)",
        best_us(lambda: parse_request_header(pv, 4, len(pv))),
        best_us(lambda: ReqHdr.parse_header(io.BytesIO(produce[4:]), version=9)),
    ))
    rows.append((
        f"Produce v9 summary, 1 batch of {len(batch)} B",
        best_us(lambda: w_produce(pv, body_pos, len(pv), Summary())),
        best_us(lambda: Produce.decode(pv[body_pos:], version=9)),
    ))
    rows.append((
        f"Fetch v12 response summary, 4×256 KiB ({len(fetch) >> 10} KiB)",
        best_us(lambda: w_fetch(fv, 9, len(fv), Summary())),
        best_us(lambda: Fetch.decode(fv[9:], version=12)),
    ))
    rows.append((
        f"Metadata v12 response summary, 50 topics×3 partitions ({len(meta)} B)",
        best_us(lambda: w_meta(mv, 9, len(mv), Summary())),
        best_us(lambda: Meta.decode(mv[9:], version=12)),
    ))

    rows.append((
        f"Metadata v12 response summary, 50 topics×1 partition ({len(meta1)} B)",
        best_us(lambda: w_meta(meta1, 9, len(meta1), Summary())),
        best_us(lambda: Meta.decode(meta1[9:], version=12)),
    ))
    rows.append((
        "Metadata v12 summary 50×3, plain walker (before the optimistic one; slow path)",
        best_us(lambda: w_meta_plain(mv, 9, len(mv), Summary())),
        best_us(lambda: Meta.decode(mv[9:], version=12)),
    ))

    rows.append((
        "Metadata v12 response full decode, 50×3 (protocol.deep, spec codec; off the hot path)",
        best_us(lambda: decode_body(3, 12, False, mv[9:])),
        best_us(lambda: Meta.decode(mv[9:], version=12)),
    ))

    st = KafkaStream()  # one per connection, reused: per-frame cost only
    st.receive_request_data(produce, 1)  # stream offset > 0 from now on (no TLS sniffing)
    st.next_event()

    def stream_produce() -> None:
        st.receive_request_data(produce, 1)
        st.next_event()
        # what the response does: every fed frame must be a new request, not a reuse of a correlation id
        # still in flight (the stream reports those as dropped, a different and rarer path)
        st._in_flight.clear()

    rows.append((
        "KafkaStream: feed Produce frame + take RequestSeen",
        best_us(stream_produce),
        best_us(lambda: Produce.decode(pv[body_pos:], version=9)),
    ))

    def stream_fetch_chunked() -> None:
        s = KafkaStream()
        s._in_flight[7] = _FETCH_REQ  # pair without a request frame
        for i in range(0, len(fetch), 65536):
            s.receive_response_data(fv[i:i + 65536], 1)  # read-only views: no copies
        s.next_event()

    global _FETCH_REQ
    s0 = KafkaStream()
    from tests.protocol.protocol_frames import request
    s0.receive_request_data(request(1, 12, {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20,
                                            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": []}), 0)
    _FETCH_REQ = s0.next_event()
    rows.append((
        "KafkaStream: Fetch 4×256 KiB in 64 KiB chunks (incremental)",
        best_us(stream_fetch_chunked),
        best_us(lambda: Fetch.decode(fv[9:], version=12)),
    ))

    return rows


_FETCH_REQ = None

if __name__ == "__main__":
    main()
