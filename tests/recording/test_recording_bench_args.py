"""bench/recording_cost.py refuses what it cannot measure, with a reason, before it starts anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "recording_cost.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=60)


def test_before_needs_side_by_side() -> None:
    r = _run("--before", "HEAD")
    assert r.returncode != 0 and "--before needs --side-by-side" in r.stderr


def test_a_revision_git_does_not_know_is_named() -> None:
    r = _run("--side-by-side", "stats,record", "--before", "no-such-revision")
    assert r.returncode != 0 and "--before no-such-revision: git cannot archive that revision" in r.stderr


def test_an_unknown_mode_is_refused_with_the_choices() -> None:
    r = _run("--side-by-side", "stats,recrod")
    assert r.returncode != 0 and "unknown mode(s) recrod" in r.stderr and "record+capture" in r.stderr
