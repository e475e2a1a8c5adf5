"""`--workers N` in transparent mode with rules of another --mark: every hop back is refused, whichever worker
the kernel (or the balancer) hands it to.

The proxy runs as the real command in a namespace, `kafkatap iptables --mode local --mark 0x1` redirects its own
upstream connections back to it, and plain TCP clients connect to an echo server in a second namespace. Each
worker once knew only its own upstream sockets: a hop that reached another worker was served as a new client,
and one connect made chains of 5 to 111 hops, recorded as broker resets, the real client's row too.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest

from harness import netns
from proxy_procs import ECHO_SERVER
from recording.reader import read_recording
from test_workers import KAFKATAP, ProxyProcess

pytestmark = pytest.mark.netns

CLIENTS = 8


# one connection after another, each told at once (a reset, or a close before any answer)
CLIENT = textwrap.dedent("""
    import socket, sys
    for i in range(int(sys.argv[3])):
        try:
            s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
            s.sendall(b"ping")
            print(repr(s.recv(10)))
        except (ConnectionResetError, BrokenPipeError):
            print("reset")
""")


@pytest.fixture
def fxt_topology(monkeypatch: pytest.MonkeyPatch) -> Iterator[netns.Topology]:
    """Namespaces named fxt-…, deleted at the end whatever happens."""
    monkeypatch.setattr(netns, "PREFIX", "fxt")
    with netns.Topology() as topo:
        yield topo


@pytest.mark.parametrize("balance", ["connections", "kernel"])
def test_a_redirect_loop_is_refused_at_the_first_hop_whichever_worker_takes_it(fxt_topology, tmp_path: Path,
                                                                               balance: str) -> None:
    topo = fxt_topology
    client, server = topo.host("lw"), topo.host("le")
    topo.link(client, "10.77.61.1/24", server, "10.77.61.2/24")
    echo = server.popen([sys.executable, "-c", ECHO_SERVER, "10.77.61.2", "7000"], stdout=subprocess.PIPE, text=True)
    assert echo.stdout.readline().strip() == "ready"
    client.run(KAFKATAP + ["iptables", "--mode", "local", "--port", "7000", "--mark", "0x1", "--no-ipv6", "--apply"])
    record = tmp_path / "rec"
    p = ProxyProcess(["--transparent", "--listen", "0.0.0.0:15092", "--workers", "3", "--balance", balance,
                      "--proxy-id", "loopw", "--record", str(record), "--log-level", "debug"], popen=client.popen)
    try:
        p.wait_event("workers running")
        out = client.run([sys.executable, "-c", CLIENT, "10.77.61.2", "7000", str(CLIENTS)], check=False)
        assert out.returncode == 0, out.stderr
        # the client and the one hop of its connect; a chain would go on past this
        p.wait_event("connection closed", count=2 * CLIENTS)
        assert p.terminate() == 0
    finally:
        p.kill()
    told = out.stdout.split()
    assert len(told) == CLIENTS and set(told) <= {"reset", "b''"}, out.stdout  # none reached the echo server
    closed = p.events("connection closed")
    assert len(closed) == 2 * CLIENTS, "\n".join(str((ev.get("worker"), ev.get("client"), ev["end_reason"], ev.get("detail")[:60])) for ev in closed)
    rows = read_recording(record, "connections")
    rows = rows.filter(pc.equal(rows.column("final"), True)).to_pylist()
    assert len(rows) == 2 * CLIENTS
    ends = [(r["end_reason"], (r["end_detail"] or "")[:40]) for r in rows]
    assert all(r["end_reason"] == "upstream_connect_failed" and r["end_detail"].startswith("redirect loop: ")
               for r in rows), ends
    assert {r["broker_addr"] for r in rows} == {"10.77.61.2:7000"}
    assert len({r["proxy_id"] for r in rows}) >= 2, ends  # the hops did cross workers: the case under test
