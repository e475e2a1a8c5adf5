"""CPU and memory of a process and its descendants, read from /proc (for the benches).

The benches measure processes they start (a proxy with its workers and writer
processes, an analysis driver with its JVM): CPU time is what they spend
whatever the neighbours do, so it is reported beside wall time. One reader of
/proc/PID/stat for all of them, so that they count ticks the same way.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

TICK = os.sysconf("SC_CLK_TCK")
_RSS = re.compile(r"VmRSS:\s+(\d+)")


class Proc(NamedTuple):
    ppid: int
    ticks: int  # utime + stime, clock ticks
    rss_kib: int  # 0 unless asked for


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def state(pid: int) -> str:
    """The process state letter (/proc/PID/stat field 3): R, S, T for stopped by a signal, …"""
    return _stat(pid)[0]


def cpu_s(pid: int) -> float:
    """utime + stime of one process in seconds (/proc/PID/stat fields 14 and 15)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICK


def snapshot(rss: bool = False) -> dict[int, Proc]:
    """Every process now: parent, CPU ticks and (with `rss`) resident KiB; vanished ones are left out."""
    procs: dict[int, Proc] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat(entry)
            kib = 0
            if rss:
                with open(f"/proc/{entry}/status") as f:
                    m = _RSS.search(f.read())
                kib = int(m.group(1)) if m else 0
        except (OSError, IndexError, ValueError):
            continue
        procs[int(entry)] = Proc(int(fields[1]), int(fields[11]) + int(fields[12]), kib)
    return procs


def tree(root: int, procs: dict[int, Proc]) -> list[int]:
    """`root` and all its descendants in `procs`."""
    children: dict[int, list[int]] = {}
    for pid, p in procs.items():
        children.setdefault(p.ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of `root` and all its descendants."""
    procs = snapshot()
    return sum(procs[p].ticks for p in tree(root, procs) if p in procs) / TICK


def pin_cpus() -> tuple[set[int], set[int]] | None:
    """(the proxy's core, every other core) when this machine lets us choose; None with a single core."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    return ({cpus[0]}, set(cpus[1:])) if len(cpus) >= 2 else None


def set_process_affinity(pid: int, cpus: set[int]) -> None:
    """Pin every thread of `pid` (sched_setaffinity on a pid moves only its main thread)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tasks:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            continue
