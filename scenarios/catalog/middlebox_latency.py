"""Two-point latency: how much does the middlebox between two kafkatap proxies add?

client → kafkatap A → middlebox (fault injector: +4 ms fixed, +0–2 ms jitter on
the request path, i.e. 5 ms ± 1 ms) → kafkatap B → broker. Comparing A's and
B's recordings of the same requests must report ≈5 ms added, within 10 %.
"""

from scenarios.spec import Broker, ClientSpec, DirectionFaults, Expect, Faults, Proxy, Scenario

ADDED_MS = 5.0


def _within_10pct(found: list[dict], report: object) -> str | None:
    apis = found[0].get("evidence", {}).get("apis", {})
    produce = apis.get("Produce")
    if not produce or not produce.get("matched"):
        return f"no matched Produce requests (apis: {sorted(apis)})"
    got = (produce.get("diff_p50_us") or 0) / 1000
    if abs(got - ADDED_MS) > ADDED_MS * 0.10:
        return f"Produce p50 added latency {got:.2f} ms, expected {ADDED_MS:g} ms ± 10 %"
    return None


SCENARIO = Scenario(
    name="middlebox-latency",
    story=f"client → kafkatap A → middlebox (+{ADDED_MS:g} ± 1 ms) → kafkatap B → broker; compare A with B",
    broker=Broker(topics={"quotes": 1}),
    proxies=[
        Proxy("A", upstream="middlebox"),
        Proxy("middlebox", upstream="B", record=False,
              faults=Faults(to_broker=DirectionFaults(latency_ms=ADDED_MS - 1, jitter_ms=2.0), seed=7)),
        Proxy("B"),
    ],
    compare=("A", "B"),
    clients=[
        ClientSpec("quote-feed", topics=["quotes"], rate=40, linger_ms=0, duration_s=10),
        ClientSpec("quote-reader", kind="confluent", role="consumer", topics=["quotes"], group="readers", duration_s=10),
    ],
    expect=[Expect("compare_added_latency", _within_10pct, why=f"A − B ≈ {ADDED_MS:g} ms on Produce")],
    traffic_s=11,
)
