"""Injected Kafka faults (issue 17): how each client library reacted, and retries that stored records twice.

Why findings and not only tables: a fault injection run asks one question —
did every client come back, how fast, at what cost — and the answer must be
at the top of the report, per library, where a scenario can check it. The
rows come from `fault_reactions_by_library` / `fault_reactions`
(`analytics.transforms.faults`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from analytics.findings.base import Finding, Tables, rule, score


def _fmt_ms(v: Any) -> str:
    return "—" if v is None else (f"{v / 1000:.1f} s" if v >= 1000 else f"{v:.0f} ms")


@rule("kafka_fault_reactions")
def kafka_fault_reactions(t: Tables) -> list[Finding]:
    """One finding per injected fault (kind × error × API): per library, recovered or not, how fast, extra requests."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in t.get("fault_reactions_by_library", []):
        groups[(r.get("kind") or "", r.get("detail") or "", r.get("api_name") or "")].append(r)
    out = []
    for (kind, detail, api), rows in sorted(groups.items()):
        faults = sum(r.get("faults") or 0 for r in rows)
        stuck = [r for r in rows if (r.get("recovered") or 0) < (r.get("faults") or 0)]
        libs: dict[str, dict[str, Any]] = {}
        for r in rows:
            lib = libs.setdefault(r.get("library") or "(unknown)", {
                "clients": [], "faults": 0, "recovered": 0, "recover_max_ms": None, "recover_p50_ms": [],
                "retries": 0, "metadata_refreshes": 0, "coordinator_lookups": 0, "rebalance_requests": 0,
                "reconnects": 0, "duplicate_records": 0})
            lib["clients"].append(r.get("client_id"))
            for k in ("faults", "recovered", "retries", "metadata_refreshes", "coordinator_lookups",
                      "rebalance_requests", "reconnects", "duplicate_records"):
                lib[k] += r.get(k) or 0
            if r.get("recover_max_ms") is not None:
                lib["recover_max_ms"] = max(lib["recover_max_ms"] or 0, r["recover_max_ms"])
            if r.get("recover_p50_ms") is not None:
                lib["recover_p50_ms"].append(r["recover_p50_ms"])
        for lib in libs.values():
            p50s = sorted(lib.pop("recover_p50_ms"))
            lib["recover_p50_ms"] = p50s[len(p50s) // 2] if p50s else None
        what = f"{detail} on {api}" if detail else f"{kind} on {api}"
        per_lib = "; ".join(
            f"{name}: {v['recovered']}/{v['faults']} recovered (median {_fmt_ms(v['recover_p50_ms'])}, max "
            f"{_fmt_ms(v['recover_max_ms'])}), {v['retries']} retries, {v['metadata_refreshes']} metadata refreshes, "
            f"{v['coordinator_lookups']} coordinator lookups, {v['reconnects']} reconnects"
            + (f", {v['duplicate_records']} duplicate records" if v["duplicate_records"] else "")
            for name, v in sorted(libs.items()))
        sev = "warning" if stuck else "info"
        out.append(Finding(
            id="kafka_fault_reactions", severity=sev,
            title=f"Injected {what} ×{faults}: {len(libs)} client librar{'y' if len(libs) == 1 else 'ies'}"
                  + (f", {sum((r.get('faults') or 0) - (r.get('recovered') or 0) for r in stuck)} not recovered"
                     if stuck else ", all recovered"),
            summary=(f"kafkatap injected {kind} ({what}) {faults} time(s). What each client library did next, until "
                     f"its next successful {api}: {per_lib}. 'Not recovered' means no successful {api} from that "
                     "client within 120 s or before its next injected fault on that API."),
            evidence={"kind": kind, "detail": detail, "api": api, "faults": faults, "libraries": libs},
            examples=[{k: r.get(k) for k in ("library", "client_id", "faults", "recovered", "recover_p50_ms",
                                              "recover_max_ms", "retries", "metadata_refreshes", "coordinator_lookups",
                                              "rebalance_requests", "reconnects", "duplicate_records")} for r in rows[:10]],
            tables=["fault_reactions_by_library", "fault_reactions"], score=score(sev, faults),
        ))
    return out


@rule("fault_retry_duplicates")
def fault_retry_duplicates(t: Tables) -> list[Finding]:
    """Produce answered with an error after the broker wrote it, and the client sent the records again."""
    rows = [r for r in t.get("fault_reactions", []) if (r.get("duplicate_records") or 0) > 0]
    if not rows:
        return []
    total = sum(r["duplicate_records"] for r in rows)
    clients = sorted({r.get("client_id") or "?" for r in rows})
    return [Finding(
        id="fault_retry_duplicates", severity="warning",
        title=f"{total} record(s) written twice: retries after a rewritten Produce error by {', '.join(clients[:5])}",
        summary=(f"The broker stored {len(rows)} Produce request(s) whose answer was rewritten to an error, and the "
                 f"non-idempotent producer(s) {', '.join(clients[:5])} sent the same records again: {total} duplicate "
                 "record(s). Enable idempotence (enable.idempotence=true, the default of current clients) or "
                 "transactions so that a retry after a lost answer cannot duplicate."),
        evidence={"duplicate_records": total, "requests": len(rows), "clients": clients},
        examples=[{k: r.get(k) for k in ("at", "client_id", "library", "detail", "topics", "duplicate_records", "retries",
                                          "conn_id", "correlation_id")} for r in rows[:5]],
        tables=["fault_reactions"], score=score("warning", total),
    )]
