"""Transforms on small explicit DataFrames (one shared SparkSession)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import functions as F

from analytics.findings.resets import idle_resets_not_from_broker, reconnect_storm
from analytics.findings.surge import connection_surge
from analytics.findings.tcp_window import window_scaling_off
from analytics.job import summary
from analytics.result import AnalysisResult
from analytics.transforms import clients, compare, connections, drilldown, errors, latency, overview, produce_fetch, tcp
from analytics.transforms.common import percentiles_by, prepare_requests
from analytics.transforms.cube import REQUEST_VIEWS, TOPIC_VIEWS, _bin, latency_cube, tail_floor, view_values
from analytics.transforms.rollups import request_rollup, topic_rollup, traffic_over_time
from analytics.synthetic import tcp_info
from analytics_rows import S, T0, conn, req

pytestmark = pytest.mark.spark


def by(rows, key):
    return {r[key]: r for r in (x.asDict(recursive=True) for x in rows)}


def test_long_poll_is_separated(make_df) -> None:
    r = prepare_requests(make_df("requests", [
        req("c1", 1, "Fetch", lat_us=500_300, broker_latency_us=500_100, max_wait_ms=500, record_bytes=0),
        req("c1", 2, "Fetch", lat_us=3000, max_wait_ms=500, record_bytes=9000),
        req("c1", 3, "Fetch", lat_us=600_000, broker_latency_us=599_000, max_wait_ms=500, record_bytes=50_000),  # slow, with data
    ]))
    labels = [x.api_label for x in r.orderBy("correlation_id").collect()]
    assert labels == ["Fetch (long poll)", "Fetch", "Fetch"]


def test_share_fetch_long_polls_have_their_own_label_and_stay_out_of_real_latency(make_df) -> None:
    """KIP-932: a share consumer's ShareFetch that only waited is a long poll, never a Fetch's nor real latency."""
    wait = {"max_wait_ms": 500, "broker_latency_us": 500_100, "lat_us": 500_300, "record_bytes": 0}
    r = prepare_requests(make_df("requests", [
        req("s1", 1, "ShareFetch", client="sh", **wait),
        req("s1", 2, "ShareFetch", client="sh", lat_us=3000, max_wait_ms=500, record_bytes=700),
        req("c1", 3, "Fetch", client="c", **wait),
    ]))
    assert [x.api_label for x in r.orderBy("correlation_id").collect()] == ["ShareFetch (long poll)", "ShareFetch",
                                                                           "Fetch (long poll)"]
    cube = latency_cube(r, 60)
    assert set(by(latency.cube_latency_by_api(cube).collect(), "api_label")) == {
        "ShareFetch (long poll)", "ShareFetch", "Fetch (long poll)"}
    assert {k: v["count"] for k, v in by(latency.cube_latency_by_client(cube).collect(), "client_id").items()} == {"sh": 1}
    lp = by(latency.long_polls_by_client(request_rollup(r), cube).collect(), "client_id")
    assert {k: (v["fetches"], v["long_polls"]) for k, v in lp.items()} == {"sh": (2, 1), "c": (1, 1)}
    a = make_df("requests", [req("a1", 5, "ShareFetch", client="sh", **wait), req("a1", 6, "ShareFetch", client="sh", lat_us=2000)])
    b = make_df("requests", [req("r1", 100 + i, "ShareFetch", client="sh", t_s=5000 + i, lat_us=1500) for i in range(2)])
    m = compare.match_requests(prepare_requests(a), prepare_requests(b), "sequence")
    api = by(compare.compare_by_api(m).collect(), "api_name")
    assert {k: v["matched"] for k, v in api.items()} == {"ShareFetch (long poll)": 1, "ShareFetch": 1}


def test_latency_cube_percentiles_match_exact_within_bin(make_df) -> None:
    rows = [req("c1", i, "Produce", t_s=i, lat_us=1000 + i * 10) for i in range(1, 101)]  # 1010 … 2000 µs
    r = prepare_requests(make_df("requests", rows))
    cube = latency_cube(r, 60)
    t = by(latency.cube_latency_by_api(cube).collect(), "api_label")["Produce"]
    assert t["count"] == 100 and t["max_us"] == 2000
    assert 1500 <= t["p50_us"] <= 1500 * 1.02 + 10
    assert 1990 <= t["p99_us"] <= 2000
    assert t["mean_us"] == pytest.approx(1505.0)
    exact = by(percentiles_by(r, ["api_label"], "latency_us").collect(), "api_label")["Produce"]  # percentile_approx agrees
    assert abs(exact["p50_us"] - t["p50_us"]) <= 40
    over = latency.cube_latency_over_time(cube).where("api_name = '(all)'").collect()
    assert sum(x["count"] for x in over) == 100 and len(over) == 2  # 1..59 s and 60..100 s


def test_latency_views_exclude_long_polls_but_api_view_keeps_them(make_df) -> None:
    r = prepare_requests(make_df("requests", [
        req("c1", 1, "Fetch", lat_us=500_000, broker_latency_us=499_990, max_wait_ms=500, record_bytes=0),
        req("c1", 2, "Produce", lat_us=2000, client="p", topics=["t"]),
    ]))
    cube = latency_cube(r, 60)
    assert set(by(latency.cube_latency_by_api(cube).collect(), "api_label")) == {"Fetch (long poll)", "Produce"}
    assert by(latency.cube_latency_by_broker(cube).collect(), "broker_addr")["10.0.0.1:9092"]["max_us"] == 2000
    assert set(by(latency.cube_latency_by_client(cube).collect(), "client_id")) == {"p"}
    topic = latency.cube_latency_by_topic(cube).collect()
    assert [(x.topic, x.api_name) for x in topic] == [("t", "Produce")]
    proxy = by(latency.cube_proxy_delay_by_api(cube).collect(), "api_name")
    assert proxy["Produce"]["p50_us"] == 20
    lp = by(latency.long_polls_by_client(request_rollup(r), cube).collect(), "client_id")["app-1"]
    assert (lp["fetches"], lp["long_polls"], lp["long_poll_ratio"], lp["max_wait_ms"]) == (1, 1, 1.0, 500)
    assert 499_990 <= lp["median_wait_us"] <= 499_990 * 1.02


def test_client_inventory_roles_and_order(make_df) -> None:
    r = prepare_requests(make_df("requests", [
        req("c1", 1, "ApiVersions", client="prod"),
        *[req("c1", i, "Produce", t_s=i, client="prod", topics=["orders"]) for i in range(2, 12)],
        req("c2", 1, "Fetch", client="cons", topics=["orders"], client_addr="10.1.0.6:1"),
        req("c2", 2, "JoinGroup", client="cons", client_addr="10.1.0.6:1", group_id="g"),
        req("c3", 1, "CreateTopics", client="adm", client_addr="10.1.0.7:1", topics=["new"]),
    ]))
    c = make_df("connections", [conn("c1", 0, 20, client="prod", client_software_name="librdkafka", client_software_version="2.4.0")])
    inv = [x.asDict() for x in clients.client_inventory(request_rollup(r), topic_rollup(r), c).collect()]
    assert inv[0]["client_id"] == "prod"  # busiest first
    roles = {x["client_id"]: x["role"] for x in inv}
    assert roles == {"prod": "producer", "cons": "consumer, group member", "adm": "admin"}
    assert inv[0]["software_name"] == "librdkafka" and inv[0]["topics_produced"] == ["orders"] and inv[0]["records_produced"] == 100
    assert inv[0]["records_produced_per_s"] == 9.09  # 100 records produced over 11 s (ApiVersions at 0 s, the last Produce at 11 s)
    tv = by(clients.topic_view(topic_rollup(r)).collect(), "topic")["orders"]
    assert tv["producers"] == ["prod"] and tv["consumers"] == ["cons"]


def test_client_inventory_names_the_brokers_own_connections(make_df) -> None:
    """The brokers also talking through the listener: a client sending only what brokers send is "broker" (and the
    inventory finding does not count it as a client); an Admin aborting a transaction stays an admin."""
    r = prepare_requests(make_df("requests", [
        req("m1", 1, "ApiVersions", client="broker-1-txn-marker-sender"),
        req("m1", 2, "WriteTxnMarkers", client="broker-1-txn-marker-sender"),
        req("f1", 1, "Fetch", client="broker-2-fetcher-0", client_addr="10.0.0.2:1", topics=["orders"]),
        req("f1", 2, "OffsetForLeaderEpoch", client="broker-2-fetcher-0", client_addr="10.0.0.2:1"),
        req("v1", 1, "AddPartitionsToTxn", client="broker-3-verifier", client_addr="10.0.0.3:1"),
        req("s1", 1, "ReadShareGroupState", client="persister", client_addr="10.0.0.3:2"),
        req("a1", 1, "Metadata", client="admin-abort", client_addr="10.1.0.9:1"),
        req("a1", 2, "WriteTxnMarkers", client="admin-abort", client_addr="10.1.0.9:1"),
        req("t1", 1, "InitProducerId", client="txn", client_addr="10.1.0.8:1"),
        req("t1", 2, "AddPartitionsToTxn", client="txn", client_addr="10.1.0.8:1"),
        req("t1", 3, "Produce", client="txn", client_addr="10.1.0.8:1", topics=["orders"]),
        req("c1", 1, "Fetch", client="app", client_addr="10.1.0.7:1", topics=["orders"]),
    ]))
    inv = [x.asDict() for x in clients.client_inventory(request_rollup(r), topic_rollup(r), make_df("connections", [])).collect()]
    roles = {x["client_id"]: x["role"] for x in inv}
    assert roles == {"broker-1-txn-marker-sender": "broker", "broker-2-fetcher-0": "broker", "broker-3-verifier": "broker",
                     "persister": "broker", "admin-abort": "other", "txn": "producer", "app": "consumer"}
    from analytics.findings.inventory import client_inventory as finding
    (f,) = finding({"client_inventory": inv})
    assert f.title.startswith("3 clients") and f.evidence["brokers_own"] == 4
    assert "Not counted: 4 of the brokers' own clients" in f.summary
    (only,) = finding({"client_inventory": [x for x in inv if x["role"] == "broker"]})  # a listener only brokers use
    assert only.title == "No clients; 4 of the brokers' own clients only" and only.evidence["clients"] == 0
    tv = by(clients.topic_view(topic_rollup(r)).collect(), "topic")["orders"]
    assert tv["consumers"] == ["app"] and tv["producers"] == ["txn"]  # the follower replicates: it reads nothing


def test_errors_and_throttling(make_df) -> None:
    e = [{"code": 10, "name": "MESSAGE_TOO_LARGE", "topic": "big", "partition": 0, "resource": None}]
    r = prepare_requests(make_df("requests", [
        req("c1", 1, "Produce", t_s=5, errors=e, error_count=1, request_bytes=2_000_000, acks=1, topics=["big"]),
        req("c1", 2, "Produce", t_s=70, errors=e, error_count=1, request_bytes=1_500_000, acks=1, topics=["big"]),
        req("c1", 3, "Produce", t_s=80, throttle_ms=250),
    ]))
    rows = [x.asDict() for x in errors.errors_by_name(r).collect()]
    assert len(rows) == 1
    row = rows[0]
    assert (row["error_name"], row["api_name"], row["topic"], row["count"], row["max_request_bytes"]) == ("MESSAGE_TOO_LARGE", "Produce", "big", 2, 2_000_000)
    assert row["example_conn_id"] == "c1" and row["acks"] == [1]
    assert [x["count"] for x in errors.errors_over_time(r, 60).collect()] == [1, 1]
    th = errors.throttling(request_rollup(r)).collect()
    assert th[0]["total_throttle_ms"] == 250


def test_overview(make_df) -> None:
    r = prepare_requests(make_df("requests", [req("c1", 1, t_s=0), req("c1", 2, t_s=10, lat_us=None)]))
    c = make_df("connections", [conn("c1", 0, 20)])
    o = overview.overview(request_rollup(r), c).collect()[0]
    assert o["requests"] == 2 and o["unanswered"] == 1 and o["connections"] == 1 and o["span_s"] == 20.0
    assert o["request_connections"] == 1
    two = prepare_requests(make_df("requests", [req("c1", 1, proxy_id="vm-w1"), req("c2", 1, proxy_id="vm-w2"),
                                                req("c3", 1, proxy_id="gw")]))
    o = overview.overview(request_rollup(two), c).collect()[0]
    assert (o["proxies"], o["proxy_processes"]) == (2, 3)  # vm with two workers, and gw
    # only connections relayed without decoding (TLS pass-through): their proxy and broker still count
    none = prepare_requests(make_df("requests", [req("x", 1)])).where("false")
    tls = make_df("connections", [conn("t1", 0, 5, tls=True), conn("t2", 1, 6, tls=True, broker="10.0.0.2:9093")])
    o = overview.overview(request_rollup(none), tls).collect()[0]
    assert (o["requests"], o["connections"], o["brokers"], o["proxies"]) == (0, 2, 2, 1)



def test_overview_span_is_where_the_data_meets_the_window(make_df) -> None:
    """--since/--until: a connection open all week spans the hour asked for, not the week; a wider window, the data's own span."""
    day, since_s = 86_400, 3 * 86_400
    since, until = T0 + since_s * S, T0 + (since_s + 3600) * S
    r = prepare_requests(make_df("requests", [req("week", 1, t_s=since_s + 600)]))
    week = make_df("connections", [conn("week", 0, 7 * day)])
    o = overview.overview(request_rollup(r), week, since, until).collect()[0]
    assert (o["start_ns"], o["end_ns"], o["span_s"]) == (since, until, 3600.0)
    assert overview.overview(request_rollup(r), week).collect()[0]["span_s"] == 7 * day  # no window: the data's span
    short = make_df("connections", [conn("short", since_s + 300, since_s + 1200)])
    wide = overview.overview(request_rollup(r), short, since - day * S, until + day * S).collect()[0]
    assert (wide["start_ns"], wide["end_ns"], wide["span_s"]) == (since + 300 * S, since + 1200 * S, 900.0)
    empty = overview.overview(request_rollup(r.limit(0)), week.limit(0), since, until).collect()[0]
    assert (empty["start"], empty["end"], empty["span_s"]) == (None, None, None)  # no data: no span, not the window's bounds

def _err(name: str, code: int) -> list[dict]:
    return [{"code": code, "name": name, "topic": None, "partition": None, "resource": None}]


def test_error_rate_counts_real_errors_only(make_df) -> None:
    """A first JoinGroup's MEMBER_ID_REQUIRED is no error; a coordinator still loading is retriable; worst kind wins."""
    r = prepare_requests(make_df("requests", [
        req("c1", 1, "JoinGroup", t_s=0, errors=_err("MEMBER_ID_REQUIRED", 79), error_count=1, group_id="g"),
        req("c1", 2, "Heartbeat", t_s=1, errors=_err("REBALANCE_IN_PROGRESS", 27), error_count=1, group_id="g"),
        req("c1", 3, "FindCoordinator", t_s=2, errors=_err("COORDINATOR_NOT_AVAILABLE", 15), error_count=1),
        req("c1", 4, "Produce", t_s=3, errors=_err("NOT_LEADER_OR_FOLLOWER", 6) + _err("MESSAGE_TOO_LARGE", 10), error_count=2),
        req("c1", 5, "Produce", t_s=4), req("c1", 6, "Produce", t_s=5), req("c1", 7, "Produce", t_s=6),
        req("c1", 8, "Produce", t_s=7),
        req("c1", 9, "Produce", t_s=8, errors=[], error_count=1),  # a count without names: not excused
        req("c1", 10, "Heartbeat", t_s=9, errors=_err("REBALANCE_IN_PROGRESS", 27) + _err("COORDINATOR_NOT_AVAILABLE", 15),
            error_count=2, group_id="g"),  # a step and a retriable one: retriable
        req("c1", 11, "Produce", t_s=10, errors=_err("NOT_LEADER_OR_FOLLOWER", 6), error_count=1),
    ]))
    rollup = request_rollup(r)
    o = overview.overview(rollup, make_df("connections", [conn("c1", 0, 20)])).collect()[0].asDict()
    assert (o["requests_with_errors"], o["requests_retriable"], o["protocol_steps"]) == (2, 3, 2)
    assert (o["error_rate"], o["retriable_rate"]) == (0.18182, 0.27273)
    kinds = {(x["error_name"], x["api_name"]): x["kind"] for x in errors.errors_by_name(r).collect()}
    assert kinds == {("MEMBER_ID_REQUIRED", "JoinGroup"): "protocol_step", ("REBALANCE_IN_PROGRESS", "Heartbeat"): "protocol_step",
                     ("COORDINATOR_NOT_AVAILABLE", "FindCoordinator"): "retriable", ("COORDINATOR_NOT_AVAILABLE", "Heartbeat"): "retriable",
                     ("NOT_LEADER_OR_FOLLOWER", "Produce"): "retriable", ("MESSAGE_TOO_LARGE", "Produce"): "error"}
    assert {x["kind"] for x in errors.errors_over_time(r, 60).collect()} == {"protocol_step", "retriable", "error"}
    inv = clients.client_inventory(rollup, topic_rollup(r), make_df("connections", [conn("c1", 0, 20)])).collect()[0]
    assert (inv["requests_with_errors"], inv["requests_retriable"]) == (2, 3)
    clean = prepare_requests(make_df("requests", [req("c2", 1, "Produce", client="quiet")]))
    quiet = clients.client_inventory(request_rollup(clean), topic_rollup(clean), make_df("connections", [conn("c2", 0, 20)])).collect()[0]
    assert (quiet["requests_with_errors"], quiet["requests_retriable"]) == (0, 0)  # zero, not null, without any error
    acks = produce_fetch.produce_acks(rollup).collect()[0]
    assert (acks["with_errors"], acks["with_retriable_errors"]) == (2, 1)
    first = summary(AnalysisResult(Path("out"), [], o, {}, 60, Path("r.html"), Path("f.json"), {})).splitlines()[0]
    assert "error rate 18.182% (+27.273% retriable)" in first, first


def test_spark_error_kind_is_protocols(make_df, spark) -> None:
    """The Spark expression and protocol.error_kinds.error_kind agree on every known name, for every API a step names."""
    from analytics.transforms.common import error_kind as spark_kind
    from protocol.error_kinds import PROTOCOL_STEPS, error_kind
    from protocol.errors import ERROR_NAMES

    apis = sorted({a for a, _ in PROTOCOL_STEPS} | {"Produce"})
    pairs = [(a, n) for a in apis for n in sorted(set(ERROR_NAMES.values()))] + [("Produce", None)]
    df = spark.createDataFrame(pairs, "api string, name string")
    got = {(x["api"], x["name"]): x["kind"] for x in df.select("api", "name", spark_kind("api", "name").alias("kind")).collect()}
    assert got == {(a, n): error_kind(a, n) for a, n in pairs}


def test_spark_response_error_kind_is_protocols_worst(spark) -> None:
    """The request's kind in Spark SQL equals protocol.error_kinds.response_kind, including no errors and unnamed ones."""
    from analytics.transforms.common import response_error_kind
    from protocol.error_kinds import response_kind

    cases = [("Produce", []), ("JoinGroup", ["MEMBER_ID_REQUIRED"]), ("Produce", ["NOT_LEADER_OR_FOLLOWER"] * 2),
             ("Produce", ["NOT_LEADER_OR_FOLLOWER", "TOPIC_AUTHORIZATION_FAILED"]),
             ("Heartbeat", ["REBALANCE_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"]), ("Heartbeat", ["REBALANCE_IN_PROGRESS"]),
             ("OffsetCommit", ["REBALANCE_IN_PROGRESS"]), ("Produce", [None])]
    rows = [(i, api, len(names), [{"name": n} for n in names]) for i, (api, names) in enumerate(cases)]
    df = spark.createDataFrame(rows, "i int, api_name string, error_count int, errors array<struct<name: string>>")
    got = {r["i"]: r["kind"] for r in df.select("i", response_error_kind().alias("kind")).collect()}
    want = {i: response_kind(api, names) for i, (api, names) in enumerate(cases)}
    assert got == want


def test_sql_text_quotes_what_the_kind_expression_embeds(spark) -> None:
    from analytics.transforms.common import _sql_text

    for value in ("plain", "it's", "back\\slash", "both \\' at once"):
        assert spark.range(1).select(F.expr(_sql_text(value)).alias("v")).collect()[0]["v"] == value


def test_summary_says_when_connections_have_no_row_yet(make_df) -> None:
    """A proxy still running: c2's requests are written, its connection row comes at close or its first snapshot."""
    r = prepare_requests(make_df("requests", [req("c1", 1, t_s=0), req("c2", 1, t_s=1), req("c3", 1, t_s=2)]))
    o = overview.overview(request_rollup(r), make_df("connections", [conn("c1", 0, 20)])).collect()[0].asDict()
    assert (o["connections"], o["request_connections"]) == (1, 3)
    first = summary(AnalysisResult(Path("out"), [], o, {}, 60, Path("r.html"), Path("f.json"), {})).splitlines()[0]
    assert "1 connections (+2 with requests but no connection row yet" in first, first


def test_connections_over_time_concurrency_and_latency(make_df) -> None:
    cs = [conn(f"c{i}", 0, 300) for i in range(3)] + [conn(f"s{i}", 120, None) for i in range(10)]
    rs = [req("c0", 1, t_s=10, lat_us=1000), req("s1", 1, t_s=130, lat_us=9000)]
    r = prepare_requests(make_df("requests", rs))
    c = make_df("connections", cs)
    rows = [x.asDict() for x in connections.connections_over_time(c, traffic_over_time(r, 60), 60, latency_cube(r, 60)).collect()]
    conc = [x["concurrent"] for x in rows]
    assert conc == [3, 3, 13, 13, 13, 13]  # 3 long-lived, +10 at 120 s, the 3 end at 300 s (still counted in that bucket)
    assert rows[0]["opens"] == 3 and rows[2]["opens"] == 10 and rows[5]["ends"] == 3
    assert rows[0]["p99_us"] == 1000 and rows[2]["p99_us"] == 9000
    assert rows[0]["requests"] == 1 and rows[1]["requests"] == 0 and rows[0]["bytes_per_request"] == 500



def test_a_burst_of_short_connections_is_churn_not_a_surge(make_df) -> None:
    """30 connections opened and closed one after another in one bucket beside 2 long-lived ones: `concurrent` (every
    connection open at some moment) said 32, and the surge rule reported a critical surge; at most 3 were open."""
    from analytics.findings.surge import connection_surge

    cs = [conn(f"long{i}", 0, 600) for i in range(2)]
    cs += [conn(f"short{i}", 300 + i * 0.02, 300 + i * 0.02 + 0.006) for i in range(30)]
    rs = [req(f"long{i % 2}", i, t_s=5 + 20 * i, lat_us=1000 if i < 15 else 3000) for i in range(29)]
    r = prepare_requests(make_df("requests", rs))
    rows = [x.asDict() for x in connections.connections_over_time(
        make_df("connections", cs), traffic_over_time(r, 60), 60, latency_cube(r, 60)).collect()]
    assert rows[5]["concurrent"] == 32 and rows[5]["peak_concurrent"] == 3
    assert [x["peak_concurrent"] for x in rows][:5] == [2, 2, 2, 2, 2]
    assert not connection_surge({"connections_over_time": rows, "_meta": [{"bucket_s": 60}]})


def test_connections_over_time_covers_only_the_window(make_df) -> None:
    """With --since/--until the grid is the window's buckets; connections open at its start count as concurrent there.

    Opened before the window (even in its first bucket) is concurrent, not an open; closed after it is open to its end,
    not an end; a connection that ended before the window (a caller that did not filter) counts nowhere.
    """
    day, b0 = 86_400, 3 * 86_400  # the window: 30 s into bucket b0 to the last second of b0 + 9 (60 s buckets)
    since, until = T0 + (b0 + 30) * S, T0 + (b0 + 599) * S
    cs = [conn("week", 0, 7 * day), conn("never-closed", 0, None, snapshot_ns=since + 300 * S), conn("gone", 0, day),
          conn("edge", b0 + 10, b0 + 200), conn("inside", b0 + 150, b0 + 330), conn("late", b0 + 400, 5 * day)]
    r = prepare_requests(make_df("requests", [req("inside", 1, t_s=b0 + 160, lat_us=2000)]))
    rows = [x.asDict() for x in connections.connections_over_time(
        make_df("connections", cs), traffic_over_time(r, 60), 60, latency_cube(r, 60), since, until).collect()]
    assert [int(x["bucket"].timestamp()) for x in rows] == [(T0 // S) + b0 + 60 * i for i in range(10)]
    assert [x["concurrent"] for x in rows] == [3, 3, 4, 4, 3, 3, 3, 3, 3, 3]
    assert [x["peak_concurrent"] for x in rows] == [3, 3, 4, 4, 3, 3, 3, 3, 3, 3]  # "edge" ends before "inside" opens
    assert [x["opens"] for x in rows] == [0, 0, 1, 0, 0, 0, 1, 0, 0, 0]
    assert [x["ends"] for x in rows] == [0, 0, 0, 1, 0, 1, 0, 0, 0, 0]
    assert (rows[2]["requests"], rows[2]["p99_us"]) == (1, 2000)


def over_time(make_df, cs: list[dict], rs: list[dict]) -> list[dict]:
    """`connections_over_time` (60 s buckets) of these connection and request rows."""
    r = prepare_requests(make_df("requests", rs))
    return [x.asDict() for x in connections.connections_over_time(make_df("connections", cs), traffic_over_time(r, 60), 60,
                                                                  latency_cube(r, 60)).collect()]


def test_proxy_run_is_the_run_a_proxy_names_its_connections_by(make_df) -> None:
    from proxy.server import ProxyServer

    one, two = (ProxyServer(["127.0.0.1:0=127.0.0.1:9"], tcp_info=False) for _ in range(2))
    ids = [one.next_conn_id(), one.next_conn_id(), two.next_conn_id(), "c1"]
    runs = [x.run for x in make_df("connections", [conn(i, 0, 1) for i in ids]).select(connections.proxy_run().alias("run")).collect()]
    assert runs[0] == runs[1] == f"p1/{ids[0].split('-')[0]}" and runs[2] == f"p1/{ids[2].split('-')[0]}" != runs[0]
    assert runs[3] == "p1/"  # not the proxy's form: one run per proxy id


def test_a_proxy_starting_to_record_is_no_connection_surge(make_df) -> None:
    """Two proxies record into one directory, the second from 240 s: the connections it takes over open in its first bucket.
    Its conn_ids are not the proxy's `<run>-<n>`, so the proxy id alone is its run."""
    cs = [conn(f"a1b2c3-{i}", i / 10, None) for i in range(30)] + [conn(f"p2-{i}", 240 + i / 10, None, proxy_id="p2") for i in range(40)]
    rs = [req("a1b2c3-0", k, t_s=k * 60 + 5) for k in range(8)] + [req("p2-0", k, t_s=k * 60 + 5, proxy_id="p2") for k in range(4, 8)]
    rows = over_time(make_df, cs, rs)
    assert [x["concurrent"] for x in rows] == [30, 30, 30, 30, 70, 70, 70, 70]
    assert connection_surge({"connections_over_time": rows}) == []
    assert [x["recording_starts"] for x in rows] == [1, 0, 0, 0, 1, 0, 0, 0]


def test_a_proxy_restart_is_no_connection_surge(make_df) -> None:
    """One proxy id, two runs: the restart's bucket counts the first run's connections (ended in it) and the second's."""
    cs = [conn(f"a1b2c3-{i}", i / 10, 250, end_reason="proxy_shutdown", end_by="proxy") for i in range(30)]
    cs += [conn(f"0a0b0c-{i}", 255 + i / 10, None) for i in range(30)]
    rs = [req("a1b2c3-0", k, t_s=k * 60 + 5) for k in range(5)] + [req("0a0b0c-0", k, t_s=k * 60 + 5) for k in range(5, 8)]
    rows = over_time(make_df, cs, rs)
    assert [x["concurrent"] for x in rows] == [30, 30, 30, 30, 60, 30, 30, 30]
    assert connection_surge({"connections_over_time": rows}) == []
    assert [x["recording_starts"] for x in rows] == [1, 0, 0, 0, 1, 0, 0, 0]


def test_a_gap_in_the_recording_is_no_connection_surge(make_df) -> None:
    """The writer recorded nothing from 120 s to 300 s: the connections that ended meanwhile keep their last snapshot
    (open, as far as the recording knows) and the clients' new ones add to them when the recording resumes."""
    cs = [conn(f"a1b2c3-{i}", i / 10, None, snapshot_ns=T0 + 110 * S) for i in range(30)]
    cs += [conn(f"a1b2c3-{100 + i}", 300 + i / 10, None) for i in range(30)]
    rs = [req("a1b2c3-0", k, t_s=k * 60 + 5) for k in range(2)] + [req("a1b2c3-100", k, t_s=k * 60 + 5) for k in range(5, 9)]
    rows = over_time(make_df, cs, rs)
    assert [x["concurrent"] for x in rows] == [30, 30, 30, 30, 30, 60, 60, 60, 60]
    assert connection_surge({"connections_over_time": rows}) == []
    assert [x["requests"] for x in rows] == [1, 1, 0, 0, 0, 1, 1, 1, 1] and not any(x["recording_starts"] for x in rows[1:])


def test_reconnects_are_replaced_connections_not_a_clients_start(make_df) -> None:
    """A client starting up: kafka-python's bootstrap connection, closed before it opens the broker's own, one per broker and
    the coordinator's, all within a second and still open 150 s later. Beside it, incident 2's client: a connection reset
    after idle and reopened, again and again."""
    later = {"snapshot_ns": T0 + 150 * S, "duration_us": 149_000_000}
    cs = [conn("s-boot", 0, 0.1, client="orders-app")]
    cs += [conn(f"s-{b}", 0.2, None, client="orders-app", broker=f"10.0.0.{b}:9092", **later) for b in (1, 2, 3)]
    cs += [conn("s-coord", 1.0, None, client="orders-app", broker="10.0.0.2:9092", **later)]
    cs += [conn(f"r{i}", i * 100, i * 100 + 90, client="billing", end_reason="client_rst", end_by="client", idle_ms=60_000,
                client_addr=f"10.9.0.5:{3000 + i}") for i in range(6)]
    rc = by(connections.reconnects_by_client(make_df("connections", cs)).collect(), "client_id")
    storms = reconnect_storm({"reconnects_by_client": list(rc.values())})
    assert len(storms) == 1 and storms[0].evidence["clients"] == 1, [f.summary for f in storms]
    assert "billing" in storms[0].title and "orders-app" not in storms[0].summary and storms[0].evidence["reconnects"] == 5
    assert (rc["orders-app"]["connections"], rc["orders-app"]["reconnects"], rc["orders-app"]["reconnects_per_min"]) == (5, 0, 0)
    assert rc["billing"]["reconnects"] == 5



def test_replacing_connections_left_half_open_is_a_reconnect(make_df) -> None:
    """Incident 2 with a conntrack firewall on the client's side, recorded on the broker's: it drops idle state silently,
    so the client's old connections never end at the proxy (ended only by its shutdown, 2000 s in) while the client opens
    one after another to the same broker. By ended connections alone that was no reconnect. Beside it, a consumer whose
    group-coordinator connection opens 20 s after its fetch connection to the same broker, which it keeps using: none.
    A connection still open at the recording's end is quiet by its last request (the rollup) when no end says so."""
    stop = {"end_reason": "proxy_shutdown", "end_by": "proxy"}
    cs = [conn(f"fw{i}", 30 * i, 2000, client="fw-app", idle_ms=int((2000 - (30 * i + 2)) * 1000), **stop,
               client_addr=f"10.9.0.7:{4000 + i}") for i in range(10)]  # each quiet 2 s after it opened
    cs += [conn("fetch", 0.2, 2000, client="shop-consumer", idle_ms=500, **stop, client_addr="10.9.0.8:5000"),
           conn("coordinator", 20, 2000, client="shop-consumer", idle_ms=900, **stop, client_addr="10.9.0.8:5001")]
    later = {"snapshot_ns": T0 + 2000 * S, "duration_us": 1_000_000_000, "idle_ms": None}
    cs += [conn(f"live{i}", 100 * i, None, client="live-app", client_addr=f"10.9.0.9:{6000 + i}", **later) for i in range(6)]
    rs = [req(f"live{i}", 1, t_s=100 * i + 1, client="live-app") for i in range(6)]
    c = make_df("connections", cs)
    plain = by(connections.reconnects_by_client(c).collect(), "client_id")  # no rollup: quiet only by an end's idle time
    assert (plain["fw-app"]["connections"], plain["fw-app"]["reconnects"], plain["shop-consumer"]["reconnects"]) == (10, 9, 0)
    assert plain["live-app"]["reconnects"] == 0  # never ended, no requests known: not known to have gone quiet
    rc = by(connections.reconnects_by_client(c, rollup=request_rollup(prepare_requests(make_df("requests", rs)))).collect(),
            "client_id")
    assert (rc["fw-app"]["reconnects"], rc["fw-app"]["half_open_reconnects"]) == (9, 9)
    assert (rc["shop-consumer"]["reconnects"], rc["shop-consumer"]["half_open_reconnects"]) == (0, 0)
    assert (rc["live-app"]["reconnects"], rc["live-app"]["half_open_reconnects"]) == (5, 5)
    storms = reconnect_storm({"reconnects_by_client": [rc["fw-app"], rc["shop-consumer"]]})
    assert len(storms) == 1 and "fw-app" in storms[0].title and storms[0].evidence["half_open_reconnects"] == 9
    assert "9 replacing one left half-open" in storms[0].summary and "never closed" in storms[0].summary, storms[0].summary
    assert rc["fw-app"]["median_lifetime_s"] > 600  # the proxy held them till it stopped: no test of short lives applies


def test_a_proxy_restart_is_no_reconnect_storm(make_df) -> None:
    """A consumer of a three-broker cluster (a connection per broker and one to its coordinator) recorded over three
    runs of a proxy, restarted every 200 s: each stop closes the four (proxy_shutdown) and the client opens them again
    on the next run. Those are the recording's restarts, not reconnects of the client's; the storm beside it still is."""
    cs = []
    for run in range(3):
        t0, t1 = run * 201, run * 201 + 200
        last = run == 2
        kw = {"end_reason": "proxy_shutdown", "end_by": "proxy"} if not last else {}
        cs += [conn(f"run{run}-b{b}", t0 + 0.2, None if last else t1, client="ledger-java", broker=f"10.0.0.{b}:9092",
                    **kw, **({"snapshot_ns": T0 + 600 * S} if last else {})) for b in (1, 2, 3)]
        cs += [conn(f"run{run}-coord", t0 + 1.0, None if last else t1, client="ledger-java", broker="10.0.0.2:9092",
                    **kw, **({"snapshot_ns": T0 + 600 * S} if last else {}))]
    cs += [conn(f"r{i}", i * 100, i * 100 + 90, client="billing", end_reason="client_rst", end_by="client", idle_ms=60_000,
                client_addr=f"10.9.0.5:{3000 + i}") for i in range(6)]
    rc = by(connections.reconnects_by_client(make_df("connections", cs)).collect(), "client_id")
    assert (rc["ledger-java"]["connections"], rc["ledger-java"]["reconnects"]) == (12, 0)
    storms = reconnect_storm({"reconnects_by_client": list(rc.values())})
    assert len(storms) == 1 and "billing" in storms[0].title and "ledger-java" not in storms[0].summary, storms[0].summary


def test_connection_ends_resets_reconnects(make_df) -> None:
    cs = [conn(f"r{i}", i * 100, i * 100 + 90, client="billing", end_reason="client_rst", end_by="client", idle_ms=60_000,
               client_addr=f"10.9.0.5:{3000 + i}") for i in range(6)]
    cs += [conn("b1", 0, 5, client="bulk", end_reason="broker_fin", end_by="broker", idle_ms=1, last_api="Produce",
                last_request_acks=0, last_request_bytes=3_000_000, last_request_topics=["t"], unanswered=0)]
    c = make_df("connections", cs)
    ends = {(x.end_reason, x.end_by): x for x in connections.connection_ends(c).collect()}
    assert ends[("client_rst", "client")]["connections"] == 6 and ends[("client_rst", "client")]["median_idle_ms"] == 60_000
    assert len(connections.resets(c).collect()) == 6
    rc = by(connections.reconnects_by_client(c).collect(), "client_id")["billing"]
    assert rc["connections"] == 6 and rc["reconnects"] == 5 and rc["resets_not_by_broker"] == 6
    assert rc["reconnects_per_min"] == pytest.approx(5 / (590 / 60), rel=0.01)
    bc = connections.broker_closes(c).collect()
    assert [(x.conn_id, x.last_request_acks, x.last_request_bytes) for x in bc] == [("b1", 0, 3_000_000)]
    r = prepare_requests(make_df("requests", [req("b1", 1, lat_us=None, status="no_response", acks=0)]))
    assert [x.conn_id for x in connections.unanswered_at_close(c, request_rollup(r)).collect()] == ["b1"]
    life = by(connections.connection_lifetimes(c).collect(), "lifetime")
    assert life["1–10 min"]["connections"] == 6 and life["1–10 s"]["connections"] == 1


def _cut_by_a_window() -> list[dict]:
    """Connections of app-1 around the window [1000 s, 2000 s]: ended before it, across its start, inside it, across its
    end, open all along (ended days later), never closed (last snapshot after it) and opened after it."""
    return [conn("week", 0, 10_000), conn("gone", 0, 500, end_reason="broker_fin", end_by="broker"),
            conn("edge", 900, 1100, end_reason="client_rst", idle_ms=60_000, inferred_cause="reset after 60 s idle"),
            conn("inside", 1200, 1205, end_reason="broker_fin", end_by="broker"),
            conn("late", 1900, 2500, end_reason="client_rst", idle_ms=30_000),
            conn("never", 1500, None, idle_ms=None, snapshot_ns=T0 + 3000 * S, duration_us=1_500_000_000), conn("after", 2100, 2200)]


def test_connection_ends_and_lifetimes_under_a_window_are_the_windows(make_df) -> None:
    """--since/--until: ends inside the window by how they ended; the rest it sees as it stood at its end (open, aged
    until then); lifetimes likewise. Without a window both tables are the whole lives', as before."""
    since, until = T0 + 1000 * S, T0 + 2000 * S
    c = make_df("connections", _cut_by_a_window())
    ends = {(x["end_reason"], x["end_by"]): x for x in (r.asDict() for r in connections.connection_ends(c, since, until).collect())}
    assert {k: v["connections"] for k, v in ends.items()} == {("open", "none"): 3, ("client_rst", "client"): 1,
                                                             ("broker_fin", "broker"): 1}
    rst, still = ends[("client_rst", "client")], ends[("open", "none")]
    assert (rst["example_conn_id"], rst["median_idle_ms"], rst["inferred_cause"]) == ("edge", 60_000, "reset after 60 s idle")
    assert (still["median_lifetime_s"], still["max_idle_ms"], still["example_conn_id"]) == (500.0, None, None)  # ages 2000, 100, 500
    life = by(connections.connection_lifetimes(c, since, until).collect(), "lifetime")
    assert {k: (v["connections"], v["reset"], v["still_open"]) for k, v in life.items()} == {
        "1–10 s": (1, 0, 0), "1–10 min": (3, 1, 2), "10–60 min": (1, 0, 1)}  # edge; late and never; week aged 2000 s
    whole = {(x.end_reason, x.end_by, x.inferred_cause): x.connections for x in connections.connection_ends(c).collect()}
    assert whole == {("client_fin", "client", ""): 2, ("broker_fin", "broker", ""): 2, ("client_rst", "client", ""): 1,
                     ("client_rst", "client", "reset after 60 s idle"): 1, ("open", "none", ""): 1}
    life = by(connections.connection_lifetimes(c).collect(), "lifetime")
    assert {k: (v["connections"], v["reset"], v["still_open"]) for k, v in life.items()} == {
        "1–10 s": (1, 0, 0), "1–10 min": (3, 1, 0), "10–60 min": (2, 1, 1), "1–24 h": (1, 0, 0)}
    since_only = {(x.end_reason, x.end_by, x.inferred_cause): x.connections for x in connections.connection_ends(c, since, None).collect()}
    assert since_only == {**whole, ("broker_fin", "broker", ""): 1}  # no end of the window: only the end before it ("gone") goes


def test_reconnects_under_a_window_are_the_windows(make_df) -> None:
    """Incident 2's client reconnecting every 100 s, beside a connection of its open all week: a one-hour-like window counts
    the reconnects, resets and time inside it, so the storm's rate is its own, not one diluted over the week. Across the
    window's start the first reopen follows an end before it (not one the window sees): not counted, as documented."""
    since, until = T0 + 1000 * S, T0 + 2000 * S
    cs = [conn(f"r{i}", i * 100, i * 100 + 90, client="billing", end_reason="client_rst", end_by="client", idle_ms=60_000,
               client_addr=f"10.9.0.5:{3000 + i}") for i in range(30)]
    cs += [conn("long", 0, 7 * 86_400, client="billing", broker="10.0.0.2:9092", client_addr="10.9.0.5:2999")]
    cs += [conn(f"pool{i}", 500 + i, 5000, client="billing", broker="10.0.0.3:9092", client_addr=f"10.9.0.5:{2990 + i}")
           for i in range(3)]  # opened in r5's minute before the window, open all through it: none of its opens
    c = make_df("connections", cs)
    rc = by(connections.reconnects_by_client(c, since_ns=since, until_ns=until).collect(), "client_id")["billing"]
    # opened inside: r10 (at the start) … r20 (at the end); reconnects r11 … r20; resets r10 … r19 (r20 ends after it)
    assert (rc["connections"], rc["reconnects"], rc["resets"], rc["resets_not_by_broker"]) == (11, 10, 10, 10)
    assert rc["reconnects_per_min"] == pytest.approx(10 / (1000 / 60), abs=0.001)  # over the 1000 s of the window
    assert (rc["median_lifetime_s"], rc["median_idle_before_end_ms"], rc["max_opens_per_interval"]) == (90.0, 60_000, 1)
    storms = reconnect_storm({"reconnects_by_client": [rc]})
    assert len(storms) == 1 and storms[0].evidence["reconnects"] == 10, [f.summary for f in storms]
    whole = by(connections.reconnects_by_client(c).collect(), "client_id")["billing"]  # no window: the whole week's, as before
    assert (whole["connections"], whole["reconnects"], whole["resets"], whole["max_opens_per_interval"]) == (34, 29, 30, 4)
    assert whole["reconnects_per_min"] == pytest.approx(29 / (7 * 1440), abs=0.001)


def test_connection_lists_and_overview_under_a_window_are_the_windows(make_df) -> None:
    """--since/--until: resets, broker closes and unanswered-at-close list the ends inside the window (one after it was
    open at its end, one before it is not seen), so idle_resets_not_from_broker counts the window's resets only; the
    overview counts every connection the window sees and the ends inside it; opaque connections are every one it sees,
    last seen as at its end. Without a window every table is the whole lives', as before."""
    since, until = T0 + 1000 * S, T0 + 2000 * S
    tls = "request stream opaque at offset 0: tls: TLS ClientHello/handshake (0x16 0x03 0x01): the connection is encrypted"
    unanswered = {"gone": 1, "inside": 2, "late": 4, "never": 3}  # at their end; "never"'s in flight at its last snapshot
    cs = [{**x, "unanswered": unanswered.get(x["conn_id"], 0)} for x in _cut_by_a_window()]
    cs[0].update(tls=True, opaque=True, opaque_reason=tls)  # "week": TLS pass-through, open all through the window
    cs += [conn("stopped", 1500, None, idle_ms=None, snapshot_ns=T0 + 1800 * S, unanswered=5)]  # last snapshot inside it
    c = make_df("connections", cs)
    r = prepare_requests(make_df("requests", [req("inside", 1, t_s=1201)]))

    def ids(df) -> list[str]:
        return [x.conn_id for x in df.collect()]

    windowed = [x.asDict() for x in connections.resets(c, since_ns=since, until_ns=until).collect()]
    assert [x["conn_id"] for x in windowed] == ["edge"]  # "late" is reset after the window
    assert ids(connections.broker_closes(c, since_ns=since, until_ns=until)) == ["inside"]  # "gone" closed before it
    # "late" ended and "never" was snapshot after it: what they had in flight at its end is not known
    assert ids(connections.unanswered_at_close(c, request_rollup(r), since_ns=since, until_ns=until)) == ["stopped", "inside"]
    found = idle_resets_not_from_broker({"resets": windowed})
    assert len(found) == 1 and found[0].evidence["resets"] == 1 and found[0].severity == "warning"
    assert [e["conn_id"] for e in found[0].examples] == ["edge"]
    o = overview.overview(request_rollup(r), c, since, until).collect()[0]
    # seen: week, edge, inside, late, never, stopped; ended inside: edge, inside
    assert (o["connections"], o["connections_ended"], o["opaque_connections"], o["tls_connections"]) == (6, 2, 1, 1)
    op = connections.opaque_connections(c, since, until).collect()
    assert [(x.kind, x.connections, x.example_conn_id) for x in op] == [("tls", 1, "week")]
    assert (op[0]["last_seen"] - op[0]["first_opened"]).total_seconds() == 2000  # opened at 0, as at the window's end

    # no window: the whole lives' (every row as recorded)
    assert ids(connections.resets(c)) == ["edge", "late"]
    assert ids(connections.broker_closes(c)) == ["gone", "inside"]
    assert ids(connections.unanswered_at_close(c, request_rollup(r))) == ["stopped", "late", "never", "inside", "gone"]
    whole = idle_resets_not_from_broker({"resets": [x.asDict() for x in connections.resets(c).collect()]})
    assert whole[0].evidence["resets"] == 2
    o = overview.overview(request_rollup(r), c).collect()[0]
    assert (o["connections"], o["connections_ended"], o["opaque_connections"]) == (8, 6, 1)
    whole_op = connections.opaque_connections(c).collect()[0]
    assert (whole_op["last_seen"] - whole_op["first_opened"]).total_seconds() == 10_000  # its close, long after the window


def test_tcp_window_ceiling(make_df, spark) -> None:
    cs = [conn("slow", 0, 100, tcp_client_open=tcp_info(False, 180_000, timestamps=False), tcp_broker_open=tcp_info(True, 300),
               tcp_client_close=tcp_info(False, 180_000, retrans=4), bytes_from_broker=30_000_000),
          conn("fast", 0, 100, tcp_client_open=tcp_info(True, 500), tcp_broker_open=tcp_info(True, 300))]
    c = make_df("connections", cs)
    t = make_df("tcp", [])
    sides = tcp.tcp_sides(c, t)
    health = by(tcp.tcp_health(sides).collect(), "side")
    assert health["client"]["without_window_scaling"] == 1 and health["client"]["without_timestamps"] == 1
    assert health["broker"]["without_window_scaling"] == 0
    big = req("slow", 1, "Fetch", lat_us=2_000_000, response_bytes=1_000_000, resp_first_ns=T0, resp_last_ns=T0 + int(2.9 * S))
    r = prepare_requests(make_df("requests", [big]))
    wc = [x.asDict() for x in tcp.window_ceiling(sides, request_rollup(r)).collect()]
    assert len(wc) == 1 and wc[0]["conn_id"] == "slow" and wc[0]["side"] == "client"
    assert wc[0]["ceiling_bytes_per_s"] == pytest.approx(65535 / 0.18, rel=0.01)
    assert wc[0]["avg_bytes_per_s"] == pytest.approx(300_000, rel=0.01)
    # the Fetch's read from the broker (345 kB/s) is the broker socket's leg, not this client socket's: the average it is
    assert wc[0]["peak_bytes_per_s"] is None and wc[0]["utilisation"] == pytest.approx(300_000 / (65535 / 0.18), abs=0.001)
    assert wc[0]["retrans_total"] == 4 and wc[0]["above_ceiling"] is False
    assert {x.peer for x in tcp.tcp_rtt_by_peer(sides).collect()} == {"10.1.0.5", "10.0.0.1:9092"}


def test_window_ceiling_measures_the_capped_socket_not_the_other_leg(make_df) -> None:
    """`scenario run no-window-scaling`: a client socket without window scaling, RTT 2.54 ms (ceiling 24.6 MiB/s), whose
    responses the proxy read from the broker at 1.3 GiB/s while the client took them at 1.4 MB/s. The report said "moved
    up to 1.3 GiB/s", utilisation 53, "1 running at the cap". The socket's own samples tell its rate; a client socket
    pinned by its samples still is at the cap; a rate the cap cannot carry is flagged, never counted as at the cap."""
    slow = {"wscale": False, "timestamps": False}
    cs = [conn("natted", 0, 8, tcp_client_open=tcp_info(**slow, rtt_us=2540), tcp_broker_open=tcp_info(True, 50),
               bytes_from_broker=11_200_000),
          conn("pinned", 0, 30, tcp_client_open=tcp_info(**slow, rtt_us=180_000), tcp_broker_open=tcp_info(True, 50),
               bytes_from_broker=6_000_000),
          conn("odd", 0, 10, tcp_client_open=tcp_info(True, 50), tcp_broker_open=tcp_info(**slow, rtt_us=180_000),
               bytes_from_client=1000)]
    t = [_sample("natted", 0, "open", **slow, rtt_us=2540), _sample("natted", 4, "periodic", **slow, rtt_us=2540, bytes_acked=5_600_000),
         _sample("natted", 8, "close", **slow, rtt_us=2540, bytes_acked=11_200_000),
         _sample("natted", 8.001, "close", **slow, rtt_us=2540, bytes_acked=11_265_000),  # an ack burst: too close to count
         _sample("pinned", 0, "open", **slow, rtt_us=180_000),
         _sample("pinned", 10, "periodic", **slow, rtt_us=180_000, bytes_acked=3_500_000),  # 350 kB/s of 364 kB/s
         _sample("pinned", 30, "close", **slow, rtt_us=180_000, bytes_acked=6_000_000)]
    big = {"response_bytes": 1_400_000, "resp_first_ns": T0 + S, "resp_last_ns": T0 + S + 1_000_000}  # read in 1 ms
    r = prepare_requests(make_df("requests", [req("natted", 1, "Fetch", t_s=1, **big), req("odd", 1, "Fetch", t_s=1, **big)]))
    wc = by(tcp.window_ceiling(tcp.tcp_sides(make_df("connections", cs), make_df("tcp", t)), request_rollup(r)).collect(),
            "conn_id")
    natted = wc["natted"]
    assert natted["peak_bytes_per_s"] == pytest.approx(1_400_000, rel=0.01), natted
    assert natted["utilisation"] == pytest.approx(1_400_000 / (65535 / 0.00254), abs=0.002) and not natted["above_ceiling"]
    assert wc["pinned"]["utilisation"] == pytest.approx(350_000 / (65535 / 0.18), abs=0.002)
    odd = wc["odd"]  # the broker socket read 1.4 GB/s through a 364 kB/s cap: not credible
    assert odd["side"] == "broker" and odd["above_ceiling"] is True and odd["utilisation"] is None
    rows = sorted(wc.values(), key=lambda x: -(x["utilisation"] or -1))
    (found,) = window_scaling_off({"window_ceiling": [x for x in rows if x["conn_id"] != "pinned"]})
    assert "running at the cap" not in found.title and "GiB" not in found.summary, found.summary
    assert "moved up to 1.3 MiB/s" in found.summary, found.summary
    (found,) = window_scaling_off({"window_ceiling": rows})
    assert "1 running at the cap" in found.title and found.evidence["at_ceiling"] == 1
    (found,) = window_scaling_off({"window_ceiling": [odd]})
    assert "not credible" in found.summary and "running at the cap" not in found.title, found.summary


def _sample(conn_id: str, t_s: float, phase: str, **info) -> dict:
    """One client-socket TCP_INFO sample of the `tcp` dataset."""
    return {"proxy_id": "p1", "conn_id": conn_id, "side": "client", "phase": phase, "ts_ns": T0 + int(t_s * S), **tcp_info(**info)}


def test_tcp_sides_under_a_window_are_the_windows(make_df) -> None:
    """--since/--until [1000 s, 2000 s]: RTT, retransmits and bytes come from the TCP samples inside the window (the
    open's only for a connection opened inside it, the close's only for one that ended inside it); retransmits and bytes
    are the counters' rise inside it. Without a window each socket is its whole life's, as before."""
    since, until = T0 + 1000 * S, T0 + 2000 * S
    slow = {"wscale": False, "timestamps": False}
    cs = [conn("across-start", 0, 1500, tcp_client_open=tcp_info(**slow, rtt_us=900_000),  # a bad start, days before the hour
               tcp_client_close=tcp_info(**slow, rtt_us=500, retrans=12, bytes_acked=9000), bytes_from_broker=9000),
          conn("inside", 1200, 1300, tcp_client_open=tcp_info(rtt_us=200), tcp_client_close=tcp_info(rtt_us=250, retrans=3),
               bytes_from_broker=4000),
          conn("across-end", 1800, 5000, tcp_client_open=tcp_info(rtt_us=300),
               tcp_client_close=tcp_info(rtt_us=700_000, retrans=40, bytes_acked=90_000), bytes_from_broker=90_000),
          conn("after", 2100, 2200, tcp_client_open=tcp_info(rtt_us=999_000, retrans=7))]
    t = [_sample("across-start", 0, "open", **slow, rtt_us=900_000),
         _sample("across-start", 500, "periodic", **slow, rtt_us=800_000, retrans=10, bytes_acked=5000),
         _sample("across-start", 1100, "periodic", **slow, rtt_us=400, retrans=10, bytes_acked=6000),
         _sample("across-start", 1500, "close", **slow, rtt_us=500, retrans=12, bytes_acked=9000),
         _sample("inside", 1200, "open", rtt_us=200), _sample("inside", 1300, "close", rtt_us=250, retrans=3),
         _sample("across-end", 1800, "open", rtt_us=300), _sample("across-end", 1900, "periodic", rtt_us=350, retrans=1, bytes_acked=2000),
         _sample("across-end", 3000, "periodic", rtt_us=600_000, retrans=30, bytes_acked=50_000),
         _sample("across-end", 5000, "close", rtt_us=700_000, retrans=40, bytes_acked=90_000)]
    c, samples = make_df("connections", cs), make_df("tcp", t)

    def per_conn(sides) -> dict:
        return {x.conn_id: (x.rtt_us, x.retrans_total, x.bytes_sent, x.duration_s) for x in sides.collect()}

    windowed = tcp.tcp_sides(c, samples, since, until)
    assert per_conn(windowed) == {"across-start": (500, 2, 3000, 500.0), "inside": (250, 3, 4000, 100.0),
                                  "across-end": (350, 1, 2000, 200.0)}
    health = by(tcp.tcp_health(windowed).collect(), "side")["client"]
    assert (health["connections"], health["rtt_max_us"], health["retransmits"], health["without_window_scaling"]) == (3, 500, 6, 1)
    r = prepare_requests(make_df("requests", [req("across-start", 1, "Fetch", t_s=1400)]))
    (wc,) = [x.asDict() for x in tcp.window_ceiling(windowed, request_rollup(r)).collect()]
    assert (wc["conn_id"], wc["rtt_ms"], wc["avg_bytes_per_s"], wc["retrans_total"]) == ("across-start", 0.5, 6.0, 2)
    assert max(x.rtt_p99_us for x in tcp.tcp_rtt_by_peer(windowed).collect()) == 500
    # no window: the whole lives' (every sample, the open's and the close's)
    assert per_conn(tcp.tcp_sides(c, samples)) == {"across-start": (900_000, 12, 9000, 1500.0), "inside": (250, 3, 4000, 100.0),
                                                   "across-end": (700_000, 40, 90_000, 3200.0), "after": (999_000, 7, 1000, 100.0)}


def test_produce_fetch_detail(make_df) -> None:
    r = prepare_requests(make_df("requests", [
        req("c1", 1, "Produce", t_s=0, acks=0, lat_us=None, status="no_response", compression="lz4", topics=["a"]),
        req("c1", 2, "Produce", t_s=10, acks=1, compression="lz4", topics=["a"]),
        req("c1", 3, "Produce", t_s=20, acks=-1, compression="zstd", topics=["a"]),
        req("c2", 1, "Fetch", t_s=0, client="cons", record_bytes=0, topics=["a"]),
        req("c2", 2, "Fetch", t_s=10, client="cons", record_bytes=1000, topics=["a"]),
    ]))
    acks = by(produce_fetch.produce_acks(request_rollup(r)).collect(), "acks")
    assert {k: v["requests"] for k, v in acks.items()} == {0: 1, 1: 1, -1: 1}
    comp = by(produce_fetch.produce_compression(request_rollup(r)).collect(), "compression")
    assert comp["lz4"]["requests"] == 2
    rate = by(produce_fetch.produce_rate_by_topic(topic_rollup(r)).collect(), "topic")["a"]
    assert rate["records"] == 30 and rate["records_per_s"] == 1.5
    batches = by(produce_fetch.produce_batches(topic_rollup(r), latency_cube(r, 60)).collect(), "topic")["a"]
    assert batches["requests"] == 3 and batches["compression"] == "lz4, zstd"
    f = by(produce_fetch.fetch_by_consumer(topic_rollup(r)).collect(), "client_id")["cons"]
    assert f["empty_ratio"] == 0.5 and f["bytes"] == 1000


def test_compare_wire_matching(make_df) -> None:
    a = prepare_requests(make_df("requests", [req("a1", i, "Produce", t_s=i, lat_us=3000 + i) for i in range(1, 21)]))
    b = prepare_requests(make_df("requests", [req("b1", i, "Produce", t_s=i + 0.001, lat_us=1000 + i) for i in range(1, 21)]))
    assert compare.choose_mode(a, b) == "wire"
    m = compare.match_requests(a, b, "wire")
    assert m.count() == 20
    api = by(compare.compare_by_api(m).collect(), "api_name")["Produce"]
    assert api["matched"] == 20 and api["diff_p50_us"] == 2000
    per_conn = compare.compare_by_connection(m).collect()
    assert [(x.conn_id_a, x.conn_id_b) for x in per_conn] == [("a1", "b1")]


def test_compare_wire_matching_pairs_connections_one_to_one_when_clients_share_a_client_id(make_df) -> None:
    """Four producers sharing librdkafka's default client id restart correlation ids on each connection: requests
    paired across connections (one A connection with four B connections, a 4.5 ms 'difference' through a 20 ms
    middlebox). Each A connection is now one B connection, the one most of its requests agree on."""
    import random

    sent = random.Random(7)
    at = {(c, i): 0.01 * i + 0.005 * c + sent.uniform(0, 0.004) for c in range(4) for i in range(1, 41)}

    def side(prefix: str, delay_s: float, lat: int) -> list[dict]:
        return [req(f"{prefix}{c}", i, "Produce", t_s=at[c, i] + delay_s, lat_us=lat, client="rdkafka")
                for c in range(4) for i in range(1, 41)]

    # B sees each request 20 ms after A: another connection's request of the same id is nearer in time than its twin
    a = prepare_requests(make_df("requests", side("a", 0.0, 21_000)))
    b = prepare_requests(make_df("requests", side("b", 0.020, 1_000)))
    m = compare.match_requests(a, b, "wire")
    assert m.count() == 160
    per_conn = sorted((x.conn_id_a, x.conn_id_b, x.matched) for x in compare.compare_by_connection(m).collect())
    assert per_conn == [(f"a{c}", f"b{c}", 40) for c in range(4)]
    api = by(compare.compare_by_api(m).collect(), "api_name")["Produce"]
    assert api["diff_p50_us"] == api["diff_p99_us"] == 20_000


def test_compare_sequence_matching_for_replays(make_df) -> None:
    e = [{"code": 10, "name": "MESSAGE_TOO_LARGE", "topic": "t", "partition": 0, "resource": None}]
    a = make_df("requests", [req("a1", 5 + i, "Produce", t_s=i, acks=1) for i in range(3)])
    b = make_df("requests", [req("r1", 100 + i, "Produce", t_s=5000 + i, acks=1, **({"errors": e, "error_count": 1} if i == 2 else {}))
                             for i in range(3)])
    pa_, pb = prepare_requests(a), prepare_requests(b)
    assert compare.choose_mode(pa_, pb) == "sequence"
    m = compare.match_requests(pa_, pb, "sequence")
    assert m.count() == 3
    diff = compare.compare_errors(m).collect()
    assert len(diff) == 1 and diff[0]["errors_b"] == "MESSAGE_TOO_LARGE" and diff[0]["errors_a"] == ""
    ca = make_df("connections", [conn("a1", 0, 10)])
    cb = make_df("connections", [conn("r1", 4999, 5003, end_reason="broker_fin", end_by="broker")])
    ends = compare.compare_ends(m, ca, cb).collect()
    assert ends[0]["same"] is False and ends[0]["end_reason_b"] == "broker_fin"
    assert {x.api_name: x.matched for x in compare.compare_summary(pa_, pb, m, "sequence").collect()} == {"Produce": 3}


def test_compare_ends_under_a_window_are_the_windows(make_df) -> None:
    """--compare with --since/--until [1000 s, 2000 s]: the ends compared are those inside each side's window. Two
    connections that differ only by how they ended days after it are both open at its end (the same); two that ended
    differently inside it differ. Without a window both pairs differ, as before."""
    window = (T0 + 1000 * S, T0 + 2000 * S)
    a = prepare_requests(make_df("requests", [req("a1", 1, t_s=1100), req("a2", 1, t_s=1200)]))
    b = prepare_requests(make_df("requests", [req("b1", 1, t_s=1100.001), req("b2", 1, t_s=1200.001)]))
    m = compare.match_requests(a, b, "wire")
    ca = make_df("connections", [conn("a1", 900, 1500, end_reason="client_rst", inferred_cause="reset after idle"),
                                 conn("a2", 900, 90_000, end_reason="client_rst", inferred_cause="reset after idle")])
    cb = make_df("connections", [conn("b1", 900, 1500, end_reason="broker_fin", end_by="broker"),
                                 conn("b2", 900, 90_000, end_reason="broker_fin", end_by="broker")])

    def ends(*windows) -> dict:
        return {x.conn_id_a: (x.end_reason_a, x.end_reason_b, x.inferred_cause_a, x.same)
                for x in compare.compare_ends(m, ca, cb, *windows).collect()}

    assert ends(window, window) == {"a1": ("client_rst", "broker_fin", "reset after idle", False), "a2": ("open", "open", None, True)}
    assert ends() == {"a1": ("client_rst", "broker_fin", "reset after idle", False),
                      "a2": ("client_rst", "broker_fin", "reset after idle", False)}


def test_compare_keeps_long_polls_apart(make_df) -> None:
    """A recorded Fetch that waited 500 ms for data and its replay answered at once are not 500 ms of path."""
    a = make_df("requests", [req("a1", 5 + i, "Fetch", t_s=i, lat_us=500_000, max_wait_ms=500, record_bytes=0) for i in range(3)]
                + [req("a1", 9, "Fetch", t_s=4, lat_us=2000, max_wait_ms=500)])
    b = make_df("requests", [req("r1", 100 + i, "Fetch", t_s=5000 + i, lat_us=1500, max_wait_ms=500) for i in range(4)])
    m = compare.match_requests(prepare_requests(a), prepare_requests(b), "sequence")
    api = by(compare.compare_by_api(m).collect(), "api_name")
    assert {k: v["matched"] for k, v in api.items()} == {"Fetch (long poll)": 3, "Fetch": 1}
    assert api["Fetch"]["diff_p50_us"] == 500



def test_errors_tolerate_requests_without_topics(make_df) -> None:
    """Spark 4 (ANSI) raises on element_at of an empty array; a JoinGroup error has no topics."""
    e = [{"code": 79, "name": "MEMBER_ID_REQUIRED", "topic": None, "partition": None, "resource": None}]
    r = prepare_requests(make_df("requests", [req("c1", 1, "JoinGroup", errors=e, error_count=1, topics=[])]))
    rows = [x.asDict() for x in errors.errors_by_name(r).collect()]
    assert [(x["error_name"], x["topic"]) for x in rows] == [("MEMBER_ID_REQUIRED", "")]


def test_new_group_protocols_name_their_members_and_groups(make_df) -> None:
    """KIP-848 consumers, share consumers and streams members are named as such; each group shows its protocol."""
    r = prepare_requests(make_df("requests", [
        req("c1", 1, "ConsumerGroupHeartbeat", client="k848", group_id="g-new"),
        req("c1", 2, "Fetch", client="k848", topics=["orders"]),
        req("c2", 1, "ShareGroupHeartbeat", client="sh", group_id="g-share"),
        req("c2", 2, "ShareFetch", client="sh", topics=["orders"], group_id="g-share", record_bytes=300),
        req("c3", 1, "StreamsGroupHeartbeat", client="st", group_id="g-streams"),
        req("c4", 1, "JoinGroup", client="old", group_id="g-old"),
        req("c4", 2, "OffsetCommit", client="old", group_id="g-old"),
        req("c5", 1, "OffsetFetch", client="adm", group_id="g-offsets-only"),
    ]))
    inv = clients.client_inventory(request_rollup(r), topic_rollup(r), make_df("connections", []))
    roles = {x["client_id"]: x["role"] for x in inv.collect()}
    assert roles == {"k848": "consumer, KIP-848 consumer", "sh": "share consumer", "st": "streams member",
                     "old": "group member", "adm": "other"}
    assert by(inv.collect(), "client_id")["sh"]["topics_consumed"] == ["orders"]  # a share consumer reads the topic
    groups = by(clients.group_protocols(request_rollup(r)).collect(), "group_id")
    assert {g: x["protocol"] for g, x in groups.items()} == {
        "g-new": "consumer", "g-share": "share", "g-streams": "streams", "g-old": "classic", "g-offsets-only": "unknown"}
    assert groups["g-share"]["clients"] == ["sh"] and groups["g-share"]["requests"] == 2


def test_broker_ids_come_from_the_relayed_metadata_answers(make_df) -> None:
    from analytics.transforms.brokers import broker_ids

    t0 = 1_700_000_000_000_000_000
    rows = [
        {"conn_id": "c1", "api_name": "Metadata", "req_first_ns": t0, "advertised": ["1@127.0.0.1:9093", "2@127.0.0.1:9094"]},
        {"conn_id": "c1", "api_name": "Metadata", "req_first_ns": t0 + 10**9, "advertised": ["1@127.0.0.1:9093"]},
        {"conn_id": "c2", "api_name": "FindCoordinator", "req_first_ns": t0, "advertised": ["127.0.0.1:9093"]},  # no id
        {"conn_id": "c3", "api_name": "Produce", "req_first_ns": t0, "advertised": None},
    ]
    got = [(r["address"], r["node_id"], r["answers"])
           for r in broker_ids(prepare_requests(make_df("requests", rows))).collect()]
    assert got == [("127.0.0.1:9093", 1, 2), ("127.0.0.1:9094", 2, 1)]
    # explicit mode: the broker advertises the proxy listener; connections accepted there reach 10.0.0.2:9092.
    # The listener is no broker: the broker behind it takes its row, the listener is named beside it
    conns = make_df("connections", [{"conn_id": "c1", "listener": "127.0.0.1:9094", "broker_addr": "10.0.0.2:9092"},
                                    {"conn_id": "c2", "listener": "127.0.0.1:19092", "broker_addr": "10.0.0.2:9092"}])
    got = {(r["address"], r["node_id"], tuple(r["listeners"] or ()), r["answers"])
           for r in broker_ids(prepare_requests(make_df("requests", rows)), conns).collect()}
    assert got == {("127.0.0.1:9093", 1, (), 2), ("10.0.0.2:9092", 2, ("127.0.0.1:19092", "127.0.0.1:9094"), 1)}


def test_latency_cube_equals_one_grouping_per_view(make_df) -> None:
    """Every cell of the one-pass cube equals a plain groupBy of its own view (no view's keys or values mixed up)."""
    r = prepare_requests(make_df("requests", [
        req("c1", 1, "Fetch", lat_us=500_300, broker_latency_us=500_100, max_wait_ms=500, record_bytes=0, topics=["t"]),
        req("c1", 2, "Fetch", t_s=70, lat_us=3000, broker_latency_us=2900, max_wait_ms=500, record_bytes=9000, topics=["t", "u"]),
        req("c2", 1, "Produce", t_s=5, lat_us=2000, client="p", topics=["t"], request_bytes=4096),
        req("c2", 2, "Produce", t_s=130, lat_us=40_000, client="p", topics=["u"], request_bytes=100),
        req("c2", 3, "Produce", t_s=131, lat_us=None, client="p", topics=["u"], request_bytes=1_000_000),  # unanswered
        req("c3", 1, "Metadata", lat_us=1, client="admin"),
    ]))
    values, topics = view_values(r, 60)
    expected = set()
    for rows, views in ((values, REQUEST_VIEWS), (topics, TOPIC_VIEWS)):
        for v in views:
            cells = rows.where(F.col(v.value).isNotNull()).groupBy(
                F.col(v.k1).cast("string").alias("k1"), (F.col(v.k2).cast("string") if v.k2 else F.lit("")).alias("k2"),
                _bin(F.col(v.value), v.base).alias("bin"),
            ).agg(F.count(F.lit(1)).alias("n"), F.sum(v.value).alias("s"), F.max(v.value).alias("mx"))
            expected |= {(v.dim, v.metric, x.k1, x.k2, x.bin, x.n, x.s, x.mx) for x in cells.collect()}
    got = {(x.dim, x.metric, x.k1, x.k2, x.bin, x.n, x.s, x.mx) for x in latency_cube(r, 60).collect()}
    assert got == expected
    assert {(d, m) for d, m, *_ in got} == {(v.dim, v.metric) for v in REQUEST_VIEWS + TOPIC_VIEWS}  # every view has cells


def test_clients_on_versions_kafka_4_removed_by_client_and_their_finding(make_df) -> None:
    """Connections that sent request versions Kafka 4.0 removed (KIP-896): counted in the overview, one row per client
    with every version it sent, and a finding that is critical once a broker closed some of them for it."""
    from analytics.findings.upgrade import kafka_4_removed_versions

    c = make_df("connections", [
        conn("o1", 0, 30, client="legacy-app", removed_in_kafka_4=["Produce v2"]),
        conn("o2", 5, 40, client="legacy-app", removed_in_kafka_4=["Fetch v3", "Produce v2"],
             client_software_name="kafka-python", client_software_version="1.4.7"),
        conn("o3", 6, None, client="pinned-rdkafka", removed_in_kafka_4=["OffsetCommit v1"]),
        conn("ok", 0, 40, removed_in_kafka_4=None),
        conn("ok2", 0, 40, removed_in_kafka_4=[]),
        # a follower broker's replica fetcher at an old inter-broker protocol: not a client to upgrade
        conn("f1", 0, 40, client="broker-2-fetcher-0", removed_in_kafka_4=["Fetch v3"]),
        # a 3.x broker's idle close of a pinned client's connection: served, not refused
        conn("idle", 1, 600, client="legacy-app", end_reason="broker_fin", end_by="broker", last_api="Produce",
             removed_in_kafka_4=["Produce v2"], inferred_cause="broker closed the connection after 600 s idle"),
        # a 3.x broker's restart with a Fetch v3 in flight: it had served them, the proxy named no refusal
        conn("restart", 2, 300, client="legacy-app", end_reason="broker_rst", end_by="broker", unanswered=1,
             last_api="Fetch", removed_in_kafka_4=["Fetch v3"]),
    ])
    o = overview.overview(request_rollup(prepare_requests(make_df("requests", [req("ok", 1)]))), c).collect()[0]
    assert o["removed_version_connections"] == 5
    rows = [r.asDict() for r in connections.kafka_4_upgrade(c).collect()]
    assert [(r["client_id"], r["versions"], r["connections"], r["closed_by_broker"], r["example_conn_id"]) for r in rows] == [
        ("legacy-app", ["Fetch v3", "Produce v2"], 4, 0, "o1"), ("pinned-rdkafka", ["OffsetCommit v1"], 1, 0, "o3")]
    assert rows[0]["client_software"] == ["kafka-python 1.4.7"] and rows[1]["client_software"] == []
    (found,) = kafka_4_removed_versions({"overview": [o.asDict()], "kafka_4_upgrade": rows})
    assert found.severity == "warning" and found.title.startswith("2 client(s) send request versions Kafka 4.0 removed")
    assert "legacy-app, pinned-rdkafka sent Fetch v3, OffsetCommit v1, Produce v2" in found.summary
    # a 4.x broker closed one at its Produce v2: what was a warning about the upgrade is a failure now
    closed = make_df("connections", [conn("o1", 0, 30, client="legacy-app", end_reason="broker_fin", end_by="broker",
                                          unanswered=1, last_api="Produce", removed_in_kafka_4=["Produce v2"],
                                          inferred_cause="broker closed the connection at a Produce v2 request, a version "
                                                         "Kafka 4.0 removed (a 4.x broker serves Produce from v3 on; …)")])
    (found,) = kafka_4_removed_versions({"kafka_4_upgrade": [r.asDict() for r in connections.kafka_4_upgrade(closed).collect()]})
    assert found.severity == "critical" and "the broker closed 1 of their connections" in found.title
    assert kafka_4_removed_versions({"kafka_4_upgrade": []}) == []


def test_tail_floor_bounds_the_slowest_requests(make_df) -> None:
    """The cube's tail floor is at most the n-th highest latency, so the filtered slowest list is the same list."""
    lat = [(i * 7919) % 100_000 + 50 for i in range(300)]  # spread over 50 µs … 100 ms, in no order
    rows = [req("c1", i, "Produce", t_s=i, lat_us=v) for i, v in enumerate(lat)]
    rows += [req("c2", i, "Fetch", lat_us=900_000, broker_latency_us=899_990, max_wait_ms=900, record_bytes=0) for i in range(20)]  # long polls
    r = prepare_requests(make_df("requests", rows))
    cube = latency_cube(r, 60)
    floor = tail_floor(cube, 25).collect()[0].floor_us
    assert floor is not None and 0 < floor <= sorted(lat)[-25]  # at or below the 25th highest; long polls not counted
    assert floor >= sorted(lat)[-25] / 1.02 ** 3  # and close to it: within the bin and the margin bin
    plain = [x.asDict() for x in drilldown.slowest_requests(r, 25).collect()]
    assert [x.asDict() for x in drilldown.slowest_requests(r, 25, floor_us=floor).collect()] == plain
    assert [x["latency_us"] for x in plain] == sorted(lat, reverse=True)[:25]
    assert tail_floor(cube, 301).collect()[0].floor_us is None  # fewer requests than asked for: no floor


def test_opaque_connections_by_kind_and_their_finding(make_df) -> None:
    """TLS pass-through and other undecoded connections: counted in the overview, grouped by why, and a finding."""
    from analytics.findings.opaque import opaque_connections

    tls = "request stream opaque at offset 0: tls: TLS ClientHello/handshake (0x16 0x03 0x01): the connection is encrypted"
    c = make_df("connections", [
        *[conn(f"t{i}", i, i + 30, client_ids=[], requests=0, tls=True, opaque=True, opaque_reason=tls) for i in range(3)],
        conn("g1", 5, 40, opaque=True, opaque_reason="response stream opaque at offset 77: garbage: request header is not Kafka: x"),
        conn("b1", 6, 40, opaque=True, opaque_reason="observation fell more than 1048576 bytes behind the relay; 9 bytes relayed"),
        conn("ok", 0, 40),
    ])
    o = overview.overview(request_rollup(prepare_requests(make_df("requests", [req("ok", 1)]))), c).collect()[0]
    assert (o["connections"], o["opaque_connections"], o["tls_connections"]) == (6, 5, 3)
    rows = [r.asDict() for r in connections.opaque_connections(c).collect()]
    assert [(r["kind"], r["connections"], r["example_conn_id"]) for r in rows] == [
        ("tls", 3, "t0"), ("garbage", 1, "g1"), ("observation_backlog", 1, "b1")]
    assert rows[0]["brokers"] == ["10.0.0.1:9092"] and rows[0]["bytes_from_client"] == 3000 and rows[1]["client_ids"] == ["app-1"]
    found = opaque_connections({"overview": [o.asDict()], "opaque_connections": rows})
    assert [f.severity for f in found] == ["warning", "warning"]  # 2 of 6 connections undecoded beside the TLS ones
    assert "3 of 6 connection(s) were TLS" in found[0].title and "garbage ×1, observation_backlog ×1" in found[1].title
