"""What recording costs: proxy CPU with recording on vs off at ~20k requests/s, and bytes per row on disk.

    .venv/bin/python bench/recording_cost.py            # full run (~3 min), prints a markdown section
    .venv/bin/python bench/recording_cost.py --quick    # shorter windows
    .venv/bin/python bench/recording_cost.py --side-by-side --rate 6000 --rounds 8   # the steadier ratio
    .venv/bin/python bench/recording_cost.py --side-by-side stats,record --before 39761f9 --rate 6000 --rounds 8
                                                              # a change's effect: REV's proxies in the same run

`--side-by-side` runs the stats, record and record+capture proxies at the same time, each with its own
load, and measures all of them over the same window: whatever disturbs the machine meanwhile falls on
all of them, so the round's ratios are steadier than those of windows taken one after the other (the
same mode moved by up to 38 % between two sequential windows). Their sum must stay below what the
two cores can carry: 3 × 6,000 req/s does, 3 × 20,000 does not (each proxy then reaches only what it
gets of the CPU, and the ratios compare different rates).

`--before REV` adds, beside each side-by-side mode (`stats` included), the same mode served from the
code of git revision REV (`MODE@before`, extracted with `git archive` into a temporary directory): a
change's effect measured in the same windows as the code it replaced, with no copy of the bench. Each
`MODE@before` is compared with `stats@before` of the same round, REV's recording against REV's relay:
against this checkout's `stats` the ratio would carry any change to the relay itself.

Rounds are paired: a round counts only when every mode reached ≥ 95 % of the offered rate and within
5 % of its baseline's (`stats`) rate. CPU per request at two different rates compares two different
loads (a saturated proxy batches more per wake-up), so such a round is left out of every median and
the report says how many rounds were valid and why the others were not.

How (and why this way):
1. Real frames: a real broker (LocalKafka) and real kafka-python clients run
   through the proxy once with `--capture all`; one Produce, Fetch and
   Metadata request/response pair is taken from that capture.
2. A fake broker in this process answers each captured request with its
   captured response (correlation id rewritten), so the broker is not the
   bottleneck on a 2-core box; a pipelining load generator (same process)
   drives the proxy at the target rate with a ~48 % Produce / ~47 % Fetch /
   5 % Metadata mix.
3. The proxy runs in its own process (the real ProxyServer + uvloop, the
   collector set up as `kafkatap proxy` does), once per mode, alternating in
   one run: `off` (NullSink), `stats` (LiveStats only), `record`
   (ParquetRecorder + LiveStats, as `build_sinks` makes it for
   `kafkatap proxy`: Parquet in a writer process), `record+capture` (also raw
   request frames), and `record-thread` (the recorder with its writer thread
   inside the proxy's process, as before issue 16: the same run's baseline). Its CPU comes from /proc/PID/stat over a fixed window
   after warm-up; the recorder's shipping thread is found by its kernel
   thread name, the writer process as the proxy's child. The headline ratio
   is the CPU per request of the proxy's processes, relay and writer process
   together: the writer is where the recording's Arrow and Parquet work
   runs, so the relay process alone would hide most of what recording costs.
   The relay process alone is printed beside it as a secondary figure (its
   loop's one core is what saturates first). The writer's compaction (merging
   a segment's flush files every 60 s, and the rollups of the merged requests
   file) happens outside the short windows, so it is measured after the rounds
   on the rows the `record` and `record+capture` proxies wrote, laid out as
   60 one-second flush files at the offered rate, and added per request.
4. Bytes per request row: from the `record` run's files (real rows) and from
   the synthetic mix in `recording.sample_rows` (jittered sizes and
   timestamps), both as written per 1 s flush and after compaction.
5. Event-loop side in isolation, both writers (`thread`, `process`) in one
   run: enqueue cost per row, the recorder's thread in the proxy's process
   (converting + encoding, or only pickling rows into the writer process's
   pipe), the writer process's CPU per row, and the lateness of a 1 ms loop
   ticker meanwhile. (`tests/recording/test_loop_lag.py` asserts the stall
   a 10,000-row flush causes, with the machine's own load taken out.)

Fairness changes (issue 16): `record` used to be the recorder *without*
LiveStats, so "record vs stats" compared two different sinks; it is now
stats + recorder, as its description always said. The proxy child now gets
`settle_memory()` like `kafkatap proxy`. And with the writer in its own process,
its CPU is measured from the proxy's children (a /proc/PID/stat of the
proxy alone would hide it).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

# the code under test; a `MODE@before` proxy is served from another revision's tree (`--before`)
ROOT = Path(os.environ.get("KAFKATAP_BENCH_ROOT") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))
BEFORE = "@before"

from proc_tree import pin_cpus, set_process_affinity  # noqa: E402  (bench/, this script's own directory)
from revisions import extract_revision  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")
REACHED = 0.95  # a mode below this share of the offered rate was saturated: its CPU per request is of another load
SAME_RATE = 0.05  # a mode further than this from its baseline's rate ran a different load than the baseline
# per request: relay + writer processes, compaction included; the same over the window (flushes only); the relay alone
TOTAL, FLUSHED, RELAY = "total_us_per_req", "flush_us_per_req", "cpu_us_per_req"
WINDOW_S, WARMUP_S = 10.0, 3.0  # the defaults, left out of the printed command


# --------------------------------------------------------------------------- 1. real frames
def capture_frames() -> dict[int, tuple[bytes, bytes]]:
    """api_key → (request frame, response frame) from a real proxied kafka-python session."""
    from kafka import KafkaConsumer, KafkaProducer

    from proxy.running import RunningProxy
    from harness.kafka import LocalKafka, free_port

    frames: list[dict] = []

    class Grab:
        def request(self, row): pass
        def connection(self, row): pass
        def tcp(self, row): pass
        def frame(self, row): frames.append(row)
        def close(self): pass

    port = free_port()
    with LocalKafka(broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}"}) as kafka:
        with RunningProxy([f"127.0.0.1:{port}=127.0.0.1:{kafka.port}"], sink=Grab(), capture="all") as p:
            prod = KafkaProducer(bootstrap_servers=p.bootstrap, acks=1, linger_ms=20, batch_size=16384,
                                 compression_type="gzip")
            rnd = random.Random(1)
            for i in range(3000):
                prod.send("bench", json.dumps({"order": i, "sku": rnd.randrange(10**6), "qty": rnd.randrange(9),
                                               "note": "x" * rnd.randrange(40, 160)}).encode())
            prod.flush()
            prod.close()
            cons = KafkaConsumer("bench", bootstrap_servers=p.bootstrap, auto_offset_reset="earliest",
                                 consumer_timeout_ms=2000, max_partition_fetch_bytes=4096)
            sum(1 for _ in cons)
            cons.close()
    reqs = {(f["conn_id"], f["correlation_id"]): f for f in frames if f["direction"] == "request"}
    pairs: dict[int, list[tuple[bytes, bytes]]] = {}
    for f in frames:
        if f["direction"] == "response":
            q = reqs.get((f["conn_id"], f["correlation_id"]))
            if q is not None:
                pairs.setdefault(q["api_key"], []).append((q["data"], f["data"]))
    out = {}
    for key in (0, 1, 3):
        cands = pairs[key]
        if key == 1:  # a Fetch that returned a typical small-message amount of data (~4 KB)
            cands = sorted(cands, key=lambda c: abs(len(c[1]) - 4096))
            out[key] = cands[0]
            continue
        cands.sort(key=lambda c: len(c[0]) + len(c[1]))
        out[key] = cands[len(cands) // 2]
    return out


# --------------------------------------------------------------------------- 2. fake broker + load
class FakeBroker(asyncio.Protocol):
    responses: dict[int, bytes] = {}

    def connection_made(self, transport):
        self.t = transport
        self.buf = bytearray()

    def data_received(self, data):
        buf = self.buf
        buf += data
        out = []
        pos, n = 0, len(buf)
        while n - pos >= 4:
            size = int.from_bytes(buf[pos:pos + 4], "big")
            if n - pos < 4 + size:
                break
            api_key = int.from_bytes(buf[pos + 4:pos + 6], "big")
            resp = self.responses[api_key]
            out.append(resp[:4])
            out.append(bytes(buf[pos + 8:pos + 12]))
            out.append(memoryview(resp)[8:])
            pos += 4 + size
        if pos:
            del buf[:pos]
        if out:
            self.t.write(b"".join(out))


class LoadClient(asyncio.Protocol):
    def __init__(self, gen: "Load") -> None:
        self.gen = gen
        self.buf = bytearray()
        self.inflight = 0
        self.corr = 0

    def connection_made(self, transport):
        self.t = transport

    def send(self, n: int) -> None:
        frames = []
        for _ in range(n):
            self.corr = (self.corr + 1) & 0x7FFFFFFF
            req = self.gen.pick()
            frames.append(req[:8] + self.corr.to_bytes(4, "big") + req[12:])
        self.inflight += n
        self.t.write(b"".join(frames))

    def data_received(self, data):
        buf = self.buf
        buf += data
        done = 0
        pos, n = 0, len(buf)
        while n - pos >= 4:
            size = int.from_bytes(buf[pos:pos + 4], "big")
            if n - pos < 4 + size:
                break
            pos += 4 + size
            done += 1
        if pos:
            del buf[:pos]
        self.inflight -= done
        self.gen.completed += done


def request_sequence(requests: dict[int, bytes]) -> list[bytes]:
    """The load's request mix, in the order it is sent round and round: 48 % Produce, 47 % Fetch, 5 % Metadata
    (shuffled once, the same way every run; bench/wireload.c sends the same sequence)."""
    mix = [0] * 48 + [1] * 47 + [3] * 5
    random.Random(3).shuffle(mix)
    return [requests[k] for k in mix]


class Load:
    def __init__(self, requests: dict[int, bytes], rate: float, conns: int, depth: int) -> None:
        self.rate, self.conns, self.depth = rate, conns, depth
        self.seq = request_sequence(requests)
        self.i = 0
        self.completed = 0
        self.clients: list[LoadClient] = []

    def pick(self) -> bytes:
        self.i += 1
        return self.seq[self.i % len(self.seq)]

    async def run(self, addr: tuple[str, int], seconds: float) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self.conns):
            _, c = await loop.create_connection(lambda: LoadClient(self), *addr)
            self.clients.append(c)
        tick = 0.002
        per_tick = self.rate * tick
        credit = 0.0
        t_end = loop.time() + seconds
        nxt = loop.time()
        k = 0
        while loop.time() < t_end:
            credit += per_tick
            while credit >= 1:
                c = self.clients[k % len(self.clients)]
                k += 1
                room = self.depth - c.inflight
                if room <= 0:
                    if all(cl.inflight >= self.depth for cl in self.clients):
                        credit = min(credit, self.depth * self.conns)  # saturated: do not build a backlog
                        break
                    continue
                n = int(min(room, credit, 8))
                c.send(n)
                credit -= n
            nxt += tick
            await asyncio.sleep(max(0.0, nxt - loop.time()))
        for c in self.clients:
            c.t.close()


def cpu_ticks(pid: int) -> tuple[float, dict[str, float]]:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    total = (int(parts[11]) + int(parts[12])) / CLK
    threads: dict[str, float] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = open(f"/proc/{pid}/task/{task}/comm").read().strip()
            tp = open(f"/proc/{pid}/task/{task}/stat").read().rsplit(")", 1)[1].split()
            threads[comm] = threads.get(comm, 0) + (int(tp[11]) + int(tp[12])) / CLK
        except OSError:
            continue
    return total, threads


def children_cpu(pid: int) -> float:
    """CPU seconds of the live child processes of `pid` (the recorder's writer process)."""
    total = 0.0
    for kid in child_pids(pid):
        try:
            parts = open(f"/proc/{kid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(parts[11]) + int(parts[12])) / CLK
    return total


def child_pids(pid: int) -> set[int]:
    """The live child processes of `pid` (of any of its threads): the recorder's writer process."""
    kids: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for task in tasks:
        try:
            kids.update(int(k) for k in open(f"/proc/{pid}/task/{task}/children").read().split())
        except OSError:
            continue
    return kids


def serve_proxy(mode: str, upstream: str, record_dir: str) -> None:
    """Child process: the real proxy with the sinks of one mode; prints its port, stops on SIGTERM.

    With KAFKATAP_BENCH_PROXY_CPU set it pins itself to that core first, so every thread it starts
    inherits it (the bench then moves the writer process to the other cores).
    """
    import uvloop

    if os.environ.get("KAFKATAP_BENCH_PROXY_CPU"):
        os.sched_setaffinity(0, {int(os.environ["KAFKATAP_BENCH_PROXY_CPU"])})

    from recording.logs import configure_logging
    from proxy.metrics import LiveStats
    from proxy.server import ProxyServer
    from proxy.sinks import NullSink, build_sinks

    from proxy.memory_tuning import settle_memory

    configure_logging("json", "warning")

    async def main() -> None:
        capture = "requests" if mode == "record+capture" else "none"
        if mode == "off":
            sink = NullSink()
        elif mode == "stats":
            sink = LiveStats("bench")
        else:  # the recorder beside the same LiveStats as `stats`, so the difference is the recording alone
            writer = "thread" if mode == "record-thread" else "process"
            sink = build_sinks(record_dir, "bench", capture=capture, live_stats=True, writer=writer).sink
        server = ProxyServer([f"127.0.0.1:0={upstream}"], sink=sink, proxy_id="bench", capture=capture,
                             tcp_info_interval=10.0)
        await server.start()
        settle_memory()  # as `kafkatap proxy` does once it listens
        print(server.listen_addr[1], flush=True)
        await server.serve_forever()  # SIGTERM → stop() closes the sink

    uvloop.run(main())


async def run_modes(modes: list[str], upstream_port: int, pairs, rate: float, warm: float, window: float,
                    record_dirs: list[str], pins: tuple[set[int], set[int]] | None = None,
                    before_root: str | None = None) -> list[dict[str, Any]]:
    """One proxy process per mode, all loaded at `rate` at once and measured over the same window.

    With one mode this is the sequential bench. With several (`--side-by-side`), every proxy meets
    the same machine at the same time: whatever slows the box during the window (the other vCPU's
    load, frequency, the writer process's turn) falls on all of them alike, so their ratio is steadier
    than that of two windows taken one after the other.
    """
    env = dict(os.environ)
    if pins:
        env["KAFKATAP_BENCH_PROXY_CPU"] = str(min(pins[0]))
    def serve(mode: str, d: str) -> subprocess.Popen:
        # a MODE@before proxy runs REV's code, started from REV's tree (an older writer process is found
        # through the working directory)
        before = mode.endswith(BEFORE)
        return subprocess.Popen([sys.executable, __file__, "--serve", mode.removesuffix(BEFORE),
                                 f"127.0.0.1:{upstream_port}", d], stdout=subprocess.PIPE, text=True,
                                env={**env, "KAFKATAP_BENCH_ROOT": str(before_root)} if before else env,
                                cwd=before_root if before else None)

    procs = [serve(mode, d) for mode, d in zip(modes, record_dirs)]
    ports = []
    for mode, proc in zip(modes, procs):
        line = proc.stdout.readline()
        if not line.strip().isdigit():  # it died before listening (its error is above on stderr)
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(60)
            sys.exit(f"the {mode} proxy did not start" + (" from the --before revision's code" if BEFORE in mode else ""))
        ports.append(int(line))
    loads = [Load({k: v[0] for k, v in pairs.items()}, rate, conns=16, depth=8) for _ in modes]
    tasks = [asyncio.ensure_future(load.run(("127.0.0.1", port), warm + window)) for load, port in zip(loads, ports)]
    await asyncio.sleep(warm)
    if pins:  # the writer process started on the proxy's core (it inherits it): off to the other cores
        for proc in procs:
            for kid in child_pids(proc.pid):
                set_process_affinity(kid, pins[1])
    before = [(cpu_ticks(p.pid), children_cpu(p.pid), load.completed) for p, load in zip(procs, loads)]
    w0 = time.monotonic()
    await asyncio.sleep(window)
    after = [(cpu_ticks(p.pid), children_cpu(p.pid), load.completed) for p, load in zip(procs, loads)]
    w1 = time.monotonic()
    await asyncio.gather(*tasks)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(60)
    out = []
    for mode, ((c0, t0_threads), k0, n0), ((c1, t1_threads), k1, n1) in zip(modes, before, after):
        writer = sum(t1_threads.get(n, 0) - t0_threads.get(n, 0) for n in ("kafkatap-rec", "kafkatap-cmp"))
        reqs = n1 - n0
        out.append({"mode": mode, "rate": reqs / (w1 - w0), "cpu_pct": 100 * (c1 - c0) / (w1 - w0),
                    "cpu_us_per_req": 1e6 * (c1 - c0) / max(1, reqs), "writer_pct": 100 * writer / (w1 - w0),
                    "child_pct": 100 * (k1 - k0) / (w1 - w0),
                    FLUSHED: 1e6 * (c1 - c0 + k1 - k0) / max(1, reqs)})
    return out


# --------------------------------------------------------------------------- 4/5. disk and loop cost
def bytes_per_row(root: Path) -> tuple[float, int]:
    from recording.reader import read_recording

    files = [f for f in (root / "requests").rglob("*.parquet") if not f.name.startswith(".")]
    rows = read_recording(root, "requests").num_rows
    return sum(f.stat().st_size for f in files) / max(1, rows), rows


SEGMENT_S = 60.0  # the proxy's default --compact-interval: a segment holds this many seconds of flush files


def compaction_cost(root: Path, rate: float, segment_s: float = SEGMENT_S, repeats: int = 2) -> dict[str, float]:
    """CPU µs per request that the writer process spends after the flush: merging a segment's flush files
    (requests and frames; the other datasets hold a row per connection or event, not per request) and computing
    the requests file's rollups, measured on the rows a `record` or
    `record+capture` proxy of this run wrote.

    Why offline: the writer merges a segment every `--compact-interval` (60 s by default), so a 10 s window
    rarely holds a merge, and the rounds' proxies are stopped before they make one: the windows measure
    the flushes alone. Here the recording's rows are laid out as the writer leaves them in 60 s at the
    offered rate (one flush file a second, the rows repeated to fill the segment), then merged and rolled
    up by the writer's own code (`Compactor.merge`, inline), in this process, its CPU time counted (Arrow's
    threads included). The modules are imported first and the least of `repeats` merges is kept: the
    first import of the rollups' modules alone is worth ~3 µs a request of a 60 s segment.
    """
    import pyarrow as pa

    import recording.rollups  # noqa: F401 — imported before the clock starts (see above)
    from recording.reader import read_recording
    from recording.writer import ParquetRecorder

    requests = read_recording(root, "requests", with_partitions=False)
    if requests.num_rows == 0:
        return {}
    copies = max(1, -(-int(rate * segment_s) // requests.num_rows))  # ceil: at least a segment's worth
    n_requests = copies * requests.num_rows
    work = Path(tempfile.mkdtemp(prefix="kt-bench-compact-"))
    try:
        rec = ParquetRecorder(work, "bench")  # writer="thread": its streams, options and compactor are the writer process's
        out = {}
        for name in ("requests", "frames"):
            table = requests if name == "requests" else read_recording(root, name, with_partitions=False)
            if table.num_rows == 0:
                continue
            s = rec._streams[name]
            table = pa.concat_tables([table] * copies).select(s.schema.names).cast(s.schema)
            spent = []
            for k in range(repeats):
                seg = _flush_files(rec, s, table, work / name / f"r{k}", max(1, round(segment_s)))
                t0 = time.process_time()
                rec._compactor.merge(s, seg)  # the writer's own merge, and a requests file's rollups after it
                spent.append(time.process_time() - t0)
            out[name] = min(spent) * 1e6 / n_requests
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _flush_files(rec: Any, s: Any, table: Any, directory: Path, flushes: int) -> Any:
    """`table` written as `flushes` flush files of `rec`'s stream `s` in `directory`: a segment to merge."""
    from recording.compaction import FlushFile, Segment

    step = -(-table.num_rows // flushes)
    seg = Segment(directory, 0.0, closes=True)
    for i in range(flushes):
        part = table.slice(i * step, step)
        path = directory / f"part-flush-{i + 1:08d}.parquet"
        rec._write_file(s, [part], path, f"{i + 1}-{i + 1}", 0, part.num_rows, flush=True)  # as its flushes write them
        seg.files.append(FlushFile(i + 1, path, part.num_rows, 0, rec._flush_options[s.name].interim))
    return seg


def synthetic_disk(rows_per_s: int = 20_000, seconds: int = 10) -> dict[str, float]:
    """Bytes per row for the synthetic mix: per 1 s flush files, and after compaction."""
    from recording.writer import ParquetRecorder
    from recording.sample_rows import SessionMix

    out = {}
    # with compaction off a flush file is final (sorted, zstd); with it on, flush files are interim (lz4, unsorted,
    # ~1.4-2.5 x bigger) for the minute until compaction rewrites them: what stays on disk is "after compaction"
    for label, compact in (("flush files (1 s, compaction off)", 0.0), ("after compaction", 3600.0)):
        d = Path(tempfile.mkdtemp(prefix="kt-bench-"))
        try:  # the files are only measured: left behind they fill /tmp run after run
            r = ParquetRecorder(d, "bench", flush_interval_s=3600, compact_interval_s=compact, fsync=False).start()
            mix = SessionMix(rate_per_s=rows_per_s)
            for _ in range(seconds):
                for row in mix.rows(rows_per_s):
                    r.request(row)
                r._flush(final=False)  # one flush per simulated second
            r.close()
            out[label] = bytes_per_row(d)[0]
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return out


def loop_side(writer: str, rows_per_s: int = 20_000, seconds: float = 5.0) -> dict[str, float]:
    """Enqueue cost per row on the loop thread, the recorder's CPU per row (in and out of the proxy's
    process), and the lateness of a 1 ms loop ticker while it writes.

    Rows carry every request column, as `proxy.rows.request_row` makes them (the synthetic mix alone
    has fewer keys, which made the conversion look cheaper than the proxy's rows).
    """
    from recording.sample_rows import SessionMix
    from recording.schema import REQUEST_COLUMNS

    rows = [{c.name: r.get(c.name) for c in REQUEST_COLUMNS} for r in SessionMix(rate_per_s=rows_per_s).rows(rows_per_s)]
    d = Path(tempfile.mkdtemp(prefix="kt-bench-"))
    try:  # only the CPU and lateness are wanted: the files go, whatever happens
        return _loop_side_in(d, rows, writer, rows_per_s, seconds)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _loop_side_in(d: Path, rows: list[dict], writer: str, rows_per_s: int, seconds: float) -> dict[str, float]:
    """`loop_side`'s measurement, recording into `d` (which the caller removes)."""
    import threading

    from recording.writer import ParquetRecorder

    r = ParquetRecorder(d, "bench", flush_interval_s=1.0, compact_interval_s=0, fsync=False, writer=writer).start()
    t0 = time.perf_counter()
    for row in rows:
        r.request(row)
    enqueue_us = (time.perf_counter() - t0) / len(rows) * 1e6
    deadline = time.monotonic() + 120  # the first flush (and the writer process's start) behind us
    while r.stats()["rows_written"]["requests"] < len(rows) and time.monotonic() < deadline:
        time.sleep(0.1)

    async def drive(feed: bool = True) -> list[float]:
        lags = []
        loop = asyncio.get_running_loop()
        per_tick = rows_per_s // 1000
        i = 0
        nxt = loop.time()
        end = nxt + seconds
        while loop.time() < end:
            nxt += 0.001
            await asyncio.sleep(max(0, nxt - loop.time()))
            lags.append(loop.time() - nxt)
            for _ in range(per_tick if feed else 0):
                r.request(rows[i % len(rows)])
                i += 1
        return lags

    writer_tid = None
    for t in threading.enumerate():
        if t.name == "kafkatap-recorder":
            writer_tid = t.native_id
    child = r._child.pid if r._child is not None else None
    base = sorted(asyncio.run(drive(feed=False)))
    w0, k0 = _thread_cpu(writer_tid), _process_cpu(child)
    lags = asyncio.run(drive())
    w1, k1 = _thread_cpu(writer_tid), _process_cpu(child)
    r.close()
    lags.sort()
    n = rows_per_s * seconds
    return {"enqueue_us": enqueue_us, "writer_us_per_row": (w1 - w0) * 1e6 / n,
            "writer_pct": 100 * (w1 - w0) / seconds, "child_us_per_row": (k1 - k0) * 1e6 / n,
            "lag_p99_ms": lags[int(len(lags) * 0.99)] * 1e3,
            "lag_max_ms": lags[-1] * 1e3, "base_lag_p99_ms": base[int(len(base) * 0.99)] * 1e3,
            "base_lag_max_ms": base[-1] * 1e3}


def _process_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        tp = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(tp[11]) + int(tp[12])) / CLK


def _thread_cpu(tid: int | None) -> float:
    if tid is None:
        return 0.0
    tp = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
    return (int(tp[11]) + int(tp[12])) / CLK


# --------------------------------------------------------------------------- main
MODES = ("off", "stats", "record-thread", "record", "record+capture")  # what `serve_proxy` can run
SIDE_BY_SIDE = ("stats", "record", "record+capture")  # the ratios, measured in one window each round


async def amain(args) -> tuple:
    print("capturing real frames through the proxy from a real broker…", file=sys.stderr)
    pairs = capture_frames()
    FakeBroker.responses = {k: v[1] for k, v in pairs.items()}
    loop = asyncio.get_running_loop()
    pins = args.pins
    if pins:  # the load generator and the fake broker (this process) stay off the proxy's core
        set_process_affinity(os.getpid(), pins[1])
    srv = await loop.create_server(FakeBroker, "127.0.0.1", 0)
    upstream_port = srv.sockets[0].getsockname()[1]
    modes = args.modes
    results: dict[str, list[dict]] = {m: [] for m in modes}
    rec_dirs: dict[str, str] = {}  # each recording mode's first recording: bytes per row, compaction cost
    for rnd in range(args.rounds):
        order = modes if rnd % 2 == 0 else list(reversed(modes))
        batches = [order] if args.side_by_side else [[m] for m in order]
        for batch in batches:
            dirs = [tempfile.mkdtemp(prefix=f"{mode.replace('+', '-').replace('@', '-')}-", dir=args.scratch)
                    for mode in batch]
            for mode, d in zip(batch, dirs):
                if mode.startswith("record") and BEFORE not in mode:
                    rec_dirs.setdefault(mode, d)
            try:
                for res in await run_modes(batch, upstream_port, pairs, args.rate, args.warmup, args.window, dirs,
                                           pins, args.before_root):
                    print(f"  {res['mode']:15s} {res['rate']:8.0f} req/s  proxy CPU {res['cpu_pct']:5.1f} %  "
                          f"{res[RELAY]:5.1f} µs/req  shipping thread {res['writer_pct']:4.1f} %  "
                          f"writer process {res['child_pct']:4.1f} %  relay + writer {res[FLUSHED]:5.1f} µs/req (flushes)",
                          file=sys.stderr)
                    results[res["mode"]].append(res)
            finally:  # a round's recordings are gigabytes over a long run: gone as soon as measured
                for d in dirs:
                    if d not in rec_dirs.values():
                        shutil.rmtree(d, ignore_errors=True)
    srv.close()
    sizes = {k: (len(v[0]), len(v[1])) for k, v in pairs.items()}
    return results, sizes, rec_dirs


def add_compaction(results: dict[str, list[dict]], compaction: dict[str, dict[str, float]]) -> None:
    """Each round's TOTAL: its window's relay + writer CPU per request plus its mode's compaction cost per request
    (`compaction_cost`; 0 for a mode that records nothing, and for a `MODE@before`, whose code it was not measured
    with: the `--before` lines compare the windows alone)."""
    for mode, runs in results.items():
        extra = sum(compaction.get(mode, {}).values())
        for r in runs:
            r["compact_us_per_req"] = extra
            r[TOTAL] = r[FLUSHED] + extra


def baseline(mode: str) -> str:
    """The mode whose same-round CPU a mode is compared with: `stats`, or `stats@before` for REV's proxies.

    REV's recording against REV's relay: against this checkout's `stats`, a `MODE@before` ratio would
    also carry whatever changed in the relay between the two revisions."""
    return "stats" + BEFORE if mode.endswith(BEFORE) else "stats"


def round_problems(results: dict[str, list[dict]], rnd: int, offered: float) -> list[str]:
    """Why round `rnd` cannot be paired (empty when it can): a mode saturated, or at another rate than its baseline.

    CPU per request is only comparable between proxies carrying the same load; a proxy that fell short
    batches more per wake-up and looks cheaper per request than it is."""
    problems = []
    for mode, runs in results.items():
        rate = runs[rnd]["rate"]
        if rate < REACHED * offered:
            problems.append(f"{mode} reached {rate:,.0f} of {offered:,.0f} req/s offered")
        base = baseline(mode)
        if base != mode and base in results:
            b = results[base][rnd]["rate"]
            if abs(rate - b) > SAME_RATE * b:
                problems.append(f"{mode} {rate:,.0f} req/s vs {base} {b:,.0f}")
    return problems


def valid_rounds(results: dict[str, list[dict]], offered: float) -> tuple[list[int], dict[int, list[str]]]:
    """(the rounds every median uses, the others with their reasons)."""
    n = min(len(runs) for runs in results.values())
    invalid = {rnd: why for rnd in range(n) if (why := round_problems(results, rnd, offered))}
    return [rnd for rnd in range(n) if rnd not in invalid], invalid


def round_ratios(results: dict[str, list[dict]], mode: str, rounds: list[int], key: str = TOTAL,
                 vs: str | None = None) -> list[float]:
    """Per cent more `key` per request than the same round's baseline, for each of `rounds`: rounds are pairs,
    so what disturbed a round disturbed both sides of its ratio."""
    vs = vs or baseline(mode)
    return [100 * (results[mode][r][key] - results[vs][r][key]) / results[vs][r][key] for r in rounds]


def paired_median(results: dict[str, list[dict]], mode: str, rounds: list[int], key: str = TOTAL,
                  vs: str | None = None) -> float | None:
    """The median of `round_ratios`, None without a valid round (no figure rather than one from unpaired loads)."""
    ratios = round_ratios(results, mode, rounds, key, vs)
    return statistics.median(ratios) if ratios else None


def _pct(x: float | None) -> str:
    return "no valid round" if x is None else f"{x:+.1f} %"


def validity_line(results: dict[str, list[dict]], offered: float) -> str:
    """How many rounds the medians rest on, and what the others missed."""
    rounds, invalid = valid_rounds(results, offered)
    n = len(rounds) + len(invalid)
    line = (f"**Valid rounds: {len(rounds)} of {n}** (a round counts only when every mode reached ≥ "
            f"{REACHED * 100:.0f} % of the offered rate and within {SAME_RATE * 100:.0f} % of its baseline's rate; "
            "the others are "
            "left out of every median and best-round figure below)")
    if invalid:
        line += ": " + "; ".join(f"round {r + 1} left out ({', '.join(why)})" for r, why in invalid.items())
    return line + "."


def headline_lines(results: dict[str, list[dict]], offered: float, before: str | None) -> list[str]:
    """The issue's figures: the paired per-round median of the proxy's total CPU per request (relay + writer
    process), then the relay process alone, labelled as the secondary figure it is."""
    rounds, _ = valid_rounds(results, offered)
    # this checkout's modes: a MODE@before has no compaction figure (measured with this checkout's code only), so
    # it is compared in the `--before` lines below, on the windows alone for both revisions
    compared = [m for m in results if m != baseline(m) and not m.endswith(BEFORE)]
    total = "; ".join(f"{m} {_pct(paired_median(results, m, rounds))}" for m in compared)
    relay = "; ".join(f"{m} {_pct(paired_median(results, m, rounds, RELAY))}" for m in compared)
    flushed = "; ".join(f"{m} {_pct(paired_median(results, m, rounds, FLUSHED))}" for m in compared)
    lines = ["",
             "**Headline — recording adds ≤ +10 % proxy CPU per request (the proxy's processes: relay and writer, "
             "the writer's compaction included); record+capture ≤ +25 % on the same basis.** Median over the valid "
             "rounds of each round's ratio of (relay process + writer process over the window + the writer's "
             "compaction and rollups per request, measured after the rounds on the rows recorded) CPU per request to "
             f"the same round's `stats`: {total}. One run: a target counts as met when two runs meet it.",
             "",
             "Without the compaction (the windows alone, what this bench's headline was until the thirty-ninth "
             f"session): {flushed}.",
             "",
             f"Secondary, the relay process alone (leaves out the writer process, where the Arrow and Parquet work "
             f"runs; what the loop's own core carries): {relay}."]
    if before and "stats" + BEFORE in results:
        lines += ["", f"`--before {before}`, measured in the same windows, each revision against its own `stats` "
                      "(relay + writer over the windows: compaction is measured with this checkout's code only):"]
        lines += [f"- {m}: `{before}` {_pct(paired_median(results, m + BEFORE, rounds, FLUSHED))} → this checkout "
                  f"{_pct(paired_median(results, m, rounds, FLUSHED))} (relay process alone: "
                  f"{_pct(paired_median(results, m + BEFORE, rounds, RELAY))} → "
                  f"{_pct(paired_median(results, m, rounds, RELAY))})"
                  for m in compared if m + BEFORE in results]
        lines.append(f"- the relay itself, CPU per request of this checkout's `stats` vs `stats@before`: "
                     f"{_pct(paired_median(results, 'stats', rounds, FLUSHED, vs='stats' + BEFORE))}")
    return lines


def best_lines(results: dict[str, list[dict]], offered: float) -> list[str]:
    """Each mode's least-disturbed valid round (interference only adds CPU) against its baseline's, and round by
    round: the spread the medians above summarise."""
    rounds, invalid = valid_rounds(results, offered)
    if not rounds:
        return []

    def best(mode: str, key: str) -> float:
        return min(results[mode][r][key] for r in rounds)

    def versus(m: str, key: str, vs: str) -> str:
        return "" if vs == m or vs not in results else f" ({100 * (best(m, key) - best(vs, key)) / best(vs, key):+.0f} %)"

    def ratios(key: str, vs: Callable[[str], str] = baseline, modes: list[str] | None = None) -> str:
        return "; ".join(f"{m} {best(m, key):.1f} µs{versus(m, key, vs(m))}" for m in modes or list(results))

    def by_round(mode: str) -> str:
        every = list(range(len(rounds) + len(invalid)))
        return ", ".join(f"{x:+.0f} %" + (" (left out)" if r in invalid else "")
                         for r, x in zip(every, round_ratios(results, mode, every)))

    now = [m for m in results if not m.endswith(BEFORE)]  # a MODE@before has no compaction figure
    compared = [m for m in now if m != baseline(m)]
    both = any(m.endswith(BEFORE) for m in results)
    return ["",
            "Best valid round of each mode, relay + writer processes per request, compaction included, vs `stats`: "
            + ratios(TOTAL, modes=now) + ".",
            "",
            *(["Same, the windows alone (no compaction), both revisions (`MODE@before` vs `stats@before`): "
               + ratios(FLUSHED) + ".", ""] if both else []),
            "Same, relay process alone: " + ratios(RELAY) + ".",
            "",
            *(["Relay process alone, vs `off`: " + ratios(RELAY, lambda m: "off") + ".", ""]
              if "off" in results else []),
            "Round by round, relay + writer processes, compaction included, each against the same round's `stats`: "
            + "; ".join(f"{m} {by_round(m)}" for m in compared) + ".",
            ""]


def command_line(args) -> str:
    """The command that reproduces this run: every option that differs from its default, windows included."""
    opts = [" --quick" if args.quick else "",
            "" if args.rate == 20_000 else f" --rate {args.rate:.0f}",
            f" --side-by-side {args.side_by_side}" if args.side_by_side else "",
            f" --before {args.before}" if args.before else "",
            "" if args.rounds == 2 or args.quick else f" --rounds {args.rounds}",
            "" if args.quick or args.window == WINDOW_S else f" --window {args.window:g}",
            "" if args.quick or args.warmup == WARMUP_S else f" --warmup {args.warmup:g}",
            " --pin" if args.pins else ""]
    return ".venv/bin/python bench/recording_cost.py" + "".join(opts)


def report(args, results, sizes, real_bpr, real_rows, synth, side) -> None:
    lines = [
        "## recording (bench/recording_cost.py)",
        "",
        f"Command: `{command_line(args)}` — "
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} shared cores "
        f"(load average {os.getloadavg()[0]:.1f} while it ran), offered {args.rate:,.0f} req/s"
        + (f" to each of {len(results)} proxies running at once (side by side)" if args.side_by_side else "")
        + f", {args.rounds} alternating rounds × {args.window:g} s windows after {args.warmup:g} s warm-up; "
        + ("the proxy pinned alone to one core, the load generator, fake broker and writer process to the "
           "others." if args.pins else "no CPU pinning."),
        "",
        f"Real proxy (ProxyServer + uvloop, own process) in front of a fake broker replaying real captured "
        f"frames (request/response bytes: Produce {sizes[0][0]}/{sizes[0][1]}, Fetch {sizes[1][0]}/{sizes[1][1]}, "
        f"Metadata {sizes[3][0]}/{sizes[3][1]}; mix 48/47/5 %), 16 connections × 8 in flight. "
        "Relay CPU = the proxy process's user+sys over the window (the recorder's shipping thread found by its "
        "kernel thread name); the writer process (Arrow + Parquet, `recording.writer_child`) is the proxy's child, "
        "measured apart. The writer merges a segment's flush files (and computes the rollups) every 60 s, "
        "which no 10 s window holds: that compaction is measured after the rounds on this run's recorded rows "
        "(`compaction_cost`) and added to each round; the last column, the total, is what the headline compares. "
        "`record` = LiveStats + "
        "recorder, so record vs stats is the recording alone.",
        "",
        "| mode | round | req/s reached | proxy CPU % of a core | relay CPU µs / request | shipping thread % of a core "
        "| writer process % of a core | relay + writer µs / request (window) | compaction µs / request (after) "
        "| total µs / request |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, runs in results.items():
        for i, r in enumerate(runs):
            lines.append(f"| {mode} | {i + 1} | {r['rate']:,.0f} | {r['cpu_pct']:.1f} | {r[RELAY]:.1f} | "
                         f"{r['writer_pct']:.1f} | {r['child_pct']:.1f} | {r[FLUSHED]:.1f} | "
                         + ("not measured | — |" if mode.endswith(BEFORE) else
                            f"{r['compact_us_per_req']:.1f} | {r[TOTAL]:.1f} |"))
    lines += ["", validity_line(results, args.rate)]
    if "stats" in results:
        lines += headline_lines(results, args.rate, args.before)
        lines += best_lines(results, args.rate)
    if lines[-1]:
        lines.append("")
    lines += [
        "Bytes per request row on disk (zstd-3, dictionary + DELTA_BINARY_PACKED timestamps, sorted by "
        "api_key, conn_id, time):",
        "",
        f"- rows of the `record` run ({real_rows:,} rows, files as left after SIGTERM; the replayed frames "
        f"repeat, so this is optimistic): **{real_bpr:.1f} B/row**",
    ]
    for label, v in synth.items():
        lines.append(f"- synthetic typical mix (`recording.sample_rows.SessionMix`: jittered sizes and "
                     f"timings, 24 connections, 20k rows/s), {label}: **{v:.1f} B/row**")
    lines += [
        "",
        "Recorder driven directly at 20k rows/s (no proxy; rows with every request column), both writers "
        "in one run:",
        "",
        "| writer | enqueue on the loop thread µs/row | recorder thread in the proxy µs/row (% of a core) "
        "| writer process µs/row | 1 ms ticker lateness p99 / max, ms (idle recorder: "
        f"{side['thread']['base_lag_p99_ms']:.2f} / {side['thread']['base_lag_max_ms']:.2f}) |",
        "|---|---|---|---|---|",
        *(f"| {w} | {s['enqueue_us']:.2f} | {s['writer_us_per_row']:.2f} ({s['writer_pct']:.1f} %) | "
          f"{s['child_us_per_row']:.2f} | {s['lag_p99_ms']:.2f} / {s['lag_max_ms']:.2f} |" for w, s in side.items()),
        "",
        "`thread`: the dict → Arrow conversion, sort and zstd run on a thread of the proxy (GIL held per "
        "512-row conversion). `process` (what `kafkatap proxy` uses): the loop thread pickles every 64 rows "
        "(counted in its enqueue cost here, with rows built long before: cold in the cache) and the proxy's "
        "thread only writes them into a pipe; Arrow and Parquet run in the writer process on another core.",
        "",
    ]
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", nargs=3, metavar=("MODE", "UPSTREAM", "DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=20_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window", type=float, default=WINDOW_S, help="seconds measured per round")
    ap.add_argument("--warmup", type=float, default=WARMUP_S, help="seconds of load before each window")
    ap.add_argument("--quick", action="store_true", help="1 round, 5 s windows")
    ap.add_argument("--side-by-side", nargs="?", const=",".join(SIDE_BY_SIDE), metavar="MODES",
                    help="run one proxy per mode at once (default: " + ",".join(SIDE_BY_SIDE) + "), each offered "
                         "--rate, and measure them over the same window (without it: one mode at a time, alternating)")
    ap.add_argument("--before", metavar="REV",
                    help="with --side-by-side (which must include stats): also run each mode from git revision REV's "
                         "code, in the same windows (MODE@before, stats@before included), each compared with its own "
                         "revision's stats, to measure a change against the code it replaced")
    ap.add_argument("--pin", action="store_true",
                    help="pin the proxy alone to the first core and the load generator, fake broker and writer "
                         "process to the others (default: the OS places them). On the 2-core bench machine this did "
                         "not narrow the spread between rounds (bench/RESULTS.md)")
    args = ap.parse_args()
    if args.serve:
        serve_proxy(*args.serve)
        return
    args.modes = args.side_by_side.split(",") if args.side_by_side else list(MODES)
    unknown = [m for m in args.modes if m not in MODES]
    if unknown:
        ap.error(f"--side-by-side: unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    args.before_root = None
    if args.before:
        if not args.side_by_side:
            ap.error("--before needs --side-by-side: a revision's proxies are compared in the same windows")
        if "stats" not in args.modes:
            ap.error("--before needs stats among the --side-by-side modes: each revision's recording is compared "
                     "with that revision's own stats proxy")
        args.before_root = extract_revision(ROOT, args.before)
        args.modes += [m + BEFORE for m in args.modes]  # stats@before too: REV's modes are compared with it
    if args.quick:
        args.rounds, args.window, args.warmup = 1, 5.0, 2.0
    args.pins = pin_cpus() if args.pin else None  # before this process pins itself to the others
    import uvloop

    from recording.logs import configure_logging

    configure_logging("json", "warning")  # logs to stderr: stdout is the markdown section

    args.scratch = tempfile.mkdtemp(prefix="kt-bench-rec-")  # every round's recordings, removed whatever happens
    try:
        results, sizes, rec_dirs = uvloop.run(amain(args))
        real_bpr, real_rows = bytes_per_row(Path(rec_dirs["record"])) if "record" in rec_dirs else (0.0, 0)
        print("measuring compaction on the recorded rows…", file=sys.stderr)
        compaction = {mode: compaction_cost(Path(d), args.rate) for mode, d in rec_dirs.items()}
        add_compaction(results, compaction)
    finally:
        shutil.rmtree(args.scratch, ignore_errors=True)
        if args.before_root:
            shutil.rmtree(args.before_root, ignore_errors=True)
    synth = synthetic_disk()
    side = {w: loop_side(w) for w in ("thread", "process")}
    report(args, results, sizes, real_bpr, real_rows, synth, side)


if __name__ == "__main__":
    main()
