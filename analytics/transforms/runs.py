"""Proxy runs: when each began recording and whether it is known to be over (`runs/`, written by the proxy).

A run is one proxy process's life (a `--workers` worker is a process of its own), named by the
6 hex digits that prefix each conn_id it gives (`<run>-<n>`, recording.schema). The proxy writes
a `runs/` row when a run starts listening and one when it stops cleanly, after every connection's
end was handed to the recorder. Two questions only these rows answer:

* Is a connection without a final row still open? Not when its run is over: the run stopped
  cleanly (its stop row), or a later run of the same proxy id started (a restart into the same
  recording; a worker the parent restarted). A run killed (SIGKILL, OOM) or whose host went down
  writes no end for its open connections, and without this they stayed open in every table for
  ever. Such a connection is ended, `end_not_recorded` by `unknown`, at the run's last sign of
  life in the recording (the latest snapshot or end of any of its connections: the proxy snapshots
  open connections every `--tcp-info-interval`), or at its clean stop.
* Where did a run start recording? At its start row, not at its first connection: a worker that
  stays idle for an hour records its first connection an hour after the proxy started, and that
  connection is no run taking over connections (`connection_surge`).

A recording without `runs/` (made before the proxy wrote it) reads exactly as before: no run is
known to be over, and a run starts where its first connection is seen. No I/O here: `analytics.load`
reads the rows and hands them in.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.transforms.common import ns_to_ts

# the proxy names its connections `<run>-<n>` (recording.schema: conn_id), the run new at each start of a proxy or worker
RUN_OF_CONN_ID = r"^([0-9a-f]{6})-[0-9]+$"
END_NOT_RECORDED = "end_not_recorded"  # end_reason of a connection whose run ended without recording its end
ENDED_BY_UNKNOWN = "unknown"
NOT_RECORDED_CAUSE = "proxy stopped without recording its end"
_KILLED = "the proxy run ended without a clean stop (killed, crashed or its host went down); a later run started at "
_STOPPED = "the proxy run stopped cleanly but this connection's end row was not written (dropped by the recorder)"
# columns `settle_unrecorded_ends` adds to every connection, null for a run without a start row: its run's start,
# and the last time that run is known to have been recording (its clean stop, else its last sign of life)
RUN_STARTED = "run_started_ns"
RUN_LAST = "run_last_ns"


def proxy_run() -> Column:
    """Which run of which proxy recorded a connection: `proxy_id/run`.

    The run is the conn_id's prefix; a conn_id not in the proxy's form (another
    tool's recording) gives only `proxy_id/`, one run per proxy.
    """
    return F.concat_ws("/", F.col("proxy_id"), F.regexp_extract(F.col("conn_id"), RUN_OF_CONN_ID, 1))


def last_sign_of_life() -> Column:
    """A connection row's latest time: its open, snapshot or close (`greatest` skips the nulls)."""
    return F.greatest("opened_ns", "snapshot_ns", "closed_ns")


def run_marks(runs: DataFrame) -> DataFrame:
    """Per run of the `runs/` rows (`run`: proxy_id/run): its start row's time (`started_ns`), its clean stop's
    (`stopped_ns`), and the process's `pid` and kafkatap `version`."""
    return runs.groupBy("proxy_id", F.concat_ws("/", "proxy_id", "run").alias("run")).agg(
        F.min(F.when(F.col("event") == "start", F.col("ts_ns"))).alias("started_ns"),
        F.min(F.when(F.col("event") == "stop", F.col("ts_ns"))).alias("stopped_ns"),
        F.max("pid").alias("pid"), F.max("version").alias("version"))


def run_bounds(runs: DataFrame, conns: DataFrame) -> DataFrame:
    """Per run (`run`: proxy_id/run) of the markers or the connections: its start row's time
    (`started_ns`), its clean stop's (`stopped_ns`), the start of the next run of its proxy id that
    wrote a start row (`next_start_ns`) and its last sign of life among the connections (`last_seen_ns`).

    A run without a start row (recorded before `runs/` existed) is placed by its first connection, so
    a later run's start row still proves it over; nothing else about it changes.
    """
    marks = run_marks(runs)
    seen = conns.groupBy("proxy_id", proxy_run().alias("run")).agg(
        F.min("opened_ns").alias("first_open_ns"),
        F.max(last_sign_of_life()).alias("last_seen_ns"))
    b = marks.join(seen, ["proxy_id", "run"], "full")
    later = Window.partitionBy("proxy_id").orderBy(F.coalesce("started_ns", "first_open_ns")).rowsBetween(
        1, Window.unboundedFollowing)
    return b.select("run", "started_ns", "stopped_ns", "last_seen_ns",
                    F.min("started_ns").over(later).alias("next_start_ns"))


def settle_unrecorded_ends(conns: DataFrame, runs: DataFrame) -> DataFrame:
    """The connections (one row each) with every one whose run is over but whose end is not recorded ended.

    Such a connection gets `end_reason` END_NOT_RECORDED, `end_by` "unknown", the plain cause
    NOT_RECORDED_CAUSE, an `end_detail` saying which evidence proved the run over, and as `closed_ns` the
    run's clean stop or else its last sign of life (its duration to there); `final` stays false (no
    final row was written). Every connection also gets RUN_STARTED and RUN_LAST: from its run's start row
    to its clean stop or last sign of life, the run was recording (null for a run without a start row).
    The runs are a few rows per proxy: broadcast, no shuffle of the connections beyond the one
    aggregation that finds each run's last sign of life.
    """
    bounds = run_bounds(runs, conns)
    c = conns.withColumn("_run", proxy_run()).join(
        F.broadcast(bounds.withColumnRenamed("run", "_run")), "_run", "left")
    over = F.coalesce(F.col("stopped_ns"), F.col("next_start_ns")).isNotNull()
    settle = ~F.coalesce(F.col("final"), F.lit(False)) & F.col("closed_ns").isNull() & over
    ended = F.coalesce("stopped_ns", "last_seen_ns")

    def unless_settled(value: Column, name: str) -> Column:
        return F.when(settle, value).otherwise(F.col(name))

    detail = F.when(F.col("stopped_ns").isNotNull(), F.lit(_STOPPED)).otherwise(
        F.concat(F.lit(_KILLED), F.date_format(ns_to_ts("next_start_ns"), "yyyy-MM-dd HH:mm:ss 'UTC'")))
    return c.withColumns({
        "closed_ns": unless_settled(ended, "closed_ns"),
        "duration_us": unless_settled(F.floor((ended - F.col("opened_ns")) / 1000).cast("long"), "duration_us"),
        "end_reason": unless_settled(F.lit(END_NOT_RECORDED), "end_reason"),
        "end_by": unless_settled(F.lit(ENDED_BY_UNKNOWN), "end_by"),
        "end_detail": unless_settled(detail, "end_detail"),
        "inferred_cause": unless_settled(F.lit(NOT_RECORDED_CAUSE), "inferred_cause"),
        RUN_STARTED: F.col("started_ns"),
        RUN_LAST: F.when(F.col("started_ns").isNotNull(), F.coalesce("stopped_ns", "last_seen_ns")),
    }).drop("_run", "started_ns", "stopped_ns", "last_seen_ns", "next_start_ns")
