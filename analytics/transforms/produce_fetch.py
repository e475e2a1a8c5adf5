"""Produce and Fetch detail: acks mix, batch sizes, compression, records/s, fetch rates, empty fetches."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

ACKS_LABEL = {0: "acks=0 (no response)", 1: "acks=1 (leader)", -1: "acks=all"}


def _span_s(df: DataFrame) -> F.Column:
    return F.greatest((F.max("ts_ns") - F.min("ts_ns")) / 1e9, F.lit(1.0))


def produce_acks(req: DataFrame) -> DataFrame:
    p = req.where(F.col("api_name") == "Produce")
    label = F.coalesce(*[F.when(F.col("acks") == k, F.lit(v)) for k, v in ACKS_LABEL.items()], F.lit("unknown"))
    return p.groupBy(F.col("acks"), label.alias("acks_label")).agg(
        F.count(F.lit(1)).alias("requests"),
        F.countDistinct("client_id").alias("clients"),
        F.sum("records").alias("records"),
        F.sum("request_bytes").alias("bytes"),
        F.sum(F.when(F.col("error_count") > 0, 1).otherwise(0)).alias("with_errors"),
    ).orderBy(F.desc("requests"))


def produce_batches(req: DataFrame, cube: DataFrame | None = None) -> DataFrame:
    """Per topic: request size distribution, records per request and the codecs used.

    With the latency cube the size percentiles come from its `produce_topic`
    view (2 % bins) instead of a second percentile scan.
    """
    p = req.where(F.col("api_name") == "Produce").select("request_bytes", "record_bytes", "records", "compression",
                                                          F.explode("topics").alias("topic"))
    agg = p.groupBy("topic").agg(
        F.count(F.lit(1)).alias("requests"),
        F.max("request_bytes").alias("max_request_bytes"),
        F.round(F.avg("records"), 1).alias("avg_records_per_request"),
        F.array_sort(F.collect_set("compression")).alias("compression"),
        *([] if cube is not None else [F.percentile_approx("request_bytes", [0.5, 0.99], 2000).alias("q")]),
    )
    if cube is not None:
        from analytics.transforms.cube import cube_percentiles

        q = cube_percentiles(cube, "produce_topic", "request_bytes").select(F.col("k1").alias("topic"), F.array("p50_us", "p99_us").alias("q"))
        agg = agg.join(q, "topic", "left")
    return agg.select("topic", "requests", F.col("q")[0].alias("p50_request_bytes"), F.col("q")[1].alias("p99_request_bytes"),
                      "max_request_bytes", "avg_records_per_request", F.concat_ws(", ", "compression").alias("compression")).orderBy(F.desc("requests"))


def produce_compression(req: DataFrame) -> DataFrame:
    p = req.where(F.col("api_name") == "Produce")
    return p.groupBy(F.coalesce("compression", F.lit("unknown")).alias("compression")).agg(
        F.count(F.lit(1)).alias("requests"), F.sum("record_bytes").alias("record_bytes"), F.sum("records").alias("records"),
    ).orderBy(F.desc("requests"))


def produce_rate_by_topic(req: DataFrame) -> DataFrame:
    """Records and bytes per second per topic over the recording's produce span."""
    p = req.where(F.col("api_name") == "Produce").select("ts_ns", "client_id", "records", "record_bytes", F.explode("topics").alias("topic"))
    return p.groupBy("topic").agg(
        F.sum("records").alias("records"),
        F.sum("record_bytes").alias("bytes"),
        F.countDistinct("client_id").alias("producers"),
        _span_s(p).alias("span_s"),
    ).select("topic", "records", "bytes", "producers", F.round(F.col("records") / F.col("span_s"), 2).alias("records_per_s"),
             F.round(F.col("bytes") / F.col("span_s"), 1).alias("bytes_per_s")).orderBy(F.desc("records_per_s"))


def fetch_by_consumer(req: DataFrame) -> DataFrame:
    """Per consumer and topic: fetches, bytes/s, empty-fetch ratio and long-poll ratio."""
    # a multi-topic fetch's bytes are split evenly over its topics (responses are summarized per request)
    f = req.where(F.col("api_name") == "Fetch").select(
        "ts_ns", "client_id", (F.col("record_bytes") / F.greatest(F.size("topics"), F.lit(1))).alias("record_bytes"), "long_poll",
        F.explode_outer("topics").alias("topic"))
    empty = F.coalesce(F.col("record_bytes"), F.lit(0)) == 0
    return f.groupBy("client_id", F.coalesce("topic", F.lit("")).alias("topic")).agg(
        F.count(F.lit(1)).alias("fetches"),
        F.round(F.sum("record_bytes")).cast("long").alias("bytes"),
        _span_s(f).alias("span_s"),
        F.round(F.avg(empty.cast("double")), 4).alias("empty_ratio"),
        F.round(F.avg(F.col("long_poll").cast("double")), 4).alias("long_poll_ratio"),
    ).select("client_id", "topic", "fetches", "bytes", F.round(F.col("bytes") / F.col("span_s"), 1).alias("bytes_per_s"),
             "empty_ratio", "long_poll_ratio").orderBy(F.desc("bytes_per_s"))
