"""Another git revision's code, for benches that measure a change against the code it replaced.

A before/after figure is only worth quoting when a later reader can rerun it: the benches
take `--before REV`, extract REV's tree with `git archive` into a temporary directory (no
worktree is left in the repository) and run the same measurement from there, alternating
with this checkout's code in one run, so both see the same machine.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path


def extract_revision(root: Path, rev: str) -> str:
    """REV's tree in a new temporary directory; exits with a clear message when git cannot archive REV."""
    try:
        archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", rev], check=True,
                                 capture_output=True).stdout
    except subprocess.CalledProcessError as exc:
        sys.exit(f"--before {rev}: git cannot archive that revision: {exc.stderr.decode().strip()}")
    out = tempfile.mkdtemp(prefix="kt-bench-before-")
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    return out
