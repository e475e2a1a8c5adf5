"""Errors kafkatap injected (Kafka faults, noted in `edit`) are not counted as the broker's, and stay visible apart."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

from analytics.findings.general import error_hotspot
from analytics.findings.oversize_produce import produce_rejected_too_large
from analytics.job import summary
from analytics.report.html import _not_steps
from analytics.result import AnalysisResult
from analytics.transforms import clients, errors, overview
from analytics.transforms.common import prepare_requests
from analytics.transforms.injected import injected_error_names as spark_injected_names
from analytics.transforms.rollups import request_rollup, topic_rollup
from analytics_rows import conn, req
from recording.request_sums import request_sums
from recording.fault_notes import injected_error_names
from recording.schema import arrow_schema

pytestmark = pytest.mark.spark

NLOF = "NOT_LEADER_OR_FOLLOWER"


def _err(name: str, topic: str = "orders") -> dict:
    return {"code": 6, "name": name, "topic": topic, "partition": 0, "resource": None}


def _rows() -> list[dict]:
    """Two clients: one meets an injected NOT_LEADER_OR_FOLLOWER on every Produce, the other real broker errors."""
    inject = "fault#1 error=NOT_LEADER_OR_FOLLOWER in-place"
    rows = [req("f", i, "Produce", t_s=i, client="faulted", errors=[_err(NLOF)], error_count=1, edit=inject) for i in range(1, 31)]
    rows += [
        req("f", 40, "Produce", t_s=40, client="faulted"),  # the client got through
        # a rewrite with topic=orders: its entry carries the injected error, the broker's own on `audit` stays the broker's
        req("f", 41, "Produce", t_s=41, client="faulted", topics=["orders", "audit"], error_count=2,
            errors=[_err(NLOF), _err("NOT_ENOUGH_REPLICAS", "audit")], edit="fault#2 error=NOT_LEADER_OR_FOLLOWER rewrite"),
        # a delay, then an injected non-retriable error: only the error is kafkatap's
        req("f", 42, "Produce", t_s=42, client="faulted", errors=[_err("TOPIC_AUTHORIZATION_FAILED")], error_count=1,
            edit="fault#3 delay=100ms; fault#4 error=TOPIC_AUTHORIZATION_FAILED in-place"),
        # the response edit failed: the client got the broker's answer, whose error is the broker's
        req("f", 43, "Produce", t_s=43, client="faulted", errors=[_err(NLOF)], error_count=1,
            edit="fault#2 error=NOT_LEADER_OR_FOLLOWER rewrite (not applied)"),
        req("b", 1, "Produce", t_s=1, client="real", errors=[_err("MESSAGE_TOO_LARGE")], error_count=1),
        req("b", 2, "Produce", t_s=2, client="real", errors=[_err(NLOF)], error_count=1),
        req("b", 3, "Produce", t_s=3, client="real", errors=[_err(NLOF)], error_count=1, edit="fault#5 delay=5ms"),
        req("b", 4, "Produce", t_s=4, client="real"),
    ]
    return rows


def test_error_counts_are_the_brokers_and_injected_errors_have_rows_of_their_own(make_df) -> None:
    r = prepare_requests(make_df("requests", _rows()))
    rollup = request_rollup(r)
    c = make_df("connections", [conn("f", 0, 50, client="faulted"), conn("b", 0, 50, client="real")])
    o = overview.overview(rollup, c).collect()[0].asDict()
    # broker errors: MESSAGE_TOO_LARGE (error); NOT_ENOUGH_REPLICAS, the not-applied rewrite's and 2 of client real's NLOF
    assert (o["requests"], o["requests_with_errors"], o["requests_retriable"]) == (38, 1, 4)
    first = summary(AnalysisResult(Path("out"), [], o, {}, 60, Path("r.html"), Path("f.json"), {})).splitlines()[0]
    assert "error rate 2.632% (+10.526% retriable)" in first, first
    inv = {x["client_id"]: x for x in clients.client_inventory(rollup, topic_rollup(r), c).collect()}
    assert (inv["faulted"]["requests_with_errors"], inv["faulted"]["requests_retriable"]) == (0, 2)
    assert (inv["real"]["requests_with_errors"], inv["real"]["requests_retriable"]) == (1, 2)

    table = [x.asDict() for x in errors.errors_by_name(r).collect()]
    counts = {(x["client_id"], x["error_name"], x["topic"], x["injected"]): x["count"] for x in table}
    assert counts == {("faulted", NLOF, "orders", True): 31, ("faulted", "TOPIC_AUTHORIZATION_FAILED", "orders", True): 1,
                      ("faulted", "NOT_ENOUGH_REPLICAS", "audit", False): 1, ("faulted", NLOF, "orders", False): 1,
                      ("real", "MESSAGE_TOO_LARGE", "orders", False): 1, ("real", NLOF, "orders", False): 2}
    assert sum(counts.values()) == sum(len(x["errors"]) for x in _rows())  # the table reconciles with the raw rows
    over = {(x["error_name"], x["injected"]): 0 for x in errors.errors_over_time(r, 60).collect()}
    for x in errors.errors_over_time(r, 60).collect():
        over[(x["error_name"], x["injected"])] += x["count"]
    assert over[(NLOF, True)] == 31 and over[(NLOF, False)] == 3
    assert {x["error_name"] for x in _not_steps(table)} == {NLOF, "NOT_ENOUGH_REPLICAS", "MESSAGE_TOO_LARGE"}
    assert sum(x["count"] for x in _not_steps(table) if x["error_name"] == NLOF) == 3  # the chart: the broker's only


def test_the_writers_stored_sums_count_the_same_errors(make_df) -> None:
    """The pyarrow twin (recording.request_sums) leaves the injected errors out as Spark's rollup does."""
    rows = _rows()
    schema = arrow_schema("requests")
    table = pa.Table.from_pylist([{k: v for k, v in row.items() if k in schema.names} for row in rows], schema=schema)
    measures = ["requests_with_errors", "requests_retriable", "protocol_steps"]  # (the rows' ns stand for µs here)
    stored = request_sums(table).select(measures).to_pylist()
    spark = request_rollup(prepare_requests(make_df("requests", rows))).collect()
    for measure in measures:
        assert sum(x[measure] for x in stored) == sum(x[measure] for x in spark), measure
    assert sum(x["requests_retriable"] for x in stored) == 4


EDITS = [None, "", "fault#1 error=NOT_LEADER_OR_FOLLOWER in-place", "fault#2 error=NOT_COORDINATOR rewrite",
         "fault#2 error=NOT_COORDINATOR rewrite (not applied)", "fault#3 delay=100ms", "fault#9 drop",
         "fault#3 delay=100ms; fault#4 error=UNKNOWN_CODE_999 in-place", "fault#1 throttle=50ms; fault#2 error=NONE_X rewrite",
         "fault pause=20ms", "rewrote 3 broker addresses",
         # the note's later parts (proxy.kafka_faults): the topics a filtered rule matched, the broker's own refusal
         "fault#6 error=NOT_LEADER_OR_FOLLOWER in-place on=orders,payments",
         "fault#7 error=NOT_ENOUGH_REPLICAS rewrite on=orders broker-error=MESSAGE_TOO_LARGE"]


def test_both_engines_read_the_same_injected_names_from_edit(spark) -> None:
    df = spark.createDataFrame([(i, e) for i, e in enumerate(EDITS)], "i int, edit string")
    got = {r["i"]: set(r["names"]) for r in df.select("i", spark_injected_names(df["edit"]).alias("names")).collect()}
    assert got == {i: set(injected_error_names(e)) for i, e in enumerate(EDITS)}
    assert got[2] == {NLOF} and got[4] == set() and got[7] == {"UNKNOWN_CODE_999"}
    assert got[11] == {NLOF} and got[12] == {"NOT_ENOUGH_REPLICAS"}


def _throttled_rows() -> list[dict]:
    """A client kafkatap throttled with a `throttle=` fault, and one a broker quota throttled."""
    return [
        req("t", 1, "Produce", t_s=1, client="faulted", throttle_ms=700, edit="fault#4 throttle=700ms"),
        req("t", 2, "Produce", t_s=2, client="faulted", throttle_ms=700, edit="fault#3 delay=100ms; fault#4 throttle=700ms"),
        # the response edit failed: the 250 ms are the broker's own
        req("t", 3, "Produce", t_s=3, client="faulted", throttle_ms=250, edit="fault#4 throttle=700ms (not applied)"),
        req("q", 1, "Produce", t_s=1, client="quota", throttle_ms=120),
        req("q", 2, "Produce", t_s=2, client="quota", throttle_ms=80, edit="fault#5 delay=5ms"),
        req("q", 3, "Produce", t_s=3, client="quota"),
    ]


def test_injected_throttles_are_not_broker_quotas_in_either_engine(make_df) -> None:
    """A `throttle=` fault's 700 ms were counted as the broker's quota throttling: the `throttling` table listed them and
    the finding said "Brokers throttled 1 client(s) for 1.4 s in total" of a broker without quotas."""
    rows = _throttled_rows()
    spark = {x["client_id"]: x for x in request_rollup(prepare_requests(make_df("requests", rows))).collect()}
    assert (spark["faulted"]["throttled_requests"], spark["faulted"]["throttle_ms"]) == (1, 250)
    assert (spark["quota"]["throttled_requests"], spark["quota"]["throttle_ms"]) == (2, 200)
    schema = arrow_schema("requests")
    table = pa.Table.from_pylist([{k: v for k, v in row.items() if k in schema.names} for row in rows], schema=schema)
    measures = ["throttled_requests", "throttle_ms", "max_throttle_ms"]  # (the rows' ns stand for µs here: no timestamps)
    stored = {x["client_id"]: x for x in request_sums(table).select(["client_id", *measures]).to_pylist()}
    for client, row in spark.items():
        for m in measures:
            assert stored[client][m] == row[m], (client, m)
    assert {x["client_id"]: x["total_throttle_ms"] for x in errors.throttling(request_rollup(
        prepare_requests(make_df("requests", rows)))).collect()} == {"faulted": 250, "quota": 200}


def test_both_engines_read_the_same_injected_throttles_from_edit(spark) -> None:
    from analytics.transforms.injected import injected_throttle as spark_injected_throttle
    from recording.fault_notes import injected_throttle

    edits = [*EDITS, "fault#1 throttle=50ms", "fault#1 throttle=50ms (not applied)", "fault#12 delay=5ms; fault#13 throttle=9ms",
             "throttle=50ms by a user's note"]
    df = spark.createDataFrame([(i, e) for i, e in enumerate(edits)], "i int, edit string")
    got = {r["i"]: r["t"] for r in df.select("i", spark_injected_throttle(df["edit"]).alias("t")).collect()}
    assert got == {i: injected_throttle(e) for i, e in enumerate(edits)}
    assert [i for i, t in got.items() if t] == [edits.index("fault#1 throttle=50ms; fault#2 error=NONE_X rewrite"),
                                               len(EDITS), len(EDITS) + 2]


T = dt.datetime(2026, 11, 20, 9, 0)


def _table_row(name: str, n: int, injected: bool, kind: str = "retriable", api: str = "Produce") -> dict:
    return {"error_name": name, "kind": kind, "api_name": api, "topic": "orders", "client_id": "kp-prod-orders", "count": n,
            "connections": 1, "first_seen": T, "last_seen": T + dt.timedelta(seconds=21), "example_conn_id": "c1",
            "max_request_bytes": 2_000_000, "acks": [-1], "injected": injected}


def test_injected_errors_make_no_hotspot_and_no_oversize_rejection() -> None:
    t = {"overview": [{"requests": 3900}], "errors_by_name": [_table_row(NLOF, 57, True)]}
    assert error_hotspot(t) == []  # the audit's warning: 57 injected NLOF over 21 s read as a broker in trouble
    mixed = {"overview": [{"requests": 3900}], "errors_by_name": [_table_row(NLOF, 57, True), _table_row(NLOF, 12, False)]}
    [f] = error_hotspot(mixed)
    assert f.title.startswith("12 × NOT_LEADER_OR_FOLLOWER") and f.evidence["injected_not_counted"] == 57
    assert "57 more injected by kafkatap" in f.summary, f.summary
    too_large = [_table_row("MESSAGE_TOO_LARGE", 3, True, kind="error")]
    assert produce_rejected_too_large({"errors_by_name": too_large}) == []
    assert len(produce_rejected_too_large({"errors_by_name": too_large + [_table_row("MESSAGE_TOO_LARGE", 1, False, kind="error")]})) == 1
