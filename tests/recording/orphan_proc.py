"""A proxy that dies with its writer process's answers unread: the subject of a crash test.

It hands the writer process rows and a flush request, then more rows, and kills itself (SIGKILL)
at once: the child writes the first rows while nobody reads its answer any more. Prints the writer
process's pid first, so the test can wait for that orphan to finish.
"""

from __future__ import annotations

import os
import signal
import sys

from recording.sample_rows import SessionMix
from recording.writer import ParquetRecorder


def main(root: str, first: int, then: int) -> None:
    rec = ParquetRecorder(root, "orphan", fsync=False, flush_interval_s=3600, compact_interval_s=0.05,
                          writer="process").start()
    rows = SessionMix(proxy_id="orphan", connections=1).rows(first + then)
    for n, row in enumerate(rows[:first], 1):
        row["correlation_id"] = n
        rec.request(row)
    rec._ship(final=False)  # rows and a flush request, answered later on a thread of ours
    child = rec._child
    assert child is not None
    print(child.pid, flush=True)
    for n, row in enumerate(rows[first:], first + 1):
        row["correlation_id"] = n
        rec.request(row)
    rec._ship_stream(child, rec._streams["requests"])  # more rows, in the pipe behind the flush request
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
