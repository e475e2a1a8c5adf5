"""What the generated walkers call at run time (see `protocol.summaries.codegen`).

Why a module of its own: codegen.py *writes* walkers; this is the small
library their source is executed against (`RUNTIME` is the namespace every
walker is compiled in). Keeping the two apart means a change to the emitter
never touches the code that runs per frame, and the other way round.
"""

from __future__ import annotations

from codecs import utf_8_decode as _u8  # 2x faster than str(memoryview, 'utf-8')
from struct import Struct
from typing import Any

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


RUNTIME: dict[str, Any] = {
    "_Bail": Bail, "_K1": _K1, "_K2": _K2, "_K4": _K4, "_K8": _K8, "_K16": _K16, "_KT": _KT, "_R": _R,
    "Over": Over, "uv": uv, "tag_errors": tag_errors, "g_tag_errors": g_tag_errors, "g_uv": g_uv, "skip_tags": skip_tags, "g_skip_tags": g_skip_tags,
    "scan": scan, "scan_incremental": scan_incremental, "_pe": _pe, "_flush": _flush,
    "_PF": PartitionFetched, "_uuid": _uuid, "_Z16": _Z16, "_u8": _u8, "_skiparr": _skiparr, "_cstr": _cstr, "_carr": _carr,
    "_h": Struct(">h").unpack_from, "_i": Struct(">i").unpack_from,
}
