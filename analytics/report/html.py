"""Render the report: findings first, then one section per subject, each chart above its table."""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from analytics.findings import INCIDENTS_DOC, Finding, incident_ref
from analytics.findings.stretches import stretches_notice
from analytics.report.svg import all_zero, bar_chart, fmt_num, line_chart, time_bars
from analytics.result import AnalysisResult
from protocol.error_kinds import PROTOCOL_STEP

Rows = list[dict[str, Any]]
SHOW_ROWS = 25

CSS = """
:root{--bg:#f6f7f9;--card:#fff;--ink:#1f2937;--mute:#6b7280;--line:#e5e7eb;--crit:#dc2626;--warn:#d97706;--info:#2563eb}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;background:var(--bg);color:var(--ink)}
header{background:#111827;color:#f9fafb;padding:18px 32px}header h1{margin:0;font-size:20px}header .sub{color:#9ca3af;font-size:13px;margin-top:4px}
nav{position:sticky;top:0;z-index:2;background:#1f2937;padding:6px 32px;display:flex;gap:14px;flex-wrap:wrap}
nav a{color:#d1d5db;text-decoration:none;font-size:13px}nav a:hover{color:#fff}
main{max-width:1320px;margin:0 auto;padding:20px 24px 60px}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:10px;margin:8px 0 20px}
.tile{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px}.tile b{display:block;font-size:20px}.tile span{color:var(--mute);font-size:12px}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 20px;margin:18px 0}
section h2{margin:0 0 4px;font-size:18px}section h3{margin:18px 0 6px;font-size:15px}.intro{color:var(--mute);margin:0 0 8px}
.finding{border-left:5px solid var(--info);background:#fff;border-radius:8px;border:1px solid var(--line);border-left-width:5px;padding:10px 14px;margin:10px 0}
.finding.critical{border-left-color:var(--crit)}.finding.warning{border-left-color:var(--warn)}
.finding h3{margin:0 0 4px;font-size:15px}.finding p{margin:4px 0}.badge{display:inline-block;font-size:11px;font-weight:600;text-transform:uppercase;padding:1px 7px;border-radius:10px;margin-right:6px;color:#fff;background:var(--info)}
.badge.critical{background:var(--crit)}.badge.warning{background:var(--warn)}.inc{color:var(--mute);font-size:12px}
.finding details{margin-top:4px}.finding summary{cursor:pointer;color:var(--mute);font-size:12px}
table{border-collapse:collapse;width:100%;font-size:12.5px;margin:0}th,td{padding:3px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:#f3f4f6;position:sticky;top:0;font-weight:600;vertical-align:bottom;overflow-wrap:normal;hyphens:none}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td{max-width:260px;overflow-wrap:break-word}header a{color:#93c5fd}td .c{display:-webkit-box;-webkit-line-clamp:2;-webkit-box-orient:vertical;overflow:hidden}
td a{color:var(--info)}td.t{white-space:nowrap;font-variant-numeric:tabular-nums}h4{margin:12px 0 2px;font-size:13px;font-weight:600;color:#374151}
.tablewrap{max-height:420px;overflow:auto;border:1px solid var(--line);border-radius:6px;margin:6px 0}
.note{color:var(--mute);font-size:12px}.empty{color:var(--mute);font-style:italic}
svg.chart{display:block;margin:6px 0 4px;background:#fff}svg .grid{stroke:#eef0f3}svg .axis{stroke:#9ca3af}
svg .tick{font-size:10.5px;fill:#6b7280}svg .axislabel{font-size:11px;fill:#4b5563}svg .label{font-size:11.5px;fill:#374151}svg .value{font-size:10.5px;fill:#374151}svg .legend{font-size:11.5px;fill:#374151}
code{background:#f3f4f6;padding:0 4px;border-radius:4px}
"""


# Column headers people read (a generic rule covers the rest: snake_case → words, `_us` → "(ms)")
HEADERS: dict[str, str] = {
    "conn_id": "connection", "example_conn_id": "example connection", "client_id": "client id", "client_host": "client host",
    "broker_addr": "broker", "client_addr": "client address", "api_name": "API", "api_label": "API", "api_version": "version",
    "correlation_id": "correlation id", "requests_per_s": "requests/s", "records_per_s": "records/s",
    "records_produced_per_s": "records produced/s", "bytes_per_s": "bytes/s",
    "error_name": "error", "error_code": "code", "group_or_resource": "group / resource", "p50_us": "p50 (ms)",
    "p90_us": "p90 (ms)", "p99_us": "p99 (ms)", "p999_us": "p99.9 (ms)", "max_us": "max (ms)", "mean_us": "mean (ms)",
    "latency_us": "latency (ms)", "broker_latency_us": "broker latency (ms)", "bytes_sent": "bytes client → broker",
    "bytes_received": "bytes broker → client", "bytes_from_client": "bytes client → broker",
    "bytes_from_broker": "bytes broker → client", "request_bytes": "request bytes", "response_bytes": "response bytes",
    "software_name": "software", "software_version": "software version", "idle_before_end_ms": "idle before end (ms)",
    "acks_label": "setting", "empty_ratio": "empty share", "long_poll_ratio": "long-poll share", "at": "time", "last_api": "last API",
    "end_reason": "end", "end_by": "ended by", "inferred_cause": "likely cause", "first_seen": "first seen",
    "last_seen": "last seen", "bytes_to_broker_per_s": "client → broker bytes/s", "bytes_to_client_per_s": "broker → client bytes/s",
}
# internal columns (sort keys, raw epoch ns, proxy ids that are the same everywhere) are in tables/*.csv, not on screen
HIDDEN = ("bin", "closed_ns", "example_ts_ns", "proxy_id", "seq", "first_ns", "last_ns", "ts_ns", "opened_ns", "snapshot_ns")
MAX_COLUMNS = 11  # wider tables show their first columns; the rest are in tables/NAME.csv (named under the table)
RATIOS = ("empty_ratio", "long_poll_ratio", "error_rate", "retriable_rate")


def header(col: str) -> str:
    """A human column header: known names from HEADERS, else words, with µs columns shown in ms."""
    if col in HEADERS:
        return HEADERS[col]
    words = col
    if words.endswith("_us"):
        words = words[:-3] + " (ms)"
    elif words.endswith("_ms"):
        words = words[:-3] + " (ms)"
    elif words.endswith("_per_s"):
        words = words[:-6] + "/s"
    elif words.endswith("_s"):
        words = words[:-2] + " (s)"
    return words.replace("_", " ")


def _cell(v: Any, col: str = "") -> tuple[str, bool]:
    """(text, is_number) of one value as shown in a table: µs as ms, ratios as %, long lists shortened."""
    if v is None:
        return "", False
    if isinstance(v, bool):
        return ("yes" if v else "no"), False
    if col.endswith("_us") and isinstance(v, (int, float)):
        ms = v / 1000
        return (f"{ms:,.3f}" if abs(ms) < 10 else f"{ms:,.1f}" if abs(ms) < 1000 else f"{ms:,.0f}"), True
    if col in RATIOS and isinstance(v, (int, float)):
        return f"{v:.1%}", True
    if isinstance(v, int):
        return f"{v:,}", True
    if isinstance(v, float):
        return (f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:,.0f}"), True
    if isinstance(v, dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S"), False
    if isinstance(v, (list, tuple)):
        items = ["" if x is None else str(x) for x in v]
        s = ", ".join(items[:3]) + (f" +{len(items) - 3} more" if len(items) > 3 else "")
        return s, False
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items()), False
    return str(v), False


def human_duration(seconds: float) -> str:
    """16 s, 850 ms, 12 min 5 s, 3 h 20 min, 2 d 4 h: the units an operator says out loud."""
    s = float(seconds or 0)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s" if s < 10 and s != int(s) else f"{s:.0f} s"
    if s < 3600:
        m, r = divmod(round(s), 60)
        return f"{m} min {r} s" if r else f"{m} min"
    if s < 86400:
        h, r = divmod(round(s / 60), 60)
        return f"{h} h {r} min" if r else f"{h} h"
    d, r = divmod(round(s / 3600), 24)
    return f"{d} d {r} h" if r else f"{d} d"


def conn_page(conn_id: str) -> str:
    """Where a connection's drill-down page is, relative to report.html."""
    return "connections/" + re.sub(r"[^A-Za-z0-9._-]", "_", conn_id) + ".html"


BROKER_COLUMNS = frozenset({"broker_addr", "told_by", "brokers"})  # cells that name brokers by address


def node_ids(rows: Rows) -> dict[str, int]:
    """address -> node id from the `brokers` table (the latest node an address was said to be)."""
    latest: dict[str, tuple[Any, int]] = {}
    for r in rows:
        seen = r.get("last_seen")
        if r["address"] not in latest or (seen is not None and latest[r["address"]][0] is not None
                                          and seen > latest[r["address"]][0]):
            latest[r["address"]] = (seen, r["node_id"])
    return {a: n for a, (_, n) in latest.items()}


def with_node(text: str, nodes: dict[str, int]) -> str:
    """ "host:port" -> "host:port (node N)" when the node is known; lists are labelled item by item."""
    return ", ".join(f"{a} (node {nodes[a]})" if a in nodes else a for a in text.split(", "))


def table_html(name: str, rows: Rows, limit: int = SHOW_ROWS, hide: tuple[str, ...] = HIDDEN,
               links: frozenset[str] = frozenset(), prefix: str = "", columns: Sequence[str] | None = None,
               nodes: dict[str, int] | None = None) -> str:
    """A table with human headers; conn ids with a drill-down page are links; very wide tables show their first columns.

    `nodes` (address -> node id) puts the node id beside every broker address.
    """
    if not rows:
        return '<p class="empty">no rows</p>'
    visible = [c for c in (columns or rows[0].keys()) if c not in hide]
    cols = visible[:MAX_COLUMNS]
    head = "".join(f'<th title="{escape(c)}">{escape(header(c))}</th>' for c in cols)
    body = []
    for r in rows[:limit]:
        cells = []
        for c in cols:
            v = r.get(c)
            text, num = _cell(v, c)
            if nodes and c in BROKER_COLUMNS and text:
                text = with_node(text, nodes)
            full = _cell(v)[0] if isinstance(v, (list, tuple)) else text
            tip = f' title="{escape(full)}"' if len(full) > 24 else ""
            if c in ("conn_id", "example_conn_id") and isinstance(v, str) and v in links:
                inner = f'<a href="{escape(prefix + conn_page(v))}">{escape(text)}</a>'
            else:
                inner = escape(text)
            if num:
                cells.append(f'<td class="n"{tip}>{inner}</td>')
            elif isinstance(v, dt.datetime):
                cells.append(f'<td class="t">{inner}</td>')
            else:
                cells.append(f'<td{tip}><div class="c">{inner}</div></td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f" — showing {limit}" if len(rows) > limit else ""
    rest = [c for c in visible if c not in cols]
    extra = f"; {len(rest)} more column(s) ({', '.join(header(c) for c in rest)}) in the file" if rest else ""
    where = f"; full table: <code>tables/{escape(name)}.csv</code> / <code>.parquet</code>" if name else ""
    return (f'<div class="tablewrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
            f'<p class="note">{len(rows):,} row(s){more}{escape(extra)}{where}</p>')


def _top(rows: Rows, key: str, n: int = 15) -> Rows:
    return sorted(rows, key=lambda r: -(r.get(key) or 0))[:n]


ZERO_NOTE = '<p class="note">Chart left out: every value in it is zero.</p>'


# ---- charts per table: each takes the table's rows and the time bucket, returns SVG (or a one-line note)

Chart = Callable[[Rows, int], str]


def _c_bars(label: str, cols: dict[str, str], unit: str = "", sort: str | None = None, n: int = 15,
            axis: str = "") -> Chart:
    """Bars of the table's first rows (its own order, so chart and table agree) or of the top rows by `sort`."""
    def chart(rows: Rows, bucket_s: int) -> str:
        rs = _top(rows, sort, n) if sort else rows[:n]
        series = {title: [r.get(col) for r in rs] for col, title in cols.items()}
        if all_zero(series):
            return ZERO_NOTE
        labels = [" · ".join(str(r.get(p) or "") for p in label.split("+")) for r in rs]
        return bar_chart(labels, series, unit, axis_label=axis)
    return chart


def _c_latency_over_time(rows: Rows, bucket_s: int) -> str:
    by: dict[str, dict] = defaultdict(dict)
    totals: dict[str, int] = defaultdict(int)
    for r in rows:
        by[r["api_name"]][r["bucket"]] = r
        totals[r["api_name"]] += r.get("count") or 0
    xs = sorted({r["bucket"] for r in rows})
    series: dict[str, list] = {}
    if "(all)" in by:
        series["all p50"] = [by["(all)"].get(x, {}).get("p50_us") for x in xs]
        series["all p99"] = [by["(all)"].get(x, {}).get("p99_us") for x in xs]
    for api in sorted((a for a in by if a != "(all)"), key=lambda a: -totals[a])[:3]:
        series[f"{api} p99"] = [by[api].get(x, {}).get("p99_us") for x in xs]
    return ZERO_NOTE if all_zero(series) else line_chart(xs, series, "µs", y_label="latency")


def _c_conns_over_time(rows: Rows, bucket_s: int) -> str:
    by: dict[str, Rows] = defaultdict(list)
    for r in rows:
        by[r["broker_addr"]].append(r)
    parts = []
    for broker, rs in sorted(by.items()):
        rs.sort(key=lambda r: r["bucket"])
        xs = [r["bucket"] for r in rs]
        parts.append(f"<h4>{escape(broker)}: open connections (solid) and p99 latency (dashed)</h4>")
        parts.append(line_chart(xs, {"open connections (most at once)": [r.get("peak_concurrent", r.get("concurrent")) for r in rs], "opens": [r.get("opens") for r in rs]},
                                "", right={"p99 latency": [r.get("p99_us") for r in rs]}, right_unit="µs",
                                y_label="connections", right_label="p99 latency", height=220))
    return "".join(parts[:16])


def _not_steps(rows: Rows) -> Rows:
    """The rows of the broker's errors and retriable ones: protocol steps and errors kafkatap injected (a Kafka fault:
    the faults section tells them) stay in the tables, out of the error charts."""
    return [r for r in rows if r.get("kind") != PROTOCOL_STEP and not r.get("injected")]


def _without_steps(chart: Callable[[Rows, int], str]) -> Callable[[Rows, int], str]:
    """`chart` drawn from `_not_steps` of its rows."""
    return lambda rows, bucket_s: chart(_not_steps(rows), bucket_s)


def _c_errors_over_time(rows: Rows, bucket_s: int) -> str:
    """Errors and retriable errors per bucket, the six most frequent names; protocol steps are not errors."""
    rows = _not_steps(rows)
    xs = sorted({r["bucket"] for r in rows})
    tot: dict[str, int] = defaultdict(int)
    m: dict[tuple, int] = defaultdict(int)
    for r in rows:
        tot[r["error_name"]] += r["count"]
        m[(r["error_name"], r["bucket"])] += r["count"]
    names = sorted(tot, key=lambda n: -tot[n])[:6]
    series = {n: [m.get((n, x), 0) for x in xs] for n in names}
    if not xs or all_zero(series):
        return ZERO_NOTE
    return time_bars(xs, series, bucket_s, y_label=f"errors per {human_duration(bucket_s)}")


def _c_ceiling(rows: Rows, bucket_s: int) -> str:
    rs = rows[:15]
    return bar_chart([f"{r['conn_id']} ({r.get('side')})" for r in rs],
                     {"64 KiB / RTT ceiling": [r.get("ceiling_bytes_per_s") for r in rs],
                      "peak moved": [r.get("peak_bytes_per_s") for r in rs],
                      "average moved": [r.get("avg_bytes_per_s") for r in rs]}, "B/s", axis_label="bytes per second")


def _c_tcp_health(rows: Rows, bucket_s: int) -> str:
    return bar_chart([r["side"] + " side" for r in rows], {
        "connections": [r.get("connections") for r in rows],
        "without window scaling": [r.get("without_window_scaling") for r in rows],
        "without timestamps": [r.get("without_timestamps") for r in rows],
        "without SACK": [r.get("without_sack") for r in rows]}, axis_label="sockets")


def _c_ends(rows: Rows, bucket_s: int) -> str:
    agg: dict[str, int] = defaultdict(int)
    for r in rows:
        agg[f"{r.get('end_reason')} by {r.get('end_by')}"] += r.get("connections") or 0
    items = sorted(agg.items(), key=lambda kv: -kv[1])
    return bar_chart([k for k, _ in items], {"connections": [v for _, v in items]}, axis_label="connections")


def _c_resets(rows: Rows, bucket_s: int) -> str:
    bins = [(0, 1, "< 1 s"), (1, 10, "1–10 s"), (10, 60, "10–60 s"), (60, 300, "1–5 min"), (300, 1800, "5–30 min"), (1800, 7200, "30 min–2 h"), (7200, 1e12, "> 2 h")]
    counts = {lab: [0, 0] for _, _, lab in bins}
    for r in rows:
        s = (r.get("idle_before_end_ms") or 0) / 1000
        for lo, hi, lab in bins:
            if lo <= s < hi:
                counts[lab][0 if r.get("end_by") != "broker" else 1] += 1
    return bar_chart(list(counts), {"not sent by the broker": [v[0] for v in counts.values()], "by the broker": [v[1] for v in counts.values()]},
                     axis_label="resets, by idle time before them")


def _c_throughput(rows: Rows, bucket_s: int) -> str:
    """Per topic and per client: bytes/s each way and records/s, one line per key (the busiest; the rest as "(others)")."""
    parts = []
    xs = sorted({r["bucket"] for r in rows})  # one time axis for every chart, so they line up
    for by, what in (("topic", "Per topic (record bytes; each topic's own share of a request naming several)"),
                     ("client", "Per client (whole requests and responses)")):
        rs = [r for r in rows if r.get("by") == by]
        if not rs:
            continue
        keys = sorted({r["key"] for r in rs}, key=lambda k: (k == "(others)", k))
        cell = {(r["key"], r["bucket"]): r for r in rs}
        for col, title, unit in (("bytes_to_broker_per_s", "client → broker", "B/s"),
                                 ("bytes_to_client_per_s", "broker → client", "B/s"),
                                 ("records_per_s", "records produced", "")):
            series = {k: [(cell.get((k, x)) or {}).get(col) or 0 for x in xs] for k in keys}
            if all_zero(series):
                parts.append(f'<p class="note">{escape(what)}, {escape(title)}: nothing in this recording.</p>')
                continue
            label = "bytes/s" if unit else "records/s"
            parts.append(f"<h4>{escape(what)}: {escape(title)} ({label})</h4>")
            parts.append(line_chart(xs, series, unit, y_label=label, height=220))
    return "".join(parts)


def throughput_summary(rows: Rows, bucket_s: int) -> Rows:
    """The throughput table as people read it: per topic/client, average and peak each way."""
    acc: dict[tuple[str, str], dict[str, Any]] = {}
    n = max(1, len({r["bucket"] for r in rows}))  # one span for every key: averages over the same time
    for r in rows:
        a = acc.setdefault((r["by"], r["key"]), {"by": r["by"], "key": r["key"], "to_b": 0.0, "to_c": 0.0, "rec": 0.0,
                                                 "peak_b": 0.0, "peak_c": 0.0})
        a["to_b"] += r.get("bytes_to_broker_per_s") or 0
        a["to_c"] += r.get("bytes_to_client_per_s") or 0
        a["rec"] += r.get("records_per_s") or 0
        a["peak_b"] = max(a["peak_b"], r.get("bytes_to_broker_per_s") or 0)
        a["peak_c"] = max(a["peak_c"], r.get("bytes_to_client_per_s") or 0)
    out = []
    for a in sorted(acc.values(), key=lambda a: (a["by"], -(a["to_b"] + a["to_c"]))):
        out.append({"by": a["by"], "key": a["key"], "avg client → broker": fmt_num(a["to_b"] / n, "B/s"),
                    "peak client → broker": fmt_num(a["peak_b"], "B/s"), "avg broker → client": fmt_num(a["to_c"] / n, "B/s"),
                    "peak broker → client": fmt_num(a["peak_c"], "B/s"), "records/s": round(a["rec"] / n, 2)})
    return out


SECTIONS: list[tuple[str, str, str, list[tuple[str, str, Chart | None]]]] = [
    ("clients", "Clients", f"Who talks to the brokers, in which role, how much — busiest (most requests) first (incident 3: {incident_ref(3)}).", [
        ("client_inventory", "Client inventory", _c_bars("client_id+role", {"requests": "requests"}, axis="requests in the analyzed span (the window, if given)")),
        ("topic_view", "Topics: who writes and who reads", _c_bars("topic", {"bytes_produced": "produced", "bytes_fetched": "fetched"}, "B", sort="bytes_produced", axis="record bytes")),
        ("group_protocols", "Groups and their protocol (classic / consumer / share / streams)", None),
        ("kafka_4_upgrade", "Clients sending request versions Kafka 4.0 removed (KIP-896): a 4.x broker closes their connections", None),
        ("brokers", "Brokers: node id, address and the proxy listeners they were reached through (from the Metadata answers relayed)", None),
    ]),
    ("throughput", "Throughput over time", "Bytes per second each way (client → broker, broker → client) and records produced per second, "
                                           "per topic and per client; the busiest are drawn, the rest summed as “(others)”.", [
        ("throughput_over_time", "Throughput", _c_throughput),
    ]),
    ("latency", "Latency", "Client-visible latency (first request byte read → last response byte written), in ms. Long-poll Fetches "
                            "(broker waited max_wait, returned nothing) are their own row and excluded from broker/topic/client views; "
                            "the proxy's own delay is shown separately.", [
        ("latency_by_api", "By API", _c_bars("api_label", {"p50_us": "p50", "p99_us": "p99"}, "µs", axis="latency")),
        ("slowest_requests", "Slowest requests (long polls excluded)", None),
        ("latency_over_time", "Over time (long polls excluded)", _c_latency_over_time),
        ("broker_latency_by_api", "Broker latency by API (request sent → first response byte)", None),
        ("latency_by_broker", "By broker", _c_bars("broker_addr", {"p50_us": "p50", "p99_us": "p99"}, "µs", axis="latency")),
        ("latency_by_api_version", "By API and version", None),
        ("latency_by_topic", "By topic", None),
        ("latency_by_client", "By client", None),
        ("proxy_delay_by_api", "Delay added by the proxy", _c_bars("api_name", {"p50_us": "p50", "p99_us": "p99"}, "µs", axis="delay added by the proxy")),
        ("long_polls_by_client", "Long-poll Fetches per consumer", None),
    ]),
    ("errors", "Errors and throttling", "Every non-zero error code by name × API × topic (or group / resource) × client, with an example connection. "
     "Kind: error; retriable (Kafka's clients retry it: normal in bursts, a problem when it lasts); protocol_step (how the "
     "protocol works, e.g. a first JoinGroup's MEMBER_ID_REQUIRED; not counted in the error rates). Injected: kafkatap's own "
     "(a Kafka fault), not the broker's: counted apart, in no error rate nor chart.", [
        ("errors_by_name", "Errors", _without_steps(_c_bars("error_name+api_name+client_id", {"count": "count"}, sort="count",
                                                            axis="occurrences"))),
        ("errors_over_time", "Errors over time", _c_errors_over_time),
        ("throttling", "Throttling (quota)", None),
    ]),
    ("faults", "Injected faults and how clients reacted", "Kafka faults kafkatap injected (the requests' `edit` column), grouped into "
                                                          "episodes (a client's injections on one API with no success between them), and what "
                                                          "each client did through each: time to recover after the first and the last "
                                                          "injection, retries, metadata refreshes, coordinator lookups, rebalances, reconnects, "
                                                          "duplicates — per client library.", [
        ("fault_reactions_by_library", "By client library (the comparison)", None),
        ("fault_reactions", "Every injected fault", None),
    ]),
    ("connections", "Connections", "Opens, ends and concurrency per broker with latency overlaid (incident 4); how and why connections end "
                                    f"(incidents 1 and 2; all three in {INCIDENTS_DOC}).", [
        ("bypass", "Broker addresses that sent clients around the proxy (explicit mode; use --cluster)", None),
        ("opaque_connections", "Connections relayed without decoding (TLS pass-through, not Kafka …)", None),
        ("connections_over_time", "Concurrency and latency over time, per broker", _c_conns_over_time),
        ("connection_ends", "How connections ended", _c_ends),
        ("connection_lifetimes", "Lifetimes", _c_bars("lifetime", {"connections": "connections"}, axis="connections")),
        ("resets", "Resets and the idle time before them", _c_resets),
        ("reconnects_by_client", "Reconnects per client", _c_bars("client_id", {"reconnects_per_min": "reconnects/min"}, sort="reconnects_per_min", axis="reconnects per minute")),
        ("broker_closes", "Connections closed by the broker (with the last request)", None),
        ("broker_outages", "Brokers unreachable (connects refused or timing out at the proxy)", None),
        ("unanswered_at_close", "Requests unanswered at close", None),
    ]),
    ("tcp", "TCP health", f"From TCP_INFO on the proxy's two sockets (incident 5: {incident_ref(5)}). Without window scaling a socket moves at most 64 KiB per round trip.", [
        ("tcp_health", "Negotiated options", _c_tcp_health),
        ("window_ceiling", "Sockets without window scaling: 64 KiB / RTT ceiling vs actual", _c_ceiling),
        ("tcp_rtt_by_peer", "RTT and retransmits by peer", _c_bars("side+peer", {"rtt_p50_us": "p50 RTT", "rtt_p99_us": "p99 RTT"}, "µs", sort="rtt_p99_us", axis="round-trip time")),
    ]),
    ("produce", "Produce and Fetch", "acks mix, batch sizes and codecs; records/s per topic; fetch rates and empty fetches per consumer.", [
        ("produce_acks", "acks mix", _c_bars("acks_label", {"requests": "requests"}, axis="Produce requests")),
        ("produce_rate_by_topic", "Records per second by topic", _c_bars("topic", {"records_per_s": "records/s"}, sort="records_per_s", axis="records per second")),
        ("produce_batches", "Produce request sizes by topic", None),
        ("produce_compression", "Compression", _c_bars("compression", {"requests": "requests"}, axis="Produce requests")),
        ("fetch_by_consumer", "Fetch by consumer and topic", _c_bars("client_id+topic", {"bytes_per_s": "bytes/s"}, "B/s", sort="bytes_per_s", axis="bytes per second, broker → client")),
    ]),
    ("runs", "Proxy runs and stretches of recording", "Each proxy process's run (from its runs/ start row to its clean "
     "stop or last sign of life) and the stretches of time they recorded, with the gaps between: a directory reused "
     "across sessions holds several, and rates over the whole span mix them (use --since/--until).", [
        ("recording_stretches", "Stretches of recording", None),
        ("proxy_runs", "Proxy runs", None),
    ]),
    ("compare", "Comparison A vs B", "Requests matched between two recordings; differences are A − B.", [
        ("compare_summary", "Matching", None),
        ("compare_by_api", "Latency difference by API", _c_bars("api_name", {"diff_p50_us": "A−B p50", "diff_p99_us": "A−B p99"}, "µs", axis="latency difference")),
        ("compare_by_connection", "Latency difference by connection", None),
        ("compare_errors", "Errors that differ", None),
        ("compare_ends", "How matched connections ended", None),
    ]),
]
# What the TCP tables count under --since/--until: the samples taken inside the window (analytics.transforms.tcp.tcp_sides)
TCP_WINDOW_NOTE = ("Window (--since/--until): every socket of a connection open at some time inside it; RTT from the "
                   "TCP_INFO samples taken inside it (the open's only if it opened inside it, the close's only if it "
                   "ended inside it), retransmits the counter's rise inside it (from its first sample there for a "
                   "connection already open at its start); options as negotiated at the open.")
# What a table of connections counts under --since/--until, said under its heading when the analysis had a window. The
# window is read as a recording of its own (analytics.transforms.window: as_at_window_end): it begins with the
# connections open at its start already open and ends with those open at its end still open. An operator reading a
# one-hour window of a week's recording asks about that hour, and these tables would otherwise cover whole lives. Tables
# of ends count the ends inside it; counts of connections that stand for "how many were there" count every connection
# open at some time inside it. "overview" is said under the tiles.
WINDOW_NOTES: dict[str, str] = {
    "overview": "Window (--since/--until): the span is where the data meets it; requests are those sent inside it, "
                "connections every one open at some time inside it (also the ones already open at its start or still "
                "open at its end).",
    "client_inventory": "Window (--since/--until): the requests each client sent inside it, at rates over its time "
                        "active there; connections are those that carried its requests inside it (one open all week "
                        "counts if it sent one in the window).",
    "opaque_connections": "Window (--since/--until): every undecoded connection open at some time inside it (also one "
                          "already open at its start or still open at its end: its traffic in the window is missing too), "
                          "last seen as at its end; bytes and requests decoded are the whole connection's.",
    "kafka_4_upgrade": "Window (--since/--until): every such connection open at some time inside it; the versions are "
                       "those each connection sent in its whole life.",
    "connections_over_time": "Window (--since/--until): its buckets only. A connection already open at its start is "
                             "concurrent from the first bucket, not one of its opens; one still open at its end is not an end.",
    "connection_ends": "Window (--since/--until): the connections that ended inside it, by how they ended; those still open "
                       "at its end (also the ones that ended after it) are the row open by none, with their age then as "
                       "lifetime. Ends before the window are not counted.",
    "connection_lifetimes": "Window (--since/--until): the connections that ended inside it, by their whole lifetime (from "
                            "their open, however long before the window); those still open at its end by their age then, "
                            "counted in still open.",
    "resets": "Window (--since/--until): the resets inside it. A connection reset after its end was still open then (the "
              "open row of How connections ended); one reset before it is not listed.",
    "reconnects_by_client": "Window (--since/--until): connections and reconnects opened inside it (a reconnect follows an "
                            "end of the client's earlier connection to that broker, inside the window too), resets and "
                            "broker closes that happened inside it, the rate per minute of the client's time inside it; "
                            "median lifetime as in Lifetimes.",
    "broker_closes": "Window (--since/--until): the connections the broker closed inside it; a close after its end is not "
                     "listed (the connection was still open then).",
    "broker_outages": "Window (--since/--until): the failed connects that ended inside it, and the broker's closes and "
                      "its return that it sees.",
    "unanswered_at_close": "Window (--since/--until): the connections that ended inside it with requests in flight (or "
                           "right after an acks=0 Produce the broker answered by closing), and those open at its end by "
                           "their last snapshot inside it; unanswered APIs are of the requests sent inside it.",
    "tcp_health": TCP_WINDOW_NOTE,
    "tcp_rtt_by_peer": TCP_WINDOW_NOTE,
    "window_ceiling": TCP_WINDOW_NOTE + " Average: a connection's bytes over its lifetime when all of it lies inside "
                      "the window, else the bytes its socket's samples inside it saw acknowledged over its time inside it; "
                      "peak: the socket's TCP_INFO samples inside it (and, on the broker side, responses to requests sent inside it).",
    "compare_ends": "Window (--since/--until): each side as at the end of its own window, so the ends compared are those "
                    "inside it; a connection that ended after it is open by none there.",
    # the drill-down: the section listing the pages, and each page (connection_page)
    "connection_facts": "Window (--since/--until): each connection's whole life (its open and end, however far outside the "
                        "window, and its counts); its requests and TCP_INFO samples on its page are those inside the window.",
}
# tables shown through a summary instead of their raw rows (the raw ones are in tables/)
SUMMARIES: dict[str, Callable[[Rows, int], Rows]] = {"throughput_over_time": throughput_summary}
# the columns that matter on screen for tables wider than MAX_COLUMNS (the file has them all)
COLUMNS_SHOWN: dict[str, tuple[str, ...]] = {
    "recording_stretches": ("stretch", "start", "end", "duration_s", "gap_before_s", "proxy_runs", "connections_opened",
                            "clients"),
    "proxy_runs": ("proxy_id", "run", "started", "stopped", "pid", "version", "faults", "recorded_from", "recorded_to",
                   "connections", "gap_before_s"),
    "client_inventory": ("client_id", "client_host", "role", "software_name", "software_version", "requests", "requests_per_s",
                         "records_produced_per_s", "bytes_per_s", "connections", "topics_produced", "topics_consumed"),
    "errors_by_name": ("error_name", "kind", "api_name", "topic", "group_or_resource", "client_id", "count", "injected",
                       "connections", "first_seen", "example_conn_id"),
    "slowest_requests": ("at", "conn_id", "correlation_id", "api_name", "api_version", "client_id", "broker_addr", "topics",
                         "latency_us", "broker_latency_us", "errors"),
    "fault_reactions_by_library": ("library", "client_id", "detail", "api_name", "faults", "recovered", "recover_p50_ms",
                                   "retries", "metadata_refreshes", "coordinator_lookups", "reconnects"),
    "fault_reactions": ("at", "client_id", "library", "detail", "mode", "broker_error", "api_name", "time_to_recover_ms",
                        "retries", "coordinator_lookups", "duplicate_records", "conn_id"),
}


def _finding_html(f: Finding, links: frozenset[str] = frozenset()) -> str:
    # the report is read away from the repository (OUT/report.html), so the reference is text, not a link
    inc = f'<span class="inc">incident {f.incident}, <code>{escape(f.incident_doc)}</code> · </span>' if f.incident_doc else ""
    ex = ""
    if f.examples:
        ex = "<details><summary>evidence and examples</summary>" + table_html("", f.examples, 10, links=links)
        ev = ", ".join(f"{k}: {_cell(v)[0]}" for k, v in f.evidence.items() if not isinstance(v, (dict, list)) or len(str(v)) < 120)
        ex += f'<p class="note">{escape(ev)}</p></details>'
    tables = ", ".join(f'<a href="#t-{escape(t)}">{escape(t)}</a>' for t in f.tables)
    return (f'<div class="finding {escape(f.severity)}"><h3><span class="badge {escape(f.severity)}">{escape(f.severity)}</span>{escape(f.title)}</h3>'
            f'<p>{escape(f.summary)}</p><p class="note">{inc}rule <code>{escape(f.id)}</code>{" · tables: " + tables if tables else ""}</p>{ex}</div>')


def _tiles(ov: dict[str, Any], bucket_s: int) -> str:
    items = [
        ("requests", fmt_num(ov.get("requests") or 0)), ("connections", fmt_num(ov.get("connections") or 0)),
        ("client ids", fmt_num(ov.get("client_ids") or 0)), ("brokers", str(ov.get("brokers") or 0)),
        ("proxies", str(ov.get("proxies") or 0) + (f" ({ov['proxy_processes']} workers)"
                                                     if (ov.get("proxy_processes") or 0) > (ov.get("proxies") or 0) else "")), ("span", human_duration(ov.get("span_s") or 0)),
        ("bytes client → broker", fmt_num(ov.get("request_bytes") or 0, "B")),
        ("bytes broker → client", fmt_num(ov.get("response_bytes") or 0, "B")),
        ("error rate", f"{(ov.get('error_rate') or 0):.3%}"), ("retriable errors", f"{(ov.get('retriable_rate') or 0):.3%}"),
        ("unanswered", fmt_num(ov.get("unanswered") or 0)),
        ("time bucket", human_duration(bucket_s)),
    ]
    return '<div class="tiles">' + "".join(f"<div class=\"tile\"><b>{escape(v)}</b><span>{escape(k)}</span></div>" for k, v in items) + "</div>"


def drilled(result: AnalysisResult) -> frozenset[str]:
    """Conn ids that have a drill-down page (the job asked for the ones its tables reference)."""
    return frozenset(str(r["conn_id"]) for r in result.tables.get("connection_facts", []) if r.get("conn_id"))


def _window_note(windowed: bool, name: str) -> str:
    """What table `name` counts under --since/--until, when the analysis had a window and the table a note ("" else)."""
    return f'<p class="note window">{escape(WINDOW_NOTES[name])}</p>' if windowed and name in WINDOW_NOTES else ""


def _page(title: str, sub: str, body: str) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{CSS}</style></head>
<body><header><h1>{escape(title)}</h1><div class="sub">{sub}</div></header>
<main>{body}</main></body></html>
"""


def render(result: AnalysisResult, filters: str = "none") -> str:
    t = result.tables
    ov = result.overview
    links = drilled(result)
    nodes = node_ids(t.get("brokers", []))
    start, end = _cell(ov.get("start"))[0], _cell(ov.get("end"))[0]
    nav = ['<a href="#findings">Findings</a>']
    body = ['<section id="findings"><h2>Findings</h2><p class="intro">Ranked diagnoses, most important first, each with its evidence.</p>'
            + ("".join(_finding_html(f, links) for f in result.findings)
               or f'<p class="empty">No findings: {escape(result.nothing_matched or "nothing in this recording matched a rule")}.</p>')
            + "</section>"]
    for sid, title, intro, items in SECTIONS:
        present = [(n, h, c) for n, h, c in items if n in t]
        if not present:
            continue
        nav.append(f'<a href="#{sid}">{escape(title)}</a>')
        parts = [f'<section id="{sid}"><h2>{escape(title)}</h2><p class="intro">{escape(intro)}</p>']
        for name, heading, chart in present:
            rows = t[name]
            parts.append(f'<h3 id="t-{escape(name)}">{escape(heading)}</h3>')
            parts.append(_window_note(result.windowed, name))
            if chart and rows:
                try:
                    parts.append(chart(rows, result.bucket_s))
                except Exception as exc:  # a chart must never cost the table
                    parts.append(f'<p class="note">chart unavailable: {escape(str(exc))}</p>')
            shown = SUMMARIES[name](rows, result.bucket_s) if name in SUMMARIES else rows
            parts.append(table_html(name, shown, links=links, columns=COLUMNS_SHOWN.get(name), nodes=nodes))
        parts.append("</section>")
        body.append("".join(parts))
    if links:
        nav.append(f'<a href="#t-connection_facts">Connection pages ({len(links)})</a>')
        body.append('<section id="drilldown"><h2>Connection pages</h2><p class="intro">Every connection the tables above point at has a '
                    "page of its own: its requests in order, its TCP_INFO samples and how it ended.</p>"
                    f'<h3 id="t-connection_facts">Connections with a page</h3>'
                    + _window_note(result.windowed, "connection_facts")
                    + table_html("connection_facts", t.get("connection_facts", []), limit=len(links), links=links,
                                 columns=("conn_id", "client_id", "client_addr", "broker_addr", "opened_at", "closed_at",
                                          "requests", "end_reason", "end_by", "inferred_cause"))
                    + "</section>")
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    span = f"{start} to {end}" if start and end else "no data"  # a window or filters that matched nothing
    window_note = f'<p class="note window" id="window-overview">{escape(WINDOW_NOTES["overview"])}</p>' if result.windowed else ""
    notice = stretches_notice(t)  # above everything: every number below spans the gaps
    window_note += f'<p class="note notice" id="stretches-notice">{escape(notice)}</p>' if notice else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>kafkatap report — {escape(span)}</title><style>{CSS}</style></head>
<body><header><h1>kafkatap report</h1><div class="sub">{escape(span.replace(" to ", " → "))} · filters: {escape(filters)} · generated {generated}</div></header>
<nav>{''.join(nav)}</nav><main>{_tiles(ov, result.bucket_s)}{window_note}{''.join(body)}</main></body></html>
"""


def _rows_of(rows: Rows, conn_id: str) -> Rows:
    return [r for r in rows if r.get("conn_id") == conn_id]


def connection_page(conn_id: str, facts: Rows, requests: Rows, tcp: Rows, windowed: bool = False) -> str:
    """One connection's story: who and where, its requests in order, its TCP_INFO samples, how it ended.

    `windowed`: the analysis had --since/--until. The page then says that how it ended is the whole life's
    (the loader keeps the connection's row, whose end may lie after the window) while its requests and
    samples are the window's (the loader kept only those): without it the two read as one span.
    """
    parts = [_window_note(windowed, "connection_facts")]
    for f in facts:
        ended = (f"ended {escape(str(f.get('end_reason') or 'open'))} by {escape(str(f.get('end_by') or '?'))}"
                 + (f" after {human_duration((f.get('idle_before_end_ms') or 0) / 1000)} idle" if f.get("idle_before_end_ms") is not None else ""))
        cause = f"<p><b>Likely cause:</b> {escape(str(f['inferred_cause']))}</p>" if f.get("inferred_cause") else ""
        life = human_duration((f.get("duration_us") or 0) / 1e6)
        parts.append(f'<section id="ending"><h2>How it ended</h2><p>{escape(str(f.get("client_id")))} at {escape(str(f.get("client_addr")))} → '
                     f'{escape(str(f.get("broker_addr")))}; open {escape(_cell(f.get("opened_at"))[0])}, {life}; {ended}.</p>{cause}'
                     + table_html("", [f], columns=("requests", "responses", "bytes_from_client", "bytes_from_broker", "unanswered",
                                                    "last_api", "last_request_bytes", "last_request_acks", "last_request_topics", "end_detail"))
                     + "</section>")
    shown = len(requests)
    parts.append(f'<section id="requests"><h2>Requests</h2><p class="intro">In the order the client sent them'
                 f'{" (the first " + str(shown) + ")" if shown >= 300 else ""}; full list: the recording’s requests/ for this conn id.</p>'
                 + table_html("connection_requests", requests, limit=len(requests),
                              columns=("at", "correlation_id", "api_name", "topics", "request_bytes", "response_bytes",
                                       "latency_us", "broker_latency_us", "status", "errors"))
                 + "</section>")
    rtt = [r for r in tcp if r.get("rtt_us") is not None]
    chart = ""
    if len(rtt) > 1:
        xs = sorted({r["at"] for r in rtt})
        by = {(r["side"], r["at"]): r["rtt_us"] for r in rtt}
        chart = line_chart(xs, {f"{side} socket RTT": [by.get((side, x)) for x in xs] for side in ("client", "broker")}, "µs",
                           y_label="smoothed RTT", height=200)
    parts.append('<section id="tcp"><h2>TCP_INFO samples</h2><p class="intro">The proxy\u2019s two sockets: client side and broker side, '
                 "at open, periodically and at close.</p>" + chart
                 + table_html("connection_tcp", tcp, limit=len(tcp),
                              columns=("at", "side", "phase", "state", "rtt_us", "rttvar_us", "retrans_total", "lost", "snd_cwnd",
                                       "snd_wscale", "rcv_wscale", "delivery_rate_bps"))
                 + "</section>")
    sub = '<a href="../report.html">← back to the report</a>'
    return _page(f"Connection {conn_id}", sub, "".join(parts))


def connection_pages(result: AnalysisResult) -> dict[str, str]:
    """{path relative to OUT: html} for every drilled-down connection (bounded by the job's cap)."""
    t = result.tables
    return {conn_page(c): connection_page(c, _rows_of(t.get("connection_facts", []), c), _rows_of(t.get("connection_requests", []), c),
                                          _rows_of(t.get("connection_tcp", []), c), result.windowed)
            for c in sorted(drilled(result))}
