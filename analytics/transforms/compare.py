"""Two-point comparison: the same traffic seen at two places (or a recording and its replay).

Two ways to pair requests, chosen by `match_mode`:

* ``wire`` — both recordings watched the same requests at the same time (either
  side of a middlebox): pair on client_id + correlation_id + api_key, nearest
  in time within a tolerance, inside connections paired one to one (a proxy
  relays one TCP connection as one): the A and B connection most of whose
  requests pair up, with the steadiest gap between twins, each the other's
  best. Clients sharing a client_id (a
  fleet on librdkafka's default `rdkafka`) restart correlation ids on every
  connection, so a request alone also pairs with its neighbours' twins.
  latency_a - latency_b is what lies between.
* ``sequence`` — a replay: correlation ids are fresh and the clock differs, so
  pair on client_id + the connection's rank among that client's connections +
  api_key + the request's rank within its connection for that API.

``auto`` picks ``wire`` when the two time ranges overlap.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from analytics.transforms.common import api_label, first_client_id, ns_to_ts, percentiles_by
from analytics.transforms.window import Bounds, as_at_window_end


SIDE_COLS = ("correlation_id", "conn_id", "proxy_id", "ts_ns", "latency_us", "status", "error_names", "long_poll")


def _side(req: DataFrame, s: str, extra: tuple[str, ...] = ()) -> DataFrame:
    """The columns a comparison needs, suffixed _a / _b (join keys and `extra` keep their names)."""
    r = req.withColumn("error_names", F.coalesce(F.array_sort(F.transform("errors", lambda e: e["name"])), F.array().cast("array<string>")))
    return r.select("client_id", "api_key", "api_name", *extra, *[F.col(c).alias(f"{c}_{s}") for c in SIDE_COLS])


def _with_sequence(req: DataFrame) -> DataFrame:
    """Add conn_rank (per client, by first request) and seq (per connection and API, by time)."""
    first = req.groupBy("proxy_id", "conn_id", "client_id").agg(F.min("ts_ns").alias("conn_start"))
    first = first.withColumn("conn_rank", F.row_number().over(Window.partitionBy("client_id").orderBy("conn_start", "conn_id")))
    r = req.join(first, ["proxy_id", "conn_id", "client_id"])
    return r.withColumn("seq", F.row_number().over(Window.partitionBy("proxy_id", "conn_id", "api_key").orderBy("ts_ns", "correlation_id")))


def choose_mode(a: DataFrame, b: DataFrame) -> str:
    """`wire` if the recordings overlap in time, else `sequence` (this collects two tiny aggregates)."""
    ra = a.agg(F.min("ts_ns"), F.max("ts_ns")).first()
    rb = b.agg(F.min("ts_ns"), F.max("ts_ns")).first()
    if None in (ra[0], rb[0]):
        return "wire"
    return "wire" if ra[0] <= rb[1] and rb[0] <= ra[1] else "sequence"


def match_requests(a: DataFrame, b: DataFrame, mode: str = "wire", tolerance_s: float = 10.0) -> DataFrame:
    """Pairs of matched requests (one row per A request that found its B twin)."""
    if mode == "sequence":
        keys = ["client_id", "conn_rank", "api_key", "seq"]
        ja = _side(_with_sequence(a), "a", ("conn_rank", "seq"))
        jb = _side(_with_sequence(b), "b", ("conn_rank", "seq")).drop("api_name")
        return ja.join(jb, keys).drop("conn_rank", "seq")
    tol = int(tolerance_s * 1e9)
    ja, jb = _side(a, "a"), _side(b, "b").drop("api_name")
    j = ja.join(jb, (ja.client_id == jb.client_id) & (ja.api_key == jb.api_key) & (ja.correlation_id_a == jb.correlation_id_b)
                & (F.abs(ja.ts_ns_a - jb.ts_ns_b) <= tol)).drop(jb.client_id).drop(jb.api_key)
    gap = F.abs(F.col("ts_ns_a") - F.col("ts_ns_b"))
    conn_a, conn_b = ["proxy_id_a", "conn_id_a"], ["proxy_id_b", "conn_id_b"]
    # a twin follows its request by the path's delay, steady; another connection's request of the same id comes
    # whenever that connection sent it: the pair whose gaps vary least, among those pairing the most requests
    votes = j.groupBy(*conn_a, *conn_b).agg(
        F.count(F.lit(1)).alias("_votes"),
        F.coalesce(F.stddev_pop(F.col("ts_ns_b") - F.col("ts_ns_a")), F.lit(0.0)).alias("_spread"),
        F.avg(gap).alias("_gap"))
    best = lambda side, other: Window.partitionBy(*side).orderBy(  # noqa: E731
        F.desc("_votes"), "_spread", "_gap", *other)
    pairs = votes.withColumn("_ra", F.row_number().over(best(conn_a, conn_b))) \
        .withColumn("_rb", F.row_number().over(best(conn_b, conn_a))).where("_ra = 1 AND _rb = 1")
    j = j.join(pairs.select(*conn_a, *conn_b), [*conn_a, *conn_b], "left_semi")
    w = Window.partitionBy("proxy_id_a", "conn_id_a", "correlation_id_a", "ts_ns_a").orderBy(gap)
    wb = Window.partitionBy("proxy_id_b", "conn_id_b", "correlation_id_b", "ts_ns_b").orderBy(gap)  # one twin each
    return j.withColumn("_r", F.row_number().over(w)).where("_r = 1") \
        .withColumn("_r", F.row_number().over(wb)).where("_r = 1").drop("_r")


def _diff(m: DataFrame) -> DataFrame:
    return m.withColumn("diff_us", F.col("latency_us_a") - F.col("latency_us_b"))


def compare_by_api(m: DataFrame) -> DataFrame:
    """Per API: p50/p99 on each side and of the per-request difference (A - B).

    A Fetch or ShareFetch that was a long poll on either side is its own row ("Fetch (long poll)",
    "ShareFetch (long poll)"): its latency is the broker waiting for data, so A − B says when data
    arrived (a replay answered at once what the original waited 500 ms for), not what lies between A and B.
    """
    long_poll = F.coalesce(F.col("long_poll_a"), F.lit(False)) | F.coalesce(F.col("long_poll_b"), F.lit(False))
    d = _diff(m).withColumn("api_name", api_label(long_poll))
    a = percentiles_by(d, ["api_name"], "latency_us_a", prefix="a_").select("api_name", "a_count", "a_p50_us", "a_p99_us")
    b = percentiles_by(d, ["api_name"], "latency_us_b", prefix="b_").select("api_name", "b_p50_us", "b_p99_us")
    x = percentiles_by(d, ["api_name"], "diff_us", prefix="diff_").select("api_name", "diff_p50_us", "diff_p99_us", "diff_max_us")
    return a.join(b, "api_name", "outer").join(x, "api_name", "outer").withColumnRenamed("a_count", "matched").orderBy(F.desc("matched"))


def compare_by_connection(m: DataFrame, limit: int = 5000) -> DataFrame:
    d = _diff(m)
    return d.groupBy("conn_id_a", "conn_id_b", "client_id").agg(
        F.count(F.lit(1)).alias("matched"),
        F.percentile_approx("diff_us", [0.5, 0.99], 2000).alias("q"),
        F.percentile_approx("latency_us_a", 0.5, 2000).alias("a_p50_us"),
        F.percentile_approx("latency_us_b", 0.5, 2000).alias("b_p50_us"),
    ).select("conn_id_a", "conn_id_b", "client_id", "matched", "a_p50_us", "b_p50_us", F.col("q")[0].alias("diff_p50_us"),
             F.col("q")[1].alias("diff_p99_us")).orderBy(F.desc_nulls_last("diff_p99_us")).limit(limit)


def compare_errors(m: DataFrame, limit: int = 5000) -> DataFrame:
    """Matched requests whose error sets differ, grouped by API and the two error sets."""
    d = m.where((F.col("error_names_a") != F.col("error_names_b")) | (F.col("status_a") != F.col("status_b")))
    return d.groupBy("api_name", F.concat_ws(",", "error_names_a").alias("errors_a"), F.concat_ws(",", "error_names_b").alias("errors_b"),
                     "status_a", "status_b").agg(
        F.count(F.lit(1)).alias("requests"),
        F.min_by(F.struct("conn_id_a", "correlation_id_a", "conn_id_b"), "ts_ns_a").alias("example"),
    ).select("api_name", "errors_a", "errors_b", "status_a", "status_b", "requests", F.col("example.conn_id_a").alias("example_conn_id_a"),
             F.col("example.correlation_id_a").alias("example_correlation_id_a"), F.col("example.conn_id_b").alias("example_conn_id_b")
             ).orderBy(F.desc("requests")).limit(limit)


def compare_ends(m: DataFrame, conns_a: DataFrame, conns_b: DataFrame, window_a: Bounds = (None, None),
                 window_b: Bounds = (None, None), limit: int = 5000) -> DataFrame:
    """Connection pairs (majority of matched requests) and how each ended; `same` is false when they differ.

    Each side is read as at the end of its own --since/--until window (`window_a`, `window_b`;
    `transforms.window.as_at_window_end`, the rule of `connection_ends`): an end after its window is no end
    there (open by none, no inferred cause or in-flight count), so the ends compared are those inside the
    windows, not ones days after the hour compared.
    """
    conns_a, conns_b = as_at_window_end(conns_a, *window_a), as_at_window_end(conns_b, *window_b)
    pairs = m.groupBy("proxy_id_a", "conn_id_a", "proxy_id_b", "conn_id_b").agg(F.count(F.lit(1)).alias("matched"))
    w = Window.partitionBy("proxy_id_a", "conn_id_a").orderBy(F.desc("matched"))
    pairs = pairs.withColumn("_r", F.row_number().over(w)).where("_r = 1").drop("_r")

    def side(c: DataFrame, s: str) -> DataFrame:
        return c.select(F.col("proxy_id").alias(f"proxy_id_{s}"), F.col("conn_id").alias(f"conn_id_{s}"),
                        first_client_id().alias(f"client_id_{s}"),
                        F.col("end_reason").alias(f"end_reason_{s}"), F.col("end_by").alias(f"end_by_{s}"),
                        F.col("inferred_cause").alias(f"inferred_cause_{s}"), F.col("unanswered").alias(f"unanswered_{s}"))

    j = pairs.join(side(conns_a, "a"), ["proxy_id_a", "conn_id_a"], "left").join(side(conns_b, "b"), ["proxy_id_b", "conn_id_b"], "left")
    same = (F.coalesce("end_reason_a", F.lit("")) == F.coalesce("end_reason_b", F.lit(""))) & (
        F.coalesce("end_by_a", F.lit("")) == F.coalesce("end_by_b", F.lit("")))
    return j.select("conn_id_a", "conn_id_b", F.col("client_id_a").alias("client_id"), "matched", "end_reason_a", "end_reason_b",
                    "end_by_a", "end_by_b", "inferred_cause_a", "inferred_cause_b", same.alias("same")).orderBy("same", "conn_id_a").limit(limit)


def compare_summary(a: DataFrame, b: DataFrame, m: DataFrame, mode: str,
                    clusters: tuple[list[str], list[str]] = ([], [])) -> DataFrame:
    """Per API: requests on each side, how many matched, and when each side's requests ran.

    The times are what `findings.compare.compare_few_matched` shows when few requests matched: two
    recordings of different windows, or a clock offset, show in them. They come from the aggregates
    that count the requests, so they cost no extra pass. `clusters`: the Kafka cluster ids each side's
    `topics/` names (`cluster_ids_a`, `cluster_ids_b`): two sides of one path record one cluster.
    """
    def side(req: DataFrame, s: str) -> DataFrame:
        return req.groupBy("api_name").agg(F.count(F.lit(1)).alias(f"requests_{s}"), ns_to_ts(F.min("ts_ns")).alias(f"first_{s}"),
                                           ns_to_ts(F.max("ts_ns")).alias(f"last_{s}"))

    cm = m.groupBy("api_name").agg(F.count(F.lit(1)).alias("matched"))
    return (side(a, "a").join(side(b, "b"), "api_name", "outer").join(cm, "api_name", "outer")
            .fillna(0, ["requests_a", "requests_b", "matched"]).withColumn("mode", F.lit(mode))
            .withColumns({f"cluster_ids_{s}": F.array(*[F.lit(c) for c in ids]).cast("array<string>")
                          for s, ids in zip("ab", clusters)})
            .select("api_name", "requests_a", "requests_b", "matched", "mode", "first_a", "last_a", "first_b", "last_b",
                    "cluster_ids_a", "cluster_ids_b")
            .orderBy(F.desc("requests_a")))
