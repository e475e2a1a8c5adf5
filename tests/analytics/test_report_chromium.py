"""The report of a real recording (real broker, real clients, the proxy recording), as an operator opens it:
headless Chromium at 1400 px, no horizontal scrolling, the investigation views there with data, screenshots
kept in test-artifacts/ (report-1400.png, report-connection-1400.png) for a person to look at."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from analytics.job import run_analysis
from analytics.result import AnalysisResult
from proxy.running import RunningProxy
from recording.writer import ParquetRecorder

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
VIEWPORT = 1400


class _Broker:
    def __init__(self, kafka, proxy_port: int) -> None:
        self.kafka = kafka
        self.route = f"127.0.0.1:{proxy_port}=127.0.0.1:{kafka.port}"


@pytest.fixture(scope="module")
def proxied_broker() -> Iterator[_Broker]:
    """A broker advertising the proxy's port, so every client connection (bootstrap and after) is recorded."""
    from harness.kafka import LocalKafka, free_port

    proxy_port = free_port()
    kafka = LocalKafka(broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy_port}"})
    kafka.start()
    try:
        yield _Broker(kafka, proxy_port)
    finally:
        kafka.stop()
        kafka.cleanup()


def _workload(bootstrap: str) -> None:
    """Two producers, a consumer group and an admin over ~8 s, with one real error (TOPIC_ALREADY_EXISTS)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="ops-admin")
    admin.create_topics([NewTopic("orders", 3, 1), NewTopic("audit", 1, 1)])
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics([NewTopic("orders", 3, 1)])
    orders = KafkaProducer(bootstrap_servers=bootstrap, client_id="orders-service", acks="all", linger_ms=5)
    audit = KafkaProducer(bootstrap_servers=bootstrap, client_id="audit-writer", acks=1, batch_size=65536, linger_ms=50)
    end = time.monotonic() + 8
    i = 0
    while time.monotonic() < end:
        orders.send("orders", f"order-{i}".encode() * 10)
        if i % 3 == 0:
            audit.send("audit", b"x" * 2000)
        i += 1
        if i % 50 == 0:
            orders.flush()
            time.sleep(0.1)  # a steady rate over several seconds, so throughput has a time axis
    orders.close()
    audit.close()
    consumer = KafkaConsumer("orders", "audit", bootstrap_servers=bootstrap, group_id="billing", client_id="billing-reader",
                             auto_offset_reset="earliest", consumer_timeout_ms=30_000)
    # read all that was sent (the orders, and an audit record every third): a fresh broker's first group waits
    # seconds for __consumer_offsets, so 3 s of quiet was no sign of the end
    sent = i + len(range(0, i, 3))
    assert sum(1 for _ in zip(range(sent), consumer)) >= i
    consumer.close()
    admin.close()


@pytest.fixture(scope="module")
def real_report(proxied_broker: _Broker, spark, tmp_path_factory) -> AnalysisResult:
    root = tmp_path_factory.mktemp("real-report")
    rec = ParquetRecorder(root / "rec", "p1", flush_interval_s=0.2, fsync=False).start()
    try:
        with RunningProxy([proxied_broker.route], sink=rec, proxy_id="p1", tcp_info_interval=1.0) as p:
            _workload(p.bootstrap)
    finally:
        rec.close()
    return run_analysis([root / "rec"], root / "out", spark=spark, progress=False)


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    assert Path(CHROMIUM).exists(), "Debian chromium is missing: ./go setup installs it"
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=180)


def _measure(page: Path, tmp_path: Path) -> tuple[int, int, str]:
    """(document scrollWidth, scrollHeight, DOM) of `page` laid out at a 1400 px wide viewport.

    The report itself carries no script; a copy beside it gets one that writes the sizes into the title.
    """
    probe = page.with_name(f".probe-{page.name}")
    probe.write_text(page.read_text(encoding="utf-8").replace(
        "</body>", "<script>document.title='SIZE '+document.documentElement.scrollWidth+' '"
                   "+document.documentElement.scrollHeight+' '+Math.max(0,...Array.from("
                   "document.querySelectorAll('.tablewrap'),e=>e.scrollWidth-e.clientWidth))</script></body>"),
        encoding="utf-8")
    try:
        dom = _chromium([f"--window-size={VIEWPORT},900", "--dump-dom", probe.as_uri()], tmp_path / "profile-dom").stdout
    finally:
        probe.unlink()
    m = re.search(r"<title>SIZE (\d+) (\d+) (\d+)</title>", dom)
    assert m, dom[:2000]
    assert int(m[3]) <= 1, f"{page.name}: a table needs horizontal scrolling inside its frame ({m[3]} px) at {VIEWPORT} px"
    return int(m[1]), int(m[2]), dom


def _screenshot(page: Path, png: Path, height: int, tmp_path: Path) -> None:
    png.unlink(missing_ok=True)
    p = _chromium([f"--window-size={VIEWPORT},{height}", f"--screenshot={png}", page.as_uri()], tmp_path / "profile-shot")
    assert png.exists() and png.stat().st_size > 20_000, p.stderr[-2000:]


def _section(html: str, sid: str) -> str:
    start = html.index(f'<section id="{sid}">')
    return html[start:html.index("</section>", start)]


def test_new_views_have_data(real_report: AnalysisResult, proxied_broker: _Broker) -> None:
    t = real_report.tables
    html = real_report.report_path.read_text(encoding="utf-8")
    # throughput per topic and per client, both directions
    rows = t["throughput_over_time"]
    keys = {(r["by"], r["key"]) for r in rows}
    assert keys >= {("topic", "orders"), ("topic", "audit"), ("client", "orders-service"), ("client", "audit-writer"),
                    ("client", "billing-reader")}, keys
    orders = [r for r in rows if r["key"] == "orders" and r["by"] == "topic"]
    assert sum(r["bytes_to_broker_per_s"] for r in orders) > 0 and sum(r["bytes_to_client_per_s"] for r in orders) > 0, orders
    throughput = _section(html, "throughput")
    assert throughput.count("<svg") >= 4 and "client → broker" in throughput and "broker → client" in throughput
    # slowest requests, each with its connection (a link to its page) and correlation id
    slow = t["slowest_requests"]
    assert len(slow) >= 10 and all(r["conn_id"] and r["correlation_id"] is not None for r in slow), slow
    assert [r["latency_us"] for r in slow] == sorted((r["latency_us"] for r in slow), reverse=True)
    assert f'<a href="connections/{slow[0]["conn_id"]}.html">' in _section(html, "latency")
    # the error, its own row, group ids out of the topic column
    assert any(r["error_name"] == "TOPIC_ALREADY_EXISTS" for r in t["errors_by_name"]), t["errors_by_name"]
    # every example connection in every table is a link to a page that exists
    examples = {str(r["example_conn_id"]) for rs in t.values() for r in rs if r.get("example_conn_id")}
    assert examples
    assert examples <= {r["conn_id"] for r in t["connection_facts"]}, (examples, t["connection_facts"])
    for conn_id in examples:
        assert f'<a href="connections/{conn_id}.html">{conn_id}</a>' in html, conn_id
        assert (real_report.out / "connections" / f"{conn_id}.html").exists()
    # human headers, ms not raw µs, no internal columns
    assert "<th title=\"p99_us\">p99 (ms)</th>" in html and ">bin<" not in html and ">p99_us<" not in html
    span = re.search(r"<b>([^<]*)</b><span>span</span>", html)
    assert span and re.fullmatch(r"\d+(\.\d)? s|\d+ min( \d+ s)?", span[1]), span  # "14 s", not "0.2 min"
    assert "bytes client → broker" in html and "bytes in / out" not in html
    # broker ids beside addresses: the broker behind the proxy listener is node 1 (one-node cluster)
    nodes = {(r["address"], r["node_id"]) for r in t["brokers"]}
    upstreams = {r["broker_addr"] for r in t["connection_facts"] if r.get("broker_addr")}
    assert upstreams and all((a, 1) in nodes for a in upstreams), (nodes, upstreams)
    # the table lists brokers only, as the overview counts them: the advertised proxy listener is beside its broker
    assert {a for a, _ in nodes} == upstreams and len(upstreams) == real_report.tables["overview"][0]["brokers"], nodes
    listen = proxied_broker.route.partition("=")[0]
    assert all(r["listeners"] == [listen] for r in t["brokers"]), (t["brokers"], listen)
    assert f"{sorted(upstreams)[0]} (node 1)" in _section(html, "latency")


def test_connection_page_tells_the_story(real_report: AnalysisResult) -> None:
    conn_id = real_report.tables["slowest_requests"][0]["conn_id"]
    page = (real_report.out / "connections" / f"{conn_id}.html").read_text(encoding="utf-8")
    requests = _section(page, "requests")
    assert requests.count("<tr>") > 2  # header + its requests
    tcp = _section(page, "tcp")
    assert tcp.count("<tr>") >= 3 and ">client<" in tcp and ">broker<" in tcp  # samples of both sockets
    assert "How it ended" in page and 'href="../report.html"' in page


def test_report_fits_1400_px_and_screenshots(real_report: AnalysisResult, tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    width, height, dom = _measure(real_report.report_path, tmp_path)
    assert width <= VIEWPORT, f"the report needs horizontal scrolling at {VIEWPORT} px: scrollWidth {width}"
    text = unescape(dom)
    for heading in ("Throughput over time", "Slowest requests", "Connection pages", "Errors over time"):
        assert heading in text, heading
    _screenshot(real_report.report_path, ARTIFACTS / "report-1400.png", min(height, 16000), tmp_path)
    conn_id = real_report.tables["slowest_requests"][0]["conn_id"]
    page = real_report.out / "connections" / f"{conn_id}.html"
    cwidth, cheight, _ = _measure(page, tmp_path)
    assert cwidth <= VIEWPORT, f"connection page scrollWidth {cwidth}"
    _screenshot(page, ARTIFACTS / "report-connection-1400.png", min(cheight, 8000), tmp_path)
