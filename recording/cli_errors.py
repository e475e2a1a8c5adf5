"""Errors every command prints the same way.

In `recording`, the lowest package whose commands (prune, rollups) and whose importers' commands (proxy,
analyze) all print them; `recording.timespec` holds the --since/--until type they share for the same reason.
"""

from __future__ import annotations

import math

import click


class OneLineError(click.ClickException):
    """A usage error printed as the one line `Error: …` (exit 2), without the usage block.

    For a value that is wrong only beside another (a --out inside a DIR, a fault flag without
    --status-addr): click's BadParameter would repeat the usage, which says nothing about it.
    """

    exit_code = 2


def a_number(ctx: click.Context | None, param: click.Parameter, value: float | None) -> float | None:
    """A click callback refusing `nan` and infinities, which pass click's range checks (every comparison with
    nan is false) and then broke what they set: a hang at `inf`, a timer that raised at `nan`."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number", ctx=ctx, param=param)
    return value
