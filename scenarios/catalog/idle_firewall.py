"""Incident 2 (docs/incidents.md#incident-2): somebody resets producer connections (an idle-timeout firewall).

Producers that send every few seconds sit behind a middlebox that resets
connections idle for more than 3 s — here kafkatap's own fault injector,
acting as the firewall in front of the recording proxy (client → firewall →
kafkatap → broker), so the recording proxy stands where a capture on the
broker side would: it sees the resets arrive from the client side, never from
the broker, each after ~3 s of silence, and every client reconnecting.

Why not a conntrack router here: a Linux router whose conntrack entry expired
answers the client's next packet with a RST *to the client only*; nothing
reaches the broker side, so a broker-side recorder sees only the reconnects
(exactly what the operators' broker capture showed). A firewall that resets
both sides, like this one, makes the "after N s idle" evidence recordable.
"""

from scenarios.spec import Broker, ClientSpec, Expect, Faults, Proxy, Scenario

IDLE_S = 3.0


def _idle_near_limit(found: list[dict], report: object) -> str | None:
    ev = found[0].get("evidence", {})
    med = (ev.get("median_idle_ms") or 0) / 1000
    if not IDLE_S * 0.9 <= med <= IDLE_S * 1.5:
        return f"median idle before the reset is {med:.1f} s, expected about {IDLE_S:g} s"
    if "broker" in (ev.get("end_by") or []):
        return "resets attributed to the broker"
    if (ev.get("resets") or 0) < 6:
        return f"only {ev.get('resets')} resets"
    return None


SCENARIO = Scenario(
    name="idle-firewall",
    story=f"a middlebox resets connections idle > {IDLE_S:g} s: resets not sent by the broker, clients reconnect",
    broker=Broker(topics={"metrics": 1, "events": 1}),
    proxies=[
        Proxy("rec"),  # the recording kafkatap, broker side
        Proxy("firewall", upstream="rec", record=False, faults=Faults(idle_reset_s=IDLE_S)),
    ],
    clients=[
        ClientSpec("sensor-a", topics=["metrics"], interval_s=4.5, count=5, duration_s=22),
        ClientSpec("sensor-b", topics=["metrics"], interval_s=4.5, count=5, duration_s=22, start_after_s=1),
        ClientSpec("batch-job", kind="confluent", topics=["events"], interval_s=5, count=4, duration_s=22),
        ClientSpec("busy", topics=["events"], rate=20, duration_s=20),  # never idle: never reset
    ],
    expect=[
        Expect("idle_resets_not_from_broker", _idle_near_limit, why="resets after ~3 s idle from the middlebox"),
        Expect("reconnect_storm", why="the idle producers reconnect again and again"),
    ],
    traffic_s=23,
)
