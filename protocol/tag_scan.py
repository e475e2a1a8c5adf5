"""Which top-level tagged fields a body carries, found by a generated walker that skips everything else.

Why: a cluster-mode proxy must look at every Produce, Fetch, ShareFetch and
ShareAcknowledge response before forwarding it, because the broker addresses
they can carry (KIP-951 node endpoints) live in a top-level tagged field, which
comes after all the partitions. Nearly always that tag is absent and the frame
goes on unchanged, so this look is on the latency path of every such response.
Walking the schema field by field (a dispatch on the field's kind, a dict
lookup and a function call per field) cost ~10 µs for a three-partition
Produce response; one straight-line function per (api, direction, version),
generated from `protocol.codec`'s plan of that version, with runs of
fixed-size fields folded into one addition, reads only the length prefixes,
null markers and tagged-field headers and copies nothing.

The body may be bytes, a memoryview or `protocol.pieces.Pieces` (a frame still
in the reads it came in): the walker reads it by int index and contiguous
slice only. A malformed body raises IndexError, ValueError, `Over` or
`ProtocolError` (an overlong varint); the caller treats every one as "cannot
say". Sans-I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol import codec
from protocol.summaries.codegen import FIXED
from protocol.summaries.varint import skip_tags, uv

__all__ = ["TagScan", "tag_scanner", "scanner_source"]

TagScan = Callable[[Any, int], tuple[frozenset[int], int]]  # (body, start) -> (top-level tags present, end)

_FIXED = {typ: size for typ, (_fmt, size) in FIXED.items()}  # wire sizes of the fixed-size types
_NO_TAGS: frozenset[int] = frozenset()
_SCANNERS: dict[tuple[int, bool, int], TagScan] = {}


def _int(d: Any, p: int, width: int) -> int:
    """A big-endian signed length at p; IndexError when the body ends inside it (a short slice is no length)."""
    b = d[p:p + width]
    if len(b) != width:
        raise IndexError(f"{width}-byte length at {p} runs past the body")
    return int.from_bytes(b, "big", signed=True)


def _top_tags(d: Any, p: int, lim: int) -> tuple[frozenset[int], int]:
    """The tags of the tagged-field section at p, and where it ends."""
    count, p = uv(d, p, lim)
    if not count:
        return _NO_TAGS, p
    present = set()
    for _ in range(count):
        tag, p = uv(d, p, lim)
        size, p = uv(d, p, lim)
        p += size
        present.add(tag)
    return frozenset(present), p


_RUNTIME = {"uv": uv, "skip_tags": skip_tags, "_int": _int, "_top_tags": _top_tags}


def _fixed_size(st: Any) -> int | None:
    """The wire size of a struct made of fixed-size values only (no lengths, no tags), else None."""
    if st.flexible:
        return None
    total = 0
    for f in st.regular:
        size = _FIXED.get(f.inner) if f.kind == "value" else None
        if size is None:
            return None
        total += size
    return total


class _Emitter:
    """The source of one scanner: runs of fixed-size fields become one `p += k`."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.pending = 0  # bytes of fixed-size fields not yet added to p
        self.n = 0

    def var(self) -> str:
        self.n += 1
        return f"n{self.n}"

    def emit(self, ind: int, line: str) -> None:
        self.lines.append("    " * ind + line)

    def flush(self, ind: int) -> None:
        if self.pending:
            self.emit(ind, f"p += {self.pending}")
            self.pending = 0

    def length(self, ind: int, v: str, compact: bool, wide: bool) -> None:
        """`v` = a length prefix's value (-1: null), p past the prefix."""
        self.flush(ind)
        if compact:
            self.emit(ind, f"{v} = d[p]")
            self.emit(ind, f"if {v} < 128: p += 1")
            self.emit(ind, f"else: {v}, p = uv(d, p, lim)")
            self.emit(ind, f"{v} -= 1")
        else:
            width = 4 if wide else 2
            self.emit(ind, f"{v} = _int(d, p, {width}); p += {width}")

    def value(self, ind: int, typ: str, compact: bool) -> None:
        size = _FIXED.get(typ)
        if size is not None:
            self.pending += size
            return
        v = self.var()
        self.length(ind, v, compact, typ != "string")
        self.emit(ind, f"if {v} > 0: p += {v}")

    def tags(self, ind: int) -> None:
        self.flush(ind)
        self.emit(ind, "if d[p]: p = skip_tags(d, p, lim)")
        self.emit(ind, "else: p += 1")

    def struct(self, ind: int, st: Any) -> None:
        for f in st.regular:
            self.field(ind, f)
        if st.flexible:
            self.tags(ind)

    def field(self, ind: int, f: Any) -> None:
        if f.kind == "value":
            self.value(ind, f.inner, f.compact)
            return
        if f.kind == "struct":
            if not f.nullable:
                self.struct(ind, f.struct)
                return
            self.flush(ind)
            self.emit(ind, "if d[p] == 255: p += 1")
            self.emit(ind, "else:")
            self.emit(ind + 1, "p += 1")
            self.struct(ind + 1, f.struct)
            self.flush(ind + 1)
            return
        v = self.var()
        self.length(ind, v, f.compact, True)
        size = _fixed_size(f.struct) if f.kind == "structs" else _FIXED.get(f.inner)
        if size is not None:
            self.emit(ind, f"if {v} > 0: p += {v} * {size}")
            return
        # an element takes at least one byte: a count past the body is malformed, not a long loop
        self.emit(ind, f"if {v} > lim - p: raise ValueError('{f.where}: {{}} elements past the body'.format({v}))")
        self.emit(ind, f"for _ in range({v}):")
        if f.kind == "structs":
            self.struct(ind + 1, f.struct)
        else:
            self.value(ind + 1, f.inner, f.compact)
        self.flush(ind + 1)  # (never an empty body: fixed-size elements took the branch above)


def scanner_source(api_key: int, request: bool, version: int) -> str:
    """The generated source of one scanner (for reading and for the tests)."""
    st = codec.plan(api_key, request, version)
    e = _Emitter()
    e.emit(0, "def scan(d, p):")
    e.emit(1, "lim = len(d)")
    for f in st.regular:
        e.field(1, f)
    e.flush(1)
    if st.flexible:
        e.emit(1, "tags, p = _top_tags(d, p, lim)")
    else:
        e.emit(1, "tags = _NO_TAGS")
    e.emit(1, "if p > lim: raise ValueError('the body ends before its last field')")
    e.emit(1, "return tags, p")
    return "\n".join(e.lines) + "\n"


def tag_scanner(api_key: int, request: bool, version: int) -> TagScan:
    """The compiled scanner of one (api, direction, version): `scan(body, start) -> (tags present, end)`.

    UnknownApi (from the codec) when no spec describes it. Compiled once, on first use.
    """
    key = (api_key, request, version)
    scan = _SCANNERS.get(key)
    if scan is None:
        namespace: dict[str, Any] = {**_RUNTIME, "_NO_TAGS": _NO_TAGS}
        exec(compile(scanner_source(api_key, request, version), f"<tag scan {api_key} v{version}>", "exec"),
             namespace)
        scan = _SCANNERS[key] = namespace["scan"]
    return scan
