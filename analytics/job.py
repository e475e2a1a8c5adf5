"""The analyze job: read -> transforms -> tables, findings.json, report.html, stdout summary.

`run_analysis` is the one entry point (the CLI and the scenarios call it). It
owns all I/O; transforms stay pure. Tables are small by construction (grouped,
or capped detail lists), so they are collected once with Arrow and then written
as Parquet + CSV, fed to the finding rules and rendered into the report.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics import load as L
from analytics.findings import run_rules
from analytics.findings.stretches import stretches_notice
from analytics.outdir import clear_artifacts
from analytics.progress import Progress
from analytics.report.html import connection_pages, render
from analytics.result import AnalysisResult
from analytics.session import (
    C1_ONLY_MAX_ROWS, MID_INPUT_ROWS, SMALL_INPUT_ROWS, default_master, get_spark, is_local, running_session, small_input_settings,
)
from analytics.transforms import brokers, bypass, clients, compare, connections, drilldown, errors, faults, latency, outages, overview, produce_fetch, rollups, stretches, tcp
from analytics.transforms.common import prepare_requests, union_all
from analytics.transforms.cube import cube_from_cells, latency_cube, percentile_views, tail_floor
from analytics.unmatched import empty_compare_sides, is_narrowed, nothing_matched
from recording.request_terms import ROLLUP_BUCKET_S
from recording.rollups import TIME_KEYED, RecordingCoverage, coverage_all, stored_span_ns
from recording.schema import DERIVED_DATASETS
from recording.terminal_text import printable
from recording.layout import hour_partition, partition_values
from recording.reader import LiveFiles, live_files

TABLE_ROW_CAP = 20_000  # a table bigger than this is a detail list; the report and rules need the top rows only
NICE_BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
TARGET_BUCKETS = 120
OVERLAP_MAX_ROWS = 2_000_000  # up to this many recorded rows, a local analysis overlaps its passes (overlapped_passes)

FINDINGS_FORMAT = 1


def choose_bucket(span_s: float | None) -> int:
    """A round interval giving about TARGET_BUCKETS points over the span."""
    if not span_s or span_s <= 0:
        return 60
    for b in NICE_BUCKETS:
        if span_s / b <= TARGET_BUCKETS:
            return b
    return NICE_BUCKETS[-1]


@dataclass
class Inputs:
    """What the report tables are computed from; the job pins (checkpoints) every one of them.

    Their blocks are freed by Spark's context cleaner once these objects are
    garbage collected, so a long-lived process can call `run_analysis` again.

    The raw request view is never cached (10 M rows): it is scanned, column-pruned,
    by the passes that build `rollup`, `topics` and `cube` (plus `traffic`
    and the notable rows: errors, answers naming brokers), and every table
    reads those small results.
    """

    rollup: DataFrame  # rollups.request_rollup
    topics: DataFrame  # rollups.topic_rollup
    traffic: DataFrame  # rollups.traffic_over_time
    views: DataFrame  # cube.percentile_views of the latency cube
    notable: DataFrame  # rollups.notable_requests: errors and answers naming brokers (`advertised`, `bypass`)
    conns: DataFrame
    sides: DataFrame
    requests: DataFrame | None = None  # the raw prepared view (never cached): slowest-N scans it once
    reactions: DataFrame | None = None  # faults.fault_reactions, pinned; None when no fault was injected
    cube: DataFrame | None = None  # the pinned latency cube: its tail bounds the slowest-requests scan
    slowest: DataFrame | None = None  # every file's slowest requests, as the writer kept them (recording.rollups); None: scan
    runs: DataFrame | None = None  # the runs/ rows (start, clean stop): the Proxy runs table; None: no such table
    outages: DataFrame | None = None  # outages.broker_outages, pinned; None when no connect found the broker unreachable
    spans: list[stretches.RunSpan] | None = None  # every proxy run's recorded span (stretches.collect_spans), on the driver

    def slowest_floor(self) -> int | None:
        """A latency at most the SLOWEST-th highest (cube.tail_floor), or None without a cube or enough requests."""
        if self.cube is None:
            return None
        return collect(tail_floor(self.cube, drilldown.SLOWEST)).column("floor_us")[0].as_py()

    @property
    def err(self) -> DataFrame:
        """The request rows with errors (the only place their nested error lists are read)."""
        return self.notable.where(F.col("error_count") > 0)


def table_plan(i: Inputs, bucket_s: int, window: tuple[int | None, int | None] = (None, None)
               ) -> dict[str, Callable[[], DataFrame | pa.Table]]:
    """Every report table, in report order, as a thunk so the job can time and run them concurrently.

    `window` is --since/--until in epoch ns: the requests are filtered already, and a connection is
    kept for the whole of its life if it overlaps the window, so every table of connections (series, ends,
    lifetimes, resets, reconnects, broker closes, unanswered at close) takes the window to read it as a
    recording of its own (transforms.window: `as_at_window_end`, connections already open at its start
    count as open, not as opens, and those open at its end as open, not as ends). The client inventory
    counts the connections that carried the client's requests, which are the window's already. The TCP
    tables read `i.sides`, which `tcp.tcp_sides` built from the samples inside the window. The broker's
    closes as it went away (`outages.with_outage_causes`) carry that cause in `connection_ends` and `broker_closes`.
    """
    return {
        "client_inventory": lambda: clients.client_inventory(i.rollup, i.topics, i.conns, i.spans),
        "topic_view": lambda: clients.topic_view(i.topics),
        "group_protocols": lambda: clients.group_protocols(i.rollup),
        "latency_by_api": lambda: latency.cube_latency_by_api(i.views),
        "broker_latency_by_api": lambda: latency.cube_broker_latency_by_api(i.views),
        "latency_by_api_version": lambda: latency.cube_latency_by_api_version(i.views),
        "latency_by_broker": lambda: latency.cube_latency_by_broker(i.views),
        "latency_by_topic": lambda: latency.cube_latency_by_topic(i.views),
        "latency_by_client": lambda: latency.cube_latency_by_client(i.views),
        "latency_over_time": lambda: latency.cube_latency_over_time(i.views),
        "proxy_delay_by_api": lambda: latency.cube_proxy_delay_by_api(i.views),
        "long_polls_by_client": lambda: latency.long_polls_by_client(i.rollup, i.views),
        "errors_by_name": lambda: errors.errors_by_name(i.err),
        "errors_over_time": lambda: errors.errors_over_time(i.err, bucket_s),
        "throttling": lambda: errors.throttling(i.rollup),
        "connections_over_time": lambda: connections.connections_over_time(i.conns, i.traffic, bucket_s, i.views, *window),
        "connection_lifetimes": lambda: connections.connection_lifetimes(i.conns, *window),
        "connection_ends": lambda: connections.connection_ends(outages.with_outage_causes(i.conns, i.outages), *window),
        "resets": lambda: connections.resets(i.conns, since_ns=window[0], until_ns=window[1]),
        "reconnects_by_client": lambda: connections.reconnects_by_client(i.conns, since_ns=window[0], until_ns=window[1],
                                                                         spans=i.spans, rollup=i.rollup),
        "broker_closes": lambda: connections.broker_closes(outages.with_outage_causes(i.conns, i.outages), since_ns=window[0],
                                                           until_ns=window[1]),
        "broker_outages": lambda: i.outages if i.outages is not None else empty_table(i.conns, outages.OUTAGE_COLUMNS),
        "unanswered_at_close": lambda: connections.unanswered_at_close(i.conns, i.rollup, since_ns=window[0], until_ns=window[1]),
        "recording_stretches": lambda: stretches.recording_stretches(i.conns, bucket_s, *window, spans=i.spans),
        **({} if i.runs is None else {"proxy_runs": lambda: stretches.proxy_runs(i.runs, i.conns, i.spans)}),
        "tcp_health": lambda: tcp.tcp_health(i.sides),
        "tcp_rtt_by_peer": lambda: tcp.tcp_rtt_by_peer(i.sides),
        "window_ceiling": lambda: tcp.window_ceiling(i.sides, i.rollup),
        "produce_acks": lambda: produce_fetch.produce_acks(i.rollup),
        "produce_batches": lambda: produce_fetch.produce_batches(i.topics, i.views),
        "produce_compression": lambda: produce_fetch.produce_compression(i.rollup),
        "produce_rate_by_topic": lambda: produce_fetch.produce_rate_by_topic(i.topics, i.spans),
        "fetch_by_consumer": lambda: produce_fetch.fetch_by_consumer(i.topics, i.spans),
        **({} if i.requests is None else {"bypass": lambda: bypass.bypassed_addresses(i.notable),
                                          "brokers": lambda: brokers.broker_ids(i.notable, i.conns)}),
        **({} if i.requests is None else {  # injected Kafka faults and the clients' reactions (issue 17)
            "fault_reactions_by_library": lambda: (faults.fault_reactions_by_library(i.reactions) if i.reactions is not None
                                                   else empty_table(i.requests, faults.BY_LIBRARY_COLUMNS)),
            "fault_reactions": lambda: (i.reactions if i.reactions is not None
                                        else empty_table(i.requests, faults.REACTIONS_COLUMNS)),
        }),
        **({} if i.requests is None else {
            "throughput_over_time": lambda: drilldown.throughput_over_time(i.traffic, i.topics, bucket_s),
            "slowest_requests": lambda: (drilldown.slowest_requests(i.slowest) if i.slowest is not None
                                         else drilldown.slowest_requests(i.requests, floor_us=i.slowest_floor())),
        }),
    }


def empty_table(like: DataFrame, columns: str) -> pa.Table:
    """An empty table with these columns (Spark DDL), typed as `toArrow` would type them, without a job.

    For the fault tables of a recording without injected faults: their plan cost ~3 s of a small
    analysis (analysed and run twice) to say nothing, and even an empty relation's `toArrow` runs
    a job (~0.5 s).
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    spark = like.sparkSession
    schema = spark.createDataFrame([], columns).schema  # parsed and resolved only: no job
    return to_arrow_schema(schema, error_on_duplicated_field_names_in_struct=True,
                           prefers_large_types=spark._jconf.arrowUseLargeVarTypes()).empty_table()


DRILLDOWN_TABLES = ("connection_facts", "connection_requests", "connection_tcp")
DRILLDOWN_CAP = 40  # connections that get a page of their own (report/connections/…): the ones tables point at


def referenced_connections(tables: dict[str, pa.Table], cap: int = DRILLDOWN_CAP) -> list[str]:
    """Conn ids the tables point at (`example_conn_id`, `conn_id`), at most `cap`.

    Every table's first examples come first, then the first rows of the tables that list
    connections (so each table's top rows link to a page), then the rest in table order.
    """
    examples, lists = [], []
    for name, t in tables.items():
        if name.startswith("compare_") or name in DRILLDOWN_TABLES:
            continue  # compare tables name connections of two recordings; the drill-down's own are its result
        for col, into in (("example_conn_id", examples), ("conn_id", lists)):
            if col in t.column_names:
                into.append([str(v) for v in t.column(col).to_pylist()[:cap] if v])
    seen: dict[str, None] = {}
    for ids in [ids[:5] for ids in examples] + [ids[:3] for ids in lists] + examples + lists:
        for v in ids:
            if len(seen) >= cap:
                return list(seen)
            seen.setdefault(v, None)
    return list(seen)


def _cluster_ids(spark: SparkSession, directory: str) -> list[str]:
    """The Kafka cluster ids a recording's `topics/` rows name (a few rows: one small job, compare only)."""
    topics, _, has_rows = L.read_dataset(spark, directory, "topics")
    if not has_rows:
        return []
    return sorted(r[0] for r in topics.select("cluster_id").distinct().collect() if r[0])


def compare_plan(spark: SparkSession, a_dir: str, b_dir: str, sides: tuple[L.Filters, L.Filters], mode: str, tolerance_s: float,
                 progress: Progress) -> tuple[str, dict[str, Callable[[], DataFrame]]]:
    """The comparison tables of A and B, each read through its own filters (`side_filters`)."""
    ra = L.load(spark, [a_dir], sides[0])
    rb = L.load(spark, [b_dir], sides[1])
    a, b = prepare_requests(ra.requests).cache(), prepare_requests(rb.requests).cache()
    if mode == "auto":
        mode = compare.choose_mode(a, b)
    windows = ("" if sides[0] == sides[1] else
               f" (A: {sides[0].describe()}; B: {sides[1].describe()})")
    progress.info(f"comparing {a_dir} (A) with {b_dir} (B): {mode} matching{windows}")
    m = compare.match_requests(a, b, mode, tolerance_s).cache()
    clusters = (_cluster_ids(spark, a_dir), _cluster_ids(spark, b_dir))
    return mode, {
        "compare_summary": lambda: compare.compare_summary(a, b, m, mode, clusters),
        "compare_by_api": lambda: compare.compare_by_api(m),
        "compare_by_connection": lambda: compare.compare_by_connection(m),
        "compare_errors": lambda: compare.compare_errors(m),
        "compare_ends": lambda: compare.compare_ends(m, ra.connections, rb.connections, (sides[0].since_ns, sides[0].until_ns),
                                                     (sides[1].since_ns, sides[1].until_ns)),
    }


def _csv_safe(t: pa.Table) -> pa.Table:
    """CSV cannot hold lists or structs: join lists with ';' and JSON-encode structs."""
    cols = []
    for name, col in zip(t.column_names, t.columns):
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_struct(col.type):
            vals = col.to_pylist()
            if pa.types.is_struct(col.type):
                cols.append(pa.array([json.dumps(v, default=str) if v is not None else None for v in vals], pa.string()))
            else:
                cols.append(pa.array([";".join("" if x is None else str(x) for x in v) if v is not None else None for v in vals], pa.string()))
        else:
            cols.append(col)
    return pa.table(cols, names=t.column_names)


def write_table(out: Path, name: str, t: pa.Table, csv: bool = True) -> None:
    d = out / "tables"
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, d / f"{name}.parquet")
    if csv:
        pacsv.write_csv(_csv_safe(t), d / f"{name}.csv")


def pin(df: DataFrame) -> DataFrame:
    """Materialize a small intermediate result once and cut its lineage.

    A local checkpoint keeps the rows in the executors' block managers and
    replaces the plan behind them, so the ~30 table queries over it plan in
    milliseconds and never recompute it. (A `.cache()` is matched by plan
    shape, and Spark misses that match when one cached grouping-sets plan is
    unioned with itself, silently recomputing it once per branch.)
    """
    return df.localCheckpoint(eager=True)


def stored_rollups(dirs: Sequence[str | Path], rollups: bool) -> dict[str, RecordingCoverage] | None:
    """Each recording's rollup coverage (recording.rollups.coverage_all), listed once per analysis; None when
    `rollups` is off (a filter, a comparison, --ignore-rollups) or some path cannot be listed."""
    if not rollups:
        return None
    out = {}
    for d in dirs:
        c = coverage_all(d)
        if c is None:
            return None
        out[str(d)] = c
    return out


def time_keyed_usable(covers: dict[str, RecordingCoverage] | None, dirs: Sequence[str | Path], bucket_s: int | None) -> bool:
    """Whether the time-keyed rollups (stored per ROLLUP_BUCKET_S) can make the analysis's time bucket.

    With no bucket given it is chosen from the span, which the stored request sums' footers
    bound from below (`stored_span_ns`): a recording of an hour or less gets a bucket under
    ROLLUP_BUCKET_S, and its time-keyed views are computed from the requests.
    """
    if bucket_s is None:
        listings = [covers[str(d)].listing("request_sums") if covers and str(d) in covers else None for d in dirs]
        spans = [stored_span_ns(live) if live is not None else None for live in listings]
        if not spans or any(sp is None for sp in spans):
            return False
        bucket_s = choose_bucket((max(sp[1] for sp in spans if sp) - min(sp[0] for sp in spans if sp)) / 1e9)
    return bucket_s % ROLLUP_BUCKET_S == 0


def read_datasets(cover: RecordingCoverage | None, time_keyed: bool) -> tuple[str, ...]:
    """The datasets an analysis's passes read in one recording: the stored rollups in place of the requests when
    every requests file has all of them, the requests too when the time-keyed rollups cannot make the bucket."""
    if cover is None or not cover.complete:
        return L.DATASETS_READ
    if time_keyed:
        return tuple(ds for ds in L.DATASETS_READ if ds != "requests") + DERIVED_DATASETS
    return L.DATASETS_READ + tuple(ds for ds in DERIVED_DATASETS if ds not in TIME_KEYED)


def input_rows(dirs: Sequence[str | Path], limit: int = SMALL_INPUT_ROWS, covers: dict[str, RecordingCoverage] | None = None,
               bucket_s: int | None = None) -> int | None:
    """Rows the analysis's passes read in `dirs` (Parquet footers), counting up to just past `limit`; None when unknown.

    Only tells a small input from a big one (the Spark settings follow), so it stops
    reading footers once past `limit` and gives up on paths pyarrow cannot list (e.g. `s3a://`).
    With rollups stored beside every requests file (`covers`, from `stored_rollups`), those are
    what the passes read, so they are what is counted (`read_datasets`).
    """
    total = 0
    time_keyed = covers is not None and time_keyed_usable(covers, dirs, bucket_s)
    for d in dirs:
        cover = covers.get(str(d)) if covers else None
        for ds in read_datasets(cover, time_keyed):
            listing = cover.listing(ds) if cover else None  # listed once, with the coverage
            if listing is None:
                listing = live_files(str(d), ds)
            if listing is None:
                return None
            for path in listing.paths:
                try:
                    total += pq.read_metadata(path, filesystem=listing.filesystem).num_rows
                except (OSError, ValueError):
                    return None  # unreadable footer: Spark will say so; no guess here
                if total > limit:
                    return total
    return total


DRILL_PRUNE_MIN_HOURS = 3  # recordings this long or longer: the drill-down reads only the hours it needs (drill_requests)


def drill_requests(rec: L.Recording, full: DataFrame, stored_sums: DataFrame | None,
                   covers: dict[str, RecordingCoverage] | None, drill: Sequence[str], prog: Progress) -> DataFrame:
    """The requests the drill-down's timelines read: only the hours that hold each connection's first requests.

    Why: a timeline shows a connection's first CONNECTION_REQUESTS requests, and a recording is
    partitioned by the hour of each request (recording.layout). The stored request sums say how
    many requests each connection has in each hour, so the hours up to the one where it reaches
    that many (or all of its own) are the only ones read: a few hours' files of a week-long
    recording instead of every request. The rows are those of a scan of everything (ordered by
    time, every row of an hour precedes the next hour's). One small job over the sums (~0.3 s),
    so not for recordings of fewer than DRILL_PRUNE_MIN_HOURS hours, where it would cost about
    what it could save; without the sums (a filter, --ignore-rollups, an older recording), or
    when every hour is needed, the whole recording is scanned as before.
    """
    recorded = recorded_hours([c.requests for c in covers.values()]) if stored_sums is not None and covers else None
    if recorded is None or len(recorded) < DRILL_PRUNE_MIN_HOURS:
        return full
    per_conn = drilldown.CONNECTION_REQUESTS
    counts: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for r in drilldown.connection_hours(stored_sums, drill).collect():
        counts.setdefault((r["proxy_id"], r["conn_id"]), []).append((r["hour_index"], r["requests"] or 0))
    pairs = []
    for (proxy, conn), hours in counts.items():
        seen = 0
        for hour_index, n in sorted(hours):  # its hours in time order, until they hold the timeline's requests
            if seen >= per_conn:
                break
            pairs.append((proxy, conn, *hour_partition(hour_index)))
            seen += n
    needed = {(d, h) for _, _, d, h in pairs}
    if not pairs or not needed < recorded:
        return full
    prog.info(f"drill-down: the requests of {len(needed)} of the recording's {len(recorded)} hours")
    return prepare_requests(rec.requests.where(drilldown.in_hours(pairs)))


def recorded_hours(listings: Sequence[LiveFiles]) -> set[tuple[str, int]] | None:
    """Every (date, hour) partition of the given requests listings; None if a file lies outside the date=/hour= layout."""
    out = set()
    for listing in listings:
        for rel in listing.relative:
            pv = partition_values(rel)
            if "date" not in pv or not pv.get("hour", "").isdigit():
                return None
            out.add((pv["date"], int(pv["hour"])))
    return out


class _RuntimeConf:
    """Set runtime SQL settings for one analysis and put the previous values back after it.

    The session is shared by every `run_analysis` of a process (scenarios, tests), so one
    analysis's size-based choice must not leak into the next.
    """

    def __init__(self, spark: SparkSession, settings: dict[str, str]) -> None:
        self.spark, self.settings, self.saved = spark, settings, {}

    def __enter__(self) -> None:
        for key, value in self.settings.items():
            self.saved[key] = self.spark.conf.get(key, None)
            self.spark.conf.set(key, value)

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                self.spark.conf.unset(key)
            else:
                self.spark.conf.set(key, value)


class _OneByOne:
    """The executor of `pass_runner(1)`: each submitted pass runs at once, on the caller's thread."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        done: Future = Future()
        try:
            done.set_result(fn(*args))
        except Exception as e:  # handed to whoever asks for the result, as a pool would (Ctrl-C stops at once)
            done.set_exception(e)
        return done

    def __enter__(self) -> "_OneByOne":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def pass_runner(passes: int) -> ThreadPoolExecutor | _OneByOne:
    """Where the job submits its passes over the requests: a pool of `passes - 1` threads (the job's own
    thread runs one more), or, for `passes` <= 1, one after another in submission order."""
    if passes <= 1:
        return _OneByOne()
    return ThreadPoolExecutor(max_workers=passes - 1, thread_name_prefix="kafkatap-pass")


def overlapped_passes(master: str, input_rows: int | None, parallel: int) -> int:
    """How many of the passes over the requests run at a time: `parallel`, unless the input is big and local.

    On a small or mid-sized input each pass's time is Spark's fixed per-job cost (planning,
    scheduling, single-task stages), which leaves a core idle: overlapping three took about 1 s off a
    demo-sized analysis and 1–6 s off a 1 M-request one. Past OVERLAP_MAX_ROWS the passes' own
    tasks keep both local cores busy and overlapping only adds contention (10 M requests: 53 and
    61 s one by one, 59 and 61 s overlapped; bench/RESULTS.md, twelfth session), so a big or
    unknown-sized local input gets them one by one. A cluster has the cores: it overlaps.
    """
    if is_local(master) and (input_rows is None or input_rows > OVERLAP_MAX_ROWS):
        return 1
    return max(1, parallel)


def row_counts(frames: dict[str, DataFrame]) -> dict[str, int]:
    """Rows of each (pinned) frame, counted in one Spark job instead of one job each.

    For the progress lines only, where six counts were six jobs of a few hundred ms of fixed cost each.
    """
    union = union_all([df.select(F.lit(name).alias("name"), F.lit(1).alias("one")) for name, df in frames.items()])
    rows = union.groupBy("name").agg(F.count("one").alias("n")).toArrow().to_pylist()
    got = {r["name"]: r["n"] for r in rows}
    return {name: got.get(name, 0) for name in frames}


def collect(df: DataFrame, cap: int = TABLE_ROW_CAP) -> pa.Table:
    return df.limit(cap).toArrow()


def collect_all(plan: dict[str, Callable[[], DataFrame | pa.Table]], prog: Progress, parallel: int
                ) -> dict[str, pa.Table]:
    """Collect every table, a few Spark jobs at a time (a thunk may hand back a table it made without Spark).

    Most tables are small aggregations whose wall time is dominated by
    per-job fixed costs (planning, code generation, scheduling) rather than
    by the scan of the cached data; overlapping a few of them keeps both
    cores busy. Results come back in plan order.
    """
    done: dict[str, pa.Table] = {}
    n = len(plan)

    def one(item: tuple[str, Callable[[], DataFrame | pa.Table]]) -> tuple[str, pa.Table, float]:
        name, thunk = item
        t0 = time.monotonic()
        got = thunk()
        return name, got if isinstance(got, pa.Table) else collect(got), time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="kafkatap-table") as pool:
        for i, (name, table, secs) in enumerate(pool.map(one, plan.items()), 1):
            done[name] = table
            prog.timings[f"table:{name}"] = round(secs, 3)
            prog.info(f"  ({i}/{n}) {name}: {table.num_rows:,} rows, {secs:.1f} s")
    return {name: done[name] for name in plan}


def run_analysis(
    dirs: Sequence[str | Path],
    out: str | Path,
    *,
    master: str | None = None,
    since: object = None,
    until: object = None,
    brokers: Sequence[str] = (),
    clients: Sequence[str] = (),
    topics: Sequence[str] = (),
    compare: tuple[str | Path, str | Path] | None = None,
    compare_mode: str = "auto",
    tolerance_s: float = 10.0,
    bucket_s: int | None = None,
    spark: SparkSession | None = None,
    progress: bool = True,
    csv: bool = True,
    report: bool = True,
    spark_conf: dict[str, str] | None = None,
    parallel: int | None = None,
    ignore_rollups: bool = False,
) -> AnalysisResult:
    """Analyze recordings `dirs` (or, with `compare=(A, B)`, compare two) and write OUT, an earlier analysis's files there removed.

    Returns the ranked findings, the overview row, every table's rows and the
    paths written (an `analytics.result.AnalysisResult`). `dirs` may be empty
    when `compare` is given. `ignore_rollups` computes everything from the request rows even where
    the recording stores rollups beside them (recording.rollups: the same result, slower; for checking them).
    """
    t_start = time.monotonic()
    parallel = parallel or int(os.environ.get("KAFKATAP_ANALYZE_PARALLEL", "3"))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    clear_artifacts(out)  # OUT holds this run's report only: no earlier run's tables or pages beside it
    spark = spark or running_session()
    spark_master = spark.sparkContext.master if spark is not None else default_master(master)
    # counted before a JVM starts: its JIT follows the size (session.driver_jvm); a cluster's storage is not read here
    # the passes read the stored rollups instead of the requests unless something rules them out (then count the requests)
    narrowed = since is not None or until is not None or bool(brokers or clients or topics) or compare is not None
    covers = stored_rollups(dirs, not (ignore_rollups or narrowed))
    rows = (input_rows([*dirs, *(compare or ())], max(C1_ONLY_MAX_ROWS, OVERLAP_MAX_ROWS, MID_INPUT_ROWS), covers, bucket_s)
            if is_local(spark_master) else None)
    spark = spark or get_spark(master, spark_conf, input_rows=rows)
    filters = L.Filters(*L.time_window(since, until, (list(dirs) or [compare[0]]) if compare else dirs),
                        tuple(brokers), tuple(clients), tuple(topics))
    sides = side_filters(filters, since, until, compare) if compare else None
    sized = {k: v for k, v in small_input_settings(spark_master, rows).items()
             if k not in (spark_conf or {})}  # the caller's --conf wins
    with _RuntimeConf(spark, sized):
        passes = overlapped_passes(spark_master, rows, parallel)
        return _run(spark, dirs, out, filters, t_start, parallel, passes, compare, compare_mode, tolerance_s, bucket_s, csv, report,
                    progress, covers, sides)


def side_filters(filters: L.Filters, since: object, until: object,
                 compare: tuple[str | Path, str | Path]) -> tuple[L.Filters, L.Filters]:
    """The filters of each side of a comparison: a `+SECONDS` end counts from that side's own first request.

    A recording and its replay, or two sides of a middlebox recorded at different
    times, are compared over "the same minutes of each": anchoring both to the
    earlier recording's start would put the later one's window before its data.
    Absolute times are the same for both sides.
    """
    out = []
    for side in compare:
        since_ns, until_ns = L.time_window(since, until, [side])
        out.append(replace(filters, since_ns=since_ns, until_ns=until_ns))
    return out[0], out[1]


def _run(spark: SparkSession, dirs: Sequence[str | Path], out: Path, filters: L.Filters, t_start: float, parallel: int, passes: int,
         compare: tuple[str | Path, str | Path] | None, compare_mode: str, tolerance_s: float, bucket_s: int | None,
         csv: bool, report: bool, progress: bool, covers: dict[str, RecordingCoverage] | None = None,
         sides: tuple[L.Filters, L.Filters] | None = None) -> AnalysisResult:
    """run_analysis's body, under the size-chosen SQL settings."""
    tables: dict[str, list[dict[str, Any]]] = {}
    arrow: dict[str, pa.Table] = {}
    mode_used: str | None = None
    with Progress(spark, enabled=progress) as prog:
        main_dirs = [str(d) for d in dirs] or ([str(compare[0])] if compare else [])
        prog.step("reading", f"{', '.join(main_dirs)} (filters: {filters.describe()})")
        rec = L.load(spark, main_dirs, filters)
        full = prepare_requests(rec.requests)  # never cached: the column-pruned passes below read it
        # a comparison reads both recordings' requests (its matching needs them); so do its main tables, as its sizing assumed
        stored = L.read_rollups(spark, main_dirs, covers) if covers is not None and dirs else {}
        stored_sums = stored.get("request_sums")  # per file (hour) and connection: what the drill-down's pruning reads
        if stored:
            prog.info(f"rollups stored beside every requests file: {', '.join(stored)} (the passes below sum them)")
        stale = sorted({c.stale for rc in (covers or {}).values() for c in rc.by_dataset.values() if c.stale})
        if stale:
            prog.info(f"rollups not used, computed from the requests instead: {'; '.join(stale)} "
                      "(`kafkatap rollups DIR` rewrites them)")
        used: list[str] = []

        def from_stored(dataset: str, build: Callable[[DataFrame], DataFrame], raw: Callable[[], Any]) -> Any:
            """`build` over the stored rollup when the recording has it (the same rows, a fraction of the work), else `raw`."""
            if dataset in stored:
                used.append(dataset)
                return build(stored[dataset])
            return raw()

        with pass_runner(passes) as pool:  # this thread runs one pass; the pool up to passes - 1 more
            prog.step("request rollup", ("summing the stored request sums per connection, client and API" if "request_sums" in stored
                                         else "one pass over the requests: sums per connection, client and API")
                      + (f"; the notable rows and TCP sides alongside ({passes} Spark jobs at a time)" if passes > 1 else ""))
            f_conns = pool.submit(pin, rec.connections)
            f_notable = pool.submit(lambda: pin(from_stored(  # few rows: errors, answers naming brokers
                "notable_requests", lambda df: rollups.notable_from_stored(df, rec.topic_names),
                lambda: rollups.notable_requests(full))))
            f_sides = pool.submit(lambda: pin(tcp.tcp_sides(f_conns.result(), rec.tcp, filters.since_ns, filters.until_ns)))
            rollup = pin(from_stored("request_sums", rollups.request_rollup_from_sums, lambda: rollups.request_rollup(full)))
            conns = f_conns.result()
            ov_t = collect(overview.overview(rollup, conns, filters.since_ns, filters.until_ns))  # span: data ∩ window
            arrow["overview"] = ov_t
            ov = (ov_t.to_pylist() or [{}])[0]
            bucket_s = bucket_s or choose_bucket(ov.get("span_s"))
            prog.info(f"{ov.get('requests') or 0:,} requests, {ov.get('connections') or 0:,} connections over "
                      f"{ov.get('span_s') or 0:,.0f} s; time bucket {bucket_s} s")
            unmatched = (nothing_matched(spark, main_dirs, filters)  # jobs of its own, only when the filters kept nothing
                         if not compare and is_narrowed(filters) and not ov.get("requests") and not ov.get("connections")
                         else None)
            if unmatched:
                prog.info(unmatched)
            if bucket_s % ROLLUP_BUCKET_S:  # the stored time-keyed rollups are per 60 s: this bucket cannot be made of them
                timed = [d for d in TIME_KEYED if stored.pop(d, None) is not None]
                if timed:
                    prog.info(f"time bucket {bucket_s} s is not a multiple of the stored rollups' {ROLLUP_BUCKET_S} s: "
                              f"{', '.join(timed)} computed from the requests")
            prog.step("topic rollup and latency cube",
                      "Produce and Fetch per client and topic, request rate per broker over time, all latency views")
            f_topics = pool.submit(lambda: pin(from_stored(
                "topic_sums", lambda df: rollups.topic_rollup_from_sums(df, bucket_s, rec.topic_names),
                lambda: rollups.topic_rollup(full, bucket_s))))
            f_traffic = pool.submit(lambda: pin(from_stored(
                "traffic_sums", lambda df: rollups.traffic_from_sums(df, bucket_s), lambda: rollups.traffic_over_time(full, bucket_s))))
            cube = pin(from_stored("latency_cells", lambda df: cube_from_cells(df, bucket_s, rec.topic_names),
                                   lambda: latency_cube(full, bucket_s)))
            views = pin(percentile_views(cube))
            # not `sides`: that name holds the --compare sides' filters (this DataFrame in their place broke every --compare)
            topics, traffic, notable, tcp_sides = f_topics.result(), f_traffic.result(), f_notable.result(), f_sides.result()
        if prog.enabled:  # counting is a Spark job: only for a reader, and one job for all of them
            n = row_counts({"rollup": rollup, "topics": topics, "traffic": traffic, "errors": notable.where(F.col("error_count") > 0),
                            "cube": cube, "views": views})
            prog.info(f"rollup {n['rollup']:,} rows, topic rollup {n['topics']:,}, {n['traffic']:,} broker × client intervals, "
                      f"{n['errors']:,} requests with errors; latency cube {n['cube']:,} cells, {n['views']:,} percentile rows")
        reactions = None
        if ov.get("faults_injected"):
            prog.step("fault reactions", f"{ov['faults_injected']:,} injected Kafka fault(s) and what each client did next")
            reactions = pin(faults.fault_reactions(full))
        slowest = from_stored("slowest_requests", lambda df: rollups.slowest_candidates(df, rec.topic_names), lambda: None)
        # the broker's outages (few rows) feed three tables: computed once, and only when some connect found it unreachable
        broker_down = pin(outages.broker_outages(conns, filters.since_ns, filters.until_ns)) if ov.get("unreachable_connects") else None
        inputs = Inputs(rollup, topics, traffic, views, notable, conns, tcp_sides, full, reactions, cube, slowest, rec.runs,
                        broker_down, stretches.collect_spans(conns))  # the runs' spans: one small job for six tables
        plan = table_plan(inputs, bucket_s, (filters.since_ns, filters.until_ns))
        if ov.get("opaque_connections"):  # TLS pass-through and other undecoded connections: only a recording with some pays
            plan["opaque_connections"] = lambda: connections.opaque_connections(conns, filters.since_ns, filters.until_ns)
        if ov.get("removed_version_connections"):  # clients a Kafka 4 broker would refuse: only a recording with some pays
            plan["kafka_4_upgrade"] = lambda: connections.kafka_4_upgrade(conns, filters.since_ns, filters.until_ns)
        if compare:
            mode_used, cplan = compare_plan(spark, str(compare[0]), str(compare[1]), sides or (filters, filters),
                                             compare_mode, tolerance_s, prog)
            plan.update(cplan)
        prog.step("tables", f"{len(plan)} tables, {parallel} Spark jobs at a time")
        arrow.update(collect_all(plan, prog, parallel))
        if compare and unmatched is None:  # a side the window or filters left empty: say which, and what it holds
            kept = [sum(arrow["compare_summary"].column(f"requests_{s}").to_pylist()) for s in "ab"]
            unmatched = empty_compare_sides(spark, [str(c) for c in compare], sides or (filters, filters), kept)
            if unmatched:
                prog.info(unmatched)
        drill = referenced_connections(arrow)
        if drill:
            prog.info(f"drill-down for {len(drill)} referenced connection(s)")
            arrow.update(collect_all({
                # a connection the broker closed as it went away says so on its page too, as in connection_ends
                "connection_facts": lambda: drilldown.connection_facts(outages.with_outage_causes(conns, broker_down), drill),
                "connection_requests": lambda: drilldown.connection_requests(
                    drill_requests(rec, full, stored_sums, covers, drill, prog), drill),
                "connection_tcp": lambda: drilldown.connection_tcp(rec.tcp, drill),
            }, prog, parallel))
        prog.step("writing", str(out))
        arrow["_meta"] = pa.table({"bucket_s": [bucket_s], "compare_mode": [mode_used], "rollups": [",".join(sorted(used))],
                                   "tolerance_s": [float(tolerance_s)]})  # the wire matching's, for compare_few_matched's causes
        for name, t in arrow.items():
            tables[name] = t.to_pylist()
            if not name.startswith("_"):
                write_table(out, name, t, csv)
        findings = run_rules(tables)
        findings_path = out / "findings.json"
        findings_path.write_text(json.dumps({
            "format": FINDINGS_FORMAT,
            "recordings": main_dirs,
            "compare": [str(c) for c in compare] if compare else None,
            "compare_mode": mode_used,
            "filters": filters.describe(),
            "bucket_s": bucket_s,
            "rollups": sorted(used),  # stored rollups the analysis summed instead of passing over the requests
            "nothing_matched": unmatched,  # the filters kept nothing: the recording's span and what there is (analytics.unmatched)
            "overview": {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in ov.items()},
            "findings": [f.to_json() for f in findings],
        }, indent=2, default=str))
        report_path = out / "report.html"
        result = AnalysisResult(out, findings, ov, tables, bucket_s, report_path, findings_path, prog.timings, mode_used, unmatched,
                                (filters.since_ns, filters.until_ns))
        if report:
            report_path.write_text(render(result, filters.describe()), encoding="utf-8")
            for rel, page in connection_pages(result).items():
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                (out / rel).write_text(page, encoding="utf-8")
    result.timings = dict(prog.timings, total=round(time.monotonic() - t_start, 3))
    return result


def summary(result: AnalysisResult) -> str:
    """The short stdout summary: headline numbers and the findings, most important first."""
    ov = result.overview
    unrecorded = (ov.get("request_connections") or 0) - (ov.get("connections") or 0)
    conns = f"{ov.get('connections') or 0:,} connections" + (
        f" (+{unrecorded:,} with requests but no connection row yet: still open when the proxy last wrote)"
        if unrecorded > 0 else "") + (
        f" ({ov['unreachable_connects']:,} of them connects the broker refused or never answered: see Broker outages)"
        if ov.get("unreachable_connects") else "")
    lines = [
        f"kafkatap analyze: {ov.get('requests') or 0:,} requests, {conns}, "
        f"{ov.get('client_ids') or 0} client ids, {ov.get('brokers') or 0} broker(s), span {ov.get('span_s') or 0:,.0f} s, "
        f"error rate {(ov.get('error_rate') or 0):.3%} (+{(ov.get('retriable_rate') or 0):.3%} retriable)",
    ]
    if result.nothing_matched:
        lines.append(printable(result.nothing_matched))
    notice = stretches_notice(result.tables)
    if notice:
        lines.append(f"Note: {notice}.")
    lines.append(f"{len(result.findings)} finding(s):")
    for f in result.findings[:15]:
        lines.append(f"  [{f.severity.upper():8}] {printable(f.title)}")  # titles name client ids: any text
    if len(result.findings) > 15:
        lines.append(f"  … {len(result.findings) - 15} more in findings.json")
    lines.append(printable(f"report:   {result.report_path}"))
    lines.append(printable(f"findings: {result.findings_path}"))
    lines.append(printable(f"tables:   {result.out / 'tables'}/"))
    return "\n".join(lines)
