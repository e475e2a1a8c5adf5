"""Process bookkeeping shared by the scenario tests."""

from __future__ import annotations

import os
import subprocess


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def children() -> set[str]:
    """Live child processes of this test process, except Spark's JVM (the shared session is meant to live)."""
    out = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout.split()
    return {p for p in out if b"spark" not in _cmdline(p) and _cmdline(p)}
