"""Incident 1 (docs/incidents.md#incident-1): the broker hangs up on a producer (RecordBatchTooLarge with acks=0).

A broker with a small message.max.bytes. One producer sends an oversize batch
with acks=0: no response can carry the error, so the broker closes the
connection and the client only sees a disconnect. Another sends the same with
acks=1: the broker answers MESSAGE_TOO_LARGE and keeps the connection. A
normal producer runs beside them so the report has a baseline.
"""

from scenarios.spec import Broker, ClientSpec, Expect, Proxy, Scenario


def _closed_oversize(found: list[dict], report: object) -> str | None:
    f = found[0]
    ev = f.get("evidence", {})
    if "RecordBatchTooLarge" not in str(ev.get("inferred_cause")):
        return f"inferred cause is {ev.get('inferred_cause')!r}"
    if (ev.get("max_request_bytes") or 0) <= 10_000:
        return f"the Produce was only {ev.get('max_request_bytes')} bytes"
    return None


SCENARIO = Scenario(
    name="batch-too-large",
    story="acks=0 oversize batch → the broker silently hangs up; acks=1 → MESSAGE_TOO_LARGE, connection kept",
    broker=Broker(props={"message.max.bytes": 10_000}, topics={"orders": 1, "big-events": 1}),
    proxies=[Proxy("rec")],
    clients=[
        ClientSpec("steady", topics=["orders"], rate=20, duration_s=8, size=200),
        # acks=0: the broker answers an oversize batch by closing the connection
        ClientSpec("fire-and-forget", client_id="producer-acks0", topics=["big-events"], acks=0, size=50_000,
                   count=3, interval_s=1.5, duration_s=8, config={"max_request_size": 1_000_000, "retries": 0}),
        # acks=1: the same batch comes back as an error, the connection stays open
        ClientSpec("careful", client_id="producer-acks1", topics=["big-events"], acks=1, size=50_000, count=2,
                   interval_s=1.5, duration_s=8, config={"max_request_size": 1_000_000, "retries": 0}),
    ],
    expect=[
        Expect("broker_closed_after_acks0_produce", _closed_oversize,
               why="the broker must be seen closing right after the acks=0 oversize Produce"),
        Expect("produce_rejected_too_large", why="acks=1 oversize Produce answered with MESSAGE_TOO_LARGE"),
    ],
    traffic_s=10,
)
