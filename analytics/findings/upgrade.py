"""Clients that send request versions Kafka 4.0 removed (KIP-896): what stands between a cluster and Kafka 4.

Kafka 4.0 stopped serving the request versions of clients older than Kafka 2.1 (and of
clients pinned to old versions: kafka-python's `api_version`, librdkafka's
`api.version.request=false` with `broker.version.fallback`). A 3.x broker serves them, so
nothing fails until the brokers are upgraded; then every such connection is closed at its
first old request, and the client sees only disconnects. The proxy names each connection's
removed versions (`connections.removed_in_kafka_4`); this rule lists the clients (the
`kafka_4_upgrade` table), critical when a broker already closed some of them at such a request (an idle
close or a restart does not count).
"""

from __future__ import annotations

from analytics.findings.base import Finding, Tables, rule, score, ts

WHAT_TO_DO = ("Upgrade these clients (Kafka's Java clients 2.1 or later, a current librdkafka or kafka-python), or drop "
              "their version pins (kafka-python's api_version, librdkafka's api.version.request=false with "
              "broker.version.fallback), before the brokers move to Kafka 4.x.")


@rule("kafka_4_removed_versions")
def kafka_4_removed_versions(t: Tables) -> list[Finding]:
    rows = [r for r in t.get("kafka_4_upgrade", []) if r.get("connections")]
    if not rows:
        return []
    clients = [r.get("client_id") or "(no client id)" for r in rows]
    versions = sorted({v for r in rows for v in (r.get("versions") or [])})
    conns = sum(r["connections"] for r in rows)
    closed = sum(r.get("closed_by_broker") or 0 for r in rows)
    shown = ", ".join(clients[:5]) + (f" and {len(clients) - 5} more" if len(clients) > 5 else "")
    if closed:
        sev = "critical"
        title = (f"{len(rows):,} client(s) send request versions Kafka 4.0 removed ({', '.join(versions[:4])}): "
                 f"the broker closed {closed:,} of their connections")
        now = (f"A broker already closed {closed:,} of their {conns:,} connection(s) at a request of such a version, as "
               "a Kafka 4.x broker does (each connection's inferred cause says which): these clients cannot work with it.")
    else:
        sev = "warning"
        title = (f"{len(rows):,} client(s) send request versions Kafka 4.0 removed ({', '.join(versions[:4])}): "
                 "a Kafka 4.x broker will refuse them")
        now = (f"The brokers recorded here served all {conns:,} of their connection(s); a Kafka 4.x broker closes such a "
               "connection at its first request of a removed version (KIP-896), and the client sees only disconnects.")
    return [Finding(
        id="kafka_4_removed_versions", severity=sev, title=title,
        summary=f"{shown} sent {', '.join(versions)}. {now} {WHAT_TO_DO}",
        evidence={"clients": clients[:20], "versions": versions, "connections": conns, "closed_by_broker": closed},
        examples=[{"client_id": r.get("client_id"), "versions": r.get("versions"), "connections": r.get("connections"),
                   "client_software": r.get("client_software"), "client_hosts": (r.get("client_hosts") or [])[:5],
                   "conn_id": r.get("example_conn_id"), "last_seen": ts(r.get("last_seen"))} for r in rows[:5]],
        tables=["kafka_4_upgrade"], score=score(sev, conns),
    )]
