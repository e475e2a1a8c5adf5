"""bench/edit_cost.py runs, against another revision too, and prints every case with both figures.

Why a test: the bench's before/after figures are what bench/RESULTS.md quotes for cluster mode's per-response
check; a bench that no longer runs (an API it calls renamed) would leave those figures without a command that
reproduces them. It checks that the bench works, not its figures.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_edit_cost_bench_measures_this_checkout_against_a_revision() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "edit_cost.py"), "--before", "HEAD", "--repeats", "1",
                          "--calls", "100"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("  ")]
    assert [ln.split(":")[0].strip() for ln in lines] == [
        "produce v11, 1 partition(s)", "produce v11, 3 partition(s)", "produce v12, 10 partition(s)",
        "fetch v17, 3 partition(s)"]
    for ln in lines:
        assert re.search(r"check [\d.]+ → [\d.]+ \([\d.]+ ×\); cycle [\d.]+ → [\d.]+ \([\d.]+ ×\)", ln), ln
