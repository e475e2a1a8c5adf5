"""What `kafkatap analyze` writes into OUT, so a run can clear its own earlier output and nothing else.

A second analysis into the same OUT must leave exactly its own report there: a
comparison's `tables/compare_*`, or connection pages of an earlier run that
had requests, would otherwise sit beside the new report as if they were part
of it. Only the names kafkatap writes are ever removed; any other file a user
keeps in OUT stays. No Spark here: the CLI clears OUT from its Ctrl-C handler.
"""

from __future__ import annotations

from pathlib import Path

# (sub-directory of OUT, the patterns kafkatap writes there)
ARTIFACTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("", ("report.html", "findings.json")),
    ("tables", ("*.parquet", "*.csv")),
    ("connections", ("*.html",)),
)


def artifacts(out: str | Path) -> list[Path]:
    """The files of an analysis in `out` (report, findings, tables, connection pages), whichever run wrote them."""
    found: list[Path] = []
    for sub, patterns in ARTIFACTS:
        d = Path(out) / sub
        if d.is_dir():
            found.extend(p for pattern in patterns for p in sorted(d.glob(pattern)) if p.is_file() or p.is_symlink())
    return found


def clear_artifacts(out: str | Path) -> list[Path]:
    """Remove an earlier analysis's files from `out` (and its tables/ and connections/ once empty); returns them."""
    removed = artifacts(out)
    for p in removed:
        p.unlink(missing_ok=True)
    for sub, _ in ARTIFACTS:
        d = Path(out) / sub
        if sub and d.is_dir() and not d.is_symlink() and not any(d.iterdir()):
            d.rmdir()
    return removed
