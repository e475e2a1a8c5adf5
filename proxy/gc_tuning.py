"""Garbage-collector settings for a process that runs the proxy's event loop.

Why a module of its own: `kafkatap proxy` and `proxy.running.RunningProxy`
(tests, scenarios, replay, benchmarks) must run the relay with the same
collector, or a benchmark measures a proxy nobody runs.
"""

from __future__ import annotations

import gc

__all__ = ["settle_gc"]

FIRST_GENERATION = 20_000  # allocations between young collections (CPython's default: 700)


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
    gc.set_threshold(FIRST_GENERATION, 20, 20)
