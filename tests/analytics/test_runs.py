"""Proxy runs (`runs/`): ends a run over never recorded, run starts and quiet buckets, on small explicit DataFrames."""

from __future__ import annotations

from typing import Any

import pytest

from analytics.findings.surge import connection_surge
from analytics.load import one_row_per_connection
from analytics.transforms import connections, stretches
from analytics.transforms.cube import latency_cube
from analytics.transforms.common import prepare_requests
from analytics.transforms.rollups import traffic_over_time
from analytics.transforms.runs import END_NOT_RECORDED, NOT_RECORDED_CAUSE, marks_of
from analytics_rows import S, T0, conn, req
from recording.layout import launching_proxy_id, worker_proxy_id

pytestmark = pytest.mark.spark


def mark(run: str, event: str, t_s: float, proxy_id: str = "p1") -> dict[str, Any]:
    """One `runs/` row as the proxy writes it."""
    return {"proxy_id": proxy_id, "run": run, "event": event, "ts_ns": T0 + int(t_s * S), "pid": 4242, "version": "test"}


def settled(make_df, cs: list[dict], marks: list[dict]) -> dict[str, dict]:
    rows = one_row_per_connection(make_df("connections", cs), marks).collect()
    return {r.conn_id: r.asDict() for r in rows}


def over_time(make_df, cs: list[dict], rs: list[dict], marks: list[dict]) -> list[dict]:
    """`connections_over_time` (60 s buckets) of these rows, the connections settled as `analytics.load` does."""
    r = prepare_requests(make_df("requests", rs))
    c = one_row_per_connection(make_df("connections", cs), marks)
    return [x.asDict() for x in connections.connections_over_time(c, traffic_over_time(r, 60), 60, latency_cube(r, 60)).collect()]


def test_a_killed_runs_open_connections_end_unrecorded_once_a_later_run_started(make_df) -> None:
    """Run a1b2c3 was SIGKILLed (no stop row) with three connections open, last snapshotted at 100 s; the proxy was
    restarted at 300 s (run 0a0b0c). Another proxy (p2) still runs, and p3 recorded before `runs/` existed."""
    cs = [conn(f"a1b2c3-{i}", 10, None, snapshot_ns=T0 + (90 + i * 5) * S) for i in range(3)]
    cs += [conn("a1b2c3-9", 10, 50), conn("0a0b0c-1", 301, None, snapshot_ns=T0 + 400 * S)]
    cs += [conn("c0c0c0-1", 10, None, proxy_id="p2", snapshot_ns=T0 + 100 * S)]
    cs += [conn("d0d0d0-1", 10, None, proxy_id="p3"), conn("e0e0e0-1", 300, None, proxy_id="p3")]
    marks = [mark("a1b2c3", "start", 0), mark("0a0b0c", "start", 300), mark("c0c0c0", "start", 0, "p2")]
    got = settled(make_df, cs, marks)
    for i in range(3):
        c = got[f"a1b2c3-{i}"]
        assert (c["end_reason"], c["end_by"], c["inferred_cause"]) == (END_NOT_RECORDED, "unknown", NOT_RECORDED_CAUSE)
        assert c["closed_ns"] == T0 + 100 * S and c["duration_us"] == 90 * 1_000_000  # the run's last sign of life
        assert "killed" in c["end_detail"] and c["final"] is False
    assert got["a1b2c3-9"]["end_reason"] == "client_fin" and got["a1b2c3-9"]["closed_ns"] == T0 + 50 * S
    # the run still going, a proxy with no later run, and a recording without start rows: open as they were
    for still in ("0a0b0c-1", "c0c0c0-1", "d0d0d0-1", "e0e0e0-1"):
        assert (got[still]["end_reason"], got[still]["closed_ns"]) == ("open", None), still
    ends = {(r.end_reason, r.end_by): r.connections for r in connections.connection_ends(
        one_row_per_connection(make_df("connections", cs), marks)).collect()}
    assert ends[(END_NOT_RECORDED, "unknown")] == 3 and ends[("open", "none")] == 4


def test_a_cleanly_stopped_run_ends_what_it_did_not_record_at_its_stop(make_df) -> None:
    cs = [conn("a1b2c3-1", 10, None, snapshot_ns=T0 + 150 * S), conn("a1b2c3-2", 10, 190, end_reason="proxy_shutdown")]
    got = settled(make_df, cs, [mark("a1b2c3", "start", 0), mark("a1b2c3", "stop", 200)])
    assert (got["a1b2c3-1"]["end_reason"], got["a1b2c3-1"]["closed_ns"]) == (END_NOT_RECORDED, T0 + 200 * S)
    assert "stopped cleanly" in got["a1b2c3-1"]["end_detail"]
    assert got["a1b2c3-2"]["end_reason"] == "proxy_shutdown"


def test_a_run_from_before_start_rows_ends_at_its_own_last_sign_once_its_proxy_restarts(make_df) -> None:
    """p1 recorded with a kafkatap that wrote no `runs/` (run d0d0d0), then a current one started at 300 s into the same
    directory. A connection of the old run is over once a start row follows its open, at its own last snapshot (the
    old run's last sign of life would take an aggregation per run, for recordings no current proxy makes); one that
    opened after that start ran beside the new run, so it proves nothing and stays open."""
    cs = [conn("d0d0d0-1", 10, None, snapshot_ns=T0 + 80 * S), conn("d0d0d0-2", 20, None, snapshot_ns=T0 + 95 * S),
          conn("d0d0d0-3", 400, None, snapshot_ns=T0 + 450 * S), conn("0a0b0c-1", 301, 320)]
    got = settled(make_df, cs, [mark("0a0b0c", "start", 300), mark("0a0b0c", "stop", 500)])
    assert [(got[c]["end_reason"], got[c]["closed_ns"]) for c in ("d0d0d0-1", "d0d0d0-2")] == [
        (END_NOT_RECORDED, T0 + 80 * S), (END_NOT_RECORDED, T0 + 95 * S)]
    assert "killed" in got["d0d0d0-1"]["end_detail"] and got["d0d0d0-1"]["run_started_ns"] is None
    assert (got["d0d0d0-3"]["end_reason"], got["d0d0d0-3"]["closed_ns"]) == ("open", None)
    assert (got["0a0b0c-1"]["run_started_ns"], got["0a0b0c-1"]["run_last_ns"]) == (T0 + 300 * S, T0 + 500 * S)


def test_a_run_with_only_its_stop_row_ends_what_it_did_not_record_at_its_stop(make_df) -> None:
    """Its start row is in a file retention or a crash removed: the stop still proves it over, and it has no start."""
    got = settled(make_df, [conn("a1b2c3-1", 10, None, snapshot_ns=T0 + 150 * S)], [mark("a1b2c3", "stop", 200)])
    c = got["a1b2c3-1"]
    assert (c["end_reason"], c["closed_ns"], c["run_started_ns"], c["run_last_ns"]) == (END_NOT_RECORDED, T0 + 200 * S, None, None)


def test_a_runs_rows_from_several_directories_make_one_run() -> None:
    """`kafkatap analyze A B` of one proxy's recording split in two: its start in one, its stop in the other."""
    first, second = [mark("a1b2c3", "start", 0)], [mark("a1b2c3", "stop", 200), mark("a1b2c3", "start", 5)]
    broken = {"proxy_id": None, "run": "ffffff", "event": "start", "ts_ns": T0, "pid": 1, "version": "x"}
    (m,) = marks_of(first + second + [broken])
    assert (m.key, m.started_ns, m.stopped_ns) == ("p1/a1b2c3", T0, T0 + 200 * S)


def launch(run: str, t_s: float, proxy_id: str, parent_pid: int = 99_999) -> dict[str, Any]:
    """The `launch` row a `--workers` worker writes with its start: its parent's start time and pid."""
    return mark(run, "launch", t_s, proxy_id) | {"pid": parent_pid}


def test_a_workers_proxy_killed_whole_and_started_again_with_fewer_ends_every_old_worker_run(make_df) -> None:
    """`--workers 2` of p1 launched at 0 s (p1-w1 run aaaaaa, p1-w2 run bbbbbb) was killed whole; at 300 s p1 started
    again without workers (run cccccc). No run of p1-w2 ever starts again: only the launch proves its run over. A
    proxy its operator named p1-w3, which writes no launch rows, is nobody's worker and stays as it is."""
    cs = [conn("aaaaaa-1", 5, None, proxy_id="p1-w1", snapshot_ns=T0 + 100 * S),
          conn("bbbbbb-1", 6, None, proxy_id="p1-w2", snapshot_ns=T0 + 110 * S),
          conn("cccccc-1", 301, None, snapshot_ns=T0 + 400 * S),
          conn("eeeeee-1", 7, None, proxy_id="p1-w3", snapshot_ns=T0 + 120 * S)]
    marks = [launch("aaaaaa", 0, "p1-w1"), mark("aaaaaa", "start", 1, "p1-w1"),
             launch("bbbbbb", 0, "p1-w2"), mark("bbbbbb", "start", 2, "p1-w2"),
             mark("cccccc", "start", 300), mark("eeeeee", "start", 3, "p1-w3")]
    got = settled(make_df, cs, marks)
    for conn_id, last_s in (("aaaaaa-1", 100), ("bbbbbb-1", 110)):
        c = got[conn_id]
        assert (c["end_reason"], c["closed_ns"]) == (END_NOT_RECORDED, T0 + last_s * S), c
        assert "killed" in c["end_detail"] and "09:05:00 UTC" in c["end_detail"]  # proved over by p1's start at 300 s
    for still in ("cccccc-1", "eeeeee-1"):
        assert (got[still]["end_reason"], got[still]["closed_ns"]) == ("open", None), still
    # the other way round: workers launched after a proxy without them end its killed run
    again = settled(make_df, [conn("cccccc-1", 301, None, snapshot_ns=T0 + 400 * S)],
                    marks + [launch("ffffff", 500, "p1-w1"), mark("ffffff", "start", 501, "p1-w1")])
    assert (again["cccccc-1"]["end_reason"], again["cccccc-1"]["closed_ns"]) == (END_NOT_RECORDED, T0 + 400 * S)
    # the launch row's time and pid are the parent's: the run's own start and pid are what `proxy_runs` lists
    runs = {r.run: r for r in stretches.proxy_runs(make_df("runs", marks), one_row_per_connection(
        make_df("connections", cs), marks)).collect()}
    assert (runs["bbbbbb"].pid, runs["bbbbbb"].start_ns) == (4242, T0 + 2 * S)


def test_a_workers_proxy_id_leads_back_to_its_parents() -> None:
    assert [launching_proxy_id(worker_proxy_id(p, i)) for p, i in (("edge", 1), ("edge-w2", 12), ("a-b", 3))] == [
        "edge", "edge-w2", "a-b"]
    assert [launching_proxy_id(x) for x in ("edge", "edge-w", "-w1", "edge-wx")] == [None] * 4


def test_a_workers_own_launch_never_ends_it_even_after_a_clock_step_back(make_df) -> None:
    """The parent read the clock at 10 s, then the clock stepped back and its workers started at 3 s and 4 s: the
    launch is later than their starts, and still theirs. Only another launch (p1 again at 300 s) ends them."""
    cs = [conn("aaaaaa-1", 5, None, proxy_id="p1-w1", snapshot_ns=T0 + 100 * S),
          conn("bbbbbb-1", 6, None, proxy_id="p1-w2", snapshot_ns=T0 + 110 * S)]
    marks = [launch("aaaaaa", 10, "p1-w1"), mark("aaaaaa", "start", 3, "p1-w1"),
             launch("bbbbbb", 10, "p1-w2"), mark("bbbbbb", "start", 4, "p1-w2")]
    got = settled(make_df, cs, marks)
    assert [got[c]["end_reason"] for c in ("aaaaaa-1", "bbbbbb-1")] == ["open", "open"]
    got = settled(make_df, cs, marks + [mark("cccccc", "start", 300)])
    assert [got[c]["end_reason"] for c in ("aaaaaa-1", "bbbbbb-1")] == [END_NOT_RECORDED] * 2


def test_a_worker_its_parent_restarted_ends_only_its_own_earlier_run(make_df) -> None:
    """p1-w1 died at ~100 s and its parent started it again at 150 s (run dddddd, the same launch at 0 s): its old
    run is over, while its sibling p1-w2, which never stopped, keeps its connection open."""
    cs = [conn("aaaaaa-1", 5, None, proxy_id="p1-w1", snapshot_ns=T0 + 100 * S),
          conn("bbbbbb-1", 6, None, proxy_id="p1-w2", snapshot_ns=T0 + 200 * S)]
    marks = [launch("aaaaaa", 0, "p1-w1"), mark("aaaaaa", "start", 1, "p1-w1"),
             launch("bbbbbb", 0, "p1-w2"), mark("bbbbbb", "start", 2, "p1-w2"),
             launch("dddddd", 0, "p1-w1"), mark("dddddd", "start", 150, "p1-w1")]
    got = settled(make_df, cs, marks)
    assert (got["aaaaaa-1"]["end_reason"], got["aaaaaa-1"]["closed_ns"]) == (END_NOT_RECORDED, T0 + 100 * S)
    assert (got["bbbbbb-1"]["end_reason"], got["bbbbbb-1"]["closed_ns"]) == ("open", None)


def test_without_runs_rows_nothing_is_settled(make_df) -> None:
    cs = [conn("a1b2c3-1", 10, None, snapshot_ns=T0 + 150 * S), conn("a1b2c3-2", 10, 190)]
    got = settled(make_df, cs, [])
    assert [(got[c]["end_reason"], got[c]["run_started_ns"], got[c]["run_last_ns"]) for c in ("a1b2c3-1", "a1b2c3-2")] == [
        ("open", None, None), ("client_fin", None, None)]


def test_a_killed_run_stops_counting_in_the_concurrency(make_df) -> None:
    """Without the later run's start row the killed run's 20 connections stayed open in every bucket after it."""
    cs = [conn(f"a1b2c3-{i}", i, None, snapshot_ns=T0 + 110 * S) for i in range(20)]
    cs += [conn(f"0a0b0c-{i}", 245 + i, None, snapshot_ns=T0 + 470 * S) for i in range(5)]
    rs = [req("a1b2c3-0", k, t_s=k * 60 + 5) for k in range(2)] + [req("0a0b0c-0", k, t_s=k * 60 + 5) for k in range(4, 8)]
    rows = over_time(make_df, cs, rs, [mark("a1b2c3", "start", 0), mark("0a0b0c", "start", 240)])
    assert [x["concurrent"] for x in rows] == [20, 20, 0, 0, 5, 5, 5, 5]
    assert rows[1]["ends"] == 20


def _steady_and_idle_worker() -> tuple[list[dict], list[dict]]:
    """Worker w1 carries 50 long-lived connections and requests every minute; worker w2, started with it at 0 s,
    serves nothing until 100 clients connect to it at 420 s, while latency climbs."""
    cs = [conn(f"a1b2c3-{i}", i / 10, None, proxy_id="p1-w1", snapshot_ns=T0 + 590 * S) for i in range(50)]
    cs += [conn(f"b1b2b3-{i}", 420 + i / 10, None, proxy_id="p1-w2", snapshot_ns=T0 + 590 * S) for i in range(100)]
    rs = [req("a1b2c3-0", k, t_s=k * 60 + 5, proxy_id="p1-w1", lat_us=2000 if k < 7 else 9000) for k in range(10)]
    return cs, rs


def test_a_surge_where_an_idle_worker_first_records_is_reported(make_df) -> None:
    cs, rs = _steady_and_idle_worker()
    rows = over_time(make_df, cs, rs, [mark("a1b2c3", "start", 0, "p1-w1"), mark("b1b2b3", "start", 0, "p1-w2")])
    assert [x["recording_starts"] for x in rows] == [1] + [0] * 9  # both runs began at 0 s; w2 took nothing over
    (f,) = connection_surge({"connections_over_time": rows})
    assert (f.evidence["baseline_connections"], f.evidence["peak_connections"]) == (50, 150) and f.severity == "critical"
    # a recording without start rows still reads w2's first connections as its start: no surge, as before
    assert connection_surge({"connections_over_time": over_time(make_df, cs, rs, [])}) == []


def test_quiet_buckets_inside_a_run_keep_the_baseline(make_df) -> None:
    """No request and no end from 120 s to 419 s while the run records (its connections' snapshots go on)."""
    cs, _ = _steady_and_idle_worker()
    cs = [c | {"proxy_id": "p1"} for c in cs if c["conn_id"].startswith("a1b2c3")]
    cs += [conn(f"a1b2c3-{100 + i}", 420 + i / 10, None, snapshot_ns=T0 + 590 * S) for i in range(100)]
    rs = [req("a1b2c3-0", k, t_s=k * 60 + 5, lat_us=2000 if k < 7 else 9000) for k in (0, 1, 7, 8, 9)]
    rows = over_time(make_df, cs, rs, [mark("a1b2c3", "start", 0)])
    assert [x["requests"] for x in rows] == [1, 1, 0, 0, 0, 0, 0, 1, 1, 1]
    assert all(x["runs_recording"] == 1 for x in rows)
    (f,) = connection_surge({"connections_over_time": rows})
    assert (f.evidence["baseline_connections"], f.evidence["peak_connections"]) == (50, 150)
    assert connection_surge({"connections_over_time": over_time(make_df, cs, rs, [])}) == []  # without runs/: a gap
