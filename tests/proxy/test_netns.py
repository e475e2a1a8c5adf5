"""Namespace tests: SYN cookies without window scaling (incident 5), transparent mode with REDIRECT."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from proxy.running import RunningProxy
from proxy_upstreams import EchoServer

pytestmark = pytest.mark.netns

from harness import netns

CLIENT = textwrap.dedent("""
    import socket, sys
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    s.sendall(b"ping")
    got = b""
    while len(got) < 4:
        got += s.recv(4 - len(got))
    assert got == b"ping", got
    s.close()
""")


def _echo_in(host):
    """An EchoServer whose loop thread lives in the namespace."""
    class NsEcho(EchoServer):
        def _main(self) -> None:
            with host.entered():
                super()._main()
    return NsEcho()


def test_syn_cookies_without_timestamps_show_no_window_scaling(sink):
    with netns.Topology() as topo:
        server, plain, nots = topo.host("srv"), topo.host("plain"), topo.host("nots")
        topo.link(plain, "10.77.11.1/24", server, "10.77.11.2/24")
        topo.link(nots, "10.77.12.1/24", server, "10.77.12.2/24")
        server.sysctl("net.ipv4.tcp_syncookies", 2)  # every SYN answered with a cookie
        nots.sysctl("net.ipv4.tcp_timestamps", 0)  # like a NAT stripping the option
        with _echo_in(server) as echo, RunningProxy(
            listen="0.0.0.0:0", upstream=f"127.0.0.1:{echo.port}", sink=sink,
            thread_context=server.entered,
        ) as p:
            port = p.listen_addr[1]
            plain.run([sys.executable, "-c", CLIENT, "10.77.11.2", str(port)])
            nots.run([sys.executable, "-c", CLIENT, "10.77.12.2", str(port)])
            sink.wait_final(2)
    by_client = {r["client_addr"].split(":")[0]: r for r in sink.finals()}
    normal, stripped = by_client["10.77.11.1"], by_client["10.77.12.1"]
    assert normal["tcp_client_open"]["wscale_ok"] is True
    assert normal["tcp_client_open"]["timestamps_ok"] is True
    assert stripped["tcp_client_open"]["wscale_ok"] is False
    assert stripped["tcp_client_open"]["timestamps_ok"] is False
    # the broker-side socket (loopback, no cookies) negotiated scaling in both cases
    assert stripped["tcp_broker_open"]["wscale_ok"] is True
    opens = [t for t in sink.tcps if t["phase"] == "open" and t["side"] == "client"]
    assert {t["wscale_ok"] for t in opens} == {True, False}


KAFKA_CLIENT = textwrap.dedent("""
    import json, sys
    lib, bootstrap, topic = sys.argv[1], sys.argv[2], sys.argv[3]
    n = 20
    if lib == "kafka-python":
        from kafka import KafkaConsumer, KafkaProducer
        p = KafkaProducer(bootstrap_servers=bootstrap, acks=1, client_id="kp-" + topic[-6:])
        for i in range(n):
            p.send(topic, b"m%d" % i)
        p.flush(); p.close()
        c = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=4000)
        got = [m.value for m in c]; c.close()
    else:
        import confluent_kafka as ck
        p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(n):
            p.produce(topic, b"m%d" % i)
        assert p.flush(20) == 0
        c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "g" + topic, "auto.offset.reset": "earliest"})
        c.subscribe([topic]); got = []
        while len(got) < n:
            m = c.poll(15)
            assert m is not None, len(got)
            if m.error() is None:
                got.append(m.value())
        c.close()
    print(json.dumps(len(got)))
""")


@pytest.fixture(scope="module")
def gateway_topology():
    """client ns ── gw ns (router + proxy) ── server ns (Kafka at 10.77.22.2)."""
    from harness.kafka import LocalKafka

    with netns.Topology() as topo:
        client, gw, server = topo.host("cli"), topo.host("gw"), topo.host("kfk")
        topo.link(client, "10.77.21.1/24", gw, "10.77.21.2/24")
        topo.link(gw, "10.77.22.1/24", server, "10.77.22.2/24")
        topo.enable_forwarding(gw)
        topo.route(client, "10.77.22.0/24", "10.77.21.2")
        topo.route(server, "10.77.21.0/24", "10.77.22.1")
        kafka = LocalKafka(host="10.77.22.2", netns=server.name)
        kafka.start()
        try:
            yield topo, client, gw, server, kafka
        finally:
            kafka.stop()
            kafka.cleanup()


def _run_client(host, lib: str, bootstrap: str, topic: str) -> int:
    out = host.run([sys.executable, "-c", KAFKA_CLIENT, lib, bootstrap, topic])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _iptables_save(host) -> str:
    return "\n".join(ln for ln in host.run(["iptables-save", "-t", "nat"]).stdout.splitlines()
                     if not ln.startswith("#") and not ln.startswith(":"))


@pytest.mark.kafka
@pytest.mark.parametrize("lib", ["kafka-python", "confluent-kafka"])
def test_transparent_gateway_prerouting(gateway_topology, sink, lib):
    from proxy.netfilter import RulePlan, build, build_removal, run

    topo, client, gw, server, kafka = gateway_topology
    plan = RulePlan("gateway", 15092, [("10.77.22.2", kafka.port)], ipv6=False)
    before = _iptables_save(gw)
    run(build(plan), netns=gw.name)
    try:
        with RunningProxy([":15092"], sink=sink, thread_context=gw.entered) as p:
            assert p.listen_addr[1] == 15092
            topic = f"tr-{lib}-{os.getpid()}"
            assert _run_client(client, lib, kafka.bootstrap, topic) == 20
    finally:
        run(build_removal(plan), netns=gw.name)
    assert _iptables_save(gw) == before  # removal restored exactly the previous rules
    finals = sink.finals()
    assert finals and all(c["mode"] == "transparent" for c in finals)
    assert all(c["original_dst"] == f"10.77.22.2:{kafka.port}" == c["broker_addr"] for c in finals)
    assert all(c["client_addr"].startswith("10.77.21.1:") for c in finals)
    per_conn: dict[str, int] = {}
    for r in sink.requests:
        per_conn[r["conn_id"]] = per_conn.get(r["conn_id"], 0) + 1
    for c in finals:
        assert per_conn.get(c["conn_id"], 0) == c["requests"]
    assert any(r["api_name"] == "Produce" and r["status"] == "answered" for r in sink.requests)
    assert any(r["api_name"] == "Fetch" for r in sink.requests)


@pytest.mark.kafka
def test_transparent_mode_names_the_cluster_from_the_relayed_answers(gateway_topology, sink):
    """Transparent mode decodes the clients' Metadata answers like every mode: with the proxy's own queries off
    (--no-resolve-topics) the recording still names the cluster of the original destination."""
    from proxy.netfilter import RulePlan, build, build_removal, run

    topo, client, gw, server, kafka = gateway_topology
    plan = RulePlan("gateway", 15092, [("10.77.22.2", kafka.port)], ipv6=False)
    run(build(plan), netns=gw.name)
    try:
        with RunningProxy([":15092"], sink=sink, thread_context=gw.entered, resolve_topics=False) as p:
            assert _run_client(client, "kafka-python", kafka.bootstrap, f"tr-cid-{os.getpid()}") == 20
            queries = p.call(lambda: p.server.resolver.queries)
    finally:
        run(build_removal(plan), netns=gw.name)
    own = [(t["broker_addr"], t["cluster_id"]) for t in sink.topics if t["topic_id"] is None]
    assert own == [(f"10.77.22.2:{kafka.port}", kafka.cluster_id)] and queries == 0


@pytest.mark.kafka
def test_transparent_local_output_does_not_loop(gateway_topology, sink):
    """Proxy on the client host itself: OUTPUT REDIRECT, upstream sockets skip it by SO_MARK."""
    from proxy.netfilter import RulePlan, build, build_removal, run
    from proxy.server import DEFAULT_MARK

    topo, client, gw, server, kafka = gateway_topology
    plan = RulePlan("local", 15092, [(None, kafka.port)], mark=DEFAULT_MARK, ipv6=False)
    before = _iptables_save(client)
    run(build(plan), netns=client.name)
    try:
        with RunningProxy([":15092"], sink=sink, so_mark=DEFAULT_MARK, thread_context=client.entered):
            assert _run_client(client, "kafka-python", kafka.bootstrap, f"loc-{os.getpid()}") == 20
    finally:
        run(build_removal(plan), netns=client.name)
    assert _iptables_save(client) == before
    finals = sink.finals()
    assert finals and all(c["end_reason"] != "upstream_connect_failed" for c in finals), finals
    assert all(c["broker_addr"] == f"10.77.22.2:{kafka.port}" for c in finals)
    assert sum(c["requests"] for c in finals) == len(sink.requests) > 0


ECHO_SERVER = textwrap.dedent("""
    import socket, sys
    fam = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
    s = socket.socket(fam); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(16)
    print("ready", flush=True)
    while True:
        c, _ = s.accept()
        data = c.recv(100)
        c.sendall(data); c.close()
""")


def test_transparent_ipv6_original_dst(sink):
    """SO_ORIGINAL_DST for IPv6 (ip6tables REDIRECT on a gateway)."""
    from proxy.netfilter import RulePlan, build, run

    with netns.Topology() as topo:
        client, gw, server = topo.host("c6"), topo.host("g6"), topo.host("s6")
        for h in (client, gw, server):
            h.sysctl("net.ipv6.conf.all.accept_dad", 0)
            h.sysctl("net.ipv6.conf.default.accept_dad", 0)
        topo.link(client, "fd77:31::1/64", gw, "fd77:31::2/64")
        topo.link(gw, "fd77:32::1/64", server, "fd77:32::2/64")
        gw.sysctl("net.ipv6.conf.all.forwarding", 1)
        client.run(["ip", "-6", "route", "add", "fd77:32::/64", "via", "fd77:31::2"])
        server.run(["ip", "-6", "route", "add", "fd77:31::/64", "via", "fd77:32::1"])
        echo = server.popen([sys.executable, "-c", ECHO_SERVER, "fd77:32::2", "7000"], stdout=subprocess.PIPE, text=True)
        assert echo.stdout.readline().strip() == "ready"
        run(build(RulePlan("gateway", 15092, [("fd77:32::2", 7000)])), netns=gw.name)
        with RunningProxy(["[::]:15092"], sink=sink, thread_context=gw.entered):
            out = client.run([sys.executable, "-c",
                              "import socket; s=socket.create_connection(('fd77:32::2',7000),timeout=10);"
                              "s.sendall(b'six'); print(s.recv(10).decode())"])
            assert out.stdout.strip() == "six"
            (row,) = sink.wait_final(1)
    assert row["mode"] == "transparent"
    assert row["original_dst"] == "[fd77:32::2]:7000" == row["broker_addr"]
    assert row["client_addr"].startswith("[fd77:31::1]:")


def test_upstream_unreachable_recorded(sink):
    """A namespace with no route to the broker: connect fails with 'unreachable' at once."""
    with netns.Topology() as topo:
        lonely = topo.host("lone")
        with RunningProxy(listen="127.0.0.1:0", upstream="10.77.99.1:9092", sink=sink,
                          thread_context=lonely.entered) as p:
            port = p.listen_addr[1]
            lonely.run([sys.executable, "-c",
                        f"import socket; s=socket.create_connection(('127.0.0.1',{port})); s.settimeout(10)\n"
                        "try:\n    s.recv(1)\nexcept ConnectionResetError:\n    pass"])
            (row,) = sink.wait_final(1)
    assert row["end_reason"] == "upstream_connect_failed"
    assert row["end_detail"].startswith("unreachable"), row["end_detail"]


KAFKATAP = [sys.executable, "-m", "kafkatap.cli"]


def _nat_rules(host) -> str:
    """Both families' nat tables as `-S` prints them: what --apply adds and --remove must take away."""
    return "\n".join(host.run([tool, "-w", "-t", "nat", "-S"]).stdout for tool in ("iptables", "ip6tables"))


def _ipv6_host(host) -> None:
    host.sysctl("net.ipv6.conf.all.accept_dad", 0)
    host.sysctl("net.ipv6.conf.default.accept_dad", 0)


def test_transparent_default_listener_serves_ipv4_and_ipv6_and_remove_needs_no_arguments(sink):
    """`kafkatap iptables --apply` redirects both families by default, so the default transparent listener
    (0.0.0.0) must also take IPv6 (it was ECONNREFUSED); `--remove` alone undoes the --apply."""
    with netns.Topology() as topo:
        client, gw, server = topo.host("c46"), topo.host("g46"), topo.host("s46")
        for h in (client, gw, server):
            _ipv6_host(h)
        c_dev, g_dev1 = topo.link(client, "10.77.41.1/24", gw, "10.77.41.2/24")
        g_dev2, s_dev = topo.link(gw, "10.77.42.1/24", server, "10.77.42.2/24")
        for h, dev, addr in ((client, c_dev, "fd77:41::1/64"), (gw, g_dev1, "fd77:41::2/64"),
                             (gw, g_dev2, "fd77:42::1/64"), (server, s_dev, "fd77:42::2/64")):
            h.run(["ip", "-6", "addr", "add", addr, "dev", dev, "nodad"])
        topo.enable_forwarding(gw)
        gw.sysctl("net.ipv6.conf.all.forwarding", 1)
        topo.route(client, "10.77.42.0/24", "10.77.41.2")
        topo.route(server, "10.77.41.0/24", "10.77.42.1")
        client.run(["ip", "-6", "route", "add", "fd77:42::/64", "via", "fd77:41::2"])
        server.run(["ip", "-6", "route", "add", "fd77:41::/64", "via", "fd77:42::1"])
        echo = server.popen([sys.executable, "-c", ECHO_SERVER, "::", "7000"], stdout=subprocess.PIPE, text=True)
        assert echo.stdout.readline().strip() == "ready"  # "::" without V6ONLY serves IPv4 too
        before = _nat_rules(gw)
        gw.run(KAFKATAP + ["iptables", "--mode", "gateway", "--port", "7000", "--apply"])
        assert "KAFKATAP" in _nat_rules(gw)
        with RunningProxy([":15092"], sink=sink, thread_context=gw.entered):
            for dst in ("10.77.42.2", "fd77:42::2"):
                out = client.run([sys.executable, "-c",
                                  f"import socket; s=socket.create_connection(({dst!r}, 7000), timeout=10);"
                                  "s.sendall(b'46'); print(s.recv(10).decode())"], check=False)
                assert out.returncode == 0 and out.stdout.strip() == "46", (dst, out.stderr)
            rows = sink.wait_final(2)
        installed = _nat_rules(gw)
        preview = gw.run(KAFKATAP + ["iptables", "--remove", "--dry-run"])
        assert "-X KAFKATAP" in preview.stdout and "dry run" in preview.stderr
        assert _nat_rules(gw) == installed  # a preview changes nothing
        removed = gw.run(KAFKATAP + ["iptables", "--remove"])
        assert "KAFKATAP" in removed.stdout and removed.stderr.strip().endswith("removed:")
        assert removed.stdout.splitlines() == preview.stdout.splitlines()  # it did what the preview said: commands only
        assert _nat_rules(gw) == before
    assert {r["original_dst"] for r in rows} == {"10.77.42.2:7000", "[fd77:42::2]:7000"}
    assert all(r["mode"] == "transparent" and r["original_dst"] == r["broker_addr"] for r in rows)


def test_failed_apply_rolls_back_and_leaves_foreign_rules_alone():
    """The IPv6 half fails (a KAFKATAP chain is already there): the IPv4 chain and jump it had installed go."""
    with netns.Topology() as topo:
        host = topo.host("rb")
        host.iptables("-t", "nat", "-N", "KAFKATAP", v6=True)  # not ours to remove on rollback
        before = _nat_rules(host)
        out = host.run(KAFKATAP + ["iptables", "--mode", "local", "--port", "9092", "--apply"], check=False)
        assert out.returncode == 1
        assert "ip6tables" in out.stderr and "rolled back" in out.stderr, out.stderr
        assert "a KAFKATAP chain is there already (an earlier --apply?): `kafkatap iptables --remove`" in out.stderr
        assert _nat_rules(host) == before  # no IPv4 jump or chain left, the IPv6 chain untouched


LOOP_CLIENT = textwrap.dedent("""
    import socket, sys
    try:  # the proxy may reset it at any step: before, during or after the send
        s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
        s.sendall(b"ping")
        print(repr(s.recv(10)))
    except (ConnectionResetError, BrokenPipeError):
        print("reset")
""")


def test_transparent_redirect_loop_is_refused_at_once(sink):
    """Rules applied with another --mark than the proxy's: the proxy's connection to the broker is redirected back
    to it, with the broker as its original destination. It opened the next hop, and that one the next: one client
    made thousands of connections a second, headed for EMFILE. Now the first hop back is refused, and both
    connections end with the reason (proxy.loop_guard)."""
    from proxy.netfilter import RulePlan, build, run
    from proxy.server import DEFAULT_MARK

    with netns.Topology() as topo:
        client, server = topo.host("lc"), topo.host("ls")
        topo.link(client, "10.77.41.1/24", server, "10.77.41.2/24")
        echo = server.popen([sys.executable, "-c", ECHO_SERVER, "10.77.41.2", "7000"], stdout=subprocess.PIPE, text=True)
        assert echo.stdout.readline().strip() == "ready"
        run(build(RulePlan("local", 15092, [(None, 7000)], mark=0x1, ipv6=False)), netns=client.name)
        assert DEFAULT_MARK != 0x1
        with RunningProxy([":15092"], sink=sink, so_mark=DEFAULT_MARK, thread_context=client.entered) as p:
            out = client.run([sys.executable, "-c", LOOP_CLIENT, "10.77.41.2", "7000"])
            sink.wait_final(2)
            accepted = p.server.stats["accepted"]
        echo.kill()
        echo.wait()
    assert out.stdout.strip() in ("reset", "b''")  # the client learns at once; it never reached the echo server
    finals = sink.finals()
    assert accepted == 2 and len(finals) == 2, [(c["client_addr"], c["end_detail"]) for c in finals[:5]]
    assert all(c["end_reason"] == "upstream_connect_failed" and c["end_detail"].startswith("redirect loop")
               for c in finals), finals
    assert {c["broker_addr"] for c in finals} == {"10.77.41.2:7000"}
