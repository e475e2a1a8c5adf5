"""Render the report: findings first, then one section per subject, each chart above its table."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable
from html import escape
from typing import Any

from analytics.findings import INCIDENTS_DOC, Finding, incident_ref
from analytics.report.svg import bar_chart, fmt_num, line_chart
from analytics.result import AnalysisResult

Rows = list[dict[str, Any]]
SHOW_ROWS = 25

CSS = """
:root{--bg:#f6f7f9;--card:#fff;--ink:#1f2937;--mute:#6b7280;--line:#e5e7eb;--crit:#dc2626;--warn:#d97706;--info:#2563eb}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;background:var(--bg);color:var(--ink)}
header{background:#111827;color:#f9fafb;padding:18px 32px}header h1{margin:0;font-size:20px}header .sub{color:#9ca3af;font-size:13px;margin-top:4px}
nav{position:sticky;top:0;z-index:2;background:#1f2937;padding:6px 32px;display:flex;gap:14px;flex-wrap:wrap}
nav a{color:#d1d5db;text-decoration:none;font-size:13px}nav a:hover{color:#fff}
main{max-width:1180px;margin:0 auto;padding:20px 32px 60px}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:10px;margin:8px 0 20px}
.tile{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px}.tile b{display:block;font-size:20px}.tile span{color:var(--mute);font-size:12px}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 20px;margin:18px 0}
section h2{margin:0 0 4px;font-size:18px}section h3{margin:18px 0 6px;font-size:15px}.intro{color:var(--mute);margin:0 0 8px}
.finding{border-left:5px solid var(--info);background:#fff;border-radius:8px;border:1px solid var(--line);border-left-width:5px;padding:10px 14px;margin:10px 0}
.finding.critical{border-left-color:var(--crit)}.finding.warning{border-left-color:var(--warn)}
.finding h3{margin:0 0 4px;font-size:15px}.finding p{margin:4px 0}.badge{display:inline-block;font-size:11px;font-weight:600;text-transform:uppercase;padding:1px 7px;border-radius:10px;margin-right:6px;color:#fff;background:var(--info)}
.badge.critical{background:var(--crit)}.badge.warning{background:var(--warn)}.inc{color:var(--mute);font-size:12px}
.finding details{margin-top:4px}.finding summary{cursor:pointer;color:var(--mute);font-size:12px}
table{border-collapse:collapse;width:100%;font-size:12.5px;margin:6px 0}th,td{padding:4px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:#f3f4f6;position:sticky;top:0;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.tablewrap{max-height:420px;overflow:auto;border:1px solid var(--line);border-radius:6px}
.note{color:var(--mute);font-size:12px}.empty{color:var(--mute);font-style:italic}
svg.chart{display:block;margin:6px 0 4px;background:#fff}svg .grid{stroke:#eef0f3}svg .axis{stroke:#9ca3af}
svg .tick{font-size:10.5px;fill:#6b7280}svg .label{font-size:11.5px;fill:#374151}svg .value{font-size:10.5px;fill:#374151}svg .legend{font-size:11.5px;fill:#374151}
code{background:#f3f4f6;padding:0 4px;border-radius:4px}
"""


def _cell(v: Any) -> tuple[str, bool]:
    if v is None:
        return "", False
    if isinstance(v, bool):
        return ("yes" if v else "no"), False
    if isinstance(v, int):
        return f"{v:,}", True
    if isinstance(v, float):
        return (f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:,.0f}"), True
    if isinstance(v, dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S"), False
    if isinstance(v, (list, tuple)):
        s = ", ".join("" if x is None else str(x) for x in v)
        return (s if len(s) <= 160 else s[:157] + "…"), False
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items()), False
    s = str(v)
    return (s if len(s) <= 200 else s[:197] + "…"), False


def table_html(name: str, rows: Rows, limit: int = SHOW_ROWS, hide: tuple[str, ...] = ("closed_ns", "example_ts_ns", "proxy_id")) -> str:
    if not rows:
        return '<p class="empty">no rows</p>'
    cols = [c for c in rows[0].keys() if c not in hide]
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = []
    for r in rows[:limit]:
        cells = []
        for c in cols:
            text, num = _cell(r.get(c))
            cells.append(f'<td class="n">{escape(text)}</td>' if num else f"<td>{escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f" — showing {limit}" if len(rows) > limit else ""
    return (f'<div class="tablewrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
            f'<p class="note">{len(rows):,} row(s){more}; full table: <code>tables/{escape(name)}.csv</code> / <code>.parquet</code></p>')


def _top(rows: Rows, key: str, n: int = 15) -> Rows:
    return sorted(rows, key=lambda r: -(r.get(key) or 0))[:n]


# ---- charts per table (each returns SVG or "")

def _c_bars(label: str, cols: dict[str, str], unit: str = "", sort: str | None = None, n: int = 15) -> Callable[[Rows], str]:
    def chart(rows: Rows) -> str:
        rs = _top(rows, sort, n) if sort else rows[:n]
        labels = [" · ".join(str(r.get(p) or "") for p in label.split("+")) for r in rs]
        return bar_chart(labels, {title: [r.get(col) for r in rs] for col, title in cols.items()}, unit)
    return chart


def _c_latency_over_time(rows: Rows) -> str:
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
    return line_chart(xs, series, "µs")


def _c_conns_over_time(rows: Rows) -> str:
    by: dict[str, Rows] = defaultdict(list)
    for r in rows:
        by[r["broker_addr"]].append(r)
    parts = []
    for broker, rs in sorted(by.items()):
        rs.sort(key=lambda r: r["bucket"])
        xs = [r["bucket"] for r in rs]
        parts.append(f"<h3>{escape(broker)}: open connections (solid) and p99 latency (dashed)</h3>")
        parts.append(line_chart(xs, {"open connections": [r.get("concurrent") for r in rs], "opens": [r.get("opens") for r in rs]},
                                "", right={"p99 latency": [r.get("p99_us") for r in rs]}, right_unit="µs"))
    return "".join(parts[:16])


def _c_errors_over_time(rows: Rows) -> str:
    xs = sorted({r["bucket"] for r in rows})
    tot: dict[str, int] = defaultdict(int)
    m: dict[tuple, int] = {}
    for r in rows:
        tot[r["error_name"]] += r["count"]
        m[(r["error_name"], r["bucket"])] = r["count"]
    names = sorted(tot, key=lambda n: -tot[n])[:6]
    return line_chart(xs, {n: [m.get((n, x), 0) for x in xs] for n in names}) if xs else ""


def _c_ceiling(rows: Rows) -> str:
    rs = rows[:15]
    return bar_chart([f"{r['conn_id']} ({r.get('side')})" for r in rs],
                     {"64 KiB / RTT ceiling": [r.get("ceiling_bytes_per_s") for r in rs],
                      "peak moved": [r.get("peak_bytes_per_s") for r in rs],
                      "average moved": [r.get("avg_bytes_per_s") for r in rs]}, "B/s")


def _c_tcp_health(rows: Rows) -> str:
    return bar_chart([r["side"] + " side" for r in rows], {
        "connections": [r.get("connections") for r in rows],
        "without window scaling": [r.get("without_window_scaling") for r in rows],
        "without timestamps": [r.get("without_timestamps") for r in rows],
        "without SACK": [r.get("without_sack") for r in rows]})


def _c_ends(rows: Rows) -> str:
    agg: dict[str, int] = defaultdict(int)
    for r in rows:
        agg[f"{r.get('end_reason')} by {r.get('end_by')}"] += r.get("connections") or 0
    items = sorted(agg.items(), key=lambda kv: -kv[1])
    return bar_chart([k for k, _ in items], {"connections": [v for _, v in items]})


def _c_resets(rows: Rows) -> str:
    bins = [(0, 1, "< 1 s"), (1, 10, "1–10 s"), (10, 60, "10–60 s"), (60, 300, "1–5 min"), (300, 1800, "5–30 min"), (1800, 7200, "30 min–2 h"), (7200, 1e12, "> 2 h")]
    counts = {lab: [0, 0] for _, _, lab in bins}
    for r in rows:
        s = (r.get("idle_before_end_ms") or 0) / 1000
        for lo, hi, lab in bins:
            if lo <= s < hi:
                counts[lab][0 if r.get("end_by") != "broker" else 1] += 1
    return bar_chart(list(counts), {"not sent by the broker": [v[0] for v in counts.values()], "by the broker": [v[1] for v in counts.values()]})


SECTIONS: list[tuple[str, str, str, list[tuple[str, str, Callable[[Rows], str] | None]]]] = [
    ("clients", "Clients", f"Who talks to the brokers, in which role, how much — busiest first (incident 3: {incident_ref(3)}).", [
        ("client_inventory", "Client inventory", _c_bars("client_id+role", {"requests_per_s": "requests/s"}, sort="requests_per_s")),
        ("topic_view", "Topics: who writes and who reads", _c_bars("topic", {"bytes_produced": "produced", "bytes_fetched": "fetched"}, "B", sort="bytes_produced")),
        ("group_protocols", "Groups and their protocol (classic / consumer / share / streams)", None),
    ]),
    ("latency", "Latency", "Client-visible latency in µs. Long-poll Fetches (broker waited max_wait, returned nothing) are their own row "
                            "and excluded from broker/topic/client views; the proxy's own delay is shown separately.", [
        ("latency_by_api", "By API", _c_bars("api_label", {"p50_us": "p50", "p99_us": "p99"}, "µs")),
        ("latency_over_time", "Over time (long polls excluded)", _c_latency_over_time),
        ("broker_latency_by_api", "Broker latency by API (request sent → first response byte)", None),
        ("latency_by_broker", "By broker", _c_bars("broker_addr", {"p50_us": "p50", "p99_us": "p99"}, "µs")),
        ("latency_by_api_version", "By API and version", None),
        ("latency_by_topic", "By topic", None),
        ("latency_by_client", "By client", None),
        ("proxy_delay_by_api", "Delay added by the proxy", _c_bars("api_name", {"p50_us": "p50", "p99_us": "p99"}, "µs")),
        ("long_polls_by_client", "Long-poll Fetches per consumer", None),
    ]),
    ("errors", "Errors and throttling", "Every non-zero error code by name × API × topic × client, with an example connection.", [
        ("errors_by_name", "Errors", _c_bars("error_name+api_name+client_id", {"count": "count"}, sort="count")),
        ("errors_over_time", "Errors over time", _c_errors_over_time),
        ("throttling", "Throttling (quota)", None),
    ]),
    ("connections", "Connections", "Opens, ends and concurrency per broker with latency overlaid (incident 4); how and why connections end "
                                    f"(incidents 1 and 2; all three in {INCIDENTS_DOC}).", [
        ("connections_over_time", "Concurrency and latency over time, per broker", _c_conns_over_time),
        ("connection_ends", "How connections ended", _c_ends),
        ("connection_lifetimes", "Lifetimes", _c_bars("lifetime", {"connections": "connections"})),
        ("resets", "Resets and the idle time before them", _c_resets),
        ("reconnects_by_client", "Reconnects per client", _c_bars("client_id", {"reconnects_per_min": "reconnects/min"}, sort="reconnects_per_min")),
        ("broker_closes", "Connections closed by the broker (with the last request)", None),
        ("unanswered_at_close", "Requests unanswered at close", None),
    ]),
    ("tcp", "TCP health", f"From TCP_INFO on the proxy's two sockets (incident 5: {incident_ref(5)}). Without window scaling a socket moves at most 64 KiB per round trip.", [
        ("tcp_health", "Negotiated options", _c_tcp_health),
        ("window_ceiling", "Sockets without window scaling: 64 KiB / RTT ceiling vs actual", _c_ceiling),
        ("tcp_rtt_by_peer", "RTT and retransmits by peer", _c_bars("side+peer", {"rtt_p50_us": "p50 RTT", "rtt_p99_us": "p99 RTT"}, "µs", sort="rtt_p99_us")),
    ]),
    ("produce", "Produce and Fetch", "acks mix, batch sizes and codecs; records/s per topic; fetch rates and empty fetches per consumer.", [
        ("produce_acks", "acks mix", _c_bars("acks_label", {"requests": "requests"})),
        ("produce_rate_by_topic", "Records per second by topic", _c_bars("topic", {"records_per_s": "records/s"}, sort="records_per_s")),
        ("produce_batches", "Produce request sizes by topic", None),
        ("produce_compression", "Compression", _c_bars("compression", {"requests": "requests"})),
        ("fetch_by_consumer", "Fetch by consumer and topic", _c_bars("client_id+topic", {"bytes_per_s": "bytes/s"}, "B/s", sort="bytes_per_s")),
    ]),
    ("compare", "Comparison A vs B", "Requests matched between two recordings; differences are A − B.", [
        ("compare_summary", "Matching", None),
        ("compare_by_api", "Latency difference by API", _c_bars("api_name", {"diff_p50_us": "A−B p50", "diff_p99_us": "A−B p99"}, "µs")),
        ("compare_by_connection", "Latency difference by connection", None),
        ("compare_errors", "Errors that differ", None),
        ("compare_ends", "How matched connections ended", None),
    ]),
]


def _finding_html(f: Finding) -> str:
    # the report is read away from the repository (OUT/report.html), so the reference is text, not a link
    inc = f'<span class="inc">incident {f.incident}, <code>{escape(f.incident_doc)}</code> · </span>' if f.incident_doc else ""
    ex = ""
    if f.examples:
        ex = "<details><summary>evidence and examples</summary>" + table_html("", f.examples, 10).split('<p class="note">')[0]
        ev = ", ".join(f"{k}: {_cell(v)[0]}" for k, v in f.evidence.items() if not isinstance(v, (dict, list)) or len(str(v)) < 120)
        ex += f'<p class="note">{escape(ev)}</p></details>'
    tables = ", ".join(f'<a href="#t-{escape(t)}">{escape(t)}</a>' for t in f.tables)
    return (f'<div class="finding {escape(f.severity)}"><h3><span class="badge {escape(f.severity)}">{escape(f.severity)}</span>{escape(f.title)}</h3>'
            f'<p>{escape(f.summary)}</p><p class="note">{inc}rule <code>{escape(f.id)}</code>{" · tables: " + tables if tables else ""}</p>{ex}</div>')


def _tiles(ov: dict[str, Any], bucket_s: int) -> str:
    items = [
        ("requests", fmt_num(ov.get("requests") or 0)), ("connections", fmt_num(ov.get("connections") or 0)),
        ("client ids", fmt_num(ov.get("client_ids") or 0)), ("brokers", str(ov.get("brokers") or 0)),
        ("proxies", str(ov.get("proxies") or 0)), ("span", f"{(ov.get('span_s') or 0) / 60:,.1f} min"),
        ("bytes in / out", f"{fmt_num(ov.get('request_bytes') or 0, 'B')} / {fmt_num(ov.get('response_bytes') or 0, 'B')}"),
        ("error rate", f"{(ov.get('error_rate') or 0):.3%}"), ("unanswered", fmt_num(ov.get("unanswered") or 0)),
        ("time bucket", f"{bucket_s} s"),
    ]
    return '<div class="tiles">' + "".join(f"<div class=\"tile\"><b>{escape(v)}</b><span>{escape(k)}</span></div>" for k, v in items) + "</div>"


def render(result: AnalysisResult, filters: str = "none") -> str:
    t = result.tables
    ov = result.overview
    start, end = _cell(ov.get("start"))[0], _cell(ov.get("end"))[0]
    nav = ['<a href="#findings">Findings</a>']
    body = ['<section id="findings"><h2>Findings</h2><p class="intro">Ranked diagnoses, most important first, each with its evidence.</p>'
            + ("".join(_finding_html(f) for f in result.findings) or '<p class="empty">No findings: nothing in this recording matched a rule.</p>')
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
            if chart and rows:
                try:
                    parts.append(chart(rows))
                except Exception as exc:  # a chart must never cost the table
                    parts.append(f'<p class="note">chart unavailable: {escape(str(exc))}</p>')
            parts.append(table_html(name, rows))
        parts.append("</section>")
        body.append("".join(parts))
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>kafkatap report — {escape(start)} to {escape(end)}</title><style>{CSS}</style></head>
<body><header><h1>kafkatap report</h1><div class="sub">{escape(start)} → {escape(end)} · filters: {escape(filters)} · generated {generated}</div></header>
<nav>{''.join(nav)}</nav><main>{_tiles(ov, result.bucket_s)}{''.join(body)}</main></body></html>
"""
