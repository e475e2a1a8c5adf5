"""Connections (incidents 1, 2, 4 of docs/incidents.md): opens/ends, concurrency with latency, lifetimes, ends, resets, reconnects."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from protocol.api_keys import KIP_896_REFUSAL
from analytics.transforms.common import broker_closed, ns_to_ts, time_bucket_index, with_client
from analytics.transforms.cube import view
from analytics.transforms.outages import reached_broker
from analytics.transforms.overview import opaque, sent_removed_versions
# proxy runs (their start rows, and the ends a run over never recorded): settled by the loader, read here
from analytics.transforms.runs import END_NOT_RECORDED, RUN_LAST, RUN_OF_CONN_ID, RUN_STARTED, proxy_run  # noqa: F401
from analytics.transforms.stretches import RunSpan, recorded_time  # a client's rate over the time runs recorded
# --since/--until: the one notion of the window (read as a recording of its own), shared with the loader and the overview
from analytics.transforms.window import as_at_window_end, ended_inside, opened_inside, seen_in_window

RESET_REASONS = ("client_rst", "broker_rst")
# ends the proxy's own run made or lost (a stop, a restart, a crash): no client reconnects after them
PROXY_RUN_ENDS = ("proxy_shutdown", END_NOT_RECORDED)


def connections_over_time(conns: DataFrame, traffic: DataFrame, bucket_s: int, views: DataFrame,
                          since_ns: int | None = None, until_ns: int | None = None) -> DataFrame:
    """Per broker and bucket: opens, ends, concurrency, request rate and latency.

    Concurrency is a running sum of opens minus ends over a dense bucket grid,
    so quiet buckets still carry the open connections; latency (long polls out)
    and bytes per request sit on the same row, which is what shows queueing:
    latency climbing with concurrency while bytes per request stay flat.
    `traffic` is `rollups.traffic_over_time` with the same bucket (summed over
    clients here); latency comes from the cube's broker x time view (`views`:
    cube or percentile views).

    With a `since_ns`/`until_ns` window (--since/--until) the grid covers only the
    buckets inside it. A connection opened before the window and still open at its
    start is concurrent from the window's first bucket on, but not one of its
    `opens`; one closed after the window is still open at its last bucket, not one
    of its `ends`. Without that, one connection opened a week before a one-hour
    window drew a week of buckets.

    `recording_starts` counts the proxy runs (`proxy_run`) whose recording began
    in the bucket and that opened connections to this broker in it. A run sees
    only what opens after it starts, so the connections a second proxy, a
    restarted proxy or a restarted worker takes over arrive as opens in its
    first bucket, however long the clients have been connected (a restart's
    bucket also still counts the previous run's connections, which end in it).
    The `connection_surge` rule does not compare concurrency across such a
    bucket. A run begins at its start row (`runs/`, RUN_STARTED on the loaded
    connections), else at its first connection: a worker idle since the proxy
    started is no start where it first records. It is one more column of the
    opens' aggregation (with each run's first bucket, a few rows, broadcast to
    it), not a pass of its own.

    `runs_recording` counts the runs with a start row known to be recording in
    the bucket (from the start to the clean stop or last sign of life, RUN_LAST):
    a bucket without requests or ends inside a run is quiet, not a gap in the
    recording (a run that died has its open connections ended by the loader).

    Only connections that reached the broker count (`outages.reached_broker`): while a broker is down its
    clients' attempts end as failed connects at the proxy, hundreds a minute, and counted as opens and
    concurrency they made an outage a surge on the broker that was not there (`broker_outages` has them).
    """
    traffic = traffic.groupBy("broker_addr", "b").agg(
        *[F.sum(c).alias(c) for c in ("requests", "request_bytes", "sized_requests")])
    first_b = None if since_ns is None else since_ns // (bucket_s * 1_000_000_000)
    last_b = None if until_ns is None else until_ns // (bucket_s * 1_000_000_000)
    open_b, close_b = time_bucket_index("opened_ns", bucket_s), time_bucket_index("closed_ns", bucket_s)
    closed = F.col("closed_ns").isNotNull()
    conns = seen_in_window(conns, since_ns, until_ns).where(reached_broker())  # a failed connect: no connection the broker held
    ends_inside = ended_inside(until_ns)
    c = conns.select(
        "broker_addr",
        # the bucket from which it counts as open: its own, or the window's first for one opened before it
        (open_b if first_b is None else F.greatest(open_b, F.lit(first_b))).alias("open_b"),
        open_b.alias("seen_b"),  # its own open bucket, also before the window: where its proxy run is first seen
        opened_inside(since_ns).alias("opened_inside"),
        F.when(ends_inside, close_b).alias("close_b"),
        # the last bucket it is known to be open in: its close, the window's last (closed after it), or its open
        F.when(ends_inside, close_b).when(closed, F.lit(last_b)).alias("last_b"),
        proxy_run().alias("run"),
        *[time_bucket_index(F.col(col) if col in conns.columns else F.lit(None), bucket_s).alias(alias)
          for col, alias in ((RUN_STARTED, "marked_b"), (RUN_LAST, "lived_b"))],
    )
    runs = c.groupBy("run").agg(F.coalesce(F.min("marked_b"), F.min("seen_b")).alias("run_start_b"),
                                F.min("marked_b").alias("marked_b"), F.max("lived_b").alias("lived_b"))
    run_start = runs.select("run", "run_start_b")
    opens = c.join(F.broadcast(run_start), "run").groupBy("broker_addr", F.col("open_b").alias("b")).agg(
        F.count(F.lit(1)).alias("starts"), F.count(F.when(F.col("opened_inside"), 1)).alias("opens"),
        F.countDistinct(F.when(F.col("opened_inside") & (F.col("seen_b") == F.col("run_start_b")), F.col("run")))
        .alias("recording_starts"))
    ends = c.where(F.col("close_b").isNotNull()).groupBy("broker_addr", F.col("close_b").alias("b")).agg(F.count(F.lit(1)).alias("ends"))
    q = view(views, "broker_time").select(
        F.col("k1").alias("broker_addr"), (F.col("k2").try_cast("long") / bucket_s).cast("long").alias("b"),
        F.array("p50_us", "p99_us").alias("q"))
    lat = traffic.select("broker_addr", "b", "requests",
                   F.round(F.col("request_bytes") / F.col("sized_requests"), 1).alias("bytes_per_request")
                   ).join(q, ["broker_addr", "b"], "left")
    bounds = c.select("broker_addr", "open_b", F.coalesce("last_b", "open_b").alias("close_b")).unionByName(
        traffic.select("broker_addr", F.col("b").alias("open_b"), F.col("b").alias("close_b"))
    ).groupBy("broker_addr").agg(F.min("open_b").alias("lo"), F.max("close_b").alias("hi"))
    grid = bounds.select("broker_addr", F.explode(F.sequence("lo", "hi")).alias("b"))
    lives = F.broadcast(runs.where(F.col("marked_b").isNotNull()).select("run", "marked_b", "lived_b"))
    recording = grid.join(lives, (grid.b >= lives.marked_b) & (grid.b <= lives.lived_b)).groupBy("broker_addr", "b").agg(
        F.countDistinct("run").alias("runs_recording"))
    g = grid.join(opens, ["broker_addr", "b"], "left").join(ends, ["broker_addr", "b"], "left").join(lat, ["broker_addr", "b"], "left")
    g = g.join(recording, ["broker_addr", "b"], "left").fillna(0, ["starts", "opens", "recording_starts", "ends", "requests",
                                                                   "runs_recording"])
    # the most connections open at once inside a bucket: a sweep of the opens (+1) and ends (-1) in time order, ends
    # first at one instant. `concurrent` counts every connection open at any moment of the bucket, so a burst of
    # connections that each lived milliseconds (a producer per send, a health check) raised it by all of them.
    t_open = F.col("opened_ns") if since_ns is None else F.greatest(F.col("opened_ns"), F.lit(since_ns))
    sweep = conns.select("broker_addr", t_open.alias("t"), F.lit(1).alias("d")).unionByName(
        conns.where(ends_inside).select("broker_addr", F.col("closed_ns").alias("t"), F.lit(-1).alias("d")))
    ws = Window.partitionBy("broker_addr").orderBy("t", "d").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    peaks = sweep.withColumn("level", F.sum("d").over(ws)).groupBy(
        "broker_addr", time_bucket_index("t", bucket_s).alias("b")).agg(F.max("level").alias("event_peak"))
    g = g.join(peaks, ["broker_addr", "b"], "left")
    w = Window.partitionBy("broker_addr").orderBy("b").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    # a connection that ends in bucket b was still open during part of b: subtract ends of earlier buckets
    at_start = F.sum("starts").over(w) - F.col("starts") - F.sum("ends").over(w) + F.col("ends")
    return g.select(
        "broker_addr",
        F.timestamp_seconds(F.col("b") * bucket_s).alias("bucket"),
        "opens", "recording_starts", "runs_recording", "ends",
        (at_start + F.col("starts")).alias("concurrent"),
        F.greatest(at_start, F.coalesce(F.col("event_peak"), at_start)).alias("peak_concurrent"),
        "requests",
        F.round(F.col("requests") / bucket_s, 2).alias("requests_per_s"),
        F.col("q")[0].alias("p50_us"),
        F.col("q")[1].alias("p99_us"),
        "bytes_per_request",
    ).orderBy("broker_addr", "bucket")


LIFETIME_BINS = [(0, 1, "< 1 s"), (1, 10, "1–10 s"), (10, 60, "10–60 s"), (60, 600, "1–10 min"),
                 (600, 3600, "10–60 min"), (3600, 86400, "1–24 h"), (86400, None, "> 1 day")]


def connection_lifetimes(conns: DataFrame, since_ns: int | None = None, until_ns: int | None = None) -> DataFrame:
    """How long connections live, binned; churn shows up as a fat left side.

    A connection still open (at the recording's end: its last snapshot) is binned by its age so far and
    counted in `still_open`. Under a `since_ns`/`until_ns` window the connections are those the window
    sees, as at its end (`as_at_window_end`): one that ended inside it by its lifetime, from its open
    however long before the window (a lifetime is known at the end); one still open at the window's end
    by its age then, in `still_open`, however long it lived on; one that ended before it not at all. Only
    connections that reached the broker count (`outages.reached_broker`), as in the concurrency and reconnects.
    """
    conns = as_at_window_end(conns, since_ns, until_ns)
    secs = F.col("duration_us") / 1e6
    label = None
    order = None
    for i, (lo, hi, name) in enumerate(LIFETIME_BINS):
        cond = (secs >= lo) & (secs < hi) if hi is not None else secs >= lo
        label = F.when(cond, F.lit(name)) if label is None else label.when(cond, F.lit(name))
        order = F.when(cond, F.lit(i)) if order is None else order.when(cond, F.lit(i))
    # a failed upstream connect never was a connection to the broker: hundreds of millisecond "lifetimes" while it is
    # down read as churn (`broker_outages` has them)
    c = conns.where(F.col("duration_us").isNotNull() & reached_broker()).select(label.alias("lifetime"), order.alias("bin"),
                                                                               "end_reason")
    return c.groupBy("bin", "lifetime").agg(
        F.count(F.lit(1)).alias("connections"),
        F.sum(F.when(F.col("end_reason").isin(*RESET_REASONS), 1).otherwise(0)).alias("reset"),
        F.sum(F.when(F.col("end_reason") == "open", 1).otherwise(0)).alias("still_open"),
    ).orderBy("bin")


def connection_ends(conns: DataFrame, since_ns: int | None = None, until_ns: int | None = None) -> DataFrame:
    """Ends by how (end_reason), who (end_by) and why (inferred_cause), with idle time and an example.

    Connections without an end yet are the row `open` by `none`. Under a `since_ns`/`until_ns` window:
    the connections that ended inside it, by their end, and those still open at its end (`as_at_window_end`:
    also the ones that ended after it) as `open`, their lifetime their age then; an end before the
    window is not its business. Without that, a one-hour window of a week counted ends days after it.
    """
    c = with_client(as_at_window_end(conns, since_ns, until_ns))
    return c.groupBy("end_reason", "end_by", F.coalesce("inferred_cause", F.lit("")).alias("inferred_cause")).agg(
        F.count(F.lit(1)).alias("connections"),
        F.countDistinct("client_id").alias("clients"),
        F.percentile_approx("idle_before_end_ms", 0.5, 2000).alias("median_idle_ms"),
        F.max("idle_before_end_ms").alias("max_idle_ms"),
        F.round(F.percentile_approx("duration_us", 0.5, 2000) / 1e6, 3).alias("median_lifetime_s"),
        F.min_by("conn_id", "closed_ns").alias("example_conn_id"),
        ns_to_ts(F.min("closed_ns")).alias("example_closed_at"),
    ).orderBy(F.desc("connections"))


def resets(conns: DataFrame, limit: int = 5000, since_ns: int | None = None, until_ns: int | None = None) -> DataFrame:
    """Every connection ended by a reset, with who sent it and how long it had been idle.

    Under a `since_ns`/`until_ns` window: the resets inside it (`as_at_window_end`: a connection reset after
    the window was open at its end, one reset before it is not among those it sees). Why: the list is when
    and after what idle time connections were cut, and `idle_resets_not_from_broker` counts its rows; a
    one-hour window of a week otherwise counted resets from days after the hour.
    """
    c = with_client(as_at_window_end(conns, since_ns, until_ns)).where(F.col("end_reason").isin(*RESET_REASONS))
    return c.select(
        "conn_id", "proxy_id", "client_id", "client_addr", "broker_addr", "end_reason", "end_by",
        "idle_before_end_ms", F.round(F.col("duration_us") / 1e6, 3).alias("lifetime_s"),
        ns_to_ts("closed_ns").alias("closed_at"), "closed_ns", "requests", "end_detail",
    ).orderBy("closed_ns").limit(limit)


STARTUP_S = 5  # a client's first moments: the connections it opens to get going, never reconnects


def last_active(rollup: DataFrame | None) -> tuple[DataFrame | None, Column]:
    """Per connection, when it last carried anything: its last byte (end less idle time) or its last request.

    Why both: a connection the proxy still held at the end (or ended only by its own shutdown) says its last byte
    in `idle_before_end_ms`; one still open at the recording's end says nothing, and the request rollup's last
    request (`last_ns`) is all there is. Returns the per-connection last requests to join (None without a rollup)
    and the column that reads both after the join.
    """
    byte = F.when(F.col("closed_ns").isNotNull() & F.col("idle_before_end_ms").isNotNull(),
                  F.col("closed_ns") - F.col("idle_before_end_ms") * 1_000_000)
    if rollup is None:
        return None, byte
    last = rollup.groupBy("proxy_id", "conn_id").agg(F.max("last_ns").alias("_last_request_ns"))
    return last, F.greatest(byte, F.col("_last_request_ns"))


def left_half_open(since_ns: int | None) -> Column:
    """This connection replaced the client's previous one to the broker, which is still open but went quiet first.

    Why: a firewall with connection tracking on the client's side drops an idle connection's state silently, so the
    client's next request goes nowhere, it gives up and connects anew, and neither its FIN nor its RST reaches the
    proxy: the old connection never ends (until the proxy stops), and no reconnect followed an ended one. A healthy
    client that holds two connections to one broker (a consumer's fetch and group-coordinator ones, an admin
    client) keeps using the older one, so it is not quiet when the newer opens. Only the previous connection by
    open time is compared (a window function, no self-join of a client's connections): in a storm of half-open
    replacements each one's previous is the last one left. Reads `_last_active` (`last_active`).
    """
    w = Window.partitionBy("client_id", "client_host", "broker_addr").orderBy("opened_ns", "conn_id")
    prev_closed, prev_quiet = F.lag("closed_ns").over(w), F.lag("_last_active").over(w)
    still_open = prev_closed.isNull() | (prev_closed > F.col("opened_ns"))
    has_prev = F.lag("opened_ns").over(w).isNotNull()
    return has_prev & still_open & (prev_quiet < F.col("opened_ns")) & opened_inside(since_ns)


def reconnects_by_client(conns: DataFrame, bucket_s: int = 60, since_ns: int | None = None,
                         until_ns: int | None = None, spans: Sequence[RunSpan] | None = None,
                         rollup: DataFrame | None = None) -> DataFrame:
    """Per client (client_id + host): connections opened, reconnects and their rate, resets and the worst minute.

    A reconnect is a connection the client opened to a broker after one of its earlier connections to
    that broker had ended, more than STARTUP_S after its first connection in the recording. Why not
    every connection after the first: a client starting up opens several within a second or two (a
    bootstrap connection, one per broker it needs, one to its group or transaction coordinator), none
    of them replacing a lost one, and (connections - 1) over the few seconds it has been seen (a
    minute at least) read as a storm of reconnects. Those open side by side, so none follows an ended
    connection to its broker, except where a client closes its bootstrap connection and opens the
    same broker's own right after (kafka-python does): STARTUP_S covers that. A storm is the other
    shape: one connection to a broker after another, each ending (reset after idle, closed by the
    broker, a producer made per send) before the next opens. The rate is reconnects per minute of
    the client's span in the recording, less the time no proxy run was recording (`stretches.recorded_time`:
    a directory reused across sessions hours apart made a storm of 21 s a rate per minute of hours).

    An end the proxy made itself (`proxy_shutdown`: a proxy or worker stopping, as for a restart; or
    `end_not_recorded`: one killed, whose restart the clients followed) is not one a reconnect follows: when a restarted proxy records again, every client opens anew each
    connection the last run closed, one per broker and coordinator, four or more for a client of a
    three-broker cluster, and that is the recording's doing, not the client's.

    A failed upstream connect (`upstream_connect_failed`) is left out altogether: while a broker is down
    every client retries every second or so, each attempt a connection of a millisecond that never reached
    the broker, and counted here an outage read as a storm of reconnects (`broker_outages` and the
    `broker_unreachable` finding tell it). `closed_by_broker` counts the broker's FINs and RSTs as
    `broker_closes` lists them (`common.broker_closed`).

    Under a `since_ns`/`until_ns` window every column counts what happened inside it, the window read as
    a recording of its own (`as_at_window_end`): `connections`, `reconnects` and `max_opens_per_interval`
    count the connections opened inside it; `resets`, `closed_by_broker` and the idle time the ends
    inside it (one that ended after the window was open at its end); the rate is per minute of the
    client's time inside the window; the median lifetime is `connection_lifetimes`' (as at its end). As
    in a recording that began at the window's start, the end a reconnect follows must be inside the
    window too (an end before it is not among the connections the window sees: at most one reconnect
    per client and broker goes uncounted, at the window's start), and STARTUP_S counts from the
    client's first connection the window sees. Without the window, one connection open all week made
    a storm inside a one-hour window a rate per minute of the week, and the reconnect_storm finding missed it.
    `spans`: the proxy runs' spans (`stretches.collect_spans` of these connections) when the caller has them.

    A reconnect is also a connection opened (past STARTUP_S) while the client's previous one to that broker was
    still open but had gone quiet before it (`left_half_open`; quiet by its last byte or, with `rollup`, its last
    request): with a conntrack firewall on the client's side the proxy's old connections never end, and by ended
    connections alone a client that opened ten to one broker had no reconnect. `half_open_reconnects` counts
    those; the `reconnect_storm` finding says the old connections were left half-open.
    """
    c = with_client(as_at_window_end(conns, since_ns, until_ns)).where(reached_broker())  # failed connects: docstring
    last_requests, active = last_active(rollup)
    if last_requests is not None:
        c = c.join(last_requests, ["proxy_id", "conn_id"], "left")
    c = c.withColumn("_last_active", active)
    first_open = F.min("opened_ns").over(Window.partitionBy("client_id", "client_host"))
    ended = F.when(~F.col("end_reason").isin(*PROXY_RUN_ENDS), F.col("closed_ns"))  # not the proxy stopping (docstring)
    first_end_to_broker = F.min(ended).over(Window.partitionBy("client_id", "client_host", "broker_addr"))
    # the earliest end to the broker is before this open: some earlier connection had ended (its own end is later)
    # (under a window it follows an end the window sees, so it opened inside the window: no condition of its own)
    past_startup = F.col("opened_ns") > first_open + STARTUP_S * 1_000_000_000
    half_open = F.coalesce(left_half_open(since_ns) & past_startup, F.lit(False))
    reconnect = ((F.col("opened_ns") > first_end_to_broker) & past_startup) | half_open

    def opens() -> Column:
        """Connections opened (inside the window): a filter inside the aggregations, no pass of its own."""
        return F.count(F.lit(1)) if since_ns is None else F.count(F.when(opened_inside(since_ns), 1))

    per_min = c.groupBy("client_id", "client_host", time_bucket_index("opened_ns", bucket_s).alias("m")).agg(
        opens().alias("n")
    ).groupBy("client_id", "client_host").agg(F.max("n").alias("max_opens_per_interval"))
    agg = c.withColumn("reconnect", F.coalesce(reconnect, F.lit(False))).withColumn("half_open", half_open).groupBy(
        "client_id", "client_host").agg(
        opens().alias("connections"),
        F.sum(F.col("reconnect").cast("int")).alias("reconnects"),
        F.sum(F.col("half_open").cast("int")).alias("half_open_reconnects"),
        F.min("opened_ns").alias("first_ns"),
        F.max(F.coalesce("closed_ns", "snapshot_ns", "opened_ns")).alias("last_ns"),
        F.sum(F.when(F.col("end_reason").isin(*RESET_REASONS), 1).otherwise(0)).alias("resets"),
        F.sum(F.when(F.col("end_reason").isin(*RESET_REASONS) & (F.col("end_by") != "broker"), 1).otherwise(0)).alias("resets_not_by_broker"),
        F.sum(broker_closed().cast("int")).alias("closed_by_broker"),
        F.percentile_approx("idle_before_end_ms", 0.5, 2000).alias("median_idle_before_end_ms"),
        F.round(F.percentile_approx("duration_us", 0.5, 2000) / 1e6, 3).alias("median_lifetime_s"),
        F.array_sort(F.collect_set("broker_addr")).alias("brokers"),
    )
    # the part of the client's span (inside the window) some proxy run recorded: not the hours between two runs
    agg = recorded_time(agg, ["client_id", "client_host"], conns, since_ns, until_ns, spans)
    # at least a minute: a client seen for seconds is not said to reconnect hundreds of times a minute (README)
    minutes = F.greatest(F.col("recorded_ns") / 6e10, F.lit(1.0))
    return agg.join(per_min, ["client_id", "client_host"]).select(
        "client_id", "client_host", "connections", "reconnects", "half_open_reconnects",
        F.round(F.col("reconnects") / minutes, 3).alias("reconnects_per_min"),
        "max_opens_per_interval", "resets", "resets_not_by_broker", "closed_by_broker",
        "median_idle_before_end_ms", "median_lifetime_s", "brokers",
    ).orderBy(F.desc("reconnects_per_min"), F.desc("connections"), "client_id", "client_host")  # ties: one order every run


def broker_closes(conns: DataFrame, limit: int = 5000, since_ns: int | None = None, until_ns: int | None = None) -> DataFrame:
    """Connections the broker ended, with the last request before the end (incident 1's evidence).

    Under a `since_ns`/`until_ns` window: the broker's closes inside it (`as_at_window_end`), as
    `connection_ends` counts them; a close after the window is no evidence about it (and
    `broker_closed_after_acks0_produce` reads these rows).
    """
    c = with_client(as_at_window_end(conns, since_ns, until_ns)).where(broker_closed())
    return c.select(
        "conn_id", "proxy_id", "client_id", "client_addr", "broker_addr", "end_reason", "end_by", "last_api",
        "last_request_bytes", "last_request_acks", "last_request_topics", "unanswered", "inferred_cause",
        "idle_before_end_ms", ns_to_ts("closed_ns").alias("closed_at"), "closed_ns",
    ).orderBy("closed_ns").limit(limit)


def unanswered_at_close(conns: DataFrame, rollup: DataFrame, limit: int = 5000, since_ns: int | None = None,
                        until_ns: int | None = None) -> DataFrame:
    """Connections that ended with requests in flight (or right after an acks=0 Produce).

    A connection still open is listed by its last snapshot's requests in flight. Under a `since_ns`/`until_ns`
    window: the connections that ended inside it so, and those open at its end whose last snapshot is inside it
    (`as_at_window_end`: an end after the window, or a snapshot after it, tells nothing of what was in flight
    at its end). `unanswered_apis` are the window's own unanswered requests (the rollup is of its requests).
    """
    c = with_client(as_at_window_end(conns, since_ns, until_ns)).where(
        (F.col("unanswered") > 0) | ((F.col("last_request_acks") == 0) & (F.col("end_by") == "broker")))
    pending = rollup.where(F.col("status") == "unanswered").groupBy("proxy_id", "conn_id").agg(
        F.sum("requests").alias("unanswered_rows"), F.array_sort(F.collect_set("api_name")).alias("unanswered_apis")
    )
    return c.join(pending, ["proxy_id", "conn_id"], "left").select(
        "conn_id", "client_id", "broker_addr", "end_reason", "end_by", "unanswered", "unanswered_apis", "last_api",
        "last_request_bytes", "last_request_acks", "last_request_topics", "inferred_cause", ns_to_ts("closed_ns").alias("closed_at"),
    ).orderBy(F.desc("unanswered"), "closed_at", "conn_id").limit(limit)  # a total order: ties kept their plan's order


# the proxy's reason for a stream it stopped parsing: "<direction> stream opaque at offset N: KIND: …" (proxy.observer)
OPAQUE_KIND = r"stream opaque at offset \d+: (\w+):"


def opaque_connections(conns: DataFrame, since_ns: int | None = None, until_ns: int | None = None) -> DataFrame:
    """Connections relayed without decoding, by why (`kind`): TLS pass-through, HTTP, a frame that is not Kafka ….

    Their requests (all of them, or those after the byte where decoding stopped) are not in the recording,
    so every other table undercounts them; the `opaque_connections` finding says so and how to decode
    them. `kind` is `tls` wherever TLS was seen, else the kind in the proxy's `opaque_reason`
    (`observation_backlog` and `decoder_error` for the reasons that carry none). The job builds this table
    only when the overview counts opaque connections.

    Under a `since_ns`/`until_ns` window: every connection the window sees, however long before it opened and
    whenever it ended, since each relayed undecoded traffic during it (the overview's `connections` and
    `opaque_connections`, the finding's "n of N", count the same); `last_seen` is as at the window's end
    (`as_at_window_end`). The byte and request counts are the whole life's: the recording has no finer ones.
    """
    reason = F.col("opaque_reason")
    kind = (F.when(F.coalesce(F.col("tls"), F.lit(False)), F.lit("tls"))
            .when(reason.rlike(OPAQUE_KIND), F.regexp_extract(reason, OPAQUE_KIND, 1))
            .when(reason.startswith("observation fell"), F.lit("observation_backlog"))
            .when(reason.startswith("decoder error"), F.lit("decoder_error"))
            .otherwise(F.lit("other")))
    c = with_client(as_at_window_end(conns, since_ns, until_ns).where(opaque())).withColumn("kind", kind)

    def few(col: str) -> Column:
        return F.slice(F.sort_array(F.collect_set(col)), 1, 20)

    return c.groupBy("kind").agg(
        F.count(F.lit(1)).alias("connections"),
        F.coalesce(F.sum("requests"), F.lit(0)).alias("requests_decoded"),
        F.coalesce(F.sum("bytes_from_client"), F.lit(0)).alias("bytes_from_client"),
        F.coalesce(F.sum("bytes_from_broker"), F.lit(0)).alias("bytes_from_broker"),
        few("client_host").alias("client_hosts"),
        few("broker_addr").alias("brokers"),
        F.slice(F.array_sort(F.array_distinct(F.flatten(F.collect_list("client_ids")))), 1, 20).alias("client_ids"),
        F.min_by("conn_id", "opened_ns").alias("example_conn_id"),
        F.min_by("opaque_reason", "opened_ns").alias("example_reason"),
        ns_to_ts(F.min("opened_ns")).alias("first_opened"),
        ns_to_ts(F.max(F.coalesce("closed_ns", "snapshot_ns", "opened_ns"))).alias("last_seen"),
    ).orderBy(F.desc("connections"), "kind")


def kafka_4_upgrade(conns: DataFrame, since_ns: int | None = None, until_ns: int | None = None) -> DataFrame:
    """Clients that sent request versions Kafka 4.0 removed (KIP-896), one row each: what they would have to stop
    sending before their brokers move to 4.x, and whether a broker already closed them for it.

    A 4.x broker closes a connection at the first such request (the proxy's `inferred_cause` says so per
    connection); a 3.x broker still serves it, so nothing fails until the upgrade. `closed_by_broker` counts
    only such closes, as the proxy's inferred cause names them (`KIP_896_REFUSAL`: the broker closed the
    connection at a request of a removed version and had answered neither it nor any request after it; an
    idle close or a 3.x broker's restart is not one). A follower broker's connections are left out
    (`overview.sent_removed_versions`). `versions` are the proxy's
    `removed_in_kafka_4` names ("Produce v2"); `client_software` is what the clients' ApiVersions v3+ said
    (kafka-python and other old clients say nothing). The job builds this table only when the overview counts
    such connections. Windowed as `opaque_connections` is: every connection the window sees.
    """
    c = with_client(as_at_window_end(conns, since_ns, until_ns).where(sent_removed_versions()))
    software = F.concat_ws(" ", "client_software_name", "client_software_version")
    # the broker closed it at a request of a removed version, as a 4.x broker does: the proxy's inferred cause says
    # so only when the broker answered neither that request nor any after it (not an idle close, not a 3.x restart)
    closed_for_it = broker_closed() & F.coalesce(F.col("inferred_cause").contains(KIP_896_REFUSAL), F.lit(False))

    def few(col: Column) -> Column:
        return F.slice(F.sort_array(F.collect_set(col)), 1, 20)

    return c.groupBy("client_id").agg(
        F.array_sort(F.array_distinct(F.flatten(F.collect_list("removed_in_kafka_4")))).alias("versions"),
        F.count(F.lit(1)).alias("connections"),
        F.sum(F.when(closed_for_it, 1).otherwise(0)).alias("closed_by_broker"),
        few(F.when(software != "", software)).alias("client_software"),
        few(F.col("client_host")).alias("client_hosts"),
        few(F.col("broker_addr")).alias("brokers"),
        F.min_by("conn_id", "opened_ns").alias("example_conn_id"),
        ns_to_ts(F.min("opened_ns")).alias("first_opened"),
        ns_to_ts(F.max(F.coalesce("closed_ns", "snapshot_ns", "opened_ns"))).alias("last_seen"),
    ).orderBy(F.desc("connections"), "client_id")
