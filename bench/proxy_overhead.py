"""What does kafkatap cost? Direct vs kafkatap (recording on) vs HAProxy (TCP mode), in one run.

    .venv/bin/python bench/proxy_overhead.py [--rounds 3] [--records 200000] [--probe 2000]

One broker (LocalKafka 4.3.1) with three listeners so every path keeps its
clients on that path (bytes are forwarded unchanged, so the broker must
advertise the proxy's address): PLAINTEXT (direct), KT (advertised as the
kafkatap port) and HAP (advertised as the HAProxy port). For each round, the
three paths run alternately:

* Kafka's own ProducerPerformance (acks=1, large batches) → MB/s
* Kafka's own ConsumerPerformance → fetch MB/s
* a small acks=1 Produce latency probe: one captured Produce frame sent and
  answered sequentially on a raw socket (no client library noise) → p50/p99

Then 1,000 connections are opened through kafkatap (each sends ApiVersions)
and the proxy's RSS is read from /proc. kafkatap runs as `kafkatap proxy
--workers 1 --record DIR` in its own processes (the relay and its recording
writer), not as `kafkatap proxy` with its default worker count: the issue's
figures are per process, and `--workers N` runs N relays, each with its own
memory (RSS about N times the figure printed). Proxy CPU is that of the
process tree, the recording writer included: the writer is where the Arrow
and Parquet work happens, and the relay process alone would leave it out.

Issue 15 adds three paths:

* cluster: `kafkatap proxy --cluster` in front of the PLAINTEXT listener, which
  advertises the broker's own address: every Metadata / FindCoordinator answer
  is rewritten, and the producer and consumer reach the broker through the
  proxy's per-broker listener (the rewriting path, framing included);
* kafkatap-tls and haproxy-tls: both terminate the clients' TLS with the same
  certificate and relay plaintext to the broker (throughput only: the latency
  probe speaks plaintext).

The latency probe also goes through a fifth proxy, `kafkatap proxy --no-decode`
("relay-only", probed only): the p50 that relaying alone adds, so what decoding
and recording add is the difference to the kafkatap path.

`--quick` runs one short round of everything (to check the bench works, not to
measure); `--no-tls` leaves the TLS paths out.

`--pin` gives the proxies a core of their own: every proxy (kafkatap's
processes, HAProxy) runs on one CPU, and the broker, the clients and the probe
on the others, for every path, direct included. Unpinned, on a two-core
machine, whatever CPU a proxy spends is taken from the broker and the clients
it is measured with (HAProxy, which decodes nothing, then reaches 0.74-0.97 x
direct); pinned, the ratios measure what the extra hop costs a client when the
proxy has its own CPU, as on a gateway host. Both are worth printing: unpinned
is the client host that also runs the proxy, pinned is the gateway.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.kafka import LocalKafka, free_port, port_is_free  # noqa: E402
from harness.tls import Pki  # noqa: E402
from harness.jars import ensure_jars  # noqa: E402
from proc_tree import pin_cpus, snapshot, tree, tree_cpu_s  # noqa: E402

KAFKA_VERSION = "4.3.1"
KAFKATAP = ROOT / ".venv" / "bin" / "kafkatap"
PATHS = ("direct", "kafkatap", "haproxy", "cluster", "kafkatap-tls", "haproxy-tls")
# the latency probe is plaintext; "relay-only" is kafkatap --no-decode (probed only): what relaying alone adds,
# so the p50 added by decoding and recording reads as the difference
PROBED = ("direct", "kafkatap", "haproxy", "cluster", "relay-only")
CLIENT_PROPS: dict[str, dict[str, str]] = {}  # path → extra client properties (TLS paths: the truststore)


def _free_run(n: int) -> int:
    """A port p with p .. p+n-1 free (cluster mode derives broker ports from its listen port)."""
    for _ in range(200):
        p = free_port()
        if p + n < 65000 and all(port_is_free("127.0.0.1", p + i) for i in range(n)):
            return p
    raise RuntimeError("no run of free ports")


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


@functools.cache
def client_lib() -> Path:
    """The Kafka jars' directory, from the harness (as the broker's): `$KAFKATAP_CACHE` moves both alike,
    so the clients never run jars other than the broker's, nor fail where a fixed `.kafka/` path is absent."""
    return ensure_jars(KAFKA_VERSION)


def java(cls: str, *args: str, timeout: float = 300) -> str:
    cmd = ["java", "-Xmx512m", "-cp", f"{client_lib()}/*", cls, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{cls} failed: {out.stderr[-2000:]}")
    return out.stdout


def producer_mb_s(bootstrap: str, topic: str, records: int, size: int, props: dict[str, str] | None = None) -> float:
    out = java("org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records", str(records),
               "--record-size", str(size), "--throughput", "-1", "--producer-props",
               f"bootstrap.servers={bootstrap}", "acks=1", "batch.size=262144", "linger.ms=5",
               "buffer.memory=67108864", "compression.type=none", *(f"{k}={v}" for k, v in (props or {}).items()))
    last = [ln for ln in out.splitlines() if "records sent" in ln][-1]
    return float(re.search(r"\(([\d.]+) MB/sec\)", last).group(1))  # type: ignore[union-attr]


def consumer_mb_s(bootstrap: str, topic: str, records: int, props: dict[str, str] | None = None) -> float:
    extra = [a for k, v in (props or {}).items() for a in ("--command-property", f"{k}={v}")]
    out = java("org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", bootstrap, "--topic", topic,
               "--messages", str(records), "--timeout", "60000", *extra)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    header = [h.strip() for h in lines[-2].split(",")]
    values = [v.strip() for v in lines[-1].split(",")]
    row = dict(zip(header, values))
    return float(row.get("fetch.MB.sec") or row["MB.sec"])


def capture_produce_frame(listen: str, upstream: str, topic: str) -> bytes:
    """One small acks=1 Produce request frame, as kafka-python sends it (captured by our own API)."""
    from kafka import KafkaProducer

    from proxy.running import RunningProxy

    class Frames:
        def __init__(self) -> None:
            self.frames: list[dict] = []

        def request(self, row: dict) -> None: ...
        def connection(self, row: dict) -> None: ...
        def tcp(self, row: dict) -> None: ...
        def frame(self, row: dict) -> None:
            self.frames.append(row)

        def close(self) -> None: ...

    sink = Frames()
    # a throwaway in-process proxy on the KT port (the broker advertises it), only to capture the bytes
    with RunningProxy(upstream=upstream, listen=listen, sink=sink, capture="requests") as p:
        prod = KafkaProducer(bootstrap_servers=p.bootstrap, acks=1, linger_ms=0)
        prod.send(topic, b"x" * 100, partition=0).get(10)
        prod.close()
    produces = [f for f in sink.frames if f["api_key"] == 0 and f["data"]]
    return produces[-1]["data"]


def _roundtrip(s: socket.socket, frame: bytes) -> int:
    t0 = time.perf_counter_ns()
    s.sendall(frame)
    head = b""
    while len(head) < 4:
        head += s.recv(4 - len(head))
    size = struct.unpack(">i", head)[0]
    got = 0
    while got < size:
        got += len(s.recv(size - got))
    return time.perf_counter_ns() - t0


def probe(port: int, frame: bytes, n: int) -> list[int]:
    return probe_interleaved({"p": port}, frame, n)["p"]


def probe_interleaved(ports: dict[str, int], frame: bytes, n: int) -> dict[str, list[int]]:
    """Request by request, rotating over the paths: machine noise hits every path alike."""
    socks = {}
    for name, port in ports.items():
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks[name] = s
    out: dict[str, list[int]] = {name: [] for name in ports}
    names = list(ports)
    for i in range(n):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(_roundtrip(socks[name], frame))
    for s in socks.values():
        s.close()
    return out


def pct(v: list[int], q: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] / 1000.0


def cpu_s(pid: int | None) -> float:
    """utime + stime of a proxy's process tree in seconds (0 for the direct path, which has no proxy).

    The tree, not the process: kafkatap's recording writer is a child process doing the Arrow/Parquet work,
    and the relay's /proc/PID/stat alone would make recording look free (RSS already counts the tree)."""
    return 0.0 if pid is None else tree_cpu_s(pid)


def rss_mb(pid: int) -> tuple[float, float]:
    """Resident memory of `pid` alone and with its descendants (the proxy with its recording writer
    process), from one reading of /proc so that both figures are of the same moment."""
    procs = snapshot(rss=True)
    return procs[pid].rss_kib / 1024, sum(procs[p].rss_kib for p in tree(pid, procs) if p in procs) / 1024


def peak_mb(pid: int) -> float:
    """The high-water marks (VmHWM) of `pid` and its descendants, summed: an upper bound of the tree's largest
    RSS over the whole run (a writer process's merge or rollup may have passed while nobody looked)."""
    procs = snapshot()
    total = 0
    for p in tree(pid, procs):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:  # gone since the snapshot
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return total / 1024


def warm_up(paths: tuple[str, ...], boot: dict[str, str], records: int, size: int) -> None:
    """One short producer and consumer run on every path before round 0 is measured.

    Warming the direct path alone left each proxy's first connections, its decoder's first batches and the
    writer's first files inside round 0's figure, against a direct path already warm: a bias, not noise."""
    for p in paths:
        producer_mb_s(boot[p], "bench", records, size, CLIENT_PROPS.get(p))
        consumer_mb_s(boot[p], "bench", records, CLIENT_PROPS.get(p))


def open_many(port: int, n: int) -> list[socket.socket]:
    req = struct.pack(">hhih", 18, 0, 1, 5) + b"bench"
    frame = struct.pack(">i", len(req)) + req
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(frame)
        socks.append(s)
    for s in socks:  # every connection answered: the proxy holds both sockets + decoder state
        head = s.recv(4)
        size = struct.unpack(">i", head)[0]
        got = 0
        while got < size:
            got += len(s.recv(size - got))
    return socks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=200_000, help="records per producer/consumer run")
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--probe", type=int, default=2000, help="latency probe requests per path per round")
    ap.add_argument("--conns", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="one short round: checks the bench runs, measures nothing")
    ap.add_argument("--no-tls", action="store_true", help="leave out the TLS termination paths")
    ap.add_argument("--pin", action="store_true",
                    help="the proxies on one core of their own, broker and clients on the others (see above)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.records, args.probe, args.conns = 1, 20_000, 200, 50
    paths = tuple(p for p in PATHS if not (args.no_tls and p.endswith("-tls")))

    os.environ.setdefault("KAFKATAP_LOG_FORMAT", "json")
    proxy_cpus: set[int] | None = None
    rest: set[int] = set()
    if args.pin:
        pins = pin_cpus()
        if pins is None:
            ap.error("--pin needs at least two CPUs")
        proxy_cpus, rest = pins
        os.sched_setaffinity(0, rest)  # the broker, the clients and the probe inherit it

    def on_proxy_core() -> None:
        """Popen preexec_fn: a proxy process (and every process it starts) runs on the proxies' core."""
        if proxy_cpus:
            os.sched_setaffinity(0, proxy_cpus)

    tmp = Path(tempfile.mkdtemp(prefix="kt-bench-"))
    b_kt, b_hap, p_kt, p_hap, b_kts, b_haps, p_kts, p_haps = (free_port() for _ in range(8))
    p_cl = _free_run(3)  # cluster mode: bootstrap listener, then broker 1 on p_cl + 2
    props = {
        "listeners": f"PLAINTEXT://127.0.0.1:{{port}},CONTROLLER://127.0.0.1:{{controller_port}},"
                     f"KT://127.0.0.1:{b_kt},HAP://127.0.0.1:{b_hap},KTS://127.0.0.1:{b_kts},HAPS://127.0.0.1:{b_haps}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{{port}},KT://127.0.0.1:{p_kt},HAP://127.0.0.1:{p_hap},"
                                f"KTS://127.0.0.1:{p_kts},HAPS://127.0.0.1:{p_haps}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,KT:PLAINTEXT,HAP:PLAINTEXT,"
                                          "KTS:PLAINTEXT,HAPS:PLAINTEXT",
        "num.network.threads": 3,
    }
    procs: list[subprocess.Popen] = []
    kafka = LocalKafka(broker_props=props, heap="1g")
    kafka.start()
    try:
        kafka.create_topic("bench", partitions=1)
        cfg = tmp / "haproxy.cfg"
        cfg.write_text(
            "global\n  maxconn 4000\n"
            "defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  timeout server 1h\n"
            f"listen kafka\n  bind 127.0.0.1:{p_hap}\n  server b1 127.0.0.1:{b_hap}\n"
        )
        pki = Pki.create(tmp / "pki")
        cert = pki.issue("proxy")  # the same certificate for both TLS terminators
        CLIENT_PROPS.update({p: {"security.protocol": "SSL", "ssl.truststore.type": "PEM",
                                 "ssl.truststore.location": str(pki.ca)} for p in ("kafkatap-tls", "haproxy-tls")})
        if "haproxy-tls" in paths:
            with cfg.open("a") as f:
                f.write(f"listen kafka-tls\n  bind 127.0.0.1:{p_haps} ssl crt {cert.bundle}\n"
                        f"  server b1 127.0.0.1:{b_haps}\n")
        hap = subprocess.Popen(["/usr/sbin/haproxy", "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, preexec_fn=on_proxy_core)
        procs.append(hap)
        frame = capture_produce_frame(f"127.0.0.1:{p_kt}", f"127.0.0.1:{b_kt}", "bench-lat")
        kt = subprocess.Popen([str(KAFKATAP), "--log-level", "warning", "proxy", "--workers", "1", "--route",
                               f"127.0.0.1:{p_kt}=127.0.0.1:{b_kt}", "--record", str(tmp / "rec")],
                              stdout=subprocess.DEVNULL, stderr=open(tmp / "kafkatap.log", "w"), preexec_fn=on_proxy_core)
        procs.append(kt)
        p_nd = free_port()
        nd = subprocess.Popen([str(KAFKATAP), "--log-level", "warning", "proxy", "--workers", "1", "--no-decode", "--route",
                               f"127.0.0.1:{p_nd}=127.0.0.1:{b_kt}"],  # the raw probe needs no advertised address
                              stdout=subprocess.DEVNULL, stderr=open(tmp / "kafkatap-nodecode.log", "w"), preexec_fn=on_proxy_core)
        procs.append(nd)
        cl = subprocess.Popen([str(KAFKATAP), "--log-level", "warning", "proxy", "--workers", "1", "--cluster", kafka.bootstrap,
                               "--listen", f"127.0.0.1:{p_cl}", "--record", str(tmp / "rec-cluster")],
                              stdout=subprocess.DEVNULL, stderr=open(tmp / "kafkatap-cluster.log", "w"), preexec_fn=on_proxy_core)
        procs.append(cl)
        kts = None
        if "kafkatap-tls" in paths:
            kts = subprocess.Popen([str(KAFKATAP), "--log-level", "warning", "proxy", "--workers", "1", "--route",
                                    f"127.0.0.1:{p_kts}=127.0.0.1:{b_kts}", "--record", str(tmp / "rec-tls"),
                                    "--tls-cert", str(cert.cert), "--tls-key", str(cert.key)],
                                   stdout=subprocess.DEVNULL, stderr=open(tmp / "kafkatap-tls.log", "w"), preexec_fn=on_proxy_core)
            procs.append(kts)
            wait_port(p_kts)
        wait_port(p_hap)
        wait_port(p_kt)
        wait_port(p_nd)
        wait_port(p_cl + 2)  # broker 1's listener: discovery is done
        boot = {"direct": kafka.bootstrap, "kafkatap": f"127.0.0.1:{p_kt}", "haproxy": f"127.0.0.1:{p_hap}",
                "cluster": f"127.0.0.1:{p_cl}", "kafkatap-tls": f"127.0.0.1:{p_kts}",
                "haproxy-tls": f"127.0.0.1:{p_haps}"}
        ports = {"direct": kafka.port, "kafkatap": p_kt, "haproxy": p_hap, "cluster": p_cl, "relay-only": p_nd}

        pids = {"direct": None, "kafkatap": kt.pid, "haproxy": hap.pid, "cluster": cl.pid,
                "kafkatap-tls": kts.pid if kts else None, "haproxy-tls": hap.pid}
        # proxy CPU seconds over all throughput runs (haproxy-tls shares haproxy's process: its own runs only)
        cpu: dict[str, float] = {p: 0.0 for p in PATHS}
        moved_mb = {p: 0.0 for p in PATHS}
        prod: dict[str, list[float]] = {p: [] for p in PATHS}
        cons: dict[str, list[float]] = {p: [] for p in PATHS}
        lat: dict[str, list[int]] = {p: [] for p in (*PATHS, *PROBED)}
        t_start = time.monotonic()
        for p in PROBED:  # warm-up (JIT, page cache, connections)
            probe(ports[p], frame, 200)
        warm_up(paths, boot, args.records // 4, args.record_size)
        for r in range(args.rounds):
            order = paths if r % 2 == 0 else tuple(reversed(paths))
            for p in order:
                c0 = cpu_s(pids[p])
                prod[p].append(producer_mb_s(boot[p], "bench", args.records, args.record_size, CLIENT_PROPS.get(p)))
                cpu[p] += cpu_s(pids[p]) - c0
                moved_mb[p] += args.records * args.record_size / 1e6
                print(f"round {r} producer {p}: {prod[p][-1]:.1f} MB/s", flush=True)
            for p in order:
                c0 = cpu_s(pids[p])
                cons[p].append(consumer_mb_s(boot[p], "bench", args.records, CLIENT_PROPS.get(p)))
                cpu[p] += cpu_s(pids[p]) - c0
                moved_mb[p] += args.records * args.record_size / 1e6
                print(f"round {r} consumer {p}: {cons[p][-1]:.1f} MB/s", flush=True)
            this_round = probe_interleaved(ports, frame, args.probe)
            for p, v in this_round.items():
                lat[p].extend(v)
            print(f"round {r} latency p50 (this round's probe) "
                  + " ".join(f"{p}={pct(this_round[p], .5):.0f}us" for p in PROBED), flush=True)

        rss_idle, tree_idle = rss_mb(kt.pid)
        socks = open_many(p_kt, args.conns)
        rss_conns, tree_conns = rss_mb(kt.pid)
        tree_peak = peak_mb(kt.pid)
        for s in socks:
            s.close()
        took = time.monotonic() - t_start

        med = {p: statistics.median(prod[p]) for p in paths}
        cmed = {p: statistics.median(cons[p]) for p in paths}

        def paired(runs: dict[str, list[float]], p: str) -> str:
            """Median of the per-round ratios to direct: each round's paths ran back to back, so a slow round
            slows them alike and the pairing cancels it (the medians above are taken path by path)."""
            return f"{statistics.median(a / b for a, b in zip(runs[p], runs['direct'])):.3f}"
        p50 = {p: pct(lat[p], 0.50) for p in PROBED}
        p99 = {p: pct(lat[p], 0.99) for p in PROBED}
        ms_mb = {p: 1000 * cpu[p] / moved_mb[p] for p in paths}  # proxy CPU ms per MB relayed
        lines = [
            "kafkatap runs as `kafkatap proxy --workers 1 --record DIR` (one relay process and its recording writer; "
            "the figures are per process, `--workers N` multiplies RSS by about N); proxy CPU is the process tree's.",
            "",
            "| metric | direct | kafkatap | haproxy | kafkatap ratio | target |",
            "|---|---|---|---|---|---|",
            f"| producer MB/s (median of {args.rounds}) | {med['direct']:.1f} | {med['kafkatap']:.1f} | {med['haproxy']:.1f} "
            f"| {med['kafkatap'] / med['direct']:.3f} × direct, {med['kafkatap'] / med['haproxy']:.3f} × haproxy | ≥ 0.95 × direct, ≥ 0.9 × haproxy |",
            f"| consumer fetch MB/s (median of {args.rounds}) | {cmed['direct']:.1f} | {cmed['kafkatap']:.1f} | {cmed['haproxy']:.1f} "
            f"| {cmed['kafkatap'] / cmed['direct']:.3f} × direct, {cmed['kafkatap'] / cmed['haproxy']:.3f} × haproxy | ≥ 0.90 × direct, ≥ 0.9 × haproxy |",
            f"| producer / consumer, median of the per-round ratios to direct | | {paired(prod, 'kafkatap')} / "
            f"{paired(cons, 'kafkatap')} | {paired(prod, 'haproxy')} / {paired(cons, 'haproxy')} | | |",
            f"| acks=1 small produce p50 µs | {p50['direct']:.0f} | {p50['kafkatap']:.0f} | {p50['haproxy']:.0f} "
            f"| +{p50['kafkatap'] - p50['direct']:.0f} µs (haproxy +{p50['haproxy'] - p50['direct']:.0f}; kafkatap relaying "
            f"only, --no-decode, +{p50['relay-only'] - p50['direct']:.0f}) | ≤ +60 µs |",
            f"| acks=1 small produce p99 µs | {p99['direct']:.0f} | {p99['kafkatap']:.0f} | {p99['haproxy']:.0f} "
            f"| +{p99['kafkatap'] - p99['direct']:.0f} µs (haproxy +{p99['haproxy'] - p99['direct']:.0f}) | ≤ +500 µs |",
            f"| kafkatap RSS MB, the proxy process | | idle {rss_idle:.0f} / {args.conns} conns {rss_conns:.0f} "
            f"(`--workers 1`: one relay process; `--workers N` runs N, about N × this) | | | ≤ 150 MB at 1,000 |",
            f"| kafkatap RSS MB, with its recording writer process | | idle {tree_idle:.0f} / {args.conns} conns "
            f"{tree_conns:.0f} (the run's peak ≤ {tree_peak:.0f}, high-water marks summed) | | | ≤ 150 MB at 1,000 |",
            f"| proxy CPU ms per MB relayed (process tree, writer included; load-independent cost) | | "
            f"{ms_mb['kafkatap']:.2f} | {ms_mb['haproxy']:.2f} "
            f"| {ms_mb['kafkatap'] / max(ms_mb['haproxy'], 1e-9):.1f} × haproxy | |",
            "",
            # HAProxy's own ratio beside it: what a C relay with no decoding reaches on the same machine in the same run
            "| cluster mode (address rewriting) | direct | cluster | ratio | haproxy's ratio, same run | target |",
            "|---|---|---|---|---|---|",
            f"| producer MB/s | {med['direct']:.1f} | {med['cluster']:.1f} | {med['cluster'] / med['direct']:.3f} × direct "
            f"| {med['haproxy'] / med['direct']:.3f} × direct | ≥ 0.95 × direct |",
            f"| consumer fetch MB/s | {cmed['direct']:.1f} | {cmed['cluster']:.1f} | {cmed['cluster'] / cmed['direct']:.3f} × "
            f"direct | {cmed['haproxy'] / cmed['direct']:.3f} × direct | ≥ 0.95 × direct |",
            f"| producer / consumer, median of the per-round ratios | | | {paired(prod, 'cluster')} / "
            f"{paired(cons, 'cluster')} | {paired(prod, 'haproxy')} / {paired(cons, 'haproxy')} | |",
            f"| acks=1 small produce p50 / p99 µs | {p50['direct']:.0f} / {p99['direct']:.0f} | {p50['cluster']:.0f} / "
            f"{p99['cluster']:.0f} | +{p50['cluster'] - p50['direct']:.0f} / +{p99['cluster'] - p99['direct']:.0f} µs "
            f"| +{p50['haproxy'] - p50['direct']:.0f} / +{p99['haproxy'] - p99['direct']:.0f} µs | |",
            f"| proxy CPU ms per MB relayed (process tree, writer included) | | {ms_mb['cluster']:.2f} | "
            f"{ms_mb['cluster'] / max(ms_mb['kafkatap'], 1e-9):.2f} × explicit kafkatap | {ms_mb['haproxy']:.2f} | |",
        ]
        if "kafkatap-tls" in paths:
            lines += [
                "",
                "| TLS termination | kafkatap-tls | haproxy-tls | kafkatap ÷ haproxy |",
                "|---|---|---|---|",
                f"| producer MB/s | {med['kafkatap-tls']:.1f} | {med['haproxy-tls']:.1f} "
                f"| {med['kafkatap-tls'] / med['haproxy-tls']:.3f} |",
                f"| consumer fetch MB/s | {cmed['kafkatap-tls']:.1f} | {cmed['haproxy-tls']:.1f} "
                f"| {cmed['kafkatap-tls'] / cmed['haproxy-tls']:.3f} |",
                f"| proxy CPU ms per MB relayed (process tree, writer included) | {ms_mb['kafkatap-tls']:.2f} "
                f"| {ms_mb['haproxy-tls']:.2f} | |",
            ]
        print("\n".join(lines))
        load = os.getloadavg()
        placement = (f"proxies pinned to CPU {sorted(proxy_cpus)}, broker + clients + probe on {sorted(rest)}"
                     if proxy_cpus else "no CPU pinning: proxies, broker and clients share every core")
        print(f"\nall runs: producer {prod}\nconsumer {cons}\nproxy cpu s (process tree, writer included) {cpu}\n"
              f"bench time {took:.0f} s, load average at end {load[0]:.1f} on {os.cpu_count()} cpus; {placement}")
        (tmp / "table.md").write_text("\n".join(lines) + "\n")
        print(f"table written to {tmp / 'table.md'}")
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.send_signal(signal.SIGTERM)
        for pr in procs:
            try:
                rc = pr.wait(20)
                if pr.args[0] == str(KAFKATAP) and rc != 0:
                    print(f"kafkatap exited {rc}", file=sys.stderr)
            except subprocess.TimeoutExpired:
                pr.kill()
        kafka.stop()
        kafka.cleanup()
        for rec in ("rec", "rec-cluster", "rec-tls"):
            shutil.rmtree(tmp / rec, ignore_errors=True)


if __name__ == "__main__":
    main()
