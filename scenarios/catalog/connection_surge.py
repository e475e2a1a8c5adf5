"""Incident 4 (docs/incidents.md#incident-4): response times jump under a connection surge.

A broker with one network thread and a short request queue serves a steady
producer; after a baseline, hundreds of new connections arrive and keep
asking for metadata. The report must show the concurrency jump and the
latency rising with it.
"""

from scenarios.spec import Broker, ClientSpec, Expect, Proxy, Scenario

SURGE_AT = 10


def _latency_rose(found: list[dict], report: object) -> str | None:
    ev = found[0].get("evidence", {})
    if (ev.get("peak_connections") or 0) < 150:
        return f"peak connections {ev.get('peak_connections')}"
    b, s = ev.get("baseline_p99_us"), ev.get("surge_p99_us")
    if not b or not s or s < 1.5 * b:
        return f"p99 latency did not rise with the surge ({b} → {s} µs)"
    return None


SCENARIO = Scenario(
    name="connection-surge",
    story="num.network.threads=1: 300 new connections during steady produce → concurrency jump, latency up",
    broker=Broker(props={"num.network.threads": 1, "num.io.threads": 1, "queued.max.requests": 4},
                  topics={"payments": 1}),
    proxies=[Proxy("rec")],
    clients=[
        ClientSpec("steady-producer", topics=["payments"], rate=50, duration_s=SURGE_AT + 16, linger_ms=0),
        ClientSpec("new-fleet", kind="surge", role="connections", connections=300, duration_s=14,
                   start_after_s=SURGE_AT),
    ],
    expect=[Expect("connection_surge", _latency_rose, why="concurrency jump with p99 latency rising")],
    traffic_s=SURGE_AT + 18,
)
