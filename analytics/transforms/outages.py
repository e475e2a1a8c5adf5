"""Broker outages: stretches of time in which the proxy could not connect to a broker at all.

Why a table of its own: while a broker is down (stopped, crashed, its host gone) every client keeps
trying, and each attempt reaches the proxy, which fails to connect upstream and ends the client's
connection as `upstream_connect_failed`. Hundreds of those a minute read, to the connection tables, as
clients reconnecting constantly and as a surge of connections on the broker, while none of them reached
it. Here they are what they are: one stretch per outage, with the broker's own closes of its live
connections just before it (a restart or a crash) and the first connection that reached it again.

The proxy's `end_detail` of a failed connect begins with its kind (proxy.connection): `refused`,
`unreachable` and `timeout` say the broker could not be reached; other failures (the proxy out of file
descriptors, a redirect loop, no original destination) are the proxy's and say nothing of the broker.
No I/O here.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.transforms.common import broker_closed, ns_to_ts, with_client
from analytics.transforms.window import as_at_window_end

CONNECT_FAILED = "upstream_connect_failed"
# the kinds of connect failure that mean the broker could not be reached (proxy.connection._connect_failed's prefixes)
UNREACHABLE_KINDS = ("refused", "unreachable", "timeout")
UNREACHABLE = r"^(" + "|".join(UNREACHABLE_KINDS) + r"):"
# failures further apart than this are two outages: clients retry within seconds (kafka-python backs off up to
# 1 s, librdkafka up to 10 s by default), so a longer silence means nobody needed the broker or it was back
OUTAGE_GAP_S = 30
# a broker's closes of live connections this long before its first refused connect are it going away
CLOSED_BEFORE_S = 5
_NS = 1_000_000_000


def reached_broker() -> Column:
    """The connection got as far as the broker: every one but a failed upstream connect.

    Why it matters: a failed connect is no client reconnecting and no connection the broker held, so
    `reconnects_by_client` and `connections_over_time` count only these.
    """
    return F.coalesce(F.col("end_reason") != CONNECT_FAILED, F.lit(True))


def broker_outages(conns: DataFrame, since_ns: int | None = None, until_ns: int | None = None) -> DataFrame:
    """Per broker, each stretch of failed connects that say it was unreachable, with what came before and after.

    A stretch is the failed connects (`refused` / `unreachable` / `timeout`) to one broker, each within
    OUTAGE_GAP_S of the last one before it. Columns: its first attempt (`first_failure`) and last failed
    end (`last_failure`), `attempts`, the client hosts that tried (`clients`, a few named in `client_hosts`),
    the failure kinds and an example detail; `broker_closes_before`: connections the broker closed (FIN or
    RST) from CLOSED_BEFORE_S before the first attempt to the last, with the first of them (`first_close`)
    (a broker stopping or crashing closes its connections, then refuses new ones); `back_at`: the first
    connection opened after the stretch that reached the broker (null: not back by the recording's end).
    `down_s` runs from the first close (else attempt) to the return (else the last failure); `first_ns` and
    `last_ns` carry the stretch's bounds for `with_outage_causes`.

    Under a `since_ns`/`until_ns` window: the failures that ended inside it (`as_at_window_end`), and the
    closes and the return the window sees.
    """
    c = with_client(as_at_window_end(conns, since_ns, until_ns))
    fails = c.where(unreachable()).select(
        "broker_addr", "opened_ns", F.coalesce("closed_ns", "opened_ns").alias("failed_ns"), "client_host", "end_detail",
        F.regexp_extract("end_detail", UNREACHABLE, 1).alias("kind"))
    w = Window.partitionBy("broker_addr").orderBy("opened_ns", "failed_ns")
    latest_before = F.max("failed_ns").over(w.rowsBetween(Window.unboundedPreceding, -1))
    new = (latest_before.isNull() | (F.col("opened_ns") - latest_before > OUTAGE_GAP_S * _NS)).cast("int")
    stretch = F.sum("new").over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    spans = fails.withColumn("new", new).withColumn("stretch", stretch).groupBy("broker_addr", "stretch").agg(
        F.min("opened_ns").alias("first_ns"), F.max("failed_ns").alias("last_ns"), F.count(F.lit(1)).alias("attempts"),
        F.countDistinct("client_host").alias("clients"),
        F.slice(F.sort_array(F.collect_set("client_host")), 1, 10).alias("client_hosts"),
        F.sort_array(F.collect_set("kind")).alias("failure_kinds"),
        F.min_by("end_detail", "opened_ns").alias("example_detail"))
    s = F.broadcast(spans)  # a few rows per outage
    closes = c.where(broker_closed() & F.col("closed_ns").isNotNull()).select(
        "broker_addr", F.col("closed_ns").alias("close_ns"))
    before = closes.join(s, "broker_addr").where(
        (F.col("close_ns") >= F.col("first_ns") - CLOSED_BEFORE_S * _NS) & (F.col("close_ns") <= F.col("last_ns"))
    ).groupBy("broker_addr", "stretch").agg(F.count(F.lit(1)).alias("broker_closes_before"),
                                            F.min("close_ns").alias("first_close_ns"))
    reached = c.where(reached_broker()).select("broker_addr", F.col("opened_ns").alias("reached_ns"))
    back = reached.join(s, "broker_addr").where(F.col("reached_ns") > F.col("last_ns")).groupBy(
        "broker_addr", "stretch").agg(F.min("reached_ns").alias("back_ns"))
    out = spans.join(before, ["broker_addr", "stretch"], "left").join(back, ["broker_addr", "stretch"], "left")
    first_seen = F.least("first_ns", F.coalesce("first_close_ns", "first_ns"))  # from its closes, if it made any
    return out.select(
        "broker_addr", ns_to_ts("first_ns").alias("first_failure"), ns_to_ts("last_ns").alias("last_failure"),
        ns_to_ts("back_ns").alias("back_at"),
        F.round((F.coalesce("back_ns", "last_ns") - first_seen) / 1e9, 3).alias("down_s"), "attempts", "clients",
        F.coalesce("broker_closes_before", F.lit(0)).alias("broker_closes_before"),
        ns_to_ts("first_close_ns").alias("first_close"), "failure_kinds", "example_detail", "client_hosts",
        "first_ns", "last_ns",
    ).orderBy("first_ns", "broker_addr")


# the table's columns (Spark DDL): a recording where no connect failed gets the empty table without a query
# (tests/analytics/test_outages.py keeps it equal to the plan's, but for the arrays' element nullability)
OUTAGE_COLUMNS = (
    "broker_addr string, first_failure timestamp, last_failure timestamp, back_at timestamp, down_s double, "
    "attempts bigint, clients bigint, broker_closes_before bigint, first_close timestamp, failure_kinds array<string>, "
    "example_detail string, client_hosts array<string>, first_ns bigint, last_ns bigint")


def outage_cause(kinds: Column, first_ns: Column, last_ns: Column) -> Column:
    """`broker went away: it refused new connections from 13:55:10 to 13:55:32 UTC` (the verb by the kinds seen)."""
    verb = F.when(F.array_join(kinds, ",") == "refused", F.lit("it refused new connections")).otherwise(
        F.concat(F.lit("new connections to it failed ("), F.array_join(kinds, ", "), F.lit(")")))
    when = F.concat(F.lit(" from "), F.date_format(ns_to_ts(first_ns), "yyyy-MM-dd HH:mm:ss"), F.lit(" to "),
                    F.date_format(ns_to_ts(last_ns), "HH:mm:ss 'UTC'"))
    return F.concat(F.lit("broker went away: "), verb, when)


def unreachable() -> Column:
    """A connect the broker never answered (`refused` / `unreachable` / `timeout`): what an outage is made of."""
    return (F.col("end_reason") == CONNECT_FAILED) & F.coalesce(F.col("end_detail").rlike(UNREACHABLE), F.lit(False))


def with_outage_causes(conns: DataFrame, outages: DataFrame | None = None) -> DataFrame:
    """The connections, those the broker closed as it went away with that as their `inferred_cause`.

    `outages` is `broker_outages` of these connections (the job computes it once and pins it); None when
    the connections hold no unreachable connect, and then nothing changes. A close lines up with an
    outage as `broker_outages` counts it (from CLOSED_BEFORE_S before the first refused connect to the
    last). The proxy cannot know at the close that the broker is going away, so the cause it recorded is
    empty; one it did record is kept. Outages are a few rows: broadcast, and a close lines up with one at
    most (outages are more than OUTAGE_GAP_S apart).
    """
    if outages is None:
        return conns
    spans = F.broadcast(outages.select(
        F.col("broker_addr").alias("_broker"), F.col("first_ns").alias("_first"), F.col("last_ns").alias("_last"),
        outage_cause(F.col("failure_kinds"), F.col("first_ns"), F.col("last_ns")).alias("_cause")))
    lines_up = ((F.col("broker_addr") == F.col("_broker")) & broker_closed()
                & (F.col("closed_ns") >= F.col("_first") - CLOSED_BEFORE_S * _NS) & (F.col("closed_ns") <= F.col("_last")))
    return conns.join(spans, lines_up, "left").withColumn(
        "inferred_cause", F.coalesce("inferred_cause", "_cause")).drop("_broker", "_first", "_last", "_cause")
