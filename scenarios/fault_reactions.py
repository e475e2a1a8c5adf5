"""The check the Kafka-fault scenarios share: every client library met the fault, is named, and came back.

`leader-moves` and `coordinator-lost` answer requests of one client per
library in the broker's place and expect the `kafka_fault_reactions` finding to
compare the libraries. The check must fail when the comparison is not one:
a library the analysis could not name ("(unknown)", a client that sent no
ApiVersions v3) would merge clients of different stacks, and an episode the
client never recovered from is exactly what these scenarios exist to show.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

UNKNOWN_LIBRARY = "(unknown)"  # analytics.findings.faults' name for a client without software name

Check = Callable[[list[dict], object], "str | None"]


def all_libraries_recovered(api: str, error: str, clients: Iterable[str], *,
                            extra: Callable[[dict[str, dict]], str | None] | None = None) -> Check:
    """A check (`scenarios.spec.Check`) of the finding for `error` on `api`.

    It holds when each of `clients` (client ids, one per library) is in the
    finding under a named library of its own, and every episode of every
    library recovered, except those whose client's recording ended first.
    `extra` adds a scenario's own condition on the per-library evidence.
    """
    want = tuple(clients)

    def check(found: list[dict], report: object) -> str | None:
        mine = [f for f in found if f.get("evidence", {}).get("api") == api
                and f.get("evidence", {}).get("detail") == error]
        if not mine:
            return f"no reaction finding for {error} on {api}"
        libs: dict[str, dict] = mine[0]["evidence"].get("libraries") or {}
        library_of = {c: name for name, v in libs.items() for c in v.get("clients") or []}
        missing = [c for c in want if c not in library_of]
        if missing:
            return f"{', '.join(missing)} did not meet {error} on {api} (libraries seen: {sorted(libs)})"
        unnamed = sorted(c for c in want if library_of[c] == UNKNOWN_LIBRARY)
        if unnamed:
            return f"the analysis could not name the library of {', '.join(unnamed)}"
        if len({library_of[c] for c in want}) < len(want):
            return f"{', '.join(want)} should be {len(want)} libraries, the analysis saw {sorted(libs)}"
        stuck = sorted(f"{name} ({v.get('episodes', 0) - v.get('episodes_recovered', 0)} of {v.get('episodes', 0)})"
                       for name, v in libs.items()
                       if not v.get("episodes_recovered")
                       or v.get("episodes", 0) - v.get("episodes_recovered", 0) > v.get("episodes_cut_short", 0))
        if stuck:
            return f"episodes never recovered from {error} on {api}: {', '.join(stuck)}"
        return extra(libs) if extra is not None else None

    return check
