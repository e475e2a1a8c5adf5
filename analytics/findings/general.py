"""Rules not tied to one incident: error hot spots and throttling."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from analytics.findings.base import Finding, Tables, rule, score, ts
from analytics.findings.oversize_produce import TOO_LARGE
from protocol.error_kinds import PROTOCOL_STEP, RETRIABLE

MIN_ERRORS = 10
# a protocol step seen this many times per connection on average is no longer one join or one rebalance
# per member: members that keep rejoining (a rebalance storm) get a warning, a group's start does not
STEPS_PER_CONNECTION = 3
# a retriable error that one client keeps getting, at least every LASTING_EVERY_S for LASTING_S or longer,
# is not a burst the client rode out (a misspelt topic's UNKNOWN_TOPIC_OR_PARTITION, a lost replica's
# NOT_ENOUGH_REPLICAS): a warning however small its share of all requests
LASTING_S = 10.0
LASTING_EVERY_S = 5.0
LASTING_MIN = 5


def _lasting_s(r: dict) -> float:
    """How long a row's error lasted for its client, when it came back at least every LASTING_EVERY_S; else 0."""
    first, last, n = r.get("first_seen"), r.get("last_seen"), r.get("count") or 0
    if not isinstance(first, dt.datetime) or not isinstance(last, dt.datetime) or n < LASTING_MIN:
        return 0.0
    span = (last - first).total_seconds()
    return span if span >= LASTING_S and span / (n - 1) <= LASTING_EVERY_S else 0.0


def _kind_note(kind: str | None, per_conn: float, repeated: bool, lasting: dict | None, lasted: float) -> str:
    """The sentence a hot spot's summary ends with: what its kind means here ("" for a plain error)."""
    if kind == RETRIABLE and lasting is not None:
        where = lasting.get("topic") or lasting.get("group_or_resource") or lasting.get("api_name")
        return (f" Kafka's clients retry it, but {lasting['client_id']} got it {lasting.get('count')} times over "
                f"{lasted:.0f} s ({where}): not a burst it rode out.")
    if kind == RETRIABLE:
        return " Kafka's clients retry it: normal in a burst, a problem when it lasts."
    if kind == PROTOCOL_STEP:
        side = (f" ({STEPS_PER_CONNECTION} or more): members were told to rejoin again and again (a rebalance storm?)."
                if repeated else f" (under {STEPS_PER_CONNECTION}): a few joins or rebalances per member.")
        return f" Not an error but a step of the protocol, {per_conn:.1f} per connection that saw it{side}"
    return ""


@rule("error_hotspot")
def error_hotspot(t: Tables) -> list[Finding]:
    """The most frequent error names (those incident rules already explain are left to them).

    Protocol steps (a first JoinGroup's MEMBER_ID_REQUIRED, a Heartbeat's REBALANCE_IN_PROGRESS) are
    how the protocol works: a group's start gives each member's connection one, which is info at most.
    Only when the connections saw STEPS_PER_CONNECTION or more each on average (members rejoining
    again and again: a rebalance storm) is it a warning. Retriable ones are named as such. A name
    counts per kind: REBALANCE_IN_PROGRESS on a Heartbeat is a step, on an OffsetCommit a lost commit.
    Errors kafkatap injected (`injected`: a Kafka fault) are not the broker's: they count for no hot spot
    (the faults rules tell how clients took them), and a hot spot names how many of its name were injected.
    """
    by_name: dict[tuple[str, str | None], list[dict]] = defaultdict(list)
    injected: dict[tuple[str, str | None], int] = defaultdict(int)
    for r in t.get("errors_by_name", []):
        if r.get("injected"):
            injected[(r["error_name"], r.get("kind"))] += r.get("count") or 0
        elif r.get("error_name") not in TOO_LARGE:
            by_name[(r["error_name"], r.get("kind"))].append(r)
    total_req = ((t.get("overview") or [{}])[0]).get("requests") or 0
    out = []
    for (name, kind), rs in by_name.items():
        n = sum(r.get("count") or 0 for r in rs)
        if n < MIN_ERRORS:
            continue
        rs.sort(key=lambda r: -(r.get("count") or 0))
        share = n / total_req if total_req else 0
        per_conn = n / max(1, sum(r.get("connections") or 0 for r in rs))
        repeated = kind != PROTOCOL_STEP or per_conn >= STEPS_PER_CONNECTION
        lasted, lasting = max(((_lasting_s(r), r) for r in rs), key=lambda x: x[0]) if kind == RETRIABLE else (0.0, None)
        sev = "warning" if (share >= 0.001 and repeated) or lasted else "info"
        apis = sorted({r.get("api_name") for r in rs})
        clients = sorted({r.get("client_id") for r in rs})
        label = {RETRIABLE: " (retriable)", PROTOCOL_STEP: " (protocol step)"}.get(kind or "", "")
        why = _kind_note(kind, per_conn, repeated, lasting if lasted else None, lasted)
        if injected[(name, kind)]:
            why += f" Not counted here: {injected[(name, kind)]:,} more injected by kafkatap (Kafka faults)."
        out.append(Finding(
            id="error_hotspot", severity=sev,
            title=f"{n:,} × {name}{label} on {', '.join(apis)} ({len(clients)} client(s))",
            summary=f"{name} appeared {n:,} times ({share:.3%} of requests), most on {rs[0].get('topic') or rs[0].get('group_or_resource') or '?'} from {rs[0].get('client_id')}.{why}",
            evidence={"error": name, "kind": kind, "count": n, "share_of_requests": share, "apis": apis, "clients": clients[:20],
                      "injected_not_counted": injected[(name, kind)]},
            examples=[{"conn_id": r.get("example_conn_id"), "first_seen": ts(r.get("first_seen")), "topic": r.get("topic"),
                       "client_id": r.get("client_id"), "count": r.get("count")} for r in rs[:5]],
            tables=["errors_by_name", "errors_over_time"], score=score(sev, n),
        ))
    return out


@rule("throttled_clients")
def throttled_clients(t: Tables) -> list[Finding]:
    rows = t.get("throttling", [])
    if not rows:
        return []
    total = sum(r.get("total_throttle_ms") or 0 for r in rows)
    clients = sorted({r.get("client_id") for r in rows})
    return [Finding(
        id="throttled_clients", severity="warning" if total >= 10_000 else "info",
        title=f"Brokers throttled {len(clients)} client(s) for {total / 1000:.1f} s in total",
        summary=f"Quota throttling (throttle_time_ms > 0) hit {', '.join(clients[:5])}{'…' if len(clients) > 5 else ''}.",
        evidence={"clients": clients[:50], "total_throttle_ms": total},
        examples=[{k: r.get(k) for k in ("client_id", "api_name", "broker_addr", "throttled_requests", "total_throttle_ms")} for r in rows[:5]],
        tables=["throttling"], score=score("warning" if total >= 10_000 else "info", total / 1000),
    )]
