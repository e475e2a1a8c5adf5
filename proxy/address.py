"""The one parser for the `HOST:PORT` arguments of the proxy's command line.

Why one module: `--listen`, `--upstream`, `--route`, `--status-addr`, `iptables --broker`
and `top --addr` all take an address, and each used to parse it on its own — so a port
of 99999 was handed to the kernel, which silently kept its low 16 bits (the proxy
listened on 34463). Every form is parsed and range-checked here, once.

Forms: `PORT`, `:PORT`, `HOST:PORT`, `[V6]:PORT` (and a bare `V6:PORT` such as
`::1:9092`, split at the last colon). The host defaults to the caller's
`default_host`: `0.0.0.0` for listeners, `127.0.0.1` for the status endpoint.
"""

from __future__ import annotations

import socket

MAX_PORT = 65535


def parse_hostport(text: str, default_host: str = "0.0.0.0", *, allow_zero: bool = True) -> tuple[str, int]:
    """`PORT`, `:PORT`, `HOST:PORT` or `[V6]:PORT` → (host, port); ValueError with a one-line reason.

    `allow_zero`: port 0 asks the kernel for a free port, which is what tests and
    embedded proxies want from a listener; for a destination it is meaningless.
    """
    raw = text
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"expected [IPV6]:PORT, got {raw!r}")
        port = rest[1:]
    elif text.isdigit():
        host, port = "", text
    else:
        host, _, port = text.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {raw!r}")
    number = int(port)
    if number > MAX_PORT or (number == 0 and not allow_zero):
        low = 0 if allow_zero else 1
        raise ValueError(f"port {number} in {raw!r} is out of range ({low}-{MAX_PORT})")
    return (host or default_host), number


def bind_problem(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on right now (e.g. "address already in use"), or None.

    Checked before anything starts (recorder, worker processes), so a taken port is one
    line and exit 2 rather than a half-started proxy; SO_REUSEADDR as the real listener
    sets it, so only a live listener makes it fail, not a socket in TIME_WAIT. Without
    SO_REUSEPORT, so a listener that set it fails it too (`proxy.workers.reserve_ports`).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as the real listener: an IPv4 one on the port is no conflict
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((host, port))
    except OSError as exc:  # socket.gaierror included: a host name that does not resolve
        return (exc.strerror or str(exc)).lower()
    return None
