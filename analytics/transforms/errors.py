"""Errors by name x API x topic x client, over time, and throttling.

Errors kafkatap injected (Kafka faults, `edit`) are counted in rows of their own, `injected` true: they are
in the recorded answers, so the table's counts add up to the rows', but they are not the broker's
(analytics.transforms.injected; the findings and charts leave them out, the faults section tells them).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics.transforms.common import bucket, error_kind, ns_to_ts
from analytics.transforms.injected import is_injected


def _exploded(req: DataFrame) -> DataFrame:
    """One row per error occurrence; the topic is the error's own, else the request's first."""
    e = req.where(F.col("error_count") > 0).select(
        "conn_id", "client_id", "api_name", "ts_ns", "request_bytes", "acks", "topics", "group_id", "edit",
        F.explode("errors").alias("e")
    )
    # a group (or other named resource: transactional id, ACL …) is not a topic: its own column
    return e.select(
        "conn_id", "client_id", "api_name", "ts_ns", "request_bytes", "acks",
        F.coalesce(F.col("e.name"), F.concat(F.lit("code "), F.col("e.code").cast("string"))).alias("error_name"),
        F.col("e.code").alias("error_code"),
        error_kind("api_name", "e.name").alias("kind"),
        F.coalesce(F.col("e.topic"), F.when(F.col("e.resource").isNull(), F.try_element_at(F.col("topics"), F.lit(1))),
                   F.lit("")).alias("topic"),
        F.coalesce(F.col("e.resource"), F.col("group_id"), F.lit("")).alias("group_or_resource"),
        is_injected(F.col("e"), F.col("edit")).alias("injected"),
    )


def errors_by_name(req: DataFrame) -> DataFrame:
    """Counts with evidence: first/last time, an example conn_id and request sizes.

    `kind` (error, retriable, protocol_step: `protocol.error_kinds`) keeps every code visible while
    saying which ones are the protocol working as designed. `injected`: kafkatap's own (a Kafka fault).
    """
    e = _exploded(req)
    return e.groupBy("error_name", "error_code", "kind", "api_name", "topic", "group_or_resource", "client_id", "injected").agg(
        F.count(F.lit(1)).alias("count"),
        F.countDistinct("conn_id").alias("connections"),
        ns_to_ts(F.min("ts_ns")).alias("first_seen"),
        ns_to_ts(F.max("ts_ns")).alias("last_seen"),
        F.min_by("conn_id", "ts_ns").alias("example_conn_id"),
        F.min("ts_ns").alias("example_ts_ns"),
        F.max("request_bytes").alias("max_request_bytes"),
        F.array_sort(F.collect_set("acks")).alias("acks"),
    ).orderBy(F.desc("count"), "error_name", "api_name", "topic", "group_or_resource", "client_id", "error_code", "injected")  # total: ties in one order whatever the partitioning


def errors_over_time(req: DataFrame, bucket_s: int) -> DataFrame:
    """Occurrences per time bucket, error name, kind and injected (the chart leaves protocol steps and injected out)."""
    e = _exploded(req).withColumn("bucket", bucket("ts_ns", bucket_s))
    return e.groupBy("bucket", "error_name", "kind", "injected").agg(F.count(F.lit(1)).alias("count")) \
        .orderBy("bucket", "error_name", "kind", "injected")


def throttling(rollup: DataFrame) -> DataFrame:
    """Who the brokers throttled (quota), on which API, and for how long in total (from the request rollup)."""
    t = rollup.where(F.col("throttled_requests") > 0)
    return t.groupBy("client_id", "api_name", "broker_addr").agg(
        F.sum("throttled_requests").alias("throttled_requests"),
        F.sum("throttle_ms").alias("total_throttle_ms"),
        F.max("max_throttle_ms").alias("max_throttle_ms"),
        ns_to_ts(F.min("first_throttled_ns")).alias("first_seen"),
    ).orderBy(F.desc("total_throttle_ms"), "client_id", "api_name", "broker_addr")  # total: ties in one order whatever the partitioning
