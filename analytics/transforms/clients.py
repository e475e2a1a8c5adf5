"""Client inventory (incident 3, docs/incidents.md#incident-3) and the topic view: who writes and who reads each topic."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics.transforms.common import (
    ADMIN_APIS, ANY_CONNECTION_API_NAMES, BROKER_APIS, FETCH_APIS, FOLLOWER_APIS, GROUP_APIS, KIP848_APIS, SHARE_APIS,
    STREAMS_APIS, follower, ns_to_ts, with_client,
)
from analytics.transforms.stretches import RunSpan, rate_seconds


def _has(api_names: tuple[str, ...] | str) -> F.Column:
    names = (api_names,) if isinstance(api_names, str) else api_names
    return F.max(F.col("api_name").isin(*names).cast("int")) == 1


def _broker_sent() -> Column:
    """A request only a broker sends (analytics.transforms.common.BROKER_APIS), a follower's fetch included."""
    api = F.col("api_name")
    return api.isin(*BROKER_APIS) | (api.isin(*FOLLOWER_APIS) & follower())


def client_inventory(rollup: DataFrame, topics: DataFrame, conns: DataFrame,
                     spans: Sequence[RunSpan] | None = None) -> DataFrame:
    """One row per (client_id, client host), busiest first, from the request and topic rollups.

    Role comes from what the client actually sent (Produce -> producer, Fetch ->
    consumer, classic group APIs -> group member, ConsumerGroupHeartbeat ->
    KIP-848 consumer, ShareGroupHeartbeat/ShareFetch -> share consumer,
    StreamsGroupHeartbeat -> streams member, admin APIs -> admin), so it works
    for every protocol version and for clients that never told us their software.
    A "client" whose every request (besides ApiVersions, FindCoordinator and SASL) is one only brokers send is a
    broker's own (role "broker"): transaction markers, a partition leader's AddPartitionsToTxn, a follower's
    fetches, share-group state, recorded because the brokers also talk through the proxy's listener.
    Rates are over the client's own active span, less the time no proxy run was recording (`spans`: the
    runs' spans, stretches.collect_spans; a directory reused across sessions hours apart).

    The software name and version (ApiVersions v3+) come from the connections,
    which keep what each client announced.
    """
    produce = F.col("api_name") == "Produce"
    fetch = F.col("api_name").isin(*FETCH_APIS)
    keys = ["client_id", "client_host"]
    agg = rollup.groupBy(*keys).agg(
        F.sum("requests").alias("requests"),
        F.countDistinct("proxy_id", "conn_id").alias("connections"),
        F.min("first_ns").alias("first_ns"),
        F.max("last_ns").alias("last_ns"),
        _has("Produce").alias("is_producer"),
        _has("Fetch").alias("is_consumer"),
        _has(GROUP_APIS).alias("is_group_member"),
        _has(KIP848_APIS).alias("is_kip848"),
        _has(SHARE_APIS).alias("is_share"),
        _has(STREAMS_APIS).alias("is_streams"),
        _has(ADMIN_APIS).alias("is_admin"),
        (F.max(_broker_sent().cast("int")) == 1).alias("sends_broker_apis"),
        (F.min((_broker_sent() | F.col("api_name").isin(*ANY_CONNECTION_API_NAMES)).cast("int")) == 1).alias("only_broker_apis"),
        F.array_sort(F.collect_set("group_id")).alias("groups"),
        F.sum(F.when(produce, F.coalesce(F.col("records"), F.lit(0))).otherwise(0)).alias("records_produced"),
        F.sum(F.when(produce, F.coalesce(F.col("record_bytes"), F.lit(0))).otherwise(0)).alias("bytes_produced"),
        F.sum(F.when(fetch, F.coalesce(F.col("record_bytes"), F.lit(0))).otherwise(0)).alias("bytes_fetched"),
        F.sum("request_bytes").alias("bytes_sent"),
        F.sum("response_bytes").alias("bytes_received"),
        F.sum("requests_with_errors").alias("requests_with_errors"),
        F.sum("requests_retriable").alias("requests_retriable"),
        F.array_sort(F.collect_set("broker_addr")).alias("brokers"),
    )
    named = topics.where(F.col("topic").isNotNull())
    per_topic = named.groupBy(*keys).agg(
        F.array_sort(F.collect_set(F.when(produce, F.col("topic")))).alias("topics_produced"),
        F.array_sort(F.collect_set(F.when(fetch, F.col("topic")))).alias("topics_consumed"),
    )
    empty = F.array().cast("array<string>")
    software = with_client(conns).groupBy(*keys).agg(
        F.max("client_software_name").alias("software_name"), F.max("client_software_version").alias("software_version"))
    agg = agg.join(per_topic, keys, "left").join(software, keys, "left").withColumn("topics_produced", F.coalesce("topics_produced", empty)).withColumn(
        "topics_consumed", F.coalesce("topics_consumed", empty))
    span_s = rate_seconds(F.col("first_ns"), F.col("last_ns"), spans)  # less the time no proxy run recorded
    roles = F.concat_ws(
        ", ",
        F.when(F.col("is_producer"), F.lit("producer")),
        F.when(F.col("is_consumer"), F.lit("consumer")),
        F.when(F.col("is_group_member"), F.lit("group member")),
        F.when(F.col("is_kip848"), F.lit("KIP-848 consumer")),
        F.when(F.col("is_share"), F.lit("share consumer")),
        F.when(F.col("is_streams"), F.lit("streams member")),
        F.when(F.col("is_admin"), F.lit("admin")),
    )
    return agg.select(
        "client_id", "client_host",
        F.when(F.col("sends_broker_apis") & F.col("only_broker_apis"), F.lit("broker"))
        .when(roles == "", F.lit("other")).otherwise(roles).alias("role"),
        "software_name", "software_version", "requests", "connections",
        F.round(F.col("requests") / span_s, 2).alias("requests_per_s"),
        "records_produced",
        F.round(F.col("records_produced") / span_s, 2).alias("records_produced_per_s"),
        F.round((F.col("bytes_sent") + F.col("bytes_received")) / span_s, 1).alias("bytes_per_s"),
        "bytes_produced", "bytes_fetched", "bytes_sent", "bytes_received", "requests_with_errors", "requests_retriable",
        "topics_produced", "topics_consumed", "groups", "brokers",
        ns_to_ts("first_ns").alias("first_seen"), ns_to_ts("last_ns").alias("last_seen"),
    ).orderBy(F.desc("requests"), F.desc("bytes_per_s"), "client_id")


def _topic_own(which: Column, share: str) -> Column:
    """A topic rollup's per-topic share (`fetch_bytes_split`, `split_records`) of the rows `which` selects, rounded.

    Why not `record_bytes`/`records`: those are the whole request's, counted under every topic it named.
    """
    return F.round(F.sum(F.when(which, F.coalesce(F.col(share), F.lit(0.0))).otherwise(0.0))).cast("long")


def topic_view(topics: DataFrame) -> DataFrame:
    """Per topic: producers, consumers, records and bytes each way (from the topic rollup).

    A follower broker's fetches (its replica fetcher's client id, FOLLOWER_CLIENT_ID_PATTERN; recorded where the
    brokers also talk through the proxy's listener) are replication, not reading: left out of consumers and bytes."""
    t = topics.where(F.col("topic").isNotNull() & ~follower())
    produce = F.col("api_name") == "Produce"
    return t.groupBy("topic").agg(
        F.array_sort(F.collect_set(F.when(produce, F.col("client_id")))).alias("producers"),
        F.array_sort(F.collect_set(F.when(~produce, F.col("client_id")))).alias("consumers"),
        F.sum(F.when(produce, F.col("requests")).otherwise(0)).alias("produce_requests"),
        F.sum(F.when(~produce, F.col("requests")).otherwise(0)).alias("fetch_requests"),
        _topic_own(produce, "split_records").alias("records_produced"),
        _topic_own(produce, "fetch_bytes_split").alias("bytes_produced"),
        _topic_own(~produce, "fetch_bytes_split").alias("bytes_fetched"),
    ).withColumn("producer_count", F.size("producers")).withColumn("consumer_count", F.size("consumers")).orderBy(
        F.desc("bytes_produced"), "topic"
    )


def group_protocols(rollup: DataFrame) -> DataFrame:
    """Per group: which group protocol its members speak (classic / consumer / share / streams), and who they are.

    Decided by the heartbeat the members send (JoinGroup/SyncGroup/Heartbeat:
    classic; ConsumerGroupHeartbeat: consumer, KIP-848; ShareGroupHeartbeat:
    share, KIP-932; StreamsGroupHeartbeat: streams, KIP-1071). A group seen only
    through offset APIs (OffsetCommit/OffsetFetch, admin tools) has protocol
    "unknown". Several protocols on one group (a migration in progress) are all listed.
    """
    g = rollup.where(F.col("group_id").isNotNull() & (F.col("group_id") != ""))
    proto = (F.when(F.col("api_name").isin(*GROUP_APIS), F.lit("classic"))
             .when(F.col("api_name").isin(*KIP848_APIS), F.lit("consumer"))
             .when(F.col("api_name").isin(*SHARE_APIS), F.lit("share"))
             .when(F.col("api_name").isin(*STREAMS_APIS), F.lit("streams")))
    agg = g.groupBy("group_id").agg(
        F.array_sort(F.collect_set(proto)).alias("_protocols"),
        F.array_sort(F.collect_set("client_id")).alias("clients"),
        F.sum("requests").alias("requests"),
        F.min("first_ns").alias("first_ns"),
        F.max("last_ns").alias("last_ns"),
    )
    protocols = F.when(F.size("_protocols") == 0, F.lit("unknown")).otherwise(F.array_join("_protocols", ", "))
    return agg.select(
        "group_id", protocols.alias("protocol"), "clients", F.size("clients").alias("client_count"), "requests",
        ns_to_ts("first_ns").alias("first_seen"), ns_to_ts("last_ns").alias("last_seen"),
    ).orderBy(F.desc("requests"), "group_id")
