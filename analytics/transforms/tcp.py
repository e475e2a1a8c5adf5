"""TCP health (incident 5, docs/incidents.md#incident-5): negotiated options, RTT, retransmits and the 64 KiB / RTT ceiling."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics.transforms.common import first_client_id
from recording.request_terms import UNSCALED_WINDOW



def tcp_sides(conns: DataFrame, tcp: DataFrame) -> DataFrame:
    """One row per connection and proxy socket (client side, broker side).

    Options come from TCP_INFO at open (they are fixed by the handshake); RTT
    and retransmits from the worst sample (close or periodic). The bytes the
    proxy *sent* on a socket are what that socket's window limited: broker
    bytes on the client socket, client bytes on the broker socket.
    """
    base = conns.select(
        "proxy_id", "conn_id", first_client_id().alias("client_id"), "client_addr", "broker_addr", "duration_us",
        "bytes_from_client", "bytes_from_broker",
        F.explode(F.array(
            F.struct(F.lit("client").alias("side"), F.col("tcp_client_open").alias("o"), F.col("tcp_client_close").alias("c")),
            F.struct(F.lit("broker").alias("side"), F.col("tcp_broker_open").alias("o"), F.col("tcp_broker_close").alias("c")),
        )).alias("s"),
    )
    samples = tcp.groupBy("proxy_id", "conn_id", "side").agg(
        F.min_by(F.struct("wscale_ok", "timestamps_ok", "sack_ok", "snd_wscale"), "ts_ns").alias("first"),
        F.max("rtt_us").alias("s_rtt"),
        F.max("retrans_total").alias("s_retrans"),
    )
    j = base.select("*", F.col("s.side").alias("side")).join(samples, ["proxy_id", "conn_id", "side"], "left")
    rtt = F.greatest(F.col("s.o.rtt_us"), F.col("s.c.rtt_us"), F.col("s_rtt"))
    sent = F.when(F.col("side") == "client", F.col("bytes_from_broker")).otherwise(F.col("bytes_from_client"))
    out = j.select(
        "proxy_id", "conn_id", "side", "client_id", "client_addr", "broker_addr",
        F.coalesce(F.col("s.o.wscale_ok"), F.col("first.wscale_ok")).alias("wscale_ok"),
        F.coalesce(F.col("s.o.timestamps_ok"), F.col("first.timestamps_ok")).alias("timestamps_ok"),
        F.coalesce(F.col("s.o.sack_ok"), F.col("first.sack_ok")).alias("sack_ok"),
        rtt.alias("rtt_us"),
        F.greatest(F.col("s.c.retrans_total"), F.col("s_retrans"), F.col("s.o.retrans_total")).alias("retrans_total"),
        sent.alias("bytes_sent"),
        F.round(F.col("duration_us") / 1e6, 3).alias("duration_s"),
    )
    return out.where(F.col("wscale_ok").isNotNull() | F.col("rtt_us").isNotNull())


def tcp_health(sides: DataFrame) -> DataFrame:
    """Per socket side: how many connections lack each option, RTT and retransmit summary."""
    return sides.groupBy("side").agg(
        F.count(F.lit(1)).alias("connections"),
        F.sum((~F.col("wscale_ok")).cast("int")).alias("without_window_scaling"),
        F.sum((~F.col("timestamps_ok")).cast("int")).alias("without_timestamps"),
        F.sum((~F.col("sack_ok")).cast("int")).alias("without_sack"),
        F.percentile_approx("rtt_us", 0.5, 2000).alias("rtt_p50_us"),
        F.percentile_approx("rtt_us", 0.99, 2000).alias("rtt_p99_us"),
        F.max("rtt_us").alias("rtt_max_us"),
        F.sum(F.when(F.col("retrans_total") > 0, 1).otherwise(0)).alias("with_retransmits"),
        F.sum("retrans_total").alias("retransmits"),
    ).orderBy("side")


def tcp_rtt_by_peer(sides: DataFrame) -> DataFrame:
    """RTT and retransmit distribution per broker (broker side) and client host (client side)."""
    peer = F.when(F.col("side") == "broker", F.col("broker_addr")).otherwise(F.regexp_extract("client_addr", r"^(\[[^\]]*\]|[^:]*)", 1))
    return sides.withColumn("peer", peer).groupBy("side", "peer").agg(
        F.count(F.lit(1)).alias("connections"),
        F.percentile_approx("rtt_us", [0.5, 0.9, 0.99], 2000).alias("q"),
        F.max("rtt_us").alias("rtt_max_us"),
        F.percentile_approx("retrans_total", 0.99, 2000).alias("retrans_p99"),
        F.max("retrans_total").alias("retrans_max"),
    ).select("side", "peer", "connections", F.col("q")[0].alias("rtt_p50_us"), F.col("q")[1].alias("rtt_p90_us"),
             F.col("q")[2].alias("rtt_p99_us"), "rtt_max_us", "retrans_p99", "retrans_max").orderBy(F.desc("rtt_p99_us"))


def window_ceiling(sides: DataFrame, rollup: DataFrame, limit: int = 5000) -> DataFrame:
    """Every socket without window scaling: its 64 KiB / RTT ceiling next to what it moved.

    `peak_bytes_per_s` is the best single large response (>= 64 KiB) on the
    connection, from the request rollup — a transfer pinned at the ceiling is
    the signature of incident 5.
    """
    affected = sides.where(~F.col("wscale_ok"))
    peak = rollup.groupBy("proxy_id", "conn_id").agg(F.max("peak_response_bytes_per_s").alias("peak_bytes_per_s"))
    ceiling = F.when(F.col("rtt_us") > 0, UNSCALED_WINDOW / (F.col("rtt_us") / 1e6))
    avg = F.when(F.col("duration_s") > 0, F.col("bytes_sent") / F.col("duration_s"))
    out = affected.join(peak, ["proxy_id", "conn_id"], "left").select(
        "conn_id", "proxy_id", "side", "client_id", "client_addr", "broker_addr", "timestamps_ok", "sack_ok",
        F.round(F.col("rtt_us") / 1000, 2).alias("rtt_ms"),
        F.round(ceiling, 0).alias("ceiling_bytes_per_s"),
        F.round(avg, 0).alias("avg_bytes_per_s"),
        F.round(F.col("peak_bytes_per_s"), 0).alias("peak_bytes_per_s"),
        F.round(F.greatest(avg, F.coalesce(F.col("peak_bytes_per_s"), F.lit(0))) / ceiling, 3).alias("utilisation"),
        "bytes_sent", "duration_s", "retrans_total",
    )
    return out.orderBy(F.desc_nulls_last("utilisation")).limit(limit)
