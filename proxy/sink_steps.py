"""What the row-sink steps between the relay and the sinks (`proxy.topics`, `proxy.bypass`) share.

A module of its own, importing nothing: `kafkatap top` imports `proxy.bypass` for its warning line,
and must not pull in the recorder (pyarrow) with it.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["pass_through"]


def pass_through(step: object, inner: object, names: Iterable[str]) -> None:
    """Bind `inner`'s methods `names` on the row-sink step `step` itself, where `inner` has them.

    Why: a step that passes those rows on unchanged then costs no call of its own for each of them
    (a Python call per row, or ~0.8 µs through `__getattr__`; with `--capture`, one per frame).
    """
    for name in names:
        method = getattr(inner, name, None)
        if method is not None:
            setattr(step, name, method)
