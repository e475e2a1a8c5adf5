"""Collector and allocator settings for a process that runs the proxy's event loop.

Why a module of its own: `kafkatap proxy` and `proxy.running.RunningProxy`
(tests, scenarios, replay, benchmarks) must run the relay with the same
memory settings, or a benchmark measures a proxy nobody runs.
"""

from __future__ import annotations

import ctypes
import gc

__all__ = ["settle_memory", "settle_gc", "settle_malloc", "FIRST_GENERATION", "GC_THRESHOLDS"]

FIRST_GENERATION = 20_000  # allocations between young collections (CPython's default: 700)
GC_THRESHOLDS = (FIRST_GENERATION, 20, 20)  # gc.set_threshold's three, as the relay runs with them

# glibc's mallopt parameters (malloc.h) and the values the relay runs with
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20  # every read (uvloop's buffer is 256 KiB) comes from the heap, not a fresh mapping
TRIM_THRESHOLD = 8 << 20  # free memory the heap keeps at its top before giving it back to the kernel


def settle_gc() -> None:
    """Keep the collector off the event loop's back (issue 19: 20-50 ms full collections).

    Everything alive after start-up (modules, schemas, generated walkers)
    lives as long as the process: `gc.freeze()` takes it out of every later
    collection. The relay allocates and frees many short-lived objects per
    request (events, summaries, rows) and holds up to 10,000 in flight per
    connection; a larger first generation makes collections rarer, and the
    higher thresholds of the older ones keep full collections (which walk
    every in-flight object) far apart.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def settle_malloc() -> bool:
    """Let glibc reuse the memory of large reads instead of mapping fresh pages for each (issue 16).

    Every chunk the relay reads becomes a bytes object of up to 256 KiB, freed
    once it is written on. With glibc's defaults the heap gave such memory
    back to the kernel (trimmed) and took it again for the next reads: under
    Kafka's ProducerPerformance through the proxy that was ~47 page faults per
    MB relayed (14,000 per 300 MB), each a kernel entry that zeroes a page, a
    few % of the proxy's CPU. A fixed mmap threshold above the largest read
    and a trim threshold of a few MiB keep that memory in the heap: ~0 faults,
    and the same RSS (bench/RESULTS.md, twenty-first session).

    A no-op returning False where the C library has no `mallopt` (musl's does
    nothing; macOS has none).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def settle_memory() -> None:
    """Both: what `kafkatap proxy` does once it listens (after start-up's allocations)."""
    settle_gc()
    settle_malloc()
