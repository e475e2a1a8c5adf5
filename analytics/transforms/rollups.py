"""Rollups: the request view summed once, so the report tables never rescan every request.

Most request tables (inventory, topic view, acks/compression mix, throttling,
fetch rates, unanswered requests, the overview) only need counts, sums, minima
and maxima per client, connection, API or topic. Scanning 10 M requests once
per table costs one Spark job of real work per table; instead two plain hash
aggregates reduce the requests to a few thousand rows, and every table is
then a cheap aggregate of those. Only additive measures are kept, so any
coarser grouping of a rollup gives the same answer as grouping the requests.

- `request_rollup`: one row per connection x client x API x (group, acks,
  compression, status). A connection determines its client address and
  broker, so the rollup has about (connections x APIs) rows. It also keeps
  each group's best transfer rate of a large response (the TCP ceiling table).
- `topic_rollup`: Produce and Fetch (and ShareFetch) requests exploded by topic, one row per
  client x API x topic x compression (x time bucket, when the job gives one: the
  throughput chart's per-topic lines).
- `traffic_over_time`: requests and bytes per broker, client and time bucket
  (connections over time needs every request, long polls and unanswered ones
  too; the throughput chart's per-client lines are its sums over brokers).
- `notable_requests`: not a sum but the few rows that some tables read:
  requests with errors, and answers that named brokers. Kept once, so the error
  tables, the bypass table and the broker ids never scan every request.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics.transforms.common import FETCH_APIS, host, response_error_kind, time_bucket_index
from analytics.transforms.injected import injected_throttle, with_broker_errors
from analytics.transforms.topics import name_topic, name_topic_ids
from recording.request_sums import LARGE_RESPONSE_BYTES, NOTABLE_COLUMNS, SUMS, SumSpec
from protocol.error_kinds import ERROR, PROTOCOL_STEP, RETRIABLE


def _zero(name: str) -> Column:
    return F.coalesce(F.col(name), F.lit(0))


def request_rollup(req: DataFrame) -> DataFrame:
    """Additive measures of the prepared request view per connection, client and API."""
    throttled = (F.col("throttle_ms") > 0) & ~injected_throttle(F.col("edit"))  # a broker quota's, not a throttle= fault's
    transfer_s = (F.col("resp_last_ns") - F.col("resp_first_ns")) / 1e9
    big = (F.col("response_bytes") >= LARGE_RESPONSE_BYTES) & (transfer_s > 0)
    # each request counts once, by its worst error (protocol.error_kinds) among the broker's: kafkatap's injected ones are
    # not the broker's (analytics.transforms.injected)
    req = with_broker_errors(req)
    kind = response_error_kind("broker_errors", "broker_error_count")
    # grouped by the client's address, not its host: a connection has one address, so the rows are
    # the same, and the host's regular expression runs once per row of the result instead of per
    # request (bench/RESULTS.md, seventh session: the rollup step at 10 M requests)
    sums = req.groupBy(
        "proxy_id", "conn_id", "client_id", "client_addr", "broker_addr", "api_name", "group_id", "acks", "compression", "status",
    ).agg(
        F.count(F.lit(1)).alias("requests"),
        F.min("ts_ns").alias("first_ns"),
        F.max("ts_ns").alias("last_ns"),
        F.sum(_zero("request_bytes")).alias("request_bytes"),
        F.sum(_zero("response_bytes")).alias("response_bytes"),
        F.max("request_bytes").alias("max_request_bytes"),
        F.sum("records").alias("records"),  # null when no request of the group carried a count
        F.sum("record_bytes").alias("record_bytes"),
        # kind is null without errors: count 0 for those, never a null sum for a client without any
        F.sum(F.when(kind == ERROR, 1).otherwise(0).cast("long")).alias("requests_with_errors"),
        F.sum(F.when(kind == RETRIABLE, 1).otherwise(0).cast("long")).alias("requests_retriable"),
        F.sum(F.when(kind == PROTOCOL_STEP, 1).otherwise(0).cast("long")).alias("protocol_steps"),
        F.sum(F.col("long_poll").cast("long")).alias("long_polls"),
        F.max("max_wait_ms").alias("max_wait_ms"),
        F.sum(throttled.cast("long")).alias("throttled_requests"),
        F.sum(F.when(throttled, F.col("throttle_ms"))).alias("throttle_ms"),
        F.max(F.when(throttled, F.col("throttle_ms"))).alias("max_throttle_ms"),
        F.min(F.when(throttled, F.col("ts_ns"))).alias("first_throttled_ns"),
        F.max(F.when(big, F.col("response_bytes") / transfer_s)).alias("peak_response_bytes_per_s"),
        # requests the proxy injected a Kafka fault into (`fault#…` in `edit`): none, and the fault tables need no job
        F.sum(F.col("edit").contains("fault#").cast("long")).alias("faults_injected"),
    )  # fixed-width buffers only: a string max/first would turn this into a sort-based aggregate (the software name comes from connections)
    return sums.withColumn("client_host", host(F.col("client_addr"))).drop("client_addr")


def topic_rollup(req: DataFrame, bucket_s: int | None = None) -> DataFrame:
    """Produce and Fetch per client, API and topic (and time bucket `b`); a Fetch without topics gets topic null.

    A row's record bytes and records go to each topic as the row gives them
    (`topic_record_bytes`, `topic_records`: a fetch's as its response carried
    them, a multi-topic Produce's batches) in `fetch_bytes_split` and
    `split_records`; a row without them (one topic, an older recording) is split
    evenly over its topics, while `record_bytes` keeps the whole request's
    figure. `empty` counts, per topic, the requests that brought it no records.
    With `bucket_s` the rows are also per bucket index `b`: every measure is a
    sum, minimum or maximum, so the tables that group by client or topic get the
    same answer, and the throughput chart needs no scan of its own.
    """
    n = F.greatest(F.size("topics"), F.lit(1))
    given = {c: F.when(F.size(c) == F.size("topics"), F.col(c)) for c in ("topic_record_bytes", "topic_records")}
    # one struct per topic carrying its own figures (an exploded row does not drag the row's whole lists along)
    entries = F.transform("topics", lambda t, i: F.struct(
        t.alias("topic"), F.get(given["topic_record_bytes"], i).cast("double").alias("bytes"),
        F.get(given["topic_records"], i).cast("double").alias("records")))
    pf = req.where(F.col("api_name").isin("Produce", *FETCH_APIS)).select(
        "client_id", "client_host", "api_name", "compression", "ts_ns", "request_bytes", "records", "record_bytes", "long_poll",
        (F.col("record_bytes") / n).alias("even_bytes"), (F.col("records") / n).alias("even_records"),
        F.explode_outer(entries).alias("e"),
    ).select(
        "client_id", "client_host", "api_name", "compression", "ts_ns", "request_bytes", "records", "record_bytes", "long_poll",
        F.col("e.topic").alias("topic"), F.coalesce(F.col("e.bytes"), F.col("even_bytes")).alias("split_bytes"),
        F.coalesce(F.col("e.records"), F.col("even_records")).alias("split_records"),
    )
    keys = ["client_id", "client_host", "api_name", "topic", "compression"]
    if bucket_s is not None:
        pf = pf.withColumn("b", time_bucket_index("ts_ns", bucket_s))
        keys.append("b")
    return pf.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("requests"),
        F.min("ts_ns").alias("first_ns"),
        F.max("ts_ns").alias("last_ns"),
        F.sum("records").alias("records"),
        F.count("records").alias("requests_with_records"),
        F.sum("record_bytes").alias("record_bytes"),
        F.sum("split_bytes").alias("fetch_bytes_split"),
        F.sum("split_records").alias("split_records"),
        F.max("request_bytes").alias("max_request_bytes"),
        F.sum((F.coalesce(F.col("split_bytes"), F.lit(0.0)) == 0).cast("long")).alias("empty"),
        F.sum(F.col("long_poll").cast("long")).alias("long_polls"),
    )


def traffic_over_time(req: DataFrame, bucket_s: int) -> DataFrame:
    """Requests, bytes each way and records produced per broker, client and bucket index (ts // bucket)."""
    return req.groupBy("broker_addr", "client_id", time_bucket_index("ts_ns", bucket_s).alias("b")).agg(
        F.count(F.lit(1)).alias("requests"),
        F.sum("request_bytes").alias("request_bytes"),
        F.count("request_bytes").alias("sized_requests"),
        F.sum(_zero("response_bytes")).alias("response_bytes"),
        F.sum(F.when(F.col("api_name") == "Produce", _zero("records")).otherwise(0)).alias("produced_records"),
    )


def notable_requests(req: DataFrame) -> DataFrame:
    """The few request rows some tables read in detail: errors (their nested lists), and answers naming brokers (`advertised`, `bypass`).

    Few whatever the recording's size (errors are rare, and only Metadata, FindCoordinator and
    DescribeCluster answers name brokers), so one pass keeps them for three tables that each
    used to scan every request for their handful. Only NOTABLE_COLUMNS are kept.
    """
    return req.select(*NOTABLE_COLUMNS).where(
        (F.col("error_count") > 0) | F.col("advertised").isNotNull() | F.col("bypass").isNotNull())


def merged(stored: DataFrame, spec: SumSpec, keys: list[Column]) -> DataFrame:
    """Stored partial sums grouped by `keys` (the spec's keys, some rewritten), each measure merged as the spec says."""
    how = {"sum": F.sum, "min": F.min, "max": F.max}
    return stored.groupBy(*keys).agg(*[how[h](m).alias(m) for m, h in spec.measures.items()])


def request_rollup_from_sums(stored: DataFrame) -> DataFrame:
    """`request_rollup` of the requests whose sums the writer stored (`recording.request_sums`): the same rows."""
    spec = SUMS["request_sums"]
    sums = merged(stored, spec, [F.col(k) for k in spec.keys])
    return sums.withColumn("client_host", host(F.col("client_addr"))).drop("client_addr")


def _rebucketed(bucket_s: int) -> Column:
    """The stored 60 s bucket start as the index of the analysis's `bucket_s` bucket (a multiple of 60 s)."""
    return F.floor(F.col("b") / bucket_s).cast("long").alias("b")


def topic_rollup_from_sums(stored: DataFrame, bucket_s: int, topic_names: Mapping[str, str]) -> DataFrame:
    """`topic_rollup(req, bucket_s)` of the requests whose sums the writer stored, topics named as the requests' are."""
    spec = SUMS["topic_sums"]
    keys = [name_topic(F.col("topic"), topic_names).alias("topic") if k == "topic" else
            _rebucketed(bucket_s) if k == "b" else F.col(k) for k in spec.keys]
    return merged(stored, spec, keys)


def traffic_from_sums(stored: DataFrame, bucket_s: int) -> DataFrame:
    """`traffic_over_time(req, bucket_s)` of the requests whose sums the writer stored."""
    spec = SUMS["traffic_sums"]
    return merged(stored, spec, [_rebucketed(bucket_s) if k == "b" else F.col(k) for k in spec.keys])


def notable_from_stored(stored: DataFrame, topic_names: Mapping[str, str]) -> DataFrame:
    """`notable_requests` from the rows the writer kept, with topic ids named as the requests' are."""
    return name_topic_ids(stored, topic_names).select(*NOTABLE_COLUMNS)


def slowest_candidates(stored: DataFrame, topic_names: Mapping[str, str]) -> DataFrame:
    """Every file's slowest requests (the writer kept them: long polls already left out), for `drilldown.slowest_requests`."""
    return name_topic_ids(stored, topic_names).withColumn("long_poll", F.lit(False))
