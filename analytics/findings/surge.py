"""Incident 4 (docs/incidents.md#incident-4): a connection surge on a broker, with latency rising with it."""

from __future__ import annotations

import statistics
from collections import defaultdict

from analytics.findings.base import Finding, Tables, human_ts, rule, score, ts

MIN_BASELINE_BUCKETS = 3
JUMP_FACTOR = 2.0
MIN_JUMP = 20  # connections: a broker going from 2 to 5 is not a surge
LATENCY_FACTOR = 1.5


def _med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def recorded(r: dict) -> bool:
    """Whether the recording shows this broker's bucket at all: a request or a connection end in it, or a
    proxy run known to be recording through it (`runs_recording`: between its start row and its clean stop
    or last sign of life, `analytics.transforms.runs`).

    Concurrency is carried through a bucket with none of these, so the table cannot tell a quiet broker
    from one nobody was recording (a proxy down, a writer dropping its rows): the ends that happened
    meanwhile are missing, and what opened meanwhile appears when the recording resumes. An open is no
    evidence either way: a connection the recording sees again after a gap carries its real open time.
    Inside a run the bucket is quiet, not a gap: a run that died has its open connections ended at its
    last sign of life, so no missing end keeps them counted (a recording without `runs/` has no such rows).
    """
    return any((r.get(k) or 0) > 0 for k in ("requests", "ends", "runs_recording"))


def stretches(rows: list[dict]) -> list[list[dict]]:
    """One broker's buckets (in time order) cut where the recording's coverage changes.

    A stretch ends before a bucket the recording does not show (`recorded`), and a new one begins at a
    bucket where a proxy run began recording connections to this broker (`recording_starts`: a second
    proxy or worker, a restart; a run with a start row begins there, not where an idle worker first
    records): its first opens are the run starting to see connections, not new ones.
    """
    out: list[list[dict]] = []
    cur: list[dict] = []
    for r in rows:
        if cur and (not recorded(r) or (r.get("recording_starts") or 0) > 0):
            out.append(cur)
            cur = []
        if recorded(r):
            cur.append(r)
    return [*out, cur] if cur else out


def first_jump(conc: list[int]) -> int | None:
    """The first index whose concurrency is >= 2x (and +20) the median of everything before it."""
    for i in range(MIN_BASELINE_BUCKETS, len(conc)):
        base = statistics.median(conc[:i])
        if conc[i] >= max(base * JUMP_FACTOR, base + MIN_JUMP):
            return i
    return None


def _open_at_once(row: dict) -> int:
    """The most connections open at once in a bucket (`peak_concurrent`; `concurrent`, every connection open at
    some moment of it, for rows without it). A burst of connections that each lived milliseconds is churn, not a
    surge: it raised `concurrent` by all of them while a few were ever open together."""
    peak = row.get("peak_concurrent")
    return int(peak if peak is not None else row.get("concurrent") or 0)


@rule("connection_surge")
def connection_surge(t: Tables) -> list[Finding]:
    """Per broker: the first bucket where concurrency jumps to >= 2x (and +20) its earlier median,
    then whether p99 latency rose with it while bytes per request stayed flat (queueing).

    The baseline and the jump come from one stretch of continuous recording (`stretches`): never across
    a bucket the recording does not show, nor across a proxy run's start. Both raise the concurrency
    column without a single new connection on the wire: a second proxy or a restarted one records the
    connections it takes over as opens at its start, a restart's bucket still counts the connections
    the last run ended in it, and after a gap the connections whose ends were not recorded stay counted
    while the clients' new ones add to them. What this gives up: a surge in the bucket where a proxy
    starts recording, or in the MIN_BASELINE_BUCKETS buckets after it or after a gap, is not reported,
    since the recording cannot tell it from the recording starting. With the proxy's `runs/` rows, a
    worker's first connections and quiet buckets inside a run are neither."""
    bucket_s = (t.get("_meta") or [{}])[0].get("bucket_s") or 60
    series: dict[str, list[dict]] = defaultdict(list)
    for r in t.get("connections_over_time", []):
        series[r["broker_addr"]].append(r)
    out = []
    for broker, all_rows in series.items():
        all_rows.sort(key=lambda r: r["bucket"])
        for rows in stretches(all_rows):
            conc = [_open_at_once(r) for r in rows]
            start = first_jump(conc)
            if start is not None:
                break
        else:
            continue
        base_c = statistics.median(conc[:start])
        thresh = (base_c + conc[start]) / 2
        surge = [r for r in rows[start:] if _open_at_once(r) >= thresh]
        peak = max(conc[start:])
        b_p99 = _med([r.get("p99_us") for r in rows[:start]])
        s_p99 = _med([r.get("p99_us") for r in surge])
        b_bpr = _med([r.get("bytes_per_request") for r in rows[:start]])
        s_bpr = _med([r.get("bytes_per_request") for r in surge])
        opens = sum(r.get("opens") or 0 for r in rows[start:start + 3])
        lat_up = b_p99 is not None and s_p99 is not None and b_p99 > 0 and s_p99 >= b_p99 * LATENCY_FACTOR
        flat = b_bpr is not None and s_bpr is not None and b_bpr > 0 and 0.5 <= s_bpr / b_bpr <= 2
        sev = "critical" if lat_up else "warning"
        lat_txt = (f"p99 latency rose from {b_p99 / 1000:.1f} ms to {s_p99 / 1000:.1f} ms with it"
                   if lat_up else "latency did not rise markedly")
        queue_txt = " while bytes per request stayed flat — requests are queueing (network/IO threads saturated)" if lat_up and flat else ""
        out.append(Finding(
            id="connection_surge", incident=4, severity=sev,
            title=f"Connection surge on {broker}: {base_c:.0f} → {peak} connections from {human_ts(rows[start]['bucket'])}; {lat_txt}",
            summary=(f"Open connections on {broker} jumped from a median of {base_c:.0f} to {peak} (≈{opens / (3 * bucket_s):.1f} opens/s at the start) "
                     f"starting {human_ts(rows[start]['bucket'])}; {lat_txt}{queue_txt}. Check num.network.threads / num.io.threads / "
                     "queued.max.requests and which clients opened the new connections (client inventory)."),
            evidence={"broker": broker, "baseline_connections": base_c, "peak_connections": peak, "surge_start": ts(rows[start]["bucket"]),
                      "baseline_p99_us": b_p99, "surge_p99_us": s_p99, "baseline_bytes_per_request": b_bpr,
                      "surge_bytes_per_request": s_bpr, "opens_in_first_buckets": opens, "bucket_s": bucket_s,
                      "baseline_from": ts(rows[0]["bucket"])},
            examples=[{"bucket": ts(r["bucket"]), "concurrent": r.get("concurrent"), "peak_concurrent": _open_at_once(r),
                       "opens": r.get("opens"), "p99_us": r.get("p99_us")}
                      for r in rows[max(0, start - 2):start + 3]],
            tables=["connections_over_time"], score=score(sev, peak - base_c),
        ))
    return out
