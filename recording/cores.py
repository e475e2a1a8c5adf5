"""The cores this process may run on, asked one way by everything that sizes itself by them.

The proxy's default `--workers` and the analysis's driver JVM (one C1 compiler thread on a small host) both
follow it. Its CPU affinity, not the host's count: `taskset` and a container's cpuset narrow it. A CPU quota
without a cpuset (`docker --cpus`) is not seen here.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on, at least 1."""
    count = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if count is not None:
        return count() or 1
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
