"""Incident 5 (docs/incidents.md#incident-5): window scaling not negotiated, so throughput is capped at 64 KiB per round trip."""

from __future__ import annotations

from analytics.findings.base import Finding, Tables, human_bytes, rule, score


@rule("window_scaling_off")
def window_scaling_off(t: Tables) -> list[Finding]:
    """One finding listing every socket without window scaling and its 64 KiB / RTT ceiling."""
    rows = t.get("window_ceiling", [])
    if not rows:
        return []
    pinned = [r for r in rows if (r.get("utilisation") or 0) >= 0.5]
    sev = "critical" if pinned else "warning"
    no_ts = sum(1 for r in rows if r.get("timestamps_ok") is False)
    worst = rows[0]
    return [Finding(
        id="window_scaling_off", incident=5, severity=sev,
        title=f"Window scaling off on {len(rows)} socket(s): throughput capped at 64 KiB / RTT"
              + (f", {len(pinned)} running at the cap" if pinned else ""),
        summary=(f"{len(rows)} proxy socket(s) negotiated no TCP window scaling, so each can move at most 64 KiB per round trip "
                 f"(e.g. {worst['conn_id']} to {worst.get('broker_addr')}: RTT {worst.get('rtt_ms')} ms → ceiling "
                 f"{human_bytes(worst.get('ceiling_bytes_per_s'))}/s, moved up to {human_bytes(worst.get('peak_bytes_per_s') or worst.get('avg_bytes_per_s'))}/s). "
                 f"{no_ts} of them also lack TCP timestamps — SYN cookies without timestamps cannot carry the window-scale option: "
                 "check net.ipv4.tcp_syncookies / SYN backlog on the server and middleboxes stripping TCP options."),
        evidence={"sockets": len(rows), "at_ceiling": len(pinned), "without_timestamps": no_ts,
                  "connections": sorted({r["conn_id"] for r in rows})[:50]},
        examples=[{"conn_id": r["conn_id"], "side": r.get("side"), "client_id": r.get("client_id"), "rtt_ms": r.get("rtt_ms"),
                   "ceiling_bytes_per_s": r.get("ceiling_bytes_per_s"), "avg_bytes_per_s": r.get("avg_bytes_per_s"),
                   "peak_bytes_per_s": r.get("peak_bytes_per_s"), "flag": "window scaling off: throughput capped at 64 KiB / RTT"}
                  for r in rows[:10]],
        tables=["window_ceiling", "tcp_health"], score=score(sev, len(rows) * 5),
    )]
