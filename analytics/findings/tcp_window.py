"""Incident 5 (docs/incidents.md#incident-5): window scaling not negotiated, so throughput is capped at 64 KiB per round trip."""

from __future__ import annotations

from analytics.findings.base import Finding, Tables, human_bytes, rule, score


def _moved(r: dict) -> str:
    """What the socket moved, as its row measured it; a rate above the ceiling is named as not credible.

    Why: a rate a capped socket cannot carry (another leg's, or one against a smaller RTT than the worst sampled)
    once read "moved up to 1.3 GiB/s" beside a 24.6 MiB/s ceiling; `window_ceiling` leaves its utilisation empty.
    """
    rate = r.get("peak_bytes_per_s") or r.get("avg_bytes_per_s")
    if r.get("above_ceiling"):
        return (f"measured {human_bytes(rate)}/s, above what the cap allows, so not credible as this socket's rate: "
                "read its RTT and bytes in tcp_health and the connection's page")
    return f"moved up to {human_bytes(rate)}/s"


@rule("window_scaling_off")
def window_scaling_off(t: Tables) -> list[Finding]:
    """One finding listing every socket without window scaling and its 64 KiB / RTT ceiling."""
    rows = t.get("window_ceiling", [])
    if not rows:
        return []
    pinned = [r for r in rows if (r.get("utilisation") or 0) >= 0.5]  # null: not measured, or not credible
    sev = "critical" if pinned else "warning"
    no_ts = sum(1 for r in rows if r.get("timestamps_ok") is False)
    worst = rows[0]
    return [Finding(
        id="window_scaling_off", incident=5, severity=sev,
        title=f"Window scaling off on {len(rows)} socket(s): throughput capped at 64 KiB / RTT"
              + (f", {len(pinned)} running at the cap" if pinned else ""),
        summary=(f"{len(rows)} proxy socket(s) negotiated no TCP window scaling, so each can move at most 64 KiB per round trip "
                 f"(e.g. {worst['conn_id']} to {worst.get('broker_addr')}: RTT {worst.get('rtt_ms')} ms → ceiling "
                 f"{human_bytes(worst.get('ceiling_bytes_per_s'))}/s, {_moved(worst)}). "
                 f"{no_ts} of them also lack TCP timestamps — SYN cookies without timestamps cannot carry the window-scale option: "
                 "check net.ipv4.tcp_syncookies / SYN backlog on the server and middleboxes stripping TCP options."),
        evidence={"sockets": len(rows), "at_ceiling": len(pinned), "without_timestamps": no_ts,
                  "connections": sorted({r["conn_id"] for r in rows})[:50]},
        examples=[{"conn_id": r["conn_id"], "side": r.get("side"), "client_id": r.get("client_id"), "rtt_ms": r.get("rtt_ms"),
                   "ceiling_bytes_per_s": r.get("ceiling_bytes_per_s"), "avg_bytes_per_s": r.get("avg_bytes_per_s"),
                   "peak_bytes_per_s": r.get("peak_bytes_per_s"), "utilisation": r.get("utilisation"),
                   "above_ceiling": r.get("above_ceiling"), "flag": "window scaling off: throughput capped at 64 KiB / RTT"}
                  for r in rows[:10]],
        tables=["window_ceiling", "tcp_health"], score=score(sev, len(rows) * 5),
    )]
