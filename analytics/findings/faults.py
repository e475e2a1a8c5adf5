"""Injected Kafka faults (issue 17): how each client library came through them, and retries that stored records twice.

Why findings and not only tables: a fault injection run asks one question —
did every client come back, how fast, at what cost — and the answer must be
at the top of the report, per library, where a scenario can check it. The
rows come from `fault_reactions_by_library` / `fault_reactions`
(`analytics.transforms.faults`).

A fault that lasts (`for=`, `nth=`, a client retrying into it) is many
injections: the finding speaks in episodes — injections on one client and API
with no successful request of it between them — and says when each client
came back, from the episode's first injection (the outage it saw) and from
its last (how fast once the fault stopped). Each kind is worded by what it
does: an error is recovered from; a dropped connection is answered again; a
delay or throttle holds a request, so what counts is whether the client
waited for the answer or gave up (its connection closed first). Notes the
proxy marked "(not applied)" are counted apart, never as injections; a
rewrite over an answer the broker had refused itself is named, for what the
client did next was the broker's refusal's as much as the fault's.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from analytics.findings.base import Finding, Tables, rule, score
from analytics.transforms.faults import WINDOW_S

_SUMS = ("faults", "recovered", "not_applied", "over_broker_error", "episodes", "episodes_recovered",
         "episodes_cut_short", "answered", "retries", "metadata_refreshes", "coordinator_lookups", "rebalance_requests",
         "reconnects", "duplicate_records")
_MAXES = ("recover_max_ms", "after_last_max_ms", "wait_max_ms")
_MEDIANS = ("recover_p50_ms", "after_last_p50_ms", "wait_p50_ms")


def _fmt_ms(v: Any) -> str:
    return "—" if v is None else (f"{v / 1000:.1f} s" if v >= 1000 else f"{v:.0f} ms")


def _n(k: int, one: str, many: str | None = None) -> str:
    return f"{k} {one if k == 1 else (many or one + 's')}"


def _per_library(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    libs: dict[str, dict[str, Any]] = {}
    meds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        name = r.get("library") or "(unknown)"
        lib = libs.setdefault(name, {"clients": [], **{k: 0 for k in _SUMS}, **{k: None for k in _MAXES}})
        lib["clients"].append(r.get("client_id"))
        for k in _SUMS:
            lib[k] += r.get(k) or 0
        for k in _MAXES:
            if r.get(k) is not None:
                lib[k] = max(lib[k] or 0, r[k])
        for k in _MEDIANS:
            if r.get(k) is not None:
                meds[name][k].append(r[k])
    for name, lib in libs.items():
        for k in _MEDIANS:  # the median of the clients' medians (one client: its own)
            vals = sorted(meds[name][k])
            lib[k] = vals[len(vals) // 2] if vals else None
    return libs


def _costs(v: dict[str, Any], api: str) -> str:
    out = (f"{_n(v['retries'], f'{api} request')}, "
           f"{_n(v['metadata_refreshes'], 'metadata refresh', 'metadata refreshes')}, "
           f"{_n(v['coordinator_lookups'], 'coordinator lookup')}, {_n(v['reconnects'], 'reconnect')}")
    if v["rebalance_requests"]:
        out += f", {_n(v['rebalance_requests'], 'rebalance request')}"
    if v["duplicate_records"]:
        out += f", {_n(v['duplicate_records'], 'duplicate record')}"
    return out


def _came_back(v: dict[str, Any], api: str, word: str, first: str, last: str) -> str:
    """`1/1 episodes recovered 10.3 s after the first injection, 180 ms after the last` (medians; max when several)."""
    s = f"{v['episodes_recovered']}/{_n(v['episodes'], 'episode')} {word}"
    if v["episodes_recovered"]:
        many = v["episodes_recovered"] > 1
        s += (f" {_fmt_ms(v['recover_p50_ms'])}{' (median; max ' + _fmt_ms(v['recover_max_ms']) + ')' if many else ''}"
              f" after the {first}, {_fmt_ms(v['after_last_p50_ms'])}"
              f"{' (median; max ' + _fmt_ms(v['after_last_max_ms']) + ')' if many else ''} after the {last}")
    stuck = v["episodes"] - v["episodes_recovered"]
    if stuck:
        s += (f"; {stuck} not: no successful {api} within {WINDOW_S} s after the {last}"
              + (f" ({v['episodes_cut_short']} of them: the client's recording ended sooner)"
                 if v["episodes_cut_short"] else ""))
    return s


def _held(v: dict[str, Any], api: str) -> str:
    """delay / throttle: the held requests answered (and how long the client waited), the ones it gave up on."""
    gave_up = v["faults"] - v["answered"]
    s = (f"{v['answered']}/{v['faults']} answered (the client waited median {_fmt_ms(v['wait_p50_ms'])}, max "
         f"{_fmt_ms(v['wait_max_ms'])})")
    s += (f", {gave_up} never answered (the connection closed first: the client timed out or gave up)" if gave_up
          else ", none given up on")
    if v["episodes"] > v["episodes_recovered"]:
        s += (f"; {v['episodes'] - v['episodes_recovered']}/{_n(v['episodes'], 'episode')} with no untouched "
              f"successful {api} within {WINDOW_S} s after the last hold")
    return s


@rule("kafka_fault_reactions")
def kafka_fault_reactions(t: Tables) -> list[Finding]:
    """One finding per injected fault (kind × detail × API): per library, in episodes, how each came through."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in t.get("fault_reactions_by_library", []):
        groups[(r.get("kind") or "", r.get("detail") or "", r.get("api_name") or "")].append(r)
    out = []
    for (kind, detail, api), rows in sorted(groups.items()):
        libs = _per_library(rows)
        faults = sum(v["faults"] for v in libs.values())
        episodes = sum(v["episodes"] for v in libs.values())
        stuck = sum(v["episodes"] - v["episodes_recovered"] for v in libs.values())
        not_applied = sum(v["not_applied"] for v in libs.values())
        gave_up = sum(v["faults"] - v["answered"] for v in libs.values())
        over_refusal = sum(v["over_broker_error"] for v in libs.values())
        if kind == "error":
            what = f"{detail or kind} on {api}"
            per = {n: f"{_came_back(v, api, 'recovered', 'first injection', 'last')}; {_costs(v, api)}"
                   for n, v in libs.items() if v["faults"]}
            outcome = f"{stuck} episode(s) not recovered" if stuck else "all recovered"
            meaning = (f"An episode is a run of injections on one client and {api} with no successful {api} between "
                       f"them; it recovered at the client's first successful {api} after its last injection, and "
                       f"'not recovered' means none came within {WINDOW_S} s of that injection. The {api} requests counted "
                       "include the faulted retries and the recovering one.")
            warn = stuck > 0
        elif kind == "drop":
            what = f"connection closed on {api}"
            per = {n: (f"{_came_back(v, api, 'answered again', 'first drop', 'last')}; {_costs(v, api)}")
                   for n, v in libs.items() if v["faults"]}
            outcome = f"{stuck} episode(s) with no answer" if stuck else "all answered again"
            meaning = (f"kafkatap closed the connection instead of forwarding the {api}; an episode is a run of such "
                       f"drops with no successful {api} between them, answered again at the client's first successful "
                       f"{api} after the last one (none within {WINDOW_S} s: no answer).")
            warn = stuck > 0
        else:  # delay / throttle: the request is held, never refused — "recovered" means nothing for it
            verb = "held" if kind == "delay" else "throttled"
            what = f"{api} {verb} {detail}" if detail else f"{kind} on {api}"
            per = {n: f"{_held(v, api)}; {_n(v['reconnects'], 'reconnect')}, "
                      f"{_n(v['retries'], f'{api} request')} after the held ones"
                   for n, v in libs.items() if v["faults"]}
            outcome = (f"{gave_up} never answered (the client gave up)" if gave_up
                       else "every held request answered")
            meaning = ("delay holds the response (and those behind it); throttle sets throttle_time_ms and mutes the "
                       "connection as a broker does. A request never answered is one whose connection closed before "
                       "its answer: the client timed out (request.timeout.ms) or gave up, and its retries and "
                       "reconnects follow.")
            warn = gave_up > 0 and stuck > 0  # it gave up and got no untouched answer afterwards
        per_lib = "; ".join(f"{name}: {text}" for name, text in sorted(per.items())) or "none applied"
        title = (f"Injected {what} ×{faults} in {_n(episodes, 'episode')}: {outcome}" if faults
                 else f"Injected {what}: none applied")
        if not_applied:
            title += f" ({not_applied} more noted but not applied)"
        sev = "warning" if warn else "info"
        out.append(Finding(
            id="kafka_fault_reactions", severity=sev, title=title,
            summary=(f"kafkatap injected {kind} ({what}) {faults} time(s) in {_n(episodes, 'episode')}. {per_lib}. "
                     f"{meaning}"
                     + (f" {not_applied} injection(s) were noted '(not applied)' by the proxy (the response edit "
                        "failed: the client got the broker's own answer) and are not counted." if not_applied else "")
                     + (f" {over_refusal} injection(s) rewrote an answer in which the broker had already refused "
                        "the request itself (broker_error): the client's retries there follow the broker's refusal "
                        "as much as the fault, and a resend duplicated nothing." if over_refusal else "")),
            evidence={"kind": kind, "detail": detail, "api": api, "faults": faults, "episodes": episodes,
                      "not_recovered": stuck, "not_applied": not_applied, "over_broker_error": over_refusal,
                      "libraries": libs},
            examples=[{k: r.get(k) for k in ("library", "client_id", "faults", "episodes", "episodes_recovered",
                                              "recover_p50_ms", "after_last_p50_ms", "answered", "wait_p50_ms",
                                              "retries", "metadata_refreshes", "coordinator_lookups", "reconnects",
                                              "duplicate_records", "not_applied")} for r in rows[:10]],
            tables=["fault_reactions_by_library", "fault_reactions"], score=score(sev, max(faults, 1)),
        ))
    return out


@rule("fault_retry_duplicates")
def fault_retry_duplicates(t: Tables) -> list[Finding]:
    """Produce answered with an error after the broker wrote it, and the client sent the same batch again."""
    rows = [r for r in t.get("fault_reactions", []) if (r.get("duplicate_records") or 0) > 0]
    if not rows:
        return []
    total = sum(r["duplicate_records"] for r in rows)
    clients = sorted({r.get("client_id") or "?" for r in rows})
    return [Finding(
        id="fault_retry_duplicates", severity="warning",
        title=f"{total} record(s) written twice: retries after a rewritten Produce error by {', '.join(clients[:5])}",
        summary=(f"The broker stored {len(rows)} Produce request(s) whose answer was rewritten to an error, and the "
                 f"non-idempotent producer(s) {', '.join(clients[:5])} sent the same batch again (a Produce with the "
                 f"same topics, record count and bytes before the next success): {total} duplicate record(s). "
                 "kafkatap keeps no batch bytes, so a new batch of exactly the same size would look the same (a client "
                 "that sent such a batch before the fault too is left out: it sends batches of one size). Enable "
                 "idempotence (enable.idempotence=true, the default of current clients) or transactions so that a "
                 "retry after a lost answer cannot duplicate."),
        evidence={"duplicate_records": total, "requests": len(rows), "clients": clients},
        examples=[{k: r.get(k) for k in ("at", "client_id", "library", "detail", "topics", "duplicate_records", "resends",
                                          "retries", "conn_id", "correlation_id")} for r in rows[:5]],
        tables=["fault_reactions"], score=score("warning", total),
    )]
