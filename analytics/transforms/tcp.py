"""TCP health (incident 5, docs/incidents.md#incident-5): negotiated options, RTT, retransmits and the 64 KiB / RTT ceiling."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.transforms.common import first_client_id
from analytics.transforms.window import as_at_window_end, opened_inside, state_after, taken_inside
from recording.request_terms import UNSCALED_WINDOW

# Two TCP_INFO samples closer than this say nothing about a rate: acknowledgements arrive in bursts, so a window's worth
# acknowledged within a millisecond read as many times the 64 KiB / RTT a socket can carry. Periodic samples are 10 s apart.
MIN_SAMPLE_GAP_S = 1.0
# A rate above the ceiling by more than this is no measurement of the capped socket (the RTT under load was not the one
# sampled, or the rate is another leg's): its utilisation is left empty and the row flagged, never read as "at the cap".
CEILING_SLACK = 0.1


def tcp_sides(conns: DataFrame, tcp: DataFrame, since_ns: int | None = None, until_ns: int | None = None) -> DataFrame:
    """One row per connection and proxy socket (client side, broker side).

    Options come from TCP_INFO at open (they are fixed by the handshake); RTT
    and retransmits from the worst sample (close or periodic). The bytes the
    proxy *sent* on a socket are what that socket's window limited: broker
    bytes on the client socket, client bytes on the broker socket.

    Under a `since_ns`/`until_ns` window (--since/--until) the samples are those taken inside it, read as
    a recording of its own (`transforms.window`): the open's sample counts only for a connection opened
    inside it and the close's only for one that ended inside it (`as_at_window_end`), so an RTT or
    retransmits of days before or after an hour's window are not that hour's. `retrans_total` is the
    counter's rise inside the window (from the first sample inside it for a connection already open at its
    start; the kernel's counter covers the socket's whole life). `bytes_sent` and `duration_s` are the
    connection's own when its whole recorded life lies inside the window; for one across an edge, the bytes
    its socket's samples inside the window saw acknowledged (`bytes_acked`'s rise) over its time inside it.
    Options hold for the whole life, so they are every seen connection's.
    """
    tcp = tcp.where(taken_inside("ts_ns", since_ns, until_ns))
    whole_life_inside = opened_inside(since_ns) & ~state_after(until_ns)  # before as_at_window_end rewrites the end
    conns = as_at_window_end(conns.withColumn("_whole", whole_life_inside), since_ns, until_ns)
    base = conns.select(
        "proxy_id", "conn_id", first_client_id().alias("client_id"), "client_addr", "broker_addr", "duration_us",
        "bytes_from_client", "bytes_from_broker", "_whole", opened_inside(since_ns).alias("_opened_in"),
        (F.col("duration_us") - _us_before(since_ns)).alias("_inside_us"),
        F.explode(F.array(
            F.struct(F.lit("client").alias("side"), F.col("tcp_client_open").alias("o"), F.col("tcp_client_close").alias("c")),
            F.struct(F.lit("broker").alias("side"), F.col("tcp_broker_open").alias("o"), F.col("tcp_broker_close").alias("c")),
        )).alias("s"),
    )
    samples = tcp.withColumn("_rate", sampled_rate()).groupBy("proxy_id", "conn_id", "side").agg(
        F.min_by(F.struct("wscale_ok", "timestamps_ok", "sack_ok", "snd_wscale", "retrans_total", "bytes_acked"), "ts_ns").alias("first"),
        F.max("rtt_us").alias("s_rtt"),
        F.max("retrans_total").alias("s_retrans"),
        F.max("bytes_acked").alias("s_acked"),
        F.max("_rate").alias("sampled_peak_bytes_per_s"),
    )
    j = base.select("*", F.col("s.side").alias("side")).join(samples, ["proxy_id", "conn_id", "side"], "left")
    at_open = F.col("_opened_in")  # the open's sample is inside the window (always, without since_ns)
    rtt = F.greatest(F.when(at_open, F.col("s.o.rtt_us")), F.col("s.c.rtt_us"), F.col("s_rtt"))
    retrans = F.greatest(F.col("s.c.retrans_total"), F.col("s_retrans"), F.when(at_open, F.col("s.o.retrans_total")))
    sent = F.when(F.col("side") == "client", F.col("bytes_from_broker")).otherwise(F.col("bytes_from_client"))
    duration_us = F.col("duration_us")
    if since_ns is not None or until_ns is not None:
        # the counters at the window's start: the first sample inside it (or the close, when it is the only one)
        start = F.when(~at_open, F.coalesce(F.col("first.retrans_total"), F.col("s.c.retrans_total"))).otherwise(0)
        retrans = retrans - start
        acked = F.greatest(F.col("s.c.bytes_acked"), F.col("s_acked"))
        acked_start = F.when(~at_open, F.coalesce(F.col("first.bytes_acked"), F.col("s.c.bytes_acked"))).otherwise(0)
        sent = F.when(F.col("_whole"), sent).otherwise(acked - acked_start)
        duration_us = F.when(F.col("_whole"), duration_us).otherwise(F.col("_inside_us"))
    out = j.select(
        "proxy_id", "conn_id", "side", "client_id", "client_addr", "broker_addr",
        F.coalesce(F.col("s.o.wscale_ok"), F.col("first.wscale_ok")).alias("wscale_ok"),
        F.coalesce(F.col("s.o.timestamps_ok"), F.col("first.timestamps_ok")).alias("timestamps_ok"),
        F.coalesce(F.col("s.o.sack_ok"), F.col("first.sack_ok")).alias("sack_ok"),
        rtt.alias("rtt_us"),
        retrans.alias("retrans_total"),
        sent.alias("bytes_sent"),
        F.round(duration_us / 1e6, 3).alias("duration_s"),
        "sampled_peak_bytes_per_s",
    )
    return out.where(F.col("wscale_ok").isNotNull() | F.col("rtt_us").isNotNull())


def sampled_rate() -> Column:
    """Per TCP_INFO sample: bytes per second the socket moved since its previous sample (the busier direction).

    Why the samples: they are the socket's own counters (`bytes_acked`: what the peer acknowledged of the proxy's
    sends; `bytes_received`: what the peer sent), so the rate is that socket's, whichever leg of the relay was slower.
    Both directions: without window scaling neither end can offer more than 64 KiB, so a producer's requests are
    capped on the client socket as a consumer's responses are. Null for the first sample and for one less than
    MIN_SAMPLE_GAP_S after the previous.
    """
    w = Window.partitionBy("proxy_id", "conn_id", "side").orderBy("ts_ns")
    gap_s = (F.col("ts_ns") - F.lag("ts_ns").over(w)) / 1e9
    moved = F.greatest(F.col("bytes_acked") - F.lag("bytes_acked").over(w),
                       F.col("bytes_received") - F.lag("bytes_received").over(w))
    return F.when(gap_s >= MIN_SAMPLE_GAP_S, moved / gap_s)


def _us_before(since_ns: int | None) -> Column:
    """µs of a connection's life before the window's start (0 for one opened inside it)."""
    if since_ns is None:
        return F.lit(0)
    return F.greatest(F.lit(0), F.floor((F.lit(since_ns) - F.col("opened_ns")) / 1000)).cast("long")


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

    `peak_bytes_per_s` is the best rate the socket's own TCP_INFO samples show (`sampled_rate`); on the broker
    side also the best single large response (>= 64 KiB) the proxy read from the broker, from the request
    rollup. Not on the client side: that rate is the broker socket's leg (how fast the proxy *read* the
    response), and a client socket capped at 1.4 MB/s read 1.3 GiB/s there, "running at the cap". A transfer
    pinned at the ceiling is the signature of incident 5.

    `utilisation` is the better of average and peak over the ceiling, at most 1; a rate more than CEILING_SLACK
    above the ceiling is not credible for a capped socket, so its utilisation is null and `above_ceiling` says so.
    """
    affected = sides.where(~F.col("wscale_ok"))
    read = rollup.groupBy("proxy_id", "conn_id").agg(F.max("peak_response_bytes_per_s").alias("_read_peak"))
    ceiling = F.when(F.col("rtt_us") > 0, UNSCALED_WINDOW / (F.col("rtt_us") / 1e6))
    avg = F.when(F.col("duration_s") > 0, F.col("bytes_sent") / F.col("duration_s"))
    read_here = F.when(F.col("side") == "broker", F.col("_read_peak"))  # the response's read is the broker socket's
    peak = F.greatest("sampled_peak_bytes_per_s", read_here)
    ratio = F.greatest(avg, F.coalesce(peak, F.lit(0))) / ceiling
    above = ratio > 1 + CEILING_SLACK
    out = affected.join(read, ["proxy_id", "conn_id"], "left").select(
        "conn_id", "proxy_id", "side", "client_id", "client_addr", "broker_addr", "timestamps_ok", "sack_ok",
        F.round(F.col("rtt_us") / 1000, 2).alias("rtt_ms"),
        F.round(ceiling, 0).alias("ceiling_bytes_per_s"),
        F.round(avg, 0).alias("avg_bytes_per_s"),
        F.round(peak, 0).alias("peak_bytes_per_s"),
        F.when(~above, F.round(F.least(ratio, F.lit(1.0)), 3)).alias("utilisation"),
        F.coalesce(above, F.lit(False)).alias("above_ceiling"),
        "bytes_sent", "duration_s", "retrans_total",
    )
    return out.orderBy(F.desc_nulls_last("utilisation")).limit(limit)
