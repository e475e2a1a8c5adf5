"""Cluster mode and the bypass warning without sockets: the registry, the rewriter, the checks, the counters."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.addresses import SeenAddress, endpoints
from protocol.deep import decode_response, encode_response
from proxy.bypass import BypassCheck, BypassSink, top_line
from proxy.cluster import AddressRewriter, BrokerRegistry, ClusterConfig, parse_broker_ports
from proxy.cluster_options import cluster_setup
from proxy.intercept import RequestHead
from proxy.live import parse_metrics
from proxy.metrics import LiveStats

METADATA = 3


def _addr(node: int | None, host: str, port: int, api: int = METADATA, version: int = 12) -> SeenAddress:
    (ep,) = endpoints(api, False, version)
    return SeenAddress(ep, node, host, port)


def test_ports_follow_the_listen_port_and_can_be_pinned() -> None:
    cfg = ClusterConfig(bootstrap=("b1", 9092), listen=("0.0.0.0", 19092), broker_ports={1001: 20001})
    assert cfg.port_for(1) == 19094 and cfg.port_for(1001) == 20001
    assert ClusterConfig(("b", 1), ("h", 19092), broker_port_base=30000).port_for(5) == 30005
    with pytest.raises(ValueError, match="--broker-port 70000=PORT"):
        cfg.port_for(70000)
    with pytest.raises(ValueError, match="node id -1 names no broker"):  # it would have been the --listen port
        cfg.port_for(-1)
    assert ClusterConfig(("b", 1), ("127.0.0.1", 1)).advertised() == "127.0.0.1"
    assert ClusterConfig(("b", 1), ("0.0.0.0", 1), advertise_host="proxy.example").advertised() == "proxy.example"
    assert parse_broker_ports(["1=19001", "2 = 19002"]) == {1: 19001, 2: 19002}
    with pytest.raises(ValueError):
        parse_broker_ports(["1:19001"])


def test_registry_binds_a_new_broker_before_answering_and_follows_a_moved_one() -> None:
    bound: list[tuple[int, int]] = []
    reg = BrokerRegistry("proxy", ClusterConfig(("b", 1), ("proxy", 19092)).port_for,
                         bind=lambda r: bound.append((r.node_id, r.listen_port)) or r.listen_port)
    assert reg.map(_addr(2, "10.0.0.2", 9092)) == ("proxy", 19095)
    assert bound == [(2, 19095)]
    assert reg.map(_addr(2, "10.0.0.2", 9092)) == ("proxy", 19095) and len(bound) == 1  # bound once
    assert reg.map(_addr(2, "10.0.0.9", 9092)) == ("proxy", 19095)  # replaced: same listener, new target
    assert reg.upstream(2) == ("10.0.0.9", 9092)
    # an address without a node id is rewritten only when it is a known broker's
    (streams_ep,) = [e for e in endpoints(89, False, 0) if not e.broker]
    assert reg.map(SeenAddress(streams_ep, None, "10.0.0.9", 9092)) == ("proxy", 19095)
    assert reg.map(SeenAddress(streams_ep, None, "app-host", 8080)) is None
    assert reg.map(_addr(-1, "", -1)) is None  # "no coordinator": left as the broker wrote it


def test_two_brokers_that_swap_addresses_both_stay_known_by_address() -> None:
    """Pod addresses reused: node 1 moves to node 2's old address, then node 2 moves to node 1's. The second move
    once dropped node 1's new address from the by-address map (its old holder's entry was popped blindly)."""
    reg = BrokerRegistry("proxy", ClusterConfig(("b", 1), ("proxy", 19092)).port_for)
    a, b = ("10.0.0.1", 9092), ("10.0.0.2", 9092)
    reg.learn(1, *a)
    reg.learn(2, *b)
    reg.learn(1, *b)
    reg.learn(2, *a)
    assert reg.by_upstream == {b: 1, a: 2} and reg.all_listened([a, b])


def test_versions_newer_than_the_specs_are_not_offered_for_apis_that_carry_addresses() -> None:
    """A broker newer than the committed specs offers Metadata v14: its addresses could not be found, so the response
    would reach the client as the broker wrote it. The ApiVersions answer offers the specs' newest instead."""
    from protocol.apis import API_VERSIONS, APIS, FIND_COORDINATOR, PRODUCE

    newest = {k: APIS[k].max_version for k in (PRODUCE, METADATA, FIND_COORDINATOR, API_VERSIONS)}
    keys = [{"api_key": k, "min_version": 0, "max_version": v + (1 if k in (METADATA, FIND_COORDINATOR) else 0)}
            for k, v in newest.items()]
    keys.append({"api_key": 32, "min_version": 0, "max_version": APIS[32].max_version + 5})  # DescribeConfigs: no address
    answer = encode_response(API_VERSIONS, 3, 9, {"error_code": 0, "api_keys": keys, "throttle_time_ms": 0})
    rw = AddressRewriter(BrokerRegistry("proxy", ClusterConfig(("b", 1), ("proxy", 19092)).port_for), "c-1")
    head = RequestHead(API_VERSIONS, 3, 9, "x", 20, None, True)
    assert rw.wants_response(head)
    edit = rw.on_response(head, answer)
    assert edit is not None and edit.note == "cap versions Metadata,FindCoordinator"
    assert len(edit.frame) == len(answer) and edit.frame[:8] == answer[:8]  # same size, same header
    offered = {e["api_key"]: e["max_version"] for e in decode_response(edit.frame, API_VERSIONS, 3)["body"]["api_keys"]}
    assert offered == {**newest, 32: APIS[32].max_version + 5}
    changed = [i for i, (x, y) in enumerate(zip(answer, edit.frame)) if x != y]
    assert len(changed) == 2  # the low byte of two max_version fields, nothing else
    assert rw.registry.stats.capped_version_answers == 1
    same = encode_response(API_VERSIONS, 3, 10, {"error_code": 0, "throttle_time_ms": 0, "api_keys": [
        {"api_key": k, "min_version": 0, "max_version": v} for k, v in newest.items()]})
    assert rw.on_response(head, same) is None  # a broker of the specs' release: nothing to do
    refused = encode_response(API_VERSIONS, 3, 11, {"error_code": 35, "api_keys": []})
    assert rw.on_response(head, refused) is None  # UNSUPPORTED_VERSION (a v0 body): left as it is


def test_an_api_versions_request_newer_than_the_specs_still_gets_its_answer_capped() -> None:
    """A client and broker of a release past the specs speak ApiVersions v5+: its answer could not be read, so it
    went out uncapped (counted as a rewrite failure) and the next Metadata carried the brokers' own addresses."""
    from protocol.apis import API_VERSIONS, APIS
    from protocol.codec import UNKNOWN_TAGS

    newest = APIS[API_VERSIONS].max_version
    body = {"error_code": 0, "throttle_time_ms": 0, UNKNOWN_TAGS: {9: b"\x01\x02"},  # a field added after the specs
            "api_keys": [{"api_key": METADATA, "min_version": 0, "max_version": APIS[METADATA].max_version + 1}]}
    answer = encode_response(API_VERSIONS, newest, 12, body)  # the layout of the specs' newest, as a v5 body is
    reg = BrokerRegistry("proxy", ClusterConfig(("b", 1), ("proxy", 19092)).port_for)
    rw = AddressRewriter(reg, "c-1")
    edit = rw.on_response(RequestHead(API_VERSIONS, newest + 1, 12, "x", 20, None, True), answer)
    assert edit is not None and edit.note == "cap versions Metadata" and len(edit.frame) == len(answer)
    assert edit.frame.endswith(b"\x01\x09\x02\x01\x02")  # the unknown tag kept as it came
    assert reg.stats.rewrite_failures == 0 and reg.stats.capped_version_answers == 1


def test_an_api_only_newer_versions_of_which_the_broker_speaks_is_said_once() -> None:
    from structlog.testing import capture_logs

    from protocol.apis import API_VERSIONS, APIS

    too_new = APIS[METADATA].max_version + 1
    answer = encode_response(API_VERSIONS, 3, 13, {"error_code": 0, "throttle_time_ms": 0, "api_keys": [
        {"api_key": METADATA, "min_version": too_new, "max_version": too_new + 2}]})
    rw = AddressRewriter(BrokerRegistry("proxy", ClusterConfig(("b", 1), ("proxy", 19092)).port_for), "c-1")
    head = RequestHead(API_VERSIONS, 3, 13, "x", 20, None, True)
    with capture_logs() as logs:
        assert rw.on_response(head, answer) is None and rw.on_response(head, answer) is None  # nothing to lower
    said = [e for e in logs if "upgrade kafkatap" in e["event"]]
    assert len(said) == 1 and said[0]["apis"] == ["Metadata"]


def test_a_broker_without_a_listener_is_left_alone_and_logged() -> None:
    reg = BrokerRegistry("proxy", ClusterConfig(("b", 1), ("proxy", 65000)).port_for, bind=lambda r: None)
    assert reg.map(_addr(7, "10.0.0.7", 9092)) is None
    assert reg.map(_addr(900, "10.0.0.8", 9092)) is None  # 65000 + 1 + 900 does not fit


def _metadata(cid: int = 1) -> bytes:
    return encode_response(METADATA, 12, cid, {"brokers": [{"node_id": 1, "host": "10.0.0.1", "port": 9092}],
                                               "cluster_id": "c", "controller_id": 1, "topics": []})


def test_rewriter_edits_wanted_responses_and_notes_it() -> None:
    reg = BrokerRegistry("proxy", ClusterConfig(("b", 1), ("proxy", 19092)).port_for)
    rw = AddressRewriter(reg, "c-1")
    head = RequestHead(METADATA, 12, 1, "x", 20, None, True)
    assert rw.wants_response(head) and not rw.wants_request(head)
    assert not rw.wants_response(RequestHead(32, 4, 2, "x", 20, None, True))  # DescribeConfigs: no addresses
    edit = rw.on_response(head, _metadata())
    assert edit is not None and edit.note == "rewrite addresses 1"
    body = decode_response(edit.frame, METADATA, 12)["body"]
    assert (body["brokers"][0]["host"], body["brokers"][0]["port"]) == ("proxy", 19094)
    # garbage in a wanted response: forwarded as it was, counted, never raised
    assert rw.on_response(head, b"\x00\x00\x00\x06\x00\x00\x00\x01\xff\xff") is None
    assert reg.stats.rewrite_failures == 1 and reg.stats.rewritten_responses == 1


def test_cluster_options_refuse_what_cannot_work() -> None:
    setup = cluster_setup({"cluster": "b1:9092", "broker_ports": ("1=19001",)})
    assert setup.routes(("127.0.0.1:19092",), (), (), False) == ["127.0.0.1:19092=b1:9092"]
    assert setup.routes((), (), ("127.0.0.1:19092=b1:9092",), False)  # a worker of --workers
    with pytest.raises(ValueError, match="--upstream"):
        setup.routes(("1",), ("b2:9092",), (), False)
    with pytest.raises(ValueError, match="port 0"):
        setup.routes(("127.0.0.1:0",), (), (), False)
    with pytest.raises(ValueError, match="only apply with --cluster"):
        cluster_setup({"advertise_host": "x"})
    with pytest.raises(ValueError, match="is the --listen port"):
        cluster_setup({"cluster": "b1:9092", "broker_ports": ("1=19092",)}).routes(("127.0.0.1:19092",), (), (), False)
    with pytest.raises(ValueError, match="a port of its own"):
        cluster_setup({"cluster": "b1:9092", "broker_ports": ("1=19001", "2=19001")}).routes(("127.0.0.1:19092",), (), (), False)
    with pytest.raises(ValueError, match="^--cluster: "):
        cluster_setup({"cluster": "127.0.0.1"})
    with pytest.raises(ValueError, match="already the --listen port"):  # a derived port on the bootstrap listener
        ClusterConfig(("b", 1), ("h", 19092), broker_port_base=19090).port_for(2)


class _Rows:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def request(self, row: dict[str, Any]) -> None:
        self.rows.append(row)


def test_bypass_check_flags_broker_addresses_not_the_proxy() -> None:
    check = BypassCheck(lambda: [("127.0.0.1", 19092)], [("127.0.0.1", 29092)])
    assert check.around(["127.0.0.1:29092", "10.1.1.1:9092", "127.0.0.1:19092", "proxy.local:19092"]) == [
        "127.0.0.1:29092", "10.1.1.1:9092"]
    inner = _Rows()
    sink = BypassSink(inner, check, lambda: ["127.0.0.1:19092"])
    sink.request({"api_name": "Metadata", "advertised": ["127.0.0.1:29092"]})
    sink.request({"api_name": "Metadata", "advertised": ["127.0.0.1:19092"]})
    sink.request({"api_name": "Produce"})
    assert [r.get("bypass") for r in inner.rows] == [["127.0.0.1:29092"], None, None]
    assert sink.responses == 1 and sink.warned == {"127.0.0.1:29092"}


def test_first_in_proxy_is_once_per_key_across_processes(tmp_path, monkeypatch) -> None:
    """The mark is a file in the parent's directory: a second worker (or a restarted one) asking again gets False."""
    from proxy.bypass import ONCE_DIR_ENV, first_in_proxy

    monkeypatch.delenv(ONCE_DIR_ENV, raising=False)
    assert first_in_proxy("bypass a:1") and first_in_proxy("bypass a:1")  # one process: its own set decides
    monkeypatch.setenv(ONCE_DIR_ENV, str(tmp_path))
    assert first_in_proxy("bypass a:1") and not first_in_proxy("bypass a:1") and first_in_proxy("bypass b:2")
    monkeypatch.setenv(ONCE_DIR_ENV, str(tmp_path / "gone"))
    assert first_in_proxy("bypass a:1")  # the directory went away: warn twice rather than never


def test_bypass_is_counted_in_metrics_and_shown_in_top() -> None:
    stats = LiveStats("p1")
    stats.request({"conn_id": "c", "api_name": "Metadata", "api_version": 12, "bypass": ["127.0.0.1:29092"]})
    stats.request({"conn_id": "c", "api_name": "Metadata", "api_version": 12, "bypass": ["127.0.0.1:29092"]})
    metrics = parse_metrics(stats.render_prometheus())
    assert metrics["kafkatap_bypass_advertised_total"] == [({"proxy": "p1", "address": "127.0.0.1:29092"}, 2.0)]
    line = top_line(metrics["kafkatap_bypass_advertised_total"])
    assert line is not None and "2 responses" in line and "127.0.0.1:29092" in line and "--cluster" in line
    in_cluster_mode = top_line(metrics["kafkatap_bypass_advertised_total"], cluster=True)
    assert in_cluster_mode is not None and "--broker-port" in in_cluster_mode and "--cluster" not in in_cluster_mode
    assert top_line([]) is None


def test_an_address_in_front_of_the_proxy_is_no_bypass() -> None:
    """--fronted-by: a load balancer / NAT / another proxy forwards that address here."""
    check = BypassCheck(lambda: [("127.0.0.1", 19092)], [("127.0.0.1", 29092)], fronted_by=[("10.1.1.1", 9092)])
    assert check.around(["1@10.1.1.1:9092", "2@10.2.2.2:9092", "127.0.0.1:19092"]) == ["10.2.2.2:9092"]


def test_a_broker_that_can_get_no_listener_stops_the_start_before_a_client_is_accepted() -> None:
    """Node 20000 on a listen port of 48500 (port + 1 + node id is no port): the proxy logged "listening" and
    "clients bootstrap here" and accepted clients for the length of the discovery, then exited 2. Now the
    listeners serve after discovery. Node 65000 here: no free port plus it fits."""
    import asyncio
    import socket

    from structlog.testing import capture_logs

    from protocol.apis import METADATA
    from proxy.cluster import BrokerListenerError, ClusterMode
    from proxy.server import ProxyServer

    async def run() -> None:
        async def bootstrap(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readexactly(4)
            body = await reader.readexactly(int.from_bytes(head, "big"))
            cid = int.from_bytes(body[4:8], "big")
            writer.write(encode_response(METADATA, 12, cid, {
                "throttle_time_ms": 0, "brokers": [{"node_id": 65000, "host": "127.0.0.1", "port": 9092, "rack": None}],
                "cluster_id": "c", "controller_id": 65000, "topics": []}))
            await writer.drain()
            writer.close()

        fake = await asyncio.start_server(bootstrap, "127.0.0.1", 0)
        with socket.socket() as probe:  # a free port: plus 1 + 65000 it is no port
            probe.bind(("127.0.0.1", 0))
            listen = probe.getsockname()[1]
        mode = ClusterMode(ClusterConfig(bootstrap=fake.sockets[0].getsockname()[:2], listen=("127.0.0.1", listen)))
        server = ProxyServer([f"127.0.0.1:{listen}=127.0.0.1:9"], tcp_info=False, cluster=mode)
        with pytest.raises(BrokerListenerError, match="broker 65000"):
            await server.start()
        fake.close()

    with capture_logs() as logs:
        asyncio.run(run())
    events = [e["event"] for e in logs]
    assert "listening" not in events and "clients bootstrap here" not in events, events
