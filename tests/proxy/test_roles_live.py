"""`kafkatap top` / `/clients` name the newer group protocols' members (issue 14): pure, no sockets."""

from __future__ import annotations

from proxy.live import by_client, client_roles, render
from proxy.metrics import LiveStats


def _row(conn: str, api_key: int, api_name: str, client: str, topics: list[str] | None = None) -> dict:
    return {"proxy_id": "p1", "conn_id": conn, "api_key": api_key, "api_name": api_name, "api_version": 1,
            "client_id": client, "client_addr": "10.0.0.9:1", "broker_addr": "10.0.0.1:9092", "status": "answered",
            "request_bytes": 100, "response_bytes": 100, "latency_us": 100, "broker_latency_us": 90,
            "topics": topics or [], "errors": []}


def test_new_group_protocol_members_are_named_live() -> None:
    stats = LiveStats("p1")
    stats.request(_row("c1", 68, "ConsumerGroupHeartbeat", "k848"))
    stats.request(_row("c1", 1, "Fetch", "k848", ["orders"]))
    stats.request(_row("c2", 76, "ShareGroupHeartbeat", "share"))
    stats.request(_row("c2", 78, "ShareFetch", "share", ["orders"]))
    stats.request(_row("c3", 88, "StreamsGroupHeartbeat", "streams"))
    stats.request(_row("c4", 11, "JoinGroup", "classic"))
    doc = stats.clients_json()
    roles = {c["client_id"]: c["roles"] for c in doc["clients"]}
    assert roles == {"k848": ["consumer", "kip848-consumer"], "share": ["share-consumer"],
                     "streams": ["streams-member"], "classic": ["group-member"]}
    screen = render(doc, {}, None, 0.0, 200, 40, color=False)
    assert "consumer+kip848-consumer" in screen and "share-consumer" in screen and "streams-member" in screen


def test_a_brokers_own_connections_are_named_broker_and_only_alone() -> None:
    """The brokers also talking through the listener: their connections read "broker", a client's never do."""
    stats = LiveStats("p1")
    stats.request(_row("m1", 27, "WriteTxnMarkers", "broker-1-txn-marker-sender"))  # the coordinator's markers
    stats.request(_row("v1", 18, "ApiVersions", "broker-2-verifier"))
    stats.request({**_row("v1", 24, "AddPartitionsToTxn", "broker-2-verifier"), "api_version": 5})  # a leader verifies
    stats.request(_row("f1", 1, "Fetch", "broker-3-fetcher-0", ["orders"]))  # a follower replicates
    stats.request(_row("f1", 23, "OffsetForLeaderEpoch", "broker-3-fetcher-0"))
    stats.request(_row("s1", 84, "ReadShareGroupState", "persister"))  # the share coordinator's state
    stats.request({**_row("t1", 24, "AddPartitionsToTxn", "txn-producer"), "api_version": 3})  # a client's form
    stats.request(_row("a1", 61, "DescribeProducers", "admin-abort"))  # kafka-transactions abort (KIP-664)
    stats.request(_row("a1", 27, "WriteTxnMarkers", "admin-abort"))
    stats.request(_row("c1", 1, "Fetch", "broker-fetcher-app", ["orders"]))  # a consumer named like one, almost
    stats.request(_row("b1", 3, "Metadata", "abort-by-id"))  # `kafka-transactions abort --producer-id …`: its
    stats.request(_row("b1", 27, "WriteTxnMarkers", "abort-by-id"))  # markers beside Metadata on one connection…
    stats.request(_row("b2", 3, "Metadata", "abort-split"))  # …or on a connection of their own
    stats.request({**_row("b3", 27, "WriteTxnMarkers", "abort-split"), "client_addr": "10.0.0.9:2"})
    doc = stats.clients_json()
    roles = {c["client_id"]: c["role"] for c in doc["clients"] if c["conn_id"] != "b3"}
    assert roles == {"broker-1-txn-marker-sender": "broker", "broker-2-verifier": "broker", "broker-3-fetcher-0": "broker",
                     "persister": "broker", "txn-producer": "producer", "admin-abort": "admin",
                     "broker-fetcher-app": "consumer", "abort-by-id": "other", "abort-split": "other"}
    by = {g["client_id"]: client_roles(g["roles"]) for g in by_client(doc["clients"], {})}
    assert by["abort-split"] == "other" and by["abort-by-id"] == "other" and by["persister"] == "broker"


def test_top_names_the_clients_a_kafka_4_broker_would_refuse() -> None:
    """A connection's row naming request versions Kafka 4.0 removed (KIP-896) reaches /clients, and `top` says which
    clients sent them in a line above the table; a snapshot naming fewer (an older one) does not undo it."""
    stats = LiveStats("p1")
    stats.request(_row("c1", 0, "Produce", "legacy-app", ["orders"]))
    stats.request(_row("c2", 0, "Produce", "current-app", ["orders"]))
    base = {"proxy_id": "p1", "client_addr": "10.0.0.9:1", "broker_addr": "10.0.0.1:9092", "final": False}
    stats.connection({**base, "conn_id": "c1", "removed_in_kafka_4": ["Produce v2", "Fetch v3"]})
    stats.connection({**base, "conn_id": "c1", "removed_in_kafka_4": ["Produce v2"]})
    stats.connection({**base, "conn_id": "c2", "removed_in_kafka_4": None})
    doc = stats.clients_json()
    assert {c["client_id"]: c["removed_in_kafka_4"] for c in doc["clients"]} == {
        "legacy-app": ["Produce v2", "Fetch v3"], "current-app": []}
    stats.request(_row("f1", 1, "Fetch", "broker-2-fetcher-0", ["orders"]))  # a follower at an old protocol: not named
    stats.connection({**base, "conn_id": "f1", "removed_in_kafka_4": ["Fetch v3"]})
    doc = stats.clients_json()
    lines = render(doc, {}, None, 0.0, 200, 40, color=False).splitlines()
    assert lines[2] == ("legacy-app (Fetch v3, Produce v2): request versions Kafka 4.0 removed (KIP-896), which a 4.x "
                        "broker refuses")
    assert render(doc, {}, None, 0.0, 80, 40, color=False).splitlines()[2].startswith("legacy-app (Fetch v3, Produce v2): ")
    quiet = LiveStats("p1")
    quiet.request(_row("c2", 0, "Produce", "current-app", ["orders"]))
    assert "Kafka 4.0" not in render(quiet.clients_json(), {}, None, 0.0, 200, 40, color=False)
