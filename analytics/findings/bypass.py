"""Clients were sent around the proxy: most of their traffic is missing from the recording.

In explicit mode the proxy forwards bytes unchanged; a broker that advertises
its own address hands clients that address in its Metadata (or
FindCoordinator) response, and from then on they produce and fetch directly.
The proxy records the `bypass` addresses on those responses' rows
(`proxy.bypass`); this rule turns them into the report's first warning, since
every other table of such a recording describes only the bootstrap traffic.
"""

from __future__ import annotations

from analytics.findings.base import Finding, Tables, rule, score, ts


@rule("clients_bypass_proxy")
def clients_bypass_proxy(t: Tables) -> list[Finding]:
    rows = [r for r in t.get("bypass", []) if r.get("address")]
    if not rows:
        return []
    addrs = [r["address"] for r in rows]
    responses = sum(r.get("responses") or 0 for r in rows)
    clients = sorted({c for r in rows for c in (r.get("client_ids") or []) if c})
    told_by = sorted({b for r in rows for b in (r.get("told_by") or []) if b})
    shown = ", ".join(addrs[:5]) + (f" and {len(addrs) - 5} more" if len(addrs) > 5 else "")
    return [Finding(
        id="clients_bypass_proxy", severity="critical",
        title=f"Clients were sent around the proxy to {shown}: their traffic is not in this recording",
        summary=(f"{responses} response(s) through the proxy told {len(clients) or 'the'} client(s) to connect to broker "
                 f"address(es) the proxy does not listen for ({shown}). From then on those clients produced and "
                 "fetched directly, so this recording holds little more than their bootstrap requests. Run the proxy "
                 "in cluster mode (`kafkatap proxy --cluster BOOTSTRAP:PORT --listen HOST:PORT`: it rewrites broker "
                 "addresses, no broker change), or set each broker's advertised.listeners to a proxy listener. If "
                 "the proxy already ran in cluster mode, a broker got no listener (its port was taken): the proxy "
                 "logged 'cannot listen for a broker'; free that port or pin one with --broker-port NODE_ID=PORT."),
        evidence={"addresses": addrs, "responses": responses, "clients": clients[:20], "told_by": told_by},
        examples=[{"address": r["address"], "responses": r.get("responses"), "clients": r.get("client_ids"),
                   "apis": r.get("apis"), "first_seen": ts(r.get("first_seen")), "last_seen": ts(r.get("last_seen")),
                   "conn_id": r.get("example_conn_id")} for r in rows[:5]],
        tables=["bypass"], score=score("critical", responses * 10),
    )]
