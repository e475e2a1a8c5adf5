"""Text that came from the wire, made safe to print on an operator's terminal.

Why shared: a client chooses its client_id, software name and topic names, and any of them can hold
escape sequences that clear the screen, set the window title, or reverse how a line reads. `kafkatap top`
prints them in its table, and `kafkatap analyze` in its summary's finding titles: both go through
`printable`. The HTML report escapes for HTML on its own.
"""

from __future__ import annotations

import unicodedata

__all__ = ["printable", "display_width", "cut_to_width", "pad_to_width"]

# C0 controls, DEL and C1 controls (0x9b is a CSI on its own) → "\\n", "\\x1b", …: what clients send
# (client_id, software, topics) must neither move the cursor nor split a row across lines; and the bidi
# controls (U+202A–U+202E, U+2066–U+2069), which reverse how the rest of a row reads
_CONTROL_ESCAPES = {i: (repr(chr(i))[1:-1] if i < 0x100 else f"\\u{i:04x}")
                    for i in (*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def printable(text: str) -> str:
    """`text` with its control characters written as Python escapes, for a terminal."""
    return text.translate(_CONTROL_ESCAPES)


def _char_width(ch: str) -> int:
    """Terminal columns of one character: 2 for East Asian wide and fullwidth ones (CJK, most emoji), 0 for
    combining marks and format characters (zero-width joiner, variation selectors), else 1."""
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def display_width(text: str) -> int:
    """The columns `text` takes on a terminal (len() counts characters: a CJK topic name takes twice its length,
    and misaligned every column after it in `kafkatap top`)."""
    if text.isascii():
        return len(text)
    return sum(_char_width(ch) for ch in text)


def cut_to_width(text: str, width: int, keep: int = 0) -> str:
    """`text` in at most `width` columns; a longer one ends in "…" (at least `keep` columns of text kept before it),
    so nothing is lost silently and no wide character is split at the edge."""
    if display_width(text) <= width:
        return text
    room, used, out = max(keep, width - 1), 0, []
    for ch in text:
        w = _char_width(ch)
        if used + w > room:
            break
        out.append(ch)
        used += w
    return "".join(out) + "…"


def pad_to_width(text: str, width: int) -> str:
    """`text` padded with spaces to `width` columns (str.ljust counts characters)."""
    return text + " " * max(0, width - display_width(text))
