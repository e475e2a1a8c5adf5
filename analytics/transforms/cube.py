"""The latency cube: every latency view from one pass over the requests.

Ten percentile tables computed with `percentile_approx` mean ten scans of
10 M rows through an object-based aggregate. Instead the requests are grouped
once with GROUPING SETS, one set per view: (view keys, log-bin of the value)
-> count, sum, max. Spark runs that as a single code-generated Expand + hash
aggregate, far cheaper than per-view scans or exploding arrays of structs.
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
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.transforms.common import QNAMES, QUANTILES, time_bucket_index

BIN_BASE = 1.02
TIME_BIN_BASE = 1.10  # the over-time views only feed charts and the surge rule: 10 % bins, 5x fewer cells
ALL_APIS = "(all)"


def _bin(v: Column, base: float = BIN_BASE) -> Column:
    return F.when(v <= 1, F.lit(0)).otherwise(F.ceil(F.log(v.cast("double")) / math.log(base))).cast("int")


@dataclass(frozen=True)
class View:
    """One grouping set: a cube dim keyed by k1 (and k2) over one value column, binned by `bin`."""

    dim: str
    metric: str
    k1: str
    k2: str | None
    value: str
    bin: str


# values: v = client-visible latency, vr = the same without long polls, bl = broker latency,
# pd = proxy-added delay of answered requests, w = broker wait of long polls, rb = Produce request size
REQUEST_VIEWS = (
    View("api_version", "latency", "api_label", "api_version", "v", "lbin"),
    View("client", "latency", "client_id", None, "vr", "lbin"),
    View("time", "latency", "b", "api_name", "vr", "tbin"),
    View("broker_time", "latency", "broker_addr", "b", "vr", "tbin"),
    View("api", "broker_latency", "api_label", None, "bl", "blbin"),
    View("api", "proxy_delay", "api_name", None, "pd", "pdbin"),
    View("long_poll_wait", "broker_latency", "client_id", None, "w", "wbin"),
)
TOPIC_VIEWS = (
    View("topic", "latency", "topic", "api_name", "vr", "lbin"),
    View("produce_topic", "request_bytes", "topic", None, "rb", "rbin"),
)
# (derived dim, metric, source dim, k2 of the result): the source summed over its k2, k1 kept
DERIVED = (
    ("api", "latency", "api_version", ""),
    ("broker", "latency", "broker_time", ""),
    ("time", "latency", "time", ALL_APIS),
)


def _grouped(df: DataFrame, views: tuple[View, ...]) -> DataFrame:
    """GROUPING SETS over `views`, then one (dim, k1, k2, metric, bin, n, s, mx) row per non-empty cell."""
    keys: list[str] = []
    for v in views:
        for c in (v.k1, v.k2, v.bin):
            if c and c not in keys:
                keys.append(c)
    values = sorted({v.value for v in views})
    sets = [[F.col(c) for c in (v.k1, v.k2, v.bin) if c] for v in views]
    aggs = [F.grouping_id().alias("gid")]
    for val in values:
        aggs += [F.count(val).alias(f"n_{val}"), F.sum(val).alias(f"s_{val}"), F.max(val).alias(f"mx_{val}")]
    g = df.groupingSets(sets, *keys).agg(*aggs)

    def pick(expr_of) -> Column:
        out = None
        for v in views:
            present = {v.k1, v.k2, v.bin}
            gid = sum(1 << (len(keys) - 1 - i) for i, c in enumerate(keys) if c not in present)
            cond = F.col("gid") == gid
            out = F.when(cond, expr_of(v)) if out is None else out.when(cond, expr_of(v))
        return out

    rows = g.select(
        pick(lambda v: F.lit(v.dim)).alias("dim"),
        pick(lambda v: F.col(v.k1).cast("string")).alias("k1"),
        pick(lambda v: F.col(v.k2).cast("string") if v.k2 else F.lit("")).alias("k2"),
        pick(lambda v: F.lit(v.metric)).alias("metric"),
        pick(lambda v: F.col(v.bin)).alias("bin"),
        pick(lambda v: F.col(f"n_{v.value}")).alias("n"),
        pick(lambda v: F.col(f"s_{v.value}")).alias("s"),
        pick(lambda v: F.col(f"mx_{v.value}")).alias("mx"),
    )
    return rows.where(F.col("n") > 0)


def latency_cube(req: DataFrame, bucket_s: int) -> DataFrame:
    """(dim, k1, k2, metric, bin) -> count n, sum s, max mx for every latency view in the report."""
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
    per_request = values.select("*", *[_bin(F.col(v)).alias(n) for v, n in (("v", "lbin"), ("bl", "blbin"), ("pd", "pdbin"), ("w", "wbin"))],
                                _bin(F.col("vr"), TIME_BIN_BASE).alias("tbin"))
    topics = values.where((answered & real) | F.col("rb").isNotNull()).select(
        "api_name", "vr", "rb", F.explode("topics").alias("topic")
    ).select("*", _bin(F.col("vr")).alias("lbin"), _bin(F.col("rb")).alias("rbin"))
    return _grouped(per_request, REQUEST_VIEWS).unionByName(_grouped(topics, TOPIC_VIEWS))


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
