"""Incident 3 (docs/incidents.md#incident-3): who is writing to me? Fourteen clients; the inventory names them.

Producers and consumers with four client stacks (kafka-python,
confluent-kafka/librdkafka, kcat, and Apache Kafka's own Java clients: a
ProducerPerformance producer and a KIP-848 console consumer) on four topics;
`clickstream` is far busier than the rest. The inventory must rank it first and
show every client's role, topics (by name, also for the clients that name
topics by id on the wire: Java Produce v13, librdkafka Fetch v16) and software.
"""

from proxy.topics import is_topic_id
from scenarios.clients import java_group_role
from scenarios.spec import Broker, ClientSpec, Expect, Proxy, Scenario

D = 14  # seconds of traffic


def _ranked(found: list[dict], report: object) -> str | None:
    rows = report.table("client_inventory")  # type: ignore[attr-defined]
    if len(rows) < 12:
        return f"inventory lists {len(rows)} clients, expected at least 12"
    if rows[0]["client_id"] != "clickstream":
        return f"busiest client is {rows[0]['client_id']}, expected clickstream"
    by_id = {r["client_id"]: r for r in rows}
    group_role = java_group_role(by_id.get("orders-848", {}).get("software_version"))  # classic on Kafka 3.x
    for cid, role, topic in (("orders-svc", "producer", "orders"), ("billing", "consumer", "orders"),
                             ("audit-shipper", "producer", "audit"), ("fraud", "consumer", "payments"),
                             ("ledger-java", "producer", "payments"), ("orders-848", group_role, "orders")):
        # fraud (librdkafka Fetch v16), ledger-java (Produce v13) and orders-848 name topics by id on the
        # wire: the proxy and the analysis must still show the names
        r = by_id.get(cid)
        if r is None:
            return f"{cid} missing from the inventory"
        if role not in (r.get("role") or ""):
            return f"{cid} has role {r.get('role')!r}, expected {role}"
        topics = (r.get("topics_produced") or []) + (r.get("topics_consumed") or [])
        if topic is not None and topic not in topics:
            return f"{cid} topics {topics}, expected {topic}"
    software = {str(r.get("software_name")) for r in rows}
    if not all(any(name in s for s in software) for name in ("kafka-python", "librdkafka", "apache-kafka-java")):
        return f"client software seen: {sorted(software)}"
    uuids = [t["topic"] for t in report.table("topic_view") if is_topic_id(t.get("topic"))]  # type: ignore[attr-defined]
    if uuids:
        return f"topic view lists topic ids instead of names: {uuids}"
    return None


SCENARIO = Scenario(
    name="who-is-writing",
    story="14 producers/consumers (kafka-python, confluent-kafka, kcat, Java incl. a KIP-848 consumer); "
          "the inventory ranks them, busiest first, naming every topic",
    broker=Broker(topics={"orders": 3, "payments": 1, "clicks": 3, "audit": 1}),
    proxies=[Proxy("rec")],
    clients=[
        ClientSpec("clickstream", kind="confluent", topics=["clicks"], rate=1500, size=300, linger_ms=1, duration_s=D),
        ClientSpec("orders-svc", topics=["orders"], rate=15, duration_s=D),
        ClientSpec("orders-backfill", topics=["orders"], rate=4, acks=-1, duration_s=D),
        ClientSpec("payments-svc", kind="confluent", topics=["payments"], rate=8, duration_s=D),
        ClientSpec("audit-shipper", kind="kcat", topics=["audit"], rate=5, duration_s=D),
        ClientSpec("billing", role="consumer", topics=["orders", "payments"], group="billing", duration_s=D),
        ClientSpec("fraud", kind="confluent", role="consumer", topics=["payments"], group="fraud", duration_s=D),
        ClientSpec("clicks-etl", kind="confluent", role="consumer", topics=["clicks"], group="etl", duration_s=D),
        ClientSpec("dashboard", role="consumer", topics=["clicks"], group="dashboard", duration_s=D),
        ClientSpec("audit-archiver", kind="kcat", role="consumer", topics=["audit"], group="archiver", duration_s=D),
        ClientSpec("orders-tail", kind="kcat", role="consumer", topics=["orders"], duration_s=D, start_after_s=4),
        ClientSpec("search-indexer", role="consumer", topics=["orders", "clicks"], group="search", duration_s=D),
        ClientSpec("ledger-java", kind="java", topics=["payments"], rate=10, acks=-1, duration_s=D,
                   # gzip, not zstd: kafka-python (billing reads payments) has no zstd codec here
                   config={"compression.type": "gzip", "enable.idempotence": "true"}),
        ClientSpec("orders-848", kind="java", role="consumer", topics=["orders"], group="orders-848", duration_s=D),
    ],
    expect=[Expect("client_inventory", _ranked, why="the inventory ranks clickstream first with roles, topics, software")],
    traffic_s=D + 4,
)
