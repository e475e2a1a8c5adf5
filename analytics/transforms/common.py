"""Shared column logic: the prepared request view, percentiles and time buckets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from protocol.api_keys import ANY_CONNECTION_APIS, API_NAMES, BROKER_SENT_APIS, FOLLOWER_CLIENT_ID_PATTERN
from protocol.error_kinds import ERROR, PROTOCOL_STEP, PROTOCOL_STEPS, RETRIABLE, RETRIABLE_ERRORS
from recording.request_terms import FETCH_APIS, LONG_POLL_FRACTION, LONG_POLL_LABELS, LONG_POLL_SUFFIX  # noqa: F401 — shared with the writer's rollups

QUANTILES = (0.5, 0.9, 0.99, 0.999)
QNAMES = ("p50", "p90", "p99", "p999")

ADMIN_APIS = (
    "CreateTopics", "DeleteTopics", "CreatePartitions", "DescribeConfigs", "AlterConfigs", "IncrementalAlterConfigs",
    "CreateAcls", "DeleteAcls", "DescribeAcls", "DescribeCluster", "ListGroups", "DescribeGroups", "DeleteGroups",
    "ElectLeaders", "AlterPartitionReassignments", "ListPartitionReassignments", "DescribeLogDirs", "AlterReplicaLogDirs",
    "DeleteRecords", "DescribeUserScramCredentials", "AlterUserScramCredentials", "DescribeQuorum", "DescribeProducers",
    "DescribeTransactions", "ListTransactions", "DescribeClientQuotas", "AlterClientQuotas",
)
GROUP_APIS = ("JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup")  # the classic group protocol
# The newer group protocols, each named by the heartbeat its members send (and, for share groups, how they fetch).
KIP848_APIS = ("ConsumerGroupHeartbeat",)
SHARE_APIS = ("ShareGroupHeartbeat", "ShareFetch", "ShareAcknowledge")
STREAMS_APIS = ("StreamsGroupHeartbeat",)
# A broker's own traffic, recorded when the brokers also talk through the proxy's listener: the APIs only brokers
# send (protocol.api_keys.BROKER_SENT_APIS) and AddPartitionsToTxn, whose client form (v3 and below) comes with a
# producer's Produce and InitProducerId (the rows name no version, so the client as a whole tells them apart);
# a follower's Fetch and OffsetForLeaderEpoch are told by its client id (protocol.api_keys.FOLLOWER_CLIENT_ID_PATTERN)
BROKER_APIS = tuple(sorted(API_NAMES[k] for k in BROKER_SENT_APIS)) + ("AddPartitionsToTxn",)
FOLLOWER_APIS = ("Fetch", "OffsetForLeaderEpoch")
ANY_CONNECTION_API_NAMES = tuple(sorted(API_NAMES[k] for k in ANY_CONNECTION_APIS))


def literal_map(pairs: Mapping[str, object], value_type: str) -> Column:
    """A small driver-side dict (topic names, run times) as one literal map column of `value_type` values; null for
    an empty one, so a lookup in it gives null either way."""
    if not pairs:
        return F.lit(None).cast(f"map<string,{value_type}>")
    return F.create_map(*[x for k, v in sorted(pairs.items()) for x in (F.lit(k), F.lit(v).cast(value_type))])


def literal_rows(spark: SparkSession, columns: Sequence[tuple[str, str | T.DataType]],
                 rows: Sequence[Sequence[object]]) -> DataFrame:
    """A few rows the driver holds (run spans, stretches) as a DataFrame of `columns` ((name, Spark type) pairs).

    Why not `createDataFrame`: from Python rows it makes an RDD, and every query over it runs a job that
    pickles them across (~0.5 s of a small analysis each). A literal array of structs, exploded on a
    one-row range, is planned and evaluated in the driver's one task like any other expression.
    """
    types = [(name, kind if isinstance(kind, T.DataType) else T.DataType.fromDDL(kind)) for name, kind in columns]
    element = T.StructType([T.StructField(name, kind, True) for name, kind in types])
    values = F.array(*[F.struct(*[F.lit(v).cast(kind).alias(name) for (name, kind), v in zip(types, row)]) for row in rows])
    return spark.range(0, 1, 1, 1).select(F.inline(values.cast(T.ArrayType(element, True))))


def host(col: Column) -> Column:
    """host part of host:port (keeps [IPv6] whole); grouping by host survives ephemeral ports."""
    return F.regexp_extract(col, r"^(\[[^\]]*\]|[^:]*)", 1)


def is_long_poll() -> Column:
    """A Fetch or ShareFetch whose broker latency ≈ max_wait and that returned no data: time spent waiting, not working."""
    return (
        F.col("api_name").isin(*FETCH_APIS)
        & F.col("max_wait_ms").isNotNull()
        & (F.col("max_wait_ms") > 0)
        & (F.coalesce(F.col("record_bytes"), F.lit(0)) == 0)
        & (F.col("broker_latency_us") >= F.col("max_wait_ms") * (1000 * LONG_POLL_FRACTION))
    )


def api_label(long_poll: Column) -> Column:
    """`api_name`, except "<api_name> (long poll)" where `long_poll` ("Fetch (long poll)", "ShareFetch (long poll)"):
    a long poll's latency is waiting, never mixed with real reads."""
    return F.when(long_poll, F.concat(F.col("api_name"), F.lit(LONG_POLL_SUFFIX))).otherwise(F.col("api_name"))


def _sql_text(value: str) -> str:
    """`value` as a Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def error_kind_sql(api: str, name: str) -> str:
    """`protocol.error_kinds.error_kind` as Spark SQL text over the SQL expressions `api` and `name`.

    Text, parsed once by the JVM (`F.expr`), rather than a tree of Column calls: each PySpark Column
    operation is a Py4J round trip, and the ~50 of this expression, built a dozen times per analysis,
    were ~700 of a small analysis's ~17,800 round trips.
    """
    steps = " OR ".join(f"({api} = {_sql_text(a)} AND {name} = {_sql_text(n)})" for a, n in sorted(PROTOCOL_STEPS))
    retriable = ", ".join(_sql_text(n) for n in sorted(RETRIABLE_ERRORS))
    return (f"CASE WHEN {name} IS NULL THEN {_sql_text(ERROR)}"
            + (f" WHEN {steps} THEN {_sql_text(PROTOCOL_STEP)}" if steps else "")
            + (f" WHEN {name} IN ({retriable}) THEN {_sql_text(RETRIABLE)}" if retriable else "")
            + f" ELSE {_sql_text(ERROR)} END")


def error_kind(api: str, name: str) -> Column:
    """`protocol.error_kinds.error_kind` of the columns named `api` and `name` (SQL expressions): protocol_step,
    retriable or error."""
    return F.expr(error_kind_sql(api, name))


def response_error_kind(errors: str = "errors", error_count: str = "error_count") -> Column:
    """The worst kind among a request's `errors` (error > retriable > protocol_step), null without any.

    Evaluated only for the rare requests with errors (CASE stops at the first branch that holds). A
    request whose `error_count` says errors but whose list names none (a recording not made by this
    proxy) counts as an error: only a named protocol step is excused. `errors` / `error_count` name
    the columns to read (the request rollup passes the broker's own: analytics.transforms.injected).
    """
    def has(kind: str) -> str:
        return f"exists({errors}, err -> {error_kind_sql('api_name', 'err.name')} = {_sql_text(kind)})"
    return F.expr(f"CASE WHEN coalesce({error_count}, 0) <= 0 THEN CAST(NULL AS STRING)"
                  f" WHEN {has(ERROR)} THEN {_sql_text(ERROR)} WHEN {has(RETRIABLE)} THEN {_sql_text(RETRIABLE)}"
                  f" WHEN {has(PROTOCOL_STEP)} THEN {_sql_text(PROTOCOL_STEP)} ELSE {_sql_text(ERROR)} END")


def union_all(frames: Sequence[DataFrame]) -> DataFrame:
    """The frames one after another, columns matched by name (at least one frame)."""
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def prepare_requests(req: DataFrame) -> DataFrame:
    """The slim request view every transform uses (one projection, cached by the job).

    Adds: ts_ns, client_host, long_poll, api_label (long polls get their own
    label so they never mix with real Fetch latency), proxy_delay_us, topic
    (first topic; per-topic transforms explode `topics` instead).
    """
    return req.select(
        "proxy_id", "conn_id", "correlation_id", "api_key", "api_name", "api_version", "client_id", "client_addr",
        "broker_addr", "status", "answered", "request_bytes", "response_bytes",
        F.col("req_first_ns").alias("ts_ns"), "resp_first_ns", "resp_last_ns",
        "latency_us", "broker_latency_us",
        (F.coalesce(F.col("proxy_req_delay_us"), F.lit(0)) + F.coalesce(F.col("proxy_resp_delay_us"), F.lit(0))).alias("proxy_delay_us"),
        "acks", "topics", "records", "record_bytes", "topic_record_bytes", "topic_records", "compression", "max_wait_ms", "group_id",
        "client_software_name", "client_software_version", "throttle_ms", "error_count", "errors", "bypass", "advertised",
        "edit", "producer_id",  # injected faults (issue 17: analytics.transforms.faults)
        host(F.col("client_addr")).alias("client_host"),
        is_long_poll().alias("long_poll"),
    ).withColumn(
        "api_label", api_label(F.col("long_poll"))
    ).withColumn("client_id", F.coalesce(F.col("client_id"), F.lit("(none)")))


def percentiles_by(df: DataFrame, keys: Sequence[str], value: str, prefix: str = "", accuracy: int = 2000) -> DataFrame:
    """keys + count + p50/p90/p99/p999 + max + mean of one µs column (nulls ignored).

    percentile_approx with a modest accuracy keeps the aggregation buffers small
    (many groups x 10 M rows on 2 cores) while staying well within 1 % of rank.
    """
    q = F.percentile_approx(F.col(value), list(QUANTILES), accuracy)
    agg = df.where(F.col(value).isNotNull()).groupBy(*keys).agg(
        F.count(F.lit(1)).alias(f"{prefix}count"),
        q.alias("_q"),
        F.max(value).alias(f"{prefix}max_us"),
        F.round(F.avg(value), 1).alias(f"{prefix}mean_us"),
    )
    return agg.select(
        *keys,
        f"{prefix}count",
        *[F.col("_q")[i].alias(f"{prefix}{name}_us") for i, name in enumerate(QNAMES)],
        f"{prefix}max_us",
        f"{prefix}mean_us",
    )


def time_bucket_index(ts_col: str | Column, bucket_s: int) -> Column:
    """Which bucket (ts // bucket length) a ns timestamp falls into, as a long."""
    col = F.col(ts_col) if isinstance(ts_col, str) else ts_col
    return F.floor(col / (bucket_s * 1_000_000_000)).cast("long")


def bucket(ts_col: str | Column, bucket_s: int) -> Column:
    """Start of the time bucket a ns timestamp falls into, as a Spark timestamp."""
    return F.timestamp_seconds(time_bucket_index(ts_col, bucket_s) * bucket_s).alias("bucket")


def ns_to_ts(col: str | Column) -> Column:
    """epoch ns -> Spark timestamp (µs precision, UTC)."""
    c = F.col(col) if isinstance(col, str) else col
    return F.timestamp_micros(F.floor(c / 1000).cast("long"))


def follower(client_id: Column | None = None) -> Column:
    """The client id Kafka gives a follower broker's replica fetcher (FOLLOWER_CLIENT_ID_PATTERN) in `client_id`
    (a request row's `client_id` column by default); false when null."""
    cid = F.col("client_id") if client_id is None else client_id
    return F.coalesce(cid.rlike(FOLLOWER_CLIENT_ID_PATTERN), F.lit(False))


def first_client_id() -> Column:
    """The connection's client_id (connections keep every distinct one; the first names it)."""
    return F.coalesce(F.try_element_at(F.col("client_ids"), F.lit(1)), F.lit("(none)"))


def with_client(conns: DataFrame) -> DataFrame:
    """Connections with the naming columns every table uses (client_id, client_host)."""
    return conns.withColumn("client_id", first_client_id()).withColumn("client_host", host(F.col("client_addr")))


def broker_closed() -> Column:
    """The broker ended the connection (its FIN or RST): one predicate for every table that counts such ends,
    so `broker_closes`, `reconnects_by_client`'s `closed_by_broker` and `broker_outages` count the same."""
    return (F.col("end_by") == "broker") | F.col("end_reason").isin("broker_fin", "broker_rst")
