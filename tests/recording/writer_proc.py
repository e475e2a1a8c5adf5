"""A process that records rows at a steady rate until killed: the subject of the crash tests.

Prints the number of rows handed to the recorder after every batch, and how
many of them a kill would lose by design (thread: not written yet; process:
not handed to the writer process yet, which writes what it got after its
proxy dies), so the test knows both when it sends kill -9 / SIGTERM; and (writer
"process") `writer <pid>` once the writer process runs, so the test can wait
for it to finish after the kill. On SIGTERM it closes the recorder (the
proxy's shutdown path) and exits 0.
"""

from __future__ import annotations

import signal
import sys
import time

from recording.logs import configure_logging
from recording.writer import ParquetRecorder
from recording.sample_rows import SessionMix


def main(root: str, rate: int, flush: float, compact: float, writer: str = "thread") -> None:
    configure_logging("json", "info")  # logs to stderr: stdout carries the row counts
    rec = ParquetRecorder(root, "crash", flush_interval_s=flush, compact_interval_s=compact, fsync=False,
                          writer=writer).start()
    told = False
    stop = False

    def on_term(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    mix = SessionMix(proxy_id="crash", connections=1)
    n = 0
    batch = max(1, rate // 50)
    next_t = time.monotonic()
    while not stop:
        for row in mix.rows(batch):
            n += 1
            row["correlation_id"] = n  # unique: duplicates and gaps are visible
            rec.request(row)
        if writer == "process":
            at_risk = len(rec._streams["requests"].queue)
        else:
            at_risk = n - rec.stats()["rows_written"]["requests"]
        print(n, at_risk, flush=True)
        child = rec._child
        if child is not None and not told:
            told = True
            print(f"writer {child.pid}", flush=True)
        next_t += batch / rate
        time.sleep(max(0.0, next_t - time.monotonic()))
    rec.close()
    print(f"closed {n}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), *sys.argv[5:])
