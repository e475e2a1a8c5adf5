"""A scenario's spec checked before anything starts: each mistake one line naming the field.

Why: a scenario file is the operator's own Python. Without these checks a typo in a proxy's name, a
client kind or a finding id surfaced after the broker had started (a `KeyError: 'natted'`, a
`StopIteration` with no message), or after a minute of traffic and Spark ("expected finding …
missing"), and `topics="orders"` silently produced to topics o, r, d, e and s. The built-in catalog
passes them too (tests/scenarios).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from scenarios.clients import DRIVERS
from scenarios.spec import Scenario

__all__ = ["spec_problems"]


def _near(word: str, choices: Iterable[str]) -> str:
    near = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


def _names(value: Any) -> bool:
    """A list (or tuple) of topic names, as the clients and the broker take them; a bare string is not one."""
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) and v for v in value)


def spec_problems(sc: Scenario) -> list[str]:
    """Every mistake `sc` holds that would fail its run (or quietly change it), in the order of the spec."""
    from analytics.findings.base import RULES  # the finding ids a report can hold
    from proxy.faults import FaultSpecError
    from proxy.kafka_faults import FaultRules

    out: list[str] = []
    hosts = list(sc.network.hosts) if sc.network is not None else []

    def host(where: str, name: str | None) -> None:
        if name is not None and name not in hosts:
            have = ", ".join(hosts) if hosts else "none: add network=Network(hosts=[…])"
            out.append(f"{where}: host={name!r} is not one of the network's hosts ({have}){_near(name, hosts)}")

    b = sc.broker
    if not isinstance(b.topics, dict) or not all(isinstance(k, str) and isinstance(v, int) and v > 0
                                                 for k, v in b.topics.items()):
        out.append(f"broker: topics={b.topics!r} must map each topic to its partitions, e.g. {{'orders': 3}}")
    if not isinstance(b.props, dict):
        out.append(f"broker: props={b.props!r} must be a dict of broker properties, e.g. {{'message.max.bytes': 10000}}")
    host("broker", b.host)

    names = [p.name for p in sc.proxies]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        out.append(f"proxies: two proxies are named {dup!r}")
    for p in sc.proxies:
        targets = ["broker", *(n for n in names if n != p.name)]
        if p.upstream not in targets:
            out.append(f"proxy {p.name!r}: upstream={p.upstream!r} is neither 'broker' nor another proxy "
                       f"({', '.join(targets)}){_near(p.upstream, targets)}")
        host(f"proxy {p.name!r}", p.host)
        try:
            FaultRules.from_specs(list(p.kafka_faults))
        except (FaultSpecError, TypeError) as exc:
            out.append(f"proxy {p.name!r}: kafka_faults: {exc}")
    if sc.entry is not None and sc.entry not in names:
        out.append(f"entry={sc.entry!r} is not a proxy of this scenario ({', '.join(names)}){_near(sc.entry, names)}")
    for side in sc.compare or ():
        if side not in names:
            out.append(f"compare: {side!r} is not a proxy of this scenario ({', '.join(names)}){_near(side, names)}")
        elif not next(p for p in sc.proxies if p.name == side).record:
            out.append(f"compare: proxy {side!r} does not record (record=False): there is nothing of it to compare")
    if sc.proxies and not any(p.record for p in sc.proxies):
        out.append("proxies: none records (record=False on every one): the run would have nothing to analyze")

    kinds = sorted({k for k, _ in DRIVERS})
    for c in sc.clients:
        if (c.kind, c.role) not in DRIVERS:
            pairs = ", ".join(f"{k}/{r}" for k, r in sorted(DRIVERS))
            hint = _near(c.kind, kinds) if c.kind not in kinds else ""
            out.append(f"client {c.name!r}: kind={c.kind!r} with role={c.role!r} is no client this runner has "
                       f"(kind/role: {pairs}){hint}")
        if not _names(c.topics):
            out.append(f"client {c.name!r}: topics={c.topics!r} must be a list of topic names, e.g. ['orders']")
        host(f"client {c.name!r}", c.host)

    for e in sc.expect:
        if e.finding not in RULES:
            out.append(f"expect: {e.finding!r} is no finding kafkatap reports{_near(e.finding, RULES)}")
    return out
