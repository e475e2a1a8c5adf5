"""How a scenario is declared: broker, network, proxies, clients, expected findings.

Why declarative: a user with an incident should be able to copy one catalog
module, change a broker property or a client, and run it — without learning
the runner. Everything a scenario needs is data here; `scenarios.runner`
turns it into processes, namespaces and a report, and tears it all down.

    SCENARIO = Scenario(
        name="batch-too-large", story="…",
        broker=Broker(props={"message.max.bytes": 10000}),
        proxies=[Proxy("rec")],                      # client → rec → broker
        clients=[ClientSpec("p0", acks=0, size=50_000, count=1, topics=["big"])],
        expect=[Expect("broker_closed_after_acks0_produce")],
    )
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.faults import DirectionFaults, Faults
from scenarios.clients import ClientSpec

__all__ = ["Scenario", "Broker", "Proxy", "Network", "Link", "Expect", "Report", "ClientSpec", "Faults", "DirectionFaults"]


@dataclass
class Broker:
    """The local KRaft broker: server.properties overrides and the topics to create up front.

    host: namespace role to run it in (None: loopback of the runner's network).
    """

    props: dict[str, Any] = field(default_factory=dict)
    topics: dict[str, int] = field(default_factory=dict)  # name -> partitions
    host: str | None = None
    address: str = "127.0.0.1"  # where the broker listens (inside `host` when given)


@dataclass
class Proxy:
    """One kafkatap proxy in the path.

    upstream: "broker" or the name of another proxy (a chain: client → A → F → B → broker).
    record: write a recording (Parquet) under OUT/recordings/<name>; a pure
    middlebox (fault injector) sets record=False. kafka_faults: Kafka-level faults
    (`error=Produce:NOT_LEADER_OR_FOLLOWER,…`, the `--fault` grammar of proxy.kafka_faults).
    listen: "HOST:PORT" (default 127.0.0.1:<free port>); inside a namespace use a fixed port.
    advertise: the address clients should use for this proxy (defaults to listen).
    """

    name: str
    upstream: str = "broker"
    record: bool = True
    faults: Faults | None = None
    kafka_faults: list[str] = field(default_factory=list)  # `--fault` specs of proxy.kafka_faults (error=, delay= …)
    host: str | None = None
    listen: str | None = None
    advertise: str | None = None


@dataclass
class Link:
    """A veth pair between two namespace hosts with one address (CIDR) at each end."""

    a: str
    a_addr: str
    b: str
    b_addr: str


@dataclass
class Network:
    """Namespaces for TCP-level scenarios. Everything lives inside namespaces the runner creates.

    hosts: roles (each becomes a namespace). sysctls: role -> {key: value}.
    addresses: extra addresses on a host's loopback (e.g. one service address reachable over several links).
    routes: (role, destination, via). iptables: role -> list of argument lists.
    """

    hosts: list[str]
    links: list[Link] = field(default_factory=list)
    sysctls: dict[str, dict[str, Any]] = field(default_factory=dict)
    addresses: dict[str, list[str]] = field(default_factory=dict)
    routes: list[tuple[str, str, str]] = field(default_factory=list)
    iptables: dict[str, list[list[str]]] = field(default_factory=dict)
    forwarding: list[str] = field(default_factory=list)


class Report:
    """The analysis output as written on disk: findings.json and tables/*.parquet.

    Expectations read this (not in-memory objects) so a scenario proves what a
    user would actually get.
    """

    def __init__(self, out: Path) -> None:
        import json

        self.out = Path(out)
        self.data: dict[str, Any] = json.loads((self.out / "findings.json").read_text())
        self.findings: list[dict[str, Any]] = self.data.get("findings", [])
        self.report_html = self.out / "report.html"

    def by_id(self, finding_id: str) -> list[dict[str, Any]]:
        return [f for f in self.findings if f.get("id") == finding_id]

    def recording(self, proxy: str, dataset: str = "requests") -> list[dict[str, Any]]:
        """Rows a scenario proxy recorded (OUT/recordings/<proxy>), for ground truth beside the report."""
        import pyarrow.dataset as ds

        path = self.out.parent / "recordings" / proxy / dataset
        return ds.dataset(path, partitioning="hive").to_table().to_pylist() if path.exists() else []

    def table(self, name: str) -> list[dict[str, Any]]:
        import pyarrow.parquet as pq

        path = self.out / "tables" / f"{name}.parquet"
        return pq.read_table(path).to_pylist() if path.exists() else []


# A check gets the matching findings and the whole report; it returns a problem or None.
Check = Callable[[list[dict[str, Any]], Report], str | None]


@dataclass
class Expect:
    """A finding the report must contain (or, with absent=True, must not)."""

    finding: str
    check: Check | None = None
    why: str = ""
    absent: bool = False

    def problems(self, report: Report) -> list[str]:
        found = report.by_id(self.finding)
        if self.absent:
            return [f"finding {self.finding} present but must not be: {found[0].get('title')}"] if found else []
        if not found:
            return [f"expected finding {self.finding} missing{' (' + self.why + ')' if self.why else ''}"]
        if self.check is not None:
            msg = self.check(found, report)
            if msg:
                return [f"finding {self.finding}: {msg}"]
        return []


@dataclass
class Scenario:
    """One incident reproduced end to end.

    compare: (proxy A, proxy B) — also run `analyze --compare A B`; its
    findings are checked against `expect` too. traffic_s: the expected
    length of the traffic phase (clients are bounded; this is a ceiling for
    `scenario list` and a timeout margin). needs_root: namespaces/sysctls.
    """

    name: str
    story: str
    broker: Broker = field(default_factory=Broker)
    proxies: list[Proxy] = field(default_factory=lambda: [Proxy("rec")])
    clients: list[ClientSpec] = field(default_factory=list)
    expect: list[Expect] = field(default_factory=list)
    network: Network | None = None
    compare: tuple[str, str] | None = None
    entry: str | None = None  # the client-facing proxy (default: the one no other proxy points at)
    traffic_s: float = 20.0
    analysis: dict[str, Any] = field(default_factory=dict)  # extra run_analysis options (bucket_s …)

    @property
    def needs_root(self) -> bool:
        return self.network is not None

    def entry_proxy(self) -> Proxy:
        if self.entry:
            return next(p for p in self.proxies if p.name == self.entry)
        targets = {p.upstream for p in self.proxies}
        heads = [p for p in self.proxies if p.name not in targets]
        if len(heads) != 1:
            raise ValueError(f"{self.name}: cannot tell the client-facing proxy; set entry=")
        return heads[0]
