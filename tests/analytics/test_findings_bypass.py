"""The `clients_bypass_proxy` finding, from the `bypass` table's rows (no Spark needed: rules read small tables)."""

from __future__ import annotations

import datetime as dt

from analytics.findings import RULES, run_rules
from analytics.findings.bypass import clients_bypass_proxy


def test_clients_sent_around_the_proxy_is_critical_and_says_what_to_do() -> None:
    at = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc)
    rows = [{"address": "127.0.0.1:29092", "responses": 3, "clients": 2, "client_ids": ["app-a", "app-b"],
             "told_by": ["127.0.0.1:29092"], "apis": ["Metadata"], "first_seen": at, "last_seen": at,
             "example_conn_id": "c-1"}]
    (f,) = clients_bypass_proxy({"bypass": rows})
    assert f.id == "clients_bypass_proxy" and f.severity == "critical"
    assert "127.0.0.1:29092" in f.title and "--cluster" in f.summary and "advertised.listeners" in f.summary
    assert f.evidence["clients"] == ["app-a", "app-b"] and f.examples[0]["conn_id"] == "c-1"
    assert "clients_bypass_proxy" in RULES
    assert run_rules({"bypass": rows})[0].id == "clients_bypass_proxy"  # ranked first: critical


def test_no_bypass_no_finding() -> None:
    assert clients_bypass_proxy({}) == [] and clients_bypass_proxy({"bypass": []}) == []
