"""bench/proxy_overhead.py runs end to end, pinned, and its pinning helpers place processes where they say.

Why a test: `--pin` is how the bench separates what the extra hop costs from the CPU a proxy takes from a
broker and clients sharing its cores; a pin that silently did nothing would print unpinned figures under a
pinned heading. `--quick` checks that the bench works, not its figures.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH_DIR))

from proc_tree import pin_cpus, set_process_affinity  # noqa: E402


def _allowed(pid: int) -> set[int]:
    line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Cpus_allowed_list"))
    out: set[int] = set()
    for part in line.split(":", 1)[1].strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def test_pin_cpus_splits_this_process_cpus_in_two() -> None:
    pins = pin_cpus()
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        assert pins is None
        return
    assert pins is not None
    proxy, rest = pins
    assert len(proxy) == 1 and proxy.isdisjoint(rest) and proxy | rest == cpus


def test_set_process_affinity_moves_every_thread_of_a_running_process() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    # a child with a second thread: sched_setaffinity on a pid alone would move only its main thread
    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                              "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tids) == 2
        set_process_affinity(child.pid, {cpus[-1]})
        assert all(_allowed(t) == {cpus[-1]} for t in tids)
    finally:
        child.kill()
        child.wait()


@pytest.mark.kafka
@pytest.mark.slow
def test_the_overhead_bench_runs_pinned() -> None:
    r = subprocess.run([sys.executable, str(BENCH_DIR / "proxy_overhead.py"), "--quick", "--pin", "--no-tls"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"proxies pinned to CPU \[\d+\], broker \+ clients \+ probe on \[[\d, ]+\]", r.stdout), r.stdout
    assert re.search(r"^\| producer / consumer, median of the per-round ratios to direct \| \| [\d.]+ / [\d.]+ \|",
                     r.stdout, re.M), r.stdout
    assert re.search(r"^\| producer MB/s \| [\d.]+ \| [\d.]+ \| [\d.]+ × direct", r.stdout, re.M), r.stdout
    proxy = re.search(r"RSS MB, the proxy process \| \| idle (\d+) / \d+ conns (\d+)", r.stdout)
    whole = re.search(r"RSS MB, with its recording writer process \| \| idle (\d+) / \d+ conns (\d+)", r.stdout)
    assert proxy and whole, r.stdout
    assert int(whole[1]) > int(proxy[1]) > 0  # the writer process is counted beside the proxy, not instead


@pytest.mark.kafka
@pytest.mark.slow
def test_the_latency_split_bench_runs() -> None:
    """bench/latency_split.py puts each kafkatap path (relay, decode, record) beside direct in one run: `--quick`
    checks the bench works and prints every path, not its figures."""
    r = subprocess.run([sys.executable, str(BENCH_DIR / "latency_split.py"), "--quick"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = dict(re.findall(r"^\| ([^|]+?) \| (\d+) \|", r.stdout, re.M))
    assert set(rows) == {"direct", "relay", "decode", "record"}, r.stdout
    assert all(int(v) > 0 for v in rows.values())
