"""The raw wire client (`harness.wire`) against the real broker, and its refusals of answers that are not answers."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest

from harness.kafka import LocalKafka, brokers_registered, free_port, partition_states
from harness.wire import AsyncWireClient, WireClient, WireError
from protocol.apis import API_VERSIONS, CREATE_TOPICS, METADATA
from protocol.errors import TOPIC_ALREADY_EXISTS
from protocol.frames import parse_request, response_correlation_id


def _create(name: str, partitions: int) -> dict:
    return {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [],
                        "configs": []}], "timeout_ms": 10000, "validate_only": False}


def test_blocking_client_talks_to_the_broker(kafka_broker: LocalKafka, topic_name: str) -> None:
    host, port = kafka_broker.host, kafka_broker.port
    assert brokers_registered(host, port) == 1
    with WireClient(host, port, client_id="wire-test") as client:
        versions = client.exchange(API_VERSIONS, 3, {"client_software_name": "kafkatap", "client_software_version": "1"})
        sent = parse_request(versions.request)
        assert (sent.api_key, sent.api_version, sent.correlation_id, sent.client_id) == (18, 3, 1, "wire-test")
        assert response_correlation_id(versions.response) == 1
        keys = {k["api_key"]: k["max_version"] for k in versions.body["api_keys"]}
        assert keys[METADATA] >= 12 and keys[CREATE_TOPICS] >= 7
        created = client.call(CREATE_TOPICS, 7, _create(topic_name, 2))
        assert [(t["name"], t["error_code"]) for t in created["topics"]] == [(topic_name, 0)]
        again = client.exchange(CREATE_TOPICS, 7, _create(topic_name, 2))
        assert parse_request(again.request).correlation_id == 3
        assert again.body["topics"][0]["error_code"] == TOPIC_ALREADY_EXISTS
    kafka_broker.wait_for_topic(topic_name, 2)  # polls partition_states until both partitions are led
    code, parts = partition_states(host, port, topic_name)
    assert code == 0 and parts == [(1, 1), (1, 1)]  # node 1 leads both, ISR of one


def test_async_client_talks_to_the_broker(kafka_broker: LocalKafka) -> None:
    async def ask() -> tuple[list[dict], int]:
        client = await AsyncWireClient.connect(kafka_broker.host, kafka_broker.port, client_id="wire-async")
        try:
            md = await client.call(METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                                  "include_topic_authorized_operations": False})
            ex = await client.exchange(METADATA, 1, {"topics": []})
            return md["brokers"], response_correlation_id(ex.response)
        finally:
            client.close()

    brokers, second = asyncio.run(ask())
    assert [(b["node_id"], b["host"], b["port"]) for b in brokers] == [(1, kafka_broker.host, kafka_broker.port)]
    assert second == 2


def test_no_broker_is_an_os_error() -> None:
    with pytest.raises(OSError):
        brokers_registered("127.0.0.1", free_port(), timeout=2.0)


@pytest.fixture
def fake_broker() -> Iterator[Callable[[Callable[[int], bytes]], int]]:
    """One-shot loopback server: reads one request frame, answers with what `reply(correlation_id)` returns."""
    threads: list[threading.Thread] = []
    servers: list[socket.socket] = []

    def start(reply: Callable[[int], bytes]) -> int:
        srv = socket.create_server(("127.0.0.1", 0))
        servers.append(srv)

        def serve() -> None:
            conn, _ = srv.accept()
            with conn:
                head = conn.recv(4, socket.MSG_WAITALL)
                frame = head + conn.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)
                conn.sendall(reply(parse_request(frame).correlation_id))

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        threads.append(t)
        return srv.getsockname()[1]

    yield start
    for srv in servers:
        srv.close()
    for t in threads:
        t.join(5)


def test_answers_that_are_not_the_answer_are_refused(fake_broker: Callable[[Callable[[int], bytes]], int]) -> None:
    wrong_id = fake_broker(lambda cid: struct.pack(">ii", 4, cid + 1))
    with WireClient("127.0.0.1", wrong_id) as client, pytest.raises(WireError, match="correlation id 2, expected 1"):
        client.exchange(METADATA, 1, {"topics": None})
    negative = fake_broker(lambda cid: struct.pack(">i", -7))
    with WireClient("127.0.0.1", negative) as client, pytest.raises(WireError, match="size -7"):
        client.call(METADATA, 1, {"topics": None})
    closes = fake_broker(lambda cid: struct.pack(">ii", 8, cid))  # announces 8 bytes, sends 4, hangs up
    with WireClient("127.0.0.1", closes) as client, pytest.raises(ConnectionError, match="closed"):
        client.call(METADATA, 1, {"topics": None})
