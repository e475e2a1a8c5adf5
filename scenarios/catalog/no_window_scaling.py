"""Incident 5 (docs/incidents.md#incident-5): 64 KiB per round trip — window scaling lost to SYN cookies without timestamps.

The server namespace (broker + kafkatap, which accepts the clients'
connections there) sends SYN cookies for every connection
(`tcp_syncookies=2`). One client namespace has `tcp_timestamps=0` (as behind
the NAT that stripped them): a SYN cookie without timestamps cannot carry the
window-scale option, so those accepted sockets have no window scaling. The
other client namespace is normal. kafkatap reads TCP_INFO on its client-side
sockets, so it must sit in the server namespace to see what the server saw.
"""

from scenarios.spec import Broker, ClientSpec, Expect, Link, Network, Proxy, Scenario

SERVICE = "10.75.0.1"


def _only_stripped(found: list[dict], report: object) -> str | None:
    rows = report.table("window_ceiling")  # type: ignore[attr-defined]
    flagged = {r.get("client_id") for r in rows}
    if not rows:
        return "no socket flagged"
    wrong = flagged - {"legacy-nat-producer", "legacy-nat-consumer"}
    if wrong:
        return f"sockets of normal clients flagged too: {sorted(map(str, wrong))}"
    if {r.get("side") for r in rows} != {"client"}:
        return f"flagged sides {sorted({str(r.get('side')) for r in rows})}, expected only the client side"
    return None


SCENARIO = Scenario(
    name="no-window-scaling",
    story="server tcp_syncookies=2 + clients without TCP timestamps → no window scaling on exactly those connections",
    network=Network(
        hosts=["server", "natted", "direct"],
        links=[Link("natted", "10.75.1.1/24", "server", "10.75.1.2/24"),
               Link("direct", "10.75.2.1/24", "server", "10.75.2.2/24")],
        addresses={"server": [f"{SERVICE}/32"]},
        routes=[("natted", f"{SERVICE}/32", "10.75.1.2"), ("direct", f"{SERVICE}/32", "10.75.2.2")],
        sysctls={"server": {"net.ipv4.tcp_syncookies": 2}, "natted": {"net.ipv4.tcp_timestamps": 0}},
    ),
    broker=Broker(host="server", topics={"replication": 1}),
    proxies=[Proxy("rec", host="server", listen="0.0.0.0:19092", advertise=f"{SERVICE}:19092")],
    clients=[
        ClientSpec("legacy-nat-producer", host="natted", topics=["replication"], rate=40, size=20_000, duration_s=8),
        ClientSpec("legacy-nat-consumer", host="natted", role="consumer", topics=["replication"], group="dr", duration_s=9),
        ClientSpec("direct-producer", kind="confluent", host="direct", topics=["replication"], rate=40, size=20_000,
                   duration_s=8),
        ClientSpec("direct-consumer", kind="confluent", host="direct", role="consumer", topics=["replication"],
                   group="local", duration_s=9),
    ],
    expect=[Expect("window_scaling_off", _only_stripped, why="only the timestamp-less clients' sockets lack window scaling")],
    traffic_s=10,
)
