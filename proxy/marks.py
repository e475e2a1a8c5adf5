"""SO_MARK on the proxy's own upstream sockets, set in one place.

Why a module: three places set it (the start-up probe, each upstream connection, the topic-name
queries), and each needs the same two details. The option number is 36 where Python's socket
module does not name it. The mark is an unsigned 32-bit value (`--mark` takes 1..0xffffffff), but
`setsockopt` takes a C int, so a mark of 0x80000000 or more is passed as the int with the same
32 bits: the kernel reads them as the same unsigned mark.
"""

from __future__ import annotations

import socket

SO_MARK = getattr(socket, "SO_MARK", 36)


def set_mark(sock: socket.socket, mark: int) -> None:
    """Mark `sock`'s packets with `mark` (raises OSError without CAP_NET_ADMIN or CAP_NET_RAW)."""
    sock.setsockopt(socket.SOL_SOCKET, SO_MARK, mark - (1 << 32) if mark >= 1 << 31 else mark)
