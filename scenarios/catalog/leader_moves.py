"""Issue 17: a partition leader that moves — NOT_LEADER_OR_FOLLOWER on Produce and Fetch, and how each client library reacts.

When a partition's leadership moves (a broker restart, a preferred-leader
election, a reassignment), the old leader answers Produce and Fetch for it
with NOT_LEADER_OR_FOLLOWER until the client has refreshed its metadata and
gone to the new leader. Here kafkatap plays that broker: the recording proxy
answers every 20th Produce and every 8th Fetch of each client on `orders`
in the broker's place (the broker never sees those requests, so a retry cannot
duplicate), and the report compares what Apache Kafka's Java client,
librdkafka (confluent-kafka) and kafka-python did next: how long until their
next successful request, how many retries and metadata refreshes, whether they
reconnected.

Expected: one `kafka_fault_reactions` finding for Produce and one for Fetch,
each naming the three libraries (one client each, every library named), every
episode of which recovered (`scenarios.fault_reactions`).
"""

from scenarios.fault_reactions import all_libraries_recovered
from scenarios.spec import Broker, ClientSpec, Expect, Proxy, Scenario

LIBRARIES = {"java": "java", "rdkafka": "confluent", "kp": "kafka-python"}
TOPIC = "orders"


def _faults() -> list[str]:
    out = []
    for prefix in LIBRARIES:  # one rule per library, so each gets its share of faults whatever the others do
        out.append(f"error=Produce:NOT_LEADER_OR_FOLLOWER,topic={TOPIC},client-id={prefix}-producer,nth=20")
        out.append(f"error=Fetch:NOT_LEADER_OR_FOLLOWER,topic={TOPIC},client-id={prefix}-consumer,nth=8,after=3s")
    return out


def _recovered(api: str, role: str):  # noqa: ANN201 — a scenarios.spec.Check
    return all_libraries_recovered(api, "NOT_LEADER_OR_FOLLOWER", (f"{p}-{role}" for p in LIBRARIES))


SCENARIO = Scenario(
    name="leader-moves",
    story="NOT_LEADER_OR_FOLLOWER on Produce and Fetch (a leader that moves): Java, librdkafka and kafka-python compared",
    broker=Broker(topics={TOPIC: 1}),
    proxies=[Proxy("rec", kafka_faults=_faults())],
    clients=[
        ClientSpec("java-producer", kind="java", topics=[TOPIC], rate=20, duration_s=16),
        ClientSpec("rdkafka-producer", kind="confluent", topics=[TOPIC], rate=20, duration_s=16),
        ClientSpec("kp-producer", kind="kafka-python", topics=[TOPIC], rate=20, duration_s=16),
        ClientSpec("java-consumer", kind="java", role="consumer", topics=[TOPIC], group="java-readers", duration_s=20,
                   config={"group.protocol": "classic"}),
        ClientSpec("rdkafka-consumer", kind="confluent", role="consumer", topics=[TOPIC], group="rdkafka-readers",
                   duration_s=20, config={"fetch.wait.max.ms": 200}),
        ClientSpec("kp-consumer", kind="kafka-python", role="consumer", topics=[TOPIC], group="kp-readers",
                   duration_s=20, config={"fetch_max_wait_ms": 200}),
    ],
    expect=[
        Expect("kafka_fault_reactions", _recovered("Produce", "producer"),
               why="every library meets NOT_LEADER_OR_FOLLOWER on Produce and produces again"),
        Expect("kafka_fault_reactions", _recovered("Fetch", "consumer"),
               why="every library meets NOT_LEADER_OR_FOLLOWER on Fetch and fetches again"),
    ],
    traffic_s=22,
)
