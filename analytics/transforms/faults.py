"""Injected Kafka faults and what each client did next (issue 17).

Why here: a fault is only worth injecting for the reaction it provokes, and
the reactions are already in the recording — the requests the same client
sent after the faulted one. The proxy notes every injection in the request
row's `edit` column as `fault#ID KIND[=DETAIL] [MODE]` (`proxy.kafka_faults`);
each such row opens a window that lasts until the same client's next
injected fault on the same API (at most `WINDOW_S`), and the requests of that
client inside the window are counted (faults on different APIs of one client
may overlap, and then share what the client did, e.g. one FindCoordinator):

* recovered: the first request of the same API that was answered without an
  error; time to recover = its first byte − the faulted request's first byte;
* retries: requests of the same API before and including the recovering one;
* metadata refreshes (Metadata), coordinator lookups (FindCoordinator),
  rebalance requests (JoinGroup and SyncGroup of the classic protocol),
  reconnects (new connections of the client whose first request falls in the
  window);
* duplicates: records of a Produce the broker wrote before its answer was
  rewritten (`rewrite` mode) when the client sent the same API again and is not
  idempotent (no producer id in its batches) — the broker stored them twice.

Pure DataFrame → DataFrame; the job collects the two small results.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

WINDOW_S = 120  # a reaction later than this is not attributed to the fault
NOTE = r"fault#(\d+) (\w+)(?:=(\S+))?(?: (in-place|rewrite))?"

# The two tables' columns (Spark DDL), for a recording without injected faults: Spark needs ~1 s only to
# analyse the reactions' plan (a window, five joins), and a zero limit still runs a job, so those empty
# tables are made from these. tests/analytics/test_fault_reactions.py keeps them equal to the plans'.
REACTIONS_COLUMNS = (
    "at timestamp, client_id string, library string, library_version string, rule int, kind string, detail string, "
    "mode string, api_name string, topics array<string>, recovered boolean, time_to_recover_ms double, "
    "retries bigint, metadata_refreshes bigint, coordinator_lookups bigint, rebalance_requests bigint, "
    "reconnects bigint, requests_in_window bigint, duplicate_records bigint, conn_id string, correlation_id int, "
    "edit string")
BY_LIBRARY_COLUMNS = (
    "library string, client_id string, kind string, detail string, api_name string, faults bigint, recovered bigint, "
    "recover_p50_ms double, recover_max_ms double, retries bigint, metadata_refreshes bigint, "
    "coordinator_lookups bigint, rebalance_requests bigint, reconnects bigint, duplicate_records bigint, "
    "requests_per_fault double")


def injected_faults(req: DataFrame) -> DataFrame:
    """One row per injected fault (a request whose `edit` carries `fault#ID …`), with its reaction window."""
    f = req.where(F.col("edit").isNotNull() & F.col("edit").contains("fault#")).select(
        "conn_id", "client_id", "client_software_name", "api_name", "ts_ns", "topics", "records", "producer_id",
        F.col("correlation_id").alias("fault_correlation_id"),
        F.regexp_extract("edit", NOTE, 1).cast("int").alias("rule"),
        F.regexp_extract("edit", NOTE, 2).alias("kind"),
        F.regexp_extract("edit", NOTE, 3).alias("detail"),
        F.regexp_extract("edit", NOTE, 4).alias("mode"),
        "edit",
    )
    w = Window.partitionBy("client_id", "api_name").orderBy("ts_ns")
    nxt = F.lead("ts_ns").over(w)
    cap = F.col("ts_ns") + F.lit(WINDOW_S * 1_000_000_000)
    return f.withColumn("window_end_ns", F.when(nxt.isNull() | (nxt > cap), cap).otherwise(nxt))


def fault_reactions(req: DataFrame) -> DataFrame:
    """One row per injected fault: what the client did in its window (see the module docstring)."""
    faults = injected_faults(req).withColumnRenamed("conn_id", "fault_conn_id").withColumnRenamed(
        "api_name", "fault_api").withColumnRenamed("ts_ns", "fault_ns")
    # only the clients that met a fault: a recording without faults costs one filtered scan, no shuffle of it all
    req = req.join(F.broadcast(faults.select("client_id").distinct()), "client_id", "left_semi")
    software = req.where(F.col("client_software_name").isNotNull()).groupBy("client_id").agg(
        F.max("client_software_name").alias("library"), F.max("client_software_version").alias("library_version"))
    after = req.select(F.col("client_id").alias("r_client"), F.col("conn_id").alias("r_conn"),
                       F.col("api_name").alias("r_api"), F.col("ts_ns").alias("r_ns"),
                       F.col("answered").alias("r_answered"), F.col("error_count").alias("r_errors"),
                       F.col("edit").alias("r_edit"))
    conn_start = req.groupBy(F.col("conn_id").alias("s_conn")).agg(F.min("ts_ns").alias("s_ns"))
    j = F.broadcast(faults).join(
        after, (F.col("r_client") == F.col("client_id")) & (F.col("r_ns") > F.col("fault_ns"))
        & (F.col("r_ns") < F.col("window_end_ns")))
    ok = (F.col("r_api") == F.col("fault_api")) & F.col("r_answered") & (F.coalesce("r_errors", F.lit(0)) == 0) & (
        F.col("r_edit").isNull() | ~F.col("r_edit").contains("fault#"))
    keys = ["fault_conn_id", "fault_correlation_id", "fault_ns"]
    recovered = j.where(ok).groupBy(*keys).agg(F.min("r_ns").alias("recovered_ns"))
    j = j.join(recovered, keys, "left").join(conn_start, F.col("r_conn") == F.col("s_conn"), "left")
    until = F.coalesce(F.col("recovered_ns"), F.col("window_end_ns"))
    inside = F.col("r_ns") <= until

    def count(cond):  # noqa: ANN001, ANN202 — a Column
        return F.sum(F.when(inside & cond, 1).otherwise(0))

    agg = j.groupBy(*keys).agg(
        count(F.col("r_api") == F.col("fault_api")).alias("retries"),
        count(F.col("r_api") == "Metadata").alias("metadata_refreshes"),
        count(F.col("r_api") == "FindCoordinator").alias("coordinator_lookups"),
        count(F.col("r_api").isin("JoinGroup", "SyncGroup")).alias("rebalance_requests"),
        F.countDistinct(F.when(inside & (F.col("s_ns") > F.col("fault_ns")) & (F.col("r_conn") != F.col("fault_conn_id")),
                               F.col("r_conn"))).alias("reconnects"),
        F.count(F.lit(1)).alias("requests_in_window"),
    )
    out = faults.join(agg, keys, "left").join(recovered, keys, "left").join(software, "client_id", "left")
    zero = F.lit(0)
    duplicates = F.when(
        (F.col("fault_api") == "Produce") & (F.col("mode") == "rewrite") & (F.coalesce("retries", zero) > 0)
        & (F.col("producer_id").isNull() | (F.col("producer_id") < 0)), F.coalesce(F.col("records"), zero)).otherwise(zero)
    return out.select(
        (F.col("fault_ns") / 1e9).cast("timestamp").alias("at"),
        "client_id",
        F.coalesce(F.col("library"), F.col("client_software_name"), F.lit("(unknown)")).alias("library"),
        "library_version", "rule", "kind", "detail", "mode", F.col("fault_api").alias("api_name"), "topics",
        F.col("recovered_ns").isNotNull().alias("recovered"),
        F.round((F.col("recovered_ns") - F.col("fault_ns")) / 1e6, 1).alias("time_to_recover_ms"),
        *[F.coalesce(F.col(c), zero).alias(c) for c in ("retries", "metadata_refreshes", "coordinator_lookups",
                                                          "rebalance_requests", "reconnects", "requests_in_window")],
        duplicates.cast("long").alias("duplicate_records"),
        F.col("fault_conn_id").alias("conn_id"), F.col("fault_correlation_id").alias("correlation_id"), "edit",
    ).orderBy("at", "client_id")


def fault_reactions_by_library(reactions: DataFrame) -> DataFrame:
    """Per client library × client × fault (kind, detail, API): how each reacted — the comparison table."""
    return reactions.groupBy("library", "client_id", "kind", "detail", "api_name").agg(
        F.count(F.lit(1)).alias("faults"),
        F.sum(F.col("recovered").cast("int")).alias("recovered"),
        F.round(F.percentile_approx("time_to_recover_ms", 0.5), 1).alias("recover_p50_ms"),
        F.max("time_to_recover_ms").alias("recover_max_ms"),
        F.sum("retries").alias("retries"),
        F.sum("metadata_refreshes").alias("metadata_refreshes"),
        F.sum("coordinator_lookups").alias("coordinator_lookups"),
        F.sum("rebalance_requests").alias("rebalance_requests"),
        F.sum("reconnects").alias("reconnects"),
        F.sum("duplicate_records").alias("duplicate_records"),
        F.round(F.sum("requests_in_window") / F.count(F.lit(1)), 1).alias("requests_per_fault"),
    ).orderBy("kind", "detail", "api_name", "library", "client_id")
