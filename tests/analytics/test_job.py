"""End to end on a synthetic recording: run_analysis, files, findings, CLI, and the report in headless Chromium."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from analytics.cli import analyze
from analytics.job import choose_bucket, row_counts, run_analysis
from analytics.result import AnalysisResult
from analytics.synthetic import generate, tcp_info, write_rows
from analytics.report.html import human_duration
from analytics_rows import INCIDENT_RULES, S, T0, conn, req

pytestmark = pytest.mark.spark

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def result(spark, tmp_path_factory) -> AnalysisResult:
    root = tmp_path_factory.mktemp("synthetic")
    generate(root / "rec", 8000)
    return run_analysis([root / "rec"], root / "out", spark=spark, progress=False)


def test_every_incident_is_diagnosed(result: AnalysisResult) -> None:
    ids = result.finding_ids()
    for incident, rules in INCIDENT_RULES.items():
        assert rules <= ids, f"incident {incident}: missing {rules - ids}"
    first = result.by_id("broker_closed_after_acks0_produce")[0]
    assert first.evidence["topic"] == "audit.raw" and first.examples[0]["conn_id"]
    assert "bulk-loader" in result.by_id("client_inventory")[0].summary or result.by_id("client_inventory")[0].evidence["clients"] > 100
    assert result.findings[0].severity == "critical"  # ranked


def test_outputs_written(result: AnalysisResult) -> None:
    out = result.out
    doc = json.loads((out / "findings.json").read_text())
    assert doc["format"] == 1 and doc["overview"]["requests"] == 8000
    f0 = doc["findings"][0]
    assert set(f0) >= {"id", "severity", "title", "summary", "incident", "evidence", "examples", "tables", "score"}
    for name in ("client_inventory", "latency_by_api", "connections_over_time", "window_ceiling", "errors_by_name", "overview"):
        assert pq.read_table(out / "tables" / f"{name}.parquet").num_rows > 0
        assert (out / "tables" / f"{name}.csv").read_text().count("\n") > 1
    assert result.tables["latency_by_api"][0]["p99_us"] > 0
    assert "Fetch (long poll)" in {r["api_label"] for r in result.tables["latency_by_api"]}


def test_findings_point_to_the_incidents_doc(result: AnalysisResult) -> None:
    """A finding that says "incident N" also says where incident N is told, in findings.json and in the report."""
    doc = json.loads(result.findings_path.read_text())
    by_incident = {f["incident"]: f["incident_doc"] for f in doc["findings"] if f["incident"]}
    assert by_incident == {n: f"docs/incidents.md#incident-{n}" for n in INCIDENT_RULES}
    assert all(f["incident_doc"] is None for f in doc["findings"] if not f["incident"])
    html = result.report_path.read_text()
    for n in INCIDENT_RULES:
        assert f"incident {n}, <code>docs/incidents.md#incident-{n}</code>" in html


def test_report_is_self_contained(result: AnalysisResult) -> None:
    html = result.report_path.read_text()
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "url(" not in html and "@import" not in html
    assert html.index('id="findings"') < html.index('id="clients"')  # findings first
    assert html.count("<svg") >= 10


def test_report_renders_in_headless_chromium(result: AnalysisResult, tmp_path) -> None:
    assert Path("/usr/bin/chromium").exists(), "Debian chromium is missing: ./go setup installs it"
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "analytics-report.png"
    shot.unlink(missing_ok=True)
    base = ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--enable-logging=stderr", "--v=0"]
    url = result.report_path.resolve().as_uri()
    p = subprocess.run(base + [f"--user-data-dir={tmp_path / 'profile-a'}", "--window-size=1280,2400", f"--screenshot={shot}", url],
                       capture_output=True, text=True, timeout=180)
    assert shot.exists() and shot.stat().st_size > 50_000, p.stderr[-2000:]
    dom = subprocess.run(base + [f"--user-data-dir={tmp_path / 'profile-b'}", "--dump-dom", url], capture_output=True, text=True, timeout=180)
    assert "Findings" in dom.stdout and "window scaling" in dom.stdout.lower()
    logs = p.stderr + dom.stderr
    bad = [line for line in logs.splitlines() if "CONSOLE" in line or "Uncaught" in line or "net::ERR" in line]
    assert bad == [], bad


def test_choose_bucket() -> None:
    assert choose_bucket(60) == 1 and choose_bucket(7200) == 60 and choose_bucket(None) == 60 and choose_bucket(10**9) == 86400


def test_row_counts_in_one_job_equal_each_count(spark) -> None:
    frames = {"ten": spark.range(10), "none": spark.range(0), "three": spark.range(3).where("id < 2").union(spark.range(1))}
    assert row_counts(frames) == {name: df.count() for name, df in frames.items()} == {"ten": 10, "none": 0, "three": 3}


def test_cli_help() -> None:
    out = CliRunner().invoke(analyze, ["--help"])
    assert out.exit_code == 0
    for opt in ("--out", "--master", "--since", "--until", "--broker", "--client", "--topic", "--compare"):
        assert opt in out.output


def test_cli_compare_middlebox(spark, tmp_path) -> None:
    """The same 30 requests seen before (A) and after (B) a middlebox that adds 2 ms."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_rows(a, "requests", [req("a1", i, "Produce", t_s=i, lat_us=3000 + i) for i in range(30)])
    write_rows(b, "requests", [req("b1", i, "Produce", t_s=i + 0.0005, lat_us=1000 + i) for i in range(30)])
    write_rows(a, "connections", [conn("a1", 0, 40)])
    write_rows(b, "connections", [conn("b1", 0, 40)])
    out = CliRunner().invoke(analyze, ["--compare", str(a), str(b), "--out", str(tmp_path / "out"), "--quiet"])
    assert out.exit_code == 0, out.output
    assert "Latency A − B: Produce p50 +2.00 ms" in out.output
    doc = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert doc["compare_mode"] == "wire"
    row = [r for r in json.loads(json.dumps(doc))["findings"] if r["id"] == "compare_added_latency"][0]
    assert row["evidence"]["apis"]["Produce"]["matched"] == 30



def test_a_window_narrows_the_span_the_bucket_and_the_connection_series(spark, tmp_path) -> None:
    """--since/--until an hour into a week: the span tile, the time bucket and connections_over_time are the hour's.

    The connection open all week is concurrent in every bucket of the hour; nothing before or after it is drawn.
    """
    rec, day, since_s = tmp_path / "rec", 86_400, 3 * 86_400
    write_rows(rec, "requests", [req("week", 1, t_s=600), req("week", 2, t_s=since_s + 600), req("hour", 1, t_s=since_s + 1200),
                                 req("week", 3, t_s=6 * day)])
    write_rows(rec, "connections", [conn("week", 0, 7 * day), conn("hour", since_s + 1100, since_s + 1300)])
    since, until = T0 + since_s * S, T0 + (since_s + 3600) * S
    res = run_analysis([rec], tmp_path / "out", spark=spark, progress=False, since=since, until=until)
    assert res.overview["requests"] == 2 and (res.overview["start_ns"], res.overview["end_ns"]) == (since, until)
    assert res.overview["span_s"] == 3600 and res.bucket_s == 30
    assert f"<b>{human_duration(3600)}</b><span>span</span>" in res.report_path.read_text()
    series = res.tables["connections_over_time"]
    buckets = [int(r["bucket"].timestamp()) * S for r in series]
    assert min(buckets) == since and max(buckets) <= until and len(series) == 121, (len(series), buckets[:3], buckets[-3:])
    assert series[0]["concurrent"] == 1 and series[0]["opens"] == 0  # open since day 0: there at the window's start
    assert max(r["concurrent"] for r in series) == 2 and sum(r["opens"] for r in series) == sum(r["ends"] for r in series) == 1
    assert series[-1]["concurrent"] == 1  # still open at the window's end (it closes on day 7)


def test_cli_compare_warns_when_few_requests_match(spark, tmp_path) -> None:
    """B saw 10 of A's 30 requests (it started late): the CLI's findings and the report say so, with the likely causes.

    Narrowed with --since/--until to the seconds both recorded, every request matches and the warning goes;
    the overview then spans that window only.
    """
    a, b = tmp_path / "a", tmp_path / "b"
    write_rows(a, "requests", [req("a1", i, "Produce", t_s=i, lat_us=3000) for i in range(30)])
    write_rows(b, "requests", [req("b1", i, "Produce", t_s=i + 0.0005, lat_us=1000) for i in range(20, 30)])
    write_rows(a, "connections", [conn("a1", 0, 40)])
    write_rows(b, "connections", [conn("b1", 19, 40)])
    out = CliRunner().invoke(analyze, ["--compare", str(a), str(b), "--out", str(tmp_path / "out"), "--quiet", "--tolerance", "5"])
    assert out.exit_code == 0, out.output
    assert "[WARNING ] Few requests matched: 33% of A's 30, 100% of B's 10" in out.output
    doc = json.loads((tmp_path / "out" / "findings.json").read_text())
    (few,) = [f for f in doc["findings"] if f["id"] == "compare_few_matched"]
    assert few["evidence"]["matched"] == 10 and few["tables"] == ["compare_summary"]
    assert ("A's requests run from 2026-11-20 09:00:00 UTC to 2026-11-20 09:00:29 UTC; "
            "B's run from 2026-11-20 09:00:20 UTC to 2026-11-20 09:00:29 UTC") in few["summary"]
    assert "different time windows" in few["summary"] and "clocks differ by more than --tolerance (5 s)" in few["summary"]
    assert "Few requests matched: 33% of A&#x27;s 30" in (tmp_path / "out" / "report.html").read_text()
    out = CliRunner().invoke(analyze, ["--compare", str(a), str(b), "--out", str(tmp_path / "narrow"), "--quiet",
                                       "--since", "2026-11-20T09:00:20", "--until", "2026-11-20T09:00:30"])
    assert out.exit_code == 0 and "Few requests matched" not in out.output, out.output
    assert "Latency A − B: Produce p50 +2.00 ms" in out.output
    doc = json.loads((tmp_path / "narrow" / "findings.json").read_text())
    assert doc["overview"]["span_s"] == 10.0 and doc["overview"]["requests"] == 10  # A's side, within the window

def test_cli_compare_says_which_side_the_window_left_empty(spark, tmp_path) -> None:
    """--compare with a --since/--until that misses a side: a line names that side and what its recording holds.

    Before, a window that missed both gave "0 requests" and no finding at all, and one that missed B only
    "0% of B's 0" and nothing about where B's requests are."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_rows(a, "requests", [req("a1", i, "Produce", t_s=i, lat_us=3000) for i in range(30)])
    write_rows(b, "requests", [req("b1", i, "Produce", t_s=i + 0.0005, lat_us=1000) for i in range(20, 30)])
    write_rows(a, "connections", [conn("a1", 0, 40)])
    write_rows(b, "connections", [conn("b1", 19, 40)])
    b_holds = (f"--compare B ({b}): nothing matched the filters (since 2026-11-20 09:00:00 UTC; until 2026-11-20 09:00:10 "
               "UTC): the recording's 10 requests run from 2026-11-20 09:00:20 UTC to 2026-11-20 09:00:29 UTC")
    out = CliRunner().invoke(analyze, ["--compare", str(a), str(b), "--out", str(tmp_path / "b-missed"), "--quiet",
                                       "--since", "2026-11-20T09:00:00", "--until", "2026-11-20T09:00:10"])
    assert out.exit_code == 0, out.output
    assert b_holds in out.output and "--compare A" not in out.output, out.output
    doc = json.loads((tmp_path / "b-missed" / "findings.json").read_text())
    assert doc["nothing_matched"] == b_holds
    out = CliRunner().invoke(analyze, ["--compare", str(a), str(b), "--out", str(tmp_path / "both-missed"), "--quiet",
                                       "--since", "2026-11-21T09:00:00"])
    assert out.exit_code == 0, out.output
    assert (f"--compare A ({a}): nothing matched the filters (since 2026-11-21 09:00:00 UTC): the recording's 30 requests "
            "run from 2026-11-20 09:00:00 UTC to 2026-11-20 09:00:29 UTC; --compare B") in out.output, out.output
    assert "No findings: --compare A" in (tmp_path / "both-missed" / "report.html").read_text()


def test_a_window_narrows_the_connection_ends_lifetimes_and_reconnects(spark, tmp_path) -> None:
    """--since/--until an hour into a week in which a client reconnects every 100 s all through the hour (resets after
    idle) beside a connection of its open all week: the hour's reconnects per minute make the reconnect_storm finding
    (over the week's minutes they were ~0.004/min: no finding); ends and lifetimes are the hour's; the report says how
    each table reads the window."""
    rec, day, since_s = tmp_path / "rec", 86_400, 3 * 86_400
    storm = [conn(f"r{i}", since_s - 250 + 100 * i, since_s - 160 + 100 * i, client="billing", end_reason="client_rst",
                  idle_ms=60_000, client_addr=f"10.9.0.5:{3000 + i}") for i in range(43)]  # r2 … r38 meet the hour
    write_rows(rec, "connections", [conn("billing-long", 0, 7 * day, client="billing", broker="10.0.0.2:9092",
                                         client_addr="10.9.0.5:2999"), conn("week", 0, 7 * day), *storm])
    write_rows(rec, "requests", [req("week", 1, t_s=since_s + 600), req("r10", 1, t_s=since_s + 760, client="billing")])
    since, until = T0 + since_s * S, T0 + (since_s + 3600) * S
    res = run_analysis([rec], tmp_path / "out", spark=spark, progress=False, since=since, until=until)
    rc = {r["client_id"]: r for r in res.tables["reconnects_by_client"]}["billing"]
    # opened in the hour: r3 … r38, each after the one before it ended; reset in it: r2 … r37 (r38 ends after it)
    assert (rc["connections"], rc["reconnects"], rc["resets"], rc["reconnects_per_min"]) == (36, 36, 36, 0.6)
    storm_found = res.by_id("reconnect_storm")
    assert len(storm_found) == 1 and "billing" in storm_found[0].title and storm_found[0].evidence["reconnects"] == 36
    ends = {(r["end_reason"], r["end_by"]): r["connections"] for r in res.tables["connection_ends"]}
    assert ends == {("client_rst", "client"): 36, ("open", "none"): 3}  # open at the hour's end: r38 and the two week-long ones
    life = {r["lifetime"]: (r["connections"], r["reset"], r["still_open"]) for r in res.tables["connection_lifetimes"]}
    assert life == {"10–60 s": (1, 0, 1), "1–10 min": (36, 36, 0), "> 1 day": (2, 0, 2)}  # r38 50 s old at the hour's end
    html = res.report_path.read_text()
    notes = re.findall(r'<h3 id="t-(\w+)">[^<]*</h3><p class="note window">', html)
    assert set(notes) == {"connections_over_time", "connection_ends", "connection_lifetimes", "reconnects_by_client", "resets",
                          "broker_closes", "broker_outages", "unanswered_at_close", "client_inventory", "tcp_health", "tcp_rtt_by_peer",
                          "window_ceiling", "connection_facts"}, notes  # every table of connections or their sockets here


def test_a_window_narrows_the_connection_lists_overview_and_their_findings(spark, tmp_path) -> None:
    """--since/--until an hour into a week: resets, broker closes and unanswered-at-close list the ends inside the hour, so
    idle_resets_not_from_broker and broker_closed_after_acks0_produce judge the hour (resets and closes days after it made
    them bigger, the resets' critical); the overview and opaque_connections count every connection open in the hour, the
    overview's connections_ended the ends inside it; the client inventory the connections that carried requests in it."""
    rec, day, since_s = tmp_path / "rec", 86_400, 3 * 86_400
    tls = "request stream opaque at offset 0: tls: TLS ClientHello/handshake (0x16 0x03 0x01): the connection is encrypted"
    idle = {"end_reason": "client_rst", "idle_ms": 300_000}
    big = {"client": "bulk", "end_reason": "broker_fin", "end_by": "broker", "idle_ms": 1, "last_api": "Produce",
           "last_request_acks": 0, "last_request_bytes": 3_000_000, "last_request_topics": ["audit"]}
    write_rows(rec, "connections", [
        conn("week", 0, 7 * day), conn("tls-week", 0, 7 * day, client_ids=[], requests=0, tls=True, opaque=True, opaque_reason=tls),
        conn("idle-before", 2 * day, since_s - 600, **idle),  # reset before the hour: not seen
        *[conn(f"idle-in-{i}", since_s - 3000, since_s + 600 * i, **idle) for i in (1, 2)],  # reset inside it
        *[conn(f"idle-after-{i}", since_s + 100 * i, since_s + day + i, **idle) for i in (1, 2, 3)],  # reset a day after it
        conn("big-in", since_s + 1000, since_s + 1001, **big), conn("big-after", since_s + 3000, since_s + 5000, **big),
        conn("stuck-after", since_s + 200, 6 * day, unanswered=3),  # requests in flight at its end, days after the hour
    ])
    write_rows(rec, "requests", [req("week", 1, t_s=since_s + 600), req("week", 2, t_s=since_s + 900),
                                 req("idle-after-1", 1, t_s=since_s + 700), req("idle-in-1", 1, t_s=since_s - 100),
                                 req("big-in", 1, t_s=since_s + 1000, client="bulk", lat_us=None, status="no_response", acks=0)])
    since, until = T0 + since_s * S, T0 + (since_s + 3600) * S
    res = run_analysis([rec], tmp_path / "out", spark=spark, progress=False, since=since, until=until)
    assert [r["conn_id"] for r in res.tables["resets"]] == ["idle-in-1", "idle-in-2"]
    (idle_found,) = res.by_id("idle_resets_not_from_broker")
    assert (idle_found.evidence["resets"], idle_found.severity) == (2, "warning"), idle_found.title  # 5 with the later ones
    assert [r["conn_id"] for r in res.tables["broker_closes"]] == ["big-in"]
    (acks0,) = res.by_id("broker_closed_after_acks0_produce")
    assert "closed 1 connection(s) of bulk" in acks0.title, acks0.title
    assert [r["conn_id"] for r in res.tables["unanswered_at_close"]] == ["big-in"]  # not stuck-after
    ov = res.overview  # seen in the hour: all but idle-before; ended inside it: idle-in-1, idle-in-2, big-in
    assert (ov["connections"], ov["connections_ended"], ov["opaque_connections"]) == (10, 3, 1)
    (op,) = res.tables["opaque_connections"]
    assert (op["kind"], op["connections"], op["example_conn_id"]) == ("tls", 1, "tls-week")
    assert op["last_seen"].timestamp() == (T0 + (since_s + 3600) * S) / S  # as at the hour's end, not its close days later
    inv = {r["client_id"]: r["connections"] for r in res.tables["client_inventory"]}
    assert inv == {"app-1": 2, "bulk": 1}  # week and idle-after-1 sent requests in the hour (idle-in-1's was before it)
    html = res.report_path.read_text()
    notes = re.findall(r'<h3 id="t-(\w+)">[^<]*</h3><p class="note window">', html)
    assert {"resets", "broker_closes", "unanswered_at_close", "client_inventory", "opaque_connections"} <= set(notes), notes
    assert '<p class="note window" id="window-overview">' in html


def _client_sample(conn_id: str, t_s: float, phase: str, **info) -> dict:
    """One TCP_INFO sample of the proxy's client socket."""
    return {"proxy_id": "p1", "conn_id": conn_id, "side": "client", "phase": phase, "ts_ns": T0 + int(t_s * S), **tcp_info(**info)}


def test_a_window_narrows_the_tcp_tables_and_the_pages_say_what_they_show(spark, tmp_path) -> None:
    """--since/--until an hour into a week: a socket without window scaling, open all week, had a 900 ms RTT and dozens of
    retransmits on other days and a 2 ms RTT with 2 retransmits in the hour. The TCP tables say the hour's; its page says
    that how it ended is its whole life's while its requests and samples are the hour's."""
    rec, day, since_s = tmp_path / "rec", 86_400, 3 * 86_400
    slow = {"wscale": False, "timestamps": False}
    write_rows(rec, "connections", [conn("slow", 0, 7 * day, tcp_client_open=tcp_info(**slow, rtt_us=900_000),
                                         tcp_client_close=tcp_info(**slow, rtt_us=900_000, retrans=95, bytes_acked=10**9))])
    write_rows(rec, "tcp", [
        _client_sample("slow", 0, "open", **slow, rtt_us=900_000), _client_sample("slow", day, "periodic", **slow, rtt_us=800_000, retrans=50),
        *[_client_sample("slow", since_s + 600 * i, "periodic", **slow, rtt_us=2000, retrans=50 + i // 3, bytes_acked=10**6 * (1 + i))
          for i in range(7)],  # every 10 min of the hour: 2 retransmits, 6 MB acknowledged
        _client_sample("slow", 5 * day, "periodic", **slow, rtt_us=900_000, retrans=90),
        _client_sample("slow", 7 * day, "close", **slow, rtt_us=900_000, retrans=95, bytes_acked=10**9)])
    write_rows(rec, "requests", [req("slow", 1, "Fetch", t_s=since_s + 600)])
    since, until = T0 + since_s * S, T0 + (since_s + 3600) * S
    res = run_analysis([rec], tmp_path / "out", spark=spark, progress=False, since=since, until=until)
    health = {r["side"]: r for r in res.tables["tcp_health"]}["client"]
    assert (health["rtt_max_us"], health["retransmits"], health["without_window_scaling"]) == (2000, 2, 1)
    (wc,) = res.tables["window_ceiling"]
    assert (wc["rtt_ms"], wc["retrans_total"], wc["duration_s"], wc["bytes_sent"]) == (2.0, 2, 3600.0, 6 * 10**6)
    assert [r["rtt_max_us"] for r in res.tables["tcp_rtt_by_peer"] if r["side"] == "client"] == [2000]
    (found,) = res.by_id("window_scaling_off")
    assert "RTT 2.0 ms" in found.summary, found.summary  # the hour's, not the 900 ms of other days
    html = res.report_path.read_text()
    notes = re.findall(r'<h3 id="t-(\w+)">[^<]*</h3><p class="note window">', html)
    assert {"tcp_health", "tcp_rtt_by_peer", "window_ceiling", "connection_facts"} <= set(notes), notes
    page = (res.out / "connections" / "slow.html").read_text()
    assert "each connection&#x27;s whole life" in page and "those inside the window" in page


def test_a_window_narrows_compare_ends(spark, tmp_path) -> None:
    """--compare with --since/--until an hour into a week: A's and B's connections that ended differently days after the
    hour are both open at its end, so compare_ends_differ names only the pair that ended differently inside it."""
    a, b, day, since_s = tmp_path / "a", tmp_path / "b", 86_400, 3 * 86_400
    for side, rec, end_reason, end_by in (("a", a, "client_rst", "client"), ("b", b, "broker_fin", "broker")):
        write_rows(rec, "requests", [req(f"{side}-in", 1, t_s=since_s + 600 + 0.001 * (side == "b")),
                                     req(f"{side}-after", 1, t_s=since_s + 700 + 0.001 * (side == "b"))])
        write_rows(rec, "connections", [conn(f"{side}-in", since_s - 100, since_s + 900, end_reason=end_reason, end_by=end_by),
                                        conn(f"{side}-after", 0, 5 * day, end_reason=end_reason, end_by=end_by)])
    since, until = T0 + since_s * S, T0 + (since_s + 3600) * S
    res = run_analysis([], tmp_path / "out", spark=spark, progress=False, compare=(a, b), since=since, until=until)
    ends = {r["conn_id_a"]: (r["end_reason_a"], r["end_reason_b"], r["same"]) for r in res.tables["compare_ends"]}
    assert ends == {"a-in": ("client_rst", "broker_fin", False), "a-after": ("open", "open", True)}
    (differ,) = res.by_id("compare_ends_differ")
    assert differ.evidence["connections"] == 1, differ.title
    notes = re.findall(r'<h3 id="t-(\w+)">[^<]*</h3><p class="note window">', res.report_path.read_text())
    assert "compare_ends" in notes, notes


def test_no_window_no_window_notes(result: AnalysisResult) -> None:
    """Without --since/--until the report says nothing about a window (what it shows is the whole recording's)."""
    assert 'class="note window"' not in result.report_path.read_text() and not result.windowed


def test_cli_says_what_compare_takes() -> None:
    got = CliRunner().invoke(analyze, ["--compare", "rec-a", "--out", "cmp"])  # B forgotten: --out became B
    assert got.exit_code == 2 and "--compare takes two recordings A B, got 'rec-a --out'" in got.output
    got = CliRunner().invoke(analyze, ["rec"])
    assert got.exit_code == 2 and "Missing option '--out'" in got.output


def test_cli_rejects_bad_recording(tmp_path) -> None:
    out = CliRunner().invoke(analyze, [str(tmp_path), "--out", str(tmp_path / "o"), "--quiet"])
    assert out.exit_code != 0 and "holds no recording" in out.output


def test_spark_start_prints_nothing_of_its_own() -> None:
    """Spark's console noise ("Setting default log level …") is configured away, and the JVM's notice of the incubator
    module Spark's launcher always adds ("WARNING: Using incubator modules: jdk.incubator.vector") is dropped, so
    `analyze -q` prints nothing at all."""
    code = "from analytics.session import get_spark; print(get_spark().range(3).count())"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0 and p.stdout.strip() == "3", p.stderr[-2000:]
    assert p.stderr == ""


def test_a_callers_driver_java_options_keep_kafkataps_and_spark_quiet(tmp_path) -> None:
    """`--conf spark.driver.extraJavaOptions=…` goes after kafkatap's own JVM options instead of in their place.

    In their place it dropped the log4j configuration: Spark's default profile then logged to `analyze -q`'s
    empty stderr ("Using Spark's default log4j profile", "Setting default log level to "WARN"", WARN lines of
    Utils and NativeCodeLoader at every start, and any warning after). The JVM's -XX:+PrintCommandLineFlags
    (on stdout) shows kafkatap's JIT flags and the caller's option in the same JVM.
    """
    write_rows(tmp_path / "rec", "requests", [req("c1", 1, t_s=1)])
    p = subprocess.run([sys.executable, "-m", "kafkatap.cli", "analyze", str(tmp_path / "rec"), "--out", str(tmp_path / "out"),
                        "-q", "--conf", "spark.driver.extraJavaOptions=-Dfoo=bar -XX:+PrintCommandLineFlags"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stderr == ""
    flags = [line for line in p.stdout.splitlines() if "-XX:+PrintCommandLineFlags" in line]
    assert flags and "-XX:TieredStopAtLevel=1" in flags[0], p.stdout


def test_a_jvm_that_cannot_start_is_heard_before_kafkatap_speaks(tmp_path) -> None:
    """The JVM's stderr goes through kafkatap's relay: when the JVM fails, its own words still come first, in full."""
    write_rows(tmp_path / "rec", "requests", [req("c1", 1, t_s=1)])
    agent = tmp_path / "no-such-agent.jar"  # the JVM says so on stderr, then exits
    p = subprocess.run([sys.executable, "-m", "kafkatap.cli", "analyze", str(tmp_path / "rec"), "--out", str(tmp_path / "out"),
                        "-q", "--conf", f"spark.driver.extraJavaOptions=-javaagent:{agent}"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 1, p.stderr[-2000:]
    lines = p.stderr.splitlines()
    ours = [i for i, line in enumerate(lines) if line.startswith("Error: Spark's JVM did not start (its own message is above)")]
    jvm = [i for i, line in enumerate(lines) if str(agent) in line]
    assert ours and jvm and jvm[-1] < ours[0], p.stderr
