"""Namespaces + iptables REDIRECT: the kernel hands back the original destination."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from harness.netns import Topology, leftover_namespaces

pytestmark = pytest.mark.netns

SO_ORIGINAL_DST = 80  # same value for SOL_IP and SOL_IPV6 (IP6T_SO_ORIGINAL_DST)


def _accept_original_dst(host, family: int, listen_port: int, connect_to: tuple[str, int]) -> tuple[str, int]:
    """Listen inside `host`, connect to `connect_to` from inside it, return what SO_ORIGINAL_DST says."""
    result: dict[str, object] = {}
    ready = threading.Event()

    def server() -> None:
        with host.entered(), socket.socket(family, socket.SOCK_STREAM) as srv:
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", listen_port))
            srv.listen()
            srv.settimeout(10)
            ready.set()
            conn, _ = srv.accept()
            with conn:
                if family == socket.AF_INET:
                    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
                    port, packed = struct.unpack_from("!H4s", raw, 2)
                    result["dst"] = (socket.inet_ntop(socket.AF_INET, packed), port)
                else:
                    raw = conn.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
                    port = struct.unpack_from("!H", raw, 2)[0]
                    result["dst"] = (socket.inet_ntop(socket.AF_INET6, raw[8:24]), port)

    t = threading.Thread(target=server)
    t.start()
    assert ready.wait(10)

    def client() -> None:
        with host.entered(), socket.create_connection(connect_to, timeout=10):
            pass

    c = threading.Thread(target=client)
    c.start()
    c.join(15)
    t.join(15)
    return result["dst"]  # type: ignore[return-value]


def test_redirect_reports_original_destination_ipv4_and_ipv6() -> None:
    with Topology() as topo:
        client, broker = topo.host("client"), topo.host("broker")
        topo.link(client, "10.77.1.1/24", broker, "10.77.1.2/24")
        client.run(["ip", "-6", "addr", "add", "fd77::1/64", "dev", f"kt{topo.tag[-6:]}0a", "nodad"])
        broker.run(["ip", "-6", "addr", "add", "fd77::2/64", "dev", f"kt{topo.tag[-6:]}0b", "nodad"])
        client.iptables("-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", "10.77.1.2", "--dport", "9092",
                        "-j", "REDIRECT", "--to-ports", "15092")
        client.iptables("-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", "fd77::2", "--dport", "9092",
                        "-j", "REDIRECT", "--to-ports", "15093", v6=True)

        assert _accept_original_dst(client, socket.AF_INET, 15092, ("10.77.1.2", 9092)) == ("10.77.1.2", 9092)
        assert _accept_original_dst(client, socket.AF_INET6, 15093, ("fd77::2", 9092)) == ("fd77::2", 9092)
        names = list(h.name for h in topo.hosts.values())
    assert not set(names) & set(leftover_namespaces()), "namespaces left behind"


def test_sysctls_are_per_namespace() -> None:
    with open("/proc/sys/net/ipv4/tcp_timestamps") as f:
        host_value = f.read().strip()
    with Topology() as topo:
        h = topo.host("client")
        h.sysctl("net.ipv4.tcp_timestamps", 0)
        assert h.run(["cat", "/proc/sys/net/ipv4/tcp_timestamps"]).stdout.strip() == "0"
    with open("/proc/sys/net/ipv4/tcp_timestamps") as f:
        assert f.read().strip() == host_value


def test_an_interrupt_while_a_namespace_is_added_leaves_none_behind(monkeypatch) -> None:
    """A Ctrl-C or SIGTERM that came while `ip netns add` ran left that namespace: the host was recorded after it."""
    import harness.netns as netns

    real = netns._run

    def interrupted_after_add(cmd, check=True):
        out = real(cmd, check)
        if list(cmd[:3]) == ["ip", "netns", "add"]:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(netns, "_run", interrupted_after_add)
    topo = netns.Topology()
    try:
        with pytest.raises(KeyboardInterrupt):
            topo.host("server")
    finally:
        topo.close()
    assert not [n for n in netns.leftover_namespaces() if topo.tag in n]
