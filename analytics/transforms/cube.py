"""The latency cube: every latency view from one pass over the requests.

Ten percentile tables computed with `percentile_approx` mean ten scans of
10 M rows through an object-based aggregate. Instead the requests are grouped
once: each request is copied once per view as a narrow row (view, its keys,
log-bin of its value) and one code-generated hash aggregate sums them into
count, sum and max per cell (`_grouped` says why not GROUPING SETS).
Bins are 2 % wide on a log scale (10 % for the over-time views, which only
feed charts and the surge rule, and would otherwise be most of the cells); a
percentile is reported as the largest value actually seen in its bin, so it
is a real observed value within one bin above the exact one. Max and mean
are exact.

Views that are a coarser grouping of another view (latency by API = by API
and version summed over versions; broker = broker x time summed over time;
the all-API time line = time x API summed over APIs) are derived from the
finer view instead of being grouped again.

The cube's rows: (dim, k1, k2, metric, bin, n, s, mx). `percentile_views`
adds the derived views and turns all of them into percentiles in one job; the report tables pick their
view from that small result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.transforms.common import QNAMES, QUANTILES, time_bucket_index
from analytics.transforms.rollups import merged
from analytics.transforms.topics import name_topic
from recording.latency_cells import CELL_SPEC
from recording.latency_cells import BIN_BASE, REQUEST_VIEWS, TIME_BIN_BASE, TIME_KEYS, TOPIC_VIEWS, View  # noqa: F401 — one definition for both engines

ALL_APIS = "(all)"


def _bin(v: Column, base: float | Column = BIN_BASE) -> Column:
    """The log-bin of a positive value (values <= 1 share bin 0); `base` may differ per row."""
    log_base = F.lit(math.log(base)) if isinstance(base, float) else base
    return F.when(v <= 1, F.lit(0)).otherwise(F.ceil(F.log(v.cast("double")) / log_base)).cast("int")


# the view whose bins bound the slowest requests (`tail_floor`): every answered request but long polls, once
TAIL_VIEW = next(v for v in REQUEST_VIEWS if v.dim == "client" and v.metric == "latency")
# (derived dim, metric, source dim, k2 of the result): the source summed over its k2, k1 kept
DERIVED = (
    ("api", "latency", "api_version", ""),
    ("broker", "latency", "broker_time", ""),
    ("time", "latency", "time", ALL_APIS),
)


def _per_view(views: tuple[View, ...], expr_of: Callable[[View], Column]) -> Column:
    """CASE on the view index `i`: view n's expression for its rows."""
    out = None
    for n, v in enumerate(views):
        out = F.when(F.col("i") == n, expr_of(v)) if out is None else out.when(F.col("i") == n, expr_of(v))
    return out


def _grouped(df: DataFrame, views: tuple[View, ...]) -> DataFrame:
    """Every row once per view as a narrow (i, k1, k2, bin, value) row, then one grouping -> (dim, k1, k2, metric, bin, n, s, mx).

    Each copy carries only its own view's keys and value, and copies whose value is null
    (no latency, not a long poll, not a Produce) are dropped before the grouping. That is
    the point of not using GROUPING SETS here: Spark's Expand for grouping sets copies every
    key column into every copy and updates every value's count, sum and max in every cell,
    which made the cube step seconds slower at 1 M and 10 M requests (bench/RESULTS.md, seventh session).
    """
    copies = df.select("*", F.explode(F.array(*[F.lit(n) for n in range(len(views))])).alias("i"))
    narrow = copies.select(
        "i",
        _per_view(views, lambda v: F.col(v.k1).cast("string")).alias("k1"),
        _per_view(views, lambda v: F.col(v.k2).cast("string") if v.k2 else F.lit("")).alias("k2"),
        _per_view(views, lambda v: F.col(v.value)).alias("value"),
        _per_view(views, lambda v: F.lit(math.log(v.base))).alias("log_base"),
    ).where(F.col("value").isNotNull())
    cells = narrow.groupBy("i", "k1", "k2", _bin(F.col("value"), F.col("log_base")).alias("bin")).agg(
        F.count(F.lit(1)).alias("n"), F.sum("value").alias("s"), F.max("value").alias("mx"))
    return cells.select(_per_view(views, lambda v: F.lit(v.dim)).alias("dim"), "k1", "k2",
                        _per_view(views, lambda v: F.lit(v.metric)).alias("metric"), "bin", "n", "s", "mx")


def view_values(req: DataFrame, bucket_s: int) -> tuple[DataFrame, DataFrame]:
    """The value columns REQUEST_VIEWS read (one row per request) and TOPIC_VIEWS read (one per request and topic)."""
    real = ~F.col("long_poll")
    answered = F.col("latency_us").isNotNull()
    b = time_bucket_index("ts_ns", bucket_s) * bucket_s  # bucket start, epoch seconds
    values = req.select(
        "api_label", "api_name", "api_version", "broker_addr", "client_id", "topics", "long_poll", b.alias("b"),
        F.col("latency_us").cast("long").alias("v"),
        F.when(real, F.col("latency_us").cast("long")).alias("vr"),
        F.col("broker_latency_us").cast("long").alias("bl"),
        F.when(F.col("answered"), F.col("proxy_delay_us").cast("long")).alias("pd"),
        F.when(F.col("long_poll"), F.col("broker_latency_us").cast("long")).alias("w"),
        F.when(F.col("api_name") == "Produce", F.col("request_bytes").cast("long")).alias("rb"),
    )
    topics = values.where((answered & real) | F.col("rb").isNotNull()).select(
        "api_name", "vr", "rb", F.explode("topics").alias("topic"))
    return values, topics


def latency_cube(req: DataFrame, bucket_s: int) -> DataFrame:
    """(dim, k1, k2, metric, bin) -> count n, sum s, max mx for every latency view in the report."""
    values, topics = view_values(req, bucket_s)
    return _grouped(values, REQUEST_VIEWS).unionByName(_grouped(topics, TOPIC_VIEWS))


def tail_floor(cube: DataFrame, n: int) -> DataFrame:
    """One row, `floor_us`: a latency no higher than the n-th highest client-visible one (long polls excluded).

    Null when the cube holds fewer than n such requests. Lets the slowest-requests scan filter on
    `latency_us >= floor_us`, which Parquet can check per batch, instead of ordering every request.
    From TAIL_VIEW summed over clients: B is the highest bin whose tail (bins >= B)
    holds n requests, so each of the n slowest lies in a bin >= B, above base^(B-1); the floor
    goes one bin lower still, a margin for floating point at the bin's edge.
    """
    view = (F.col("dim") == TAIL_VIEW.dim) & (F.col("metric") == TAIL_VIEW.metric)
    per_bin = cube.where(view).groupBy("bin").agg(F.sum("n").alias("n"))
    tail = F.sum("n").over(Window.orderBy(F.desc("bin")).rowsBetween(Window.unboundedPreceding, Window.currentRow))
    b = per_bin.select("bin", tail.alias("tail")).where(F.col("tail") >= n).agg(F.max("bin").alias("b"))
    return b.select(F.when(F.col("b") >= 2, F.floor(F.pow(F.lit(TAIL_VIEW.base), F.col("b") - 2))).cast("long").alias("floor_us"))


def with_derived(cube: DataFrame) -> DataFrame:
    """The cube plus the views summed from finer ones (see DERIVED).

    Kept out of `latency_cube`: Spark would recompute the whole grouping for
    every derived branch, while over the cached cube they cost next to nothing.
    """
    out = cube
    for dim, metric, src, k2 in DERIVED:
        out = out.unionByName(
            cube.where((F.col("dim") == src) & (F.col("metric") == metric))
            .groupBy(F.lit(dim).alias("dim"), "k1", F.lit(k2).alias("k2"), F.lit(metric).alias("metric"), "bin")
            .agg(F.sum("n").alias("n"), F.sum("s").alias("s"), F.max("mx").alias("mx"))
        )
    return out


def percentile_views(cube: DataFrame) -> DataFrame:
    """dim, metric, k1, k2 + count, p50/p90/p99/p999, max, mean for every view of the cube (derived ones too), in one job."""
    keys = ["dim", "metric", "k1", "k2"]
    cube = with_derived(cube)
    w = Window.partitionBy(*keys).orderBy("bin").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    c = cube.withColumn("cum", F.sum("n").over(w)).withColumn("tot", F.sum("n").over(Window.partitionBy(*keys)))
    aggs = [F.first("tot").alias("count")]
    for q, name in zip(QUANTILES, QNAMES):
        aggs.append(F.min_by("mx", F.when(F.col("cum") >= F.col("tot") * q, F.col("bin"))).alias(f"{name}_us"))
    aggs += [F.max("mx").alias("max_us"), F.round(F.sum("s") / F.sum("n"), 1).alias("mean_us")]
    return c.groupBy(*keys).agg(*aggs)


def is_cube(df: DataFrame) -> bool:
    return "bin" in df.columns


def view(cube_or_percentiles: DataFrame, dim: str, metric: str = "latency", prefix: str = "") -> DataFrame:
    """k1, k2 + count, p50 … max, mean of one view; accepts the cube or its `percentile_views`.

    The job passes the cached percentile views (one job for all views); tests
    and callers with only a cube get the same result computed on the spot.
    """
    p = percentile_views(cube_or_percentiles) if is_cube(cube_or_percentiles) else cube_or_percentiles
    p = p.where((F.col("dim") == dim) & (F.col("metric") == metric)).drop("dim", "metric")
    if prefix:
        p = p.select("k1", "k2", *[F.col(c).alias(prefix + c) for c in p.columns if c not in ("k1", "k2")])
    return p


cube_percentiles = view  # the name the transforms used before the views were computed together


def cube_from_cells(cells: DataFrame, bucket_s: int, topic_names: Mapping[str, str]) -> DataFrame:
    """The latency cube from the cells the writer stored beside each requests file (`recording.latency_cells`).

    The stored cells are per file and per ROLLUP_BUCKET_S; the cube is per recording and per `bucket_s`
    (a multiple of it), so the time views' bucket keys are moved to the start of their `bucket_s`
    bucket, topic ids the proxy could not yet name are named, and cells that now share their keys are
    summed. Every cell measure is a count, a sum or a maximum: the result equals `latency_cube` of the
    same requests.
    """
    def rebucket(key: str) -> Column:
        start = (F.floor(F.col(key).cast("long") / bucket_s) * bucket_s).cast("string")
        dims = [d for d, k in TIME_KEYS.items() if k == key]
        return F.when(F.col("dim").isin(dims), start).otherwise(F.col(key)) if dims else F.col(key)

    topic_dims = [v.dim for v in TOPIC_VIEWS if v.k1 == "topic"]
    k1 = rebucket("k1")
    if topic_names:
        k1 = F.when(F.col("dim").isin(topic_dims), name_topic(F.col("k1"), topic_names)).otherwise(k1)
    return merged(cells, CELL_SPEC, [F.col("dim"), k1.alias("k1"), rebucket("k2").alias("k2"), F.col("metric"), F.col("bin")])
