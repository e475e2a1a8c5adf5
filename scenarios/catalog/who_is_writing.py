"""Incident 3 (docs/incidents.md#incident-3): who is writing to me? A dozen clients; the inventory names them.

Producers and consumers with three client stacks (kafka-python,
confluent-kafka/librdkafka, kcat) on four topics; `clickstream` is far busier
than the rest. The inventory must rank it first and show every client's role,
topics and software.
"""

from scenarios.spec import Broker, ClientSpec, Expect, Proxy, Scenario

D = 14  # seconds of traffic


def _ranked(found: list[dict], report: object) -> str | None:
    rows = report.table("client_inventory")  # type: ignore[attr-defined]
    if len(rows) < 10:
        return f"inventory lists {len(rows)} clients, expected at least 10"
    if rows[0]["client_id"] != "clickstream":
        return f"busiest client is {rows[0]['client_id']}, expected clickstream"
    by_id = {r["client_id"]: r for r in rows}
    for cid, role, topic in (("orders-svc", "producer", "orders"), ("billing", "consumer", "orders"),
                             ("audit-shipper", "producer", "audit"), ("fraud", "consumer", None)):
        # fraud is librdkafka: Fetch v13+ names topics by id, so its topic may show as a UUID until
        # the analysis maps ids to names from Metadata responses; its role must still be right
        r = by_id.get(cid)
        if r is None:
            return f"{cid} missing from the inventory"
        if role not in (r.get("role") or ""):
            return f"{cid} has role {r.get('role')!r}, expected {role}"
        topics = (r.get("topics_produced") or []) + (r.get("topics_consumed") or [])
        if topic is not None and topic not in topics:
            return f"{cid} topics {topics}, expected {topic}"
    software = {str(r.get("software_name")) for r in rows}
    if not any("kafka-python" in s for s in software) or not any("librdkafka" in s for s in software):
        return f"client software seen: {sorted(software)}"
    return None


SCENARIO = Scenario(
    name="who-is-writing",
    story="a dozen producers/consumers (kafka-python, confluent-kafka, kcat); the inventory ranks them, busiest first",
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
    ],
    expect=[Expect("client_inventory", _ranked, why="the inventory ranks clickstream first with roles, topics, software")],
    traffic_s=D + 4,
)
