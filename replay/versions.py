"""Which recorded requests use an API version the target does not serve.

Why: a broker refuses a request whose version it does not serve by closing the
connection, so a replayed session stops at it with nothing but "the target closed
the connection". Two cases differ for the operator. Kafka 4.0 dropped the versions
that clients older than Kafka 2.1 send (KIP-896): replaying a recording against the
broker one plans to move to is how to find those clients before the upgrade does,
and the target refuses them as it would refuse the clients themselves. A version
newer than the target serves is the other case: the client would have asked the
target's ApiVersions and sent an older one, while replay sends what was recorded,
so those sessions are not replayed faithfully. The set-up reads the target's
ApiVersions once and names every (API, version) it would refuse, with the requests
and clients behind it.

ApiVersions itself is never refused (a broker answers an unknown version of it with
the versions it serves), and SaslAuthenticate is replaced by replay's own, so
neither is checked. A newer version is then lowered request by request to the target's
newest (`replay.lower`, counted as the rewrite `version_lowered`), as the client would
have sent it; one that has no faithful form there is sent as recorded and noted
`version_not_lowered`. An API the target lacks is noted `api_not_on_target`, unless
its clients ask another one there instead, which replay then sends
(`api_not_on_target_sent_as_fallback`: DescribeTopicPartitions as Metadata,
`replay.api_fallback`). Pure functions: the set-up does the I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from protocol.apis import API_NAMES, API_VERSIONS, APIS, FETCH, PRODUCE, SASL_AUTHENTICATE
from replay.api_fallback import falls_back

__all__ = ["Unserved", "served_ranges", "unserved", "transactions_v2", "RETIRED", "TOO_NEW", "MISSING", "NOT_LOWERED",
           "LEFT_OUT", "FALLBACK", "TXN_V1_TARGET"]

RETIRED = "version_retired_on_target:"  # older than the target serves: the client itself is refused there as well
TOO_NEW = "version_newer_than_target:"  # newer than it serves: the client itself would have sent an older one
MISSING = "api_not_on_target:"  # an API the target does not serve at all: an older Kafka, or a feature it has off
NOT_LOWERED = "version_not_lowered:"  # a TOO_NEW request whose body has no faithful form at the target's version
FALLBACK = "api_not_on_target_sent_as_fallback:"  # an API the target lacks, sent as the one its clients ask instead
LEFT_OUT = "ignorable_field_left_out:"  # a lowered request without a set field Kafka marks ignorable, as clients send it
TXN_V1_TARGET = "transactions_v2_recorded_v1_on_target"  # transactional requests lowered to what a v1 client sends
_NOT_CHECKED = frozenset({API_VERSIONS, SASL_AUTHENTICATE})
# Kafka 4.0's oldest Fetch and Produce (4 and 3): the protocol table's `legacy_below`, from Kafka's own specs
_KIP_896_FETCH_MIN, _KIP_896_PRODUCE_MIN = APIS[FETCH].legacy_below, APIS[PRODUCE].legacy_below


def served_ranges(api_versions_body: Mapping[str, Any]) -> dict[int, tuple[int, int]]:
    """API key → (min, max) version the target serves, from an ApiVersions answer's body (any version of it).

    One correction: Kafka 4.0 and later list Produce from v0 but refuse v0–v2 (KAFKA-18659: an old librdkafka
    turned compression off unless v0 was listed; Kafka's own spec says "3-…"). Such a broker is told by
    its Fetch, which it no longer serves below v4 (KIP-896)."""
    ranges = {k["api_key"]: (k["min_version"], k["max_version"]) for k in api_versions_body.get("api_keys") or ()}
    if FETCH in ranges and ranges[FETCH][0] >= _KIP_896_FETCH_MIN and PRODUCE in ranges:
        lo, hi = ranges[PRODUCE]
        ranges[PRODUCE] = (max(lo, _KIP_896_PRODUCE_MIN), hi)
    return ranges


TRANSACTION_VERSION = "transaction.version"  # the feature whose level 2 is transactions v2 (KIP-890 part 2)


def transactions_v2(api_versions_body: Mapping[str, Any]) -> bool:
    """Whether the target runs transactions v2, from an ApiVersions v3+ answer's finalized features: a Kafka 4 cluster
    formatted as such, or upgraded with `kafka-features upgrade --feature transaction.version=2`. A cluster
    upgraded from 3.x keeps level 0 until then, and a 3.x broker has no such feature."""
    return any(f.get("name") == TRANSACTION_VERSION and (f.get("max_version_level") or 0) >= 2
               for f in api_versions_body.get("finalized_features") or ())


@dataclass(frozen=True)
class Unserved:
    """Requests of one API and version the target would refuse."""

    api_key: int
    version: int
    requests: int
    clients: tuple[str, ...]  # the client ids that sent them, sorted
    served: tuple[int, int] | None  # what the target serves of this API; None: not this API at all
    instead: int | None = None  # the API the clients fall back to there, which the target serves (`replay.api_fallback`)

    @property
    def note(self) -> str:
        """The replay note that counts these requests: the API, the version, what the target serves instead, who sent
        them. Older than the target serves (`RETIRED`), newer (`TOO_NEW`), an API the target lacks (`MISSING`) and
        one it lacks that is sent as its clients' fallback there (`FALLBACK`) mean different things to the operator
        (`replay.schedule.note_hint`)."""
        name = API_NAMES.get(self.api_key, f"api {self.api_key}")
        clients = f"clients: {', '.join(self.clients)}"
        if self.served is None and self.instead is not None:
            return f"{FALLBACK}{name} v{self.version} → {API_NAMES.get(self.instead, self.instead)} ({clients})"
        if self.served is None:
            return f"{MISSING}{name} v{self.version} ({clients})"
        kind = RETIRED if self.version < self.served[0] else TOO_NEW
        return f"{kind}{name} v{self.version} (the target serves v{self.served[0]}–v{self.served[1]}; {clients})"


def unserved(sent: Iterable[tuple[int, int, str | None]], ranges: Mapping[int, tuple[int, int]]) -> list[Unserved]:
    """The (api key, version, client id) of every request replay would send → what the target would refuse,
    by API and version."""
    counts: dict[tuple[int, int], int] = {}
    clients: dict[tuple[int, int], set[str]] = {}
    for key, version, client in sent:
        if key in _NOT_CHECKED:
            continue
        lo, hi = ranges.get(key, (0, -1))
        if lo <= version <= hi:
            continue
        counts[(key, version)] = counts.get((key, version), 0) + 1
        clients.setdefault((key, version), set()).add(client or "(no client id)")
    return [Unserved(k, v, n, tuple(sorted(clients[(k, v)])), ranges.get(k), falls_back(k, v, ranges))
            for (k, v), n in sorted(counts.items())]
