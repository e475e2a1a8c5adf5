"""Who handles Ctrl-C (SIGINT) and SIGTERM while an analysis runs: the caller's handler, also while and after Spark starts.

pyspark's SparkContext installs a SIGINT handler of its own when it is constructed on the main thread
(pyspark/core/context.py: cancelAllJobs, then KeyboardInterrupt). That handler runs on the main thread
in the middle of whatever Py4J call the signal interrupted, and its cancelAllJobs goes out on the same
thread's pinned Py4J connection: "RuntimeError: reentrant call inside <_io.BufferedReader>", then a
Py4JNetworkError from every thread still collecting a table. `kafkatap analyze` brings its own handler
(analytics.cli.Interrupted), and `analytics.session.get_spark` constructs the SparkContext on a thread
of its own, so pyspark never installs one. A KeyboardInterrupt raised in the main thread's Py4J call is
no way out either: Py4J then interrupts the JVM thread serving that call, and the Spark jobs of the
analysis's other threads can wait forever (scenarios.runner: `kafkatap demo` and `scenario run` end at
once, as `analyze` does). SIGTERM (`kill`, a supervisor, a CI timeout) gets the same handler: Python's default
action ends the process on the spot, leaving a half-written report. No pyspark import here: the CLI installs
the handler before Spark is imported.
"""

from __future__ import annotations

import contextlib
import os
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


def exit_status(signum: int) -> int:
    """The status of a process that a signal ended, as the shell reports it: 128 + the signal's number.

    130 for Ctrl-C, 143 for SIGTERM: a script or supervisor tells a `kill` from a Ctrl-C by it,
    as it does for any program that the signal's default action ends.
    """
    return 128 + signum


class ExitAtOnce:
    """A signal handler that ends the analysis's process at once: clean up, one line on stderr, exit 128 + signum.

    Why not KeyboardInterrupt (see the module docstring): raised in the main thread's Py4J call, it
    leaves the other threads' Spark jobs waiting for ever. Ending the process closes the JVM's stdin,
    on which Spark's gateway ends the JVM and every running job. The handled `signals` are ignored
    first, so that a second Ctrl-C cannot cut the clean-up short; the line goes out with one
    os.write, not print, since the interrupted thread may hold stderr's buffer. Subclasses say what
    `clean_up` removes (an OSError there is let go: nothing more can be done on the way out). The
    status is `exit_status(signum)`, what a shell reports when the signal's default action ends a process.
    """

    def __init__(self, line: str, signals: tuple[int, ...] = (signal.SIGINT,)) -> None:
        self.line = line
        self.signals = signals

    def clean_up(self) -> None:
        """What the interrupted run leaves behind is removed here (nothing, by default)."""

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        for sig in self.signals:
            signal.signal(sig, signal.SIG_IGN)
        with contextlib.suppress(OSError):
            self.clean_up()
        os.write(2, self.line.encode() + b"\n")
        os._exit(exit_status(signum))
