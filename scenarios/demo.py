"""The demo: a short mixed workload through kafkatap, with two incidents hidden in it.

A few producers and consumers (kafka-python, confluent-kafka, kcat, and
Apache Kafka's own Java producer and KIP-848 consumer) on a
broker with a 20 kB message.max.bytes; one producer sends oversize batches
with acks=0 (the broker hangs up on it), and one sends rarely, behind a
middlebox that resets connections idle for 4 s. The report must name both
and list every client. Kept under a minute of traffic so the whole demo,
Spark included, stays under three minutes after set-up.
"""

from scenarios.clients import java_group_role
from scenarios.spec import Broker, ClientSpec, Expect, Faults, Proxy, Scenario


def _java_named(found: list[dict], report: object) -> str | None:
    """The Java clients name topics by id on the wire; the inventory must still show them by name."""
    by_id = {r["client_id"]: r for r in report.table("client_inventory")}  # type: ignore[attr-defined]
    group_role = java_group_role(by_id.get("orders-848", {}).get("software_version"))  # classic on Kafka 3.x
    for cid, role, key, topic in (("ledger-java", "producer", "topics_produced", "payments"),
                                  ("orders-848", group_role, "topics_consumed", "orders")):
        r = by_id.get(cid)
        if r is None or role not in (r.get("role") or "") or topic not in (r.get(key) or []):
            return f"{cid}: expected role {role!r} on topic {topic!r}, got {r and (r.get('role'), r.get(key))}"
    return None


SCENARIO = Scenario(
    name="demo",
    story="a few producers/consumers, one oversize acks=0 producer, one idle reset",
    broker=Broker(props={"message.max.bytes": 20_000}, topics={"orders": 2, "payments": 1, "telemetry": 1}),
    proxies=[
        Proxy("kafkatap"),  # the recording proxy in front of the broker
        Proxy("firewall", upstream="kafkatap", record=False, faults=Faults(idle_reset_s=4.0)),
    ],
    clients=[
        ClientSpec("orders-svc", topics=["orders"], rate=25, duration_s=14),
        ClientSpec("payments-svc", kind="confluent", topics=["payments"], rate=10, duration_s=14),
        ClientSpec("billing", role="consumer", topics=["orders"], group="billing", duration_s=15),
        ClientSpec("payments-audit", kind="kcat", role="consumer", topics=["payments"], group="audit", duration_s=15),
        ClientSpec("telemetry-agent", client_id="producer-1", topics=["telemetry"], acks=0, size=60_000, count=2,
                   interval_s=3, duration_s=8, config={"max_request_size": 1_000_000, "retries": 0}),
        ClientSpec("nightly-report", topics=["orders"], interval_s=6, count=3, duration_s=15),
        ClientSpec("ledger-java", kind="java", topics=["payments"], rate=5, duration_s=14),
        ClientSpec("orders-848", kind="java", role="consumer", topics=["orders"], group="orders-848", duration_s=15),
    ],
    expect=[
        Expect("broker_closed_after_acks0_produce", why="the oversize acks=0 producer"),
        Expect("idle_resets_not_from_broker", why="the producer idle behind the firewall"),
        Expect("client_inventory", _java_named, why="the Java producer and the KIP-848 consumer, with topic names"),
    ],
    traffic_s=16,
)
