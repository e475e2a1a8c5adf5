"""`kafkatap proxy --workers N`: several processes on one address, one status endpoint, no row lost.

The proxy runs as the real command (a subprocess), in front of the real broker of
`proxied_kafka`, with kafka-python clients; the workers' own log lines (JSON on stderr)
say who listens, who died and what each one counted when it stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient

from harness import netns
from harness.kafka import free_port
from proxy.cluster import ClusterStats
from proxy.live import parse_metrics
from proxy.metrics import LiveStats, merge_clients, merge_prometheus
from recording.layout import worker_proxy_id
from proxy_procs import ECHO_SERVER
from recording.reader import read_recording

KAFKATAP = [sys.executable, "-m", "kafkatap.cli", "--log-format", "json"]
PROXY_ID = "wtest"


class ProxyProcess:
    """`kafkatap proxy` as a subprocess whose JSON log lines a test can wait for."""

    def __init__(self, args: list[str], popen: Callable[..., subprocess.Popen] = subprocess.Popen) -> None:
        self.proc = popen([*KAFKATAP, "proxy", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cv:
                self.raw.append(line)
                try:
                    self.lines.append(json.loads(line))
                except ValueError:
                    pass
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def events(self, name: str) -> list[dict[str, Any]]:
        with self._cv:
            return [ln for ln in self.lines if ln.get("event") == name]

    def wait_for(self, pred: Callable[[], Any], what: str, timeout: float = 90.0) -> None:
        with self._cv:
            ok = self._cv.wait_for(lambda: pred() or self.proc.poll() is not None and not self._reader.is_alive(),
                                   timeout)
            if not ok or not pred():
                tail = "".join(self.raw[-30:])
                raise AssertionError(f"{what}: not within {timeout} s (exit {self.proc.poll()}); log tail:\n{tail}")

    def wait_event(self, name: str, count: int = 1, timeout: float = 90.0) -> list[dict[str, Any]]:
        self.wait_for(lambda: len(self.events(name)) >= count, f"{count} x {name!r}", timeout)
        return self.events(name)

    def terminate(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture
def start_proxy(proxied_kafka) -> Iterator[Callable[..., ProxyProcess]]:  # noqa: ANN001
    started: list[ProxyProcess] = []

    def start(*extra: str, workers: int = 2) -> ProxyProcess:
        p = ProxyProcess(["--route", proxied_kafka.route, "--workers", str(workers), "--proxy-id", PROXY_ID, *extra])
        started.append(p)
        p.wait_event("workers running")
        return p

    yield start
    for p in started:
        p.kill()


def _get(addr: str, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as resp:
        return resp.read()


def _produce(bootstrap: str, topic: str, producers: int, messages: int) -> None:
    """`producers` kafka-python producers (two connections each: bootstrap and broker), `messages` acked sends each."""

    def one(i: int) -> None:
        prod = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=0, client_id=f"worker-test-{i}")
        try:
            for n in range(messages):
                prod.send(topic, f"{i}-{n}".encode()).get(timeout=30)
        finally:
            prod.close(timeout=10)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


def _rows_by_worker(record: Path) -> Counter:
    table = read_recording(record, "requests")
    return Counter(table.column("proxy").to_pylist())


def _produced(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> float:
    """Produce requests the merged /metrics counts."""
    return sum(v for labels, v in metrics.get("kafkatap_requests_total", []) if labels["api"] == "Produce")


def _open(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> float:
    """Client connections the merged /metrics counts as open."""
    return sum(v for _, v in metrics.get("kafkatap_open_connections", []))


def _scrape_until(status: str, done: Callable[[dict[str, list[tuple[dict[str, str], float]]]], bool],
                  timeout: float = 60.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The merged /metrics, scraped until `done(metrics)` holds (an awaited condition), or the last one at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = parse_metrics(_get(status, "/metrics").decode())
        if done(metrics) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.05)


def test_connections_spread_over_workers_and_status_is_merged(start_proxy, proxied_kafka, topic_name, tmp_path):
    status = f"127.0.0.1:{free_port()}"
    record = tmp_path / "rec"
    p = start_proxy("--status-addr", status, "--record", str(record))
    listening = p.events("worker listening")
    assert sorted(ev["worker"] for ev in listening) == [worker_proxy_id(PROXY_ID, 1), worker_proxy_id(PROXY_ID, 2)]
    assert len({ev["pid"] for ev in listening}) == 2

    _produce(proxied_kafka.listen, topic_name, producers=8, messages=20)
    # Every answer reached its producer and every producer closed; a connection is counted closed after its last
    # row, so with none open every request is decoded (decoding may wait for its batch: proxy.observer, lingering).
    metrics = _scrape_until(status, lambda m: _produced(m) >= 8 * 20 and _open(m) == 0)

    clients = json.loads(_get(status, "/clients"))
    assert clients["proxy_id"] == PROXY_ID and clients["workers"] == 2 and clients["workers_unreachable"] == 0
    per_worker = Counter(c["worker"] for c in clients["clients"])
    assert len(clients["clients"]) >= 16, per_worker  # 8 producers x (bootstrap + broker connection)
    assert len(per_worker) == 2 and min(per_worker.values()) >= 1, per_worker  # the kernel spread them

    assert {labels["proxy"] for samples in metrics.values() for labels, _ in samples} == {PROXY_ID}
    assert metrics["kafkatap_workers"][0][1] == 2 and metrics["kafkatap_workers_running"][0][1] == 2
    produce = _produced(metrics)
    assert produce >= 8 * 20
    # the merged histogram counts every answered Produce once, whichever worker relayed it
    hist = [name for name in metrics if name.startswith("kafkatap_request_latency") and name.endswith("_count")]
    assert hist, sorted(metrics)
    counted = sum(v for labels, v in metrics[hist[0]] if labels["api"] == "Produce")
    assert counted == produce
    total_requests = sum(v for _, v in metrics["kafkatap_requests_total"])
    top = subprocess.run([*KAFKATAP, "top", "--addr", status, "--once"], capture_output=True, text=True, timeout=60)
    assert top.returncode == 0, top.stderr
    assert f"proxy {PROXY_ID}" in top.stdout and "worker-test-" in top.stdout  # one view of every worker's clients
    # and, per worker, the spread the merge hides: requests decoded by each add up to the whole
    by_worker = {labels["worker"]: v for labels, v in metrics["kafkatap_worker_requests_total"]}
    assert set(by_worker) == {worker_proxy_id(PROXY_ID, 1), worker_proxy_id(PROXY_ID, 2)}
    assert sum(by_worker.values()) == total_requests and min(by_worker.values()) > 0, by_worker
    assert len(metrics["kafkatap_worker_open_connections"]) == 2 and "(per worker " in top.stdout, top.stdout

    assert p.terminate() == 0
    rows = _rows_by_worker(record)
    # each worker wrote its own partition, and together they hold exactly what /metrics counted
    assert set(rows) == {worker_proxy_id(PROXY_ID, 1), worker_proxy_id(PROXY_ID, 2)}, rows
    assert sum(rows.values()) == total_requests
    table = read_recording(record, "requests")
    assert pc.sum(pc.equal(table.column("api_name"), "Produce")).as_py() == produce


def test_sigterm_under_load_stops_every_worker_without_losing_rows(start_proxy, proxied_kafka, topic_name, tmp_path):
    status = f"127.0.0.1:{free_port()}"
    record = tmp_path / "rec"
    p = start_proxy("--status-addr", status, "--record", str(record), "--shutdown-timeout", "5")
    stop = threading.Event()
    errors: list[BaseException] = []

    def load(i: int) -> None:
        prod = KafkaProducer(bootstrap_servers=proxied_kafka.listen, acks=1, linger_ms=0, retries=0,
                             client_id=f"load-{i}", max_block_ms=2000, reconnect_backoff_max_ms=200)
        try:
            while not stop.is_set():
                futs = [prod.send(topic_name, b"x" * 100) for _ in range(50)]
                for f in futs:
                    try:
                        f.get(timeout=10)
                    except Exception:  # noqa: BLE001 — the proxy stopping under us is the point
                        if not stop.is_set():
                            raise
        except Exception as exc:  # noqa: BLE001
            if not stop.is_set():
                errors.append(exc)
        finally:
            try:
                prod.close(timeout=0)  # records still queued for a stopped proxy: kafka-python raises on them
            except Exception:  # noqa: BLE001 — the load's end, not what the test checks
                pass

    threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    produced = _produced(_scrape_until(status, lambda m: _produced(m) >= 500))  # the load, on both workers' rows
    assert produced >= 500 and not errors, errors

    code = p.terminate()  # while the producers keep sending
    stop.set()
    for t in threads:
        t.join(30)
    assert code == 0, "".join(p.raw[-20:])

    stopped = {ev["worker"]: ev for ev in p.events("stopped")}
    assert set(stopped) == {worker_proxy_id(PROXY_ID, 1), worker_proxy_id(PROXY_ID, 2)}, p.events("stopped")
    rows = _rows_by_worker(record)
    for worker, ev in stopped.items():
        dropped = sum(ev["requests_dropped"].values())
        # every request a worker forwarded is a row on disk, or a drop it counted
        assert ev["requests_seen"] == ev["request_rows"] + dropped, ev
        assert rows[worker] == ev["request_rows"], (worker, rows, ev)
        assert ev["request_rows"] > 0
    assert sum(rows.values()) >= produced


def test_a_dead_worker_is_logged_and_restarted(start_proxy, proxied_kafka, tmp_path):
    status = f"127.0.0.1:{free_port()}"
    p = start_proxy("--status-addr", status)
    victim = p.events("worker listening")[0]
    os.kill(victim["pid"], signal.SIGKILL)
    died = p.wait_event("worker died: restarting it; its open connections were lost")[0]
    assert died["worker"] == victim["worker"] and died["status"] == "signal SIGKILL"
    again = p.wait_event("worker listening", count=3)[-1]
    assert again["worker"] == victim["worker"] and again["pid"] != victim["pid"]

    admin = KafkaAdminClient(bootstrap_servers=proxied_kafka.listen, request_timeout_ms=10000)
    try:
        assert admin.describe_cluster()["brokers"]  # the proxy still serves
    finally:
        admin.close()
    metrics = parse_metrics(_get(status, "/metrics").decode())
    assert metrics["kafkatap_worker_restarts_total"][0][1] == 1
    assert metrics["kafkatap_workers_running"][0][1] == 2
    assert p.terminate() == 0


def test_workers_name_the_cluster_of_a_sasl_listener(rec_broker, topic_name, tmp_path):
    """The proxy's own Metadata query is refused on a SASL listener; the clients' relayed answers still name the
    cluster, in the partition of each worker that relayed one (`kafkatap replay` reads them all)."""
    record = tmp_path / "rec"
    p = ProxyProcess(["--route", rec_broker.sasl_route, "--workers", "2", "--proxy-id", PROXY_ID,
                      "--record", str(record), "--capture", "requests"])
    try:
        p.wait_event("workers running")
        prod = KafkaProducer(bootstrap_servers=f"127.0.0.1:{rec_broker.sasl_proxy_port}", acks=1, linger_ms=0,
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                             sasl_plain_username=rec_broker.sasl_user, sasl_plain_password=rec_broker.sasl_password)
        try:
            for n in range(20):
                prod.send(topic_name, b"%d" % n).get(timeout=30)
        finally:
            prod.close(timeout=10)
        assert p.terminate() == 0
    finally:
        p.kill()
    own = [r for r in read_recording(record, "topics").to_pylist() if r["topic_id"] is None]
    assert {(r["broker_addr"], r["cluster_id"]) for r in own} == {(rec_broker.sasl_upstream, rec_broker.kafka.cluster_id)}
    workers = [r["proxy"] for r in own]
    assert len(workers) == len(set(workers)) and set(workers) <= {worker_proxy_id(PROXY_ID, 1), worker_proxy_id(PROXY_ID, 2)}


def test_a_worker_that_cannot_start_stops_the_proxy(proxied_kafka, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")  # the workers' recorders cannot create a directory below it
    p = ProxyProcess(["--route", proxied_kafka.route, "--workers", "2", "--record", str(a_file / "rec")])
    assert p.proc.wait(120) == 2
    p._reader.join(10)
    # the cause once for the proxy (both workers meet it), then the parent's line; no "worker did not start … still
    # starting" of workers that had exited 2
    assert [ln.get("event") for ln in p.lines if ln.get("level") == "error"] == [
        "cannot set up recording", "the proxy did not start"]


def test_merge_sums_counters_and_histograms_bucket_wise_and_concatenates_clients():
    a, b = LiveStats("p-w1"), LiveStats("p-w2")
    for stats, conn, latencies in ((a, "c1", (40, 300, 7000)), (b, "c2", (60, 300))):
        for lat in latencies:
            stats.request({"api_name": "Produce", "api_key": 0, "api_version": 9, "latency_us": lat,
                           "broker_addr": "b:9092", "conn_id": conn, "request_bytes": 10})
    b.request({"api_name": "Fetch", "api_key": 1, "api_version": 12, "conn_id": "c2", "broker_addr": "b:9092"})
    merged = parse_metrics(merge_prometheus([a.render_prometheus(), b.render_prometheus()], "p"))
    assert {labels["proxy"] for s in merged.values() for labels, _ in s} == {"p"}
    by_api = {labels["api"]: v for labels, v in merged["kafkatap_requests_total"]}
    assert by_api == {"Produce": 5, "Fetch": 1}
    hist = next(n for n in merged if n.startswith("kafkatap_request_latency") and n.endswith("_bucket"))
    buckets = {labels["le"]: v for labels, v in merged[hist]}
    singles = [parse_metrics(s.render_prometheus())[hist] for s in (a, b)]
    for le, v in buckets.items():  # cumulative counts of equal bounds add up
        assert v == sum(val for samples in singles for labels, val in samples if labels["le"] == le)
    assert buckets["+Inf"] == 5
    assert merged["kafkatap_start_time_seconds"][0][1] == min(a.started_ns, b.started_ns) / 1e9
    assert merged["kafkatap_open_connections"][0][1] == 2  # gauges are summed
    for stats in (a, b):  # ... except what every worker sees of the same cluster: each discovers all of it
        stats.cluster_stats = ClusterStats(brokers_seen=3, brokers_unlistened=1)
    merged = parse_metrics(merge_prometheus([a.render_prometheus(), b.render_prometheus()], "p"))
    assert merged["kafkatap_cluster_brokers"][0][1] == 2 and merged["kafkatap_cluster_brokers_unlistened"][0][1] == 1
    clients = merge_clients([a.clients_json(), b.clients_json()], "p")
    assert clients["open_connections"] == 2
    assert sorted((c["conn_id"], c["worker"]) for c in clients["clients"]) == [("c1", "p-w1"), ("c2", "p-w2")]




@pytest.mark.netns
def test_transparent_mode_workers_each_take_the_original_destination():
    """A gateway (`kafkatap iptables --mode gateway`) in front of a server: every worker answers redirected
    connections with their SO_ORIGINAL_DST, and sets the default SO_MARK on its upstream sockets.

    The client holds its 16 connections open, so the workers balance them (proxy.balance): a
    connection passed to the other worker keeps its original destination, and each serves 8."""
    with netns.Topology() as topo:
        client, gw, server = topo.host("cw"), topo.host("gw"), topo.host("sw")
        topo.link(client, "10.77.51.1/24", gw, "10.77.51.2/24")
        topo.link(gw, "10.77.52.1/24", server, "10.77.52.2/24")
        topo.enable_forwarding(gw)
        topo.route(client, "10.77.52.0/24", "10.77.51.2")
        topo.route(server, "10.77.51.0/24", "10.77.52.1")
        echo = server.popen([sys.executable, "-c", ECHO_SERVER, "10.77.52.2", "7000"], stdout=subprocess.PIPE, text=True)
        assert echo.stdout.readline().strip() == "ready"
        gw.run(KAFKATAP + ["iptables", "--mode", "gateway", "--port", "7000", "--no-ipv6", "--apply"])
        p = ProxyProcess(["--transparent", "--listen", "0.0.0.0:15092", "--workers", "2", "--proxy-id", PROXY_ID],
                         popen=gw.popen)
        try:
            p.wait_event("workers running")
            script = ("import socket\n"
                      "held = []\n"
                      "for i in range(16):\n"
                      "    s = socket.create_connection(('10.77.52.2', 7000), timeout=10)\n"
                      "    s.sendall(b'w%d' % i); assert s.recv(10) == b'w%d' % i; held.append(s)\n"
                      "for s in held:\n"
                      "    s.close()\n")
            out = client.run([sys.executable, "-c", script], check=False)
            assert out.returncode == 0, out.stderr
            closed = p.wait_event("connection closed", count=16)
            assert p.terminate() == 0
        finally:
            p.kill()
    opened = p.events("connection opened")
    assert len(opened) == 16 and all(ev["mode"] == "transparent" for ev in opened), opened
    assert {ev["original_dst"] for ev in opened} == {"10.77.52.2:7000"}
    spread = Counter(ev["worker"] for ev in opened)
    assert sorted(spread.values()) == [8, 8], spread  # balanced, whatever the kernel's hash chose
    assert all(ev["end_reason"] != "upstream_connect_failed" for ev in closed)


def test_workers_never_touch_each_others_partitions(tmp_path):
    """Start-up recovery of worker 1 leaves worker 2's in-progress and flush files alone, whatever their state."""
    from recording.layout import flush_name, merged_name, partition_dir, recover

    w1, w2 = worker_proxy_id(PROXY_ID, 1), worker_proxy_id(PROXY_ID, 2)
    assert w1 != w2 and w1.startswith(PROXY_ID)
    theirs = partition_dir(tmp_path, "requests", w2, 490_000)
    theirs.mkdir(parents=True)
    files = [theirs / ".tmp-999999-00000000-part-x.parquet",  # a dead writer's leftover, in worker 2's directory
             theirs / flush_name("20260101T000000Z-ab12", 1), theirs / merged_name("20260101T000000Z-ab12", 1, 1)]
    for f in files:
        f.write_bytes(b"")
    assert recover(tmp_path, w1) == 0
    assert all(f.exists() for f in files)
    assert recover(tmp_path, w2) == 2  # its own recovery does clean them (leftover + superseded flush file)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_second_ctrl_c_closes_at_once_and_a_first_one_waits(tmp_path, workers: int) -> None:
    """Ctrl-C reaches the whole process group. The first waits for answers in flight (up to
    --shutdown-timeout, 60 s here); a second one closes at once (it only set the same stop flag again)."""
    import json
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from harness.kafka import free_port
    from tests.proxy.proxy_procs import wait_listening

    held = socket.create_server(("127.0.0.1", 0))  # a broker that takes requests and never answers
    upstream = held.getsockname()[1]
    port = free_port()
    env = dict(os.environ, KAFKATAP_LOG_FORMAT="json")
    proc = subprocess.Popen([sys.executable, "-m", "kafkatap.cli", "proxy", "--workers", str(workers), "--listen",
                             f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{upstream}", "--shutdown-timeout", "60"],
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    clients, brokers = [], []
    request = b"\x00\x00\x00\x15\x00\x12\x00\x03\x00\x00\x00\x01\x00\x03abc" + bytes(8)  # ApiVersions
    try:
        wait_listening(port, proc)
        held.settimeout(20)
        for _ in range(4):  # with two workers, requests held on both
            c = socket.create_connection(("127.0.0.1", port))
            c.sendall(request)
            clients.append(c)
            while True:  # the request reached the broker: it is in flight in the proxy
                b, _ = held.accept()  # (the proxy's start-up probe of its upstream connects and closes at once)
                b.settimeout(20)
                got = b""
                while len(got) < len(request) and (chunk := b.recv(64)):
                    got += chunk
                brokers.append(b)
                if got == request:
                    break
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(3)  # waiting for the answers
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(20) == 0 and time.monotonic() - t0 < 15
    finally:
        for c in clients + brokers:
            c.close()
        held.close()
        if proc.poll() is None:
            proc.kill()
    lines = [json.loads(ln) for ln in proc.stderr.read().splitlines() if ln.startswith("{")]
    hurried = [ln for ln in lines if ln["event"].startswith("second stop signal")]
    # once per worker that still waited (a worker whose connections all went to the other one had stopped);
    # never on the first Ctrl-C, which the wait above shows
    assert 1 <= len(hurried) <= workers, [ln["event"] for ln in lines]
