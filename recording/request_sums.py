"""The analysis's request rollups of a batch of request rows, in pyarrow: what the writer stores beside each requests file.

The twins of `analytics.transforms.rollups` (request_rollup, topic_rollup,
traffic_over_time, notable_requests), for the reason `recording.latency_cells`
gives: every measure is a count, a sum, a minimum or a maximum, so sums of
each final requests file can be computed once by the writer and an analysis
adds them up instead of passing over every request again. `SUMS` says, per
rollup, which columns are keys and how each measure merges; the writer's merge
and the analysis's re-aggregation both follow it.

The time-keyed rollups (topics, traffic) are stored per ROLLUP_BUCKET_S, with
`b` the bucket's start in epoch seconds; an analysis re-buckets them. Topics are
kept as recorded (an id when the proxy did not know the name yet), and so are
the notable rows' `topic_ids`: the analysis names them as it names raw rows.

Pure: pyarrow tables in, pyarrow tables out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from protocol.error_kinds import ERROR, PROTOCOL_STEP, RETRIABLE, response_kind
from recording.schema import NOTABLE_REQUEST_COLUMNS, SLOWEST_REQUEST_COLUMNS
from recording.fault_notes import INJECTED_THROTTLE, NOT_APPLIED, injected_error_names
from recording.request_terms import FETCH_APIS, UNSCALED_WINDOW, bucket_start, client_id, host, long_poll, when

__all__ = ["LARGE_RESPONSE_BYTES", "NOTABLE_COLUMNS", "SLOWEST_KEPT", "SLOWEST_COLUMNS", "SumSpec", "SUMS", "INPUT_COLUMNS",
           "request_sums", "topic_sums", "traffic_sums", "notable_rows", "slowest_rows", "slowest_of", "merge"]

LARGE_RESPONSE_BYTES = UNSCALED_WINDOW  # fills an unscaled TCP window: its transfer rate shows the window's ceiling
# what the tables that read the notable rows use (errors, bypass, brokers); the stored rows add the ids that name topics
NOTABLE_COLUMNS = tuple(c.name for c in NOTABLE_REQUEST_COLUMNS if c.name != "topic_ids")
SLOWEST_KEPT = 50  # slowest requests kept per file: the report lists the 50 slowest of the recording, all among these
SLOWEST_COLUMNS = tuple(c.name for c in SLOWEST_REQUEST_COLUMNS)  # the slowest-requests table's, plus what names topics
# the report's order: slowest first, then conn id and correlation id (Spark's ascending order puts nulls first)
SLOWEST_ORDER = [("latency_us", "descending", "at_end"), ("conn_id", "ascending", "at_start"),
                 ("correlation_id", "ascending", "at_start")]


@dataclass(frozen=True)
class SumSpec:
    """One rollup: its key columns and, per measure, how two partial sums merge (sum, min or max)."""

    dataset: str
    keys: tuple[str, ...]
    measures: dict[str, str]


SUMS = {
    "request_sums": SumSpec(
        "request_sums",
        ("proxy_id", "conn_id", "client_id", "client_addr", "broker_addr", "api_name", "group_id", "acks", "compression", "status"),
        {"requests": "sum", "first_ns": "min", "last_ns": "max", "request_bytes": "sum", "response_bytes": "sum",
         "max_request_bytes": "max", "records": "sum", "record_bytes": "sum", "requests_with_errors": "sum",
         "requests_retriable": "sum", "protocol_steps": "sum", "long_polls": "sum", "max_wait_ms": "max",
         "throttled_requests": "sum", "throttle_ms": "sum", "max_throttle_ms": "max", "first_throttled_ns": "min",
         "peak_response_bytes_per_s": "max", "faults_injected": "sum"}),
    "topic_sums": SumSpec(
        "topic_sums", ("client_id", "client_host", "api_name", "topic", "compression", "b"),
        {"requests": "sum", "first_ns": "min", "last_ns": "max", "records": "sum", "requests_with_records": "sum",
         "record_bytes": "sum", "fetch_bytes_split": "sum", "split_records": "sum", "max_request_bytes": "max",
         "empty": "sum", "long_polls": "sum"}),
    "traffic_sums": SumSpec(
        "traffic_sums", ("broker_addr", "client_id", "b"),
        {"requests": "sum", "request_bytes": "sum", "sized_requests": "sum", "response_bytes": "sum",
         "produced_records": "sum"}),
}
# the raw request columns these are computed from (a writer reads only these back)
INPUT_COLUMNS = ("proxy_id", "conn_id", "client_id", "client_addr", "broker_addr", "api_name", "group_id", "acks",
                 "compression", "status", "req_first_ns", "correlation_id", "api_version", "latency_us", "request_bytes", "response_bytes", "records", "record_bytes",
                 "error_count", "errors", "max_wait_ms", "broker_latency_us", "throttle_ms", "resp_first_ns",
                 "resp_last_ns", "edit", "topics", "topic_ids", "topic_record_bytes", "topic_records", "bypass", "advertised")


def _ns(ts: pa.ChunkedArray | pa.Array) -> pa.Array:
    """timestamp[us] as epoch ns (the unit the analysis computes in)."""
    return pc.multiply(ts.cast(pa.int64()), 1000)


def _ones(n: int) -> pa.Array:
    """A 1 per row: summed, the row count (Spark's `count(lit(1))`)."""
    return pa.repeat(pa.scalar(1, pa.int64()), n)


def _flag(cond: pa.Array) -> pa.Array:
    """A condition as 1/0 (null stays null), to be summed: Spark's `cond.cast("long")`."""
    return cond.cast(pa.int64())


def _kinds(t: pa.Table) -> pa.Array:
    """Each request's worst error kind (analytics.transforms.common.response_error_kind), null without errors.

    Python per row, but only for the rare rows with errors: a request whose `error_count` says errors
    but whose list names none counts as an error, as in Spark. Errors kafkatap injected are not the
    broker's and are left out (analytics.transforms.injected: a request with only those has no kind).
    """
    has = pc.greater(pc.fill_null(t["error_count"], 0), 0)
    out: list[str | None] = [None] * t.num_rows
    if pc.any(has).as_py():
        idx = pc.indices_nonzero(has).to_pylist()
        apis = t["api_name"].take(idx).to_pylist()
        errors = t["errors"].take(idx).to_pylist()
        counts = t["error_count"].take(idx).to_pylist()
        edits = t["edit"].take(idx).to_pylist()
        for i, api, errs, count, edit in zip(idx, apis, errors, counts, edits):
            injected = injected_error_names(edit)
            names = [e["name"] for e in errs or []]
            broker = [n for n in names if n not in injected]
            if count - (len(names) - len(broker)) > 0:
                out[i] = response_kind(api, broker) or ERROR
    return pa.array(out, pa.string())


def _aggregate(table: pa.Table, spec: SumSpec, measures: dict[str, tuple[str, str]]) -> pa.Table:
    """Group `table` by the spec's keys; measures: output name -> (input column, pyarrow aggregation)."""
    aggs = [(src, how) for src, how in measures.values()]
    grouped = table.group_by(list(spec.keys), use_threads=False).aggregate(aggs)
    cols = {k: grouped[k] for k in spec.keys}
    for name, (src, how) in measures.items():
        cols[name] = grouped[f"{src}_{how}"]
    return pa.table(cols)


def _injected_throttles(edit: pa.ChunkedArray) -> pa.ChunkedArray:
    """Per row, whether its throttle is one kafkatap's `throttle=` fault put there (recording.fault_notes.injected_throttle)."""
    noted = pc.fill_null(pc.match_substring_regex(edit, INJECTED_THROTTLE), False)
    return pc.and_(noted, pc.invert(pc.fill_null(pc.ends_with(edit, NOT_APPLIED), False)))


def request_sums(t: pa.Table) -> pa.Table:
    """analytics.transforms.rollups.request_rollup's sums per connection, client and API (client_addr still the address)."""
    spec = SUMS["request_sums"]
    kind = _kinds(t)
    throttle = t["throttle_ms"]
    throttled = pc.and_kleene(pc.greater(throttle, 0), pc.invert(_injected_throttles(t["edit"])))
    first_ns = t["req_first_ns"]
    transfer_s = pc.divide(pc.subtract(_ns(t["resp_last_ns"]), _ns(t["resp_first_ns"])).cast(pa.float64()), 1e9)
    big = pc.and_kleene(pc.greater_equal(t["response_bytes"], LARGE_RESPONSE_BYTES), pc.greater(transfer_s, 0))
    rate = pc.divide(t["response_bytes"].cast(pa.float64()), transfer_s)
    work = pa.table({
        **{k: t[k] for k in spec.keys if k != "client_id"}, "client_id": client_id(t),
        "one": _ones(t.num_rows), "ts": first_ns, "rq": pc.fill_null(t["request_bytes"].cast(pa.int64()), 0),
        "rs": pc.fill_null(t["response_bytes"].cast(pa.int64()), 0), "rqmax": t["request_bytes"],
        "records": t["records"], "record_bytes": t["record_bytes"],
        "err": pc.if_else(pc.fill_null(pc.equal(kind, ERROR), False), 1, 0).cast(pa.int64()),
        "retr": pc.if_else(pc.fill_null(pc.equal(kind, RETRIABLE), False), 1, 0).cast(pa.int64()),
        "step": pc.if_else(pc.fill_null(pc.equal(kind, PROTOCOL_STEP), False), 1, 0).cast(pa.int64()),
        "lp": _flag(long_poll(t)), "max_wait_ms": t["max_wait_ms"], "thr": _flag(throttled),
        "thr_ms": when(throttled, throttle), "thr_ts": when(throttled, first_ns), "rate": when(big, rate),
        "faults": _flag(pc.match_substring(t["edit"], "fault#")),
    })
    return _aggregate(work, spec, {
        "requests": ("one", "sum"), "first_ns": ("ts", "min"), "last_ns": ("ts", "max"), "request_bytes": ("rq", "sum"),
        "response_bytes": ("rs", "sum"), "max_request_bytes": ("rqmax", "max"), "records": ("records", "sum"),
        "record_bytes": ("record_bytes", "sum"), "requests_with_errors": ("err", "sum"),
        "requests_retriable": ("retr", "sum"), "protocol_steps": ("step", "sum"), "long_polls": ("lp", "sum"),
        "max_wait_ms": ("max_wait_ms", "max"), "throttled_requests": ("thr", "sum"), "throttle_ms": ("thr_ms", "sum"),
        "max_throttle_ms": ("thr_ms", "max"), "first_throttled_ns": ("thr_ts", "min"),
        "peak_response_bytes_per_s": ("rate", "max"), "faults_injected": ("faults", "sum"),
    })


def topic_sums(t: pa.Table) -> pa.Table:
    """analytics.transforms.rollups.topic_rollup's sums per client, API, topic and ROLLUP_BUCKET_S bucket (`b`: its start)."""
    spec = SUMS["topic_sums"]
    pf = t.filter(pc.is_in(t["api_name"], pa.array(("Produce", *FETCH_APIS))))
    topics = pf["topics"].combine_chunks() if isinstance(pf["topics"], pa.ChunkedArray) else pf["topics"]
    lengths = pc.fill_null(pc.list_value_length(topics), 0)
    n = pc.max_element_wise(lengths, 1).cast(pa.float64())
    # explode_outer: each topic a row, and a null or empty list still one row, with topic null
    no_topic = pc.indices_nonzero(pc.equal(lengths, 0))
    rows = pa.concat_arrays([pc.list_parent_indices(topics).cast(pa.int64()), no_topic.cast(pa.int64())])
    topic = pa.concat_arrays([pc.list_flatten(topics), pa.nulls(len(no_topic), pa.string())])
    first_ns = pf["req_first_ns"]
    record_bytes = pf["record_bytes"]
    work = pa.table({
        "client_id": client_id(pf), "client_host": host(pf["client_addr"]),
        "api_name": pf["api_name"], "compression": pf["compression"], "b": bucket_start(pf),
        "one": _ones(pf.num_rows), "ts": first_ns, "records": pf["records"],
        "has_records": _flag(pc.is_valid(pf["records"])), "record_bytes": record_bytes,
        "split_bytes": pc.divide(record_bytes.cast(pa.float64()), n), "split_records": pc.divide(pf["records"].cast(pa.float64()), n),
        "rqmax": pf["request_bytes"], "lp": _flag(long_poll(pf)),
    }).take(rows)
    for name, given in (("split_bytes", "topic_record_bytes"), ("split_records", "topic_records")):
        exact = pa.concat_arrays([_per_topic(pf[given], topics, lengths), pa.nulls(len(no_topic), pa.float64())])
        work = work.set_column(work.schema.get_field_index(name), name, pc.coalesce(exact, work[name]))
    # empty for this topic: a fetch that brought another topic's records brought this one nothing
    work = work.append_column("empty", _flag(pc.equal(pc.fill_null(work["split_bytes"], 0.0), 0.0)))
    work = work.append_column("topic", topic)
    return _aggregate(work, spec, {
        "requests": ("one", "sum"), "first_ns": ("ts", "min"), "last_ns": ("ts", "max"), "records": ("records", "sum"),
        "requests_with_records": ("has_records", "sum"), "record_bytes": ("record_bytes", "sum"),
        "fetch_bytes_split": ("split_bytes", "sum"), "split_records": ("split_records", "sum"),
        "max_request_bytes": ("rqmax", "max"), "empty": ("empty", "sum"), "long_polls": ("lp", "sum"),
    })


def _per_topic(given: pa.ChunkedArray | pa.Array, topics: pa.Array, lengths: pa.Array) -> pa.Array:
    """Per entry of the flattened `topics`: the figure the row's list `given` (`topic_record_bytes`,
    `topic_records`) gives that topic, else null.

    A row's list is aligned with its `topics` (the proxy writes both), so the flattened
    lists of the rows that have one line up entry for entry.
    """
    per = given.combine_chunks() if isinstance(given, pa.ChunkedArray) else given
    has = pc.fill_null(pc.equal(pc.list_value_length(per), lengths), False)
    entry_has = pc.take(has, pc.list_parent_indices(topics))
    values = pc.list_flatten(per.filter(has)).cast(pa.float64())
    return pc.replace_with_mask(pa.nulls(len(entry_has), pa.float64()), entry_has, values)


def traffic_sums(t: pa.Table) -> pa.Table:
    """analytics.transforms.rollups.traffic_over_time's sums per broker, client and ROLLUP_BUCKET_S bucket (`b`: its start)."""
    produce = pc.fill_null(pc.equal(t["api_name"], "Produce"), False)
    work = pa.table({
        "broker_addr": t["broker_addr"], "client_id": client_id(t), "b": bucket_start(t),
        "one": _ones(t.num_rows), "rq": t["request_bytes"].cast(pa.int64()),
        "sized": _flag(pc.is_valid(t["request_bytes"])), "rs": pc.fill_null(t["response_bytes"].cast(pa.int64()), 0),
        "produced": pc.if_else(produce, pc.fill_null(t["records"], 0), 0).cast(pa.int64()),
    })
    return _aggregate(work, SUMS["traffic_sums"], {
        "requests": ("one", "sum"), "request_bytes": ("rq", "sum"), "sized_requests": ("sized", "sum"),
        "response_bytes": ("rs", "sum"), "produced_records": ("produced", "sum"),
    })


def _stored_rows(rows: pa.Table, columns: Iterable[str]) -> pa.Table:
    """Request rows as a derived dataset keeps them: `ts_ns` is `req_first_ns`, client_id as the analysis names it."""
    special = {"ts_ns": rows["req_first_ns"], "client_id": client_id(rows)}
    return pa.table({c: special[c] if c in special else rows[c] for c in columns})


def notable_rows(t: pa.Table) -> pa.Table:
    """analytics.transforms.rollups.notable_requests: rows with errors or answers naming brokers (plus `topic_ids`)."""
    keep = pc.or_kleene(pc.or_kleene(pc.greater(t["error_count"], 0), pc.is_valid(t["advertised"])), pc.is_valid(t["bypass"]))
    return _stored_rows(t.filter(keep), [c.name for c in NOTABLE_REQUEST_COLUMNS])


def slowest_rows(t: pa.Table) -> pa.Table:
    """The SLOWEST_KEPT slowest answered requests but long polls, in the report's order.

    The recording's slowest requests are the slowest among every file's slowest (the same order
    everywhere), so a file keeps only these for the slowest-requests table.
    """
    answered = pc.indices_nonzero(pc.and_(pc.is_valid(t["latency_us"]), pc.invert(pc.fill_null(long_poll(t), True))))
    top = t.take(answered.take(_slowest_indices(t.select([k for k, _, _ in SLOWEST_ORDER]).take(answered))))
    return _stored_rows(top, SLOWEST_COLUMNS)


def slowest_of(t: pa.Table) -> pa.Table:
    """The SLOWEST_KEPT first rows of `t` in the report's order (rows of `slowest_rows`, or raw ones).

    Ordered by its three key columns alone, then only those rows taken: sorting the whole batch
    would copy every column of it (compaction's memory bound, tests/recording).
    """
    return t.take(_slowest_indices(t.select([k for k, _, _ in SLOWEST_ORDER])))


def _slowest_indices(keys: pa.Table) -> pa.Array:
    return pc.sort_indices(keys, sort_keys=SLOWEST_ORDER)[:SLOWEST_KEPT]


def merge(spec: SumSpec, tables: list[pa.Table]) -> pa.Table:
    """Partial sums of several batches (at least one) as one: each measure merged as SUMS says."""
    whole = pa.concat_tables(tables)
    return _aggregate(whole, spec, {m: (m, how) for m, how in spec.measures.items()})
