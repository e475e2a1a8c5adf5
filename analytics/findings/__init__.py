"""Findings: ranked plain-language diagnoses with evidence.

A rule is a small function `Tables -> list[Finding]` over the (already
collected, small) tables the job computed; rules never touch Spark, so they
are cheap, deterministic and testable with a few dict rows. Register a rule
with `@rule`; `run_rules` applies all of them and ranks the result.
"""

from analytics.findings.base import (INCIDENT_TITLES, INCIDENTS_DOC, RULES, Finding, Tables, incident_label,
                                     incident_ref, rank, rule, run_rules)
from analytics.findings import bypass as _bypass  # noqa: F401  (registers rules)
from analytics.findings import compare as _compare  # noqa: F401
from analytics.findings import faults as _faults  # noqa: F401  (issue 17: injected Kafka faults)
from analytics.findings import general as _general  # noqa: F401
from analytics.findings import inventory as _inventory  # noqa: F401
from analytics.findings import opaque as _opaque  # noqa: F401  (TLS pass-through and other undecoded connections)
from analytics.findings import outages as _outages  # noqa: F401  (a broker refusing connections: down or restarting)
from analytics.findings import oversize_produce as _oversize  # noqa: F401
from analytics.findings import resets as _resets  # noqa: F401
from analytics.findings import stretches as _stretches  # noqa: F401  (a directory reused across sessions)
from analytics.findings import surge as _surge  # noqa: F401
from analytics.findings import tcp_window as _tcp  # noqa: F401
from analytics.findings import upgrade as _upgrade  # noqa: F401  (clients a Kafka 4 broker refuses, KIP-896)

__all__ = ["INCIDENT_TITLES", "INCIDENTS_DOC", "RULES", "Finding", "Tables", "incident_label", "incident_ref", "rank",
           "rule", "run_rules"]
