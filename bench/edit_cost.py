"""What cluster mode's frame editing costs per request, with no I/O: the address check and the whole cycle.

    .venv/bin/python bench/edit_cost.py                     # this checkout
    .venv/bin/python bench/edit_cost.py --before REV        # REV's code and this checkout's, alternating

Cluster mode cannot forward a Produce, Fetch, ShareFetch or ShareAcknowledge response before it knows
the response carries no broker address (KIP-951 node endpoints live in a top-level tag at the frame's
end), so that check (`protocol.addresses.no_addresses_in`) and the framing around it
(`proxy.intercept.FrameEditor` with the cluster-mode `AddressRewriter`) are on the latency path of
every such response. This bench times both on frames built by the codec, in the interpreter alone:

* check: `no_addresses_in` on one response frame;
* cycle: one request and its response fed to a frame editor (head parsing, pairing, the check, the
  hand-over to a connection that writes nothing).

Cases: Produce v11 with 1 and 3 partitions, Produce v12 with 10, and a Fetch v17 response of three
partitions of 64 KiB each (its record sets are skipped by length). Each figure is the median of 5
repeats of N calls. With `--before REV`, each repeat runs REV's code (extracted with `git archive`)
and this checkout's in fresh interpreters, alternating, and the ratio after / before is printed:
interpreter-only figures drift less than the proxy benches, but a machine's hour still moves them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASES = (("produce", 11, 1), ("produce", 11, 3), ("produce", 12, 10), ("fetch", 17, 3))


def _frames(kind: str, version: int, parts: int, count: int) -> list[tuple[bytes, bytes]]:
    from protocol.deep import encode_request, encode_response

    if kind == "produce":
        req = {"transactional_id": None, "acks": 1, "timeout_ms": 30000,
               "topic_data": [{"name": "bench", "partition_data": [{"index": i, "records": b"x" * 200}
                                                                    for i in range(parts)]}]}
        resp = {"responses": [{"name": "bench", "partition_responses": [
            {"index": i, "error_code": 0, "base_offset": 1000, "log_append_time_ms": -1, "log_start_offset": 0,
             "record_errors": [], "error_message": None} for i in range(parts)]}], "throttle_time_ms": 0}
        key = 0
    else:
        topic = "6f1f0bc4-6c1a-4f3e-9b1b-7c2d7e0d0a11"
        req = {"max_wait_ms": 500, "min_bytes": 1, "max_bytes": 52428800, "isolation_level": 0,
               "session_id": 0, "session_epoch": -1,
               "topics": [{"topic_id": topic, "partitions": [
                   {"partition": i, "current_leader_epoch": 0, "fetch_offset": 0, "last_fetched_epoch": -1,
                    "log_start_offset": -1, "partition_max_bytes": 1048576} for i in range(parts)]}],
               "forgotten_topics_data": [], "rack_id": ""}
        resp = {"throttle_time_ms": 0, "error_code": 0, "session_id": 11, "responses": [{"topic_id": topic, "partitions": [
            {"partition_index": i, "error_code": 0, "high_watermark": 100, "last_stable_offset": 100,
             "log_start_offset": 0, "preferred_read_replica": -1, "aborted_transactions": None,
             "records": bytes([i]) * 65536} for i in range(parts)]}]}
        key = 1
    return [(encode_request(key, version, c, "bench", req), encode_response(key, version, c, resp))
            for c in range(count)]


class _NoConnection:
    """The connection a frame editor hands its output to: it writes nothing and records nothing."""

    def send(self, request: bool, data: Any, now_ns: int) -> None:
        pass

    def send_many(self, request: bool, pieces: Any, now_ns: int) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kw: None


def measure(calls: int) -> dict[str, dict[str, float]]:
    """µs per check and per request/response cycle, for every case (one repeat), in this interpreter."""
    from protocol.addresses import no_addresses_in
    from proxy.cluster import AddressRewriter, BrokerRegistry
    from proxy.intercept import FrameEditor

    out = {}
    loop = asyncio.new_event_loop()
    for kind, version, parts in CASES:
        key = 0 if kind == "produce" else 1
        frames = _frames(kind, version, parts, calls)
        reg = BrokerRegistry("127.0.0.1", lambda node: 20000 + node, lambda route: 1)
        editor = FrameEditor(AddressRewriter(reg, "bench"), _NoConnection(), loop, time.monotonic_ns)
        it = iter(frames)

        def cycle() -> None:
            rq, rs = next(it)
            editor.feed(True, rq, 0)
            editor.feed(False, rs, 0)

        resp = frames[0][1]
        assert no_addresses_in(resp, key, version), "the bench's responses carry no address: the check must say so"
        out[f"{kind} v{version}, {parts} partition(s)"] = {
            "check_us": timeit.timeit(lambda: no_addresses_in(resp, key, version), number=calls) / calls * 1e6,
            "cycle_us": timeit.timeit(cycle, number=calls) / calls * 1e6,
        }
    loop.close()
    return out


def _run_tree(tree: Path, calls: int) -> dict[str, dict[str, float]]:
    """One repeat in a fresh interpreter that imports the project from `tree`."""
    env_code = (f"import sys; sys.path[:0] = [{str(tree)!r}]; import protocol, json; "
                f"assert protocol.__file__.startswith({str(tree)!r}), protocol.__file__; "
                f"sys.path.insert(1, {str(ROOT / 'bench')!r}); import edit_cost; "
                f"print(json.dumps(edit_cost.measure({calls})))")
    out = subprocess.run([sys.executable, "-c", env_code], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"measuring {tree} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def _alternate(trees: dict[str, Path], repeats: int, calls: int) -> dict[str, list[dict[str, dict[str, float]]]]:
    """`repeats` measurements of every tree, their order swapped each repeat (the first run after a pause pays
    for a cold CPU and cache)."""
    runs: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in trees}
    for i in range(repeats):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for name in order:
            runs[name].append(_run_tree(trees[name], calls))
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", metavar="REV", help="also measure git revision REV's code, alternating")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20000, help="calls per repeat and case")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from revisions import extract_revision

    trees = {"after": ROOT}
    if args.before:
        trees = {"before": Path(extract_revision(ROOT, args.before)), "after": ROOT}
    try:
        runs = _alternate(trees, args.repeats, args.calls)
    finally:  # REV's extracted tree (~85 MB, every CI run through the test) goes whatever happens
        if "before" in trees:
            shutil.rmtree(trees["before"], ignore_errors=True)
    print(f"µs per call, median of {args.repeats} repeats of {args.calls:,} calls"
          + (f"; before = {args.before}, after = this checkout" if args.before else ""))
    for case in runs["after"][0]:
        cells = []
        for what in ("check_us", "cycle_us"):
            med = {name: statistics.median(r[case][what] for r in rs) for name, rs in runs.items()}
            text = f"{what[:-3]} {med['after']:.1f}"
            if "before" in med:
                text = f"{what[:-3]} {med['before']:.1f} → {med['after']:.1f} ({med['after'] / med['before']:.2f} ×)"
            cells.append(text)
        print(f"  {case}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
