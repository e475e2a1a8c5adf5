"""Saturated requests/s of `kafkatap proxy --workers 1` vs `--workers 2`, in one run.

    .venv/bin/python bench/workers.py                 # 3 rounds, 5 s warm-up + 10 s window each
    .venv/bin/python bench/workers.py --quick         # 1 round, short windows: checks that it works
    .venv/bin/python bench/workers.py --capacity --rounds 2   # the highest rate each records in full

How (and why this way):
1. Real frames: one Produce, Fetch and Metadata request/response pair captured from a
   real kafka-python session through the proxy (`bench/recording_cost.py`'s
   `capture_frames`, a real LocalKafka broker), so the workers decode real requests.
2. The upstream is cheap on purpose: a fake broker in its own process answers each
   captured request with its captured response (correlation id rewritten), far less
   work per request than the proxy's relay + decode + recording, so it is not what
   saturates. `--upstreams K` runs K of them on one port (SO_REUSEPORT).
3. The load generator runs in its own process: 32 connections x 32 requests in flight,
   the pipelining wire client of `recording_cost.Load`, with no rate limit, so the proxy
   is always busy (`--rate R` offers R requests/s in all instead: below saturation, every
   request should be decoded); it counts the responses it received in the measurement window.
   By default the load and the fake broker are bench/wireload.c (`--load c`, compiled with the
   system's cc; bench/wire_load.py): on two cores whatever they spend is taken from the workers,
   and the Python ones (`--load python`: `--loaders` uvloop processes of 16 connections each,
   and FakeBroker) took 40-50 % of the two cores at two workers' capacity. The report prints the
   CPU the load and the broker used beside the proxy's.
4. The proxy is the real command, `kafkatap proxy --workers N --record DIR` (recording on,
   as an operator runs it; `--no-record` to measure the relay alone), started fresh for
   each measurement; 1 and 2 workers alternate within a round.

`--capacity` answers the issue's question for a proxy that must record everything: per worker count,
the highest offered rate at which no connection falls behind decoding, the rows keep up with what
is relayed, and the recorder keeps up with the rows: none dropped, and the rows written to Parquet over
the window >= 95 % of those decoded (or its queue not growing: a flush may fall just outside the window),
read from the proxy's /metrics (`find_capacity`: steps up by a quarter, then halves the gap twice).
Decoded rows are not recorded rows: a writer that falls behind queues them, then drops them, while the
decoding counters still rise. A saturating load
overstates the relay (most connections go opaque) and understates decoding by however many
connections happened to fall behind in the warm-up (one worker decoded 15.0k and 21.7k requests/s in
two runs of the same 40k load).

It prints requests/s relayed and requests/s decoded into rows (the proxy's /metrics) per
run, the connections whose decoding fell behind (those are relayed without decoding from
then on), the medians per worker count, the ratios 2 / 1 next to the issue's target
(>= 1.5 x), and the CPU the whole proxy (parent, workers, their recording writer
processes) and the load (load generator and fake broker) used in the window: when 2 workers
do not get ~2 x the CPU of one, the host had no core to give them (on a 2-core machine the
load shares the cores with the workers, so the ratio there is a floor).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import wire_load  # noqa: E402
from harness.kafka import free_port  # noqa: E402
from hostile import metric  # noqa: E402
from proc_tree import tree_cpu_s  # noqa: E402
from proxy.live import parse_metrics  # noqa: E402

CONNS_PER_LOADER = 16
DEPTH = 32


def upstream_main(port: int, responses: dict[int, bytes], ready: mp.synchronize.Event) -> None:
    """A fake broker on 127.0.0.1:port (SO_REUSEPORT, so several processes can share it)."""
    import uvloop

    from recording_cost import FakeBroker

    FakeBroker.responses = responses

    async def main() -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        server = await asyncio.get_running_loop().create_server(FakeBroker, sock=sock, backlog=1024)
        ready.set()
        await server.serve_forever()

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    uvloop.run(main())


def loader_main(port: int, requests: dict[int, bytes], warm: float, window: float, out: mp.Queue,
                rate: float = 1e9) -> None:
    """One load process: pipelined load (saturating unless `rate` requests/s) for warm + window s; reports
    responses in the window."""
    import uvloop

    from recording_cost import Load

    async def main() -> None:
        load = Load(requests, rate=rate, conns=CONNS_PER_LOADER, depth=DEPTH)
        task = asyncio.ensure_future(load.run(("127.0.0.1", port), warm + window + 0.5))
        out.put(None)  # started: the parent's CPU window follows this loader's
        await asyncio.sleep(warm)
        n0, t0 = load.completed, time.monotonic()
        await asyncio.sleep(window)
        n1, t1 = load.completed, time.monotonic()
        out.put((n1 - n0, t1 - t0))
        await task

    uvloop.run(main())


class PythonLoad:
    """`--load python`: `loaders` uvloop processes (loader_main), `CONNS_PER_LOADER` connections each, the rate split
    between them; the same interface as wire_load.WireLoad."""

    def __init__(self, port: int, requests: dict[int, bytes], loaders: int, rate: float, warm: float,
                 window: float) -> None:
        ctx = mp.get_context("spawn")
        self.out: mp.Queue = ctx.Queue()
        self.warm, self.window = warm, window
        self.procs = [ctx.Process(target=loader_main, args=(port, requests, warm, window, self.out,
                                                             rate / loaders if rate else 1e9))
                      for _ in range(loaders)]
        for p in self.procs:
            p.start()
        self.pids = [p.pid for p in self.procs if p.pid is not None]
        self.early: list[tuple[int, float]] = []

    def wait_connected(self) -> None:
        started = 0
        while started < len(self.procs):  # every loader connected (a late one's result may come first)
            msg = self.out.get(timeout=120)
            started += msg is None
            if msg is not None:
                self.early.append(msg)

    def rate(self) -> float:
        results = self.early + [self.out.get(timeout=self.warm + self.window + 120)
                                for _ in range(len(self.procs) - len(self.early))]
        for p in self.procs:
            p.join(60)
        return sum(n for n, _ in results) / statistics.mean(t for _, t in results)

    def close(self) -> None:
        for p in self.procs:
            p.join(60)
            if p.is_alive():
                p.terminate()


class Upstream:
    """The fake broker processes and how a measurement starts its load against a proxy (`--load c` or `python`)."""

    def __init__(self, args: argparse.Namespace, pairs: dict[int, tuple[bytes, bytes]], work: Path) -> None:
        from recording_cost import request_sequence

        self.args, self.port = args, free_port()
        self.requests = {k: v[0] for k, v in pairs.items()}
        responses = {k: v[1] for k, v in pairs.items()}
        self.procs: list = []
        if args.load == "c":
            self.program = wire_load.build(work)
            self.request_file = wire_load.write_requests(work / "requests.bin", request_sequence(self.requests))
            answers = wire_load.write_responses(work / "responses.bin", responses)
            self.procs = [wire_load.start_broker(self.program, self.port, answers) for _ in range(args.upstreams)]
        else:
            ctx = mp.get_context("spawn")
            ready = [ctx.Event() for _ in range(args.upstreams)]
            self.procs = [ctx.Process(target=upstream_main, args=(self.port, responses, r), daemon=True) for r in ready]
            for p in self.procs:
                p.start()
            for r in ready:
                r.wait(60)
        self.pids = [p.pid for p in self.procs]

    def load(self, port: int, offered: float) -> "PythonLoad | wire_load.WireLoad":
        """Start the load against the proxy on `port`, offering `offered` requests/s in all (0: saturating)."""
        a = self.args
        if a.load == "c":
            return wire_load.WireLoad(self.program, port, self.request_file, a.loaders * CONNS_PER_LOADER, DEPTH,
                                      offered, a.warm, a.window)
        return PythonLoad(port, self.requests, a.loaders, offered, a.warm, a.window)

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(10) if isinstance(p, subprocess.Popen) else p.join(10)


FELL_BEHIND = "decoding fell behind; connection is now opaque (bytes still relayed)"


def wait_ready(proxy: subprocess.Popen, workers: int, timeout: float = 120.0) -> list[int]:
    """Read the proxy's JSON log until it listens with every worker; then keep draining it on a thread.

    Returns a one-item list the drain keeps counting in: connections whose decoding fell behind and
    went opaque. A saturated proxy relays those without decoding, so its requests/s is then the
    relay's alone, not the relay's with decoding and recording.
    """
    want = "workers running" if workers > 1 else "listening"
    found = threading.Event()
    opaque = [0]

    def drain() -> None:
        assert proxy.stderr is not None
        for line in proxy.stderr:
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line).get("event")
            except ValueError:  # not one of the proxy's JSON lines
                continue
            if event == want:
                found.set()
            elif event == FELL_BEHIND:
                opaque[0] += 1

    threading.Thread(target=drain, daemon=True).start()
    if not found.wait(timeout):
        raise RuntimeError(f"the proxy did not report {want!r} (exit {proxy.poll()})")
    return opaque


def metrics_text(status: int) -> str:
    """The proxy's /metrics (the parent's: it merges every worker's)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{status}/metrics", timeout=10) as r:
        return r.read().decode()


def rows_total(status: int) -> float:
    """Requests the whole proxy decoded into rows so far, live (its /metrics merges every worker's;
    `kafkatap_request_rows_total` counts only closed connections)."""
    return metric(metrics_text(status), "kafkatap_requests_total")


class RecorderReading(NamedTuple):
    """The recorder's counters at one moment, from /metrics: request rows written and queued, rows dropped."""
    written: float
    queued: float
    dropped: float  # every dataset: a dropped connection row is a hole in the recording too


def recorder_reading(status: int) -> RecorderReading:
    text = metrics_text(status)
    return RecorderReading(metric(text, "kafkatap_recording_rows_written_total", dataset="requests"),
                           metric(text, "kafkatap_recording_queue_rows", dataset="requests"),
                           metric(text, "kafkatap_recording_dropped_rows_total"))


class RecorderWindow(NamedTuple):
    """What the recorder did over a measurement window: request rows written per second, its request queue at
    the window's start and end, and the rows dropped since the proxy started (warm-up included)."""
    written: float
    queue_start: float
    queue_end: float
    dropped: float

    @classmethod
    def between(cls, a: RecorderReading, b: RecorderReading, seconds: float) -> "RecorderWindow":
        return cls((b.written - a.written) / seconds, a.queued, b.queued, b.dropped)

    def kept_up(self, decoded: float) -> bool:
        """No row dropped, and the rows written keep up with those decoded (or the queue is not growing, for a
        flush that fell just outside the window): decoded rows only count as recorded once they are on disk."""
        steady = self.queue_end <= self.queue_start and self.written > 0
        return self.dropped == 0 and (self.written >= KEPT_UP * decoded or steady)

    def describe(self) -> str:
        return (f"written {self.written:,.0f}/s, queue {self.queue_start:,.0f} -> {self.queue_end:,.0f} rows, "
                f"{self.dropped:,.0f} dropped")


class Measured(NamedTuple):
    """One window through a fresh proxy (see `measure`)."""
    relayed: float  # requests/s the load got answered
    cpu_pct: float  # of the whole proxy: parent, workers, writer processes
    behind: int  # connections whose decoding fell behind (relayed opaque from then on)
    decoded: float  # requests/s decoded into rows
    recorder: RecorderWindow | None  # None with --no-record


SPREAD: dict[int, str] = {}  # worker count -> the last measurement's open connections per worker, "21 / 11"


def worker_spread(status: int) -> str:
    """Open connections per worker, from the parent's /metrics: "16 / 16" when balanced, the hash's spread with
    --balance kernel."""
    with urllib.request.urlopen(f"http://127.0.0.1:{status}/metrics", timeout=10) as r:
        samples = parse_metrics(r.read().decode()).get("kafkatap_worker_open_connections", [])
    return " / ".join(f"{v:.0f}" for _, v in sorted(samples, key=lambda lv: lv[0]["worker"]))


LOAD_CPU: dict[int, float] = {}  # worker count -> CPU % of the load and the fake broker in its last measurement


def measure(workers: int, upstream: Upstream, args: argparse.Namespace,
            work: Path, offered: float | None = None) -> Measured:
    """One window through a fresh `kafkatap proxy --workers N`, offered `offered` requests/s in all (default:
    `--rate`, or saturating): what was relayed, decoded and (recording on) written, and the proxy's CPU."""
    offered = args.rate if offered is None else offered
    port, status = free_port(), free_port()
    rec = work / f"rec-{workers}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "kafkatap.cli", "--log-format", "json", "--log-level", "info", "proxy",
           "--workers", str(workers), "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{upstream.port}",
           "--no-resolve-topics", "--status-addr", str(status)]
    if workers > 1:  # one process has nobody to balance with (the proxy refuses --balance there)
        cmd += ["--balance", args.balance]
    if not args.no_record:
        cmd += ["--record", str(rec)]
    proxy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    load = None
    try:
        opaque = wait_ready(proxy, workers)
        load = upstream.load(port, offered or 0.0)
        load.wait_connected()
        time.sleep(args.warm)  # the load's own warm-up; its counts come from its own clock
        driving = load.pids + upstream.pids
        c0, r0, t0 = tree_cpu_s(proxy.pid), rows_total(status), time.monotonic()
        w0 = None if args.no_record else recorder_reading(status)
        l0 = sum(tree_cpu_s(pid) for pid in driving)
        time.sleep(args.window)
        c1, r1, t1 = tree_cpu_s(proxy.pid), rows_total(status), time.monotonic()
        w1 = None if args.no_record else recorder_reading(status)
        l1 = sum(tree_cpu_s(pid) for pid in driving)
        if workers > 1:
            SPREAD[workers] = worker_spread(status)
        LOAD_CPU[workers] = 100 * (l1 - l0) / (t1 - t0)
        recorder = RecorderWindow.between(w0, w1, t1 - t0) if w0 is not None and w1 is not None else None
        return Measured(load.rate(), 100 * (c1 - c0) / (t1 - t0), opaque[0], (r1 - r0) / (t1 - t0), recorder)
    finally:
        if load is not None:
            load.close()
        proxy.send_signal(signal.SIGTERM)
        try:
            proxy.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proxy.pid, signal.SIGKILL)
        shutil.rmtree(rec, ignore_errors=True)


# A rate is sustained when the whole proxy does its whole job at it: every connection still decoded, the
# rows keeping up with what is relayed, what is relayed keeping up with what is offered, and (recording on)
# the recorder writing what is decoded without dropping any of it.
KEPT_UP = 0.95


def sustained(offered: float, m: Measured) -> bool:
    """True when the proxy relayed, decoded and (recording on) recorded all of `offered` requests/s in the window.

    Decoding counters alone said "recorded in full" with the writer stopped: rows were decoded and queued,
    then dropped, and nothing reached the disk."""
    recorded = m.recorder is None or m.recorder.kept_up(m.decoded)
    return m.behind == 0 and m.relayed >= KEPT_UP * offered and m.decoded >= KEPT_UP * m.relayed and recorded


def find_capacity(workers: int, run: Callable[[float], Measured], start: float,
                  log: Callable[[str], None]) -> tuple[float, float]:
    """The highest offered rate the proxy sustains (`sustained`), and what it decoded there.

    Steps up by a quarter from `start` until a rate is not sustained (or down by halves until one is),
    then halves the gap between the last sustained and the first failed rate twice: the answer is
    within ~6 % below the true capacity. Past the capacity, connections fall behind and go opaque,
    so a saturating load reads a relay rate that is mostly undecoded; this is the figure a saturated
    proxy that still records everything reaches.
    """
    def ok(rate: float) -> tuple[bool, float]:
        m = run(rate)
        good = sustained(rate, m)
        log(f"--workers {workers}: offered {rate:,.0f}/s: relayed {m.relayed:,.0f}, decoded {m.decoded:,.0f}, "
            f"{m.behind} fell behind, {m.recorder.describe() if m.recorder else 'recording off'}, "
            f"proxy CPU {m.cpu_pct:.0f} %, load CPU {LOAD_CPU.get(workers, 0):.0f} %"
            f"{f', connections per worker {SPREAD[workers]}' if workers in SPREAD else ''} -> "
            f"{'sustained' if good else 'not sustained'}")
        return good, m.decoded

    good, bad, got = 0.0, 0.0, 0.0
    rate = start
    while True:
        passed, decoded = ok(rate)
        if passed:
            good, got = rate, decoded
            if bad:
                break
            rate *= 1.25
        else:
            bad = rate
            if good or rate < 1000:
                break
            rate /= 2
    for _ in range(2):
        if not (good and bad):
            break
        mid = (good + bad) / 2
        passed, decoded = ok(mid)
        if passed:
            good, got = mid, decoded
        else:
            bad = mid
    return good, got


def capacity_report(args: argparse.Namespace, caps: dict[int, list[tuple[float, float]]],
                    load0: tuple[float, float, float]) -> None:
    load1 = os.getloadavg()
    print("\n## Workers: the highest rate recorded in full (`bench/workers.py --capacity`)\n")
    print(f"`{' '.join(['.venv/bin/python', 'bench/workers.py', *sys.argv[1:]])}` — {os.cpu_count()} cores, "
          f"load average {load0[0]:.2f} before / {load1[0]:.2f} after; recording {'off' if args.no_record else 'on'}; "
          f"--balance {args.balance}; {describe_load(args)}; a rate is sustained when no connection falls behind decoding, the loaders get "
          f">= {KEPT_UP:.0%} of it answered, the rows keep up with >= {KEPT_UP:.0%} of that"
          + ("" if args.no_record else f", and the recorder drops no row and writes >= {KEPT_UP:.0%} of the rows "
             "decoded (or its queue does not grow), read from the proxy's /metrics") + "\n")
    print("| workers | sustained requests/s (median) | per round | decoded into rows there, per round |")
    print("|---|---|---|---|")
    for w, got in caps.items():
        print(f"| {w} | {statistics.median(r for r, _ in got):,.0f} | {', '.join(f'{r:,.0f}' for r, _ in got)} | "
              f"{', '.join(f'{d:,.0f}' for _, d in got)} |")
    one, two = (statistics.median(r for r, _ in caps[w]) for w in (1, 2))
    per_round = [b[0] / a[0] for a, b in zip(caps[1], caps[2]) if a[0]]
    print(f"\nratio 2 / 1 workers: **{two / one if one else float('nan'):.2f} x** (per round: "
          f"{', '.join(f'{x:.2f}' for x in per_round)}; target >= 1.5 x)")
    print(json.dumps({"capacity_1": one, "capacity_2": two, "ratio": two / one if one else None}), file=sys.stderr)


def describe_load(args: argparse.Namespace) -> str:
    """The report's one-line account of the load."""
    conns = f"{args.loaders * CONNS_PER_LOADER} connections x {DEPTH} in flight"
    if args.load == "c":
        return f"load: bench/wireload.c, one process, {conns}; {args.upstreams} C fake-broker process(es)"
    return (f"load: {args.loaders} Python loader processes, {conns} in all; {args.upstreams} Python fake-broker "
            "process(es)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", type=float, default=5.0, help="seconds of load before the window")
    ap.add_argument("--window", type=float, default=10.0, help="seconds counted")
    ap.add_argument("--load", choices=("c", "python"), default="c",
                    help="c (default): the load generator and fake broker of bench/wireload.c, compiled with cc, which "
                         "leave the cores to the workers; python: the uvloop ones of bench/recording_cost.py")
    ap.add_argument("--loaders", type=int, default=2,
                    help=f"x {CONNS_PER_LOADER} connections in all (--load python: one process per {CONNS_PER_LOADER})")
    ap.add_argument("--upstreams", type=int, default=1, help="fake broker processes (one port, SO_REUSEPORT)")
    ap.add_argument("--no-record", action="store_true", help="relay and decode only (no --record)")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="offer this many requests/s in all instead of saturating: then decoded should equal relayed")
    ap.add_argument("--capacity", action="store_true",
                    help="find, per worker count, the highest offered rate recorded in full (no connection falls "
                         "behind, rows keep up): the saturated rate of a proxy that still does its job")
    ap.add_argument("--start", type=float, default=10_000.0, help="--capacity: the first rate offered (requests/s)")
    ap.add_argument("--balance", choices=("connections", "kernel"), default="connections",
                    help="the proxy's --balance: connections (its default: equal connections per worker) or kernel "
                         "(SO_REUSEPORT's hash alone, as before the workers passed connections)")
    ap.add_argument("--quick", action="store_true", help="1 round, 1 s warm-up, 3 s window")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.warm, args.window = 1, 1.0, 3.0

    from recording_cost import capture_frames

    print("capturing real frames (LocalKafka + kafka-python through the proxy) ...", file=sys.stderr)
    pairs = capture_frames()
    results: dict[int, list[float]] = {1: [], 2: []}
    cpu: dict[int, list[float]] = {1: [], 2: []}
    load_cpu: dict[int, list[float]] = {1: [], 2: []}
    opaque: dict[int, list[int]] = {1: [], 2: []}
    decoded: dict[int, list[float]] = {1: [], 2: []}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kafkatap-workers-bench-") as tmp:
        upstream = Upstream(args, pairs, Path(tmp))
        try:
            if args.capacity:
                caps: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
                for rnd in range(args.rounds):
                    for workers in ((1, 2) if rnd % 2 == 0 else (2, 1)):
                        caps[workers].append(find_capacity(
                            workers, lambda r, w=workers: measure(w, upstream, args, Path(tmp), r), args.start,
                            lambda line, n=rnd: print(f"round {n + 1}: {line}", file=sys.stderr)))
            else:
                for rnd in range(args.rounds):
                    for workers in ((1, 2) if rnd % 2 == 0 else (2, 1)):
                        rate, pct, behind, rows, recorder = measure(workers, upstream, args, Path(tmp))
                        results[workers].append(rate)
                        cpu[workers].append(pct)
                        load_cpu[workers].append(LOAD_CPU[workers])
                        opaque[workers].append(behind)
                        decoded[workers].append(rows)
                        print(f"round {rnd + 1}: --workers {workers}: {rate:,.0f} requests/s relayed, {rows:,.0f} decoded "
                              f"into rows, proxy CPU {pct:.0f} %, load CPU {LOAD_CPU[workers]:.0f} %, {behind} of "
                              f"{args.loaders * CONNS_PER_LOADER} connections fell behind decoding"
                              f"{f', recorder {recorder.describe()}' if recorder else ''}"
                              f"{f', connections per worker {SPREAD[workers]}' if workers in SPREAD else ''}", file=sys.stderr)
        finally:
            upstream.close()
    if args.capacity:
        capacity_report(args, caps, load0)
        return
    one, two = statistics.median(results[1]), statistics.median(results[2])
    ratio = two / one if one else float("nan")
    load1 = os.getloadavg()
    print("\n## Workers: saturated requests/s (`bench/workers.py`)\n")
    print(f"`{' '.join(['.venv/bin/python', 'bench/workers.py', *sys.argv[1:]])}` — {os.cpu_count()} cores, "
          f"load average {load0[0]:.2f} before / {load1[0]:.2f} after; "
          f"{f'{args.rate:,.0f} requests/s offered' if args.rate else 'saturating'}; recording "
          f"{'off' if args.no_record else 'on'}; {describe_load(args)}\n")
    print("| workers | requests/s relayed (median) | runs | requests/s decoded into rows (median) | runs | proxy CPU % "
          "(all its processes, median) | load CPU % (load and fake broker, median) | connections that fell behind "
          "decoding, per run |")
    print("|---|---|---|---|---|---|---|---|")
    for w, r in results.items():
        print(f"| {w} | {statistics.median(r):,.0f} | {', '.join(f'{x:,.0f}' for x in r)} | "
              f"{statistics.median(decoded[w]):,.0f} | {', '.join(f'{x:,.0f}' for x in decoded[w])} | "
              f"{statistics.median(cpu[w]):.0f} | {statistics.median(load_cpu[w]):.0f} | {', '.join(map(str, opaque[w]))} |")
    d1, d2 = statistics.median(decoded[1]), statistics.median(decoded[2])
    print(f"\nratio 2 / 1 workers, relayed: **{ratio:.2f} x**; decoded into rows: **{d2 / d1 if d1 else float('nan'):.2f} x** "
          f"(target >= 1.5 x). A connection whose decoding falls behind is relayed without decoding from then on, "
          f"so relayed requests/s alone can rise while what the proxy records falls.")
    print(json.dumps({"workers_1": one, "workers_2": two, "ratio": ratio}), file=sys.stderr)


if __name__ == "__main__":
    main()
