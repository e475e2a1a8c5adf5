"""Connections the proxy relayed without decoding: their traffic is missing from every other table.

TLS the proxy does not terminate is relayed byte for byte (pass-through) and recorded as opaque: a
recording of a TLS cluster then reads "0 requests, 5 connections, 0 client ids", as if it were empty.
Other connections stop being decoded from some byte on (not Kafka, an oversize or garbled frame,
decoding that fell behind); the proxy records why in `opaque_reason`. This rule says how many, what
the recording is missing, and how to decode TLS (`opaque_connections` table, built by the job only
when the overview counts such connections).
"""

from __future__ import annotations

from analytics.findings.base import Finding, Tables, human_bytes, rule, score, ts

TLS_HOW = ("To decode them, terminate TLS at the proxy: `kafkatap proxy … --tls-cert CERT --tls-key KEY` (the clients "
           "then trust the proxy's certificate, issued for --advertise-host, instead of the brokers') and originate it "
           "to the brokers' SSL or SASL_SSL listener with `--upstream-tls-ca CA` (README: \"Choosing a mode\").")

# what each kind of the proxy's opaque_reason means for the reader, where it says more than the reason itself
KIND_NOTES = {
    "http": "something spoke HTTP to a Kafka port (a health check, a browser, a misdirected client)",
    "sasl_v0": "a client authenticated with SaslHandshake v0, whose raw SASL tokens are not framed: update the client",
    "observation_backlog": "the proxy's decoding fell behind the relay (an overloaded proxy): give it more CPU or --workers",
    "truncated": "only a frame cut off by the connection's end: nothing before it is missing",
}
SHARE_WARNING = 0.1  # non-TLS opaque connections at this share of all connections make the report's numbers short


def _examples(rows: list[dict]) -> list[dict]:
    return [{"kind": r.get("kind"), "connections": r.get("connections"), "conn_id": r.get("example_conn_id"),
             "reason": r.get("example_reason"), "client_hosts": (r.get("client_hosts") or [])[:5],
             "brokers": (r.get("brokers") or [])[:5], "first_opened": ts(r.get("first_opened"))} for r in rows[:5]]


@rule("opaque_connections")
def opaque_connections(t: Tables) -> list[Finding]:
    rows = [r for r in t.get("opaque_connections", []) if r.get("connections")]
    if not rows:
        return []
    ov = (t.get("overview") or [{}])[0]
    total = ov.get("connections") or sum(r["connections"] for r in rows)
    out = []
    tls = [r for r in rows if r.get("kind") == "tls"]
    if tls:
        n = sum(r["connections"] for r in tls)
        moved = sum((r.get("bytes_from_client") or 0) + (r.get("bytes_from_broker") or 0) for r in tls)
        brokers = sorted({b for r in tls for b in (r.get("brokers") or [])})
        out.append(Finding(
            id="opaque_connections", severity="warning",
            title=f"{n:,} of {total:,} connection(s) were TLS, relayed opaque: not decoded, their requests are not in this recording",
            summary=(f"The proxy saw a TLS handshake on {n:,} connection(s) to {', '.join(brokers[:3]) or 'the brokers'} and relayed "
                     f"their {human_bytes(moved)} byte for byte (TLS pass-through): no request, client id or latency of "
                     f"theirs is in the tables. {TLS_HOW}"),
            evidence={"connections": n, "of_connections": total, "bytes": moved, "brokers": brokers[:20]},
            examples=_examples(tls), tables=["opaque_connections"], score=score("warning", n),
        ))
    other = [r for r in rows if r.get("kind") != "tls"]
    if other:
        n = sum(r["connections"] for r in other)
        lossy = sum(r["connections"] for r in other if r.get("kind") != "truncated")
        sev = "warning" if lossy and (lossy / max(total, 1) >= SHARE_WARNING or not ov.get("requests")) else "info"
        kinds = ", ".join(f"{r.get('kind')} ×{r['connections']:,}" for r in other)
        notes = "; ".join(f"{r.get('kind')}: {KIND_NOTES[r.get('kind')]}" for r in other if r.get("kind") in KIND_NOTES)
        out.append(Finding(
            id="opaque_connections", severity=sev,
            title=f"{n:,} connection(s) stopped being decoded ({kinds}): what followed is not in this recording",
            summary=(f"From some byte on the proxy relayed these connections without decoding them (bytes still forwarded "
                     f"unchanged), so their later requests are missing from the tables. Each connection's `opaque_reason` says "
                     f"why and at which stream offset (e.g. {other[0].get('example_reason') or '?'})."
                     + (f" {notes}." if notes else "")),
            evidence={"connections": n, "of_connections": total, "kinds": {r.get("kind"): r["connections"] for r in other},
                      "requests_decoded_before": sum(r.get("requests_decoded") or 0 for r in other)},
            examples=_examples(other), tables=["opaque_connections"], score=score(sev, lossy),
        ))
    return out
