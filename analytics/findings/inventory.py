"""Incident 3 (docs/incidents.md#incident-3): who is writing to me? The client inventory in one sentence."""

from __future__ import annotations

from collections import Counter

from analytics.findings.base import Finding, Tables, human_bytes, rule, score


@rule("client_inventory")
def client_inventory(t: Tables) -> list[Finding]:
    """Summarize the inventory: how many producers/consumers/admins and who is busiest."""
    every = t.get("client_inventory", [])
    # a broker's own connections (role "broker": the brokers talk through this listener too) are no client of it
    rows = [r for r in every if r.get("role") != "broker"]
    brokers = [r for r in every if r.get("role") == "broker"]
    not_counted = (f" Not counted: {len(brokers)} of the brokers' own clients "
                   f"({', '.join(sorted(r['client_id'] or '-' for r in brokers)[:5])}{', …' if len(brokers) > 5 else ''}), "
                   "recorded because the brokers also talk to each other through this listener: transaction markers, "
                   "replication, share-group state (role \"broker\" in the inventory)." if brokers else "")
    if not rows:
        if not brokers:
            return []
        return [Finding(  # the proxy sees only the cluster's own traffic: say so rather than nothing
            id="client_inventory", incident=3, severity="info",
            title=f"No clients; {len(brokers)} of the brokers' own clients only",
            summary="No client's requests were recorded." + not_counted,
            evidence={"clients": 0, "roles": {}, "producers": 0, "brokers_own": len(brokers)},
            examples=[{k: r.get(k) for k in ("client_id", "client_host", "role", "requests", "brokers")}
                      for r in brokers[:5]],
            tables=["client_inventory"], score=score("info", len(brokers)),
        )]
    roles: Counter[str] = Counter()
    for r in rows:
        for role in (r.get("role") or "other").split(", "):
            roles[role] += 1
    top = rows[:5]
    producers = [r for r in rows if "producer" in (r.get("role") or "")]
    busiest = top[0]
    topics = ", ".join((busiest.get("topics_produced") or []) + (busiest.get("topics_consumed") or [])) or "no topics"
    mix = ", ".join(f"{n} {role}{'s' if n != 1 else ''}" for role, n in roles.most_common())
    if sum(roles.values()) > len(rows):  # "consumer, group member" is one client in two roles: the counts add up to more
        mix += "; a client can hold several roles"
    return [Finding(
        id="client_inventory", incident=3, severity="info",
        title=f"{len(rows)} clients ({mix}); busiest: {busiest['client_id']} ({busiest.get('role')})",
        summary=(f"{len(rows)} distinct clients (client_id × host): {mix}. The busiest, {busiest['client_id']} at {busiest.get('client_host')}, "
                 f"sent {busiest.get('requests'):,} requests ({busiest.get('requests_per_s')}/s, {human_bytes(busiest.get('bytes_per_s'))}/s) "
                 f"on {topics}. {len(producers)} producer(s) write to "
                 f"{len({tp for r in producers for tp in (r.get('topics_produced') or [])})} topic(s)." + not_counted),
        evidence={"clients": len(rows), "roles": dict(roles), "producers": len(producers), "brokers_own": len(brokers)},
        examples=[{k: r.get(k) for k in ("client_id", "client_host", "role", "software_name", "requests", "requests_per_s",
                                         "records_produced_per_s", "bytes_per_s", "connections", "topics_produced", "topics_consumed")} for r in top],
        tables=["client_inventory", "topic_view"], score=score("info", len(rows)),
    )]
