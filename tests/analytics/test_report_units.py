"""The report's small formatting rules, without Spark: durations, axes in one unit, time ticks, headers, zero charts."""

from __future__ import annotations

import datetime as dt
import re

from analytics.report.html import _c_bars, _c_errors_over_time, _cell, header, human_duration, table_html
from analytics.report.svg import fmt_num, line_chart, scaled_ticks, time_label, time_ticks

T0 = dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.timezone.utc)


def test_durations_are_said_as_people_say_them() -> None:
    assert human_duration(16.2) == "16 s"
    assert human_duration(0.35) == "350 ms"
    assert human_duration(4.25) == "4.2 s"
    assert human_duration(725) == "12 min 5 s"
    assert human_duration(7200) == "2 h"
    assert human_duration(3 * 86400 + 7200) == "3 d 2 h"


def test_byte_axes_use_one_unit_and_no_exponents() -> None:
    ticks, labels = scaled_ticks(2000, "B/s")
    assert labels == ["0", "0.5 KiB/s", "1 KiB/s", "1.5 KiB/s", "2 KiB/s"]
    assert ticks[-1] == 2048
    assert {lab.split()[-1] for lab in scaled_ticks(3.5 * 2**20, "B")[1][1:]} == {"MiB"}
    assert fmt_num(1000, "B/s") == "1000 B/s" and "e+" not in fmt_num(999.9, "B")
    assert scaled_ticks(1_500_000, "µs")[1][-1] == "1.5 s"
    assert scaled_ticks(3, "", integer=True)[0] == [0, 1, 2, 3]  # counts: whole numbers only


def test_time_ticks_never_repeat_a_label() -> None:
    x0 = T0.timestamp()
    for span in (3, 16, 90, 700, 5000, 90000):
        ticks = time_ticks(x0, x0 + span)
        step = ticks[1] - ticks[0] if len(ticks) > 1 else 1
        labels = [time_label(t, step, span) for t in ticks]
        assert len(labels) == len(set(labels)) >= 2, (span, labels)
        assert all(x0 <= t <= x0 + span for t in ticks)


def test_errors_over_time_are_bars_per_bucket() -> None:
    rows = [{"bucket": T0 + dt.timedelta(seconds=s), "error_name": "NOT_LEADER_OR_FOLLOWER", "count": c}
            for s, c in ((0, 3), (1, 1), (5, 2))]
    svg = _c_errors_over_time(rows, 1)
    assert svg.count("<rect") >= 3 and "<path" not in svg  # bars, not a line drawn between counts
    assert "errors per 1 s" in svg
    steps = [{"bucket": T0, "error_name": "MEMBER_ID_REQUIRED", "kind": "protocol_step", "count": 40}]
    assert "<svg" not in _c_errors_over_time(steps, 1)  # protocol steps are not errors: nothing to chart
    mixed = _c_errors_over_time(steps + [{**rows[0], "kind": "retriable"}], 1)
    assert "<svg" in mixed and "MEMBER_ID_REQUIRED" not in mixed and "NOT_LEADER_OR_FOLLOWER" in mixed


def test_charts_of_zeros_are_left_out_with_a_note() -> None:
    chart = _c_bars("topic", {"records_per_s": "records/s"})
    assert "<svg" not in chart([{"topic": "a", "records_per_s": 0}, {"topic": "b", "records_per_s": None}], 60)
    assert "every value in it is zero" in chart([{"topic": "a", "records_per_s": 0}], 60)
    assert "<svg" in chart([{"topic": "a", "records_per_s": 2}], 60)
    flat = line_chart([T0, T0 + dt.timedelta(seconds=1)], {"x": [1, 2]}, "B/s", y_label="bytes/s")
    assert "bytes/s" in flat and "e+" not in flat


def test_tables_have_human_headers_ms_and_no_internal_columns() -> None:
    assert header("p99_us") == "p99 (ms)" and header("client_id") == "client id" and header("median_lifetime_s") == "median lifetime (s)"
    assert _cell(12_345, "latency_us") == ("12.3", True)  # µs shown as ms, like the charts
    html = table_html("t", [{"bin": 3, "api_name": "Fetch", "p99_us": 250_000, "example_conn_id": "c7", "topics": list("abcdef")}],
                      links=frozenset({"c7"}))
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", html)
    assert heads == ["API", "p99 (ms)", "example connection", "topics"]
    assert ">250.0<" in html and '<a href="connections/c7.html">c7</a>' in html
    assert "a, b, c +3 more" in html  # long lists do not make tall rows


def test_drilled_connections_are_the_referenced_ones_examples_first_and_capped() -> None:
    import pyarrow as pa

    from analytics.job import referenced_connections

    tables = {
        "slowest_requests": pa.table({"conn_id": [f"s{i}" for i in range(50)]}),
        "connection_ends": pa.table({"example_conn_id": ["e1", "e2"]}),  # a connection_* table that points at one
        "errors_by_name": pa.table({"example_conn_id": ["e3", None]}),
        "connection_facts": pa.table({"conn_id": ["old"]}),  # the drill-down's own result: not a reference
    }
    ids = referenced_connections(tables, cap=10)
    assert ids[:3] == ["e1", "e2", "e3"] and len(ids) == 10 and "old" not in ids
    assert ids[3:6] == ["s0", "s1", "s2"]


def test_broker_addresses_carry_their_node_id() -> None:
    from analytics.report.html import node_ids

    nodes = node_ids([{"address": "10.0.0.1:9092", "node_id": 1, "last_seen": T0},
                      {"address": "10.0.0.2:9092", "node_id": 7, "last_seen": T0},
                      {"address": "10.0.0.2:9092", "node_id": 2, "last_seen": T0 + dt.timedelta(seconds=5)}])
    assert nodes == {"10.0.0.1:9092": 1, "10.0.0.2:9092": 2}  # a replaced broker: the latest node
    html = table_html("x", [{"broker_addr": "10.0.0.2:9092", "told_by": ["10.0.0.1:9092", "10.9.9.9:1"]}], nodes=nodes)
    assert "10.0.0.2:9092 (node 2)" in html and "10.0.0.1:9092 (node 1), 10.9.9.9:1<" in html
    assert "(node" not in table_html("x", [{"broker_addr": "10.0.0.2:9092"}])


def test_a_single_point_is_drawn_as_a_dot() -> None:
    """A bare move (`d="M84.0,30.0"`) draws nothing: a one-request recording had 6 of its 8 charts blank."""
    one = line_chart([T0], {"p99": [5000]}, "µs", right={"requests": [3]})
    assert one.count('<circle cx="615.0"') == 2  # each series, in the middle of the chart (84 + (1230 - 2 × 84) / 2)
    assert ">09:00:00<" in one  # under its time label
    gaps = line_chart([T0 + dt.timedelta(seconds=s) for s in range(5)], {"x": [1, None, 2, 3, None]})
    assert gaps.count("<circle") == 1  # the point between gaps; the 2-3 segment is a line
    assert "<circle" not in line_chart([T0, T0 + dt.timedelta(seconds=1)], {"x": [1, 2]})


def test_a_report_of_nothing_says_so_in_its_title() -> None:
    """Filters that matched nothing titled the page 'kafkatap report —  to '."""
    from pathlib import Path

    from analytics.report.html import render
    from analytics.result import AnalysisResult

    page = render(AnalysisResult(Path("out"), [], {}, {}, 60, Path("r.html"), Path("f.json"), {}))
    assert "<title>kafkatap report — no data</title>" in page


def test_bars_of_negative_values_grow_left_of_zero_in_the_values_own_unit() -> None:
    """A swapped A/B (or a slower replay target) gave every bar 0.5 px on an axis of 0-1 µs, labelled '-21515 µs'."""
    from analytics.report.svg import bar_chart

    svg = bar_chart(["Produce", "Fetch"], {"A − B": [-21_515, -20_710]}, unit="µs", title="t")
    ticks = re.findall(r'class="tick"[^>]*>([^<]*)<', svg)
    assert ticks[0] == "0" and ticks[-1] == "−25 ms"
    assert re.findall(r'class="value"[^>]*>([^<]*)<', svg) == ["-21.5 ms", "-20.7 ms"]
    widths = [float(w) for w in re.findall(r'<rect x="[0-9.]+" y="[0-9.]+" width="([0-9.]+)"', svg)]
    assert min(widths) > 100  # drawn to scale, not the 0.5 px floor
    both = bar_chart(["Produce", "Fetch"], {"A − B": [21_515, -2_000]}, unit="µs", title="t")
    assert "−25 ms" in both and "25 ms" in both
