"""What one analysis produced: the value the job returns and every renderer reads.

It lives apart from `analytics/job.py` so that renderers (the HTML report,
the stdout summary, scenario checks) depend on the result's shape only, never
on the job that runs Spark: the job imports the renderers, not the other way
round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analytics.findings import Finding


@dataclass
class AnalysisResult:
    """What one analysis produced; `findings` are ranked, most important first."""

    out: Path
    findings: list[Finding]
    overview: dict[str, Any]
    tables: dict[str, list[dict[str, Any]]]
    bucket_s: int
    report_path: Path
    findings_path: Path
    timings: dict[str, float] = field(default_factory=dict)
    compare_mode: str | None = None
    nothing_matched: str | None = None  # the filters kept nothing: a line saying so, with what the recording holds
    window: tuple[int | None, int | None] = (None, None)  # --since/--until in epoch ns (the report says what it did to each table)

    @property
    def windowed(self) -> bool:
        """Whether --since or --until narrowed the analysis."""
        return any(b is not None for b in self.window)

    def finding_ids(self) -> set[str]:
        return {f.id for f in self.findings}

    def by_id(self, finding_id: str) -> list[Finding]:
        return [f for f in self.findings if f.id == finding_id]
