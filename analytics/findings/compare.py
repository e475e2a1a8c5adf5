"""Findings from a two-point comparison (middlebox latency, or a replay that behaved differently)."""

from __future__ import annotations

from analytics.findings.base import Finding, Tables, rule, score
from analytics.transforms.common import LONG_POLL_LABEL

MIN_ADDED_US = 1000


@rule("compare_added_latency")
def compare_added_latency(t: Tables) -> list[Finding]:
    # long polls are the broker waiting for data, not the path between A and B (compare.compare_by_api)
    rows = [r for r in t.get("compare_by_api", []) if (r.get("matched") or 0) > 0 and r.get("diff_p50_us") is not None
            and r.get("api_name") != LONG_POLL_LABEL]
    if not rows:
        return []
    worst = max(rows, key=lambda r: abs(r.get("diff_p99_us") or 0))
    sev = "warning" if abs(worst.get("diff_p50_us") or 0) >= MIN_ADDED_US else "info"
    parts = [f"{r['api_name']} p50 {r['diff_p50_us'] / 1000:+.2f} ms / p99 {(r.get('diff_p99_us') or 0) / 1000:+.2f} ms" for r in rows[:6]]
    return [Finding(
        id="compare_added_latency", severity=sev,
        title=f"Latency A − B: {worst['api_name']} p50 {worst['diff_p50_us'] / 1000:+.2f} ms, p99 {(worst.get('diff_p99_us') or 0) / 1000:+.2f} ms",
        summary=("Per matched request, latency at A minus latency at B (with A on the client side of a middlebox this is the latency "
                 "the middlebox adds; for a replay, negative means the replay target was slower): " + "; ".join(parts) + "."),
        evidence={"apis": {r["api_name"]: {k: r.get(k) for k in ("matched", "a_p50_us", "b_p50_us", "diff_p50_us", "diff_p99_us")} for r in rows}},
        tables=["compare_by_api", "compare_by_connection"], score=score(sev, sum(r["matched"] for r in rows)),
    )]


@rule("compare_errors_differ")
def compare_errors_differ(t: Tables) -> list[Finding]:
    rows = t.get("compare_errors", [])
    if not rows:
        return []
    n = sum(r.get("requests") or 0 for r in rows)
    return [Finding(
        id="compare_errors_differ", severity="warning",
        title=f"{n} matched request(s) got different errors or status in A and B",
        summary="; ".join(f"{r['api_name']}: A [{r.get('errors_a') or r.get('status_a')}] vs B [{r.get('errors_b') or r.get('status_b')}] × {r['requests']}"
                          for r in rows[:6]),
        examples=[{k: r.get(k) for k in ("api_name", "errors_a", "errors_b", "status_a", "status_b", "requests", "example_conn_id_a",
                                         "example_correlation_id_a", "example_conn_id_b")} for r in rows[:5]],
        evidence={"requests": n}, tables=["compare_errors"], score=score("warning", n),
    )]


@rule("compare_ends_differ")
def compare_ends_differ(t: Tables) -> list[Finding]:
    rows = [r for r in t.get("compare_ends", []) if r.get("same") is False]
    if not rows:
        return []
    return [Finding(
        id="compare_ends_differ", severity="warning",
        title=f"{len(rows)} connection(s) ended differently in A and B",
        summary="; ".join(f"{r['conn_id_a']} ({r.get('client_id')}): A {r.get('end_reason_a')} by {r.get('end_by_a')} vs B {r.get('end_reason_b')} by {r.get('end_by_b')}"
                          + (f" [{r.get('inferred_cause_b') or r.get('inferred_cause_a')}]" if (r.get('inferred_cause_b') or r.get('inferred_cause_a')) else "")
                          for r in rows[:5]),
        examples=[{k: r.get(k) for k in ("conn_id_a", "conn_id_b", "client_id", "end_reason_a", "end_reason_b", "end_by_a", "end_by_b",
                                         "inferred_cause_a", "inferred_cause_b")} for r in rows[:10]],
        evidence={"connections": len(rows)}, tables=["compare_ends"], score=score("warning", len(rows)),
    )]
