"""An explicit or cluster-mode upstream that is the proxy's own listener: refused at start, and ended at the first hop.

A proxy started with `--upstream` equal to its `--listen` connected to itself without end: its own start-up
probe of the upstream was the first client, and each hop opened the next (7,455 connections in 5 s).
"""

from __future__ import annotations

import socket

import pytest

from proxy.cli import _refuse_self_upstreams
from proxy.running import RunningProxy
from proxy.server import Route


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("upstream_host", ["127.0.0.1", "0.0.0.0"])
def test_a_connection_to_the_proxys_own_listener_ends_at_the_first_hop(sink, upstream_host: str) -> None:
    """No start-up check in an embedded proxy: the loop guard (proxy.loop_guard) refuses the hop that comes back,
    and ends the connection whose upstream it was with the same reason, so one client costs two connections.
    A connect to 0.0.0.0 reaches the loopback listener too (Linux), which the guard's first version missed."""
    port = free_port()
    with RunningProxy([f"127.0.0.1:{port}={upstream_host}:{port}"], sink=sink) as p:
        try:  # the reset may come before the send, even before connect() returns: the guard needs no client byte
            with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
                client.sendall(b"\x00\x00\x00\x01\x00")
                assert client.recv(1) == b""  # closed or reset: never answered
        except ConnectionResetError:
            pass
        finals = sink.wait_final(2)
        accepted = p.server.stats["accepted"]
    assert accepted == 2 and len(finals) == 2, [(c["client_addr"], c["end_detail"]) for c in finals[:5]]
    assert all(c["end_reason"] == "upstream_connect_failed"
               and c["end_detail"].startswith(f"loop: the upstream {upstream_host}:{port} is this proxy's own listener")
               for c in finals), finals


def R(listen: int, upstream: int | None, host: str = "127.0.0.1", upstream_host: str = "127.0.0.1") -> Route:
    return Route((host, listen), None if upstream is None else (upstream_host, upstream))


@pytest.mark.parametrize("routes, says", [
    ([R(19800, 19800)], "--upstream 127.0.0.1:19800 leads back to this proxy's own listener 127.0.0.1:19800: "),
    ([R(19800, 19800, "0.0.0.0")], "own listener 0.0.0.0:19800: "),  # a wildcard listener takes loopback connects
    ([R(19802, 19803), R(19803, 19802)], "own listener 127.0.0.1:19802 through 127.0.0.1:19803: "),
    ([R(19800, 19800, upstream_host="0.0.0.0")], "--upstream 0.0.0.0:19800 leads back"),  # Linux: to the loopback
    ([R(19800, 19800, "::1", "::")], "--upstream [::]:19800 leads back to this proxy's own listener [::1]:19800: "),
    ([R(19800, 19800, "0.0.0.0", "127.0.0.2")], "own listener 0.0.0.0:19800: "),  # every 127/8 address is this host's
    ([R(19800, 19800, "localhost")], "own listener localhost:19800: "),  # a listen name: looked up as its bind does
])
def test_a_loop_through_the_proxys_own_listeners_is_refused(routes: list[Route], says: str) -> None:
    with pytest.raises(ValueError, match="it would connect to itself") as refused:
        _refuse_self_upstreams(routes, "--upstream")
    assert says in str(refused.value)


@pytest.mark.parametrize("routes", [
    [R(19802, 19803), R(19803, 9)],  # a chain through the proxy that ends at a broker
    [R(0, 19800)],  # port 0: the kernel's choice, which no upstream names
    [R(19800, 19801), R(19801, None)],  # a transparent listener has no fixed upstream to follow
    [R(19800, 19800, "127.0.0.2")],  # another address of the loopback: not where this listener is
    # `::` listens IPv6 only (proxy.listener), 0.0.0.0 IPv4 only: a local broker of the other family on the same port
    [R(19800, 19800, "::")],
    [R(19800, 19800, "0.0.0.0", "::1")],
])
def test_routes_that_do_not_loop_are_accepted(routes: list[Route]) -> None:
    _refuse_self_upstreams(routes, "--upstream")


@pytest.mark.parametrize("host, local", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
    ("224.0.0.1", False),  # multicast: a UDP bind took it (and any address, with ip_nonlocal_bind) for local
    ("not-an-address", False),
])
def test_is_local_address_asks_the_routing_table(host: str, local: bool) -> None:
    from proxy.address import is_local_address

    assert is_local_address(host) is local
