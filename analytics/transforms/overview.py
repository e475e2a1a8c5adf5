"""Overview: one row answering "what is in this recording?"."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics.transforms.common import first_client_id, follower, ns_to_ts
from analytics.transforms.outages import unreachable
from analytics.transforms.window import as_at_window_end
from recording.layout import WORKER_SUFFIX_RE


def opaque() -> Column:
    """A connection the proxy relayed without decoding (all of it, or from some byte on): TLS, or `opaque` with its reason."""
    return F.col("tls") | F.col("opaque") | F.col("opaque_reason").isNotNull()


def sent_removed_versions() -> Column:
    """A client's connection that sent request versions Kafka 4.0 removed (KIP-896): the proxy's `removed_in_kafka_4`.

    A follower broker's replica fetcher (its client id, `FOLLOWER_CLIENT_ID_PATTERN`) is left out: its old
    Fetch versions are its inter-broker protocol's, not a client's to upgrade (the proxy already leaves out
    the APIs only brokers send)."""
    return (F.coalesce(F.size("removed_in_kafka_4"), F.lit(0)) > 0) & ~follower(first_client_id())


def clamp(ns: Column, lo: int | None, hi: int | None) -> Column:
    """`ns` moved into [lo, hi] (either bound may be absent); null stays null.

    Spark's greatest/least skip nulls, so without the null check "no data" would come out as the bound itself.
    """
    out = ns if lo is None else F.greatest(ns, F.lit(lo))
    out = out if hi is None else F.least(out, F.lit(hi))
    return out if lo is None and hi is None else F.when(ns.isNotNull(), out)


def overview(rollup: DataFrame, conns: DataFrame, since_ns: int | None = None, until_ns: int | None = None) -> DataFrame:
    """Time span, proxies, brokers, clients, connections, requests, bytes and error rates.

    The span (`start`, `end`, `span_s`) is where the data meets the `since_ns`/`until_ns` window
    (--since/--until): the connections kept are those open at some time inside it, so a connection
    opened a week before `since_ns` would otherwise stretch a one-hour window's span (and the time
    bucket the job chooses from it) to a week.

    Under the window the connections are read as at its end (`transforms.window.as_at_window_end`, the
    connection tables' notion): `connections` (and `opaque_connections`, `tls_connections`) counts every
    connection the window sees, the one already open at its start and the one still open at its end, as
    `request_connections` counts those that sent requests inside it (the summary compares the two);
    `connections_ended` counts the ends inside it, not ones days after it.

    A request counts once, by its worst error from the broker (`protocol.error_kinds`; errors kafkatap injected
    are not the broker's: `analytics.transforms.injected`): `error_rate` is the share whose answer carried a real error, `retriable_rate` the share that only carried errors Kafka's
    clients retry, and `protocol_steps` counts answers like a first JoinGroup's MEMBER_ID_REQUIRED,
    which are how the protocol works and no error at all. `rollup` is the request rollup. Computed as two single-row aggregates
    cross-joined, so it is one cheap pass over each. `opaque_connections` (`tls_connections` of them TLS) were relayed
    without decoding: they are why the job adds the `opaque_connections` table, and only when there are some;
    `unreachable_connects` (connects the broker refused or never answered, `outages.unreachable`) are why it
    computes the broker outages.
    """
    def status(name: str) -> Column:
        return F.sum(F.when(F.col("status") == name, F.col("requests")).otherwise(0))

    r = rollup.agg(
        F.min("first_ns").alias("first_ns"),
        F.max("last_ns").alias("last_ns"),
        # a proxy with --workers N records under N ids (`<id>-w1` …): one proxy, N processes
        F.countDistinct(F.regexp_replace("proxy_id", WORKER_SUFFIX_RE, "")).alias("proxies"),
        F.countDistinct("proxy_id").alias("proxy_processes"),
        F.countDistinct("broker_addr").alias("brokers"),
        F.countDistinct("client_id").alias("client_ids"),
        # connections that sent requests; more than `connections` while a proxy still runs: a connection's row
        # is written at its close or its first snapshot (--tcp-info-interval), its requests as they are answered
        F.countDistinct("proxy_id", "conn_id").alias("request_connections"),
        F.coalesce(F.sum("requests"), F.lit(0)).alias("requests"),
        F.coalesce(F.sum("request_bytes"), F.lit(0)).alias("request_bytes"),
        F.coalesce(F.sum("response_bytes"), F.lit(0)).alias("response_bytes"),
        F.coalesce(F.sum("requests_with_errors"), F.lit(0)).alias("requests_with_errors"),
        F.coalesce(F.sum("requests_retriable"), F.lit(0)).alias("requests_retriable"),
        F.coalesce(F.sum("protocol_steps"), F.lit(0)).alias("protocol_steps"),
        status("unanswered").alias("unanswered"),
        status("no_response").alias("acks0_produces"),
        F.coalesce(F.sum("faults_injected"), F.lit(0)).alias("faults_injected"),
    )
    c = as_at_window_end(conns, since_ns, until_ns).agg(
        F.count(F.lit(1)).alias("connections"),
        # a recording of connections relayed without decoding (TLS pass-through) has no request naming a proxy or a
        # broker: "0 brokers · 0 proxies" beside a finding that they relayed KiB to one
        F.countDistinct(F.regexp_replace("proxy_id", WORKER_SUFFIX_RE, "")).alias("conn_proxies"),
        F.countDistinct("proxy_id").alias("conn_proxy_processes"),
        F.countDistinct("broker_addr").alias("conn_brokers"),
        F.sum(F.when(F.col("end_by").isin("client", "broker", "proxy"), 1).otherwise(0)).alias("connections_ended"),
        F.min("opened_ns").alias("first_open_ns"),
        F.max(F.coalesce("closed_ns", "snapshot_ns")).alias("last_close_ns"),
        # relayed without decoding, TLS pass-through among them: their requests are not in the recording
        F.coalesce(F.sum(F.when(F.col("tls"), 1).otherwise(0)), F.lit(0)).alias("tls_connections"),
        F.coalesce(F.sum(F.when(opaque(), 1).otherwise(0)), F.lit(0)).alias("opaque_connections"),
        # connects the broker never answered: the job builds the outage tables only when there are some
        F.coalesce(F.sum(F.when(unreachable(), 1).otherwise(0)), F.lit(0)).alias("unreachable_connects"),
        # sent request versions Kafka 4.0 removed (KIP-896): the job builds the upgrade table only when some did
        F.coalesce(F.sum(F.when(sent_removed_versions(), 1).otherwise(0)), F.lit(0)).alias("removed_version_connections"),
    )
    out = r.crossJoin(c)
    start = clamp(F.least(F.col("first_ns"), F.col("first_open_ns")), since_ns, until_ns)
    end = clamp(F.greatest(F.col("last_ns"), F.col("last_close_ns")), since_ns, until_ns)
    return out.select(
        ns_to_ts(start).alias("start"),
        ns_to_ts(end).alias("end"),
        F.round((end - start) / 1e9, 3).alias("span_s"),
        start.alias("start_ns"),
        end.alias("end_ns"),
        *[F.greatest(F.coalesce(c, F.lit(0)), F.coalesce(f"conn_{c}", F.lit(0))).alias(c)
          for c in ("proxies", "proxy_processes", "brokers")],
        "client_ids", "connections", "request_connections", "connections_ended", "requests",
        "request_bytes", "response_bytes", "requests_with_errors",
        F.round(F.col("requests_with_errors") / F.greatest(F.col("requests"), F.lit(1)), 5).alias("error_rate"),
        "requests_retriable",
        F.round(F.col("requests_retriable") / F.greatest(F.col("requests"), F.lit(1)), 5).alias("retriable_rate"),
        "protocol_steps",
        "unanswered", "acks0_produces", "faults_injected", "tls_connections", "opaque_connections", "unreachable_connects",
        "removed_version_connections",
    )
