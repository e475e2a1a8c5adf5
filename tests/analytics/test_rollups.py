"""The rollups stored beside each requests file (recording.latency_cells, recording.request_sums) against Spark's own.

The writer computes the latency cube's cells and the request, topic and traffic sums with
pyarrow; the analysis sums them instead of passing over every request. These tests hold
the two engines to the same rows, the merged rollups of several files to those of all
their rows, the percentiles read from merged cells to within one bin of the exact ones,
and a whole analysis with rollups to the same tables and findings as one without.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from analytics import load as L
from analytics.job import run_analysis, stored_rollups
from analytics.synthetic import RUN, generate, write_rows, write_table
from analytics.transforms import clients, drilldown, produce_fetch, rollups
from analytics.transforms.common import prepare_requests
from analytics.transforms.cube import cube_from_cells, latency_cube, percentile_views
from recording.latency_cells import BIN_BASE, ROLLUP_BUCKET_S, latency_cells, merge_cells
from recording.layout import file_range, recover
from recording.rollups import CELLS, coverage_all, derived_path, merge_hour, write_missing
from recording.schema import DERIVED_DATASETS
from recording.timestamps import from_epoch_ns, ingest_schema
from tests.analytics.analytics_rows import S, T0, req

CELL = ("dim", "k1", "k2", "metric", "bin", "n", "s", "mx")


def _set(rows: list) -> set[tuple]:
    return {tuple(r[k] for k in CELL) for r in rows}


def _spark_cube(spark, root: Path, bucket_s: int = ROLLUP_BUCKET_S) -> set[tuple]:
    rec = L.load(spark, [str(root)])
    return _set([r.asDict() for r in latency_cube(prepare_requests(rec.requests), bucket_s).collect()])


def _read_stored(spark, root: Path) -> dict:
    """The stored rollups an analysis of `root` would read (its coverage listed as `run_analysis` lists it)."""
    return L.read_rollups(spark, [str(root)], stored_rollups([str(root)], True))


def _stored(spark, root: Path, bucket_s: int = ROLLUP_BUCKET_S) -> set[tuple]:
    rec = L.load(spark, [str(root)])
    cells = _read_stored(spark, root)[CELLS]
    return _set([r.asDict() for r in cube_from_cells(cells, bucket_s, rec.topic_names).collect()])


EDGE_ROWS = [
    req("c1", 1, "Fetch", lat_us=500_300, broker_latency_us=500_100, max_wait_ms=500, record_bytes=0, topics=["t"]),  # long poll
    req("c1", 2, "Fetch", t_s=70, lat_us=3000, broker_latency_us=2900, max_wait_ms=500, record_bytes=9000, topics=["t", "u"]),
    req("c1", 3, "Fetch", t_s=71, lat_us=None, max_wait_ms=500, record_bytes=None, topics=["t"]),  # unanswered Fetch
    req("c1", 4, "Fetch", t_s=72, lat_us=800, broker_latency_us=None, max_wait_ms=500, record_bytes=0),  # no broker latency
    req("c2", 1, "Produce", t_s=5, lat_us=2000, client="p", topics=["t"], request_bytes=4096),
    req("c2", 2, "Produce", t_s=130, lat_us=40_000, client="p", topics=["u"], request_bytes=100),
    req("c2", 3, "Produce", t_s=131, lat_us=None, client="p", topics=["u"], request_bytes=1_000_000),  # unanswered
    req("c2", 4, "Produce", t_s=132, lat_us=0, client=None, topics=[], request_bytes=1, proxy_req_delay_us=None),
    req("c3", 1, "Metadata", t_s=3599.9999, lat_us=1, client="admin", api_version=12),  # last µs before the hour
    req("c3", 2, "Metadata", t_s=3600, lat_us=2, client="admin", broker="10.0.0.2:9092", answered=None),
]


def test_cells_equal_the_spark_cube_cell_for_cell(spark, tmp_path) -> None:
    """Edge rows (long polls, nulls, zero and one µs, no topics, no client id, an hour edge) and a mixed recording."""
    edge = tmp_path / "edge"
    write_rows(edge, "requests", EDGE_ROWS)
    mixed = tmp_path / "mixed"
    generate(mixed, 6000, span_s=5400)
    for root in (edge, mixed):
        assert _stored(spark, root) == _spark_cube(spark, root), root


WAIT = {"max_wait_ms": 500, "topics": ["t"]}
SHARE_ROWS = [
    req("c1", 1, "Fetch", lat_us=500_300, broker_latency_us=500_100, record_bytes=0, **WAIT),  # a long poll
    req("s1", 2, "ShareFetch", t_s=1, lat_us=500_400, broker_latency_us=500_200, record_bytes=0, client="sh", **WAIT),  # one too
    req("s1", 3, "ShareFetch", t_s=2, lat_us=450_000, broker_latency_us=449_000, record_bytes=700, client="sh", **WAIT),  # read late
    req("s1", 4, "ShareFetch", t_s=3, lat_us=3000, broker_latency_us=2900, record_bytes=0, client="sh", **WAIT),  # empty at once
]


def _view_counts(cells: set[tuple], dim: str, metric: str) -> dict[str, int]:
    """Values per first key of one latency view (cells as `_set` gives them, counts summed over the bins)."""
    out: dict[str, int] = {}
    for c in cells:
        if c[0] == dim and c[3] == metric:
            out[c[1]] = out.get(c[1], 0) + c[5]
    return out


def test_share_fetch_long_polls_are_labelled_and_left_out_alike_in_both_engines(spark, tmp_path) -> None:
    """A ShareFetch that only waited is a long poll in the writer's rollups and in Spark, under its own label, and
    out of real latency, the request sums' counts and the slowest requests: both engines, the same rows."""
    root = tmp_path / "rec"
    write_rows(root, "requests", SHARE_ROWS)
    cube = _spark_cube(spark, root)
    assert _stored(spark, root) == cube
    assert _view_counts(cube, "api", "broker_latency") == {"Fetch (long poll)": 1, "ShareFetch (long poll)": 1, "ShareFetch": 2}
    assert _view_counts(cube, "client", "latency") == {"sh": 2}
    full = prepare_requests(L.load(spark, [str(root)]).requests)
    stored = _read_stored(spark, root)
    raw, summed = rollups.request_rollup(full), rollups.request_rollup_from_sums(stored["request_sums"])
    assert _rows_of(summed) == _rows_of(raw)
    assert {r["api_name"]: r["long_polls"] for r in raw.collect()} == {"Fetch": 1, "ShareFetch": 1}
    slowest = drilldown.slowest_requests(rollups.slowest_candidates(stored["slowest_requests"], {}), 7)
    assert _rows_of(slowest) == _rows_of(drilldown.slowest_requests(full, 7))
    assert sorted(r["correlation_id"] for r in slowest.collect()) == [3, 4]


def test_rollups_of_an_older_rollup_version_are_not_read_by_the_analysis(spark, tmp_path) -> None:
    """Stored rollups without a rollup version (an older kafkatap's, which counted no ShareFetch as a long poll) are
    left for the requests: the analysis equals one that ignores rollups."""
    root = tmp_path / "rec"
    write_rows(root, "requests", SHARE_ROWS)
    for path in (root / "request_sums").rglob("*.parquet"):  # what an older kafkatap stored: no ShareFetch long poll
        table = pq.read_table(path)
        old = {k: v for k, v in table.schema.metadata.items() if k != b"kafkatap.rollup_version"}
        sums = table.set_column(table.schema.get_field_index("long_polls"), "long_polls",
                                pa.array([int(a == "Fetch") for a in table["api_name"].to_pylist()], pa.int64()))
        pq.write_table(sums.replace_schema_metadata(old), path)
    result = _analysis(spark, root, tmp_path / "out")
    assert "request_sums" not in result.tables["_meta"][0]["rollups"].split(",")
    assert {r["client_id"]: r["long_polls"] for r in result.tables["long_polls_by_client"]} == {"app-1": 1, "sh": 1}
    _same_tables(result, run_analysis([str(root)], tmp_path / "raw", spark=spark, progress=False, report=False, csv=False,
                                      bucket_s=60, ignore_rollups=True))


def _err(name: str | None, topic: str | None = None) -> dict:
    return {"code": 6, "name": name, "topic": topic, "partition": 0, "resource": None}


# fetches whose response said how many bytes each topic got (`topic_record_bytes`, aligned with `topics`)
_ID = "8f1c2f0e-1111-4222-8333-944445555666"
_PER_TOPIC = [
    {"topics": ["t", "u", "v"], "record_bytes": 1000, "topic_record_bytes": [0, 900, 100]},
    {"topics": ["u"], "record_bytes": 70, "topic_record_bytes": [70]},
    {"topics": ["t", _ID], "topic_ids": [_ID], "record_bytes": 300, "topic_record_bytes": [0, 300]},  # id named late
    {"topics": ["t", "u"], "record_bytes": 40, "topic_record_bytes": [40]},  # not aligned: split evenly
    {"topics": ["v"], "record_bytes": 0, "topic_record_bytes": None},  # a poll that received nothing
]
SUM_ROWS = EDGE_ROWS + [
    req("c1", 9, "Fetch", t_s=2, lat_us=500_200, broker_latency_us=500_050, max_wait_ms=500, record_bytes=0, topics=["t"]),  # 2nd long poll
    req("c4", 1, "Produce", t_s=10, errors=[_err("NOT_LEADER_OR_FOLLOWER", "t")], error_count=1, throttle_ms=250, topics=["t"]),
    req("c4", 2, "Produce", t_s=11, errors=[_err("CORRUPT_MESSAGE", "t"), _err("NOT_LEADER_OR_FOLLOWER", "t")], error_count=2,
        edit="fault#1 error=CORRUPT_MESSAGE in-place", compression="zstd", acks=1),
    req("c4", 3, "JoinGroup", t_s=12, errors=[_err("MEMBER_ID_REQUIRED")], error_count=1, group_id="g"),
    req("c4", 4, "Heartbeat", t_s=13, errors=[], error_count=1, throttle_ms=0),  # a count without names: an error
    req("c4", 5, "Heartbeat", t_s=14, errors=[_err(None)], error_count=1, throttle_ms=None),
    # errors kafkatap injected are not the broker's: one that is all injected, one whose edit failed (the broker's)
    req("c4", 6, "Produce", t_s=15, errors=[_err("NOT_LEADER_OR_FOLLOWER", "t")], error_count=1, topics=["t"],
        edit="fault#2 delay=5ms; fault#3 error=NOT_LEADER_OR_FOLLOWER rewrite"),
    req("c4", 7, "Produce", t_s=16, errors=[_err("NOT_LEADER_OR_FOLLOWER", "t")], error_count=1, topics=["t"],
        edit="fault#3 error=NOT_LEADER_OR_FOLLOWER rewrite (not applied)"),
    req("c5", 1, "Metadata", t_s=20, advertised=["1@10.0.0.1:9092", "2@10.9.9.9:9092"], bypass=["10.9.9.9:9092"]),
    req("c5", 2, "Fetch", t_s=21, lat_us=90_000, response_bytes=1_000_000, record_bytes=999_000, records=None,
        resp_first_ns=T0 + 21 * S, resp_last_ns=T0 + 21 * S + 40_000_000, topics=None, client_addr="[::1]:5000"),
    req("c5", 3, "ShareFetch", t_s=22, topics=["t", "u", "v"], records=7, record_bytes=700, client_addr="host-only"),
    req("c5", 4, "Fetch", t_s=23, topics=["8f1c2f0e-1111-4222-8333-944445555666"], topic_ids=["8f1c2f0e-1111-4222-8333-944445555666"],
        errors=[_err("UNKNOWN_TOPIC_ID", "8f1c2f0e-1111-4222-8333-944445555666")], error_count=1),
    *[req("c6", i, "Fetch", t_s=30 + i, client="reader", **kw) for i, kw in enumerate(_PER_TOPIC, 1)],
    req("c7", 1, "Produce", t_s=40, client="writer", topics=["t", "u"], record_bytes=500, topic_record_bytes=[450, 50],
        records=10, topic_records=[9, 1]),
]


def _rows_of(df) -> list[str]:
    """Rows as sorted text, doubles to 9 significant digits (sums of partial sums round differently)."""
    def cell(v):
        return f"{v:.9g}" if isinstance(v, float) else repr(v)
    return sorted(repr([(k, cell(v)) for k, v in sorted(r.asDict(recursive=True).items())]) for r in df.collect())


def test_stored_sums_equal_the_spark_rollups(spark, tmp_path) -> None:
    """Request, topic and traffic sums, the notable rows and the slowest requests: from stored rollups and from the requests."""
    root = tmp_path / "rec"
    write_rows(root, "requests", SUM_ROWS)
    write_rows(root, "topics", [{"proxy_id": "p1", "topic_id": "8f1c2f0e-1111-4222-8333-944445555666", "name": "payments",
                                 "first_seen_ns": T0}])
    mixed = tmp_path / "mixed"
    generate(mixed, 5000, span_s=5400)
    for r in (root, mixed):
        rec = L.load(spark, [str(r)])
        full = prepare_requests(rec.requests)
        stored = _read_stored(spark, r)
        pairs = [
            (rollups.request_rollup(full), rollups.request_rollup_from_sums(stored["request_sums"])),
            (rollups.topic_rollup(full, 300), rollups.topic_rollup_from_sums(stored["topic_sums"], 300, rec.topic_names)),
            (rollups.traffic_over_time(full, 120), rollups.traffic_from_sums(stored["traffic_sums"], 120)),
            (rollups.notable_requests(full), rollups.notable_from_stored(stored["notable_requests"], rec.topic_names)),
            (drilldown.slowest_requests(full, 7), drilldown.slowest_requests(rollups.slowest_candidates(
                stored["slowest_requests"], rec.topic_names), 7)),
        ]
        for raw, summed in pairs:
            assert raw.columns == summed.columns, (raw.columns, summed.columns)
            types = [[(f.name, f.dataType) for f in df.schema] for df in (raw, summed)]  # nullability may differ
            assert types[0] == types[1], [(a, b) for a, b in zip(*types) if a != b]
            assert _rows_of(summed) == _rows_of(raw)
    kept = rollups.notable_from_stored(_read_stored(spark, root)["notable_requests"],
                                       {"8f1c2f0e-1111-4222-8333-944445555666": "payments"}).where(F.col("conn_id") == "c5")
    by_api = {r["api_name"]: r for r in kept.collect()}
    assert by_api["Metadata"]["bypass"] == ["10.9.9.9:9092"]  # the answer naming brokers
    assert by_api["Fetch"]["topics"] == ["payments"] and by_api["Fetch"]["errors"][0]["topic"] == "payments"  # named late


def test_merged_cells_equal_the_cells_of_all_rows() -> None:
    rng = random.Random(3)
    rows = [req(f"c{i % 7}", i, rng.choice(["Produce", "Fetch", "Metadata"]), t_s=rng.uniform(0, 900),
                lat_us=int(rng.lognormvariate(8, 1.5)), client=f"app-{i % 5}") for i in range(3000)]
    table = from_epoch_ns(pa.Table.from_pylist(rows, schema=ingest_schema("requests")), "requests")  # as on disk
    whole = latency_cells(table)
    parts = merge_cells(latency_cells(table.slice(a, 1000)) for a in (0, 1000, 2000))
    assert _set(parts.to_pylist()) == _set(whole.to_pylist())
    assert parts.num_rows < table.num_rows * 9  # cells, not copies: some values share a bin


def test_cube_from_cells_rebuckets_and_names_topic_ids(spark, tmp_path) -> None:
    """Two files (two hours) summed, time views moved to 300 s buckets, a topic id named from topics/."""
    root = tmp_path / "rec"
    tid = "8f1c2f0e-1111-4222-8333-944445555666"
    rows = [req("c1", i, "Produce", t_s=i * 37.0, lat_us=1000 + 17 * i, topics=["orders"]) for i in range(150)]
    rows += [req("c2", i, "Fetch", t_s=i * 41.0, lat_us=5000 + i, record_bytes=10, topics=[tid], topic_ids=[tid])
             for i in range(120)]
    write_rows(root, "requests", rows)
    write_rows(root, "topics", [{"proxy_id": "p1", "topic_id": tid, "name": "payments", "first_seen_ns": rows[0]["req_first_ns"]}])
    assert len(list((root / CELLS).rglob("*.parquet"))) == 2
    got = _stored(spark, root, 300)
    assert got == _spark_cube(spark, root, 300)
    assert any(c[0] == "topic" and c[1] == "payments" for c in got) and not any(c[1] == tid for c in got)


def test_percentiles_from_merged_cells_are_within_one_bin_of_exact(spark, tmp_path) -> None:
    """The issue's ask: percentiles read from histograms merged across files, against exact ones from the raw values."""
    rng = random.Random(11)
    root = tmp_path / "rec"
    lat = {c: [int(rng.lognormvariate(mu, 1.1)) + 1 for _ in range(4000)] for c, mu in (("fast", 6.0), ("slow", 10.0))}
    for hour in range(3):  # three files, each holding a third of every client's values
        rows = [req(f"{c}-{hour}", i, "Produce", t_s=hour * 3600 + i * 0.5, lat_us=v, client=c)
                for c, vals in lat.items() for i, v in enumerate(vals[hour::3])]
        write_table(root, "requests", pa.Table.from_pylist(rows, schema=ingest_schema("requests")))
    assert len(coverage_all(root).by_dataset[CELLS].files) == 3
    views = percentile_views(cube_from_cells(_read_stored(spark, root)[CELLS], 60, {}))
    got = {r["k1"]: r.asDict() for r in views.where((F.col("dim") == "client") & (F.col("metric") == "latency")).collect()}
    for client, values in lat.items():
        ordered = sorted(values)
        row = got[client]
        assert row["count"] == len(values) and row["max_us"] == ordered[-1]
        assert row["mean_us"] == pytest.approx(sum(values) / len(values), abs=0.05)
        for q, name in ((0.5, "p50_us"), (0.9, "p90_us"), (0.99, "p99_us"), (0.999, "p999_us")):
            exact = ordered[math.ceil(q * len(values)) - 1]  # nearest rank
            assert exact <= row[name] <= exact * BIN_BASE, (client, name, exact, row[name])
            assert row[name] in values  # a value actually seen


def test_an_analysis_with_cells_equals_one_without(spark, tmp_path) -> None:
    root = tmp_path / "rec"
    generate(root, 4000)
    runs = {}
    for ignore in (False, True):
        runs[ignore] = run_analysis([str(root)], tmp_path / f"out-{ignore}", spark=spark, progress=False, report=False,
                                    csv=False, ignore_rollups=ignore)
    with_cells, without = runs[False], runs[True]
    assert with_cells.tables["_meta"][0]["rollups"] == ",".join(sorted(DERIVED_DATASETS))
    assert without.tables["_meta"][0]["rollups"] == ""
    for name, rows in without.tables.items():
        if name != "_meta":
            assert sorted(map(repr, with_cells.tables[name])) == sorted(map(repr, rows)), name
    assert [f.to_json() for f in with_cells.findings] == [f.to_json() for f in without.findings]
    assert with_cells.findings  # the synthetic incidents are found either way


def test_cells_stand_in_only_for_every_file_and_no_filter(spark, tmp_path) -> None:
    root = tmp_path / "rec"
    write_rows(root, "requests", [req("c1", i, t_s=i * 30.0) for i in range(300)])  # 2.5 h: three files
    files = sorted((root / "requests").rglob("*.parquet"))
    assert len(files) == 3 and all(derived_path(f, d).is_file() for f in files for d in DERIVED_DATASETS)
    assert set(_read_stored(spark, root)) == set(DERIVED_DATASETS)
    narrowed = run_analysis([str(root)], tmp_path / "out0", spark=spark, progress=False, report=False, csv=False, clients=("app-1",))
    assert narrowed.tables["_meta"][0]["rollups"] == ""  # rollups cannot be narrowed
    derived_path(files[1], CELLS).unlink()  # e.g. a crash between the requests file and its rollups
    assert not coverage_all(root).by_dataset[CELLS].complete
    assert CELLS not in _read_stored(spark, root)
    result = run_analysis([str(root)], tmp_path / "out", spark=spark, progress=False, report=False, csv=False)
    assert result.tables["_meta"][0]["rollups"] == "notable_requests,request_sums,slowest_requests,topic_sums,traffic_sums"
    assert write_missing(root, fsync=False, merge=False).written == 1  # filled in afterwards
    assert coverage_all(root).by_dataset[CELLS].complete
    odd = run_analysis([str(root)], tmp_path / "out2", spark=spark, progress=False, report=False, csv=False, bucket_s=90)
    assert odd.tables["_meta"][0]["rollups"] == "notable_requests,request_sums,slowest_requests"  # 90 s: not a multiple of the stored 60 s
    assert result.tables["latency_by_api"] == run_analysis(
        [str(root)], tmp_path / "out3", spark=spark, progress=False, report=False, csv=False).tables["latency_by_api"]


def test_cells_files_name_their_requests_file(tmp_path) -> None:
    root = tmp_path / "rec"
    (path,) = write_rows(root, "requests", [req("c1", 1)])
    cells = derived_path(path, CELLS)
    assert cells.relative_to(root / CELLS) == path.relative_to(root / "requests")
    assert int(pq.read_metadata(cells).metadata[b"kafkatap.source_rows"]) == 1
    assert pq.read_schema(cells).names == list(CELL)


def _analysis(spark, root: Path, out: Path):
    return run_analysis([str(root)], out, spark=spark, progress=False, report=False, csv=False, bucket_s=60)


def _same_tables(a, b) -> None:
    for name, rows in a.tables.items():
        if name != "_meta":
            assert sorted(map(repr, rows)) == sorted(map(repr, b.tables[name])), name


def test_an_hours_rollups_merge_into_one_file_standing_for_its_range(spark, tmp_path) -> None:
    """merge_hour: one file per dataset stands for the hour's requests files, the analysis is unchanged, a crash's
    leftovers are hidden and removed, and a file that lacks its rollups blocks the merge until it is backfilled."""
    root = tmp_path / "rec"
    hour = [r for r in SUM_ROWS if r["req_first_ns"] < T0 + 3600 * S]
    for part in (hour[0::3], hour[1::3], hour[2::3]):
        write_rows(root, "requests", part)
    (directory,) = {p.parent for p in (root / "requests").rglob("*.parquet")}
    assert len(list(directory.iterdir())) == 3
    per_file = _analysis(spark, root, tmp_path / "per-file")
    kept = {p: p.read_bytes() for p in (root / CELLS).rglob("*.parquet")}
    assert merge_hour(directory, RUN, fsync=False) == len(DERIVED_DATASETS)
    (merged,) = (root / CELLS).rglob("*.parquet")
    run, first, last = file_range(merged.name)
    assert run == RUN and [file_range(p.name)[1] for p in sorted(directory.iterdir())] == [first, first + 1, last]
    assert int(pq.read_metadata(merged).metadata[b"kafkatap.source_rows"]) == len(hour)
    assert coverage_all(root).by_dataset[CELLS].complete and len(coverage_all(root).by_dataset[CELLS].files) == 1
    after = _analysis(spark, root, tmp_path / "merged")
    assert after.tables["_meta"][0]["rollups"] == ",".join(sorted(DERIVED_DATASETS))
    _same_tables(per_file, after)
    for p, data in kept.items():  # a crash between writing the merged file and deleting its inputs
        p.write_bytes(data)
    assert coverage_all(root).by_dataset[CELLS].files == (f"{root}/{CELLS}/{merged.relative_to(root / CELLS)}",)
    assert recover(root) == len(kept) and not any(p.exists() for p in kept)
    # a later requests file of the hour (a late row) without its rollups (a crash): not covered, and no merge claims it
    write_table(root, "requests", pa.Table.from_pylist([req("c9", 1, t_s=3000)], schema=ingest_schema("requests")), rollups=False)
    assert merge_hour(directory, RUN, fsync=False) == 0
    assert not coverage_all(root).by_dataset[CELLS].complete
    done = write_missing(root, fsync=False)
    assert (done.written, done.skipped, done.merged) == (1, 0, 1)
    (again,) = (root / CELLS).rglob("*.parquet")
    assert file_range(again.name) == (RUN, first, last + 1) and coverage_all(root).by_dataset[CELLS].complete
    raw = run_analysis([str(root)], tmp_path / "raw", spark=spark, progress=False, report=False, csv=False, bucket_s=60,
                       ignore_rollups=True)
    _same_tables(raw, _analysis(spark, root, tmp_path / "again"))


def test_the_drill_down_reads_only_the_hours_its_connections_need(spark, tmp_path) -> None:
    """drill_requests: from the stored request sums, each connection is read from the hours up to the one that holds
    its timeline's requests (or all of its own); the timelines equal a scan of everything, which needs every hour."""
    from analytics.job import drill_requests
    from analytics.progress import Progress

    root = tmp_path / "rec"
    rows = [req("idle", i, t_s=60 + i) for i in range(30)]  # hour 0 (09:00): no drilled connection
    rows += [req("solo", i, t_s=3600 + i) for i in range(20)]  # hour 1: all of its own requests
    rows += [req("c1", i, t_s=7000 + i) for i in range(5)]  # hour 1: 5, then 400 in hour 2: needs hour 2 too
    rows += [req("c1", 5 + i, t_s=7200 + i) for i in range(400)]
    rows += [req("c2", i, t_s=7300 + i) for i in range(350)]  # hour 2: more than a timeline shows, then hour 3
    rows += [req("c2", 350 + i, t_s=3 * 3600 + 10 + i) for i in range(50)]
    write_rows(root, "requests", rows)
    rec = L.load(spark, [str(root)])
    full = prepare_requests(rec.requests)
    drill = ["solo", "c1", "c2"]
    want = drilldown.connection_requests(full, drill).collect()
    assert {r["conn_id"] for r in want} == set(drill) and len(want) == 20 + 2 * drilldown.CONNECTION_REQUESTS
    covers = stored_rollups([str(root)], True)
    pruned = drill_requests(rec, full, _read_stored(spark, root)["request_sums"], covers, drill, Progress(spark, enabled=False))
    assert pruned is not full
    for hour in ("09", "12"):  # neither holds a timeline's requests: a scan of everything now fails, the drill-down must not
        (path,) = (root / "requests").rglob(f"hour={hour}/*.parquet")
        path.unlink()
    with pytest.raises(Exception, match="FILE_NOT_EXIST"):
        full.count()
    assert drilldown.connection_requests(pruned, drill).collect() == want
    assert drill_requests(rec, full, None, None, drill, Progress(spark, enabled=False)) is full  # no stored sums: scan


def test_a_fetch_s_bytes_go_to_each_topic_as_its_response_carried_them(spark, tmp_path) -> None:
    """A fetch naming three topics that received records of two is not split three ways, in either engine; nor is a
    Produce to two topics."""
    root = tmp_path / "rec"
    write_rows(root, "requests", SUM_ROWS)
    write_rows(root, "topics", [{"proxy_id": "p1", "topic_id": _ID, "name": "payments", "first_seen_ns": T0}])
    rec = L.load(spark, [str(root)])
    raw = rollups.topic_rollup(prepare_requests(rec.requests), 300)
    summed = rollups.topic_rollup_from_sums(_read_stored(spark, root)["topic_sums"], 300, rec.topic_names)
    for df in (raw, summed):
        got = {r["topic"]: (r["b"], r["e"]) for r in df.where(F.col("client_id") == "reader").groupBy("topic").agg(
            F.sum("fetch_bytes_split").alias("b"), F.sum("empty").alias("e")).collect()}
        # (bytes, fetches that brought the topic nothing): t got nothing in two of its fetches, v in one
        assert got == {"t": (0 + 0 + 20, 2), "u": (900 + 70 + 20, 0), "v": (100 + 0, 1), "payments": (300, 0)}, got
    # the report's topic view reads them: no fetch's whole bytes under every topic it named
    view = {r["topic"]: r["bytes_fetched"] for r in clients.topic_view(raw.where(F.col("client_id") == "reader")).collect()}
    assert view == {"t": 20, "u": 990, "v": 100, "payments": 300}, view
    # a Produce to two topics: each one's own batches, in the topic view and the produce rates
    produced = raw.where(F.col("client_id") == "writer")
    assert {r["topic"]: (r["bytes_produced"], r["records_produced"]) for r in clients.topic_view(produced).collect()} == {
        "t": (450, 9), "u": (50, 1)}
    assert {r["topic"]: (r["bytes"], r["records"]) for r in produce_fetch.produce_rate_by_topic(produced).collect()} == {
        "t": (450, 9), "u": (50, 1)}
