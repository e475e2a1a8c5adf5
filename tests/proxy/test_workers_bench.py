"""bench/workers.py runs end to end: its one- and two-worker proxies start and its report has both rows.

Why a test: a proxy option the bench passes to every worker count (`--balance`, refused with
`--workers 1`) broke the bench's one-worker runs once, and nothing else runs the bench.
This is `--quick` (one round, short windows): it checks that the bench works, not its figures.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.slow]  # it captures real frames through a LocalKafka first

BENCH = Path(__file__).resolve().parents[2] / "bench" / "workers.py"


@pytest.mark.parametrize("balance", ["connections", "kernel"])
def test_the_workers_bench_measures_one_and_two_workers(balance: str) -> None:
    r = subprocess.run([sys.executable, str(BENCH), "--quick", "--balance", balance], capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = re.findall(r"^\| ([12]) \| ([\d,]+) \|", r.stdout, re.M)
    assert [w for w, _ in rows] == ["1", "2"], r.stdout
    assert all(int(rate.replace(",", "")) > 0 for _, rate in rows), r.stdout
    assert re.search(r"ratio 2 / 1 workers, relayed: \*\*[\d.]+ x\*\*", r.stdout), r.stdout
    assert re.search(r"connections per worker \d+ / \d+", r.stderr), r.stderr[-3000:]
