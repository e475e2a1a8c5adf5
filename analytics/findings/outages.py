"""A broker that could not be reached: its clients' connects refused or timing out at the proxy (`broker_outages`)."""

from __future__ import annotations

from analytics.findings.base import Finding, Tables, human_s, human_ts, rule, score, ts

_KIND_WORDS = {"refused": "refused", "unreachable": "unreachable", "timeout": "timed out"}


def _went_away(r: dict) -> str:
    """What the broker did before the failures: closing its live connections is a process stopping (or crashing)."""
    n = r.get("broker_closes_before") or 0
    if n:
        return (f"It closed its {n} live connection(s) as it went away (the first at {human_ts(r.get('first_close'))}): "
                "the broker process stopped or crashed (a restart?), it did not just drop off the network.")
    return ("It closed no live connection first: it was already down, or the network path to it or its host failed "
            "(connections the proxy held to it may have ended later, or never been open).")


def _came_back(r: dict) -> str:
    if r.get("back_at") is not None:
        return f"It accepted connections again at {human_ts(r['back_at'])} (down {human_s(r.get('down_s'))})."
    return "No connection reached it again before the recording (or the window) ends: it may still be down."


@rule("broker_unreachable")
def broker_unreachable(t: Tables) -> list[Finding]:
    """One finding per broker outage: a stretch of connects the proxy could not make (refused, unreachable,
    timed out), whether the broker closed its connections just before (a restart or crash) and when it
    came back. Critical: no client could reach that broker while it lasted. These failed connects are
    left out of the reconnect and concurrency tables, so they make no reconnect storm or connection surge."""
    out = []
    for r in t.get("broker_outages", []):
        broker, attempts = r["broker_addr"], r.get("attempts") or 0
        kinds = "/".join(_KIND_WORDS.get(k, k) for k in r.get("failure_kinds") or []) or "failed"
        out.append(Finding(
            id="broker_unreachable", severity="critical",
            title=(f"Broker {broker} unreachable from {human_ts(r['first_failure'])} to {human_ts(r['last_failure'])}: "
                   f"{attempts} connection attempt(s) {kinds}"),
            summary=(f"The proxy could not connect to {broker} from {human_ts(r['first_failure'])} to "
                     f"{human_ts(r['last_failure'])}: {attempts} attempt(s) by {r.get('clients') or 0} client host(s) were "
                     f"{kinds} (e.g. {r.get('example_detail')}). {_went_away(r)} {_came_back(r)} Check the broker's logs "
                     "around that time (shutdown, crash, out-of-memory kill, long GC pause) and its process and host "
                     "(service manager or orchestrator restarts, disk, network). The failed attempts are not counted as "
                     "client reconnects nor as connections on the broker."),
            evidence={k: (ts(r.get(k)) if k in ("first_failure", "last_failure", "back_at", "first_close") else r.get(k))
                      for k in ("broker_addr", "first_failure", "last_failure", "back_at", "down_s", "attempts", "clients",
                                "client_hosts", "failure_kinds", "broker_closes_before", "first_close", "example_detail")},
            tables=["broker_outages", "broker_closes", "connection_ends"], score=score("critical", attempts),
        ))
    return out
