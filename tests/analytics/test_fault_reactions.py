"""Injected Kafka faults → what each client did next (analytics.transforms.faults, analytics.findings.faults)."""

from __future__ import annotations

from analytics.findings import run_rules
from analytics.job import empty_table
from analytics.transforms.common import prepare_requests
from analytics.transforms.faults import (
    BY_LIBRARY_COLUMNS,
    REACTIONS_COLUMNS,
    fault_reactions,
    fault_reactions_by_library,
)
from analytics_rows import req

NL = [{"code": 6, "name": "NOT_LEADER_OR_FOLLOWER", "topic": "orders", "partition": 0, "resource": None}]


def _rows():
    return [
        # kafka-python: in-place NOT_LEADER, then Metadata, then a successful retry 150 ms later
        req("k1", 1, "ApiVersions", t_s=0, client="kp", client_software_name="kafka-python", client_software_version="3"),
        req("k1", 2, "Produce", t_s=1.0, client="kp", errors=NL, error_count=1,
            edit="fault#1 error=NOT_LEADER_OR_FOLLOWER in-place"),
        req("k1", 3, "Metadata", t_s=1.05, client="kp"),
        req("k1", 4, "Produce", t_s=1.15, client="kp"),
        req("k1", 5, "Produce", t_s=2.0, client="kp"),
        # a non-idempotent producer whose written Produce was rewritten: it reconnects and retries → duplicates
        req("d1", 1, "ApiVersions", t_s=0, client="dup", client_software_name="librdkafka", client_software_version="2"),
        req("d1", 2, "Produce", t_s=3.0, client="dup", errors=NL, error_count=1, records=7, producer_id=-1,
            edit="fault#2 error=NOT_LEADER_OR_FOLLOWER rewrite"),
        req("d2", 1, "Metadata", t_s=3.2, client="dup"),
        req("d2", 2, "Produce", t_s=3.4, client="dup", producer_id=-1),
        # a consumer that never commits again (not recovered) and a delay note that is not an error
        req("j1", 1, "ApiVersions", t_s=0, client="java", client_software_name="apache-kafka-java", client_software_version="4"),
        req("j1", 2, "Heartbeat", t_s=5.0, client="java", errors=[{"code": 16, "name": "NOT_COORDINATOR", "topic": None,
                                                                    "partition": None, "resource": "g"}],
            error_count=1, edit="fault#3 error=NOT_COORDINATOR in-place"),
        req("j1", 3, "FindCoordinator", t_s=5.1, client="java"),
        req("j1", 4, "Fetch", t_s=5.2, client="java", edit="fault#4 delay=200ms"),
        req("x1", 1, "Produce", t_s=0.5, client="plain"),  # untouched client: not in the tables
    ]


def test_reactions_per_fault_and_per_library(make_df) -> None:
    r = prepare_requests(make_df("requests", _rows()))
    got = {(x["client_id"], x["rule"]): x for x in fault_reactions(r).toArrow().to_pylist()}
    assert set(got) == {("kp", 1), ("dup", 2), ("java", 3), ("java", 4)}
    kp = got[("kp", 1)]
    assert (kp["library"], kp["kind"], kp["detail"], kp["mode"], kp["recovered"], kp["retries"],
            kp["metadata_refreshes"], kp["reconnects"], kp["duplicate_records"]) == (
        "kafka-python", "error", "NOT_LEADER_OR_FOLLOWER", "in-place", True, 1, 1, 0, 0)
    assert kp["time_to_recover_ms"] == 150.0
    dup = got[("dup", 2)]
    assert (dup["mode"], dup["reconnects"], dup["retries"], dup["duplicate_records"], dup["library"]) == (
        "rewrite", 1, 1, 7, "librdkafka")
    hb = got[("java", 3)]
    assert (hb["recovered"], hb["coordinator_lookups"], hb["time_to_recover_ms"]) == (False, 1, None)
    assert got[("java", 4)]["kind"] == "delay" and got[("java", 4)]["detail"] == "200ms"

    by_lib = fault_reactions_by_library(fault_reactions(r)).toArrow().to_pylist()
    row = next(x for x in by_lib if x["library"] == "kafka-python")
    assert (row["faults"], row["recovered"], row["retries"], row["recover_p50_ms"]) == (1, 1, 1, 150.0)

    tables = {"fault_reactions": list(got.values()), "fault_reactions_by_library": by_lib}
    findings = run_rules(tables)
    ids = [f.id for f in findings]
    assert ids.count("kafka_fault_reactions") == 3  # NOT_LEADER on Produce, NOT_COORDINATOR on Heartbeat, delay on Fetch
    hbf = next(f for f in findings if f.id == "kafka_fault_reactions" and f.evidence["detail"] == "NOT_COORDINATOR")
    assert hbf.severity == "warning" and "not recovered" in hbf.title
    dupf = next(f for f in findings if f.id == "fault_retry_duplicates")
    assert dupf.evidence["duplicate_records"] == 7 and dupf.evidence["clients"] == ["dup"]


def test_no_fault_no_rows(make_df) -> None:
    r = prepare_requests(make_df("requests", [req("c", 1), req("c", 2, "Metadata", t_s=1)]))
    assert fault_reactions(r).count() == 0
    # without faults the job makes both tables from their declared columns, with no Spark job: they must be
    # the tables the plans give, column for column and type for type
    for plan, declared in ((fault_reactions(r), REACTIONS_COLUMNS),
                           (fault_reactions_by_library(fault_reactions(r)), BY_LIBRARY_COLUMNS)):
        made, real = empty_table(r, declared), plan.toArrow()
        assert made.num_rows == 0 and [(f.name, f.type) for f in made.schema] == [(f.name, f.type) for f in real.schema]
    assert not [f for f in run_rules({"fault_reactions": [], "fault_reactions_by_library": []})
                if f.id in ("kafka_fault_reactions", "fault_retry_duplicates")]
