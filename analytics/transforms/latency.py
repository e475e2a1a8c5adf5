"""Latency percentiles (µs) by API, version, broker, topic, client and over time.

Every view reads the latency cube (`analytics/transforms/cube.py`), which one
pass over the requests builds; nothing here scans the raw requests again.
Long-poll Fetches are labelled "Fetch (long poll)" (ShareFetches "ShareFetch
(long poll)") by `prepare_requests` and kept out of the broker/topic/client
views: a consumer waiting 500 ms for data that is not there is not a slow
broker. Proxy-added delay has its own table.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics.transforms.common import FETCH_APIS
from analytics.transforms.cube import view


def long_polls_by_client(rollup: DataFrame, views: DataFrame) -> DataFrame:
    """Per consumer: how many of its Fetches (and ShareFetches) were long polls and how long they waited.

    `rollup` is the request rollup; the median wait comes from the cube's
    long-poll view (`views`: the cube or its percentile views), which holds both APIs' waits.
    """
    f = rollup.where(F.col("api_name").isin(*FETCH_APIS)).groupBy("client_id").agg(
        F.sum("requests").alias("fetches"),
        F.sum("long_polls").alias("long_polls"),
        F.max("max_wait_ms").alias("max_wait_ms"),
    )
    wait = view(views, "long_poll_wait", "broker_latency").select(F.col("k1").alias("client_id"), F.col("p50_us").alias("median_wait_us"))
    return f.join(wait, "client_id", "left").select(
        "client_id", "fetches", "long_polls", F.round(F.col("long_polls") / F.col("fetches"), 4).alias("long_poll_ratio"),
        "median_wait_us", "max_wait_ms",
    ).orderBy(F.desc("fetches"), "client_id")


# ---- the latency views, each read from the cube (one pass over the requests builds every one).
# Each takes the cube or, as the job does, its pinned `percentile_views`.

def _k1(views: DataFrame, dim: str, name: str, metric: str = "latency") -> DataFrame:
    return view(views, dim, metric).withColumnRenamed("k1", name)


def cube_latency_by_api(cube: DataFrame) -> DataFrame:
    return _k1(cube, "api", "api_label").drop("k2").orderBy(F.desc("count"))


def cube_broker_latency_by_api(cube: DataFrame) -> DataFrame:
    return _k1(cube, "api", "api_label", "broker_latency").drop("k2").orderBy(F.desc("count"))


def cube_proxy_delay_by_api(cube: DataFrame) -> DataFrame:
    return _k1(cube, "api", "api_name", "proxy_delay").drop("k2").orderBy(F.desc("count"))


def cube_latency_by_api_version(cube: DataFrame) -> DataFrame:
    return (_k1(cube, "api_version", "api_label").withColumn("api_version", F.col("k2").try_cast("short")).drop("k2")
            .select("api_label", "api_version", *[c for c in cube_percentile_columns()]).orderBy("api_label", "api_version"))


def cube_latency_by_broker(cube: DataFrame) -> DataFrame:
    return _k1(cube, "broker", "broker_addr").drop("k2").orderBy(F.desc("p99_us"))


def cube_latency_by_client(cube: DataFrame) -> DataFrame:
    return _k1(cube, "client", "client_id").drop("k2").orderBy(F.desc("p99_us"))


def cube_latency_by_topic(cube: DataFrame) -> DataFrame:
    return (_k1(cube, "topic", "topic").withColumnRenamed("k2", "api_name")
            .select("topic", "api_name", *cube_percentile_columns()).orderBy(F.desc("p99_us")))


def cube_latency_over_time(cube: DataFrame) -> DataFrame:
    t = view(cube, "time", "latency")
    return t.select(F.timestamp_seconds(F.col("k1").try_cast("long")).alias("bucket"), F.col("k2").alias("api_name"),
                    *cube_percentile_columns()).orderBy("bucket", "api_name")


def cube_percentile_columns() -> list[str]:
    return ["count", "p50_us", "p90_us", "p99_us", "p999_us", "max_us", "mean_us"]
