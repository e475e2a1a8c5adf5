"""Proxy runs and the stretches of time a recording covers, with the gaps between them.

Why: a recording directory reused across sessions holds runs hours or days apart (`proxy --record`
appends). Read as one, the report's span ran from the first session's start to the last one's end,
and every rate divided by it mixed the sessions with the hours when no proxy was recording: a client
that reconnected 930 times in 21 s read as 5.6 reconnects a minute. These tables say what the
recording holds, and `recorded_time` gives a rate the time that was actually recorded.

A run is one proxy process's life (`analytics.transforms.runs`): from its `runs/` start row to its
clean stop or last sign of life; a run recorded before `runs/` existed is placed by its connections
(first open to last snapshot or end). A **stretch** is a stretch of time some run was recording, with
gaps shorter than `stretch_gap_s` (a restart, a worker replaced) bridged: the report lists each, and
more than one is a notice (`analytics.findings.stretches`). No I/O here.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.transforms.common import ns_to_ts, with_client
from analytics.transforms.overview import clamp
from analytics.transforms.runs import RUN_LAST, RUN_STARTED, last_sign_of_life, proxy_run, run_marks

GAP_BUCKETS = 10  # a gap of this many time buckets splits the recording into stretches …
GAP_MIN_S = 300  # … but never one under 5 minutes (a restart, a slow worker replacement) …
GAP_MAX_S = 3600  # … and always one over an hour, whatever the bucket
NO_CLEAN_STOP = "no clean stop (killed, crashed, or still running when last written)"
NO_RUN_ROWS = "not recorded (no runs/ rows: a recording made before the proxy wrote them)"
_NS = 1_000_000_000


def stretch_gap_s(bucket_s: int) -> int:
    """The shortest gap between runs that makes two stretches: GAP_BUCKETS buckets, within [GAP_MIN_S, GAP_MAX_S]."""
    return min(GAP_MAX_S, max(GAP_MIN_S, GAP_BUCKETS * int(bucket_s)))


def _column_or_null(df: DataFrame, name: str) -> Column:
    """A column the loader adds (`settle_unrecorded_ends`); null where the rows come without it (tests, tools)."""
    return F.col(name) if name in df.columns else F.lit(None).cast("long")


def run_spans(conns: DataFrame) -> DataFrame:
    """Per proxy run seen in the connections: `run` (proxy_id/run) and the span it recorded, `start_ns`..`end_ns`.

    From its start row to its clean stop or last sign of life where the loader found them (RUN_STARTED,
    RUN_LAST), else from its first connection's open to its connections' last snapshot or end.
    """
    last_seen = last_sign_of_life()  # as `runs.settle_unrecorded_ends`
    return conns.groupBy(proxy_run().alias("run")).agg(
        F.coalesce(F.min(_column_or_null(conns, RUN_STARTED)), F.min("opened_ns")).alias("start_ns"),
        F.greatest(F.coalesce(F.max(_column_or_null(conns, RUN_LAST)), F.max(last_seen)), F.max(last_seen)).alias("end_ns"),
    )


def merge_spans(spans: DataFrame, gap_ns: int) -> DataFrame:
    """Spans (`start_ns`, `end_ns`, `run`) merged where they overlap or are at most `gap_ns` apart: one row per
    stretch, with its runs. Runs are a few rows: one ordered window over all of them."""
    order = Window.orderBy("start_ns", "end_ns", "run")
    reach = F.max("end_ns").over(order.rowsBetween(Window.unboundedPreceding, -1))
    opens = F.when(reach.isNull() | (F.col("start_ns") - reach > gap_ns), 1).otherwise(0)
    numbered = spans.withColumn("_opens", opens).withColumn(
        "stretch", F.sum("_opens").over(order.rowsBetween(Window.unboundedPreceding, 0)))
    return numbered.groupBy("stretch").agg(
        F.min("start_ns").alias("start_ns"), F.max("end_ns").alias("end_ns"),
        F.array_sort(F.collect_set("run")).alias("runs"))


def _windowed(spans: DataFrame, since_ns: int | None, until_ns: int | None) -> DataFrame:
    """Spans cut to the --since/--until window; those outside it dropped."""
    cut = spans.withColumns({"start_ns": clamp(F.col("start_ns"), since_ns, until_ns),
                             "end_ns": clamp(F.col("end_ns"), since_ns, until_ns)})
    return cut.where(F.col("end_ns") > F.col("start_ns")) if since_ns is not None or until_ns is not None else cut


def recording_stretches(conns: DataFrame, bucket_s: int, since_ns: int | None = None,
                        until_ns: int | None = None) -> DataFrame:
    """The stretches of time the recording covers, in order: start, end, length, the gap before each, the runs
    recording in it, and the connections opened and clients seen in it (inside the --since/--until window).

    Gaps of at most `stretch_gap_s(bucket_s)` are bridged (a restart is no new session).
    """
    s = merge_spans(_windowed(run_spans(conns), since_ns, until_ns), stretch_gap_s(bucket_s) * _NS)
    order = Window.orderBy("start_ns")
    s = s.withColumn("stretch", F.row_number().over(order)).withColumn(
        "gap_before_ns", F.col("start_ns") - F.lag("end_ns").over(order))
    opened = with_client(conns).select("opened_ns", "client_id", "client_host")
    seen = opened.join(F.broadcast(s.select("stretch", "start_ns", "end_ns")),
                       (F.col("opened_ns") >= F.col("start_ns")) & (F.col("opened_ns") <= F.col("end_ns"))
                       ).groupBy("stretch").agg(F.count(F.lit(1)).alias("connections_opened"),
                                                F.countDistinct("client_id", "client_host").alias("clients"))
    return s.join(seen, "stretch", "left").select(
        "stretch", ns_to_ts("start_ns").alias("start"), ns_to_ts("end_ns").alias("end"),
        F.round((F.col("end_ns") - F.col("start_ns")) / 1e9, 3).alias("duration_s"),
        F.round(F.col("gap_before_ns") / 1e9, 3).alias("gap_before_s"),
        F.size("runs").alias("proxy_runs"), F.coalesce("connections_opened", F.lit(0)).alias("connections_opened"),
        F.coalesce("clients", F.lit(0)).alias("clients"), "start_ns", "end_ns",
    ).orderBy("stretch")


def recorded_time(spans_of: DataFrame, keys: list[str], conns: DataFrame, since_ns: int | None = None,
                  until_ns: int | None = None) -> DataFrame:
    """`spans_of` (one row per `keys`, with `first_ns`, `last_ns`) with `recorded_ns`: how much of first..last some
    proxy run was recording.

    Why: a rate over first..last counted the hours between two sessions of a reused recording
    directory, when no proxy recorded anything, as time the client was quiet. Runs that touch or
    overlap are one span (no gap is bridged here: time no run recorded is never the client's).
    Under the window, first..last and the runs are cut to it.
    """
    runs = merge_spans(_windowed(run_spans(conns), since_ns, until_ns), 0).select(
        F.col("start_ns").alias("_run_start"), F.col("end_ns").alias("_run_end"))
    lo, hi = clamp(F.col("first_ns"), since_ns, until_ns), clamp(F.col("last_ns"), since_ns, until_ns)
    overlap = F.greatest(F.least(hi, F.col("_run_end")) - F.greatest(lo, F.col("_run_start")), F.lit(0))
    recorded = spans_of.select(*keys, "first_ns", "last_ns").crossJoin(F.broadcast(runs)).groupBy(*keys).agg(
        F.sum(overlap).alias("recorded_ns"))
    return spans_of.join(recorded, keys, "left")


def proxy_runs(runs: DataFrame, conns: DataFrame) -> DataFrame:
    """Every proxy run, in order of its start: proxy id, run, start, clean stop (or NO_CLEAN_STOP), pid, version,
    the span it recorded, its connections and the gap since the run before it (any proxy's) ended.

    From the `runs/` rows where there are some; a run recorded before `runs/` existed is listed by its
    connections alone (no start row: `started` null, placed by its first connection).
    """
    marks = run_marks(runs)
    counted = conns.groupBy("proxy_id", proxy_run().alias("run")).agg(F.count(F.lit(1)).alias("connections"))
    spans = run_spans(conns).join(counted, "run")
    b = marks.join(spans, ["proxy_id", "run"], "full")
    start = F.coalesce("started_ns", "start_ns")
    end = F.coalesce("stopped_ns", "end_ns", "started_ns")
    order = Window.orderBy(start.asc_nulls_last(), "run")
    before = F.max(end).over(order.rowsBetween(Window.unboundedPreceding, -1))
    return b.select(
        "proxy_id", F.regexp_extract("run", r"/(.*)$", 1).alias("run"),
        ns_to_ts("started_ns").alias("started"),
        F.when(F.col("stopped_ns").isNotNull(), F.date_format(ns_to_ts("stopped_ns"), "yyyy-MM-dd HH:mm:ss.SSS"))
         .when(F.col("started_ns").isNotNull(), F.lit(NO_CLEAN_STOP)).otherwise(F.lit(NO_RUN_ROWS)).alias("stopped"),
        "pid", "version", ns_to_ts(start).alias("recorded_from"), ns_to_ts(end).alias("recorded_to"),
        F.coalesce("connections", F.lit(0)).alias("connections"),
        F.round(F.greatest(start - before, F.lit(0)) / 1e9, 3).alias("gap_before_s"),
        start.alias("start_ns"),
    ).orderBy("start_ns", "run")
