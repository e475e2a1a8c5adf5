"""The proxy process's memory settings (proxy/memory_tuning.py): the collector and glibc's allocator.

The allocator half is checked by what it is for: a process that keeps
allocating and freeing reads of 32-256 KiB (what the relay does with every
chunk it forwards) takes thousands of fresh pages from the kernel with glibc's
defaults and almost none once settled. Page faults are counted by the kernel
(getrusage), so the figure is exact, not timed; each case runs in a fresh
interpreter because the settings last for the life of a process.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Reads of random sizes, up to four alive at once, as a relay holds a read until it is written on.
_READS = """
import random, resource
rnd = random.Random(1)
held = []
def churn(n):
    for _ in range(n):
        held.append(b"x" * rnd.randint(32 << 10, 256 << 10))
        if len(held) > 3:
            held.pop(rnd.randrange(len(held)))
churn(100)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn(2000)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(setup: str) -> int:
    """Minor page faults of 2,000 reads after `setup`, in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", setup + _READS], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_settled_malloc_keeps_large_reads_in_the_heap():
    default = _faults("")
    settled = _faults("from proxy.memory_tuning import settle_malloc\nassert settle_malloc()\n")
    assert default > 2000, default  # glibc's defaults: fresh pages again and again (~11,000 here)
    assert settled < default / 20, (settled, default)


# glibc's default thresholds, fixed: a fixed value turns off glibc's dynamic threshold, which otherwise rises with
# whatever large block start-up happened to free (an unsettled proxy measured anywhere from 581 to 5,907 faults)
_GLIBC_DEFAULTS = ("import ctypes\n"
                   "ctypes.CDLL(None).mallopt(-3, 128 << 10)\n"
                   "ctypes.CDLL(None).mallopt(-1, 128 << 10)\n")


def test_running_proxy_settles_the_allocator_as_kafkatap_proxy_does():
    start = (_GLIBC_DEFAULTS + "from proxy.running import RunningProxy\n"
             "p = RunningProxy(upstream='127.0.0.1:9'{}).start()\n")
    settled = _faults(start.format(""))
    left = _faults(start.format(", settle_memory=False"))
    assert left > 2000, left
    assert settled < left / 20, (settled, left)


def test_the_proxy_process_freezes_start_up_objects_out_of_the_collector():
    from proxy.cli import settle_memory

    before = gc.get_threshold()
    try:
        settle_memory()
        assert gc.get_freeze_count() > 10_000  # modules, schemas, walkers: never scanned again
        assert gc.get_threshold()[0] >= 20_000
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_running_proxy_sets_the_collector_up_as_kafkatap_proxy_does(monkeypatch):
    """Tests and benchmarks drive the relay through RunningProxy: it must run with the proxy's collector."""
    from proxy import running

    before = gc.get_threshold()
    monkeypatch.setattr(running, "_settled", False)
    gc.set_threshold(700, 10, 10)
    try:
        with running.RunningProxy(upstream="127.0.0.1:9"):
            assert gc.get_freeze_count() > 10_000
            assert gc.get_threshold()[0] >= 20_000
        gc.set_threshold(700, 10, 10)
        with running.RunningProxy(upstream="127.0.0.1:9"):  # later proxies: thresholds only, no second freeze
            assert gc.get_threshold()[0] >= 20_000
        with running.RunningProxy(upstream="127.0.0.1:9", settle_memory=False):
            pass
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
