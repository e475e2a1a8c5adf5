"""Text that came from the wire, made safe to print on an operator's terminal.

Why shared: a client chooses its client_id, software name and topic names, and any of them can hold
escape sequences that clear the screen, set the window title, or reverse how a line reads. `kafkatap top`
prints them in its table, and `kafkatap analyze` in its summary's finding titles: both go through
`printable`. The HTML report escapes for HTML on its own.
"""

from __future__ import annotations

__all__ = ["printable"]

# C0 controls, DEL and C1 controls (0x9b is a CSI on its own) → "\\n", "\\x1b", …: what clients send
# (client_id, software, topics) must neither move the cursor nor split a row across lines; and the bidi
# controls (U+202A–U+202E, U+2066–U+2069), which reverse how the rest of a row reads
_CONTROL_ESCAPES = {i: (repr(chr(i))[1:-1] if i < 0x100 else f"\\u{i:04x}")
                    for i in (*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def printable(text: str) -> str:
    """`text` with its control characters written as Python escapes, for a terminal."""
    return text.translate(_CONTROL_ESCAPES)
