"""Proxy runs: when each began recording and whether it is known to be over (`runs/`, written by the proxy).

A run is one proxy process's life (a `--workers` worker is a process of its own), named by the
6 hex digits that prefix each conn_id it gives (`<run>-<n>`, recording.schema). The proxy writes
a `runs/` row when a run starts listening and one when it stops cleanly, after every connection's
end was handed to the recorder. Two questions only these rows answer:

* Is a connection without a final row still open? Not when its run is over: the run stopped
  cleanly (its stop row), or a later run of the same proxy id started (a restart into the same
  recording; a worker the parent restarted), or the proxy was launched again (`launch_times`): a
  `--workers N` proxy killed whole and started again with fewer workers, or with none, starts no
  run of some of its earlier workers' ids. A run killed (SIGKILL, OOM) or whose host went down
  writes no end for its open connections, and without this they stayed open in every table for
  ever. Such a connection is ended, `end_not_recorded` by `unknown`, at the run's last sign of
  life in the recording (the latest snapshot or end of any of its connections: the proxy snapshots
  open connections every `--tcp-info-interval`), or at its clean stop. (A run recorded before
  `runs/` existed has no start row: a later start of its proxy id after a connection's open proves
  that connection over, at its own last sign of life.)
* Where did a run start recording? At its start row, not at its first connection: a worker that
  stays idle for an hour records its first connection an hour after the proxy started, and that
  connection is no run taking over connections (`connection_surge`).

A recording without `runs/` (made before the proxy wrote it) reads exactly as before: no run is
known to be over, and a run starts where its first connection is seen. No I/O here: `analytics.load`
reads the rows and hands them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics.transforms.common import literal_map, ns_to_ts
from recording.layout import launching_proxy_id

# the proxy names its connections `<run>-<n>` (recording.schema: conn_id), the run new at each start of a proxy or worker
RUN_OF_CONN_ID = r"^([0-9a-f]{6})-[0-9]+$"
END_NOT_RECORDED = "end_not_recorded"  # end_reason of a connection whose run ended without recording its end
ENDED_BY_UNKNOWN = "unknown"
NOT_RECORDED_CAUSE = "proxy stopped without recording its end"
_KILLED = ("the proxy run ended without a clean stop (killed, crashed or its host went down); a later run of the proxy "
           "started at ")
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
    (`stopped_ns`), the process's `pid` and kafkatap `version`, and the TCP `faults` its start row names (null: none,
    or a recording made before the column)."""
    runs = runs.where(F.col("event").isin("start", "stop"))  # a worker's `launch` row holds its parent's time and pid
    return runs.groupBy("proxy_id", F.concat_ws("/", "proxy_id", "run").alias("run")).agg(
        F.min(F.when(F.col("event") == "start", F.col("ts_ns"))).alias("started_ns"),
        F.min(F.when(F.col("event") == "stop", F.col("ts_ns"))).alias("stopped_ns"),
        F.max("pid").alias("pid"), F.max("version").alias("version"),
        F.max(F.when(F.col("event") == "start", F.col("faults"))).alias("faults"))


@dataclass(frozen=True)
class RunMark:
    """One run's `runs/` rows, on the driver: where it started recording and where it stopped cleanly (None: no such row)."""

    proxy_id: str
    run: str  # the 6 hex digits of its conn_ids
    started_ns: int | None
    stopped_ns: int | None
    launched_ns: int | None = None  # a `--workers` worker's run: when its parent (the launch) started

    @property
    def key(self) -> str:
        """`proxy_id/run`, as `proxy_run()` names a connection's run."""
        return f"{self.proxy_id}/{self.run}"


def marks_of(rows: Iterable[Mapping[str, Any]]) -> list[RunMark]:
    """The runs of `runs/` rows (proxy_id, run, event, ts_ns in epoch ns): the first start, stop and launch of each."""
    first: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        if r["ts_ns"] is None or r["event"] not in ("start", "stop", "launch") or r["proxy_id"] is None or r["run"] is None:
            continue  # not a row the proxy writes: nothing it could prove
        seen = first.setdefault((r["proxy_id"], r["run"]), {})
        seen[r["event"]] = min(seen.get(r["event"], r["ts_ns"]), r["ts_ns"])
    return [RunMark(p, run, e.get("start"), e.get("stop"), e.get("launch")) for (p, run), e in sorted(first.items())]


def launch_times(marks: Sequence[RunMark]) -> dict[str, set[int]]:
    """Per proxy id of `marks`, the times a run of it, or a launch of the proxy it belongs to, started.

    A worker of `kafkatap proxy --workers N` records under `<id>-w<i>` and writes its parent's start (a `launch`
    row) with its own; a proxy without workers is a launch of its own id at each start. A launch of `<id>`,
    either way, proves over every earlier run of `<id>` and of all its workers, also of workers the new launch
    does not start. A proxy id counts as a worker's only if it wrote `launch` rows: a proxy named `edge-w2` by
    its operator is nobody's worker.
    """
    parent = {m.proxy_id: launching_proxy_id(m.proxy_id) for m in marks if m.launched_ns is not None}
    launches: dict[str, set[int]] = {}
    for m in marks:
        if m.launched_ns is not None:
            launches.setdefault(parent[m.proxy_id] or m.proxy_id, set()).add(m.launched_ns)
        elif m.started_ns is not None and m.proxy_id not in parent:
            launches.setdefault(m.proxy_id, set()).add(m.started_ns)
    starts: dict[str, set[int]] = {}
    for m in marks:
        own = {m.started_ns} if m.started_ns is not None else set()
        family = parent.get(m.proxy_id) or m.proxy_id
        starts.setdefault(m.proxy_id, set()).update(own, launches.get(family, ()))
    return {p: ts for p, ts in starts.items() if ts}


def _next_start_after(marks: Sequence[RunMark], proxy: Column, after: Column) -> Column:
    """The first start of a run of `proxy`, or launch of its proxy (`launch_times`), later than `after`: what proves
    an earlier run over."""
    starts = launch_times(marks)
    if not starts:
        return F.lit(None).cast("long")
    by_proxy = F.create_map(*[x for p, ts in sorted(starts.items())
                              for x in (F.lit(p), F.array(*[F.lit(t).cast("long") for t in sorted(ts)]))])
    return F.array_min(F.filter(F.element_at(by_proxy, proxy), lambda t: t > after))


def unstopped_runs(marks: Sequence[RunMark]) -> list[str]:
    """The runs (proxy_id/run) with a start row and no clean stop: killed, or still recording. Their last sign of
    life is their end, and only the connections know it (`last_signs`)."""
    return sorted({m.key for m in marks if m.started_ns is not None and m.stopped_ns is None})


def last_signs(conns: DataFrame, runs: Sequence[str]) -> DataFrame:
    """Per run of `runs` (`run`, proxy_id/run), its last sign of life among the connection rows (`last_ns`).

    Any rows will do, snapshots included: a connection's latest row is its latest time, so the rows need not
    be de-duplicated first, and the aggregation reads five columns.
    """
    run = proxy_run()
    return conns.where(run.isin(list(runs))).groupBy(run.alias("run")).agg(F.max(last_sign_of_life()).alias("last_ns"))


def settle_unrecorded_ends(conns: DataFrame, marks: Sequence[RunMark], last_seen: Mapping[str, int]) -> DataFrame:
    """The connections (one row each) with every one whose run is over but whose end is not recorded ended.

    Such a connection gets `end_reason` END_NOT_RECORDED, `end_by` "unknown", the plain cause
    NOT_RECORDED_CAUSE, an `end_detail` saying which evidence proved the run over, and as `closed_ns` the
    run's clean stop or else its last sign of life (its duration to there); `final` stays false (no
    final row was written). Every connection also gets RUN_STARTED and RUN_LAST: from its run's start row
    to its clean stop or last sign of life, the run was recording (null for a run without a start row).

    A run is proved over by its clean stop, or by a later start row of its proxy id or launch of the proxy it is a
    worker of (`launch_times`; after its own start;
    for a run without a start row, recorded before `runs/` existed, after the connection's open, and it
    ends at the connection's own last sign of life). The runs are a few rows per process, `marks` on the
    driver, and so is `last_seen`: the last sign of life of each of `unstopped_runs(marks)` (`last_signs`,
    which the loader collects only when there are such runs). Every lookup is a literal map, so settling
    is a projection of the connections; without `runs/` rows nothing changes.
    """
    if not marks:  # a recording made before runs/ existed: no run is known to be over, and none has a start row
        return conns.withColumns({RUN_STARTED: F.lit(None).cast("long"), RUN_LAST: F.lit(None).cast("long")})
    run = proxy_run()
    started = F.element_at(literal_map({m.key: m.started_ns for m in marks if m.started_ns is not None}, "bigint"), run)
    stopped = F.element_at(literal_map({m.key: m.stopped_ns for m in marks if m.stopped_ns is not None}, "bigint"), run)
    launched = F.element_at(literal_map({m.key: m.launched_ns for m in marks if m.launched_ns is not None}, "bigint"), run)
    c = conns.withColumns({"_started": started, "_stopped": stopped})
    # after the run's own launch too: a clock stepped back between a parent's start and its workers' (a boot's
    # first NTP sync) would otherwise let a worker's own launch prove it over while it runs
    after = F.greatest(F.coalesce("_started", "opened_ns"), launched)
    c = c.withColumn("_next", _next_start_after(marks, F.col("proxy_id"), after))
    c = c.withColumn("_last", F.element_at(literal_map(last_seen, "bigint"), run))  # a killed or live run's last sign of life
    run_last = F.when(F.col("_started").isNotNull(), F.coalesce("_stopped", "_last"))
    over = F.coalesce(F.col("_stopped"), F.col("_next")).isNotNull()
    settle = ~F.coalesce(F.col("final"), F.lit(False)) & F.col("closed_ns").isNull() & over
    ended = F.coalesce(run_last, "_stopped", last_sign_of_life())

    def unless_settled(value: Column, name: str) -> Column:
        return F.when(settle, value).otherwise(F.col(name))

    detail = F.when(F.col("_stopped").isNotNull(), F.lit(_STOPPED)).otherwise(
        F.concat(F.lit(_KILLED), F.date_format(ns_to_ts("_next"), "yyyy-MM-dd HH:mm:ss 'UTC'")))
    return c.withColumns({
        "closed_ns": unless_settled(ended, "closed_ns"),
        "duration_us": unless_settled(F.floor((ended - F.col("opened_ns")) / 1000).cast("long"), "duration_us"),
        "end_reason": unless_settled(F.lit(END_NOT_RECORDED), "end_reason"),
        "end_by": unless_settled(F.lit(ENDED_BY_UNKNOWN), "end_by"),
        "end_detail": unless_settled(detail, "end_detail"),
        "inferred_cause": unless_settled(F.lit(NOT_RECORDED_CAUSE), "inferred_cause"),
        RUN_STARTED: F.col("_started"),
        RUN_LAST: run_last,
    }).drop("_started", "_stopped", "_next", "_last")
