"""Topic ids → names (issue 14): the shared map, the naming step, and the resolver against a real broker."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from harness.java_clients import JavaClients, JavaTool
from harness.wire import WireClient
from protocol.apis import CREATE_TOPICS, DELETE_TOPICS, FETCH, METADATA
from proxy.rows import REQUEST_KEYS
from proxy.running import RunningProxy
from proxy.topics import TopicMap, TopicNamingSink, is_topic_id, split_topics

ZERO = "00000000-0000-0000-0000-000000000000"
TID = "8f4c9b1e-1111-4000-8000-000000000001"


class _Rows:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.connections: list[dict] = []

    def request(self, row: dict) -> None:
        self.requests.append(row)

    def connection(self, row: dict) -> None:
        self.connections.append(row)


class _Wants:
    def __init__(self) -> None:
        self.brokers: list[str | None] = []
        self.clusters: list[str | None] = []

    def want(self, broker: str | None) -> None:
        self.brokers.append(broker)

    def want_cluster(self, broker: str | None) -> None:
        self.clusters.append(broker)


def test_topic_id_shape() -> None:
    assert is_topic_id(TID)
    for name in ("orders", "8f4c9b1e-1111-4000-8000-00000000000", TID.upper(), TID.replace("-", "_"), None):
        assert not is_topic_id(name)
    assert split_topics(["a", TID]) == (["a", TID], [TID])


def test_map_is_bounded_and_reports_each_new_pair_once() -> None:
    learned: list[tuple] = []
    m = TopicMap(limit=2, on_learned=lambda *a: learned.append(a))
    assert m.learn("00000000-0000-0000-0000-000000000001", "a", "b:1")
    assert not m.learn("00000000-0000-0000-0000-000000000001", "a", "b:1")
    m.learn("00000000-0000-0000-0000-000000000002", "b")
    m.learn("00000000-0000-0000-0000-000000000003", "c")
    assert len(m) == 2 and m.name("00000000-0000-0000-0000-000000000001") is None and not m.knows_name("a")
    assert [x[1] for x in learned] == ["a", "b", "c"]
    assert not m.learn("00000000-0000-0000-0000-000000000000", "zero")  # the null id names nothing


def test_map_learns_the_pairs_a_relayed_answer_carried_ids_as_sent() -> None:
    """Relayed answers give ids as their 16 bytes: each is spelled as a uuid once (a memo as bounded as the map),
    and learned as any pair is: new ones reported once with the broker that answered, known ones refreshed."""
    learned: list[tuple] = []
    m = TopicMap(limit=2, on_learned=lambda *a: learned.append(a))
    a, b, c = (uuid.UUID(int=n) for n in (1, 2, 3))
    assert m.learn_sent([(a.bytes, "a"), (b.bytes, "b")], "b:1") == 2
    assert m.learn_sent([(a.bytes, "a"), (b.bytes, "b")], "b:1") == 0  # known: nothing recorded again
    assert m.name(str(a)) == "a" and m.knows_name("b")
    assert m.learn_sent([(c.bytes, "c")], "b:2") == 1  # the map keeps 2: the least recently learned goes
    assert m.name(str(a)) is None and len(m._spelled) <= m.limit
    assert m.learn_sent([(a.bytes, "a")], "b:2") == 1  # forgotten, then learned again from the next answer
    assert learned == [(str(a), "a", "b:1"), (str(b), "b", "b:1"), (str(c), "c", "b:2"), (str(a), "a", "b:2")]


def test_naming_sink_names_known_ids_and_asks_for_unknown_ones() -> None:
    m, rows, wants = TopicMap(), _Rows(), _Wants()
    sink = TopicNamingSink(rows, m, wants)  # type: ignore[arg-type]
    other = "8f4c9b1e-1111-4000-8000-000000000002"
    m.learn(TID, "orders")
    sink.request({"api_key": FETCH, "broker_addr": "b:1", "topics": [TID, other], "topic_ids": [TID, other],
                  "errors": [{"topic": TID}], "error_count": 1})
    row = rows.requests[-1]
    assert row["topics"] == ["orders", other] and row["topic_ids"] == [TID, other]
    assert row["errors"][0]["topic"] == "orders"
    assert wants.brokers == ["b:1"]  # the unknown id starts a query
    sink.request({"api_key": METADATA, "broker_addr": "b:2", "topics": ["orders"], "topic_ids": []})
    assert wants.brokers == ["b:1"]  # a name the map knows: nothing to ask
    sink.request({"api_key": METADATA, "broker_addr": "b:2", "topics": ["payments"], "topic_ids": []})
    assert wants.brokers == ["b:1", "b:2"]  # a client is about to use a topic we cannot name yet
    sink.connection({"last_request_topics": [TID]})
    assert rows.connections[-1]["last_request_topics"] == ["orders"]


def test_naming_sink_names_each_topic_once_and_errors_of_rows_that_name_none() -> None:
    """A KIP-848 heartbeat names a topic by name and by id: once named it counted twice per topic. An
    incremental Fetch names no topic, yet its partition errors carry ids: they stayed uuids."""
    m, rows, wants = TopicMap(), _Rows(), _Wants()
    sink = TopicNamingSink(rows, m, wants)  # type: ignore[arg-type]
    m.learn(TID, "orders")
    sink.request({"api_key": 68, "broker_addr": "b:1", "topics": ["orders", TID], "topic_ids": [TID]})
    assert rows.requests[-1]["topics"] == ["orders"]
    both = {"api_key": FETCH, "broker_addr": "b:1", "topics": [TID, "orders"], "topic_ids": [TID],
            "topic_record_bytes": [10, 20]}
    sink.request(both)
    assert rows.requests[-1]["topics"] == ["orders", "orders"]  # its bytes follow `topics` entry by entry
    other = "8f4c9b1e-1111-4000-8000-000000000002"
    sink.request({"api_key": FETCH, "broker_addr": "b:3", "topics": [], "topic_ids": [], "error_count": 2,
                  "errors": [{"topic": TID}, {"topic": other}]})
    assert [e["topic"] for e in rows.requests[-1]["errors"]] == ["orders", other]
    assert wants.brokers == ["b:3"]  # the id it cannot name starts a query


def test_naming_sink_asks_for_the_cluster_id_of_brokers_that_answer_metadata() -> None:
    """Metadata and DescribeCluster answers carry the cluster id: their broker's is learned (replay's guard)."""
    rows, wants = _Rows(), _Wants()
    sink = TopicNamingSink(rows, TopicMap(), wants)  # type: ignore[arg-type]
    for key, broker in ((FETCH, "b:1"), (METADATA, "b:2"), (60, "b:3")):  # 60: DescribeCluster
        sink.request({"api_key": key, "broker_addr": broker, "topics": [], "topic_ids": []})
    assert wants.clusters == ["b:2", "b:3"] and wants.brokers == [] and len(rows.requests) == 3


def _ask_for_brokers_only(p: RunningProxy, sink, times: int, topic: str | None = None) -> int:
    """`times` clients each send one Metadata for no topic (or for `topic`) through `p`; once all are recorded (and
    the cluster's own `topics/` row), how many Metadata queries the proxy sent the broker itself."""
    host, port = p.bootstrap.rsplit(":", 1)
    topics = [] if topic is None else [{"name": topic, "topic_id": ZERO}]
    for _ in range(times):
        with WireClient(host, int(port)) as c:
            c.call(METADATA, 12, {"topics": topics, "allow_auto_topic_creation": False,
                                  "include_topic_authorized_operations": False})
    sink.wait_for(lambda s: any(t["topic_id"] is None for t in s.topics))
    sink.wait_for(lambda s: len([r for r in s.requests if r["api_key"] == METADATA]) == times)
    return p.call(lambda: p.server.resolver.queries)


def test_a_relayed_metadata_answer_records_its_broker_cluster_id(proxied_kafka, sink):
    """A client asking for brokers only names no topic, yet the recording must name the cluster it saw:
    the broker's id is learned once and recorded in a `topics/` row of its own (no topic id, no name).
    The relayed answers carry it, so the proxy asks the broker nothing (SASL listeners refuse its query)."""
    with RunningProxy([proxied_kafka.route], sink=sink) as p:
        queries = _ask_for_brokers_only(p, sink, 3)
    own = [(t["broker_addr"], t["cluster_id"], t["name"]) for t in sink.topics if t["topic_id"] is None]
    assert own == [(proxied_kafka.upstream, proxied_kafka.kafka.cluster_id, None)]
    assert queries == 0  # the first relayed answer named the cluster: no query of our own


def test_an_answer_without_a_cluster_id_still_asks_the_broker_once(proxied_kafka, sink):
    """The fallback: a Metadata answer that carries no cluster id (here one the proxy made itself, a Kafka fault
    answering in the broker's place) leaves the broker's id unknown, so the proxy asks the broker, once. (The
    request names a topic: an answer for no topic would have no field for the error, and goes to the broker.)"""
    from proxy.kafka_faults import FaultRules, KafkaFaultLayer

    layer = KafkaFaultLayer(FaultRules.from_specs(["error=Metadata:UNKNOWN_SERVER_ERROR"]))
    with RunningProxy([proxied_kafka.route], sink=sink, interceptors=[layer]) as p:
        queries = _ask_for_brokers_only(p, sink, 2, topic="no-such-topic")
    assert all(r["edit"] for r in sink.requests if r["api_key"] == METADATA)  # neither answer came from the broker
    own = [(t["broker_addr"], t["cluster_id"]) for t in sink.topics if t["topic_id"] is None]
    assert own == [(proxied_kafka.upstream, proxied_kafka.kafka.cluster_id)] and queries == 1


def _create_directly(kafka, topic: str) -> None:
    """Create the topic on the broker itself: no proxy is listening yet, and none may see its name go by."""
    with WireClient("127.0.0.1", kafka.kafka.port) as c:
        c.call(CREATE_TOPICS, 7, {"topics": [{"name": topic, "num_partitions": 1, "replication_factor": 1,
                                              "assignments": [], "configs": []}],
                                  "timeout_ms": 10000, "validate_only": False})
    kafka.kafka.wait_for_topic(topic, 1)


def _topic_id(kafka, topic: str) -> str:
    """The id straight from the broker (not through the proxy)."""
    _create_directly(kafka, topic)
    with WireClient("127.0.0.1", kafka.kafka.port) as c:
        topics = c.call(METADATA, 12, {"topics": [{"name": topic, "topic_id": ZERO}],
                                       "allow_auto_topic_creation": False,
                                       "include_topic_authorized_operations": False})["topics"]
    return str(topics[0]["topic_id"])


def _fetch_body(topic_id: str) -> dict:
    return {"max_wait_ms": 10, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0,
            "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic_id": topic_id, "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]}


def _fetch_by_id(bootstrap: str, topic_id: str) -> None:
    host, port = bootstrap.rsplit(":", 1)
    with WireClient(host, int(port)) as c:
        c.call(FETCH, 15, _fetch_body(topic_id))


def test_id_used_before_any_metadata_passed_through_the_proxy(proxied_kafka, topic_name, sink):
    """A client that learned the id elsewhere (it started before the proxy): the proxy asks the broker itself."""
    tid = _topic_id(proxied_kafka, topic_name)
    with RunningProxy([proxied_kafka.route], sink=sink) as p:
        _fetch_by_id(p.bootstrap, tid)
        sink.wait_for(lambda s: tid in s.topic_names())  # the proxy's own Metadata answer named it
        _fetch_by_id(p.bootstrap, tid)
        sink.wait_for(lambda s: len([r for r in s.requests if r["api_key"] == FETCH]) == 2)
    first, second = [r for r in sink.requests if r["api_key"] == FETCH]
    assert set(first) == set(REQUEST_KEYS)
    assert first["topic_ids"] == second["topic_ids"] == [tid]
    assert second["topics"] == [topic_name]  # named by the proxy as it recorded
    # the first row may have left before the answer: late resolution names it from the learned pairs
    assert [sink.topic_names().get(t, t) for t in first["topics"]] == [topic_name]
    pair = next(t for t in sink.topics if t["topic_id"] == tid)
    assert pair["name"] == topic_name and pair["broker_addr"] == proxied_kafka.upstream and pair["first_seen_ns"] > 0


def test_a_delete_by_id_is_recorded_under_the_topics_name(proxied_kafka, topic_name, sink):
    """Admin.deleteTopics by id: the request's name is null, so the row named no topic and "who deleted
    topic X" found nothing. The row names it by the id, and the broker's answer (name and id) names the id."""
    tid = _topic_id(proxied_kafka, topic_name)
    with RunningProxy([proxied_kafka.route], sink=sink, resolve_topics=False) as p:  # the answer alone names it
        host, port = p.bootstrap.rsplit(":", 1)
        with WireClient(host, int(port)) as c:
            answer = c.call(DELETE_TOPICS, 6, {"topics": [{"name": None, "topic_id": tid}], "timeout_ms": 30000})
        sink.wait_for(lambda s: any(r["api_key"] == DELETE_TOPICS for r in s.requests))
    assert answer["responses"][0]["error_code"] == 0 and answer["responses"][0]["name"] == topic_name
    (row,) = [r for r in sink.requests if r["api_key"] == DELETE_TOPICS]
    assert row["topics"] == [topic_name] and row["topic_ids"] == [tid]


@pytest.mark.parametrize("resolve", [True, False], ids=["resolve", "no-resolve-topics"])
def test_name_learned_before_the_id_is_used(proxied_kafka, topic_name, sink, resolve):
    """The usual order: Metadata naming the topic passes first, the Fetch by id afterwards is recorded by name.

    The relayed answer itself pairs the name with the id, so the proxy asks the broker nothing, and learns it with
    `--no-resolve-topics` too (which turns the proxy's own queries off, not what the clients' answers say)."""
    tid = _topic_id(proxied_kafka, topic_name)
    with RunningProxy([proxied_kafka.route], sink=sink, resolve_topics=resolve) as p:
        host, port = p.bootstrap.rsplit(":", 1)
        with WireClient(host, int(port)) as c:
            c.call(METADATA, 12, {"topics": [{"name": topic_name, "topic_id": ZERO}],
                                  "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
            c.call(FETCH, 15, _fetch_body(tid))  # the same connection, right after the answer
        _fetch_by_id(p.bootstrap, tid)  # another connection
        sink.wait_for(lambda s: len([r for r in s.requests if r["api_key"] == FETCH]) == 2)
        queries = p.call(lambda: p.server.resolver.queries + p.server.resolver.failures)
    assert queries == 0
    for fetch in (r for r in sink.requests if r["api_key"] == FETCH):
        assert fetch["topics"] == [topic_name] and fetch["topic_ids"] == [tid]
    assert [(t["name"], t["broker_addr"], t["cluster_id"]) for t in sink.topics if t["topic_id"] == tid] == \
        [(topic_name, proxied_kafka.upstream, proxied_kafka.kafka.cluster_id)]


def _sasl_config(path: Path, rec_broker) -> Path:
    """The Java clients' SASL settings, as a file: a JAAS line does not survive the tools' key=value flags."""
    path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f'username="{rec_broker.sasl_user}" password="{rec_broker.sasl_password}";\n')
    return path


def _with_config(tool: JavaTool, config: Path) -> JavaTool:
    return JavaTool([*tool.argv, "--command-config", str(config)], tool.timeout_s)


def test_sasl_listener_rows_name_the_topics_modern_java_clients_send_by_id(rec_broker, topic_name, sink, tmp_path):
    """A SASL listener refuses the proxy's own Metadata query before authentication, so names must come from the
    answers the clients get: Kafka's own 4.x tools create the topic (CreateTopics v7+ pairs its name with its id),
    produce (Produce v13: the topic by id) and consume (Fetch v13+: by id) through the proxy, and every row names
    the topic as it is recorded, with no query of the proxy's own."""
    config = _sasl_config(tmp_path / "client.properties", rec_broker)
    with RunningProxy([rec_broker.sasl_route], sink=sink) as p:
        j = JavaClients(p.bootstrap)
        for tool in (j.topics("--create", "--topic", topic_name, "--partitions", "2", "--replication-factor", "1"),
                     j.producer_perf(topic_name, 50, props={"client.id": "sasl-prod", "acks": "all"}),
                     j.console_consumer(topic_name, group=f"g-{topic_name}", max_messages=50,
                                        props={"client.id": "sasl-cons"})):
            j.run(_with_config(tool, config)).check()
    by_id = [r for r in sink.requests if r["topic_ids"]]
    produce = [r for r in by_id if r["api_name"] == "Produce"]
    fetch = [r for r in by_id if r["api_name"] == "Fetch"]
    print("requests naming topics by id:", sorted({(r["api_name"], r["api_version"]) for r in by_id}))
    assert produce and all(r["api_version"] >= 13 for r in produce), {r["api_version"] for r in produce}
    assert fetch and all(r["api_version"] >= 13 for r in fetch)
    assert {t for r in by_id for t in r["topics"]} == {topic_name}, [(r["api_name"], r["topics"]) for r in by_id]
    tid = produce[0]["topic_ids"][0]
    assert [(t["name"], t["broker_addr"], t["cluster_id"]) for t in sink.topics if t["topic_id"] == tid] == \
        [(topic_name, rec_broker.sasl_upstream, rec_broker.kafka.cluster_id)]
    resolver = p.server.resolver  # stopped: its last queries (shutdown asks for ids still unnamed) are counted
    assert (resolver.queries, resolver.failures) == (0, 0)  # not asked (so not refused): the answers named everything
    assert rec_broker.sasl_password not in str(sink.requests + sink.topics + sink.connections)


def test_no_resolve_topics_keeps_ids_and_asks_nothing(proxied_kafka, topic_name, sink):
    tid = _topic_id(proxied_kafka, topic_name)
    with RunningProxy([proxied_kafka.route], sink=sink, resolve_topics=False) as p:
        _fetch_by_id(p.bootstrap, tid)
        sink.wait_for(lambda s: any(r["api_key"] == FETCH for r in s.requests))
        queries = p.call(lambda: p.server.resolver.queries)
    assert queries == 0 and sink.topics == []
    fetch = next(r for r in sink.requests if r["api_key"] == FETCH)
    assert fetch["topics"] == [tid] == fetch["topic_ids"]


def test_resolver_failure_costs_nothing() -> None:
    """A broker that is not there: the query fails, is counted, and the row keeps its id."""
    import asyncio

    from proxy.topics import TopicResolver

    async def main() -> tuple[int, int]:
        from harness.kafka import free_port
        m = TopicMap(1)
        r = TopicResolver(asyncio.get_running_loop(), m, timeout_s=1.0)
        r.want(f"127.0.0.1:{free_port()}")
        await r.idle()
        return r.failures, len(m)

    assert asyncio.run(main()) == (1, 0)


def test_a_listener_that_hangs_up_on_the_query_is_named_as_wanting_sasl_first() -> None:
    """A SASL (or TLS) listener answers the proxy's plain Metadata query by closing the connection. The one
    warning per broker said "IncompleteReadError: 0 bytes read…"; it now says what that likely means."""
    import asyncio

    from structlog.testing import capture_logs

    from proxy.topics import TopicResolver

    async def main() -> list[dict]:
        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1)  # the request has arrived
            writer.close()

        server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        r = TopicResolver(asyncio.get_running_loop(), TopicMap(1), timeout_s=5.0)
        with capture_logs() as logs:
            r.want(f"127.0.0.1:{port}")
            await r.idle()
        server.close()
        return logs

    warnings = [e for e in asyncio.run(main()) if e["log_level"] == "warning"]
    assert len(warnings) == 1 and "IncompleteReadError" in warnings[0]["error"]
    assert "wants SASL (or TLS) first" in warnings[0]["hint"]


def test_cli_has_the_off_switch() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "kafkatap.cli", "proxy", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--no-resolve-topics" in out.stdout


def test_wants_spaced_out_still_ask_a_broker_at_most_once_per_interval_and_less_while_fruitless() -> None:
    """One row every 10 ms naming an id no broker knows (a consumer committing to a deleted topic): each want
    came after the last query had ended, and each started a full-cluster Metadata query of its own."""
    import asyncio

    from proxy.topics import TopicResolver

    async def main() -> int:
        accepted = 0

        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal accepted
            accepted += 1
            await reader.read(1)
            writer.close()

        server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        broker = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        r = TopicResolver(asyncio.get_running_loop(), TopicMap(1), timeout_s=1.0, min_interval_s=0.1)
        for _ in range(100):  # pacing the rows, 1 s in all
            r.want(broker)
            await asyncio.sleep(0.01)
        r.close()
        server.close()
        return accepted

    queries = asyncio.run(main())
    assert 1 <= queries <= 5, queries  # 0, 0.1, 0.3, 0.7 s: each fruitless query doubles the interval
