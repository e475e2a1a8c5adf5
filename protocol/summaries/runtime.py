"""What the generated walkers call at run time (see `protocol.summaries.codegen`).

Why a module of its own: codegen.py *writes* walkers; this is the small
library their source is executed against (`RUNTIME` is the namespace every
walker is compiled in). Keeping the two apart means a change to the emitter
never touches the code that runs per frame, and the other way round.
"""

from __future__ import annotations

import re
from codecs import utf_8_decode as _u8  # 2x faster than str(memoryview, 'utf-8')
from struct import Struct
from typing import Any, Callable

from protocol.errors import error_name
from protocol.events import ErrorSeen, PartitionFetched, Summary
from protocol.records import scan, scan_incremental
from protocol.summaries.varint import Over, g_skip_tags, g_tag_errors, g_uv, skip_tags, tag_errors, uv

MAX_STRING_KEEP = 65536  # longer strings are skipped, never buffered (incremental mode)


def _uuid(b: bytes) -> str:
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _pe(pending: list[int] | None, code: int) -> list[int]:
    if pending is None:
        return [code]
    pending.append(code)
    return pending


def _flush(s: Summary, pending: list[int], topic: str | None, part: int | None, res: str | None) -> None:
    for code in pending:
        s.errors.append(ErrorSeen(code, error_name(code), topic, part, res))


_Z16 = bytes(16)


def _cstr(d: Any, p: int, lim: int) -> tuple[str | None, int]:
    """A compact string that is null, empty or has a multi-byte length."""
    n, p = uv(d, p, lim)
    if n == 0:
        return None, p
    n -= 1
    if n > MAX_STRING_KEEP:
        return None, p + n
    if p + n > lim:
        raise Over(p + n)
    return _u8(d[p:p + n], "replace")[0], p + n


def _carr(d: Any, p: int, lim: int) -> tuple[int, int]:
    """A compact array count that is null or needs more than one byte (checked against lim)."""
    n, p = uv(d, p, lim)
    n -= 1
    if n > lim - p:
        raise Over(p + n)
    return n, p


def _skiparr(d: Any, p: int, lim: int, size: int) -> int:
    """Skip a compact array of fixed-size elements (null, or a multi-byte count)."""
    n, p = uv(d, p, lim)
    return p + (n - 1) * size if n > 1 else p


class Bail(Exception):
    """Internal: an optimistic walker met something it leaves to the plain walker (see codegen.walker)."""


# Optimistic walkers skip a compact array / string / tagged section with one table look-up on its
# first byte: the bytes to advance when that byte is a whole one-byte count (or null), FAR when it
# is not (a multi-byte varint, a non-empty tagged section). FAR puts the position past any frame,
# so the next read raises or the walk ends past the frame: either way the plain walker redoes it.
FAR = 1 << 62
_K1 = (1,) + tuple(range(1, 128)) + (FAR,) * 128
_K2 = (1,) + tuple(1 + (n - 1) * 2 for n in range(1, 128)) + (FAR,) * 128
_K4 = (1,) + tuple(1 + (n - 1) * 4 for n in range(1, 128)) + (FAR,) * 128
_K8 = (1,) + tuple(1 + (n - 1) * 8 for n in range(1, 128)) + (FAR,) * 128
_K16 = (1,) + tuple(1 + (n - 1) * 16 for n in range(1, 128)) + (FAR,) * 128
_KT = (1,) + (FAR,) * 255
_R = tuple(range(n) for n in range(127))  # loop ranges for one-byte counts, built once

RUN_CHUNK = 64  # longest run compiled as one pattern; longer runs are matched in chunks of this many


class LeafRun(dict):  # type: ignore[type-arg]
    """n -> a `match(d, p, lim)` that skips n consecutive leaf structs in one C-level regex match.

    Why: an optimistic walker otherwise walks every partition of a big
    response in Python (an error-code test and a table step per field, about
    0.2 µs per element); `(?:ELEMENT){n}+` does the same checks in `re`'s C
    loop. `element` (built by `codegen.leaf_pattern`) matches exactly the
    bytes of one element whose error codes are zero, whose compact arrays /
    strings are short and whose tagged section is empty; every counted field
    is an alternation on its (mutually exclusive) length byte, so there is at
    most one way to match and the possessive repeat never backtracks. None
    means "not the common case": the walker then runs its per-element loop.
    Patterns are compiled on first use of a count; counts above RUN_CHUNK are
    matched in chunks, so at most RUN_CHUNK + 1 patterns exist per element
    whatever counts a client sends.
    """

    __slots__ = ("element",)

    def __init__(self, element: bytes) -> None:
        super().__init__()
        self.element = element

    def __missing__(self, n: int) -> Callable[[Any, int, int], Any]:
        if n > RUN_CHUNK:
            return self._chunked(n)  # not stored: the cache stays bounded
        match = re.compile(b"(?:%s){%d}+" % (self.element, max(n, 0)), re.DOTALL).match
        self[n] = match
        return match

    def _chunked(self, n: int) -> Callable[[Any, int, int], Any]:
        full, rest = divmod(n, RUN_CHUNK)
        chunk, tail = self[RUN_CHUNK], self[rest]

        def match(d: Any, p: int, lim: int) -> Any:
            for _ in range(full):
                m = chunk(d, p, lim)
                if m is None:
                    return None
                p = m.end()
            return tail(d, p, lim)  # rest == 0: the empty pattern, a match at p

        return match


RUNTIME: dict[str, Any] = {
    "_Bail": Bail, "_K1": _K1, "_K2": _K2, "_K4": _K4, "_K8": _K8, "_K16": _K16, "_KT": _KT, "_R": _R,
    "Over": Over, "uv": uv, "tag_errors": tag_errors, "g_tag_errors": g_tag_errors, "g_uv": g_uv, "skip_tags": skip_tags, "g_skip_tags": g_skip_tags,
    "scan": scan, "scan_incremental": scan_incremental, "_pe": _pe, "_flush": _flush,
    "_PF": PartitionFetched, "_uuid": _uuid, "_Z16": _Z16, "_u8": _u8, "_skiparr": _skiparr, "_cstr": _cstr, "_carr": _carr,
    "_h": Struct(">h").unpack_from, "_i": Struct(">i").unpack_from,
}
