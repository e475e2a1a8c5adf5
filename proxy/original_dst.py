"""SO_ORIGINAL_DST: where a REDIRECTed connection was going before netfilter caught it.

One tiny module so the one Linux-specific syscall of transparent mode can be
replaced in tests (monkeypatch `original_dst`) or ported, like mitmproxy keeps
its platform code apart from its proxy server.
"""

from __future__ import annotations

import socket
import struct

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h (IPv4, level SOL_IP)
IP6T_SO_ORIGINAL_DST = 80  # linux/netfilter_ipv6/ip6_tables.h (level SOL_IPV6)
SOL_IP = getattr(socket, "SOL_IP", 0)
SOL_IPV6 = getattr(socket, "SOL_IPV6", 41)


def original_dst(sock: socket.socket) -> tuple[str, int]:
    """Return (host, port) the client originally connected to.

    Raises OSError (ENOENT) when conntrack has no entry for the connection (no nat rules loaded). Once nat
    rules exist, conntrack tracks every connection, so a client that dialled the proxy's port directly gets
    that port back as its "original" destination: the caller tells the two apart (`proxy.connection`).
    """
    if sock.family == socket.AF_INET6:
        raw = sock.getsockopt(SOL_IPV6, IP6T_SO_ORIGINAL_DST, 28)
        # struct sockaddr_in6: family(u16, host order), port(be16), flowinfo(u32), addr[16], scope(u32)
        port = struct.unpack_from("!H", raw, 2)[0]
        host = socket.inet_ntop(socket.AF_INET6, raw[8:24])
        if host.startswith("::ffff:"):  # an IPv4 client on a dual-stack listener
            host = host[7:]
        return host, port
    raw = sock.getsockopt(SOL_IP, SO_ORIGINAL_DST, 16)
    # struct sockaddr_in: family(u16), port(be16), addr[4], zero[8]
    port = struct.unpack_from("!H", raw, 2)[0]
    host = socket.inet_ntop(socket.AF_INET, raw[4:8])
    return host, port
