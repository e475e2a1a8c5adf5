"""Injected Kafka faults and what each client did next (issue 17).

Why here: a fault is only worth injecting for the reaction it provokes, and
the reactions are already in the recording — the requests the same client
sent after the faulted one. The proxy notes every injection in the request
row's `edit` column as `fault#ID KIND[=DETAIL] [MODE] [on=TOPICS]
[broker-error=ERRORS]` (`proxy.kafka_faults`; several rules on one request are
joined with `; `, and each is one injection here). `on=`: the topics a
`topic=`/`partition=` rule matched; `broker-error=`: the broker's own errors
a `rewrite` overwrote (kept as `broker_error`). A delay, throttle or rewrite
noted beside an in-place answer or a drop on the same request (recordings made
before the proxy left those out) never applied and is no injection here. A
response edit that failed is noted with ` (not applied)` at its end: the error
/ throttle it carried never reached the client (a delay in it did), so those
rows are kept with `applied` false, in no episode and counted apart.

Episodes: a fault that lasts (`for=10s`, `nth=`, a client retrying into it)
is many injections, and what an operator asks is how the client came through
the outage, not whether each retry succeeded. Per client × API × fault (kind
and detail), injections with no successful request of that API between them
(answered, no error, no applied fault) and less than `WINDOW_S` apart are one
episode; it ends at the first such success after its last injection (for a
rule that matched topics, `on=`, a success on one of them: a client whose
other topics go through is still in the outage; the request rows name no
partitions, so a `partition=` rule's episode ends at a success on its topic;
for a delay, sooner at its last held request's answer when that was a success:
a delay refuses nothing) — the
client recovered, `time_to_recover_ms` after each injection (after the first:
the outage the client saw; after the last: how fast it came back once the
fault stopped) — or, with none within `WINDOW_S` after the last injection,
not recovered (`window_cut_short`: the client's last recorded request came
sooner than `WINDOW_S` after it, so the recording, or the client, stopped
first).

Each injection's window runs from it to the episode's next injection or its
recovery (inclusive; at most `WINDOW_S`), so the windows of an episode tile it
and their counts add up to the episode's (faults on different APIs of one
client may overlap, and then share what the client did, e.g. one
FindCoordinator):

* retries: requests of the same API in the window (the faulted retries and
  the recovering one included);
* metadata refreshes (Metadata), coordinator lookups (FindCoordinator),
  rebalance requests (JoinGroup and SyncGroup of the classic protocol),
  reconnects (new connections of the client whose first request falls in the
  window);
* answered / latency_ms: whether the injected request itself got an answer
  (a delayed one the client gave up on did not: its connection closed first)
  and how long the client waited for it;
* resends: Produce requests in the window with the faulted one's topics,
  record count and record bytes — the same batch sent again (kafkatap keeps
  no batch bytes: a new batch of exactly the same size cannot be told apart);
* duplicates: the records of an applied `rewrite` Produce error (the broker
  wrote them, the client heard an error) that a non-idempotent client (no
  producer id in its batches) resent — the broker stored them twice. Not when
  the broker had refused the request itself (`broker_error`): it wrote nothing
  there, and the resend is its refusal's as much as the fault's. Nor when the
  client sent a batch of the same shape in the window before the fault too:
  it sends batches of one size (fixed-size records, a perf test), so the one
  after may be a new batch, and nothing recorded tells them apart.

Pure DataFrame → DataFrame; the job collects the two small results.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from recording.fault_notes import NOT_APPLIED  # proxy.kafka_faults: the note of a response edit that failed

WINDOW_S = 120  # a reaction later than this is not attributed to the fault
WINDOW_NS = WINDOW_S * 1_000_000_000
NOTE = r"^fault#(\d+) (\w+)(?:=(\S+))?(?: (in-place|rewrite))?(?: on=(\S+))?(?: broker-error=(\S+))?"
# a note the proxy answered or dropped the request with: the response edits noted beside it never applied
ANSWERED_BY_PROXY = r"fault#\d+ (drop|error=\S+ in-place)"
UNAPPLIED_KINDS = ("error", "throttle")  # what such a failed response edit did not do (a delay still held it)

# The two tables' columns (Spark DDL), for a recording without injected faults: Spark needs ~1 s only to
# analyse the reactions' plan (windows, joins), and a zero limit still runs a job, so those empty
# tables are made from these. tests/analytics/test_fault_reactions.py keeps them equal to the plans'.
REACTIONS_COLUMNS = (
    "at timestamp, client_id string, library string, library_version string, rule int, kind string, detail string, "
    "mode string, api_name string, topics array<string>, broker_error string, applied boolean, episode int, "
    "episode_index int, episode_faults bigint, answered boolean, latency_ms double, recovered boolean, "
    "time_to_recover_ms double, window_cut_short boolean, retries bigint, metadata_refreshes bigint, "
    "coordinator_lookups bigint, rebalance_requests bigint, reconnects bigint, requests_in_window bigint, "
    "resends bigint, duplicate_records bigint, conn_id string, correlation_id int, edit string")
BY_LIBRARY_COLUMNS = (
    "library string, client_id string, kind string, detail string, api_name string, faults bigint, "
    "recovered bigint, recover_p50_ms double, recover_max_ms double, retries bigint, metadata_refreshes bigint, "
    "coordinator_lookups bigint, rebalance_requests bigint, reconnects bigint, duplicate_records bigint, "
    "requests_per_fault double, not_applied bigint, over_broker_error bigint, episodes bigint, "
    "episodes_recovered bigint, episodes_cut_short bigint, after_last_p50_ms double, after_last_max_ms double, "
    "answered bigint, wait_p50_ms double, wait_max_ms double")


# The faulted request's columns under the names they have beside the requests that followed it (the join's other side)
FAULT_SIDE = {"conn_id": "fault_conn_id", "api_name": "fault_api", "ts_ns": "fault_ns", "topics": "fault_topics"}


def _count_where(cond: Column) -> Column:
    """How many rows of the group meet `cond` (a long; 0, not null, for none)."""
    return F.sum(F.when(cond, 1).otherwise(0)).cast("long")


def _note_applied(note: Column, edit: Column) -> Column:
    """Is this `fault#…` note (one part of `edit`) an injection that reached the client?"""
    failed = edit.endswith(NOT_APPLIED) & F.regexp_extract(note, NOTE, 2).isin(*UNAPPLIED_KINDS)
    return note.startswith("fault#") & ~failed


def fault_applied(edit: Column) -> Column:
    """Does the request's `edit` carry at least one applied fault (false for null)?"""
    return F.coalesce(F.exists(F.split(edit, "; "), lambda p: _note_applied(p, edit)), F.lit(False))


def _moot(note: Column, edit: Column) -> Column:
    """A response edit noted beside the proxy's own answer or drop (older recordings): it never happened."""
    return edit.rlike(ANSWERED_BY_PROXY) & ~note.rlike("^" + ANSWERED_BY_PROXY)


def _part(note: Column, group: int) -> Column:
    """Group `group` of NOTE in `note`; null when the note has none."""
    got = F.regexp_extract(note, NOTE, group)
    return F.when(got != "", got)


def injected_faults(req: DataFrame) -> DataFrame:
    """One row per `fault#ID …` note (applied or not), as in the `edit` column, with the faulted request's facts.

    scope: the topics a `topic=`/`partition=` rule matched (null: the rule took the whole request).
    """
    f = req.where(F.col("edit").isNotNull() & F.col("edit").contains("fault#")).select(
        "conn_id", "client_id", "client_software_name", "api_name", "ts_ns", "topics", "records", "record_bytes",
        "producer_id", "answered", "latency_us", "error_count", "edit",
        F.col("correlation_id").alias("fault_correlation_id"),
        F.explode(F.split("edit", "; ")).alias("note"),
    ).where(F.col("note").startswith("fault#") & ~_moot(F.col("note"), F.col("edit")))
    return f.select(
        "*",
        F.regexp_extract("note", NOTE, 1).cast("int").alias("rule"),
        F.regexp_extract("note", NOTE, 2).alias("kind"),
        F.regexp_extract("note", NOTE, 3).alias("detail"),
        F.regexp_extract("note", NOTE, 4).alias("mode"),
        F.split(_part(F.col("note"), 5), ",").alias("scope"),
        _part(F.col("note"), 6).alias("broker_error"),
        _note_applied(F.col("note"), F.col("edit")).alias("applied"),
    ).drop("note")


def _held_answer_ns() -> Column:
    """When a delay's held request reached the client as a success (null for every other injection).

    A delay refuses nothing: once the held answer arrives, the client is through. Without this, a client that
    sent nothing more of that API (a producer whose process ended) stayed "in the outage" for `WINDOW_S`, and its
    window took in whatever the same client id did next — a later process's reconnects and requests.
    """
    good = (F.col("kind") == "delay") & F.coalesce(F.col("answered"), F.lit(False)) \
        & (F.coalesce(F.col("error_count"), F.lit(0)) == 0)
    return F.when(good, F.col("ts_ns") + F.col("latency_us") * 1000)


def _episodes(faults: DataFrame, ok: DataFrame) -> DataFrame:
    """The applied injections with their episode, place in it, window end and the episode's recovery.

    A success ends an episode only if it touched a topic the fault's injections were on (their `scope`s
    together), unless one of them took a whole request (no scope: any success of the API counts).
    """
    part = ["client_id", "api_name", "kind", "detail"]
    inj = faults.where("applied")
    scopes = inj.groupBy(*part).agg(F.max(F.col("scope").isNull()).alias("whole"),
                                    F.array_distinct(F.flatten(F.collect_list("scope"))).alias("scope_topics"))
    succ = ok.join(F.broadcast(scopes), ["client_id", "api_name"]) \
        .where(F.col("whole") | F.arrays_overlap("topics", "scope_topics")) \
        .select(*part, "ts_ns", F.lit(1).alias("is_ok"))
    events = inj.withColumn("is_ok", F.lit(0)).unionByName(succ, allowMissingColumns=True)
    w = Window.partitionBy(*part).orderBy("ts_ns", "is_ok")
    prev_ts, prev_ok = F.lag("ts_ns").over(w), F.lag("is_ok").over(w)
    next_ts, next_ok = F.lead("ts_ns").over(w), F.lead("is_ok").over(w)
    near = next_ts.isNotNull() & (next_ts - F.col("ts_ns") <= WINDOW_NS)
    # only an episode's last injection has one: the next success, or sooner the held answer of a last delay
    own = F.col("own_answer_ns")
    recovers = F.when(near & (next_ok == 1), F.least(next_ts, own)).when(~near, own)
    e = events.withColumn("own_answer_ns", _held_answer_ns()).select(
        "*",
        (prev_ts.isNull() | (prev_ok == 1) | (F.col("ts_ns") - prev_ts > WINDOW_NS)).cast("int").alias("starts"),
        F.when(near & (next_ok == 0), next_ts).otherwise(F.coalesce(recovers, F.col("ts_ns") + WINDOW_NS))
        .alias("window_end_ns"),
        recovers.alias("recovers_ns"),
    ).where(F.col("is_ok") == 0)
    w_inj = Window.partitionBy(*part).orderBy("ts_ns").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    e = e.withColumn("episode", F.sum("starts").over(w_inj).cast("int"))
    w_ep = Window.partitionBy(*part, "episode")
    recovered = F.max("recovers_ns").over(w_ep)
    return e.select(
        "*",
        F.row_number().over(w_ep.orderBy("ts_ns", "rule")).alias("episode_index"),
        F.count(F.lit(1)).over(w_ep).alias("episode_faults"),
        # not before a held answer still outstanding (an earlier delay answered after the last one: jitter)
        F.when(recovered.isNotNull(), F.greatest(recovered, F.max("own_answer_ns").over(w_ep))).alias("recovered_ns"),
        F.max("ts_ns").over(w_ep).alias("episode_last_ns"),
    ).drop("is_ok", "starts", "recovers_ns", "own_answer_ns")


def fault_reactions(req: DataFrame) -> DataFrame:
    """One row per injected fault: its episode and what the client did in its window (see the module docstring)."""
    all_faults = injected_faults(req)
    # only the clients that met a fault: a recording without faults costs one filtered scan, no shuffle of it all
    req = req.join(F.broadcast(all_faults.select("client_id").distinct()), "client_id", "left_semi")
    ok = req.where(F.col("answered") & (F.coalesce("error_count", F.lit(0)) == 0) & ~fault_applied(F.col("edit"))) \
        .select("client_id", "api_name", "ts_ns", "topics")
    clients = req.groupBy("client_id").agg(
        F.max("client_software_name").alias("library"), F.max("client_software_version").alias("library_version"),
        F.max("ts_ns").alias("client_last_ns"))
    faults = _episodes(all_faults, ok).withColumnsRenamed(FAULT_SIDE)
    after = req.select(F.col("client_id").alias("r_client"), F.col("conn_id").alias("r_conn"),
                       F.col("api_name").alias("r_api"), F.col("ts_ns").alias("r_ns"), F.col("topics").alias("r_topics"),
                       F.col("records").alias("r_records"), F.col("record_bytes").alias("r_record_bytes"))
    conn_start = req.groupBy(F.col("conn_id").alias("s_conn")).agg(F.min("ts_ns").alias("s_ns"))
    # the window after the fault, and as long before it: a batch of the same shape sent before the fault too means
    # this client sends batches of one size (fixed-size records), so one after it may be new, not the faulted one
    j = F.broadcast(faults).join(
        after, (F.col("r_client") == F.col("client_id")) & (F.col("r_ns") > F.col("fault_ns") - F.lit(WINDOW_NS))
        & (F.col("r_ns") <= F.col("window_end_ns"))).join(conn_start, F.col("r_conn") == F.col("s_conn"), "left")
    keys = ["fault_conn_id", "fault_correlation_id", "fault_ns", "rule"]
    later = F.col("r_ns") > F.col("fault_ns")
    same_api = F.col("r_api") == F.col("fault_api")
    same_batch = same_api & (F.col("fault_api") == "Produce") & F.col("r_topics").eqNullSafe(F.col("fault_topics")) \
        & F.col("r_records").eqNullSafe(F.col("records")) & F.col("r_record_bytes").eqNullSafe(F.col("record_bytes"))
    agg = j.groupBy(*keys).agg(
        _count_where(later & same_api).alias("retries"),
        _count_where(later & (F.col("r_api") == "Metadata")).alias("metadata_refreshes"),
        _count_where(later & (F.col("r_api") == "FindCoordinator")).alias("coordinator_lookups"),
        _count_where(later & F.col("r_api").isin("JoinGroup", "SyncGroup")).alias("rebalance_requests"),
        F.countDistinct(F.when((F.col("s_ns") > F.col("fault_ns")) & (F.col("s_ns") <= F.col("window_end_ns"))
                               & (F.col("r_conn") != F.col("fault_conn_id")), F.col("r_conn"))).alias("reconnects"),
        _count_where(later).alias("requests_in_window"),
        _count_where(later & same_batch).alias("resends"),
        _count_where((F.col("r_ns") < F.col("fault_ns")) & same_batch).alias("same_shape_before"),
    )
    episodes = faults.join(agg, keys, "left").drop("window_end_ns")
    unapplied = all_faults.where(~F.col("applied")).withColumnsRenamed(FAULT_SIDE)
    out = episodes.unionByName(unapplied, allowMissingColumns=True).join(clients, "client_id", "left")
    zero = F.lit(0)
    applied = F.col("applied")
    duplicates = F.when(
        applied & (F.col("fault_api") == "Produce") & (F.col("mode") == "rewrite") & F.col("broker_error").isNull()
        & (F.coalesce("resends", zero) > 0) & (F.col("producer_id").isNull() | (F.col("producer_id") < 0))
        & (F.coalesce("same_shape_before", zero) == 0),
        F.coalesce(F.col("records"), zero)).otherwise(zero)
    when_applied = lambda c: F.when(applied, F.coalesce(F.col(c), zero))  # noqa: E731 — null for a note not applied
    return out.select(
        (F.col("fault_ns") / 1e9).cast("timestamp").alias("at"),
        "client_id",
        F.coalesce(F.col("library"), F.col("client_software_name"), F.lit("(unknown)")).alias("library"),
        "library_version", "rule", "kind", "detail", "mode", F.col("fault_api").alias("api_name"),
        F.col("fault_topics").alias("topics"), "broker_error", "applied", "episode", "episode_index", "episode_faults",
        "answered", F.round(F.col("latency_us") / 1e3, 1).alias("latency_ms"),
        F.when(applied, F.col("recovered_ns").isNotNull()).alias("recovered"),
        F.round((F.col("recovered_ns") - F.col("fault_ns")) / 1e6, 1).alias("time_to_recover_ms"),
        F.when(applied & F.col("recovered_ns").isNull(),
               F.col("client_last_ns") < F.col("episode_last_ns") + F.lit(WINDOW_NS)).alias("window_cut_short"),
        *[when_applied(c).cast("long").alias(c) for c in ("retries", "metadata_refreshes", "coordinator_lookups",
                                                          "rebalance_requests", "reconnects", "requests_in_window",
                                                          "resends")],
        duplicates.cast("long").alias("duplicate_records"),
        F.col("fault_conn_id").alias("conn_id"), F.col("fault_correlation_id").alias("correlation_id"), "edit",
    ).orderBy("at", "client_id", "rule")


def fault_reactions_by_library(reactions: DataFrame) -> DataFrame:
    """Per client library × client × fault (kind, detail, API): how each came through — the comparison table.

    faults / recovered: applied injections, and those whose episode recovered; episodes / episodes_recovered /
    episodes_cut_short (not recovered, the recording ended within WINDOW_S); recover_*: from an episode's first
    injection to its recovery (the outage), after_last_*: from its last injection; answered / wait_*: the injected
    requests that were answered and how long the client waited (a delay's hold); not_applied: noted, never applied;
    over_broker_error: applied rewrites of an answer the broker had refused itself.
    """
    applied = F.col("applied")
    first = applied & (F.col("episode_index") == 1)
    last = applied & (F.col("episode_index") == F.col("episode_faults"))
    faults = _count_where(applied)
    return reactions.groupBy("library", "client_id", "kind", "detail", "api_name").agg(
        faults.alias("faults"),
        _count_where(applied & F.col("recovered")).alias("recovered"),
        F.round(F.percentile_approx(F.when(first, F.col("time_to_recover_ms")), 0.5), 1).alias("recover_p50_ms"),
        F.max(F.when(first, F.col("time_to_recover_ms"))).alias("recover_max_ms"),
        F.sum("retries").alias("retries"),
        F.sum("metadata_refreshes").alias("metadata_refreshes"),
        F.sum("coordinator_lookups").alias("coordinator_lookups"),
        F.sum("rebalance_requests").alias("rebalance_requests"),
        F.sum("reconnects").alias("reconnects"),
        F.sum("duplicate_records").alias("duplicate_records"),
        F.round(F.when(faults > 0, F.sum("requests_in_window") / faults), 1).alias("requests_per_fault"),
        _count_where(~applied).alias("not_applied"),
        _count_where(applied & F.col("broker_error").isNotNull()).alias("over_broker_error"),
        _count_where(first).alias("episodes"),
        _count_where(first & F.col("recovered")).alias("episodes_recovered"),
        _count_where(first & F.coalesce(F.col("window_cut_short"), F.lit(False))).alias("episodes_cut_short"),
        F.round(F.percentile_approx(F.when(last, F.col("time_to_recover_ms")), 0.5), 1).alias("after_last_p50_ms"),
        F.max(F.when(last, F.col("time_to_recover_ms"))).alias("after_last_max_ms"),
        _count_where(applied & F.col("answered")).alias("answered"),
        F.round(F.percentile_approx(F.when(applied & F.col("answered"), F.col("latency_ms")), 0.5), 1)
        .alias("wait_p50_ms"),
        F.max(F.when(applied & F.col("answered"), F.col("latency_ms"))).alias("wait_max_ms"),
    ).orderBy("kind", "detail", "api_name", "library", "client_id")
