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

import ipaddress
import socket
from collections.abc import Sequence

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


def bind_error(host: str, port: int) -> OSError | None:
    """The error a listener on `host:port` would meet right now (EADDRINUSE, EADDRNOTAVAIL, a name that does not
    resolve…), or None.

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
        return exc
    return None


def bind_problem(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on right now (e.g. "address already in use"), in a few words, or None."""
    exc = bind_error(host, port)
    return None if exc is None else (exc.strerror or str(exc)).lower()


WILDCARDS = ("0.0.0.0", "::", "")
# Where a connect to an unspecified address goes on Linux: the loopback of its family.
UNSPECIFIED_REACHES = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def connected_host(host: str) -> str:
    """The address a connect to IP `host` reaches, as the listener that accepts it sees it: an IPv4-mapped IPv6 address
    is its IPv4 one, and an unspecified one (0.0.0.0, ::) the loopback."""
    host = host[7:] if host.startswith("::ffff:") else host
    return UNSPECIFIED_REACHES.get(host, host)


def is_local_address(host: str) -> bool:
    """Whether IP `host` is one of this host's own addresses, asked of the routing table. Nothing is sent.

    A UDP socket "connected" to the address takes that very address as its source only when it is local
    (loopback addresses all are). Binding it instead said yes to any address on hosts with
    net.ipv4.ip_nonlocal_bind set (keepalived and HAProxy hosts often do), and to multicast addresses.
    """
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    if ip.is_multicast or ip.is_unspecified:
        return False
    try:
        with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))  # a route lookup only: UDP sends nothing until written to
            return ipaddress.ip_address(s.getsockname()[0]) == ip
    except (OSError, ValueError):
        return False


def listens_at(listens: Sequence[tuple[str, int]], dst: tuple[str, int]) -> bool:
    """Whether a connection to `dst` (an IP address and port) reaches one of the bound `listens`: the same address, or a
    wildcard listener of its family (`::` listens IPv6 only: proxy.listener) on the port and an address of this host."""
    host, port = connected_host(dst[0]), dst[1]
    v6 = ":" in host
    for l_host, l_port in listens:
        if l_port != port:
            continue
        if l_host == host or (l_host in WILDCARDS and (":" in l_host) == v6 and is_local_address(host)):
            return True
    return False


def listen_address(listen: tuple[str, int]) -> tuple[str, int]:
    """The address a listener on `listen` binds: a host name looked up as its bind looks it up (IPv4, since
    `proxy.listener` picks the family by a ':' in the host); a wildcard, an IPv6 address or a name that does not
    resolve as given (an IPv4 address resolves to itself, without a lookup)."""
    if listen[0] in WILDCARDS or ":" in listen[0]:
        return listen
    return connect_address(listen, socket.AF_INET) or listen


def connect_address(addr: tuple[str, int], family: int = socket.AF_UNSPEC) -> tuple[str, int] | None:
    """The (IP, port) a connect to `addr` tries first, as the proxy's connect resolves it (a first address that
    answers is the one it keeps); None for a name that does not resolve (the upstream probe says what is wrong)."""
    try:
        infos = socket.getaddrinfo(addr[0], addr[1], family, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    return (str(infos[0][4][0]), addr[1]) if infos else None
