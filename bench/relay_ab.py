"""Before/after for the relay's small-request latency: two checkouts of kafkatap, side by side, one venv.

    .venv/bin/python bench/relay_ab.py --before ../base [--rounds 4] [--requests 3000]

Why it exists: comparing two work trees with `bench/proxy_overhead.py` run from each tree's own venv
mixed in the venvs' differences (one had numpy, pandas and pyspark, the other not), and the first-started
of two proxies measured slower whichever code it ran. Here both proxies are started from *this* venv's
Python (`python -m kafkatap.cli` with the checkout as working directory, so its packages come first on
`sys.path`), both record to Parquet (as `proxy_overhead` does), and the whole comparison runs twice, once
in each start order. The probe is `proxy_overhead`'s: one captured small acks=1 Produce, request by
request, rotating over direct, after and before so that machine noise hits every path alike.

Prints the added p50 (and p99) over direct per round and order, and the mean of the per-round
differences after − before over both orders.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench.proxy_overhead import capture_produce_frame, pct, probe_interleaved, wait_port  # noqa: E402
from harness.kafka import LocalKafka, free_port  # noqa: E402


def start_proxy(checkout: Path, upstream: int, rec: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kafkatap.cli", "--log-level", "warning", "proxy", "--workers", "1",
                             "--route", f"127.0.0.1:{port}=127.0.0.1:{upstream}", "--record", str(rec)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=checkout)
    wait_port(port)
    return proc, port


def one_order(order: list[tuple[str, Path]], kafka: LocalKafka, frame: bytes, tmp: Path, rounds: int,
              requests: int) -> list[dict[str, tuple[float, float]]]:
    """Start the proxies in `order`, warm up, then `rounds` interleaved probes: per round, name -> (p50, p99) added."""
    procs = []
    ports = {"direct": kafka.port}
    try:
        for name, checkout in order:
            proc, ports[name] = start_proxy(checkout, kafka.port, tmp / f"rec-{name}-{len(procs)}-{order[0][0]}")
            procs.append(proc)
        probe_interleaved(ports, frame, 500)
        out = []
        for _ in range(rounds):
            lat = probe_interleaved(ports, frame, requests)
            d50, d99 = pct(lat["direct"], .5), pct(lat["direct"], .99)
            out.append({k: (pct(v, .5) - d50, pct(v, .99) - d99) for k, v in lat.items() if k != "direct"})
        return out
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)


def compare(before: Path, tmp: Path, rounds: int, requests: int) -> list[float]:
    """after − before p50 added, per round, over both start orders, against one LocalKafka (proxies record in
    `tmp`)."""
    p_cap = free_port()
    kafka = LocalKafka(broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{p_cap}"})
    kafka.start()
    diffs = []
    try:
        frame = capture_produce_frame(f"127.0.0.1:{p_cap}", f"127.0.0.1:{kafka.port}", "bench-lat")
        sides = [("after", ROOT), ("before", before)]
        for order in (sides, sides[::-1]):
            for r, added in enumerate(one_order(order, kafka, frame, tmp, rounds, requests)):
                print(f"{order[0][0]} started first, round {r}: " + "; ".join(
                    f"{k} +{a50:.0f} µs p50 (+{a99:.0f} p99)" for k, (a50, a99) in added.items()), flush=True)
                diffs.append(added["after"][0] - added["before"][0])
    finally:
        kafka.stop()
        kafka.cleanup()
    return diffs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the other checkout (a git worktree of the old commit)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=3000, help="probe requests per path per round")
    args = ap.parse_args()
    before = args.before.resolve()
    if not (before / "kafkatap" / "cli.py").exists():
        ap.error(f"{before} is not a kafkatap checkout")
    tmp = Path(tempfile.mkdtemp(prefix="kt-relay-ab-"))
    try:
        diffs = compare(before, tmp, args.rounds, args.requests)
    finally:  # every proxy's recording: only the latencies are wanted
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"after − before, p50 added, mean of {len(diffs)} rounds over both orders: {sum(diffs) / len(diffs):+.1f} µs "
          f"(per round: {', '.join(f'{d:+.0f}' for d in diffs)})")


if __name__ == "__main__":
    main()
