"""Two-point latency (docs/incidents.md#middlebox-latency): how much does the middlebox between two kafkatap proxies add?

client → kafkatap A → middlebox (the fault injector: +18 ms fixed, +0–4 ms
jitter on the request path, i.e. 20 ms ± 2 ms, like a WAN hop or an
inspecting firewall) → kafkatap B → broker. Comparing A's and B's recordings
of the same requests (`analyze --compare A B`) must report the added delay
within 10 %.

Why 20 ms and not 5: A − B is everything between the two proxies — the
injected delay plus two extra loopback hops and the middlebox's own relay.
On a busy 2-core CI machine those cost 0.5–1 ms, which is 10–20 % of 5 ms but
under 5 % of 20 ms; the scenario tests kafkatap's comparison, not the
machine's scheduler. The middlebox records too, so a failure message shows
how long it really held the requests.
"""

import statistics

from scenarios.spec import Broker, ClientSpec, DirectionFaults, Expect, Faults, Proxy, Scenario

ADDED_MS = 20.0
JITTER_MS = 4.0  # uniform 0..4 ms on top of ADDED_MS - JITTER_MS / 2


def _within_10pct(found: list[dict], report: object) -> str | None:
    apis = found[0].get("evidence", {}).get("apis", {})
    produce = apis.get("Produce")
    if not produce or not produce.get("matched"):
        return f"no matched Produce requests (apis: {sorted(apis)})"
    got = (produce.get("diff_p50_us") or 0) / 1000
    if abs(got - ADDED_MS) > ADDED_MS * 0.10:
        held = [r["proxy_req_delay_us"] for r in report.recording("middlebox")  # type: ignore[attr-defined]
                if r["api_name"] == "Produce" and r.get("proxy_req_delay_us") is not None]
        real = f"{statistics.median(held) / 1000:.2f} ms" if held else "unknown"
        return (f"compare says A − B = {got:.2f} ms on Produce, expected {ADDED_MS:g} ms ± 10 % "
                f"(the middlebox's own recording says it held requests {real})")
    return None


SCENARIO = Scenario(
    name="middlebox-latency",
    story=f"client → kafkatap A → middlebox (+{ADDED_MS:g} ± {JITTER_MS / 2:g} ms) → kafkatap B → broker; compare A with B",
    broker=Broker(topics={"quotes": 1}),
    proxies=[
        Proxy("A", upstream="middlebox"),
        Proxy("middlebox", upstream="B",
              faults=Faults(to_broker=DirectionFaults(latency_ms=ADDED_MS - JITTER_MS / 2, jitter_ms=JITTER_MS), seed=7)),
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
