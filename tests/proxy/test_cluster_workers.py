"""Cluster mode with several workers: what one worker learns about the brokers, every worker follows.

Each worker keeps its own broker map, and a broker that moved (or is new) is named to the proxy
only in the response of the one worker that relayed it. These tests make exactly one response
name the change and show every worker following it (`proxy.broker_news`): a real broker that
comes back at another port under `kafkatap proxy --workers 2`, and a broker two servers of one
port only learn from a relayed answer.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from cluster_helpers import CliProxy, free_port_run, three_nodes
from harness.kafka import LocalKafka, free_port
from harness.wire import WireClient
from protocol.apis import API_VERSIONS, METADATA
from proxy.broker_news import BrokerNews
from proxy.cluster import BrokerRoute, ClusterConfig, ClusterMode
from proxy.live import parse_metrics
from proxy.mailboxes import Mailboxes, MailSpec
from proxy.running import RunningProxy

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BROKERS_ONLY = {"topics": [], "allow_auto_topic_creation": False}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalKafka]:
    """Three nodes of their own: one of them is moved to another port."""
    yield from three_nodes()


def _brokers(host: str, port: int) -> set[tuple[int, int]]:
    """(node id, port) of every broker a Metadata answer from host:port lists."""
    with WireClient(host, port) as client:
        return {(b["node_id"], b["port"]) for b in client.call(METADATA, 12, BROKERS_ONLY)["brokers"]}


def _move(kafka: LocalKafka, index: int) -> int:
    """Kill node `index` and start it again with its broker listener on a new port (a replaced broker)."""
    node = kafka.nodes[index]
    kafka.kill(index)
    new = free_port(kafka.host)
    config = node.config_file.read_text()
    node.config_file.write_text(config.replace(f"{kafka.host}:{node.port}", f"{kafka.host}:{new}"))
    node.port = new
    kafka.restart(index)
    deadline = time.monotonic() + 60
    while (node.node_id, new) not in _brokers(kafka.host, kafka.nodes[0].port):
        assert time.monotonic() < deadline, "the cluster did not list the moved broker"
        time.sleep(0.2)  # the brokers' own view: nothing outside them to await
    return new


def test_every_worker_follows_a_broker_that_moved_in_one_workers_answer(cluster, tmp_path) -> None:
    listen = free_port_run(5)
    node = cluster.nodes[2]
    p = CliProxy(["--cluster", f"{cluster.host}:{cluster.nodes[0].port}", "--listen", f"127.0.0.1:{listen}"],
                 free_port(), tmp_path, workers=2)
    try:
        p.wait_log(lambda e: e.get("event") == "cluster discovered", count=2)
        new = _move(cluster, 2)
        # one answer, through one worker, names the move: nothing else passes through the proxy
        assert (node.node_id, listen + 1 + node.node_id) in _brokers("127.0.0.1", listen)
        p.wait_log(lambda e: str(e.get("event")).startswith("broker moved"), count=2)
        moved = [e for e in p.lines() if str(e.get("event")).startswith("broker moved")]
        assert len(moved) == 2 and len({e["worker"] for e in moved}) == 2
        assert all(e["node_id"] == node.node_id and e["new"] == f"{cluster.host}:{new}" for e in moved)
        assert sorted(e.get("learned_by") or "" for e in moved) == ["", "another worker"]
        # both workers now send the broker's listener to its new address: connections held open side by
        # side are balanced over the two, and every one is answered by the broker
        clients = [WireClient("127.0.0.1", listen + 1 + node.node_id) for _ in range(8)]
        try:
            for c in clients:
                assert c.call(API_VERSIONS, 0, {})["error_code"] == 0
            per_worker = parse_metrics(p.metrics())["kafkatap_worker_open_connections"]
            assert len(per_worker) == 2 and all(v >= 1 for _, v in per_worker), per_worker
        finally:
            for c in clients:
                c.close()
        news = {labels["how"]: v for labels, v in parse_metrics(p.metrics())["kafkatap_cluster_broker_news_total"]}
        assert news["applied"] >= 1 and news["lost"] == 0
    finally:
        p.stop()


def _signalled_bind(mode: ClusterMode, node_id: int) -> threading.Event:
    """An event set when `mode` binds broker `node_id`'s listener (the registry's bind, wrapped)."""
    bound = threading.Event()
    bind = mode.registry.bind

    def wrapped(route: BrokerRoute) -> int | None:
        port = bind(route)
        if route.node_id == node_id and port is not None:
            bound.set()
        return port

    mode.registry.bind = wrapped
    return bound


def test_a_broker_one_server_finds_gets_its_listener_in_every_server_of_the_port(kafka_broker, sink) -> None:
    """No discovery (as behind a SASL listener): the first relayed answer names the broker, in one server only."""
    listen = free_port_run(3)
    node = kafka_broker.nodes[0]
    boxes = Mailboxes(2)
    modes, bound = [], []
    for i in range(2):
        spec = boxes.spec(i)  # each server owns its copies of what a worker inherits
        news = BrokerNews(MailSpec(i, os.dup(spec.mailbox_fd), tuple(os.dup(fd) for fd in spec.inbox_fds)))
        mode = ClusterMode(ClusterConfig(bootstrap=(kafka_broker.host, node.port), listen=("127.0.0.1", listen)),
                           discovery_timeout=1e-9, news=news)
        modes.append(mode)
        bound.append(_signalled_bind(mode, node.node_id))
    route = f"127.0.0.1:{listen}={kafka_broker.host}:{node.port}"
    try:
        with RunningProxy(routes=[route], sink=sink, cluster=modes[0], reuse_port=True) as a, \
                RunningProxy(routes=[route], sink=type(sink)(), cluster=modes[1], reuse_port=True) as b:
            assert not any(m.registry.nodes for m in modes)
            broker_port = listen + 1 + node.node_id
            assert (node.node_id, broker_port) in _brokers("127.0.0.1", listen)
            assert all(e.wait(10) for e in bound), "a server did not bind the broker's listener"
            assert all(("127.0.0.1", broker_port) in p.listen_addrs for p in (a, b))
            assert sorted(m.news.stats()["applied"] for m in modes) == [0, 1]  # type: ignore[union-attr]
            for _ in range(8):  # whichever server the kernel hands the connection, it reaches the broker
                with WireClient("127.0.0.1", broker_port) as c:
                    assert c.call(API_VERSIONS, 0, {})["error_code"] == 0
    finally:
        for m in modes:
            m.news.close()  # type: ignore[union-attr]
        boxes.close()
