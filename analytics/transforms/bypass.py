"""Broker addresses that sent clients around the proxy (the requests' `bypass` column, explicit mode)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics.transforms.common import ns_to_ts


def bypassed_addresses(req: DataFrame) -> DataFrame:
    """One row per advertised address the proxy does not listen for: who was told, by which broker, when.

    Only Metadata / FindCoordinator / DescribeCluster rows can carry `bypass`, so
    the filter leaves a handful of rows whatever the recording's size.
    """
    b = req.where(F.col("bypass").isNotNull() & (F.size("bypass") > 0)).select(
        "conn_id", "client_id", "broker_addr", "api_name", "ts_ns", F.explode("bypass").alias("address"))
    return b.groupBy("address").agg(
        F.count(F.lit(1)).alias("responses"),
        F.countDistinct("client_id").alias("clients"),
        F.slice(F.array_sort(F.collect_set("client_id")), 1, 10).alias("client_ids"),
        F.array_sort(F.collect_set("broker_addr")).alias("told_by"),
        F.array_sort(F.collect_set("api_name")).alias("apis"),
        ns_to_ts(F.min("ts_ns")).alias("first_seen"),
        ns_to_ts(F.max("ts_ns")).alias("last_seen"),
        F.min_by("conn_id", "ts_ns").alias("example_conn_id"),
    ).orderBy(F.desc("responses"), "address")
