"""LiveStats + the status HTTP server: /metrics parses with prometheus_client, /clients JSON shape, `top --once`."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from proxy.live import parse_metrics, render, top
from proxy.metrics import LiveStats
from proxy.sinks import build_sinks
from recording.sample_rows import SessionMix, connection_row


def _feed(sink, n: int = 400) -> list[dict]:
    rows = SessionMix(connections=6).rows(n)
    for row in rows:
        sink.request(row)
    sink.request(dict(rows[0], conn_id="c-admin", client_id="admin-tool", api_key=19, api_name="CreateTopics",
                      api_version=7, errors=[{"code": 36, "name": "TOPIC_ALREADY_EXISTS", "topic": "orders",
                                              "partition": None, "resource": None}], error_count=1))
    sink.request(dict(rows[1], conn_id="c00000", status="no_response", answered=False, latency_us=None,
                      broker_latency_us=None, response_bytes=None))
    sink.connection(connection_row("p1", "c00005", final=True, end_reason="broker_fin", end_by="broker"))
    sink.connection(connection_row("p1", "c-tls", final=True, opaque=True, tls=True, end_reason="client_fin"))
    return rows


class _Loop:
    """An event loop in a thread, like the proxy's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn, *a):
        async def _c():
            return fn(*a)
        return self.run(_c())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple]:
    sinks = build_sinks(tmp_path / "rec", "p1", status_addr="127.0.0.1:0", flush_interval_s=0.1)
    lp = _Loop()
    lp.run(sinks.serve())
    yield sinks.sink, sinks, lp, sinks.status
    lp.run(sinks.stop_serving())
    sinks.sink.close()  # no ProxyServer here: the test is the sink's owner
    lp.stop()


def _get(server, path: str) -> tuple[int, dict, bytes]:
    import http.client

    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, dict(resp.getheaders()), body


def test_metrics_parse_with_prometheus_client(served) -> None:
    sink, _sinks, lp, server = served
    lp.call(_feed, sink)
    status, headers, body = _get(server, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    reqs = {(s.labels["api"], s.labels["version"]): s.value for s in fams["kafkatap_requests"].samples}
    assert sum(reqs.values()) == 402 and reqs[("CreateTopics", "7")] == 1
    errs = [s for s in fams["kafkatap_request_errors"].samples]
    assert errs[0].labels["error"] == "TOPIC_ALREADY_EXISTS"
    lat = fams["kafkatap_request_latency_seconds"]  # Prometheus base units: seconds, not µs
    assert lat.type == "histogram"
    bounds = sorted(float(s.labels["le"]) for s in lat.samples if s.name.endswith("_bucket") and s.labels["le"] != "+Inf")
    assert bounds[0] == 50e-6 and bounds[-1] == 30.0
    sums = [s.value for s in lat.samples if s.name.endswith("_sum")]
    assert all(0 < v < 60 for v in sums), sums  # seconds: a µs sum of 401 requests would be far larger
    counts = [s for s in lat.samples if s.name.endswith("_count")]
    assert sum(s.value for s in counts) == 401  # the acks=0 row has no latency
    assert {"api", "broker"} <= set(counts[0].labels)
    inf = [s for s in lat.samples if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"]
    assert sum(s.value for s in inf) == 401
    assert "kafkatap_broker_latency_seconds" in fams
    assert fams["kafkatap_open_connections"].samples[0].value == 6  # 6 + admin - 1 closed (c-tls only closes)
    ends = {(s.labels["reason"], s.labels["by"]): s.value for s in fams["kafkatap_connection_ends"].samples}
    assert ends[("broker_fin", "broker")] == 1
    assert fams["kafkatap_opaque_connections"].samples[0].value == 1
    assert {s.labels["dataset"] for s in fams["kafkatap_recording_dropped_rows"].samples} >= {"requests"}
    assert "kafkatap_recording_queue_rows" in fams
    rec_errors = {s.labels["kind"]: s.value for s in fams["kafkatap_recording_errors"].samples}
    assert rec_errors == {"write": 0, "compaction": 0, "rollups": 0, "writer_process": 0, "retention": 0}
    assert fams["kafkatap_request_bytes"].samples and fams["kafkatap_response_bytes"].samples
    unans = {s.labels["status"] for s in fams["kafkatap_requests_unanswered"].samples}
    assert unans == {"no_response"}


def test_clients_json_shape(served) -> None:
    sink, _sinks, lp, server = served
    lp.call(_feed, sink)
    status, headers, body = _get(server, "/clients")
    assert status == 200 and headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    assert doc["proxy_id"] == "p1" and doc["open_connections"] == 6
    by_id = {c["conn_id"]: c for c in doc["clients"]}
    prod = by_id["c00000"]
    assert set(prod) >= {"client_id", "software", "role", "roles", "topics", "requests", "bytes_from_client",
                         "bytes_from_broker", "last_seen_ns", "last_seen_s_ago", "client_addr", "broker_addr",
                         "open"}
    assert "producer" in prod["roles"] and prod["client_id"].startswith("producer")
    assert "consumer" in by_id["c00001"]["roles"]
    assert by_id["c-admin"]["role"] == "admin"
    assert by_id["c00005"]["open"] is False and by_id["c00005"]["end_reason"] == "broker_fin"
    assert by_id["c-tls"]["role"] == "opaque"
    assert prod["requests"] > 0 and prod["bytes_from_client"] > 0 and prod["topics"]
    assert any(c["software"] == "apache-kafka-java" for c in doc["clients"])


def test_http_edge_cases(served) -> None:
    sink, _sinks, lp, server = served
    assert _get(server, "/nope")[0] == 404
    assert _get(server, "/healthz")[0] == 200
    server.serving = False  # the proxy's listeners are not bound yet (kafkatap proxy sets it until they are)
    status, _, body = _get(server, "/healthz")
    assert status == 503 and json.loads(body)["status"] == "starting"
    server.serving = True
    import http.client

    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    conn.request("POST", "/metrics", body=b"x")
    assert conn.getresponse().status in (400, 405)
    conn.close()
    # a wrong method on a known path: 405 with the Allow header RFC 9110 requires; on an unknown path: 404
    for method, path, status, allow in (("DELETE", "/metrics", 405, "GET, HEAD"), ("OPTIONS", "/clients", 405, "GET, HEAD"),
                                        ("OPTIONS", "/nope", 404, None), ("PUT", "/faults", 405, "GET, HEAD, POST, DELETE"),
                                        ("PUT", "/faults/abc", 404, None), ("GET", "/faults/abc", 404, None),
                                        ("GET", "/faults/3", 405, "DELETE"), ("GET", "/faults", 200, None),
                                        ("GET", "/metrics", 200, None)):
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request(method, path)
        r = conn.getresponse()
        assert (r.status, r.getheader("Allow")) == (status, allow), (method, path)
        r.read()
        conn.close()
    # bare-LF line endings (a hand-written health check): answered, not held until the read times out
    import socket

    with socket.create_connection((server.host, server.port), timeout=2) as raw:
        raw.sendall(b"\n" + b"GET /healthz HTTP/1.0\nHost: x\n\n")  # an empty line first is ignored (RFC 9112)
        got = b""
        while chunk := raw.recv(4096):  # HTTP/1.0: the server closes after its answer; a timeout fails the test
            got += chunk
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and b'"status": "ok"' in got
    with socket.create_connection((server.host, server.port), timeout=2) as raw:
        raw.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 17_000 + b"\r\n\r\n")
        assert raw.recv(4096).startswith(b"HTTP/1.1 431 ")
    # keep-alive: two requests on one connection
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    for _ in range(2):
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        assert r.status == 200 and r.read()
    conn.close()


def test_top_once_renders(served) -> None:
    sink, _sinks, lp, server = served
    lp.call(_feed, sink)
    result = CliRunner().invoke(top, ["--addr", f"127.0.0.1:{server.port}", "--once", "--interval", "0.2"])
    assert result.exit_code == 0, result.output
    assert "req/s" in result.output.splitlines()[0]  # --once polls twice, so it has a rate
    assert "kafkatap top" in result.output and "producer-2" in result.output and "\x1b[" not in result.output
    result = CliRunner().invoke(top, ["--addr", f"127.0.0.1:{server.port}", "--once", "--json"])
    assert json.loads(result.output)["open_connections"] == 6


def test_top_json_is_one_poll_and_a_pipe_gets_snapshots_without_escape_codes(served) -> None:
    """`top --json` without --once was silently the live screen; into a file `top` wrote screen-clearing codes."""
    import subprocess
    import sys

    sink, _sinks, lp, server = served
    lp.call(_feed, sink)
    result = CliRunner().invoke(top, ["--addr", f"127.0.0.1:{server.port}", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["open_connections"] == 6
    proc = subprocess.Popen([sys.executable, "-m", "kafkatap.cli", "top", "--addr", f"127.0.0.1:{server.port}",
                             "--interval", "0.2"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        screens = 0
        out = []
        assert proc.stdout is not None
        for line in proc.stdout:  # two snapshots, then stop it
            out.append(line)
            screens += line.startswith("kafkatap top")
            if screens == 2:
                break
    finally:
        proc.terminate()
        proc.wait(10)
    assert screens == 2 and not any("\x1b[" in line for line in out)


def test_top_unreachable_is_clear() -> None:
    result = CliRunner().invoke(top, ["--addr", "127.0.0.1:1", "--once"])
    assert result.exit_code != 0 and "Is the proxy running with --status-addr" in result.output


def test_render_rates_from_two_polls() -> None:
    stats = LiveStats("p1")
    _feed(stats, 100)
    m1 = parse_metrics(stats.render_prometheus())
    c1 = stats.clients_json()
    from proxy.live import snapshot_counts

    prev = (0.0, snapshot_counts(c1, m1))
    _feed(stats, 100)
    screen = render(stats.clients_json(), parse_metrics(stats.render_prometheus()), prev, 1.0, 200, 50, False)
    assert "req/s" in screen and "p99" in screen


def test_top_names_recording_errors_only_when_there_are_some() -> None:
    errors = {"write": 0, "compaction": 0, "rollups": 0, "writer_process": 0, "retention": 0}
    stats = LiveStats("p1", recorder_stats=lambda: {"dropped": {}, "queued": {}, "rows_written": {}, "frames_redacted": 0,
                                                    "errors": errors})
    _feed(stats, 10)
    screen = render(stats.clients_json(), parse_metrics(stats.render_prometheus()), None, 1.0, 200, 50, False)
    assert "recording: dropped 0 queued 0   showing" in screen
    errors["rollups"] = 3
    screen = render(stats.clients_json(), parse_metrics(stats.render_prometheus()), None, 1.0, 200, 50, False)
    assert "recording: dropped 0 queued 0 errors rollups 3   showing" in screen


def test_connection_visible_from_its_open_tcp_sample() -> None:
    from recording.sample_rows import tcp_row

    stats = LiveStats("p1")
    stats.tcp(tcp_row("p1", "c-new", phase="open"))
    stats.tcp(tcp_row("p1", "c-new", side="broker", phase="open"))
    assert stats.open_count == 1 and stats.clients_json()["clients"][0]["conn_id"] == "c-new"
    stats.connection(connection_row("p1", "c-new", final=True))
    stats.tcp(tcp_row("p1", "c-new", phase="close"))  # a late close sample does not reopen it
    assert stats.open_count == 0


def test_editor_give_ups_and_oversize_frames_are_counted_once_per_growth() -> None:
    """Snapshots repeat a connection's state: the counters add what is new, not every row."""
    stats = LiveStats("p1")
    snap = connection_row("p1", "c1", final=False, edit_stopped="not Kafka framing", edit_oversize_frames=1)
    stats.connection(snap)
    stats.connection(snap)  # the next periodic snapshot, nothing new
    stats.connection(connection_row("p1", "c1", final=True, edit_stopped="not Kafka framing", edit_oversize_frames=3))
    stats.connection(connection_row("p1", "c2", final=True))
    families = {f.name: f for f in text_string_to_metric_families(stats.render_prometheus())}
    assert families["kafkatap_edit_stopped_connections"].samples[0].value == 1
    assert families["kafkatap_edit_oversize_frames"].samples[0].value == 3


def test_live_stats_per_row_cost_is_small() -> None:
    import time

    stats = LiveStats("p1")
    rows = SessionMix().rows(20_000)
    t0 = time.perf_counter()
    for r in rows:
        stats.request(r)
    per_row_us = (time.perf_counter() - t0) / len(rows) * 1e6
    assert per_row_us < 40, per_row_us


def test_a_client_that_never_reads_its_answers_is_cut_off(monkeypatch) -> None:
    """Requests pipelined by a client that never reads: the answers fill both sockets' buffers, and the
    connection (with its buffered answers) stayed open for ever; now it is aborted once an answer is not
    taken within the write timeout."""
    import socket
    import struct
    import time

    from proxy import status

    monkeypatch.setattr(status, "WRITE_TIMEOUT_S", 0.3)

    class Big:
        proxy_id = "p1"

        def render_prometheus(self) -> str:
            return "x" * (1 << 20)

        def clients_json(self) -> dict:
            return {}

    lp = _Loop()
    server = status.StatusServer(Big())
    try:
        lp.run(server.start())
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.connect(("127.0.0.1", server.port))
        c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 8)
        deadline = time.monotonic() + 10
        state = None
        while time.monotonic() < deadline:  # the kernel's view of the socket: CLOSE (7) once the server's RST came
            state = struct.unpack("B", c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[:1])[0]
            if state == 7:
                break
            time.sleep(0.05)
        assert state == 7, f"still open (TCP state {state})"
        c.close()
    finally:
        lp.run(server.stop())
        lp.stop()


def test_top_fits_its_screen_and_keeps_its_header() -> None:
    """On a 160×10 screen with 8 clients it printed 11 lines and a newline: the header scrolled away. The header lines
    were never cut (87 and 93 characters wrap at 80), and a closed row's end reason came after the cut."""
    stats = LiveStats("p1")
    rows = SessionMix(connections=8).rows(80)
    for i, row in enumerate(rows):
        stats.request(dict(row, client_id=f"client-{i % 8}"))
    stats.connection(connection_row("p1", "c00005", final=True, end_reason="upstream_connect_failed", end_by="proxy"))
    metrics = parse_metrics(stats.render_prometheus())
    for width, height in ((160, 10), (80, 12), (40, 8)):
        screen = render(stats.clients_json(), metrics, None, 1.0, width, height, False, per_connection=True)
        lines = screen.split("\n")
        assert len(lines) <= height and not screen.endswith("\n"), (width, height, lines)
        assert lines[0].startswith("kafkatap top — proxy p1") and all(len(ln) <= width for ln in lines), lines
        if height == 10:
            assert lines[-1].startswith("… ") and lines[-1].endswith(" more")


def test_top_shows_no_negative_rate_after_a_restart_and_escapes_bidi_controls() -> None:
    """A proxy restarted between two polls gave "-2.7 req/s"; a client id with U+202E reversed the rest of its row."""
    from proxy.live import snapshot_counts

    stats = LiveStats("p1")
    _feed(stats, 50)
    m, c = parse_metrics(stats.render_prometheus()), stats.clients_json()
    prev = (0.0, {**snapshot_counts(c, m), "__total__": 10_000})
    assert "requests 52  - req/s  errors" in render(c, m, prev, 1.0, 400, 50, False).split("\n")[0]
    stats.request(dict(SessionMix(connections=1).rows(1)[0], conn_id="c-evil", client_id="evil\u202eroot"))
    screen = render(stats.clients_json(), parse_metrics(stats.render_prometheus()), None, 1.0, 400, 50, False)
    assert "\u202e" not in screen and "evil\\u202eroot" in screen


def test_a_huge_client_id_is_cut_in_clients() -> None:
    """Eight 32 KiB client ids per connection made /clients megabytes, rendered on the relaying loop at each poll."""
    from proxy.metrics import MAX_CLIENT_ID_CHARS

    stats = LiveStats("p1")
    row = SessionMix(connections=1).rows(1)[0]
    for i in range(8):
        stats.request(dict(row, client_id=str(i) * 32_768))
    (conn,) = stats.clients_json()["clients"]
    assert len(conn["client_id"]) == MAX_CLIENT_ID_CHARS and conn["client_id"].endswith("…")
    assert all(len(cid) == MAX_CLIENT_ID_CHARS for cid in conn["client_ids"]) and len(conn["client_ids"]) == 8


def test_a_connection_without_a_row_is_named_from_its_requests_so_far() -> None:
    """What the relay knows of a connection no row has named yet (its addresses, its requests' client ids) fills
    /clients at render time; a connection a row named, or a closed one, is left as it is."""
    from recording.sample_rows import tcp_row

    stats = LiveStats("p1")
    stats.tcp(tcp_row("p1", "c-open", phase="open"))  # an open sample: no addresses
    opened = stats.clients["c-open"].first_seen_ns - 5 * 10**9
    so_far = [{"conn_id": "c-open", "opened_ns": opened, "client_addr": "10.0.0.7:4000", "broker_addr": "10.0.0.1:9092",
               "client_ids": ["stuck"], "client_software_name": "librdkafka", "client_software_version": "2.6",
               "bytes_from_client": 120, "bytes_from_broker": 0, "last_api_key": 0},
              {"conn_id": "c-unseen", "opened_ns": opened, "client_addr": "10.0.0.8:4000",  # --no-tcp-info
               "broker_addr": "10.0.0.1:9092", "client_ids": ["x" * 300], "client_software_name": None,
               "client_software_version": None, "bytes_from_client": 40, "bytes_from_broker": 0, "last_api_key": 18}]
    stats.open_requests_so_far = lambda: so_far
    doc = stats.clients_json()
    by_conn = {c["conn_id"]: c for c in doc["clients"]}
    c = by_conn["c-open"]
    assert (c["client_id"], c["client_addr"], c["software"], c["bytes_from_client"], c["roles"]) == (
        "stuck", "10.0.0.7:4000", "librdkafka", 120, ["producer"])  # the role of the Produce it waits on
    unseen = by_conn["c-unseen"]
    assert len(unseen["client_id"]) == 256 and unseen["first_seen_ns"] == opened  # cut as a row's would be
    # both are open; reading /clients (or /metrics) keeps no entry and moves no count of its own
    assert doc["open_connections"] == 2 and stats.open_count == 1 and "c-unseen" not in stats.clients
    assert 'kafkatap_open_connections{proxy="p1"} 2' in stats.render_prometheus()
    assert stats.open_count == 1 and stats.connections_total == 1
    stats.connection(connection_row("p1", "c-open", final=True))
    so_far[0]["client_ids"] = ["renamed"]
    assert {c["conn_id"]: c["client_id"] for c in stats.clients_json()["clients"]}["c-open"] == "stuck"


def test_a_quiet_connections_periodic_snapshot_does_not_make_it_seen() -> None:
    """SEEN (last_seen_s_ago) moved at every --tcp-info-interval snapshot, so an idle or stuck client never looked
    idle for more than the interval; a snapshot moves it only when bytes crossed since, and the end always."""
    clock = [10**18]
    stats = LiveStats("p1", clock_ns=lambda: clock[0])
    stats.connection(connection_row("p1", "c1", final=False))
    first = stats.clients["c1"].last_seen_ns
    clock[0] += 30 * 10**9
    stats.connection(connection_row("p1", "c1", final=False))  # the same byte counts: quiet
    assert stats.clients["c1"].last_seen_ns == first
    clock[0] += 10**9
    stats.connection(connection_row("p1", "c1", final=False, bytes_from_client=2000))
    assert stats.clients["c1"].last_seen_ns == clock[0]
    clock[0] += 10**9
    stats.connection(connection_row("p1", "c1", final=True, bytes_from_client=2000))
    assert stats.clients["c1"].last_seen_ns == clock[0]


def test_top_says_when_workers_did_not_answer() -> None:
    """With --workers N, a worker that did not answer left its connections out of /clients: top showed the rest as
    the proxy's open connections, with nothing saying a part was missing."""
    stats = LiveStats("p1")
    for i, row in enumerate(SessionMix(connections=4).rows(20)):
        stats.request(dict(row, client_id=f"client-{i % 4}"))
    doc = dict(stats.clients_json(), workers=2, workers_unreachable=1)
    metrics = parse_metrics(stats.render_prometheus())
    for width, height in ((160, 12), (60, 8)):
        lines = render(doc, metrics, None, 1.0, width, height, False).split("\n")
        assert lines[2].startswith("1 of 2 workers did not answer"), lines
        assert len(lines) <= height and all(len(ln) <= width for ln in lines), lines
    whole = render(dict(doc, workers_unreachable=0), metrics, None, 1.0, 160, 12, False)
    assert "did not answer" not in whole
