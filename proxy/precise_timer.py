"""A loop timer that never fires before its deadline on the precise monotonic clock.

Why: the faults that hold bytes (a TCP `latency=`, a Kafka `delay=` or throttle) promise
"at least this long", and the rows that show the hold are stamped with `time.monotonic`
(`proxy.timing`). uvloop counts its timers in whole milliseconds from the start of the loop
iteration, so a timer armed for 300 ms can run ~1 ms before 300 ms have passed on that clock.
`PreciseTimer` checks the precise clock when the loop's timer fires and, if early, waits
again for what is left, at least one millisecond (a shorter wait could fire early again at
once and spin). So a hold is never shorter than asked and at most ~1 ms longer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import monotonic

EARLY_REARM_MIN_S = 0.001  # the loop's timer resolution: a re-armed wait is at least this long


class PreciseTimer:
    """Run `fn()` once, on the loop, no earlier than `deadline` (seconds on `clock`); `cancel()` stops it."""

    __slots__ = ("_loop", "_deadline", "_fn", "_clock", "_handle")

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float, fn: Callable[[], None],
                 clock: Callable[[], float] = monotonic) -> None:
        self._loop, self._deadline, self._fn, self._clock = loop, deadline, fn, clock
        self._handle: asyncio.TimerHandle | None = loop.call_later(max(deadline - clock(), 0.0), self._fire)

    def _fire(self) -> None:
        left = self._deadline - self._clock()
        if left > 0:  # the loop's millisecond timer was early
            self._handle = self._loop.call_later(max(left, EARLY_REARM_MIN_S), self._fire)
            return
        self._handle = None
        self._fn()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
