"""Findings from a two-point comparison (middlebox latency, or a replay that behaved differently)."""

from __future__ import annotations

from analytics.findings.base import Finding, Tables, human_ts, rule, score
from analytics.transforms.common import LONG_POLL_LABELS

MIN_ADDED_US = 1000
# under this share of either side's requests matched, most of that side's traffic is not in the comparison
MIN_MATCHED_SHARE = 0.5

# why requests go unmatched, by --match mode: what the reader can check or change
UNMATCHED_CAUSES = {
    "wire": ("the recordings cover different time windows (narrow both to the time they share with --since/--until); "
             "different clients (a request matches only one with the same client_id, API and correlation id); a proxy "
             "side that saw only part of the traffic (it fronts some brokers only, some clients bypass it, or it started "
             "late or stopped early); or the two hosts' clocks differ by more than --tolerance ({tolerance}): raise it"),
    "sequence": ("a replay that sent only part of the recording (an interrupted replay, connections recorded without "
                 "--capture requests), other client ids on one side, or clients that opened their connections in another "
                 "order (requests match by client_id, the connection's rank, API and position in the connection)"),
}


@rule("compare_added_latency")
def compare_added_latency(t: Tables) -> list[Finding]:
    # long polls are the broker waiting for data, not the path between A and B (compare.compare_by_api)
    rows = [r for r in t.get("compare_by_api", []) if (r.get("matched") or 0) > 0 and r.get("diff_p50_us") is not None
            and r.get("api_name") not in LONG_POLL_LABELS]
    if not rows:
        return []
    # headed by the API most requests were matched for: the largest tail of one with 1-3 requests says little
    head = max(rows, key=lambda r: (r.get("matched") or 0, abs(r.get("diff_p50_us") or 0)))
    sev = "warning" if abs(head.get("diff_p50_us") or 0) >= MIN_ADDED_US else "info"
    parts = [f"{r['api_name']} p50 {r['diff_p50_us'] / 1000:+.2f} ms / p99 {(r.get('diff_p99_us') or 0) / 1000:+.2f} ms" for r in rows[:6]]
    summary = t.get("compare_summary", [])
    mode = next((r["mode"] for r in summary if r.get("mode")), "wire")
    ids_a, ids_b = (sorted({c for r in summary for c in (r.get(f"cluster_ids_{s}") or ())}) for s in "ab")
    if ids_a and ids_b and not set(ids_a) & set(ids_b):  # two clusters: no path between them to measure
        sev = "warning"
        reading = (f"A and B recorded different Kafka clusters (A: {', '.join(ids_a)}; B: {', '.join(ids_b)}): they "
                   "are not two sides of one path, so this is no middlebox's latency")
    elif mode == "sequence":  # no middlebox between two recordings of different times: say how they were paired
        reading = (f"the recordings do not overlap in time ({_spans(summary).strip() or 'see compare_summary'}), so "
                   "requests were paired by order, as for a replay: negative means B was slower")
    elif all((r.get("diff_p50_us") or 0) < 0 for r in rows) and abs(head.get("diff_p50_us") or 0) >= MIN_ADDED_US:
        reading = ("every API is slower at B than at A: B looks like the client side of whatever lies between them, "
                   "so A and B may be swapped (give the client-side recording first)")
    else:
        reading = "with A on the client side of a middlebox this is the latency the middlebox adds"
    return [Finding(
        id="compare_added_latency", severity=sev,
        title=f"Latency A − B: {head['api_name']} p50 {head['diff_p50_us'] / 1000:+.2f} ms, p99 {(head.get('diff_p99_us') or 0) / 1000:+.2f} ms",
        summary=(f"Per matched request, latency at A minus latency at B ({reading}): " + "; ".join(parts) + "."),
        evidence={"apis": {r["api_name"]: {k: r.get(k) for k in ("matched", "a_p50_us", "b_p50_us", "diff_p50_us", "diff_p99_us")} for r in rows}},
        tables=["compare_by_api", "compare_by_connection"], score=score(sev, sum(r["matched"] for r in rows)),
    )]


def _share(matched: int, requests: int) -> float:
    """Matched share of one side (at most 1: in wire mode two A requests may pair with the same B one)."""
    return min(1.0, matched / requests) if requests else 0.0


def _spans(rows: list[dict]) -> str:
    """"A's requests run from … to …; B's from … to …. ", which shows different windows or a clock offset ("" without times)."""
    out = []
    for side in ("a", "b"):
        first = [r[f"first_{side}"] for r in rows if r.get(f"first_{side}") is not None]
        last = [r[f"last_{side}"] for r in rows if r.get(f"last_{side}") is not None]
        if first and last:
            out.append(f"{side.upper()}'s{' requests' if not out else ''} run from {human_ts(min(first))} to {human_ts(max(last))}")
    return "; ".join(out) + ". " if out else ""


@rule("compare_few_matched")
def compare_few_matched(t: Tables) -> list[Finding]:
    """A comparison that matched under MIN_MATCHED_SHARE of either side's requests says so, with the likely causes.

    Every other compare finding reads only the matched pairs: without this one, 50 matched out of
    50,000 read like a clean comparison of everything (`compare_summary` holds the counts).
    """
    rows = t.get("compare_summary", [])
    req_a, req_b = (sum(r.get(k) or 0 for r in rows) for k in ("requests_a", "requests_b"))
    matched = sum(r.get("matched") or 0 for r in rows)
    if not (req_a or req_b):
        return []
    share_a, share_b = _share(matched, req_a), _share(matched, req_b)
    if min(share_a, share_b) >= MIN_MATCHED_SHARE:
        return []
    mode = next((r["mode"] for r in rows if r.get("mode")), "wire")
    unmatched = sorted(rows, key=lambda r: (r.get("matched") or 0) - max(r.get("requests_a") or 0, r.get("requests_b") or 0))
    tolerance = (t.get("_meta") or [{}])[0].get("tolerance_s")
    causes = UNMATCHED_CAUSES.get(mode, UNMATCHED_CAUSES["wire"]).format(
        tolerance=f"{tolerance:g} s" if tolerance is not None else "10 s unless given")
    return [Finding(
        id="compare_few_matched", severity="warning",
        title=f"Few requests matched: {share_a:.0%} of A's {req_a:,}, {share_b:.0%} of B's {req_b:,}",
        summary=(f"{mode.capitalize()} matching paired {matched:,} requests: {share_a:.0%} of A's {req_a:,} and {share_b:.0%} "
                 f"of B's {req_b:,} (two recordings of the same traffic match nearly all of both). {_spans(rows)}The latency "
                 f"differences, differing errors and connection ends speak for the matched requests only, which may not stand "
                 f"for the rest. Likely causes: {causes}."),
        evidence={"mode": mode, "requests_a": req_a, "requests_b": req_b, "matched": matched,
                  "matched_share_a": round(share_a, 4), "matched_share_b": round(share_b, 4), "threshold": MIN_MATCHED_SHARE},
        examples=[{k: r.get(k) for k in ("api_name", "requests_a", "requests_b", "matched")} for r in unmatched[:5]],
        tables=["compare_summary"], score=score("warning", max(req_a, req_b) - matched),
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
