"""Who handles Ctrl-C (SIGINT) while an analysis runs: the caller's handler, also while and after Spark starts.

pyspark's SparkContext installs a SIGINT handler of its own when it is constructed on the main thread
(pyspark/core/context.py: cancelAllJobs, then KeyboardInterrupt). That handler runs on the main thread
in the middle of whatever Py4J call the signal interrupted, and its cancelAllJobs goes out on the same
thread's pinned Py4J connection: "RuntimeError: reentrant call inside <_io.BufferedReader>", then a
Py4JNetworkError from every thread still collecting a table. `kafkatap analyze` brings its own handler
(analytics.cli.Interrupted), and `analytics.session.get_spark` constructs the SparkContext on a thread
of its own, so pyspark never installs one. A KeyboardInterrupt raised in the main thread's Py4J call is
no way out either: Py4J then interrupts the JVM thread serving that call, and the Spark jobs of the
analysis's other threads can wait forever (scenarios.runner: `kafkatap demo` and `scenario run` end at
once, as `analyze` does). No pyspark import here: the CLI installs the handler before Spark is imported.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any]


@contextmanager
def interrupts_handled(handler: Handler, signals: tuple[int, ...] = (signal.SIGINT,)) -> Iterator[None]:
    """`handler` takes SIGINT (or each of `signals`) for the block, also after a SparkContext starts inside it;
    the previous handlers after.

    Only the main thread can set a signal handler: elsewhere (a scenario's worker thread) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
