"""Read one or more recordings into Spark DataFrames, checked, filtered and de-duplicated.

A recording directory holds `requests/`, `connections/`, `tcp/`, `topics/`, `runs/` (and optional
`frames/`), each Hive-partitioned by proxy/date/hour. Every transform works on
the `Recording` returned here, so the format-version check, the time and
broker/client/topic filters, the connection-snapshot de-duplication and the ends of
connections whose proxy run is over (`transforms.runs`) happen exactly once. This module is the analytics' I/O boundary; the transforms only
see DataFrames.

Which files are read, and whether their version can be read, is decided by
`recording.reader` — the same reader replay and the tests use — so Spark
skips exactly the files pyarrow skips (in-progress `.tmp-` files, flush files
a merged file already holds after a crash during compaction) and refuses
exactly the versions pyarrow refuses. Spark is then handed that explicit file
list (with `basePath`, so the Hive partition columns still come out).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from analytics.spark_schema import conform, spark_schema, spark_type, timestamps_as_epoch_ns
from analytics.transforms.common import host, literal_rows, union_all
from analytics.transforms.runs import RunMark, last_signs, marks_of, settle_unrecorded_ends, unstopped_runs
from analytics.transforms.topics import name_connection_topics, name_topic_ids, topic_pairs
from analytics.transforms.window import seen_in_window, taken_inside
from recording import schema as rec
from recording.migrations import MIGRATIONS, RecordingFormatError
from recording.reader import LiveFiles, dataset_version, live_files, recording_start
from recording.rollups import RecordingCoverage
from recording.timespec import resolve_window

__all__ = ["DATASETS_READ", "RecordingFormatError", "MIGRATIONS", "Filters", "Recording", "fmt_ns", "time_window",
           "read_dataset", "dedupe_connections", "apply_filters", "read_rollups", "load"]

DATASETS_READ = ("requests", "connections", "tcp")


@dataclass
class Filters:
    """What the user narrowed the analysis to (all optional)."""

    since_ns: int | None = None
    until_ns: int | None = None
    brokers: tuple[str, ...] = ()
    clients: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = []
        if self.since_ns is not None:
            parts.append(f"since {fmt_ns(self.since_ns)}")
        if self.until_ns is not None:
            parts.append(f"until {fmt_ns(self.until_ns)}")
        for label, vals in (("broker", self.brokers), ("client", self.clients), ("topic", self.topics)):
            if vals:
                parts.append(f"{label} in {', '.join(vals)}")
        return "; ".join(parts) or "none"


@dataclass
class Recording:
    """The three datasets of one or more recordings, ready for the transforms."""

    requests: DataFrame
    connections: DataFrame  # one row per connection (final row, else the latest snapshot; ends a run over lost: settled)
    tcp: DataFrame
    dirs: tuple[str, ...] = ()
    versions: dict[str, int] = field(default_factory=dict)
    topic_names: dict[str, str] = field(default_factory=dict)  # topic id -> name, from topics/ (late resolution)
    runs: DataFrame | None = None  # runs/: every proxy run's start and clean stop (no time filter)


def fmt_ns(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def time_window(since: object, until: object, dirs: Iterable[object]) -> tuple[int | None, int | None]:
    """--since/--until (any form `recording.timespec` accepts, or epoch ns) as epoch ns.

    A `+SECONDS` end counts from the first request in `dirs` (looked up once,
    from Parquet statistics, and only if needed).
    """
    roots = [str(d) for d in dirs]
    return resolve_window(since, until, lambda: recording_start(roots))


def _empty(spark: SparkSession, dataset: str) -> DataFrame:
    """A dataset without files: no rows, its columns (a literal relation: `createDataFrame` would make an RDD that
    every query over it runs a job for)."""
    columns = [(f.name, f.dataType) for f in spark_schema(dataset).fields]
    return timestamps_as_epoch_ns(literal_rows(spark, columns, []), dataset)


def _read_files(spark: SparkSession, listing: LiveFiles, dataset: str) -> tuple[DataFrame, int]:
    """Read exactly the live files; an older format is read with its own columns, migrated, then conformed."""
    version, steps = dataset_version(listing)
    reader = spark.read.option("basePath", listing.spelled_base)
    if not steps:
        return reader.schema(spark_schema(dataset)).parquet(*listing.uris), version
    # Older files: the current schema would turn renamed columns into nulls before a migration could
    # rename them, so read them as they are (types from the footer; partitions as strings) first.
    old = pq.read_schema(listing.paths[0], filesystem=listing.filesystem)  # the sample agreed on one version
    fields = [T.StructField(f.name, spark_type(f.type), True) for f in old if f.name not in rec.PARTITION_COLUMNS]
    fields += [T.StructField(p, T.StringType(), True) for p in rec.PARTITION_COLUMNS]
    df = reader.schema(T.StructType(fields)).parquet(*listing.uris)
    for step in steps:
        df = step.to_spark(df, dataset)
    return conform(df, dataset), version


def read_dataset(spark: SparkSession, directory: str, dataset: str,
                 partition_filter: Column | None = None) -> tuple[DataFrame, int, bool]:
    """Read one dataset of one recording with the derived schema; migrate if older.

    Returns the DataFrame, the format version read and whether the dataset
    has files at all (or cannot be listed, so Spark will find out).

    On a path pyarrow cannot list (e.g. `s3a://`), Spark reads the directory
    itself as before: no version check and no superseded rule there (the
    proxy's start-up recovery still removes a crash's duplicates).
    """
    listing = live_files(directory, dataset)
    if listing is None:
        path = directory.rstrip("/") + "/" + dataset
        df, version = spark.read.schema(spark_schema(dataset)).option("basePath", path).parquet(path), rec.FORMAT_VERSION
    elif not listing.relative:
        return _empty(spark, dataset), rec.FORMAT_VERSION, False
    else:
        df, version = _read_files(spark, listing, dataset)
    if partition_filter is not None:
        df = df.where(partition_filter)
    return timestamps_as_epoch_ns(df, dataset), version, True


def _hour_key(ns: int) -> str:
    d = dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc)
    return d.strftime("%Y-%m-%d%H")


def _partition_filter(filters: Filters, upper: bool) -> Column | None:
    """Prune Hive partitions by time: Spark evaluates this on directory names only."""
    key = F.concat(F.col("date"), F.lpad(F.col("hour"), 2, "0"))
    cond = None
    if filters.since_ns is not None:
        cond = key >= F.lit(_hour_key(filters.since_ns))
    if upper and filters.until_ns is not None:
        c = key <= F.lit(_hour_key(filters.until_ns))
        cond = c if cond is None else cond & c
    return cond


def one_row_per_connection(rows: DataFrame, run_rows: Iterable[Mapping[str, Any]]) -> DataFrame:
    """The connection rows of a recording as the tables read them: one per connection (`dedupe_connections`), those
    whose run is over but whose end was never written ended (`runs.settle_unrecorded_ends`), from the `runs/` rows
    of every directory read (a run may start in one and stop in another)."""
    marks = marks_of(run_rows)  # a few per proxy process: looked up on the driver
    return settle_unrecorded_ends(dedupe_connections(rows), marks, run_last_seen(rows, marks))


def run_last_seen(conns: DataFrame, marks: Sequence[RunMark]) -> dict[str, int]:
    """The last sign of life of every run that started and did not stop cleanly (`runs.last_signs`), on the driver:
    one small job over five columns of the connection rows, only when there is such a run (killed, or live)."""
    unstopped = unstopped_runs(marks)
    return {r["run"]: r["last_ns"] for r in last_signs(conns, unstopped).collect()} if unstopped else {}


def dedupe_connections(conns: DataFrame) -> DataFrame:
    """One row per connection: the `final` row if there is one, else the latest snapshot."""
    w = Window.partitionBy("proxy_id", "conn_id").orderBy(
        F.coalesce(F.col("final"), F.lit(False)).desc(), F.col("snapshot_ns").desc_nulls_last()
    )
    return conns.withColumn("_rn", F.row_number().over(w)).where("_rn = 1").drop("_rn")


def _match_any(col: Column, values: Iterable[str]) -> Column:
    """Exact host:port, or host only, for --broker / --client addresses."""
    vals = list(values)
    return col.isin(vals) | host(col).isin(vals)


def apply_filters(r: Recording, f: Filters) -> Recording:
    """Narrow all datasets consistently: requests by their own fields, connections and
    TCP samples to the connections that survive.

    The time window keeps the requests sent inside it, the TCP samples taken inside it (`transforms.window.
    taken_inside`) and the connections open at some time inside it (`seen_in_window`): the one spelling of
    each rule, which the connection and TCP tables read the window through too.
    """
    req, conns, tcp = r.requests, r.connections, r.tcp
    # the connections open at some time inside the window: the rule the transforms apply too (transforms.window)
    conns = seen_in_window(conns, f.since_ns, f.until_ns)
    if f.since_ns is not None or f.until_ns is not None:
        req = req.where(taken_inside("req_first_ns", f.since_ns, f.until_ns))
        tcp = tcp.where(taken_inside("ts_ns", f.since_ns, f.until_ns))
    if f.brokers:
        req = req.where(_match_any(F.col("broker_addr"), f.brokers))
        conns = conns.where(_match_any(F.col("broker_addr"), f.brokers))
    if f.clients:
        req = req.where(F.col("client_id").isin(list(f.clients)) | _match_any(F.col("client_addr"), f.clients))
        conns = conns.where(
            F.arrays_overlap(F.col("client_ids"), F.array(*[F.lit(c) for c in f.clients]))
            | _match_any(F.col("client_addr"), f.clients)
        )
    if f.topics:
        req = req.where(F.arrays_overlap(F.col("topics"), F.array(*[F.lit(t) for t in f.topics])))
        touched = req.select("proxy_id", "conn_id").distinct()
        conns = conns.join(touched, ["proxy_id", "conn_id"], "left_semi")
    if f.brokers or f.clients or f.topics:
        tcp = tcp.join(conns.select("proxy_id", "conn_id"), ["proxy_id", "conn_id"], "left_semi")
    return Recording(req, conns, tcp, r.dirs, r.versions, r.topic_names, r.runs)


def read_rollups(spark: SparkSession, dirs: Sequence[str], covers: dict[str, RecordingCoverage]) -> dict[str, DataFrame]:
    """The derived datasets (recording.rollups) that stand for every live requests file of `dirs`, by name.

    `covers` is each recording's coverage, listed once per analysis (`analytics.job.stored_rollups`;
    the caller passes none when a filter narrows the requests: rollups stand for whole files).
    A dataset is left out when some requests file has no rollup there yet (a live proxy's last
    minute, a recording made before rollups were written or with compaction off): the analysis
    then computes that part from the requests, with the same result, only slower. Timestamps
    come out as epoch ns, as `read_dataset` gives them.
    """
    out = {}
    for dataset in rec.DERIVED_DATASETS:
        found = [covers[d].by_dataset[dataset] if d in covers else None for d in dirs]
        if not found or any(c is None or not c.complete for c in found):
            continue
        schema = spark_schema(dataset, with_partitions=False)
        df = union_all([spark.read.schema(schema).parquet(*c.files).select(*schema.names) for c in found if c is not None])
        out[dataset] = timestamps_as_epoch_ns(df, dataset)
    return out


def load(spark: SparkSession, dirs: Sequence[str], filters: Filters | None = None) -> Recording:
    """Read recordings (any path Spark reads), check versions, filter, de-duplicate."""
    if not dirs:
        raise ValueError("no recording directory given")
    filters = filters or Filters()
    frames: dict[str, list[DataFrame]] = {d: [] for d in (*DATASETS_READ, "runs")}
    versions: dict[str, int] = {}
    pairs: dict[str, str] = {}
    any_runs = False
    for directory in dirs:
        # every pair the proxies learned, at any time (no time filter): ids are named late (transforms.topics)
        learned, _, has_pairs = read_dataset(spark, directory, "topics")
        if has_pairs:
            pairs.update({r["topic_id"]: r["name"] for r in topic_pairs(learned).collect()})
        # every run's start and clean stop, at any time (no time filter): a run that began before --since still began
        runs_df, _, has_runs = read_dataset(spark, directory, "runs")
        frames["runs"].append(runs_df)
        any_runs = any_runs or has_runs
        found = False
        for ds in DATASETS_READ:
            pf = _partition_filter(filters, upper=(ds == "requests"))
            df, v, has_files = read_dataset(spark, directory, ds, pf)
            versions[f"{directory}/{ds}"] = v
            frames[ds].append(df)
            found = found or has_files
        if not found:
            raise RecordingFormatError(
                f"{directory} holds no recording: expected requests/, connections/ or tcp/ with Parquet files "
                "(record one with `kafkatap proxy … --record DIR`)"
            )

    runs = union_all(frames["runs"])
    # a few rows per proxy process, of every directory at once (a run may start in one and stop in another): one small job
    run_rows = [r.asDict() for r in runs.select("proxy_id", "run", "event", "ts_ns").collect()] if any_runs else []
    recording = Recording(
        requests=name_topic_ids(union_all(frames["requests"]), pairs),
        connections=name_connection_topics(one_row_per_connection(union_all(frames["connections"]), run_rows), pairs),
        tcp=union_all(frames["tcp"]),
        dirs=tuple(dirs),
        versions=versions,
        topic_names=pairs,
        runs=runs,
    )
    return apply_filters(recording, filters)
