"""Pure pieces: TCP_INFO decoding, inference rules, iptables plans, fault specs, row shapes."""

from __future__ import annotations

import socket
import struct

import pytest

from proxy import tcpinfo
from proxy.faults import DirectionFaults, Faults, parse_fault_specs
from proxy.inference import EndFacts, inferred_cause, request_cause
from proxy.netfilter import RulePlan, build, build_removal
from recording.schema import TCP_FIELDS
from proxy.server import Route, parse_hostport


def _raw_tcp_info(options: int, wscales: int, rtt: int = 1234, total_retrans: int = 3, rate: int = 99) -> bytes:
    head = struct.pack("=8B", 1, 0, 0, 0, 0, options, wscales, 0)
    u32 = [0] * 24
    u32[15], u32[16], u32[23], u32[18], u32[2] = rtt, 56, total_retrans, 10, 1448
    body = struct.pack("=24I", *u32)
    tail = struct.pack("=4Q", 0, 0, 5000, 6000) + struct.pack("=6I", 0, 0, 0, 0, 0, 0) + struct.pack("=Q", rate)
    return head + body + tail


def test_tcpinfo_decode_options_and_wscale_nibbles():
    d = tcpinfo.decode(_raw_tcp_info(options=1 | 2 | 4, wscales=(7 << 4) | 9))
    assert set(d) == {c.name for c in TCP_FIELDS}
    assert d["wscale_ok"] and d["timestamps_ok"] and d["sack_ok"]
    assert (d["snd_wscale"], d["rcv_wscale"]) == (9, 7)
    assert d["rtt_us"] == 1234 and d["rttvar_us"] == 56 and d["retrans_total"] == 3
    assert d["snd_cwnd"] == 10 and d["snd_mss"] == 1448
    assert d["bytes_acked"] == 5000 and d["bytes_received"] == 6000 and d["delivery_rate_bps"] == 99
    assert d["state"] == "ESTABLISHED"
    off = tcpinfo.decode(_raw_tcp_info(options=2, wscales=0x77))
    assert not off["wscale_ok"] and off["snd_wscale"] == 0 and not off["timestamps_ok"]
    # an old kernel's shorter struct: the newer fields are simply missing
    short = tcpinfo.decode(_raw_tcp_info(1, 0)[:104])
    assert short["bytes_acked"] is None and short["delivery_rate_bps"] is None


def test_tcpinfo_live_socket():
    srv = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(srv.getsockname())
    a, _ = srv.accept()
    c.sendall(b"x" * 1000)
    a.recv(1000)
    info = tcpinfo.sample(c)
    assert info and info["state"] == "ESTABLISHED" and info["wscale_ok"] and info["bytes_acked"] >= 1000
    c.close(), a.close(), srv.close()
    assert tcpinfo.sample(c) is None


def test_inference_incident1_text():
    f = EndFacts("broker_fin", "broker", idle_before_end_ms=3, last_api="Produce", last_request_bytes=50123,
                 last_request_acks=0, last_request_topics=["orders"], last_request_batch_bytes=50000,
                 ms_since_last_request=3)
    cause = inferred_cause(f)
    assert cause.startswith("broker closed the connection right after an acks=0 Produce of 50123 bytes to orders: "
                            "batch larger than message.max.bytes (RecordBatchTooLarge)")
    big = EndFacts("broker_fin", "broker", last_api="Produce", last_request_bytes=2_000_000, last_request_acks=0,
                   last_request_topics=["t"], last_request_batch_bytes=1_999_000, ms_since_last_request=1)
    assert inferred_cause(big).endswith("(RecordBatchTooLarge)")
    # acks=1: the broker answers with an error instead; no close inference
    assert inferred_cause(EndFacts("client_fin", "client", last_api="Produce", last_request_acks=1)) is None


def test_inference_idle_resets():
    assert inferred_cause(EndFacts("broker_rst", "broker", idle_before_end_ms=30_500)).startswith(
        "reset after 30.5 s idle, not sent by the broker")
    assert "client side" in inferred_cause(EndFacts("client_rst", "client", idle_before_end_ms=5000))
    assert inferred_cause(EndFacts("client_rst", "client", idle_before_end_ms=10)) is None
    assert "connections.max.idle.ms" in inferred_cause(EndFacts("broker_fin", "broker", idle_before_end_ms=600_000))


def test_inference_names_a_tls_alert_from_the_broker():
    """A TLS 1.3 broker's refusal of the proxy's client certificate ends the connection as a broker reset with the
    first request unanswered; it read "broker restart, crash or a request it rejected"."""
    refused = EndFacts("broker_rst", "broker", unanswered=1, last_api="ApiVersions",
                       end_detail="SSLError: [SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate (_ssl.c:2580)")
    cause = inferred_cause(refused)
    assert cause.startswith("the broker refused the proxy's TLS client certificate, or its lack of one "
                            "(SSLV3_ALERT_BAD_CERTIFICATE)") and "--upstream-tls-cert" in cause
    for alert in ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_CERTIFICATE_EXPIRED"):
        assert "client certificate" in inferred_cause(EndFacts("broker_rst", "broker", end_detail=f"[SSL: {alert}] x"))
    other = inferred_cause(EndFacts("broker_fin", "broker", end_detail="[SSL: TLSV1_ALERT_PROTOCOL_VERSION] y"))
    assert other == "the broker ended the TLS session with an alert (TLSV1_ALERT_PROTOCOL_VERSION)"
    # the client's own alerts and errors that are not alerts keep their causes
    assert "client certificate" not in (inferred_cause(EndFacts("client_rst", "client", end_detail="[SSL: SSLV3_ALERT_BAD_CERTIFICATE] z")) or "")
    assert inferred_cause(EndFacts("broker_rst", "broker", unanswered=1, last_api="Fetch", answered_beyond_versions=True,
                                   end_detail="ConnectionResetError: [Errno 104]")).startswith("broker reset the connection")


def test_inference_names_a_failed_or_missing_sasl_authentication():
    failed = EndFacts("broker_fin", "broker", sasl_seen=True, sasl_error="SaslAuthenticate: SASL_AUTHENTICATION_FAILED",
                      last_api="SaslAuthenticate")
    assert inferred_cause(failed).startswith(
        "broker closed the connection after SASL authentication failed (SaslAuthenticate: SASL_AUTHENTICATION_FAILED)")
    missing = EndFacts("broker_fin", "broker", unanswered=1, last_api="Metadata")
    assert "without any SASL authentication: likely a SASL listener" in inferred_cause(missing)
    # once anything beyond ApiVersions was answered, or the client authenticated, it is no missing SASL
    for other in (EndFacts("broker_fin", "broker", unanswered=1, last_api="Metadata", answered_beyond_versions=True),
                  EndFacts("broker_fin", "broker", unanswered=1, last_api="Metadata", sasl_seen=True)):
        assert inferred_cause(other).endswith("broker restart, crash or a request it rejected")


def test_netfilter_local_plan_skips_mark_and_removal_mirrors():
    plan = RulePlan("local", 15092, [(None, 9092), ("10.0.0.5", 9093), ("fd00::5", 9094)], mark=0x4B54)
    add = build(plan)
    text = [" ".join(c) for c in add]
    assert "iptables -w -t nat -N KAFKATAP" in text
    assert "iptables -w -t nat -A KAFKATAP -m mark --mark 0x4b54 -j RETURN" in text
    assert text.index("iptables -w -t nat -A KAFKATAP -m mark --mark 0x4b54 -j RETURN") < \
        text.index("iptables -w -t nat -A KAFKATAP -p tcp --dport 9092 -j REDIRECT --to-ports 15092")
    assert "iptables -w -t nat -I OUTPUT -p tcp -m comment --comment kafkatap -j KAFKATAP" in text
    assert any(t.startswith("ip6tables") and "fd00::5" in t for t in text)
    assert not any(t.startswith("ip6tables") and "10.0.0.5" in t for t in text)
    rm = [" ".join(c) for c in build_removal(plan)]
    assert rm[:3] == ["iptables -w -t nat -D OUTPUT -p tcp -m comment --comment kafkatap -j KAFKATAP",
                      "iptables -w -t nat -F KAFKATAP",
                      "iptables -w -t nat -X KAFKATAP"]
    with pytest.raises(ValueError, match="loop"):
        RulePlan("local", 15092, [(None, 9092)])
    gw = [" ".join(c) for c in build(RulePlan("gateway", 15092, [("10.0.0.5", 9092)], interface="eth1", ipv6=False))]
    assert gw[-1] == "iptables -w -t nat -I PREROUTING -p tcp -i eth1 -m comment --comment kafkatap -j KAFKATAP"


def test_netfilter_no_ipv6_names_the_ipv6_brokers_it_leaves_out():
    """`--broker 127.0.0.1:9092 --broker [::1]:9092 --no-ipv6` wrote the IPv4 rule alone and said nothing: the IPv6
    broker's connections bypassed the proxy unseen. The IPv4 rules are still right, so a note names what is left out."""
    from proxy.netfilter import left_out_note

    plan = RulePlan("gateway", 15092, [("127.0.0.1", 9092), ("::1", 9092), ("fd00::5", 9093), (None, 9094)], ipv6=False)
    assert plan.left_out == [("::1", 9092), ("fd00::5", 9093)]  # a --port (any address) is no broker left out
    assert left_out_note(plan) == ("--no-ipv6: no rule for the IPv6 broker address(es) [::1]:9092, [fd00::5]:9093: "
                                   "connections to them bypass the proxy (unrecorded); drop --no-ipv6 to redirect them too")
    text = [" ".join(c) for c in build(plan)]
    assert "iptables -w -t nat -A KAFKATAP -p tcp -d 127.0.0.1 --dport 9092 -j REDIRECT --to-ports 15092" in text
    assert not any(t.startswith("ip6tables") for t in text)
    both = RulePlan("gateway", 15092, [("127.0.0.1", 9092), ("::1", 9092)])
    assert both.left_out == [] and left_out_note(both) is None
    assert left_out_note(RulePlan("gateway", 15092, [("127.0.0.1", 9092), (None, 9094)], ipv6=False)) is None
    with pytest.raises(ValueError, match="every --broker is an IPv6 address"):
        RulePlan("gateway", 15092, [("::1", 9092)], ipv6=False)


def test_fault_specs():
    f = parse_fault_specs(["latency=to-broker:20:5", "bandwidth=both:1000000", "close-after=to-client:100",
                           "idle-reset=30", "refuse"])
    assert f.to_broker == DirectionFaults(latency_ms=20, jitter_ms=5, bandwidth_bps=1_000_000)
    assert f.to_client == DirectionFaults(bandwidth_bps=1_000_000, close_after_bytes=100)
    assert f.to_broker.describe() == "latency 20–25 ms, bandwidth 1000000 B/s"  # delay = 20 + uniform(0, 5)
    assert DirectionFaults(latency_ms=7).describe() == "latency 7 ms"
    assert f.idle_reset_s == 30 and f.refuse_connections and f.active
    assert not Faults().active
    with pytest.raises(ValueError):
        parse_fault_specs(["latency=sideways:1"])


def test_routes_parse():
    assert Route.parse("127.0.0.1:19092=broker:9092") == Route(("127.0.0.1", 19092), ("broker", 9092))
    assert Route.parse(":15092") == Route(("0.0.0.0", 15092), None)
    assert parse_hostport("[::1]:9092") == ("::1", 9092)


def test_request_cause_acks1_too_large():
    assert request_cause("Produce", 1, 50123, ["t"], ["MESSAGE_TOO_LARGE"]) == (
        "acks=1 Produce of 50123 bytes to t rejected: batch larger than message.max.bytes (MESSAGE_TOO_LARGE)")
    assert request_cause("Produce", -1, 10, ["t"], ["NOT_LEADER_OR_FOLLOWER"]) is None
    assert request_cause("Fetch", None, 10, ["t"], ["MESSAGE_TOO_LARGE"]) is None


@pytest.mark.parametrize("mark", [1, 0x4B54, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF])
def test_every_mark_the_cli_accepts_is_set_as_that_mark(mark: int) -> None:
    """setsockopt takes a C int: 0x80000000 and above raised TypeError (a traceback at start) until passed as the int
    with the same 32 bits."""
    import socket

    from proxy.marks import SO_MARK, set_mark

    with socket.socket() as s:
        set_mark(s, mark)
        assert s.getsockopt(socket.SOL_SOCKET, SO_MARK) & 0xFFFFFFFF == mark


def test_workers_never_join_another_process_listening_with_so_reuseport() -> None:
    """`--workers N` binds with SO_REUSEPORT, which lets any socket of the same user that also set it share the
    port's new connections: a second proxy started on a port the first one serves took half its clients."""
    import errno
    import socket

    from proxy.server import Route
    from proxy.workers import reserve_ports

    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        for listen in ("127.0.0.1", "0.0.0.0", "localhost"):  # a name too: the kernel resolves it as the bind will
            with pytest.raises(OSError) as refused:
                reserve_ports([Route((listen, port), ("127.0.0.1", 9))])
            assert refused.value.errno == errno.EADDRINUSE and "in use" in str(refused.value)
    with socket.socket(socket.AF_INET6) as v6_only:  # another family's listener on the port shares nothing
        v6_only.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        v6_only.bind(("::1", port))
        v6_only.listen()
        resolved, held = reserve_ports([Route(("0.0.0.0", port), ("127.0.0.1", 9))])
        for sock in held:
            sock.close()
    resolved, held = reserve_ports([Route(("127.0.0.1", port), ("127.0.0.1", 9))])  # once it is gone: free again
    assert resolved[0].listen == ("127.0.0.1", port)
    for sock in held:
        sock.close()


def test_a_transparent_listeners_ipv6_twin_held_by_another_process_is_refused_at_start() -> None:
    """A transparent 0.0.0.0 listener gets a [::] twin in each worker, bound with SO_REUSEPORT: another process's
    SO_REUSEPORT listener on [::]:P was joined without a word and took a share of the IPv6 clients."""
    import errno
    import socket

    from proxy.server import Route
    from proxy.workers import reserve_ports

    with socket.socket(socket.AF_INET6) as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        other.bind(("::", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(OSError) as refused:
            reserve_ports([Route(("0.0.0.0", port), None)])
        assert refused.value.errno == errno.EADDRINUSE and "IPv6 twin" in str(refused.value)
        resolved, held = reserve_ports([Route(("0.0.0.0", port), ("127.0.0.1", 9))])  # explicit mode: no twin
        for sock in held:
            sock.close()
    resolved, held = reserve_ports([Route(("0.0.0.0", 0), None)])
    try:  # free: the twin is held beside the IPv4 port until the workers bind
        assert [s.getsockname()[:2] for s in held] == [("0.0.0.0", resolved[0].listen[1]), ("::", resolved[0].listen[1])]
    finally:
        for sock in held:
            sock.close()


def test_workers_say_a_listen_address_not_on_this_host_as_the_kernel_does() -> None:
    """With `--workers N` (the default on a multi-core host) every bind failure used to be said as "address already
    in use ... a listener there would share its new connections": an address not on this host too."""
    import errno

    from proxy.server import Route
    from proxy.workers import reserve_ports

    with pytest.raises(OSError) as refused:  # TEST-NET-1: on no interface here; the bind fails locally, nothing is sent
        reserve_ports([Route(("192.0.2.1", 19202), ("127.0.0.1", 9))])
    assert refused.value.errno == errno.EADDRNOTAVAIL
    assert "assign requested address" in str(refused.value) and "share" not in str(refused.value)


def test_the_removed_versions_named_are_a_clients():
    """KIP-896's removals as a client sends them: the APIs only brokers send (WriteTxnMarkers v0, AlterPartition v0-1:
    an old broker's inter-broker protocol) and the whole ZooKeeper-mode APIs are not named on a connection's row."""
    from protocol.apis import FETCH, PRODUCE
    from proxy.facts import removed_in_kafka_4

    LEADER_AND_ISR, WRITE_TXN_MARKERS, ALTER_PARTITION = 4, 27, 56

    assert (removed_in_kafka_4(PRODUCE, 2), removed_in_kafka_4(PRODUCE, 3), removed_in_kafka_4(FETCH, 3)) == (3, None, 4)
    assert removed_in_kafka_4(WRITE_TXN_MARKERS, 0) is None and removed_in_kafka_4(ALTER_PARTITION, 0) is None
    assert removed_in_kafka_4(LEADER_AND_ISR, 7) is None


def test_a_refusal_of_a_removed_version_is_told_from_a_3x_brokers_own_closes():
    """A 4.x broker closes a connection at its first request of a version Kafka 4.0 removed and answers nothing after
    it; an acks=0 Produce v2 is refused so too (no answer is awaited). A 3.x broker that served such requests and
    later closed the connection (a restart with a Fetch v3 in flight) did not refuse them."""
    refused = dict(last_api_version=2, oldest_served_by_4=3, removed_unserved=True)
    acks1 = inferred_cause(EndFacts("broker_fin", "broker", unanswered=1, last_api="Produce", last_request_acks=1, **refused))
    acks0 = inferred_cause(EndFacts("broker_fin", "broker", unanswered=0, last_api="Produce", last_request_acks=0,
                                    last_request_bytes=300, last_request_batch_bytes=200, **refused))
    for cause in (acks1, acks0):
        assert cause.startswith("broker closed the connection at a Produce v2 request, a version Kafka 4.0 removed"), cause
    big = inferred_cause(EndFacts("broker_fin", "broker", last_api="Produce", last_request_acks=0, last_request_bytes=2_000_000,
                                  last_request_batch_bytes=2_000_000, **refused))
    assert "RecordBatchTooLarge" in big  # over the default message.max.bytes: that is the likelier refusal
    restart = inferred_cause(EndFacts("broker_rst", "broker", unanswered=1, last_api="Fetch", last_api_version=3,
                                      oldest_served_by_4=4, removed_unserved=False, answered_beyond_versions=True))
    assert restart is None or "Kafka 4.0" not in restart, restart
