"""PreciseTimer: a loop timer that fires early is armed again, never runs its callback before the deadline.

On a fake loop and a clock the test moves, so "the loop's timer fired 0.4 ms early" is a fact of the
test, not of the machine. The faults that use it are tested on real loops (test_faults, test_intercept).
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.precise_timer import EARLY_REARM_MIN_S, PreciseTimer


class _Handle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Loop:
    """Records each `call_later`; the test fires them by hand."""

    def __init__(self) -> None:
        self.armed: list[tuple[float, Callable[[], None], _Handle]] = []

    def call_later(self, delay: float, fn: Callable[[], None]) -> _Handle:
        handle = _Handle()
        self.armed.append((delay, fn, handle))
        return handle


def test_an_early_fire_waits_again_and_the_callback_runs_once_at_the_deadline() -> None:
    now = [100.0]
    loop, ran = _Loop(), []
    PreciseTimer(loop, 100.3, lambda: ran.append(now[0]), clock=lambda: now[0])  # type: ignore[arg-type]
    assert [round(d, 6) for d, _, _ in loop.armed] == [0.3]
    now[0] = 100.2996  # the loop's millisecond timer fired 0.4 ms early
    loop.armed[-1][1]()
    assert ran == []
    assert loop.armed[-1][0] == EARLY_REARM_MIN_S  # at least a millisecond: a shorter wait could fire early again, a spin
    now[0] = 100.3006
    loop.armed[-1][1]()
    assert ran == [100.3006] and len(loop.armed) == 2


def test_a_deadline_already_past_fires_on_the_next_turn_and_cancel_stops_it() -> None:
    loop, ran = _Loop(), []
    PreciseTimer(loop, 5.0, lambda: ran.append(1), clock=lambda: 7.0)  # type: ignore[arg-type]
    assert loop.armed[0][0] == 0.0
    loop.armed[0][1]()
    assert ran == [1]
    t = PreciseTimer(loop, 9.0, lambda: ran.append(2), clock=lambda: 8.9995)  # type: ignore[arg-type]
    loop.armed[-1][1]()  # early: armed again
    t.cancel()
    assert loop.armed[-1][2].cancelled and ran == [1]
