"""`analytics.interrupt.ExitAtOnce`, the handler `analyze`, `demo` and `scenario run` end an analysis with.

Its exit status is the shell's for a process a signal ended, 128 + the signal's number: 130 for
Ctrl-C, 143 for SIGTERM, so a script or supervisor can tell a `kill` from a Ctrl-C. No Spark here:
the handler is plain Python, and a process that sends itself the signal shows what it does.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_the_exit_status_names_the_signal(tmp_path: Path, signum: int, status: int) -> None:
    marker = tmp_path / "half-written"
    code = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from analytics.interrupt import ExitAtOnce, interrupts_handled

        class Probe(ExitAtOnce):
            def clean_up(self):
                Path({str(marker)!r}).unlink()

        Path({str(marker)!r}).write_text("x")
        probe = Probe("probe: interrupted", (signal.SIGINT, signal.SIGTERM))
        with interrupts_handled(probe, probe.signals):
            os.kill(os.getpid(), {int(signum)})
            print("the process outlived the signal", flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stderr, p.stdout) == (status, "probe: interrupted\n", "")
    assert not marker.exists()
