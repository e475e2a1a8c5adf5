"""Broker node ids beside their addresses, from the Metadata / DescribeCluster answers the proxy relayed.

Why from the answers: a connection only knows the address it reached; which node that is, the
cluster says itself in every Metadata answer (`advertised` holds `node_id@host:port`). The report
uses this small table to show "host:port (node N)" wherever it shows a broker.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics.transforms.common import ns_to_ts


def broker_ids(req: DataFrame, conns: DataFrame | None = None) -> DataFrame:
    """One row per (broker address, node id) a relayed answer named, with when it was first and last said.

    Only Metadata / DescribeCluster rows carry `advertised`, so this reads a handful of rows
    whatever the recording's size. An address that changed node (a replaced broker) has a row
    per node; the report takes the latest.

    With `conns`: an advertised address that is a proxy listener (explicit mode with the broker
    advertising the proxy, cluster mode's rewritten answers) is not a broker: the connections
    accepted on it name the broker behind it (`broker_addr`), and that broker takes its row. So the
    table lists the brokers the overview counts, and `listeners` the proxy listeners each was
    reached through (an advertised listener no recorded connection used stays as it is: nothing says
    which broker is behind it).
    """
    a = req.where(F.col("advertised").isNotNull()).select("ts_ns", F.explode("advertised").alias("entry"))
    a = a.where(F.col("entry").contains("@")).select(
        "ts_ns",
        F.substring_index("entry", "@", 1).try_cast("int").alias("node_id"),
        F.substring_index("entry", "@", -1).alias("address"))
    a = a.where(F.col("node_id").isNotNull())
    reached: DataFrame | None = None  # broker address -> the listeners its connections came in on
    if conns is not None:
        via = conns.where(F.col("listener").isNotNull() & F.col("broker_addr").isNotNull()).select(
            "listener", "broker_addr").distinct()
        behind = via.select(F.col("listener").alias("address"), F.col("broker_addr").alias("behind"))
        a = a.join(behind, "address", "left").select(
            "ts_ns", "node_id", F.coalesce("behind", "address").alias("address"))
        reached = via.groupBy(F.col("broker_addr").alias("address")).agg(
            F.array_sort(F.collect_set("listener")).alias("listeners"))
    out = a.groupBy("address", "node_id").agg(
        F.count(F.lit(1)).alias("answers"),
        ns_to_ts(F.min("ts_ns")).alias("first_seen"),
        ns_to_ts(F.max("ts_ns")).alias("last_seen"),
    )
    out = (out.join(reached, "address", "left") if reached is not None
           else out.select("*", F.lit(None).cast("array<string>").alias("listeners")))
    return out.select("address", "node_id", "listeners", "answers", "first_seen", "last_seen").orderBy(
        "node_id", "address")
