"""Views an operator investigates with: throughput over time, the slowest requests, one connection's story.

Throughput is per topic and per client, in both directions (client → broker,
broker → client), over the report's time buckets; only the busiest keys are
kept so the table stays a chart's worth. The slowest requests carry conn id
and correlation id, the two numbers that find a request again in a capture or
in a client's own log. The per-connection drill-down (`connection_requests`,
`connection_tcp`, `connection_facts`) is asked for a bounded set of conn ids:
the ones other tables point at.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.transforms.common import ns_to_ts, with_client
from recording.request_sums import SLOWEST_KEPT

THROUGHPUT_KEYS = 8  # busiest topics and clients charted; the rest are folded into "(others)"
SLOWEST = SLOWEST_KEPT  # the report's slowest requests: at most what the writer keeps per file (recording.request_sums)
CONNECTION_REQUESTS = 300  # requests shown per drilled-down connection (its first ones, in time order)
OTHERS = "(others)"


def _rates(df: DataFrame, bucket_s: int) -> DataFrame:
    """Sum per (by, key, bucket) and divide by the bucket length; keys past the busiest folded into OTHERS."""
    rank = Window.partitionBy("by").orderBy(F.desc("key_total"), "key")
    ranked = (df.groupBy("by", "key").agg((F.sum("to_broker") + F.sum("to_client")).alias("key_total"))
              .withColumn("rank", F.dense_rank().over(rank)))
    named = df.join(ranked.select("by", "key", "rank"), ["by", "key"]).withColumn(
        "key", F.when(F.col("rank") <= THROUGHPUT_KEYS, F.col("key")).otherwise(F.lit(OTHERS)))
    return named.groupBy("by", "key", "bucket").agg(
        F.round(F.sum("to_broker") / bucket_s, 1).alias("bytes_to_broker_per_s"),
        F.round(F.sum("to_client") / bucket_s, 1).alias("bytes_to_client_per_s"),
        F.round(F.sum("records") / bucket_s, 2).alias("records_per_s"),
    ).orderBy("by", "key", "bucket")


def throughput_over_time(traffic: DataFrame, topics: DataFrame, bucket_s: int) -> DataFrame:
    """Bytes/s each way and records/s produced, per client (whole frames) and per topic (record bytes).

    A client's bytes are its request and response frames; a topic's are the
    record batches produced to it (client → broker) and fetched from it
    (broker → client), each topic's own share of a request naming several
    (`rollups.topic_rollup`: as the row gives it, else an even split).
    Records are the produced ones (Fetch responses are summarized in bytes).
    Read from the rollups (`rollups.traffic_over_time`, and `rollups.topic_rollup`
    made with the same `bucket_s`), not from the requests: no scan of its own.
    """
    zero = F.lit(0.0)
    per_client = traffic.groupBy(F.col("client_id").alias("key"), "b").agg(
        F.coalesce(F.sum("request_bytes"), zero).cast("double").alias("to_broker"),
        F.coalesce(F.sum("response_bytes"), zero).cast("double").alias("to_client"),
        F.coalesce(F.sum("produced_records"), zero).cast("double").alias("records"),
    ).select(F.lit("client").alias("by"), "key", "b", "to_broker", "to_client", "records")
    produce = F.col("api_name") == "Produce"
    per_topic = topics.where(F.col("topic").isNotNull()).groupBy(F.col("topic").alias("key"), "b").agg(  # Produce, Fetch, ShareFetch
        F.coalesce(F.sum(F.when(produce, F.col("fetch_bytes_split"))), zero).cast("double").alias("to_broker"),
        F.coalesce(F.sum(F.when(~produce, F.col("fetch_bytes_split"))), zero).cast("double").alias("to_client"),
        F.coalesce(F.sum(F.when(produce, F.col("split_records"))), zero).cast("double").alias("records"),
    ).select(F.lit("topic").alias("by"), "key", "b", "to_broker", "to_client", "records")
    both = per_client.unionByName(per_topic)
    return _rates(both.select("by", "key", F.timestamp_seconds(F.col("b") * bucket_s).alias("bucket"),
                              "to_broker", "to_client", "records"), bucket_s)


def slowest_requests(req: DataFrame, n: int = SLOWEST, floor_us: int | None = None) -> DataFrame:
    """The n slowest answered requests by client-visible latency; long-poll Fetches (waiting by design) excluded.

    `floor_us` (`cube.tail_floor`), when given, must be at most the n-th highest latency: requests
    below it are dropped before the ordering, so only a few rows are ever materialized and sorted.
    """
    r = req.where(F.col("latency_us").isNotNull() & ~F.col("long_poll"))
    if floor_us is not None:
        r = r.where(F.col("latency_us") >= floor_us)
    return r.orderBy(F.desc("latency_us"), "conn_id", "correlation_id").limit(n).select(
        ns_to_ts("ts_ns").alias("at"), "conn_id", "correlation_id", "api_name", "api_version", "client_id",
        "broker_addr", "topics", "latency_us", "broker_latency_us", "request_bytes", "response_bytes", "status",
        F.array_distinct(F.transform("errors", lambda e: F.coalesce(e["name"], e["code"].cast("string")))).alias("errors"),
        "proxy_id",
    )


def connection_hours(stored_sums: DataFrame, conn_ids: Sequence[str]) -> DataFrame:
    """Per (proxy, connection) of `conn_ids` and recorded hour: its requests, from the stored request sums.

    A stored sums file stands for one hour's requests file(s) (recording.rollups), so each row's
    first request gives its hour. What `analytics.job.drill_requests` needs to read only the hours
    that hold a connection's first requests.
    """
    return stored_sums.where(F.col("conn_id").isin(list(conn_ids))).groupBy(
        "proxy_id", "conn_id", F.floor(F.col("first_ns") / F.lit(3600 * 10**9)).cast("long").alias("hour_index"),
    ).agg(F.sum("requests").alias("requests"))


def in_hours(pairs: Sequence[tuple[str, str, str, int]]) -> Column:
    """Rows of the given (proxy, conn) pairs in the given (date, hour) partitions.

    The hours are a predicate on the partition columns alone, so Spark lists and opens only those
    hours' files (Hive partition pruning); the pairs are one set lookup per row (a disjunction of
    one term per pair made the scan several times slower).
    """
    hour = F.concat_ws("/", F.col("date"), F.col("hour").cast("string"))
    hours = sorted({f"{d}/{h}" for _, _, d, h in pairs})
    keys = sorted({f"{p}\x00{c}\x00{d}/{h}" for p, c, d, h in pairs})
    return (hour.isin(hours) & F.col("conn_id").isin(sorted({c for _, c, _, _ in pairs}))
            & F.concat_ws("\x00", F.col("proxy_id"), F.col("conn_id"), hour).isin(keys))


def connection_requests(req: DataFrame, conn_ids: Sequence[str], per_conn: int = CONNECTION_REQUESTS) -> DataFrame:
    """The first `per_conn` requests of each given connection, in time order (its request timeline)."""
    w = Window.partitionBy("proxy_id", "conn_id").orderBy("ts_ns", "correlation_id")
    r = req.where(F.col("conn_id").isin(list(conn_ids))).withColumn("seq", F.row_number().over(w))
    return r.where(F.col("seq") <= per_conn).select(
        "proxy_id", "conn_id", "seq", ns_to_ts("ts_ns").alias("at"), "correlation_id", "api_name", "api_version",
        "client_id", "topics", "request_bytes", "response_bytes", "latency_us", "broker_latency_us", "status",
        F.array_distinct(F.transform("errors", lambda e: F.coalesce(e["name"], e["code"].cast("string")))).alias("errors"),
    ).orderBy("proxy_id", "conn_id", "seq")


def connection_tcp(tcp: DataFrame, conn_ids: Sequence[str]) -> DataFrame:
    """Every TCP_INFO sample of the given connections, both sockets, in time order."""
    return tcp.where(F.col("conn_id").isin(list(conn_ids))).select(
        "proxy_id", "conn_id", ns_to_ts("ts_ns").alias("at"), "side", "phase", "state", "rtt_us", "rttvar_us",
        "retrans_total", "lost", "snd_cwnd", "snd_wscale", "rcv_wscale", "wscale_ok", "delivery_rate_bps",
        "bytes_acked", "bytes_received",
    ).orderBy("proxy_id", "conn_id", "ts_ns", "side")


def connection_facts(conns: DataFrame, conn_ids: Sequence[str]) -> DataFrame:
    """One row per given connection: who, where, how long, how it ended and why."""
    return with_client(conns).where(F.col("conn_id").isin(list(conn_ids))).select(
        "proxy_id", "conn_id", "client_id", "client_addr", "broker_addr", "mode",
        ns_to_ts("opened_ns").alias("opened_at"), ns_to_ts("closed_ns").alias("closed_at"), "duration_us",
        "requests", "responses", "bytes_from_client", "bytes_from_broker", "client_software_name",
        "client_software_version", "end_reason", "end_by", "end_detail", "idle_before_end_ms", "unanswered",
        "last_api", "last_request_bytes", "last_request_acks", "last_request_topics", "inferred_cause", "opaque_reason",
    ).orderBy("proxy_id", "conn_id")
