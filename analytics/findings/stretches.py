"""A recording that holds separate stretches of time (a directory reused across sessions): say so first.

Why: `proxy --record DIR` appends to what DIR holds, so one directory can hold a session from this
morning and one from this afternoon, against other brokers. Read as one, the report's span runs across
the hours between them and every rate over the span mixes the sessions. The report lists the
stretches (`recording_stretches`, `analytics.transforms.stretches`); this rule and the notice above the
report say what that means and how to read one session alone.
"""

from __future__ import annotations

from analytics.findings.base import Finding, Tables, human_s, human_ts, rule, score


def _stretch(r: dict) -> str:
    return f"{human_ts(r.get('start'))} – {human_ts(r.get('end'))} ({human_s(r.get('duration_s'))})"


def stretches_notice(t: Tables) -> str | None:
    """The one line said above the report and the summary's findings, or None when the recording is one stretch."""
    rows = t.get("recording_stretches", [])
    if len(rows) < 2:
        return None
    gaps = [r.get("gap_before_s") or 0 for r in rows[1:]]
    shown = "; ".join(_stretch(r) for r in rows[:4]) + ("; …" if len(rows) > 4 else "")
    return (f"this recording holds {len(rows)} separate stretches of recording ({shown}), up to "
            f"{human_s(max(gaps))} apart with no proxy recording; rates over the whole span mix them: "
            "use --since/--until to read one alone")


@rule("separate_stretches")
def separate_stretches(t: Tables) -> list[Finding]:
    """One warning when the recording's runs fall into stretches more than `stretch_gap_s` apart."""
    notice = stretches_notice(t)
    if notice is None:
        return []
    rows = t["recording_stretches"]
    return [Finding(
        id="separate_stretches", severity="warning", title=notice[0].upper() + notice[1:],
        summary=("The proxy runs in this recording fall into separate stretches of time (Proxy runs and Stretches of "
                 "recording tables): a directory reused across sessions (`proxy --record` adds to what it holds). "
                 "The overview's span and its rates run across the gaps; the per-client and per-topic rates (client "
                 "inventory, reconnects, produce and fetch rates) leave the gaps out. Analyze one stretch with --since/--until its start and end, or record each "
                 "session into a directory of its own."),
        evidence={"stretches": len(rows), "longest_gap_s": max((r.get("gap_before_s") or 0) for r in rows[1:])},
        examples=[{k: r.get(k) for k in ("stretch", "start", "end", "duration_s", "gap_before_s", "proxy_runs",
                                         "connections_opened", "clients")} for r in rows[:10]],
        tables=["recording_stretches", "proxy_runs"], score=score("warning", 100),
    )]


@rule("tcp_faults_injected")
def tcp_faults_injected(t: Tables) -> list[Finding]:
    """The proxy runs that injected TCP faults (`proxy --fault`): the recording's latencies, rates and ends include them.

    Why a finding: a delay, a bandwidth cap or a close kafkatap injected is recorded as the traffic it shaped
    (requests slower, connections ended); a report read later, or by someone who did not start the proxy, read it
    as the network's or the broker's. Kafka faults are named per request (the rows' `edit`, the fault findings);
    TCP faults only by the run that injected them (`runs/`, column `faults`).
    """
    runs = [r for r in t.get("proxy_runs", []) if r.get("faults")]
    if not runs:
        return []
    kinds = sorted({r["faults"] for r in runs})
    total = len(t.get("proxy_runs", []))
    who = ("The proxy run" if total == 1 else "Every proxy run") if len(runs) == total else f"{len(runs)} of the {total} proxy runs"
    return [Finding(
        id="tcp_faults_injected", severity="warning",
        title=f"{who} injected TCP faults: {kinds[0]}" + (f" (and {len(kinds) - 1} other setting(s))" if len(kinds) > 1 else ""),
        summary=("kafkatap itself delayed, capped or closed these runs' connections (`proxy --fault`): their latencies, "
                 "throughput, resets and connection ends include what it injected, so they say how the clients "
                 "came through the faults, not how the network or the brokers behave. Compare with a recording made "
                 "without faults (`kafkatap analyze --compare`) to see the faults' own share."),
        evidence={"runs_with_faults": len(runs), "runs": len(t.get("proxy_runs", [])), "faults": kinds},
        examples=[{k: r.get(k) for k in ("proxy_id", "run", "started", "stopped", "faults")} for r in runs[:10]],
        tables=["proxy_runs"], score=score("warning", 1000),
    )]
