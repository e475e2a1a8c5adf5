"""Every incident scenario end to end: real broker, real clients, kafkatap recording, Spark report.

These are the project's end-to-end tests. Each asserts the expected findings
from the report written on disk (findings.json and tables/) and that nothing
was left behind: no child processes, no namespaces, the host's iptables
unchanged. batch-too-large and who-is-writing also run on Kafka 3.7.x, the
version in the incidents.
"""

from __future__ import annotations

import json
import os

import pytest

from scenarios.catalog import get
from harness.jars import DEFAULT_VERSION, INCIDENT_VERSION
from harness.netns import leftover_namespaces
from scenarios.runner import host_iptables_snapshot, run_scenario
from scenario_helpers import children

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

CASES = [
    pytest.param("batch-too-large", DEFAULT_VERSION, id="batch-too-large"),
    pytest.param("batch-too-large", INCIDENT_VERSION, id="batch-too-large-3.7"),
    pytest.param("idle-firewall", DEFAULT_VERSION, id="idle-firewall"),
    pytest.param("who-is-writing", DEFAULT_VERSION, id="who-is-writing"),
    pytest.param("who-is-writing", INCIDENT_VERSION, id="who-is-writing-3.7"),
    pytest.param("connection-surge", DEFAULT_VERSION, id="connection-surge"),
    pytest.param("no-window-scaling", DEFAULT_VERSION, id="no-window-scaling", marks=pytest.mark.netns),
    pytest.param("middlebox-latency", DEFAULT_VERSION, id="middlebox-latency"),
    pytest.param("leader-moves", DEFAULT_VERSION, id="leader-moves"),  # issue 17: Kafka-level faults, 3 libraries
    pytest.param("coordinator-lost", DEFAULT_VERSION, id="coordinator-lost"),
    pytest.param("demo", DEFAULT_VERSION, id="demo"),
]


@pytest.mark.parametrize(("name", "version"), CASES)
def test_scenario(name: str, version: str, tmp_path) -> None:
    if name == "demo":
        from scenarios.demo import SCENARIO as scenario
    else:
        scenario = get(name)
    assert not scenario.needs_root or os.geteuid() == 0, "this scenario needs root for network namespaces"
    namespaces_before = set(leftover_namespaces())
    iptables_before = host_iptables_snapshot()
    children_before = children()

    result = run_scenario(scenario, tmp_path / name, kafka_version=version)

    findings = json.loads((tmp_path / name / "report" / "findings.json").read_text())["findings"]
    ids = {f["id"] for f in findings}
    assert result.ok, "\n".join(result.problems) + f"\nfindings: {sorted(ids)}\n{result.summary}"
    for exp in scenario.expect:
        assert (exp.finding in ids) != exp.absent
    ours = f"ktap-{os.getpid() % 100000}x"  # other test sessions may own namespaces meanwhile
    assert not {n for n in set(leftover_namespaces()) - namespaces_before if n.startswith(ours)}, "namespaces left behind"
    assert host_iptables_snapshot() == iptables_before, "host iptables changed"
    assert not children() - children_before, "processes left behind"
