"""Unsigned varints and tagged-field sections, plain and incremental.

Compact lengths are almost always one byte; the generated walkers inline that
case and call these helpers only for multi-byte varints and non-empty tagged
sections. `_Over` carries the position the walker needed to reach, so the
stream can tell "wait for more bytes" from "declared length runs past the frame".
"""

from __future__ import annotations

from typing import Any, Generator

from protocol.errors import DecodeError


class Over(Exception):
    """Internal: the walker needed bytes up to `need` but the buffer ends earlier."""

    __slots__ = ("need",)

    def __init__(self, need: int) -> None:
        self.need = need


def uv(d: Any, p: int, lim: int) -> tuple[int, int]:
    """Read an unsigned varint at p; raise Over when it runs past lim."""
    v = 0
    shift = 0
    while True:
        if p >= lim:
            raise Over(p + 1)
        b = d[p]
        p += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, p
        shift += 7
        if shift > 28:
            raise DecodeError("varint longer than 5 bytes", p)


def skip_tags(d: Any, p: int, lim: int) -> int:
    """Skip a tagged-field section (count, then tag/size/bytes per field)."""
    n, p = uv(d, p, lim)
    for _ in range(n):
        _tag, p = uv(d, p, lim)
        size, p = uv(d, p, lim)
        p += size
    if p > lim:
        raise Over(p)
    return p


def g_uv(d: Any, p: int, lim: int) -> Generator[tuple[int, int], tuple[Any, int, int], tuple[Any, int, int, int]]:
    """Incremental `uv`: asks for one more byte until the varint is complete."""
    while True:
        try:
            v, q = uv(d, p, lim)
            return d, q, lim, v
        except Over:
            d, p, lim = yield (p, lim - p + 1 if lim >= p else 1)


def g_skip_tags(d: Any, p: int, lim: int) -> Generator[tuple[int, int], tuple[Any, int, int], tuple[Any, int, int]]:
    """Incremental `skip_tags`: field bodies are skipped without being requested."""
    d, p, lim, n = yield from g_uv(d, p, lim)
    for _ in range(n):
        d, p, lim, _tag = yield from g_uv(d, p, lim)
        d, p, lim, size = yield from g_uv(d, p, lim)
        p += size
    return d, p, lim


def tag_errors(d: Any, p: int, lim: int, wanted: frozenset[int]) -> tuple[int, list[int]]:
    """Skip a tagged section, returning the int16 values of the `wanted` tags.

    Only CreateTopicsResponse.Topics.TopicConfigErrorCode needs this today: an
    error code that lives in a tagged field.
    """
    n, p = uv(d, p, lim)
    codes: list[int] = []
    for _ in range(n):
        tag, p = uv(d, p, lim)
        size, p = uv(d, p, lim)
        if tag in wanted and size == 2:
            if p + 2 > lim:
                raise Over(p + 2)
            codes.append(int.from_bytes(d[p:p + 2], "big", signed=True))
        p += size
    if p > lim:
        raise Over(p)
    return p, codes


def g_tag_errors(d: Any, p: int, lim: int, wanted: frozenset[int]) -> Generator[tuple[int, int], tuple[Any, int, int], tuple[Any, int, int, list[int]]]:
    """Incremental `tag_errors`."""
    d, p, lim, n = yield from g_uv(d, p, lim)
    codes: list[int] = []
    for _ in range(n):
        d, p, lim, tag = yield from g_uv(d, p, lim)
        d, p, lim, size = yield from g_uv(d, p, lim)
        if tag in wanted and size == 2:
            if p + 2 > lim:
                d, p, lim = yield (p, 2)
            codes.append(int.from_bytes(d[p:p + 2], "big", signed=True))
        p += size
    return d, p, lim, codes
