"""SIGTERM ending a command as Ctrl-C does: one exception type and one context manager for every command.

Why here: `kafka up`, `scenario run`, `demo` and `replay` each end a `kill` the way they end a Ctrl-C
(cleanup, one line, exit 128 + the signal), and `recording` is the lowest package all of them may import
(docs/architecture.md, "The dependency rule"). Two copies of this had grown apart.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["SignalInterrupt", "sigterm_as_interrupt"]


class SignalInterrupt(KeyboardInterrupt):
    """The KeyboardInterrupt a run ends on when a signal (SIGTERM, or a Ctrl-C held until a block was done) stopped it.

    A KeyboardInterrupt, so that every teardown that handles Ctrl-C handles it too; `signum` says
    which signal it was, so that the command exits with the status the shell expects for it
    (analytics.interrupt.exit_status: 143 for SIGTERM), as the analysis's own handler does.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt (SignalInterrupt) for the block, so `kill` cleans up like Ctrl-C does.

    Only the main thread can set a signal handler: elsewhere (a scenario's worker thread) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SignalInterrupt(signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
