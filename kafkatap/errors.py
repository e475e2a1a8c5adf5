"""Errors every command prints the same way."""

from __future__ import annotations

import click


class OneLineError(click.ClickException):
    """A usage error printed as the one line `Error: …` (exit 2), without the usage block.

    For a value that is wrong only beside another (a --out inside a DIR, a fault flag without
    --status-addr): click's BadParameter would repeat the usage, which says nothing about it.
    """

    exit_code = 2
