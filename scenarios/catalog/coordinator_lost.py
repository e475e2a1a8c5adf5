"""Issue 17: the group coordinator goes away — NOT_COORDINATOR on heartbeats and offset commits, per client library.

A coordinator moves when the broker leading its `__consumer_offsets`
partition changes; until members find the new one, the old one answers
Heartbeat and OffsetCommit with NOT_COORDINATOR. Here kafkatap answers every
4th Heartbeat and every 3rd OffsetCommit of each consumer that way (after the
groups have formed), and the report compares what Apache Kafka's Java client
(classic group protocol, for a like-for-like comparison), librdkafka and
kafka-python did next: FindCoordinator lookups, rebalances, reconnects, and
how long until their next successful heartbeat or commit.

Expected: one `kafka_fault_reactions` finding for Heartbeat and one for
OffsetCommit, each naming the three libraries (one client each, every library
named), every episode of which recovered (`scenarios.fault_reactions`).
"""

from scenarios.catalog.leader_moves import LIBRARIES
from scenarios.fault_reactions import all_libraries_recovered
from scenarios.spec import Broker, ClientSpec, Expect, Proxy, Scenario

TOPIC = "events"


def _faults() -> list[str]:
    out = []
    for prefix in LIBRARIES:
        out.append(f"error=Heartbeat:NOT_COORDINATOR,client-id={prefix}-consumer,nth=4,after=4s")
        out.append(f"error=OffsetCommit:NOT_COORDINATOR,client-id={prefix}-consumer,nth=3,after=4s")
    return out


def _found_coordinator(libs: dict[str, dict]) -> str | None:
    return None if any(v.get("coordinator_lookups") for v in libs.values()) else "no FindCoordinator after NOT_COORDINATOR"


def _recovered(api: str):  # noqa: ANN201 — a scenarios.spec.Check
    return all_libraries_recovered(api, "NOT_COORDINATOR", (f"{p}-consumer" for p in LIBRARIES),
                                   extra=_found_coordinator)


SCENARIO = Scenario(
    name="coordinator-lost",
    story="NOT_COORDINATOR on Heartbeat and OffsetCommit (a coordinator that moves): Java, librdkafka and kafka-python compared",
    broker=Broker(topics={TOPIC: 1}),
    proxies=[Proxy("rec", kafka_faults=_faults())],
    clients=[
        ClientSpec("feeder", kind="kafka-python", topics=[TOPIC], rate=30, duration_s=18),
        ClientSpec("java-consumer", kind="java", role="consumer", topics=[TOPIC], group="java-group", duration_s=20,
                   config={"group.protocol": "classic", "heartbeat.interval.ms": 500, "auto.commit.interval.ms": 1000,
                           "enable.auto.commit": "true"}),
        ClientSpec("rdkafka-consumer", kind="confluent", role="consumer", topics=[TOPIC], group="rdkafka-group",
                   duration_s=20, config={"heartbeat.interval.ms": 500, "auto.commit.interval.ms": 1000}),
        ClientSpec("kp-consumer", kind="kafka-python", role="consumer", topics=[TOPIC], group="kp-group", duration_s=20,
                   config={"heartbeat_interval_ms": 500, "auto_commit_interval_ms": 1000}),
    ],
    expect=[
        Expect("kafka_fault_reactions", _recovered("Heartbeat"),
               why="every library meets NOT_COORDINATOR on Heartbeat, finds the coordinator again and heartbeats"),
        Expect("kafka_fault_reactions", _recovered("OffsetCommit"),
               why="every library meets NOT_COORDINATOR on OffsetCommit, finds the coordinator again and commits"),
    ],
    traffic_s=22,
)
