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

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.transforms.common import literal_rows, ns_to_ts, with_client
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


@dataclass(frozen=True)
class RunSpan:
    """One proxy run and the time it recorded, on the driver (a few rows per proxy process)."""

    proxy_id: str
    run: str  # proxy_id/run
    start_ns: int
    end_ns: int
    connections: int


@dataclass(frozen=True)
class Stretch:
    start_ns: int
    end_ns: int
    runs: tuple[str, ...]


def run_spans(conns: DataFrame) -> DataFrame:
    """Per proxy run seen in the connections: `run` (proxy_id/run), the span it recorded, `start_ns`..`end_ns`,
    and its `connections`.

    From its start row to its clean stop or last sign of life where the loader found them (RUN_STARTED,
    RUN_LAST), else from its first connection's open to its connections' last snapshot or end.
    """
    last_seen = last_sign_of_life()  # as `runs.settle_unrecorded_ends`
    return conns.groupBy("proxy_id", proxy_run().alias("run")).agg(
        F.coalesce(F.min(_column_or_null(conns, RUN_STARTED)), F.min("opened_ns")).alias("start_ns"),
        F.greatest(F.coalesce(F.max(_column_or_null(conns, RUN_LAST)), F.max(last_seen)), F.max(last_seen)).alias("end_ns"),
        F.count(F.lit(1)).alias("connections"),
    )


def collect_spans(conns: DataFrame) -> list[RunSpan]:
    """`run_spans` on the driver, in order of start: one small job, which the job runs once for every table that
    reads them (`recording_stretches`, `proxy_runs`, and the recorded time of `reconnects_by_client`,
    `client_inventory`, `produce_rate_by_topic` and `fetch_by_consumer`)."""
    return sorted((RunSpan(**r.asDict()) for r in run_spans(conns).collect()), key=lambda s: (s.start_ns, s.end_ns, s.run))


def windowed(spans: Sequence[RunSpan], since_ns: int | None, until_ns: int | None) -> list[RunSpan]:
    """Spans cut to the --since/--until window; those outside it dropped."""
    if since_ns is None and until_ns is None:
        return list(spans)
    lo, hi = (since_ns if since_ns is not None else -2**63), (until_ns if until_ns is not None else 2**63 - 1)
    cut = [replace(s, start_ns=min(max(s.start_ns, lo), hi), end_ns=min(max(s.end_ns, lo), hi)) for s in spans]
    return [s for s in cut if s.end_ns > s.start_ns]


def merged(spans: Sequence[RunSpan], gap_ns: int) -> list[Stretch]:
    """Spans merged where they overlap or are at most `gap_ns` apart: one Stretch each, in time order, with its runs."""
    out: list[Stretch] = []
    for s in sorted(spans, key=lambda s: (s.start_ns, s.end_ns, s.run)):
        if out and s.start_ns - out[-1].end_ns <= gap_ns:
            last = out[-1]
            out[-1] = Stretch(last.start_ns, max(last.end_ns, s.end_ns), tuple(sorted({*last.runs, s.run})))
        else:
            out.append(Stretch(s.start_ns, s.end_ns, (s.run,)))
    return out


def _in_stretch(ns: Column, stretches: Sequence[Stretch]) -> Column:
    """The 1-based number of the stretch holding `ns`, null outside every one (stretches never overlap)."""
    out = F.lit(None).cast("int")
    for i, st in reversed(list(enumerate(stretches, 1))):
        out = F.when((ns >= F.lit(st.start_ns)) & (ns <= F.lit(st.end_ns)), F.lit(i)).otherwise(out)
    return out


SPAN_ROWS = (("proxy_id", "string"), ("run", "string"), ("start_ns", "bigint"), ("end_ns", "bigint"), ("connections", "bigint"))
STRETCH_ROWS = (("stretch", "int"), ("start_ns", "bigint"), ("end_ns", "bigint"), ("gap_before_ns", "bigint"), ("proxy_runs", "int"))


def recording_stretches(conns: DataFrame, bucket_s: int, since_ns: int | None = None,
                        until_ns: int | None = None, spans: Sequence[RunSpan] | None = None) -> DataFrame:
    """The stretches of time the recording covers, in order: start, end, length, the gap before each, the runs
    recording in it, and the connections opened and clients seen in it (inside the --since/--until window).

    Gaps of at most `stretch_gap_s(bucket_s)` are bridged (a restart is no new session). `spans` are
    `collect_spans(conns)` when the caller has them: the runs are merged on the driver, and the connections
    are counted per stretch in one aggregation.
    """
    st = merged(windowed(collect_spans(conns) if spans is None else spans, since_ns, until_ns), stretch_gap_s(bucket_s) * _NS)
    rows = [(i, x.start_ns, x.end_ns, x.start_ns - st[i - 2].end_ns if i > 1 else None, len(x.runs))
            for i, x in enumerate(st, 1)]
    s = literal_rows(conns.sparkSession, STRETCH_ROWS, rows)
    seen = with_client(conns).select(_in_stretch(F.col("opened_ns"), st).alias("stretch"), "client_id", "client_host").where(
        F.col("stretch").isNotNull()).groupBy("stretch").agg(F.count(F.lit(1)).alias("connections_opened"),
                                                             F.countDistinct("client_id", "client_host").alias("clients"))
    return s.join(seen, "stretch", "left").select(
        "stretch", ns_to_ts("start_ns").alias("start"), ns_to_ts("end_ns").alias("end"),
        F.round((F.col("end_ns") - F.col("start_ns")) / 1e9, 3).alias("duration_s"),
        F.round(F.col("gap_before_ns") / 1e9, 3).alias("gap_before_s"),
        "proxy_runs", F.coalesce("connections_opened", F.lit(0)).alias("connections_opened"),
        F.coalesce("clients", F.lit(0)).alias("clients"), "start_ns", "end_ns",
    ).orderBy("stretch")


def recorded_ns(first: Column, last: Column, spans: Sequence[RunSpan], since_ns: int | None = None,
                until_ns: int | None = None) -> Column:
    """How much of `first`..`last` (cut to the window) some proxy run in `spans` was recording; null without spans.

    Runs that touch or overlap are one span (no gap is bridged here: time no run recorded is never a client's).
    For connection rows, which lie inside their runs' spans by construction (`reconnects_by_client`).
    """
    runs = merged(windowed(spans, since_ns, until_ns), 0)
    if not runs:
        return F.lit(None).cast("long")
    return _overlap_ns(clamp(first, since_ns, until_ns), clamp(last, since_ns, until_ns),
                       [(r.start_ns, r.end_ns) for r in runs])


def _overlap_ns(lo: Column, hi: Column, intervals: Sequence[tuple[int, int]]) -> Column:
    """How much of lo..hi the (disjoint) `intervals` cover: a literal array each row folds over, no join."""
    literal = F.array(*[F.struct(F.lit(s).cast("long").alias("s"), F.lit(e).cast("long").alias("e")) for s, e in intervals])
    return F.aggregate(literal, F.lit(0).cast("long"),
                       lambda acc, r: acc + F.greatest(F.least(hi, r["e"]) - F.greatest(lo, r["s"]), F.lit(0)))


TAIL_S = 60  # after a run's last sign of life, time still counted as recorded by a rate of requests (rate_seconds)


def rate_seconds(first: Column, last: Column, spans: Sequence[RunSpan] | None) -> Column:
    """The seconds a count of requests over `first`..`last` is a rate of: less the gaps between the recording's
    stretches that fall inside it, 1 s at least.

    Why: a topic produced to in two sessions of a reused recording directory hours apart read as a trickle over
    the hours between them. Only gaps of GAP_MIN_S or more count (a restart is no gap), and each from TAIL_S
    after the run before it: a run's span ends at its last sign of life in the connection rows (a snapshot every
    --tcp-info-interval), and a killed run's requests go on a little after that. Time before the first run or
    after the last is never subtracted, for the same reason. Without spans (a caller that has none) it is
    first..last, as before the runs were known.
    """
    whole = last - first
    stretches = merged(spans or (), GAP_MIN_S * _NS)
    gaps = [(a.end_ns + TAIL_S * _NS, b.start_ns) for a, b in zip(stretches, stretches[1:])
            if b.start_ns > a.end_ns + TAIL_S * _NS]
    if gaps:
        whole = whole - _overlap_ns(first, last, gaps)
    return F.greatest(whole / 1e9, F.lit(1.0))


def recorded_time(spans_of: DataFrame, keys: list[str], conns: DataFrame, since_ns: int | None = None,
                  until_ns: int | None = None, spans: Sequence[RunSpan] | None = None) -> DataFrame:
    """`spans_of` (one row per `keys`, with `first_ns`, `last_ns`) with `recorded_ns`: how much of first..last some
    proxy run was recording (`recorded_ns`).

    Why: a rate over first..last counted the hours between two sessions of a reused recording
    directory, when no proxy recorded anything, as time the client was quiet. Under the window,
    first..last and the runs are cut to it. The runs are `spans`, else `collect_spans(conns)`: spans of all
    the connections, failed connects included: a run that only saw connects fail (a broker down) was
    recording all the same.
    """
    runs = collect_spans(conns) if spans is None else spans
    return spans_of.withColumn("recorded_ns", recorded_ns(F.col("first_ns"), F.col("last_ns"), runs, since_ns, until_ns))


def proxy_runs(runs: DataFrame, conns: DataFrame, spans: Sequence[RunSpan] | None = None) -> DataFrame:
    """Every proxy run, in order of its start: proxy id, run, start, clean stop (or NO_CLEAN_STOP), pid, version,
    the TCP faults it injected, the span it recorded, its connections and the gap since the run before it (any
    proxy's) ended.

    From the `runs/` rows where there are some; a run recorded before `runs/` existed is listed by its
    connections alone (no start row: `started` null, placed by its first connection). `spans` as in
    `recording_stretches`.
    """
    marks = run_marks(runs)
    seen = literal_rows(conns.sparkSession, SPAN_ROWS, [(x.proxy_id, x.run, x.start_ns, x.end_ns, x.connections)
                                                        for x in (collect_spans(conns) if spans is None else spans)])
    b = marks.join(seen, ["proxy_id", "run"], "full")
    start = F.coalesce("started_ns", "start_ns")
    end = F.coalesce("stopped_ns", "end_ns", "started_ns")
    order = Window.orderBy(start.asc_nulls_last(), "run")
    before = F.max(end).over(order.rowsBetween(Window.unboundedPreceding, -1))
    return b.select(
        "proxy_id", F.regexp_extract("run", r"/(.*)$", 1).alias("run"),
        ns_to_ts("started_ns").alias("started"),
        F.when(F.col("stopped_ns").isNotNull(), F.date_format(ns_to_ts("stopped_ns"), "yyyy-MM-dd HH:mm:ss.SSS"))
         .when(F.col("started_ns").isNotNull(), F.lit(NO_CLEAN_STOP)).otherwise(F.lit(NO_RUN_ROWS)).alias("stopped"),
        "pid", "version", "faults", ns_to_ts(start).alias("recorded_from"), ns_to_ts(end).alias("recorded_to"),
        F.coalesce("connections", F.lit(0)).alias("connections"),
        F.round(F.greatest(start - before, F.lit(0)) / 1e9, 3).alias("gap_before_s"),
        start.alias("start_ns"),
    ).orderBy("start_ns", "run")
