"""A broker outage on synthetic rows: one broker_unreachable finding with its stretch, the broker's closes before it
with that cause, and no reconnect storm or connection surge made of the connects that failed meanwhile."""

from __future__ import annotations

from pathlib import Path

import pytest

from analytics.findings.outages import broker_unreachable
from analytics.findings.resets import reconnect_storm
from analytics.findings.surge import connection_surge
from analytics.job import empty_table, summary
from analytics.result import AnalysisResult
from analytics.transforms import connections, outages
from analytics.transforms.common import prepare_requests
from analytics.transforms.cube import latency_cube
from analytics.transforms.overview import overview
from analytics.transforms.rollups import request_rollup, traffic_over_time
from analytics_rows import S, T0, conn, req

pytestmark = pytest.mark.spark

B = "10.0.0.1:9092"
DOWN_S, UP_S = 300.0, 322.0  # the broker stops at 300 s (closing its connections) and listens again at 322 s


def refused(i: int, t: float, host: str) -> dict:
    """A connect the proxy could not make, as proxy.connection records one: a client connection of a millisecond."""
    return conn(f"a1b2c3-{1000 + i}", t, t + 0.001, client_addr=f"{host}:{50000 + i}", client_ids=[], requests=0,
                responses=0, end_reason="upstream_connect_failed", end_by="proxy",
                end_detail=f"refused: Connection refused ({B})", idle_ms=None)


def outage_rows() -> list[dict]:
    """Six live connections of four clients from the start, closed by the broker at 300 s; four clients retrying
    every 0.1 s (880 refused connects) until it is back; each client's new connection at 322.5 s."""
    hosts = [f"10.1.0.{n}" for n in range(1, 5)]
    live = [conn(f"a1b2c3-{i}", i, DOWN_S - 0.01 * i, client=f"app-{i % 4}", client_addr=f"{hosts[i % 4]}:4000{i}",
                 end_reason="broker_fin", end_by="broker") for i in range(6)]
    failed = [refused(i, DOWN_S + 0.1 * (i // 4), hosts[i % 4]) for i in range(880)]
    back = [conn(f"a1b2c3-{2000 + n}", UP_S + 0.5, None, client=f"app-{n}", client_addr=f"{hosts[n]}:4100{n}")
            for n in range(4)]
    return live + failed + back


def test_an_outage_is_one_stretch_with_the_closes_before_it_and_the_return(make_df) -> None:
    rows = [r.asDict(recursive=True) for r in outages.broker_outages(make_df("connections", outage_rows())).collect()]
    assert len(rows) == 1, rows
    o = rows[0]
    assert (o["broker_addr"], o["attempts"], o["clients"], o["failure_kinds"]) == (B, 880, 4, ["refused"])
    assert (o["first_ns"], o["broker_closes_before"]) == (T0 + int(DOWN_S * S), 6)
    assert o["back_at"] is not None and o["down_s"] == pytest.approx(UP_S + 0.5 - (DOWN_S - 0.05), abs=0.01)
    f = broker_unreachable({"broker_outages": rows})
    assert [x.severity for x in f] == ["critical"]
    assert "880 connection attempt(s) refused" in f[0].title and "closed its 6 live connection(s) as it went away" in f[0].summary
    assert "accepted connections again" in f[0].summary


def test_failed_connects_are_no_reconnects_nor_concurrency(make_df) -> None:
    cs = make_df("connections", outage_rows())
    recon = {r.client_id: r.asDict() for r in connections.reconnects_by_client(cs).collect()}
    assert "(none)" not in recon and sum(r["connections"] for r in recon.values()) == 10
    assert sum(r["closed_by_broker"] for r in recon.values()) == 6
    assert reconnect_storm({"reconnects_by_client": list(recon.values())}) == []
    r = prepare_requests(make_df("requests", [req("a1b2c3-0", k, t_s=k * 60 + 5, broker=B) for k in range(8)]))
    series = [x.asDict() for x in connections.connections_over_time(cs, traffic_over_time(r, 60), 60, latency_cube(r, 60)).collect()]
    assert max(x["concurrent"] for x in series) == 6 and sum(x["opens"] for x in series) == 10
    assert sum(x.connections for x in connections.connection_lifetimes(cs).collect()) == 10  # no 880 "< 1 s" lifetimes
    assert connection_surge({"connections_over_time": series}) == []


def test_the_broker_closes_before_an_outage_get_its_cause(make_df) -> None:
    cs = make_df("connections", outage_rows() + [conn("a1b2c3-9", 5, 100, end_reason="broker_fin", end_by="broker")])
    closes = {r.conn_id: r.inferred_cause for r in connections.broker_closes(
        outages.with_outage_causes(cs, outages.broker_outages(cs))).collect()}
    assert closes.pop("a1b2c3-9") is None  # a close long before the outage is not its doing
    assert set(closes.values()) == {"broker went away: it refused new connections from 2026-11-20 09:05:00 to 09:05:21 UTC"}
    assert len(closes) == 6


def test_connect_failures_apart_are_two_outages_and_other_failures_none(make_df) -> None:
    cs = [refused(i, 100 + i, "10.1.0.1") for i in range(3)] + [refused(10 + i, 400 + i, "10.1.0.1") for i in range(2)]
    cs.append(conn("a1b2c3-77", 200, 200.001, end_reason="upstream_connect_failed", end_by="proxy",
                   end_detail="no file descriptor left for the broker's socket (Too many open files): raise the proxy's "
                              "open-files limit"))
    rows = sorted((r.asDict() for r in outages.broker_outages(make_df("connections", cs)).collect()), key=lambda r: r["first_ns"])
    assert [(r["attempts"], r["broker_closes_before"], r["back_at"]) for r in rows] == [(3, 0, None), (2, 0, None)]
    f = broker_unreachable({"broker_outages": rows})
    assert len(f) == 2 and "closed no live connection first" in f[0].summary and "may still be down" in f[0].summary


def test_without_unreachable_connects_the_job_makes_the_empty_table_and_changes_no_cause(make_df) -> None:
    """The job skips the outage queries when the overview counts no unreachable connect: the table it makes then is
    the plan's (but that its arrays' elements may be null), and no connection's cause changes."""
    cs = make_df("connections", [conn("a1b2c3-1", 5, 100, end_reason="broker_fin", end_by="broker"), conn("a1b2c3-2", 6, 7)])
    real = outages.broker_outages(cs).toArrow()
    made = empty_table(cs, outages.OUTAGE_COLUMNS)
    assert real.num_rows == made.num_rows == 0
    assert [(f.name, str(f.type).replace(" not null", "")) for f in made.schema] == [
        (f.name, str(f.type).replace(" not null", "")) for f in real.schema]
    assert outages.with_outage_causes(cs, None) is cs
    rollup = request_rollup(prepare_requests(make_df("requests", [req("a1b2c3-1", 1, broker=B)])))
    assert overview(rollup, cs).collect()[0]["unreachable_connects"] == 0
    assert overview(rollup, make_df("connections", outage_rows())).collect()[0]["unreachable_connects"] == 880


def test_the_summary_says_how_many_connects_never_reached_the_broker() -> None:
    ov = {"connections": 890, "request_connections": 10, "unreachable_connects": 880}
    line = summary(AnalysisResult(Path("out"), [], ov, {}, 60, Path("r.html"), Path("f.json"), {})).splitlines()[0]
    assert "890 connections (880 of them connects the broker refused or never answered: see Broker outages)" in line
    assert "refused" not in summary(AnalysisResult(Path("out"), [], {"connections": 10}, {}, 60, Path("r.html"),
                                                   Path("f.json"), {})).splitlines()[0]


def test_the_summary_prints_a_client_chosen_title_without_its_terminal_escapes() -> None:
    """A client id is any text a client sends: in a finding title on stdout it cleared the operator's screen, set the
    window title and reversed the line (the HTML report escaped it; the terminal summary did not)."""
    from analytics.findings import Finding

    evil = "\x1b[2J\x1b[31mEVIL\u202e\x1b]0;title\x07"
    finding = Finding(id="client_inventory", severity="info", title=f"1 client: {evil}", summary="", evidence={})
    text = summary(AnalysisResult(Path("out"), [finding], {"connections": 1}, {}, 60, Path("r.html"), Path("f.json"),
                                  {}))
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\\x1b[2J\\x1b[31mEVIL\\u202e" in text
