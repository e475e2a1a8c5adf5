"""Every finding rule: one table set that shows the problem, one that doesn't.

Rules run on the collected table rows (the job feeds them the same), so these
tests need no Spark; test_job.py runs the whole chain on a synthetic recording.
"""

from __future__ import annotations

import datetime as dt

import pytest

from analytics.findings import RULES, run_rules
from analytics.findings.base import Finding, rank, ts
from analytics.findings.compare import compare_added_latency, compare_ends_differ, compare_errors_differ, compare_few_matched
from analytics.findings.general import error_hotspot, throttled_clients
from analytics.findings.inventory import client_inventory
from analytics.findings.opaque import opaque_connections
from analytics.findings.oversize_produce import broker_closed_after_acks0_produce, produce_rejected_too_large
from analytics.findings.resets import idle_resets_not_from_broker, reconnect_storm
from analytics.findings.surge import connection_surge
from analytics.findings.tcp_window import window_scaling_off

pytestmark = pytest.mark.spark  # the analytics suite; these rule tests themselves need no JVM

T = dt.datetime(2026, 11, 20, 9, 0)


def close(conn_id: str, **kw) -> dict:
    row = {"conn_id": conn_id, "client_id": "producer-1", "broker_addr": "10.0.0.1:9092", "end_reason": "broker_fin", "end_by": "broker",
           "last_api": "Produce", "last_request_bytes": 2_000_000, "last_request_acks": 0, "last_request_topics": ["big"],
           "inferred_cause": None, "closed_at": T}
    row.update(kw)
    return row


def test_broker_closed_after_acks0_produce() -> None:
    pos = broker_closed_after_acks0_produce({"broker_closes": [close("c1"), close("c2", last_request_bytes=3_000_000)]})
    assert len(pos) == 1 and pos[0].incident == 1 and pos[0].severity == "critical"
    assert "acks=0 Produce" in pos[0].title and "big" in pos[0].title and "RecordBatchTooLarge" in pos[0].summary
    assert pos[0].evidence["max_request_bytes"] == 3_000_000 and [e["conn_id"] for e in pos[0].examples] == ["c1", "c2"]
    neg = {"broker_closes": [close("c1", last_request_acks=1), close("c2", last_api="Fetch", last_request_acks=None)]}
    assert broker_closed_after_acks0_produce(neg) == []


def test_an_acks0_producer_closed_after_minutes_of_quiet_is_no_rejected_batch() -> None:
    """connections.max.idle.ms closes a quiet log shipper's connection too, its last request an acks=0 Produce: that
    was once a critical incident-1 finding whose own summary quoted the idle cause."""
    from analytics.findings import oversize_produce
    from proxy.inference import RIGHT_AFTER_MS

    assert oversize_produce.RIGHT_AFTER_MS == RIGHT_AFTER_MS  # the analysis and the proxy call the same close "right after"
    idle = close("idle", idle_before_end_ms=600_000,
                 inferred_cause="broker closed the connection after 600 s idle (connections.max.idle.ms)")
    assert broker_closed_after_acks0_produce({"broker_closes": [idle]}) == []
    soon = close("soon", idle_before_end_ms=RIGHT_AFTER_MS)
    assert [f.evidence["connections"] for f in broker_closed_after_acks0_produce({"broker_closes": [idle, soon]})] == [1]


def test_a_broker_going_away_is_no_rejected_batch() -> None:
    """A broker stopped under steady acks=0 and acks=1 producers closes all its connections within milliseconds, the
    acks=0 producer's right after a Produce: once a critical RecordBatchTooLarge beside the broker_unreachable finding.
    Neither a close inside the outage nor one of a burst with closes incident 1 cannot explain is a rejected batch;
    several acks=0 producers rejected in the same second still are."""
    at = 1_000 * 10**9
    acks0 = close("steady-acks0", client_id="steady-acks0", last_request_bytes=322, idle_before_end_ms=40, closed_ns=at)
    acks1 = close("steady-acks1", client_id="steady-acks1", last_request_acks=1, idle_before_end_ms=40, closed_ns=at + 2_000_000)
    outage = {"broker_addr": "10.0.0.1:9092", "first_ns": at + 300_000_000, "last_ns": at + 20 * 10**9}
    assert broker_closed_after_acks0_produce({"broker_closes": [acks0], "broker_outages": [outage]}) == []
    assert broker_closed_after_acks0_produce({"broker_closes": [acks0, acks1]}) == []  # no refused connect recorded
    elsewhere = dict(outage, broker_addr="10.0.0.2:9092")  # another broker's outage, another broker's close
    other = dict(acks1, broker_addr="10.0.0.2:9092")
    assert len(broker_closed_after_acks0_produce({"broker_closes": [acks0, other], "broker_outages": [elsewhere]})) == 1
    later = dict(acks1, closed_ns=at + 3 * 10**9)  # the acks=1 producer's connection closed seconds later: no burst
    assert len(broker_closed_after_acks0_produce({"broker_closes": [acks0, later]})) == 1
    rejected = [close(f"batch-{i}", closed_ns=at + i * 100_000_000) for i in range(3)]  # three rejected in 0.2 s
    assert [f.evidence["connections"] for f in broker_closed_after_acks0_produce({"broker_closes": rejected})] == [3]


def err(name: str, api: str = "Produce", n: int = 3, **kw) -> dict:
    row = {"error_name": name, "api_name": api, "topic": "big", "client_id": "producer-1", "count": n, "first_seen": T,
           "example_conn_id": "c9", "max_request_bytes": 1_500_000, "acks": [1]}
    row.update(kw)
    return row


def test_produce_rejected_too_large() -> None:
    pos = produce_rejected_too_large({"errors_by_name": [err("MESSAGE_TOO_LARGE"), err("RECORD_LIST_TOO_LARGE", n=2)]})
    assert len(pos) == 1 and pos[0].evidence["requests"] == 5 and pos[0].evidence["acks"] == [1]
    assert "RecordBatchTooLarge" in pos[0].summary and pos[0].examples[0]["conn_id"] == "c9"
    assert produce_rejected_too_large({"errors_by_name": [err("NOT_LEADER_OR_FOLLOWER"), err("MESSAGE_TOO_LARGE", api="Fetch")]}) == []


def reset(conn_id: str, idle_ms: int, end_by: str = "client", reason: str = "client_rst") -> dict:
    return {"conn_id": conn_id, "client_id": "billing", "end_reason": reason, "end_by": end_by, "idle_before_end_ms": idle_ms, "closed_at": T}


def test_idle_resets_not_from_broker() -> None:
    rows = [reset(f"r{i}", 300_000 + i * 100) for i in range(5)]
    pos = idle_resets_not_from_broker({"resets": rows, "reconnects_by_client": [{"client_id": "billing", "reconnects_per_min": 0.2}]})
    assert len(pos) == 1 and pos[0].incident == 2
    f = pos[0]
    assert "not sent by the broker" in f.title and "5.0 min" in f.title and f.evidence["idle_clustered"] is True
    assert f.evidence["reconnects_per_min"] == {"billing": 0.2}
    # resets on busy connections are not this diagnosis
    assert idle_resets_not_from_broker({"resets": [reset("busy", 5), reset("b0", 5, end_by="broker", reason="broker_rst")]}) == []
    # a reset from the broker's side after a pause is a middlebox between the proxy and the broker, not Kafka (a FIN)
    far = [reset(f"b{i}", 4_500, end_by="broker", reason="broker_rst") for i in range(3)]
    (f,) = idle_resets_not_from_broker({"resets": far})
    assert f.evidence["end_by"] == ["broker"] and "the broker's side (between the proxy and the broker)" in f.summary


def test_reconnect_storm() -> None:
    row = {"client_id": "billing", "client_host": "10.9.0.5", "connections": 30, "reconnects": 29, "reconnects_per_min": 2.5,
           "max_opens_per_interval": 4, "resets": 29, "resets_not_by_broker": 29, "closed_by_broker": 0, "median_lifetime_s": 20.0}
    pos = reconnect_storm({"reconnects_by_client": [row]})
    assert len(pos) == 1 and pos[0].severity == "critical" and "billing" in pos[0].title
    assert pos[0].evidence["reconnects"] == 29 and "29 of them replacing an ended one to the same broker" in pos[0].summary
    steady = dict(row, connections=3, reconnects=2, reconnects_per_min=0.01, median_lifetime_s=7000.0)
    long_lived = dict(row, median_lifetime_s=5000.0)
    assert reconnect_storm({"reconnects_by_client": [steady, long_lived]}) == []


def test_reconnect_storm_is_not_a_clients_start() -> None:
    """Five connections within a client's first seconds (bootstrap, three brokers, the coordinator), still open: no reconnect."""
    start = {"client_id": "orders-app", "client_host": "10.1.0.7", "connections": 5, "reconnects": 0, "reconnects_per_min": 0.0,
             "max_opens_per_interval": 5, "resets": 0, "resets_not_by_broker": 0, "closed_by_broker": 0, "median_lifetime_s": 120.0}
    assert reconnect_storm({"reconnects_by_client": [start]}) == []
    # a broker restart replaces at most its node, bootstrap and coordinator connections: not a storm either
    assert reconnect_storm({"reconnects_by_client": [dict(start, reconnects=3, reconnects_per_min=1.5)]}) == []


def test_client_inventory() -> None:
    rows = [{"client_id": "orders-app", "client_host": "10.1.0.1", "role": "producer", "requests": 900, "requests_per_s": 15.0,
             "bytes_per_s": 2048.0, "topics_produced": ["orders"], "topics_consumed": []},
            {"client_id": "billing", "client_host": "10.1.0.2", "role": "consumer, group member", "requests": 100, "requests_per_s": 1.0,
             "bytes_per_s": 10.0, "topics_produced": [], "topics_consumed": ["orders"]}]
    pos = client_inventory({"client_inventory": rows})
    assert len(pos) == 1 and pos[0].incident == 3 and "busiest: orders-app (producer)" in pos[0].title
    assert pos[0].evidence["roles"] == {"producer": 1, "consumer": 1, "group member": 1}
    # 2 clients, 3 roles: said, or "2 clients (1 producer, 1 consumer, 1 group member)" reads as 3 clients
    assert pos[0].title.startswith("2 clients (1 producer, 1 consumer, 1 group member; a client can hold several roles)")
    assert "several roles" not in client_inventory({"client_inventory": rows[:1]})[0].title
    assert client_inventory({"client_inventory": []}) == []


def series(conc: list[int], p99: list[int], broker: str = "10.0.0.3:9092", at: dict[int, dict] | None = None) -> list[dict]:
    """`connections_over_time` rows, one a minute, every bucket with requests; `at={i: {column: value}}` changes bucket i."""
    rows = [{"broker_addr": broker, "bucket": T + dt.timedelta(minutes=i), "concurrent": c, "opens": 1, "recording_starts": 0, "ends": 0,
             "requests": 600, "p99_us": p, "bytes_per_request": 500.0} for i, (c, p) in enumerate(zip(conc, p99))]
    for i, change in (at or {}).items():
        rows[i].update(change)
    return rows


def test_connection_surge() -> None:
    t = {"_meta": [{"bucket_s": 60}], "connections_over_time": series([50, 50, 52, 51, 400, 420, 410], [2000, 2100, 1900, 2000, 9000, 12000, 11000])}
    pos = connection_surge(t)
    assert len(pos) == 1 and pos[0].incident == 4 and pos[0].severity == "critical"
    assert pos[0].evidence["peak_connections"] == 420 and "queueing" in pos[0].summary
    flat = {"connections_over_time": series([50, 52, 51, 53, 55, 54, 52], [2000] * 7)}
    small = {"connections_over_time": series([2, 2, 2, 2, 6, 6, 6], [2000, 2000, 2000, 2000, 9000, 9000, 9000])}
    assert connection_surge(flat) == [] and connection_surge(small) == []
    # a surge with no latency effect is reported, but only as a warning
    calm = connection_surge({"connections_over_time": series([50, 50, 50, 50, 400, 400], [2000] * 6)})
    assert calm[0].severity == "warning"


def test_connection_surge_not_across_a_recording_start() -> None:
    """A second proxy starting to record (or a restarted one) adds its connections as opens in its first bucket."""
    second = series([50, 50, 50, 50, 110, 110, 110], [2000] * 4 + [3500] * 3, at={4: {"opens": 60, "recording_starts": 1}})
    assert connection_surge({"connections_over_time": second}) == []
    # a restart: the bucket counts the last run's connections, which end in it, and the new run's, which open in it
    restart = series([50, 50, 50, 50, 100, 50, 50, 50], [2000] * 8, at={4: {"opens": 50, "ends": 50, "recording_starts": 1}})
    assert connection_surge({"connections_over_time": restart}) == []
    # a surge after the start is still one, against the baseline recorded since
    later = series([50, 50, 50, 50, 110, 110, 110, 110, 400, 400], [2000] * 8 + [9000] * 2, at={4: {"opens": 60, "recording_starts": 1}})
    (f,) = connection_surge({"_meta": [{"bucket_s": 60}], "connections_over_time": later})
    assert f.evidence["baseline_connections"] == 110 and f.evidence["peak_connections"] == 400 and f.severity == "critical"
    assert f.evidence["baseline_from"] == ts(T + dt.timedelta(minutes=4)) and f.evidence["surge_start"] == ts(T + dt.timedelta(minutes=8))


def test_connection_surge_not_across_a_gap_in_the_recording() -> None:
    """Nothing recorded for three buckets (the proxy down, or its writer dropping rows); then the connections whose ends were
    lost stay counted while the clients' new ones add to them."""
    quiet = {"requests": 0, "ends": 0, "opens": 0}
    gap = series([50, 50, 50, 50, 50, 50, 50, 110, 110, 110], [2000] * 10, at={4: quiet, 5: quiet, 6: quiet, 7: {"opens": 60}})
    assert connection_surge({"connections_over_time": gap}) == []
    # the same jump with the broker recorded throughout is a surge
    assert len(connection_surge({"connections_over_time": series([50] * 7 + [110] * 3, [2000] * 10)})) == 1


def test_connection_surge_across_quiet_buckets_inside_a_run() -> None:
    """The same three buckets without a request or an end, but a proxy run known to be recording through them
    (`runs_recording`): quiet, not a gap, so the jump after them has its baseline."""
    quiet = {"requests": 0, "ends": 0, "opens": 0, "runs_recording": 1}
    rows = series([50, 50, 50, 50, 50, 50, 50, 110, 110, 110], [2000] * 10, at={4: quiet, 5: quiet, 6: quiet, 7: {"opens": 60}})
    (f,) = connection_surge({"connections_over_time": rows})
    assert f.evidence["baseline_connections"] == 50 and f.evidence["baseline_from"] == ts(T)


def test_window_scaling_off() -> None:
    rows = [{"conn_id": "c7", "side": "client", "client_id": "connect-hk", "broker_addr": "10.0.0.1:9092", "rtt_ms": 180.0,
             "ceiling_bytes_per_s": 364083.0, "avg_bytes_per_s": 300000.0, "peak_bytes_per_s": 350000.0, "utilisation": 0.96,
             "timestamps_ok": False}]
    pos = window_scaling_off({"window_ceiling": rows})
    assert len(pos) == 1 and pos[0].incident == 5 and pos[0].severity == "critical"
    assert "throughput capped at 64 KiB / RTT" in pos[0].title and pos[0].examples[0]["conn_id"] == "c7"
    assert pos[0].evidence["without_timestamps"] == 1
    assert window_scaling_off({"window_ceiling": []}) == []


def test_error_hotspot_and_throttling() -> None:
    t = {"overview": [{"requests": 1000}], "errors_by_name": [err("NOT_LEADER_OR_FOLLOWER", n=40), err("MESSAGE_TOO_LARGE", n=40)]}
    pos = error_hotspot(t)
    assert [f.evidence["error"] for f in pos] == ["NOT_LEADER_OR_FOLLOWER"]  # too-large is incident 1's rule
    assert error_hotspot({"overview": [{"requests": 1000}], "errors_by_name": [err("NOT_LEADER_OR_FOLLOWER", n=2)]}) == []
    # a protocol step once per connection (a group's start) is info; a retriable error says so; one name, two kinds: two findings
    steps = [err("MEMBER_ID_REQUIRED", "JoinGroup", n=400, kind="protocol_step", connections=400),
             err("REBALANCE_IN_PROGRESS", "OffsetCommit", n=30, kind="error", connections=30),
             err("COORDINATOR_LOAD_IN_PROGRESS", "JoinGroup", n=40, kind="retriable", connections=40)]
    found = {f.title: f.severity for f in error_hotspot({"overview": [{"requests": 10_000}], "errors_by_name": steps})}
    assert found == {"400 × MEMBER_ID_REQUIRED (protocol step) on JoinGroup (1 client(s))": "info",
                     "30 × REBALANCE_IN_PROGRESS on OffsetCommit (1 client(s))": "warning",
                     "40 × COORDINATOR_LOAD_IN_PROGRESS (retriable) on JoinGroup (1 client(s))": "warning"}
    # one client stuck on a retriable error (a misspelt topic) is a warning, however busy everything else was
    typo = [err("UNKNOWN_TOPIC_OR_PARTITION", "Metadata", n=15, kind="retriable", client_id="typo", topic="orders_",
                connections=1, last_seen=T + dt.timedelta(seconds=24)),
            err("UNKNOWN_TOPIC_OR_PARTITION", "Metadata", n=1, kind="retriable", client_id="auto", topic="new", connections=1)]
    f = error_hotspot({"overview": [{"requests": 1_000_000}], "errors_by_name": typo})[0]
    assert f.severity == "warning" and "typo got it 15 times over 24 s (orders_)" in f.summary, f.summary
    burst = [err("NOT_LEADER_OR_FOLLOWER", "Produce", n=40, kind="retriable", last_seen=T + dt.timedelta(seconds=2))]
    assert error_hotspot({"overview": [{"requests": 1_000_000}], "errors_by_name": burst})[0].severity == "info"
    rare = [err("NOT_LEADER_OR_FOLLOWER", "Produce", n=12, kind="retriable", last_seen=T + dt.timedelta(hours=1))]
    assert error_hotspot({"overview": [{"requests": 1_000_000}], "errors_by_name": rare})[0].severity == "info"  # 2 moves an hour apart
    # the same members told to rejoin again and again: a storm, a warning
    storm = [err("REBALANCE_IN_PROGRESS", "Heartbeat", n=60, kind="protocol_step", connections=6)]
    f = error_hotspot({"overview": [{"requests": 10_000}], "errors_by_name": storm})[0]
    assert f.severity == "warning" and "10.0 per connection" in f.summary and "rebalance storm" in f.summary
    th = throttled_clients({"throttling": [{"client_id": "x", "api_name": "Produce", "total_throttle_ms": 20_000}]})
    assert th and th[0].severity == "warning"
    assert throttled_clients({"throttling": []}) == []


def test_compare_added_latency_is_headed_by_the_busiest_api_and_says_how_it_read_the_pairs() -> None:
    """The title named the API with the largest |p99|, one of 1-3 requests; two recordings of different times were
    read as a middlebox's, and a swapped A/B was not told."""
    def api(name: str, matched: int, p50: int, p99: int) -> dict:
        return {"api_name": name, "matched": matched, "diff_p50_us": p50, "diff_p99_us": p99}

    rows = [api("OffsetCommit", 3, 21_050, 37_830), api("Produce", 150, 21_000, 22_000)]
    f = compare_added_latency({"compare_by_api": rows})[0]
    assert f.title.startswith("Latency A − B: Produce p50 +21.00 ms") and "the latency the middlebox adds" in f.summary
    swapped = compare_added_latency({"compare_by_api": [api("Produce", 150, -21_500, -20_700)]})[0]
    assert "A and B may be swapped" in swapped.summary and "middlebox adds" not in swapped.summary
    apart = {"compare_by_api": rows, "compare_summary": [{"api_name": "Produce", "mode": "sequence", "matched": 150}]}
    assert "paired by order, as for a replay" in compare_added_latency(apart)[0].summary
    two = {"compare_by_api": rows, "compare_summary": [{"api_name": "Produce", "mode": "wire", "matched": 150,
                                                         "cluster_ids_a": ["xgZF1G"], "cluster_ids_b": ["QypFfb"]}]}
    f = compare_added_latency(two)[0]
    assert "different Kafka clusters (A: xgZF1G; B: QypFfb)" in f.summary and "no middlebox's latency" in f.summary
    same = {"compare_by_api": rows, "compare_summary": [{"api_name": "Produce", "mode": "wire", "matched": 150,
                                                          "cluster_ids_a": ["xgZF1G"], "cluster_ids_b": ["xgZF1G"]}]}
    assert "the latency the middlebox adds" in compare_added_latency(same)[0].summary


def test_compare_rules() -> None:
    api = [{"api_name": "Produce", "matched": 100, "a_p50_us": 3000, "b_p50_us": 1000, "diff_p50_us": 2000, "diff_p99_us": 2500}]
    assert compare_added_latency({"compare_by_api": api})[0].severity == "warning"
    assert compare_added_latency({"compare_by_api": []}) == []
    waits = [{"api_name": "Fetch (long poll)", "matched": 100, "diff_p50_us": 497_000, "diff_p99_us": 500_000}]
    assert compare_added_latency({"compare_by_api": waits}) == []  # the broker's wait for data, not the path
    assert "Produce" in compare_added_latency({"compare_by_api": waits + api})[0].title
    e = [{"api_name": "Produce", "errors_a": "", "errors_b": "MESSAGE_TOO_LARGE", "status_a": "answered", "status_b": "answered", "requests": 1}]
    assert compare_errors_differ({"compare_errors": e})[0].evidence["requests"] == 1
    assert compare_errors_differ({"compare_errors": []}) == []
    ends = [{"conn_id_a": "a1", "conn_id_b": "b1", "client_id": "p", "end_reason_a": "client_fin", "end_reason_b": "broker_fin",
             "end_by_a": "client", "end_by_b": "broker", "inferred_cause_b": "batch larger than message.max.bytes (RecordBatchTooLarge)", "same": False}]
    f = compare_ends_differ({"compare_ends": ends})
    assert f and "RecordBatchTooLarge" in f[0].summary
    assert compare_ends_differ({"compare_ends": [dict(ends[0], same=True)]}) == []



def test_compare_leaves_out_share_fetch_long_polls_too() -> None:
    """A share consumer's ShareFetch that waited for records is the broker's wait, not the path between A and B."""
    waits = [{"api_name": "ShareFetch (long poll)", "matched": 100, "diff_p50_us": 497_000, "diff_p99_us": 500_000}]
    assert compare_added_latency({"compare_by_api": waits}) == []
    reads = [{"api_name": "ShareFetch", "matched": 100, "a_p50_us": 3000, "b_p50_us": 1000, "diff_p50_us": 2000,
              "diff_p99_us": 2500}]
    assert "ShareFetch p50" in compare_added_latency({"compare_by_api": waits + reads})[0].title


def matching(api: str, a: int, b: int, matched: int, mode: str = "wire", **times) -> dict:
    return {"api_name": api, "requests_a": a, "requests_b": b, "matched": matched, "mode": mode, **times}


def test_compare_few_matched() -> None:
    """Under half of either side's requests matched: a warning with the shares, when each side ran and why it may be."""
    hour = dt.timedelta(hours=1)
    rows = [matching("Produce", 900, 300, 300, first_a=T, last_a=T + hour, first_b=T + 0.6 * hour, last_b=T + 2 * hour),
            matching("Metadata", 100, 0, 0)]
    (f,) = compare_few_matched({"compare_summary": rows, "_meta": [{"tolerance_s": 2.5}]})
    assert f.severity == "warning" and f.title == "Few requests matched: 30% of A's 1,000, 100% of B's 300"
    assert "A's requests run from 2026-11-20 09:00:00 UTC to 2026-11-20 10:00:00 UTC; B's run from 2026-11-20 09:36:00 UTC" in f.summary
    for cause in ("different time windows", "different clients", "only part of the traffic", "clocks differ by more than --tolerance (2.5 s)"):
        assert cause in f.summary, cause
    assert (f.evidence["matched_share_a"], f.evidence["matched_share_b"]) == (0.3, 1.0)
    assert [x["api_name"] for x in f.examples] == ["Produce", "Metadata"]  # most unmatched first
    (b_short,) = compare_few_matched({"compare_summary": [matching("Produce", 100, 400, 100, "sequence")]})
    assert "25% of B's 400" in b_short.title and "a replay that sent only part of the recording" in b_short.summary
    (nothing,) = compare_few_matched({"compare_summary": [matching("Produce", 50, 0, 0)]})  # one side empty in the window
    assert nothing.evidence["matched_share_b"] == 0.0
    assert compare_few_matched({"compare_summary": [matching("Produce", 100, 98, 50)]}) == []  # half of each: no warning
    assert compare_few_matched({"compare_summary": []}) == []

def opaque(kind: str, n: int, **kw) -> dict:
    """An `opaque_connections` row (analytics.transforms.connections.opaque_connections)."""
    reason = {"tls": "request stream opaque at offset 0: tls: TLS ClientHello/handshake (0x16 0x03 0x01): the connection is encrypted",
              "http": "request stream opaque at offset 0: http: HTTP (b'GET '…) where a Kafka size prefix should be"}.get(
        kind, f"request stream opaque at offset 512: {kind}: frame at byte 512: …")
    row = {"kind": kind, "connections": n, "requests_decoded": 0 if kind in ("tls", "http") else 4 * n, "bytes_from_client": 3000 * n,
           "bytes_from_broker": 6000 * n, "client_hosts": ["10.1.0.5"], "brokers": ["10.0.0.1:9093"], "client_ids": [],
           "example_conn_id": f"{kind}-1", "example_reason": reason, "first_opened": T, "last_seen": T}
    row.update(kw)
    return row


def test_opaque_connections() -> None:
    """TLS relayed opaque reads as an empty recording ("0 requests, 5 connections"): say so, and how to decode it."""
    (tls,) = opaque_connections({"overview": [{"requests": 0, "connections": 5}], "opaque_connections": [opaque("tls", 5)]})
    assert tls.id == "opaque_connections" and tls.severity == "warning"
    assert tls.title.startswith("5 of 5 connection(s) were TLS, relayed opaque: not decoded")
    assert "`kafkatap proxy … --tls-cert CERT --tls-key KEY`" in tls.summary and "--upstream-tls-ca CA" in tls.summary
    assert tls.evidence["bytes"] == 45_000 and tls.examples[0]["conn_id"] == "tls-1" and tls.tables == ["opaque_connections"]
    # other reasons: named with their counts; a few among many decoded connections are info, many are a warning
    few = opaque_connections({"overview": [{"requests": 10_000, "connections": 100}],
                              "opaque_connections": [opaque("garbage", 2), opaque("http", 1)]})
    assert len(few) == 1 and few[0].severity == "info" and "(garbage ×2, http ×1)" in few[0].title
    assert "spoke HTTP" in few[0].summary and "frame at byte 512" in few[0].summary
    many = opaque_connections({"overview": [{"requests": 10_000, "connections": 100}], "opaque_connections": [opaque("oversize", 30)]})
    assert many[0].severity == "warning"
    cut = opaque_connections({"overview": [{"requests": 0, "connections": 3}], "opaque_connections": [opaque("truncated", 3)]})
    assert cut[0].severity == "info"  # a frame cut off at the end loses nothing before it
    both = opaque_connections({"overview": [{"requests": 0, "connections": 50}], "opaque_connections": [opaque("tls", 4), opaque("http", 1)]})
    assert [f.severity for f in both] == ["warning", "warning"]  # no request decoded at all: the other kinds matter too
    assert opaque_connections({"overview": [{"requests": 5, "connections": 5}]}) == []


def test_run_rules_ranks_and_survives_a_broken_rule(monkeypatch) -> None:
    def broken(t):
        raise RuntimeError("boom")

    monkeypatch.setitem(RULES, "broken", broken)
    t = {"broker_closes": [close("c1")], "client_inventory": [{"client_id": "a", "client_host": "h", "role": "producer", "requests": 1}]}
    out = run_rules(t)
    assert [f.id for f in out][:1] == ["broker_closed_after_acks0_produce"]
    assert any(f.id == "broken.failed" for f in out)
    assert rank([Finding("b", "info", "", "", score=1), Finding("a", "critical", "", "", score=300)])[0].id == "a"


def test_every_rule_is_covered() -> None:
    tested = {"broker_closed_after_acks0_produce", "produce_rejected_too_large", "idle_resets_not_from_broker", "reconnect_storm",
              "client_inventory", "connection_surge", "window_scaling_off", "error_hotspot", "throttled_clients",
              "compare_added_latency", "compare_errors_differ", "compare_ends_differ", "compare_few_matched",
              "clients_bypass_proxy",  # tests/analytics/test_findings_bypass.py
              "opaque_connections",
              "separate_stretches", "tcp_faults_injected",  # tests/analytics/test_stretches.py
              "broker_unreachable",  # tests/analytics/test_outages.py
              "kafka_fault_reactions", "fault_retry_duplicates",  # tests/analytics/test_fault_reactions.py
              "kafka_4_removed_versions"}  # tests/analytics/test_transforms.py, test_kafka_4_upgrade_kafka.py
    assert set(RULES) - {"broken"} == tested
