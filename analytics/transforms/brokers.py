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
    """One row per (address, node id) a relayed answer named, with when it was first and last said.

    Only Metadata / DescribeCluster rows carry `advertised`, so this reads a handful of rows
    whatever the recording's size. An address that changed node (a replaced broker) has a row
    per node; the report takes the latest.

    With `conns`: when the advertised address is a proxy listener (explicit mode with the broker
    advertising the proxy, cluster mode), the connections accepted on it name the broker behind
    it (`broker_addr`), and that address gets the node too.
    """
    a = req.where(F.col("advertised").isNotNull()).select("ts_ns", F.explode("advertised").alias("entry"))
    a = a.where(F.col("entry").contains("@")).select(
        "ts_ns",
        F.substring_index("entry", "@", 1).try_cast("int").alias("node_id"),
        F.substring_index("entry", "@", -1).alias("address"))
    a = a.where(F.col("node_id").isNotNull())
    if conns is not None:
        via = conns.where(F.col("listener").isNotNull() & F.col("broker_addr").isNotNull()).select(
            F.col("listener").alias("address"), F.col("broker_addr").alias("behind")).distinct()
        a = a.unionByName(a.join(via, "address").where(F.col("behind") != F.col("address")).select(
            "ts_ns", "node_id", F.col("behind").alias("address")))
    return a.groupBy("address", "node_id").agg(
        F.count(F.lit(1)).alias("answers"),
        ns_to_ts(F.min("ts_ns")).alias("first_seen"),
        ns_to_ts(F.max("ts_ns")).alias("last_seen"),
    ).orderBy("node_id", "address")
