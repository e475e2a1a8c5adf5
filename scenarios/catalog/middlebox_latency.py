"""Two-point latency: how much does the middlebox between two kafkatap proxies add?

client → kafkatap A → middlebox (fault injector: +4 ms fixed, +0–2 ms jitter on
the request path, i.e. 5 ms ± 1 ms) → kafkatap B → broker. Comparing A's and
B's recordings of the same requests (`analyze --compare A B`) must report the
delay the middlebox added, within 10 %.

Ground truth: the middlebox is itself a kafkatap instance, so it records how
long it actually held each request (`proxy_req_delay_us`). That, not the
configured 5 ms, is what was injected: a timer on a busy 2-core machine fires
a little late, and the comparison is supposed to see exactly that. The
injector's own precision is checked separately (within 20 % of 5 ms).
"""

import statistics

from scenarios.spec import Broker, ClientSpec, DirectionFaults, Expect, Faults, Proxy, Scenario

ADDED_MS = 5.0


def _within_10pct(found: list[dict], report: object) -> str | None:
    apis = found[0].get("evidence", {}).get("apis", {})
    produce = apis.get("Produce")
    if not produce or not produce.get("matched"):
        return f"no matched Produce requests (apis: {sorted(apis)})"
    got = (produce.get("diff_p50_us") or 0) / 1000
    # what the middlebox added to each request: its hold on the request plus its relay of the response
    held = [r["proxy_req_delay_us"] + r["proxy_resp_delay_us"]
            for r in report.recording("middlebox")  # type: ignore[attr-defined]
            if r["api_name"] == "Produce" and r.get("proxy_req_delay_us") is not None
            and r.get("proxy_resp_delay_us") is not None]
    if not held:
        return "the middlebox recorded no Produce requests"
    injected = statistics.median(held) / 1000
    if abs(injected - ADDED_MS) > ADDED_MS * 0.20:
        return f"the middlebox held requests {injected:.2f} ms (configured {ADDED_MS:g} ms): injector imprecise"
    if abs(got - injected) > injected * 0.10:
        return f"compare says A − B = {got:.2f} ms on Produce; the middlebox added {injected:.2f} ms (> 10 % apart)"
    return None


SCENARIO = Scenario(
    name="middlebox-latency",
    story=f"client → kafkatap A → middlebox (+{ADDED_MS:g} ± 1 ms) → kafkatap B → broker; compare A with B",
    broker=Broker(topics={"quotes": 1}),
    proxies=[
        Proxy("A", upstream="middlebox"),
        Proxy("middlebox", upstream="B",
              faults=Faults(to_broker=DirectionFaults(latency_ms=ADDED_MS - 1, jitter_ms=2.0), seed=7)),
        Proxy("B"),
    ],
    compare=("A", "B"),
    clients=[
        ClientSpec("quote-feed", topics=["quotes"], rate=40, linger_ms=0, duration_s=10),
        ClientSpec("quote-reader", kind="confluent", role="consumer", topics=["quotes"], group="readers", duration_s=10),
    ],
    expect=[Expect("compare_added_latency", _within_10pct, why="A − B ≈ the delay the middlebox added, on Produce")],
    traffic_s=11,
)
