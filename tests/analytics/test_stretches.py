"""A recording directory reused across sessions: two proxy runs three hours apart, read as one recording.

The audit's case: a storm of reconnects in a few minutes of an earlier session, and a second session
hours later. The report lists the runs and the stretches, says that rates over the span mix them, and
a client's reconnect rate counts only the time some run was recording.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from analytics.findings import run_rules
from analytics.job import run_analysis, summary
from analytics.report.html import render
from analytics.result import AnalysisResult
from analytics.synthetic import write_rows
from analytics.load import one_row_per_connection
from analytics.transforms import connections
from analytics.transforms.common import literal_rows
from analytics.transforms.stretches import (GAP_MIN_S, NO_CLEAN_STOP, NO_RUN_ROWS, TAIL_S, RunSpan, collect_spans, merged,
                                            proxy_runs, rate_seconds, recording_stretches, windowed)
from analytics_rows import S, T0, conn, req

pytestmark = pytest.mark.spark

LATER_S = 3 * 3600  # the second session starts three hours after the first


def mark(run: str, event: str, t_s: float, pid: int) -> dict[str, Any]:
    return {"proxy_id": "p1", "run": run, "event": event, "ts_ns": T0 + int(t_s * S), "pid": pid, "version": "9.9"}


def two_sessions() -> tuple[list[dict], list[dict]]:
    """Run a1a1a1 (0–200 s, clean stop): app-1 reconnects every 6 s for 3 minutes. Run b2b2b2 (from 3 h, no
    stop row): app-1 reconnects every 6 s for a minute."""
    cs = [conn(f"a1a1a1-{k}", 6 * k, 6 * k + 1, end_reason="broker_rst", end_by="broker") for k in range(30)]
    cs += [conn(f"b2b2b2-{k}", LATER_S + 6 * k, LATER_S + 6 * k + 1, end_reason="broker_rst", end_by="broker")
           for k in range(10)]
    marks = [mark("a1a1a1", "start", 0, 100), mark("a1a1a1", "stop", 200, 100), mark("b2b2b2", "start", LATER_S, 200)]
    return cs, marks


def test_the_reconnect_rate_is_over_the_recorded_time_not_the_gap(make_df) -> None:
    cs, marks = two_sessions()
    conns = one_row_per_connection(make_df("connections", cs), marks)
    row = connections.reconnects_by_client(conns).collect()[0].asDict()
    recorded_min = (200 + (6 * 9 + 1)) / 60  # run a1a1a1 from its start to its stop, app-1's last minute in b2b2b2
    assert row["reconnects"] >= 35
    assert row["reconnects_per_min"] == pytest.approx(row["reconnects"] / recorded_min, rel=1e-3)
    # over the span it was ~0.2/min: three hours of no proxy recording counted as the client being quiet
    assert row["reconnects_per_min"] > 5


def test_the_inventory_and_topic_rates_are_over_the_recorded_time_not_the_gap(make_df) -> None:
    """app-1 produced 10 records a second and fetched in both sessions; divided by the three hours between them
    it read as a trickle. Over the time the runs recorded (200 s of a1a1a1, 55 s of b2b2b2 here) it is a rate."""
    from analytics.transforms import clients, produce_fetch
    from analytics.transforms.common import prepare_requests
    from analytics.transforms.rollups import request_rollup, topic_rollup

    cs, marks = two_sessions()
    conns = one_row_per_connection(make_df("connections", cs), marks)
    spans = collect_spans(conns)
    times = [10 + k for k in range(0, 180)] + [LATER_S + k for k in range(0, 55)]  # one Produce and one Fetch each
    rows = [req(f"a1a1a1-{int(t) // 6}" if t < LATER_S else f"b2b2b2-{int(t - LATER_S) // 6}", 2 * i, t_s=t)
            for i, t in enumerate(times)]
    rows += [req(r["conn_id"], r["correlation_id"] + 1, api="Fetch", t_s=(r["req_first_ns"] - T0) / S) for r in rows]
    r = prepare_requests(make_df("requests", rows))
    # app-1's 10 s..LATER_S+54 s less the gap between the runs, from a minute after a1a1a1's end (TAIL_S) to b2b2b2
    recorded_s = 190 + TAIL_S + 54
    span_s = LATER_S + 54 - 10
    rate = produce_fetch.produce_rate_by_topic(topic_rollup(r), spans).collect()[0]
    assert rate["records_per_s"] == pytest.approx(len(times) * 10 / recorded_s, rel=1e-2)
    assert produce_fetch.produce_rate_by_topic(topic_rollup(r)).collect()[0]["records_per_s"] == pytest.approx(
        len(times) * 10 / span_s, abs=0.005)  # a caller without spans: first..last, as before
    fetch = produce_fetch.fetch_by_consumer(topic_rollup(r), spans).collect()[0]
    assert fetch["bytes_per_s"] == pytest.approx(len(times) * 400 / recorded_s, rel=1e-2)
    inv = clients.client_inventory(request_rollup(r), topic_rollup(r), conns, spans).collect()[0]
    assert inv["requests_per_s"] == pytest.approx(2 * len(times) / recorded_s, rel=1e-2)
    assert inv["records_produced_per_s"] == pytest.approx(len(times) * 10 / recorded_s, rel=1e-2)


def test_rate_seconds_subtract_only_the_gaps_between_stretches(spark) -> None:
    """A killed run's span ends at its last snapshot, its requests a little later: time after a run's end (up to
    TAIL_S, or after the last run) and before the first run is the client's own, and a restart is no gap."""
    spans = [span("a", 0, 200), span("b", LATER_S, LATER_S + 55)]
    cases = {  # first..last (s) -> seconds
        (10, LATER_S + 54): 190 + TAIL_S + 54,  # across the sessions: the gap from a minute after run a's end out
        (195, 230): 35,  # run a's tail, after its last sign of life: nothing subtracted
        (LATER_S + 50, LATER_S + 70): 20,  # past the last run
        (-30, 100): 130,  # before the first
        (1000, 1000.5): 1,  # a moment inside the gap: 1 s at least
    }
    rows = [(T0 + int(a * S), T0 + int(b * S)) for a, b in cases]
    df = spark.createDataFrame(rows, "first long, last long")
    got = [r[0] for r in df.select(rate_seconds(F.col("first"), F.col("last"), spans)).collect()]
    assert got == pytest.approx(list(cases.values()))
    restart = [span("a", 0, 200), span("b", 200 + GAP_MIN_S - 1, 900)]  # back within 5 minutes: one stretch
    assert df.select(rate_seconds(F.lit(T0), F.lit(T0 + 800 * S), restart)).first()[0] == pytest.approx(800)
    assert df.select(rate_seconds(F.lit(T0), F.lit(T0 + 800 * S), None)).first()[0] == pytest.approx(800)


def test_the_runs_and_stretches_tables(make_df) -> None:
    cs, marks = two_sessions()
    conns = one_row_per_connection(make_df("connections", cs), marks)
    runs = [r.asDict() for r in proxy_runs(make_df("runs", marks), conns).collect()]
    assert [(r["run"], r["pid"], r["version"], r["connections"]) for r in runs] == [
        ("a1a1a1", 100, "9.9", 30), ("b2b2b2", 200, "9.9", 10)]
    assert runs[0]["stopped"].endswith("09:03:20.000") and runs[1]["stopped"] == NO_CLEAN_STOP
    assert runs[1]["gap_before_s"] == LATER_S - 200
    stretches = [r.asDict() for r in recording_stretches(conns, 60).collect()]
    assert [(r["stretch"], r["duration_s"], r["gap_before_s"], r["connections_opened"], r["clients"]) for r in stretches] == [
        (1, 200.0, None, 30, 1), (2, 55.0, LATER_S - 200.0, 10, 1)]
    # the job collects the spans once and hands them to the three tables: the same rows
    spans = collect_spans(conns)
    assert [r.asDict() for r in recording_stretches(conns, 60, spans=spans).collect()] == stretches
    assert [r.asDict() for r in proxy_runs(make_df("runs", marks), conns, spans).collect()] == runs
    assert (connections.reconnects_by_client(conns, spans=spans).collect() == connections.reconnects_by_client(conns).collect())


def test_a_run_that_injected_tcp_faults_says_so_in_its_row_and_a_finding(make_df) -> None:
    """A delay, cap or close kafkatap injected (`proxy --fault`) is recorded as the traffic it shaped; only the run's
    start row said which, and nothing read it: the report read the injected latency as the network's or the broker's."""
    from analytics.findings import run_rules

    cs, marks = two_sessions()
    marks[0]["faults"] = "to_broker: latency 50 ms; to_client: none"  # run a1a1a1 injected; b2b2b2 did not
    conns = one_row_per_connection(make_df("connections", cs), marks)
    runs = [r.asDict() for r in proxy_runs(make_df("runs", marks), conns).collect()]
    assert [(r["run"], r["faults"]) for r in runs] == [("a1a1a1", "to_broker: latency 50 ms; to_client: none"),
                                                      ("b2b2b2", None)]
    found = [f for f in run_rules({"proxy_runs": runs}) if f.id == "tcp_faults_injected"]
    assert len(found) == 1 and found[0].severity == "warning"
    assert found[0].title == "1 of the 2 proxy runs injected TCP faults: to_broker: latency 50 ms; to_client: none"
    assert found[0].examples == [{"proxy_id": "p1", "run": "a1a1a1", "started": runs[0]["started"],
                                  "stopped": runs[0]["stopped"], "faults": "to_broker: latency 50 ms; to_client: none"}]
    runs[1]["faults"] = "idle reset after 30 s"
    assert run_rules({"proxy_runs": runs}, only=["tcp_faults_injected"])[0].title == (
        "Every proxy run injected TCP faults: idle reset after 30 s (and 1 other setting(s))")
    assert run_rules({"proxy_runs": runs[1:]}, only=["tcp_faults_injected"])[0].title == (
        "The proxy run injected TCP faults: idle reset after 30 s")
    assert not run_rules({"proxy_runs": [dict(r, faults=None) for r in runs]}, only=["tcp_faults_injected"])


def test_a_recording_without_runs_rows_is_placed_by_its_connections(make_df) -> None:
    cs, _ = two_sessions()
    conns = make_df("connections", cs)
    runs = [r.asDict() for r in proxy_runs(make_df("runs", []), conns).collect()]
    assert [(r["run"], r["started"], r["stopped"]) for r in runs] == [("a1a1a1", None, NO_RUN_ROWS), ("b2b2b2", None, NO_RUN_ROWS)]
    assert [r.duration_s for r in recording_stretches(conns, 60).collect()] == [175.0, 55.0]


def test_a_restart_minutes_later_is_one_stretch(make_df) -> None:
    """A gap under stretch_gap_s (5 min at least) is a restart, not another session: no notice."""
    cs = [conn("a1a1a1-1", 0, 100), conn("b2b2b2-1", 160, 400)]
    assert len(recording_stretches(make_df("connections", cs), 60).collect()) == 1


def test_the_notice_leads_the_findings_summary_and_report(make_df) -> None:
    cs, marks = two_sessions()
    conns = one_row_per_connection(make_df("connections", cs), marks)
    tables = {"recording_stretches": [r.asDict() for r in recording_stretches(conns, 60).collect()]}
    found = [f for f in run_rules(tables) if f.id == "separate_stretches"]
    assert len(found) == 1 and found[0].severity == "warning"
    assert "2 separate stretches" in found[0].title and "--since/--until" in found[0].title
    assert "2026-11-20 09:00:00 UTC" in found[0].title and "2026-11-20 12:00:00 UTC" in found[0].title
    result = AnalysisResult(Path("out"), found, {}, tables, 60, Path("r.html"), Path("f.json"), {})
    assert "Note: this recording holds 2 separate stretches" in summary(result)
    assert 'id="stretches-notice"' in render(result)
    assert not [f for f in run_rules({"recording_stretches": tables["recording_stretches"][:1]})
                if f.id == "separate_stretches"]


def test_an_analysis_of_a_reused_directory(spark, tmp_path: Path) -> None:
    """The two sessions written as a recording and analyzed as an operator would: runs, stretches, notice, rate."""
    cs, marks = two_sessions()
    rec = tmp_path / "rec"
    write_rows(rec, "connections", cs)
    write_rows(rec, "runs", marks)
    write_rows(rec, "requests", [req("a1a1a1-3", 1, t_s=19), req("b2b2b2-3", 1, t_s=LATER_S + 19)])
    res = run_analysis([rec], tmp_path / "out", spark=spark, progress=False)
    assert [(r["run"], r["stopped"] == NO_CLEAN_STOP) for r in res.tables["proxy_runs"]] == [("a1a1a1", False), ("b2b2b2", True)]
    assert [r["gap_before_s"] for r in res.tables["recording_stretches"]] == [None, LATER_S - 200.0]
    assert len(res.by_id("separate_stretches")) == 1
    assert res.tables["reconnects_by_client"][0]["reconnects_per_min"] > 5
    assert "separate stretches" in summary(res) and 'id="stretches-notice"' in res.report_path.read_text()


def span(run: str, start_s: float, end_s: float) -> RunSpan:
    return RunSpan("p1", f"p1/{run}", T0 + int(start_s * S), T0 + int(end_s * S), 1)


def test_spans_merge_across_gaps_up_to_the_bridge_and_are_cut_to_the_window() -> None:
    spans = [span("c", 1000, 1100), span("a", 0, 100), span("b", 50, 200)]
    assert [(x.start_ns, x.end_ns, x.runs) for x in merged(spans, 0)] == [
        (T0, T0 + 200 * S, ("p1/a", "p1/b")), (T0 + 1000 * S, T0 + 1100 * S, ("p1/c",))]
    assert len(merged(spans, 800 * S)) == 1 and len(merged(spans, 799 * S)) == 2  # a gap of exactly the bridge is bridged
    cut = windowed(spans, T0 + 150 * S, T0 + 1050 * S)
    assert sorted((x.run, x.start_ns - T0, x.end_ns - T0) for x in cut) == [
        ("p1/b", 150 * S, 200 * S), ("p1/c", 1000 * S, 1050 * S)]  # run a ended before the window: dropped
    assert windowed(spans, None, None) == spans
    assert [(x.run, x.start_ns - T0) for x in windowed(spans, T0 + 150 * S, None)] == [("p1/c", 1000 * S), ("p1/b", 150 * S)]
    assert [x.run for x in windowed(spans, None, T0 + 60 * S)] == ["p1/a", "p1/b"]


def test_literal_rows_are_typed_rows_without_a_job_of_their_own(spark) -> None:
    cols = (("n", "int"), ("at", "timestamp"), ("names", "array<string>"), ("x", "bigint"))
    df = literal_rows(spark, cols, [(1, None, ["a"], 2**40), (2, None, [], None)])
    assert [f.dataType.simpleString() for f in df.schema.fields] == ["int", "timestamp", "array<string>", "bigint"]
    assert [tuple(r) for r in df.collect()] == [(1, None, ["a"], 2**40), (2, None, [], None)]
    assert literal_rows(spark, cols, []).count() == 0
    assert "LogicalRDD" not in df._jdf.queryExecution().optimizedPlan().toString()
