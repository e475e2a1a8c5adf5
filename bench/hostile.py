"""Hostile clients against the relay (issue 19): fairness, memory bounds, accounting — one table.

    .venv/bin/python bench/hostile.py [--pings 5000] [--flood-share 0.7] [--no-pin] [--only-fairness]

No Kafka needed: the upstream is a small responder (its own process) that
answers every request frame with an ApiVersions v0 response carrying the
same correlation id. kafkatap runs as `kafkatap proxy` in its own process,
as an operator would run it, with /metrics on.

Probes:
* **fairness** — a ping connection (one tiny request at a time) alone and
  beside a flood connection pipelining tiny frames on another route of the
  same proxy process, the two phases alternating ten times (the flood stopped
  in between) so that the host's drifting noise weighs on both alike;
  p50/p99 of the ping and the ratio loaded/unloaded, with
  decoding off (reference), recording off and recording on. Fair on a small
  machine: the proxy runs alone on CPU 0, the flood and its responder on the
  other CPUs (sched_setaffinity; `--no-pin` to compare); the ping has a
  responder of its own, and the pinger and that responder run at real-time
  priority (SCHED_FIFO, they sleep between pings), so that what delays a ping
  is the proxy, not a wait for a core behind the flood's own processes. The
  `--no-decode` row is the check of that: forwarding alone must not move the
  ping. The flood is paced: first a calibration run
  measures how fast one unpaced flood gets through the `--no-decode` proxy,
  then every probe floods at `--flood-share` of that — enough to keep the
  proxy's CPU busy once it decodes, without starving the pinger of its own
  CPU (otherwise the ping waits for a core, not for the proxy). The flood's
  relay rate is printed beside its target: forwarding must not be what gives.
  At that pace the decoder falls behind and gives the flood connection up
  (opaque, bytes counted as skipped), so two more rows flood at
  `--decodable-mbps`, a pace the decoder keeps up with (skipped 0): there the
  ping competes with the flood's decoding and recording work itself.
* **memory** — the proxy's RSS (from /proc) after each hostile pattern,
  measured after the connection closed, beside the documented bound:
  1 M frames with varying versions (process-wide caches, metrics labels),
  tagged header fields past the header bound, requests pipelined past the
  in-flight cap.
* **accounting** — N requests (reused correlation ids, more than the cap in
  flight) and then: requests sent == rows written + rows dropped, from
  /metrics.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
KAFKATAP = ROOT / ".venv" / "bin" / "kafkatap"

from bench.proc_tree import cpu_s, snapshot, state, tree  # noqa: E402
from bench.proxy_overhead import wait_port  # noqa: E402
from harness.kafka import free_port  # noqa: E402


def req(cid: int, key: int = 18, ver: int = 0, client_id: bytes = b"c") -> bytes:
    body = struct.pack(">hhih", key, ver, cid, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


# ---------------------------------------------------------------- processes of their own
def realtime() -> None:
    """Run this process at real-time priority: it sleeps between pings, and must not wait for a core when woken."""
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))


def responder(port_file: str, rt: bool = False) -> None:
    """Answer every request frame with an ApiVersions v0 response (same correlation id)."""
    import asyncio

    if rt:
        realtime()

    TINY = struct.Struct(">ihhihc")
    ANSWER = struct.Struct(">iihi").pack

    class Answer(asyncio.Protocol):
        def connection_made(self, t: asyncio.BaseTransport) -> None:
            self.t = t
            self.buf = bytearray()

        def data_received(self, data: bytes) -> None:
            buf = self.buf
            buf += data
            out = bytearray()
            i = 0
            n = len(buf)
            if n >= 15 and buf[:4] == b"\x00\x00\x00\x0b":  # the bench's own 15-byte requests: a fast path
                for size, _, _, cid, _, _ in TINY.iter_unpack(bytes(buf[:n - n % 15])):
                    if size != 11:
                        break
                    out += ANSWER(10, cid, 0, 0)
                    i += 15
            while n - i >= 4:
                size = struct.unpack_from(">i", buf, i)[0]
                if n - i - 4 < size:
                    break
                cid = struct.unpack_from(">i", buf, i + 8)[0] if size >= 8 else 0
                out += struct.pack(">iihi", 10, cid, 0, 0)
                i += 4 + size
            del buf[:i]
            if out:
                self.t.write(bytes(out))  # type: ignore[attr-defined]

    async def main() -> None:
        srv = await asyncio.get_running_loop().create_server(Answer, "127.0.0.1", 0)
        Path(port_file).write_text(str(srv.sockets[0].getsockname()[1]))
        await asyncio.Event().wait()

    asyncio.run(main())


def flood(port: int, seconds: float, rate: float = 0.0) -> None:
    """Pipeline tiny requests, at `rate` bytes/s (0: as fast as one process can); print the bytes sent at the end.

    seconds > 0: flood that long, then print bytes/s. seconds == 0: the bench drives it — the flood stops
    itself once connected (SIGSTOP), floods while continued, and prints the bytes it sent on SIGTERM. Its
    pace is a token bucket holding one block at most, so a flood continued after a pause does not burst.
    """
    s = socket.create_connection(("127.0.0.1", port))
    block = b"".join(req(i) for i in range(2_000))  # 30 kB: pacing in steps of a few ms at most
    drain(s)
    sent = 0
    driven = seconds == 0
    if driven:
        def stop_now(*_: object) -> None:
            raise SystemExit
        signal.signal(signal.SIGTERM, stop_now)
        os.kill(os.getpid(), signal.SIGSTOP)
    t0 = last = time.monotonic()
    stop = float("inf") if driven else t0 + seconds
    credit = float(len(block))
    try:
        while (now := time.monotonic()) < stop:
            if rate:
                credit = min(credit + (now - last) * rate, 2.0 * len(block))
                last = now
                if credit < len(block):  # ahead of the pace: wait for it
                    time.sleep(min(0.002, (len(block) - credit) / rate))
                    continue
                credit -= len(block)
            s.sendall(block)
            sent += len(block)
    except SystemExit:
        pass
    print(sent if driven else sent / (time.monotonic() - t0), flush=True)
    s.close()


PROXY_CPUS: set[int] = set()  # the proxy's CPU(s) when pinned; the bench and its helpers run on the rest


def pin(proxy_cpus: set[int]) -> None:
    """Keep the proxy alone on `proxy_cpus`; this process (and what it starts later) on the other CPUs."""
    rest = os.sched_getaffinity(0) - proxy_cpus
    if not proxy_cpus or not rest:
        return
    PROXY_CPUS.update(proxy_cpus)
    os.sched_setaffinity(0, rest)


# ---------------------------------------------------------------- the bench process
class Proxy:
    def __init__(self, upstream: int, record: bool, tmp: Path, decode: bool = True, ping_upstream: int = 0) -> None:
        """One proxy process; with `ping_upstream`, a second route (`ping_port`) to the ping's own responder."""
        self.port = free_port()
        self.status = free_port()
        self.ping_port = free_port() if ping_upstream else 0
        routes = ["--route", f"127.0.0.1:{self.port}=127.0.0.1:{upstream}"]
        if ping_upstream:
            routes += ["--route", f"127.0.0.1:{self.ping_port}=127.0.0.1:{ping_upstream}"]
        cmd = [str(KAFKATAP), "proxy", "--workers", "1", *routes,
               "--status-addr", str(self.status), "--no-tcp-info", "--shutdown-timeout", "2"]
        if not decode:
            cmd.append("--no-decode")
        if record:
            cmd += ["--record", str(tmp / f"rec-{self.port}"), "--flush-interval", "0.2"]
        cpus = set(PROXY_CPUS)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        wait_port(self.port)
        if record and cpus:  # the writer process, like every process but the proxy's loop, runs on the other CPUs
            for pid in tree(self.proc.pid, snapshot())[1:]:
                os.sched_setaffinity(pid, os.sched_getaffinity(0))
        if ping_upstream:
            wait_port(self.ping_port)
        wait_port(self.status)
        # wait_port's own connection must be recorded first: probes count connections from here
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = self.metrics()
            if (metric(m, "kafkatap_connections_total") >= 1 + bool(ping_upstream)
                    and metric(m, "kafkatap_open_connections") == 0):
                break
            time.sleep(0.05)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.status}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def pings(c: socket.socket, n: int) -> list[float]:
    """n round trips of a tiny request on `c`, one at a time."""
    out = []
    for i in range(n):
        c.sendall(req(i))
        t0 = time.perf_counter()
        got = b""
        while len(got) < 14:  # the ApiVersions v0 answer
            got += c.recv(100)
        out.append(time.perf_counter() - t0)
    return out


def pinger(port: int) -> None:
    """The ping, as its own real-time process: 200 warm-up pings, then for each line "N" on stdin `WARM` more and N
    pings on the same connection, printed as one line of round trips in seconds."""
    realtime()
    c = socket.create_connection(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pings(c, 200)
    for line in sys.stdin:
        pings(c, WARM)  # after a pause the first round trips are slow on both sides (cold caches, wake-ups)
        print(" ".join(f"{x:.9f}" for x in pings(c, int(line))), flush=True)
    c.close()


class Pinger:
    """A `pinger` process the bench asks for pings between flood phases."""

    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--role", "pinger", str(port)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def run(self, n: int) -> list[float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return [float(x) for x in self.proc.stdout.readline().split()]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000


def drain(c: socket.socket) -> None:
    """Read and discard answers on a thread until the socket closes."""
    def run() -> None:
        try:
            while c.recv(1 << 20):
                pass
        except OSError:
            pass
    threading.Thread(target=run, daemon=True).start()


def send_and_close(proxy: Proxy, payload: bytes, timeout: float = 120.0, pace: int = 0) -> None:
    """Send `payload` on a new connection, FIN, and wait until the proxy recorded that connection's end.

    pace: send this many bytes per millisecond at most (0: as fast as possible), so that the
    decoder keeps up and what it caches is exercised rather than skipped.
    """
    before = metric(proxy.metrics(), "kafkatap_connections_total")
    c = socket.create_connection(("127.0.0.1", proxy.port))
    drain(c)
    if pace:
        step = pace * 10
        for i in range(0, len(payload), step):
            c.sendall(payload[i:i + step])
            time.sleep(0.01)
    else:
        c.sendall(payload)
    c.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = proxy.metrics()
        if metric(m, "kafkatap_connections_total") > before and metric(m, "kafkatap_open_connections") == 0:
            break
        time.sleep(0.1)
    c.close()


REFERENCE: dict[str, float] = {}


def calibrate(upstream: int, tmp: Path, seconds: float = 3.0) -> list[str]:
    """How fast one unpaced flood gets through the `--no-decode` proxy (the pace the probes take a share of)."""
    proxy = Proxy(upstream, False, tmp, decode=False)
    try:
        c0 = cpu_s(proxy.proc.pid)
        out = subprocess.run([sys.executable, __file__, "--role", "flood", str(proxy.port), str(seconds)],
                             capture_output=True, text=True, timeout=seconds + 30).stdout
        busy = (cpu_s(proxy.proc.pid) - c0) / seconds
    finally:
        proxy.stop()
    REFERENCE["max_rate"] = float(out.strip() or 0)
    return ["flood calibration (unpaced, --no-decode)",
            f"{REFERENCE['max_rate'] / 1e6:.0f} MB/s through the proxy, proxy CPU {busy:.0%} of a core", "reference"]


ROUNDS = 10  # unloaded and loaded ping phases alternate this many times in a fairness row
WARM = 50  # pings not counted at the start of each phase


def settle(pid: int, timeout: float = 5.0) -> None:
    """Wait until the proxy is nearly idle (it decoded what the flood left it): < 10 % CPU over 50 ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c0 = cpu_s(pid)
        time.sleep(0.05)
        if cpu_s(pid) - c0 < 0.005:
            return


def fairness(upstream: int, ping_upstream: int, record: bool, tmp: Path, n: int, decode: bool = True,
             share: float = 0.7, pace: float = 0.0) -> list[str]:
    """One fairness row: the flood paced at `share` of the calibrated rate, or at `pace` bytes/s when given.

    Unloaded and loaded pings alternate (`ROUNDS` times n/ROUNDS each, the flood stopped with SIGSTOP in
    between and the proxy let settle), so that the machine's own noise, which drifts over seconds on a
    small VM, weighs on both sides of the ratio alike instead of on whichever ran in the noisier second.
    """
    proxy = Proxy(upstream, record, tmp, decode, ping_upstream=ping_upstream)
    target = pace or REFERENCE["max_rate"] * share
    per = max(1, n // ROUNDS)
    alone: list[float] = []
    loaded: list[float] = []
    active = busy = 0.0
    pinger = Pinger(proxy.ping_port)
    f = subprocess.Popen([sys.executable, __file__, "--role", "flood", str(proxy.port), "0", str(target)],
                         stdout=subprocess.PIPE, text=True)
    try:
        while state(f.pid) != "T":  # connected, stopped itself (SIGSTOP) until its first phase
            time.sleep(0.01)
        for _ in range(ROUNDS):
            alone += pinger.run(per)
            c0, t0 = cpu_s(proxy.proc.pid), time.monotonic()
            os.kill(f.pid, signal.SIGCONT)
            time.sleep(0.3)  # let the flood get going (a bench, not a test)
            loaded += pinger.run(per)
            os.kill(f.pid, signal.SIGSTOP)
            busy += cpu_s(proxy.proc.pid) - c0
            active += time.monotonic() - t0
            settle(proxy.proc.pid)
        os.kill(f.pid, signal.SIGTERM)
        os.kill(f.pid, signal.SIGCONT)
        out, _ = f.communicate(timeout=30)
        rate = float(out.strip() or 0) / active / 1e6
        pinger.close()
        m = proxy.metrics()
    finally:
        if f.poll() is None:
            f.kill()
        if pinger.proc.poll() is None:
            pinger.proc.kill()
        proxy.stop()
    ratio = pct(loaded, 0.99) / pct(alone, 0.99)
    mode = f"recording {'on' if record else 'off'}" if decode else "--no-decode (reference)"
    if pace:
        mode += f", flood the decoder keeps up with ({pace / 1e6:.1f} MB/s)"
    ok = " ✓" if ratio <= 2 else " ✗"
    return [f"fairness, {mode}",
            f"ping p50 {pct(alone, .5):.2f} → {pct(loaded, .5):.2f} ms, p99 {pct(alone, .99):.2f} → "
            f"{pct(loaded, .99):.2f} ms (×{ratio:.2f}); flood relayed {rate:.0f} of {target / 1e6:.0f} MB/s paced, "
            f"proxy CPU {busy / active:.0%}; "
            f"decode skipped {metric(m, 'kafkatap_observation_skipped_bytes_total') / 1e6:.0f} MB",
            "p99 ≤ 2× unloaded" + ok]


def memory(upstream: int, tmp: Path) -> list[list[str]]:
    rows = []
    proxy = Proxy(upstream, False, tmp)
    try:
        base = proxy.rss_mib()
        rows.append(["RSS at start", f"{base:.0f} MiB", ""])

        def one(label: str, payload: bytes, bound: str, pace: int = 0) -> None:
            send_and_close(proxy, payload, pace=pace)
            lines = len(proxy.metrics().splitlines())
            rows.append([label, f"{proxy.rss_mib():.0f} MiB after close (/metrics {lines} lines)", bound])

        # versions past every schema (so no body is walked) and unknown api keys: what a fuzzer sends
        versions = b"".join(req(i % 1000, key=i % 70 + 1000 * (i % 3 == 0), ver=100 + i % 30_000)
                            for i in range(1_000_000))
        one("1 M frames, varying api key/version", versions,
            "caches ≤ schema (api, version) pairs; ≤ 256 label sets per family, /metrics < ~5k lines", pace=3_000)
        tag_len = 1 << 20
        tag = b"\x01\x00" + bytes([0x80 | (tag_len & 0x7F), 0x80 | ((tag_len >> 7) & 0x7F), tag_len >> 14]) + b"x" * tag_len
        body = struct.pack(">hhih", 3, 12, 9, 1) + b"c" + tag + b"\x00" * 8
        one("header with 1 MiB of tagged fields", struct.pack(">i", len(body)) + body,
            "header ≤ 64 KiB buffered, then opaque (oversize_header)")
        # pipelined faster than answered: the decoder's in-flight map at its cap
        big = b"".join(req(i, key=3, ver=1) for i in range(200_000))
        one("200 k pipelined requests", big, "in flight ≤ 10,000 (~9 MiB) + backlog ≤ 16 MiB per connection")
    finally:
        proxy.stop()
    return rows


def accounting(upstream: int, tmp: Path) -> list[str]:
    proxy = Proxy(upstream, True, tmp)
    n = 50_000
    try:
        payload = b"".join(req(i % 20_000) for i in range(n))  # ids reused while in flight
        send_and_close(proxy, payload)
        time.sleep(1.0)  # one flush interval and more: rows reach the Parquet files
        m = proxy.metrics()
    finally:
        proxy.stop()
    seen = metric(m, "kafkatap_requests_seen_total")
    rows = metric(m, "kafkatap_request_rows_total")
    written = metric(m, "kafkatap_recording_rows_written_total", dataset="requests")
    queue_drop = metric(m, "kafkatap_recording_dropped_rows_total", dataset="requests")
    dropped = metric(m, "kafkatap_requests_dropped_total")
    reasons = {r: metric(m, "kafkatap_requests_dropped_total", reason=r)
               for r in ("in_flight_cap", "correlation_id_reused", "decoder_failed", "observation_backlog")}
    ok = n == seen == rows + dropped and written + queue_drop <= rows
    return ["accounting", f"sent {n}, seen {seen:.0f} = rows {rows:.0f} (written {written:.0f}, queue-dropped "
            f"{queue_drop:.0f}) + dropped {dropped:.0f} {({k: int(v) for k, v in reasons.items() if v})}",
            "sent == rows + dropped" + (" ✓" if ok else " ✗")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", nargs="*")
    ap.add_argument("--pings", type=int, default=5000)
    ap.add_argument("--flood-share", type=float, default=0.7,
                    help="flood pace as a share of the calibrated unpaced rate through the --no-decode proxy")
    ap.add_argument("--decodable-mbps", type=float, default=1.0,
                    help="a second flood pace (MB/s of 15-byte frames) slow enough for the decoder to keep up, "
                         "so that the ping competes with decoding work rather than with a connection gone opaque")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the proxy to CPU 0 and the rest elsewhere")
    ap.add_argument("--only-fairness", action="store_true", help="skip the memory and accounting probes")
    args = ap.parse_args()
    if args.role:
        role, *rest = args.role
        if role == "responder":
            responder(rest[0], rt=len(rest) > 1 and rest[1] == "rt")
        elif role == "pinger":
            pinger(int(rest[0]))
        elif role == "flood":
            flood(int(rest[0]), float(rest[1]), float(rest[2]) if len(rest) > 2 else 0.0)
        return
    if not args.no_pin:
        pin({min(os.sched_getaffinity(0))})
    tmp = Path(tempfile.mkdtemp(prefix="kt-hostile-"))
    port_file, ping_file = tmp / "port", tmp / "ping-port"
    ups = [subprocess.Popen([sys.executable, __file__, "--role", "responder", str(port_file)]),
           subprocess.Popen([sys.executable, __file__, "--role", "responder", str(ping_file), "rt"])]
    try:
        for f in (port_file, ping_file):
            while not f.exists() or not f.read_text():
                time.sleep(0.05)
        upstream, ping_up = int(port_file.read_text()), int(ping_file.read_text())
        share, n, decodable = args.flood_share, args.pings, args.decodable_mbps * 1e6
        table = [calibrate(upstream, tmp),
                 fairness(upstream, ping_up, False, tmp, n, decode=False, share=share),
                 fairness(upstream, ping_up, False, tmp, n, share=share),
                 fairness(upstream, ping_up, True, tmp, n, share=share),
                 fairness(upstream, ping_up, False, tmp, n, pace=decodable),
                 fairness(upstream, ping_up, True, tmp, n, pace=decodable)]
        if not args.only_fairness:
            table += [*memory(upstream, tmp), accounting(upstream, tmp)]
    finally:
        for up in ups:
            up.kill()
            up.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    w = [max(len(r[i]) for r in table) for i in range(3)]
    print(f"{'probe':<{w[0]}} | {'result':<{w[1]}} | bound")
    print(f"{'-' * w[0]}-|-{'-' * w[1]}-|-{'-' * w[2]}")
    for r in table:
        print(f"{r[0]:<{w[0]}} | {r[1]:<{w[1]}} | {r[2]}")
    where = (f"proxy pinned to CPU {sorted(PROXY_CPUS)}, bench/flood/responders/pinger on "
             f"{sorted(os.sched_getaffinity(0))} (pinger and its responder SCHED_FIFO)"
             if PROXY_CPUS else "not pinned")
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), cpus {os.cpu_count()}; {where}")


if __name__ == "__main__":
    main()
