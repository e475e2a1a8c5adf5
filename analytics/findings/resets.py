"""Incident 2 (docs/incidents.md#incident-2): connections reset after idle by something that is not the broker; reconnect storms."""

from __future__ import annotations

import statistics
from collections import defaultdict

from analytics.findings.base import Finding, Tables, human_s, rule, score, ts

MIN_IDLE_MS = 1000
SIDES = {"client": "the client's side (between the client and the proxy, or the client itself)",
         "broker": "the broker's side (between the proxy and the broker)"}


@rule("idle_resets_not_from_broker")
def idle_resets_not_from_broker(t: Tables) -> list[Finding]:
    """RSTs the broker did not send, after the connection sat idle: an idle-timeout middlebox
    (firewall, NAT, load balancer) or the client's own timer. Kafka's idle close is a FIN.

    A reset from the broker's side counts too: after an idle period it comes from whatever sits between
    the proxy and the broker (a conntrack/NAT entry expired answers the first request after the pause
    with a reset; the proxy records that pause as the idle time), not from Kafka. Excluding them hid
    incident 2 whenever the proxy ran on the client's side of the firewall.
    """
    rows = [r for r in t.get("resets", []) if (r.get("idle_before_end_ms") or 0) >= MIN_IDLE_MS
            and (r.get("end_by") != "broker" or r.get("end_reason") == "broker_rst")]
    if not rows:
        return []
    idles = sorted(r["idle_before_end_ms"] for r in rows)
    med = statistics.median(idles)
    p10, p90 = idles[len(idles) // 10], idles[(len(idles) * 9) // 10]
    clustered = len(idles) >= 3 and p90 <= med * 1.25 and p10 >= med * 0.75
    by_client: dict[str, int] = defaultdict(int)
    for r in rows:
        by_client[r.get("client_id") or "?"] += 1
    recon = {r["client_id"]: r.get("reconnects_per_min") for r in t.get("reconnects_by_client", []) if r.get("client_id") in by_client}
    who = sorted({r.get("end_by") or "none" for r in rows})
    where = " and ".join(SIDES.get(w, f"the {w} side") for w in who)
    timer = f" — the idle times cluster tightly around {human_s(med / 1000)}, the signature of an idle timer" if clustered else ""
    sev = "critical" if len(rows) >= 3 else "warning"
    return [Finding(
        id="idle_resets_not_from_broker", incident=2, severity=sev,
        title=f"{len(rows)} connection(s) reset after ~{human_s(med / 1000)} idle, not sent by the broker",
        summary=(f"{len(rows)} connection(s) of {len(by_client)} client(s) ended with a TCP reset from {where}, "
                 f"not sent by Kafka, after {human_s(idles[0] / 1000)}–{human_s(idles[-1] / 1000)} of idle (median {human_s(med / 1000)}){timer}. "
                 "Look for a firewall/NAT/load-balancer idle timeout between client and broker shorter than the clients' idle periods; "
                 "lower connections.max.idle.ms or enable TCP keepalive below that timeout."),
        evidence={"resets": len(rows), "median_idle_ms": med, "min_idle_ms": idles[0], "max_idle_ms": idles[-1],
                  "idle_clustered": clustered, "end_by": who, "clients": dict(sorted(by_client.items(), key=lambda kv: -kv[1])[:10]),
                  "reconnects_per_min": recon},
        examples=[{"conn_id": r["conn_id"], "client_id": r.get("client_id"), "closed_at": ts(r.get("closed_at")),
                   "end_reason": r.get("end_reason"), "end_by": r.get("end_by"), "idle_before_end_ms": r.get("idle_before_end_ms")}
                  for r in rows[:5]],
        tables=["resets", "reconnects_by_client", "connection_ends"], score=score(sev, len(rows)),
    )]


MIN_RECONNECTS = 4
MAX_MEDIAN_LIFETIME_S = 600.0
MIN_RATE_PER_MIN = 0.1


# What a replacement of a connection that was never closed means: said in the finding, since it is the evidence.
HALF_OPEN_WORDS = ("the client opened a new connection while its previous one to that broker, quiet since, was never "
                   "closed (no FIN or RST ever reached the proxy), the signature of a middlebox between client and proxy "
                   "(a conntrack firewall, NAT) that drops idle connections' state silently")


def _mostly_half_open(r: dict) -> bool:
    """Most of the client's reconnects replaced connections left half-open.

    Why it waives the lifetime test: connections nobody closes live on at the proxy until it stops, so their
    median lifetime is the recording's length, however fast the client replaces them.
    """
    return 2 * (r.get("half_open_reconnects") or 0) >= (r.get("reconnects") or 0) > 0


@rule("reconnect_storm")
def reconnect_storm(t: Tables) -> list[Finding]:
    """Clients that keep opening short-lived connections (every send pays a handshake): one finding, worst client first.

    Counted in reconnects (`reconnects_by_client`: a connection to a broker after an earlier one to it had
    ended, past the client's first seconds, and not by the proxy's own shutdown, or while the previous one was
    left half-open), not connections: a client that starts up opens one per broker
    plus its bootstrap and coordinator ones within seconds, and over a span that short any count of
    connections is a high rate. MIN_RECONNECTS is more than one broker's restart makes a client replace
    (its connection to that broker, and the bootstrap and coordinator ones where they went there too).
    Connects the proxy could not make (a broker down) are no reconnects: `broker_unreachable` tells them.
    The ends counted are the storm clients' own, not every close by the broker in the recording."""
    storm = []
    for r in t.get("reconnects_by_client", []):
        n = r.get("reconnects") or 0
        life = r.get("median_lifetime_s")
        rate = r.get("reconnects_per_min") or 0
        short_lived = life is not None and life <= MAX_MEDIAN_LIFETIME_S
        if n >= MIN_RECONNECTS and (short_lived or _mostly_half_open(r)) and rate >= MIN_RATE_PER_MIN:
            storm.append(r)
    if not storm:
        return []
    storm.sort(key=lambda r: -(r.get("reconnects_per_min") or 0))
    worst = storm[0]
    sev = "critical" if (worst.get("reconnects_per_min") or 0) >= 1 else "warning"
    total = sum(r["connections"] for r in storm)
    again = sum(r["reconnects"] for r in storm)
    resets = sum(r.get("resets_not_by_broker") or 0 for r in storm)
    broker = sum(r.get("closed_by_broker") or 0 for r in storm)
    half_open = sum(r.get("half_open_reconnects") or 0 for r in storm)
    ends = []
    if resets:
        ends.append(f"{resets} reset(s) not sent by the broker")
    if broker:
        ends.append(f"{broker} closed by the broker")
    names = ", ".join(f"{r['client_id']} ({r.get('client_host')}) {r['reconnects_per_min']:.2f}/min" for r in storm[:5])
    return [Finding(
        id="reconnect_storm", incident=2, severity=sev,
        title=f"{len(storm)} client(s) reconnect constantly: {worst['client_id']} {worst['reconnects_per_min']:.2f}×/min, "
              f"median connection life {human_s(worst.get('median_lifetime_s'))}",
        summary=(f"{len(storm)} client(s) opened {total} short-lived connections, "
                 f"{again - half_open} of them replacing an ended one to the same broker"
                 + (f", {half_open} replacing one left half-open: {HALF_OPEN_WORDS}" if half_open else "")
                 + f": {names}"
                 + (f"{'…' if len(storm) > 5 else ''}. Ends of these clients' connections: {', '.join(ends)}" if ends else "")
                 + ". Every reconnect pays a TCP "
                 "handshake, ApiVersions and Metadata before the next send."),
        evidence={"clients": len(storm), "connections": total, "reconnects": again, "half_open_reconnects": half_open,
                  "resets_not_by_broker": resets,
                  "closed_by_broker": broker},
        examples=[{k: r.get(k) for k in ("client_id", "client_host", "connections", "reconnects", "half_open_reconnects",
                                         "reconnects_per_min",
                                         "max_opens_per_interval", "resets", "resets_not_by_broker", "closed_by_broker",
                                         "median_idle_before_end_ms", "median_lifetime_s")}
                  for r in storm[:10]],
        tables=["reconnects_by_client", "resets"], score=score(sev, total),
    )]
