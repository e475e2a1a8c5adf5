"""An exclusive flock(2) on a directory, and who holds it: one writer per output directory or partition.

Why a directory and not a lock file: nothing is left behind in the directory (an output directory a run
created and left empty is still removed; a recording holds only its datasets), and the kernel drops the
lock when its holder dies, however it dies. The fd is close-on-exec (os.open's default), so the brokers,
clients and writer processes a command starts never inherit it.

Used by `analyze`, `scenario run` and `demo` for their --out (analytics.outdir.claim) and by the recorder
for its partition of a recording (recording.writer): a second writer is told who the first one is.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["DirBusy", "lock_dir", "lock_holder"]


class DirBusy(Exception):
    """Another process holds the directory's lock: `holder` is " (pid N: its command line)" or ""."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is locked by another process{holder}")
        self.path, self.holder = path, holder


def lock_dir(path: str | Path) -> int | None:
    """Lock the existing directory `path` (exclusive, non-blocking); returns the fd that holds the lock (closing it
    releases it). DirBusy when another open of it holds the lock (another process, or this one).

    None when the directory cannot be locked at all: one that may be written but not read (mode 733), or a file
    system whose flock needs a file open for writing (NFS without local locks: EBADF), or none (ENOLCK). The lock
    only guards against a second writer, so the caller goes on unguarded: those directories worked before it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        raise
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = lock_holder(fd)
        os.close(fd)
        raise DirBusy(Path(path), holder) from None
    except OSError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def lock_holder(fd: int) -> str:
    """" (pid N: its command line)" for the process holding an flock on `fd`'s file, from /proc/locks; "" when not
    found (another PID namespace, /proc not mounted)."""
    st = os.fstat(fd)
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as locks:
            pids = [words[4] for words in (line.split() for line in locks)
                    if len(words) > 5 and words[1] == "FLOCK" and words[5] == ident]
    except OSError:
        return ""
    if not pids:
        return ""
    try:
        with open(f"/proc/{pids[0]}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return f" (pid {pids[0]})"
    return f" (pid {pids[0]}: {' '.join(argv)[:200]})"
