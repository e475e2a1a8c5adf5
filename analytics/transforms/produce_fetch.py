"""Produce and Fetch detail: acks mix, batch sizes, compression, records/s, fetch rates, empty fetches."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics.transforms.cube import view
from analytics.transforms.stretches import RunSpan, rate_seconds

INCREMENTAL_FETCH = "(incremental fetch: topics unchanged)"
ACKS_LABEL = {0: "acks=0 (no response)", 1: "acks=1 (leader)", -1: "acks=all"}


def _span_s(spans: Sequence[RunSpan] | None) -> F.Column:
    """An aggregation's seconds: its first..last, less the time no proxy run recorded (`stretches.rate_seconds`)."""
    return rate_seconds(F.min("first_ns"), F.max("last_ns"), spans)


def _produce(rollup: DataFrame) -> DataFrame:
    return rollup.where(F.col("api_name") == "Produce")


def produce_acks(rollup: DataFrame) -> DataFrame:
    """Produce requests per acks setting (from the request rollup)."""
    label = F.coalesce(*[F.when(F.col("acks") == k, F.lit(v)) for k, v in ACKS_LABEL.items()], F.lit("unknown"))
    return _produce(rollup).groupBy(F.col("acks"), label.alias("acks_label")).agg(
        F.sum("requests").alias("requests"),
        F.countDistinct("client_id").alias("clients"),
        F.sum("records").alias("records"),
        F.sum("request_bytes").alias("bytes"),
        F.sum("requests_with_errors").alias("with_errors"),
        F.sum("requests_retriable").alias("with_retriable_errors"),
    ).orderBy(F.desc("requests"))


def produce_batches(topics: DataFrame, views: DataFrame) -> DataFrame:
    """Per topic: request size distribution, records per request and the codecs used.

    `topics` is the topic rollup; the size percentiles come from the cube's
    `produce_topic` view (`views`: the cube or its percentile views, 2 % bins).
    """
    agg = _produce(topics).where(F.col("topic").isNotNull()).groupBy("topic").agg(
        F.sum("requests").alias("requests"),
        F.max("max_request_bytes").alias("max_request_bytes"),
        # the topic's own records of each request (a request to several topics: its share)
        F.round(F.sum("split_records") / F.sum("requests_with_records"), 1).alias("avg_records_per_request"),
        F.array_sort(F.collect_set("compression")).alias("compression"),
    )
    q = view(views, "produce_topic", "request_bytes").select(F.col("k1").alias("topic"), "p50_us", "p99_us")
    return agg.join(q, "topic", "left").select(
        "topic", "requests", F.col("p50_us").alias("p50_request_bytes"), F.col("p99_us").alias("p99_request_bytes"),
        "max_request_bytes", "avg_records_per_request", F.concat_ws(", ", "compression").alias("compression"),
    ).orderBy(F.desc("requests"), "topic")


def produce_compression(rollup: DataFrame) -> DataFrame:
    return _produce(rollup).groupBy(F.coalesce("compression", F.lit("unknown")).alias("compression")).agg(
        F.sum("requests").alias("requests"), F.sum("record_bytes").alias("record_bytes"), F.sum("records").alias("records"),
    ).orderBy(F.desc("requests"))


def produce_rate_by_topic(topics: DataFrame, spans: Sequence[RunSpan] | None = None) -> DataFrame:
    """Records and bytes per second per topic over the topic's produce span (from the topic rollup), less the time
    no proxy run was recording (`spans`: the runs' spans, stretches.collect_spans)."""
    p = _produce(topics).where(F.col("topic").isNotNull())
    return p.groupBy("topic").agg(
        F.round(F.sum("split_records")).cast("long").alias("records"),  # the topic's own batches' records and bytes
        F.round(F.sum("fetch_bytes_split")).cast("long").alias("bytes"),
        F.countDistinct("client_id").alias("producers"),
        _span_s(spans).alias("span_s"),
    ).select("topic", "records", "bytes", "producers", F.round(F.col("records") / F.col("span_s"), 2).alias("records_per_s"),
             F.round(F.col("bytes") / F.col("span_s"), 1).alias("bytes_per_s")).orderBy(F.desc("records_per_s"), "topic")


def fetch_by_consumer(topics: DataFrame, spans: Sequence[RunSpan] | None = None) -> DataFrame:
    """Per consumer and topic: fetches, bytes/s, empty-fetch ratio and long-poll ratio (from the topic rollup); the
    rate is over the time some proxy run recorded (`spans`, as `produce_rate_by_topic`)."""
    # a fetch's bytes go to each topic as its response carried them (an older recording's: split evenly)
    f = topics.where(F.col("api_name") == "Fetch")
    # a Fetch in an incremental session (KIP-227) names no topic when nothing changed; one whose answer carried
    # records names their topics (proxy.rows), so what is left here is polls that named and received nothing
    return f.groupBy("client_id", F.coalesce("topic", F.lit(INCREMENTAL_FETCH)).alias("topic")).agg(
        F.sum("requests").alias("fetches"),
        F.round(F.sum("fetch_bytes_split")).cast("long").alias("bytes"),
        _span_s(spans).alias("span_s"),
        F.round(F.sum("empty") / F.sum("requests"), 4).alias("empty_ratio"),
        F.round(F.sum("long_polls") / F.sum("requests"), 4).alias("long_poll_ratio"),
    ).select("client_id", "topic", "fetches", "bytes", F.round(F.col("bytes") / F.col("span_s"), 1).alias("bytes_per_s"),
             "empty_ratio", "long_poll_ratio").orderBy(F.desc("bytes_per_s"), "client_id", "topic")
