"""What the p50 and p99 that kafkatap adds to a small acks=1 Produce are made of: relaying, decoding, recording.

    .venv/bin/python bench/latency_split.py [--rounds 5] [--probe 2000]

`bench/proxy_overhead.py` measures kafkatap against direct and HAProxy, with a relay-only proxy beside
them. This bench takes the kafkatap side apart, in one run: `kafkatap proxy --workers 1` as

* relay   — `--no-decode`: bytes relayed and counted, nothing parsed;
* decode  — every frame decoded, rows built and counted (`/metrics`), nothing recorded;
* record  — decoded and recorded (`--record DIR`), as `proxy_overhead.py` runs it;

side by side, in one run. One broker (LocalKafka 4.3.1) has a listener per path, each advertised as its
proxy's port. The probe is `proxy_overhead.py`'s: one captured Produce frame sent and answered
sequentially on a raw socket, rotating over the paths request by request, so machine noise hits every
path alike. (A change's before and after, two checkouts side by side: `bench/relay_ab.py`.)

`--quick` runs one short round (to check the bench works, not to measure).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_overhead import KAFKATAP, capture_produce_frame, pct, probe_interleaved, wait_port  # noqa: E402

from harness.kafka import LocalKafka, free_port  # noqa: E402

VARIANTS: dict[str, list[str]] = {"relay": ["--no-decode"], "decode": [], "record": ["--record", "{rec}"]}


def broker_props(ports: dict[str, tuple[int, int]]) -> dict[str, object]:
    """One listener per path (broker port), each advertised as that path's proxy port."""
    names = {path: f"P{i}" for i, path in enumerate(ports)}
    return {
        "listeners": "PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port},"
                     + ",".join(f"{names[p]}://127.0.0.1:{b}" for p, (b, _) in ports.items()),
        "advertised.listeners": "PLAINTEXT://127.0.0.1:{port},"
                                + ",".join(f"{names[p]}://127.0.0.1:{x}" for p, (_, x) in ports.items()),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
                                          + ",".join(f"{n}:PLAINTEXT" for n in names.values()),
        "num.network.threads": 3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--probe", type=int, default=2000, help="requests per path per round")
    ap.add_argument("--quick", action="store_true", help="one short round: checks the bench runs, measures nothing")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.probe = 1, 100
    os.environ.setdefault("KAFKATAP_LOG_FORMAT", "json")
    tmp = Path(tempfile.mkdtemp(prefix="kt-split-"))
    ports = {p: (free_port(), free_port()) for p in [*VARIANTS, "capture"]}  # (broker listener, proxy port)
    kafka = LocalKafka(broker_props=broker_props(ports), heap="1g")
    kafka.start()
    procs: list[subprocess.Popen] = []
    try:
        kafka.create_topic("bench", partitions=1)
        b, x = ports["capture"]
        frame = capture_produce_frame(f"127.0.0.1:{x}", f"127.0.0.1:{b}", "bench")
        for i, (name, flags) in enumerate(VARIANTS.items()):
            b, x = ports[name]
            procs.append(subprocess.Popen(
                [str(KAFKATAP), "--log-level", "warning", "proxy", "--workers", "1", "--route",
                 f"127.0.0.1:{x}=127.0.0.1:{b}", *(f.replace("{rec}", str(tmp / f"rec-{i}")) for f in flags)],
                stdout=subprocess.DEVNULL, stderr=open(tmp / f"proxy-{i}.log", "w")))
        for name in VARIANTS:
            wait_port(ports[name][1])
        probed = {"direct": kafka.port, **{name: ports[name][1] for name in VARIANTS}}
        lat: dict[str, list[int]] = {p: [] for p in probed}
        probe_interleaved(probed, frame, 300)  # warm-up: JIT, page cache, connections
        for r in range(args.rounds):
            for p, v in probe_interleaved(probed, frame, args.probe).items():
                lat[p].extend(v)
            print(f"round {r} p50 " + " ".join(f"{p}={pct(lat[p], .5):.0f}us" for p in probed), flush=True)
        d50, d99 = pct(lat["direct"], .5), pct(lat["direct"], .99)
        print(f"\n| path | p50 µs | added | p99 µs | added |\n|---|---:|---:|---:|---:|\n| direct | {d50:.0f} | | {d99:.0f} | |")
        for p in VARIANTS:
            p50, p99 = pct(lat[p], .5), pct(lat[p], .99)
            print(f"| {p} | {p50:.0f} | +{p50 - d50:.0f} | {p99:.0f} | +{p99 - d99:.0f} |")
        print(f"\n{args.rounds} rounds x {args.probe} requests per path; load {os.getloadavg()[0]:.1f}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        kafka.stop()


if __name__ == "__main__":
    main()
