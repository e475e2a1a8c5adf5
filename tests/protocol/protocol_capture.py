"""Real traffic for protocol tests: a loopback packet capture and a tiny TCP tee.

Why a packet capture: Kafka clients bootstrap through one address and then
connect to the *advertised* broker address, so a tee in front of the bootstrap
port only sees the first connection. `dumpcap` on `lo` with a port filter sees
every connection to the broker, with the real segment boundaries; the same
pcap is then handed to tshark's Kafka dissector as an independent oracle.
The `Tee` relays one client↔broker connection and keeps both byte streams
exactly as `recv()` returned them (the chunking the proxy will see).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Segment:
    to_broker: bool
    payload: bytes
    ts_ns: int


@dataclass
class Conn:
    """One TCP connection: its segments in capture order and both byte streams."""

    stream: int
    client_port: int
    segments: list[Segment] = field(default_factory=list)

    def bytes(self, to_broker: bool) -> bytes:
        return b"".join(s.payload for s in self.segments if s.to_broker == to_broker)


class Capture:
    """`dumpcap -i lo -f 'tcp port N'` into a pcap file, as a context manager."""

    def __init__(self, port: int, path: Path) -> None:
        self.port = port
        self.path = path
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "Capture":
        self.proc = subprocess.Popen(
            ["dumpcap", "-q", "-i", "lo", "-B", "64", "-s", "0", "-f", f"tcp port {self.port}", "-w", str(self.path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # dumpcap creates the file once it captures
            if self.path.exists() and self.path.stat().st_size > 0:
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"dumpcap failed: {self.proc.stderr.read().decode() if self.proc.stderr else ''}")
            time.sleep(0.05)
        time.sleep(0.3)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            time.sleep(0.5)  # let the last segments reach the ring buffer
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def connections(pcap: Path, port: int) -> list[Conn]:
    """Reassemble every TCP connection to `port`: dedupe retransmits, reorder, and fail on a real gap.

    On a 2-CPU loopback a segment can be captured after the one that follows
    it; such a segment is held until the gap before it is filled. Bytes still
    missing at the end of the capture are a real loss and fail the test.
    """
    out = subprocess.run(
        ["tshark", "-r", str(pcap), "-Y", "tcp.len > 0", "-T", "fields", "-E", "separator=\t",
         "-o", "tcp.desegment_tcp_streams:FALSE",
         "-e", "tcp.stream", "-e", "tcp.srcport", "-e", "tcp.dstport", "-e", "tcp.seq_raw", "-e", "tcp.payload",
         "-e", "frame.time_epoch"],
        capture_output=True, text=True, check=True,
    ).stdout
    conns: dict[int, Conn] = {}
    next_seq: dict[tuple[int, bool], int] = {}
    held: dict[tuple[int, bool], dict[int, tuple[bytes, int]]] = defaultdict(dict)

    def take(conn: Conn, key: tuple[int, bool], seq: int, data: bytes, ts_ns: int) -> None:
        expect = next_seq.get(key)
        if expect is not None and seq != expect:
            if seq > expect:  # captured ahead of a segment still to come
                held[key][seq] = (data, ts_ns)
                return
            skip = expect - seq  # retransmission of bytes we have
            if skip >= len(data):
                return
            data, seq = data[skip:], expect
        next_seq[key] = seq + len(data)
        conn.segments.append(Segment(key[1], data, ts_ns))
        waiting = held[key]
        while waiting and min(waiting) <= next_seq[key]:  # the gap before held segments is now filled
            first = min(waiting)
            take(conn, key, first, *waiting.pop(first))

    for line in out.splitlines():
        stream_s, sport, dport, seq_s, payload_hex, ts = line.split("\t")
        to_broker = int(dport) == port
        stream = int(stream_s)
        conn = conns.setdefault(stream, Conn(stream, int(sport) if to_broker else int(dport)))
        take(conn, (stream, to_broker), int(seq_s), bytes.fromhex(payload_hex.replace(":", "")), int(float(ts) * 1e9))
    for key, waiting in held.items():
        if waiting:
            raise AssertionError(f"capture lost {min(waiting) - next_seq[key]} bytes in stream {key[0]}")
    return [conns[k] for k in sorted(conns)]


def tshark_requests(pcap: Path, port: int) -> dict[int, list[tuple[int, int, int, str]]]:
    """tshark's Kafka dissector: per TCP stream, (api_key, api_version, correlation_id, client_id) of each request."""
    out = subprocess.run(
        ["tshark", "-r", str(pcap), "-d", f"tcp.port=={port},kafka", "-Y", f"kafka && tcp.dstport=={port}",
         "-T", "fields", "-E", "separator=\t", "-E", "occurrence=a", "-E", "aggregator=|",
         "-e", "tcp.stream", "-e", "kafka.request_key", "-e", "kafka.api_version",
         "-e", "kafka.correlation_id", "-e", "kafka.client_id"],
        capture_output=True, text=True, check=True,
    ).stdout
    found: dict[int, list[tuple[int, int, int, str]]] = defaultdict(list)
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) < 4 or not parts[1]:
            continue
        keys, vers, cids = parts[1].split("|"), parts[2].split("|"), parts[3].split("|")
        clients = parts[4].split("|") if len(parts) > 4 and parts[4] else [""] * len(keys)
        for i in range(len(keys)):
            if i < len(vers) and i < len(cids) and vers[i] and cids[i]:
                found[int(parts[0])].append(
                    (int(keys[i]), int(vers[i]), int(cids[i]), clients[i] if i < len(clients) else ""))
    return dict(found)


class Tee:
    """A threaded loopback relay for one or more connections, recording recv() chunks per connection."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.sessions: list[list[tuple[bool, bytes, int]]] = []  # (to_broker, chunk, ns)
        self._lock = threading.Lock()
        self._stop = False
        self._pumps: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            broker = socket.create_connection(self.upstream)
            log: list[tuple[bool, bytes, int]] = []
            with self._lock:
                self.sessions.append(log)
                self._socks += [client, broker]
                for src, dst, to_broker in ((client, broker, True), (broker, client, False)):
                    pump = threading.Thread(target=self._pump, args=(src, dst, to_broker, log), daemon=True)
                    self._pumps.append(pump)
                    pump.start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_broker: bool, log: list[tuple[bool, bytes, int]]) -> None:
        while True:
            try:
                chunk = src.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            with self._lock:
                log.append((to_broker, chunk, time.monotonic_ns()))
            try:
                dst.sendall(chunk)
            except OSError:
                return

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting, wait until every relayed connection has ended both ways, then close the sockets.

        Why wait: the sessions are read after this; a pump still relaying would add chunks then.
        """
        self._stop = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); a close alone does not, on Linux
        except OSError:
            pass
        self.sock.close()
        self._acceptor.join(timeout)
        with self._lock:
            pumps = list(self._pumps)
        for pump in pumps:
            pump.join(timeout)
        assert not [t for t in pumps if t.is_alive()], "a relayed connection did not end"
        for sock in self._socks:
            sock.close()


def have_capture_tools() -> bool:
    return os.geteuid() == 0 and all(
        subprocess.run(["which", t], capture_output=True).returncode == 0 for t in ("dumpcap", "tshark"))


def tshark_request_topics(pcap: Path, port: int) -> dict[tuple[int, int], set[str] | None]:
    """tshark's topic names per (tcp stream, correlation id), for packets that carry one request only.

    A packet with several requests aggregates their fields, which cannot be
    told apart: those are left out. None when tshark says it did not decode the
    body ("Unsupported <api> version", "Unknown <n> API key", a malformed
    packet: it then reads garbage where a newer version's fields are), an
    empty set when the request names no topic.
    """
    out = subprocess.run(
        ["tshark", "-r", str(pcap), "-d", f"tcp.port=={port},kafka", "-Y", f"kafka && tcp.dstport=={port}",
         "-T", "fields", "-E", "separator=\t", "-E", "occurrence=a", "-E", "aggregator=|",
         "-e", "tcp.stream", "-e", "kafka.correlation_id", "-e", "_ws.expert.message", "-e", "kafka.topic_name"],
        capture_output=True, text=True, check=True,
    ).stdout
    found: dict[tuple[int, int], set[str] | None] = {}
    for line in out.splitlines():
        parts = line.split("\t") + ["", ""]
        if not parts[1] or "|" in parts[1]:
            continue
        undecoded = any(w in parts[2] for w in ("Unsupported", "Unknown", "Malformed", "does not end"))
        found[(int(parts[0]), int(parts[1]))] = None if undecoded else {n for n in parts[3].split("|") if n}
    return found


@dataclass
class OracleReport:
    """What comparing kafkatap's decode with tshark's on one capture found."""

    requests: int = 0  # requests kafkatap decoded on the captured connections
    headers_compared: int = 0  # (api key, version, correlation id, client id) tshark decoded, all equal to ours
    topics_compared: int = 0  # requests whose topic names tshark decoded, all equal to ours
    undecoded: set[tuple[str, int]] = field(default_factory=set)  # (api, version) whose body tshark cannot dissect
    mismatches: list[str] = field(default_factory=list)


def tshark_oracle(pcap: Path, port: int) -> OracleReport:
    """kafkatap's decode of every captured connection to `port` against tshark's Kafka dissector.

    Headers: every request tshark dissects must be one kafkatap saw, with the
    same api key, version, correlation id and client id. Topics: where tshark
    names a request's topics, kafkatap's summary must name the same ones
    (requests that name topics by id — Produce v13, Fetch v13+ — have no name
    on the wire). Bodies tshark says it cannot dissect (versions newer than
    its dissector) are listed, not compared.
    """
    from protocol.events import RequestSeen
    from protocol.stream import KafkaStream

    rep = OracleReport()
    ours: dict[int, list[tuple[int, int, int, str]]] = {}
    topics: dict[tuple[int, int], tuple[str, int, list[str]]] = {}
    for conn in connections(pcap, port):
        s = KafkaStream()
        for seg in conn.segments:
            (s.receive_request_data if seg.to_broker else s.receive_response_data)(seg.payload, seg.ts_ns)
        s.close(0)
        seen = ours.setdefault(conn.stream, [])
        for ev in s.events():
            if isinstance(ev, RequestSeen):
                rep.requests += 1
                seen.append((ev.api_key, ev.api_version, ev.correlation_id, ev.client_id or ""))
                if ev.summary is not None:
                    topics[(conn.stream, ev.correlation_id)] = (ev.api_name, ev.api_version, ev.summary.topics)
    for stream, tuples in tshark_requests(pcap, port).items():
        for t in tuples:
            if t in ours.get(stream, []):
                rep.headers_compared += 1
            else:
                rep.mismatches.append(f"stream {stream}: tshark saw request {t}, kafkatap did not")
    for key, names in tshark_request_topics(pcap, port).items():
        if key not in topics:
            continue
        api, ver, mine = topics[key]
        mine_names = {t for t in mine if not _is_uuid(t)}
        if names is None:
            rep.undecoded.add((api, ver))
        elif names or mine_names:
            rep.topics_compared += 1
            if names != mine_names:
                rep.mismatches.append(f"{api} v{ver} cid {key[1]}: tshark topics {sorted(names)}, kafkatap {sorted(mine_names)}")
    return rep


def _is_uuid(text: str) -> bool:
    return len(text) == 36 and text.count("-") == 4
