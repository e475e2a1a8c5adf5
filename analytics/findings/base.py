"""The Finding record, the rule registry and ranking."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

Tables = dict[str, list[dict[str, Any]]]
Rule = Callable[[Tables], list["Finding"]]

SEVERITY_WEIGHT = {"critical": 300, "warning": 200, "info": 100}
RULES: dict[str, Rule] = {}

# Findings name the incident they diagnose by number; the number alone means
# nothing to a reader of a report, so every mention carries this reference
# (the stable `<a id="incident-N">` anchors of the repository's docs/incidents.md).
INCIDENTS_DOC = "docs/incidents.md"


# Each incident's heading in docs/incidents.md (tests/analytics/test_docs.py holds the two equal), so a
# finding names its incident in words where the document is out of reach (a report copied elsewhere).
INCIDENT_TITLES: dict[int, str] = {
    1: "The broker hangs up on a producer (RecordBatchTooLarge with acks=0)",
    2: "Somebody resets producer connections (an idle-timeout firewall)",
    3: "Who is writing to me? (client inventory)",
    4: "ISR shrinking and high response times under a connection surge",
    5: "Cross-ocean replication crawls at 64 KB per round trip (TCP level)",
}


def incident_ref(incident: int) -> str:
    """Where incident N is told: `docs/incidents.md#incident-N` (relative to the kafkatap repository)."""
    return f"{INCIDENTS_DOC}#incident-{incident}"


def incident_label(incident: int) -> str:
    """`incident 3: Who is writing to me? (client inventory) — docs/incidents.md#incident-3`."""
    title = INCIDENT_TITLES.get(incident)
    return f"incident {incident}: {title} — {incident_ref(incident)}" if title else f"incident {incident} — {incident_ref(incident)}"


@dataclass
class Finding:
    """One diagnosis. `id` is the rule id (stable, used by scenarios and tests)."""

    id: str
    severity: str  # critical | warning | info
    title: str
    summary: str
    incident: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    score: float = 0.0

    @property
    def incident_doc(self) -> str | None:
        """The incident's account in docs/incidents.md, or None for rules not tied to one."""
        return incident_ref(self.incident) if self.incident else None

    @property
    def incident_title(self) -> str | None:
        """The incident's heading in docs/incidents.md, or None."""
        return INCIDENT_TITLES.get(self.incident) if self.incident else None

    def to_json(self) -> dict[str, Any]:
        return _jsonable({**asdict(self), "incident_doc": self.incident_doc, "incident_title": self.incident_title})


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dt.datetime):
        return v.isoformat()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def rule(rule_id: str) -> Callable[[Rule], Rule]:
    """Register a rule under its id (the id findings carry)."""

    def deco(fn: Rule) -> Rule:
        RULES[rule_id] = fn
        fn.rule_id = rule_id  # type: ignore[attr-defined]
        return fn

    return deco


def score(severity: str, weight: float) -> float:
    """Severity first, then how much evidence (log-scaled so one huge count does not dominate)."""
    return SEVERITY_WEIGHT.get(severity, 0) + min(99.0, 20 * math.log10(1 + max(weight, 0)))


def rank(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-f.score, f.id))


def run_rules(tables: Tables, only: list[str] | None = None) -> list[Finding]:
    """Apply every registered rule (or `only` those ids); a failing rule becomes an info finding, never a crash."""
    out: list[Finding] = []
    for rid, fn in RULES.items():
        if only is not None and rid not in only:
            continue
        try:
            out.extend(fn(tables))
        except Exception as exc:  # a broken rule must not hide the other diagnoses
            out.append(Finding(f"{rid}.failed", "info", f"Rule {rid} could not run", f"{type(exc).__name__}: {exc}", score=1))
    return rank(out)


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def human_s(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def ts(v: Any) -> str | None:
    """A timestamp from a table row as ISO text (rows come from Arrow as datetime)."""
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        return (v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)).isoformat()
    return str(v)


def human_ts(v: Any) -> str:
    """A timestamp for a sentence: 2026-11-20 10:28:00 UTC."""
    if isinstance(v, dt.datetime):
        d = v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)
        return d.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(v)
