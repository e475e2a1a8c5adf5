"""What `kafkatap analyze` writes into OUT, so a run can clear its own earlier output and nothing else.

A second analysis into the same OUT must leave exactly its own report there: a
comparison's `tables/compare_*`, or connection pages of an earlier run that
had requests, would otherwise sit beside the new report as if they were part
of it. Only the names kafkatap writes are ever removed; any other file a user
keeps in OUT stays. No Spark here: the CLI clears OUT from its Ctrl-C handler.

Two commands writing into one OUT at once (an `analyze` started twice, a second
`scenario run` or `demo` into the same --out) cleared each other's files and left a
report mixing both; `claim` makes the second refuse, naming the first.
"""

from __future__ import annotations

import os
from pathlib import Path

from recording.dir_lock import DirBusy, lock_dir

# (sub-directory of OUT, the patterns kafkatap writes there)
ARTIFACTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("", ("report.html", "findings.json")),
    ("tables", ("*.parquet", "*.csv")),
    ("connections", ("*.html",)),
)


def artifacts(out: str | Path) -> list[Path]:
    """The files of an analysis in `out` (report, findings, tables, connection pages), whichever run wrote them."""
    found: list[Path] = []
    for sub, patterns in ARTIFACTS:
        d = Path(out) / sub
        if d.is_dir():
            found.extend(p for pattern in patterns for p in sorted(d.glob(pattern)) if p.is_file() or p.is_symlink())
    return found


def clear_artifacts(out: str | Path) -> list[Path]:
    """Remove an earlier analysis's files from `out` (and its tables/ and connections/ once empty); returns them."""
    removed = artifacts(out)
    for p in removed:
        p.unlink(missing_ok=True)
    for sub, _ in ARTIFACTS:
        d = Path(out) / sub
        if sub and d.is_dir() and not d.is_symlink() and not any(d.iterdir()):
            d.rmdir()
    return removed


class OutBusy(Exception):
    """OUT is being written by another kafkatap command: `holder` is " (pid N: its command line)" or ""."""

    def __init__(self, out: str | Path, holder: str) -> None:
        super().__init__(f"{out} is being written by another kafkatap command{holder}; two runs into one directory "
                         "delete each other's files: wait for it, or give another --out")
        self.out, self.holder = out, holder


_claimed: dict[Path, int | None] = {}  # OUT -> the fd holding its lock until `release` (None: it cannot be locked)


def claim(out: str | Path) -> None:
    """Hold an exclusive lock on the directory OUT (it must exist) until `release` or the process's end; OutBusy
    when another process holds it (recording.dir_lock: no lock file, dropped when the holder dies). Claiming an
    OUT this process already holds does nothing."""
    path = Path(out).resolve()
    if path in _claimed:
        return
    try:
        _claimed[path] = lock_dir(path)  # None: a directory that cannot be locked (NFS, mode 733) is written unguarded
    except DirBusy as exc:
        raise OutBusy(out, exc.holder) from None


def release(out: str | Path) -> None:
    """Give up the claim on OUT (closing the fd drops the lock); nothing when this process holds none.

    The commands release at their end (click's call_on_close), so that one process running several, as the
    tests' CliRunner does, neither holds every OUT it ever wrote nor keeps an fd for each."""
    fd = _claimed.pop(Path(out).resolve(), None)
    if fd is not None:
        os.close(fd)
