"""The latency cube's cells of a batch of request rows, in pyarrow: what the writer stores beside each requests file.

Why here and not only in Spark (issue 16): an analysis of a long recording
spends most of its time in passes over every request, and the largest of them
builds the latency cube (`analytics.transforms.cube`). A cube cell is a sum of
per-request contributions (count, sum and maximum of the values in one log
bin), so the cells of each requests file can be computed once, when the file
is final, and an analysis only sums the stored cells: ~200k cells instead of
10 M requests. Percentiles then come from the merged bins, as they always did.

The views, bins and derived values are defined once, here, for both engines:
the Spark cube imports them (`recording` never imports pyspark), and
`tests/analytics/test_rollups.py` checks the two engines give the same cells.

Time views are stored at ROLLUP_BUCKET_S; an analysis whose time bucket is a
multiple of it re-buckets them (`analytics.transforms.cube.cube_from_cells`).
Topic views keep topics as the proxy recorded them (an id when it did not
know the name yet); the analysis names them as it names raw rows.

Pure: pyarrow tables in, pyarrow tables out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from recording.request_sums import SumSpec, merge
from recording.request_terms import (LONG_POLL_FRACTION, LONG_POLL_LABELS, ROLLUP_BUCKET_S, api_label, bucket_start, client_id,
                                     long_poll, when)

__all__ = ["BIN_BASE", "TIME_BIN_BASE", "ROLLUP_BUCKET_S", "LONG_POLL_LABELS", "LONG_POLL_FRACTION", "View",
           "REQUEST_VIEWS", "TOPIC_VIEWS", "TIME_KEYS", "CELL_KEYS", "INPUT_COLUMNS", "log_bin", "latency_cells",
           "merge_cells"]

BIN_BASE = 1.02
TIME_BIN_BASE = 1.10  # the over-time views only feed charts and the surge rule: 10 % bins, 5x fewer cells


@dataclass(frozen=True)
class View:
    """One view of the cube: dim keyed by k1 (and k2) over one value column, binned on a log scale of `base`."""

    dim: str
    metric: str
    k1: str
    k2: str | None
    value: str
    base: float = BIN_BASE


# values: v = client-visible latency, vr = the same without long polls, bl = broker latency,
# pd = proxy-added delay of answered requests, w = broker wait of long polls, rb = Produce request size
REQUEST_VIEWS = (
    View("api_version", "latency", "api_label", "api_version", "v"),
    View("client", "latency", "client_id", None, "vr"),
    View("time", "latency", "b", "api_name", "vr", TIME_BIN_BASE),
    View("broker_time", "latency", "broker_addr", "b", "vr", TIME_BIN_BASE),
    View("api", "broker_latency", "api_label", None, "bl"),
    View("api", "proxy_delay", "api_name", None, "pd"),
    View("long_poll_wait", "broker_latency", "client_id", None, "w"),
)
TOPIC_VIEWS = (
    View("topic", "latency", "topic", "api_name", "vr"),
    View("produce_topic", "request_bytes", "topic", None, "rb"),
)
# dim -> which key holds the time bucket (epoch seconds of its start, as text): what re-bucketing rewrites
TIME_KEYS = {v.dim: ("k1" if v.k1 == "b" else "k2") for v in REQUEST_VIEWS if "b" in (v.k1, v.k2)}
CELL_KEYS = ("dim", "k1", "k2", "metric", "bin")
CELL_SPEC = SumSpec("latency_cells", CELL_KEYS, {"n": "sum", "s": "sum", "mx": "max"})  # how cells of two batches merge
# the raw request columns the cells are computed from (a writer reads only these back)
INPUT_COLUMNS = ("api_name", "api_version", "broker_addr", "client_id", "topics", "req_first_ns", "latency_us",
                 "broker_latency_us", "proxy_req_delay_us", "proxy_resp_delay_us", "answered", "request_bytes",
                 "max_wait_ms", "record_bytes")

CELLS_SCHEMA = pa.schema([("dim", pa.string()), ("k1", pa.string()), ("k2", pa.string()), ("metric", pa.string()),
                          ("bin", pa.int32()), ("n", pa.int64()), ("s", pa.int64()), ("mx", pa.int64())])


def log_bin(values: pa.Array, base: float) -> pa.Array:
    """ceil(ln(v) / ln(base)) of each value, 0 for values <= 1: the Spark cube's `_bin`, the same doubles."""
    v = values.cast(pa.float64())
    small = pc.fill_null(pc.less_equal(v, 1.0), False)
    bins = pc.ceil(pc.divide(pc.ln(pc.if_else(small, 2.0, v)), math.log(base)))
    return pc.if_else(small, 0, bins.cast(pa.int32()))


def _view_values(t: pa.Table, bucket_s: int) -> pa.Table:
    """One row per request with every view's keys and values (analytics.transforms.cube.view_values' twin)."""
    api = t["api_name"]
    broker_latency = t["broker_latency_us"].cast(pa.int64())
    latency = t["latency_us"].cast(pa.int64())
    lp = long_poll(t)  # null leaves the request neither long poll nor real, as in Spark
    real = pc.invert(lp)
    delay = pc.add(pc.fill_null(t["proxy_req_delay_us"].cast(pa.int64()), 0),
                   pc.fill_null(t["proxy_resp_delay_us"].cast(pa.int64()), 0))
    return pa.table({
        "api_label": api_label(api, lp),
        "api_name": api,
        "api_version": t["api_version"],
        "broker_addr": t["broker_addr"],
        "client_id": client_id(t),
        "topics": t["topics"],
        "b": bucket_start(t, bucket_s),
        "v": latency,
        "vr": when(real, latency),
        "bl": broker_latency,
        "pd": when(t["answered"], delay),
        "w": when(lp, broker_latency),
        "rb": when(pc.equal(api, "Produce"), t["request_bytes"].cast(pa.int64())),
    })


def _topic_values(values: pa.Table) -> pa.Table:
    """One row per request and topic: answered requests but long polls, and every Produce (Spark's explode)."""
    answered, real = pc.is_valid(values["v"]), pc.is_valid(values["vr"])
    keep = values.filter(pc.or_kleene(pc.and_kleene(answered, real), pc.is_valid(values["rb"])))
    topics = keep["topics"]
    rows = pc.list_parent_indices(topics)
    return pa.table({"api_name": keep["api_name"].take(rows), "vr": keep["vr"].take(rows), "rb": keep["rb"].take(rows),
                     "topic": pc.list_flatten(topics)})


def _cells(rows: pa.Table, views: tuple[View, ...]) -> list[pa.Table]:
    """Each view's (k1, k2, bin) -> count, sum, max over the rows whose value is not null."""
    out = []
    for v in views:
        value = rows[v.value]
        has = pc.is_valid(value)
        if not pc.any(has).as_py():
            continue
        value = value.filter(has)
        # grouped by the keys' own types and cast to text afterwards, once per cell instead of once per request
        # (the same groups: every cast here is one-to-one)
        keys = {"k1": rows[v.k1].filter(has), **({"k2": rows[v.k2].filter(has)} if v.k2 else {})}
        grouped = pa.table({**keys, "bin": log_bin(value, v.base), "value": value}).group_by(
            [*keys, "bin"], use_threads=False).aggregate([("value", "count"), ("value", "sum"), ("value", "max")])
        n = grouped.num_rows
        k2 = grouped["k2"].cast(pa.string()) if v.k2 else pa.array([""] * n, pa.string())
        out.append(pa.table({
            "dim": pa.array([v.dim] * n, pa.string()), "k1": grouped["k1"].cast(pa.string()), "k2": k2,
            "metric": pa.array([v.metric] * n, pa.string()), "bin": grouped["bin"],
            "n": grouped["value_count"].cast(pa.int64()), "s": grouped["value_sum"].cast(pa.int64()),
            "mx": grouped["value_max"].cast(pa.int64()),
        }, schema=CELLS_SCHEMA))
    return out


def latency_cells(requests: pa.Table, bucket_s: int = ROLLUP_BUCKET_S) -> pa.Table:
    """The cube's cells (dim, k1, k2, metric, bin, n, s, mx) of request rows in the recording's schema.

    `requests` needs INPUT_COLUMNS with the recording's types (`req_first_ns` a timestamp[us]).
    """
    values = _view_values(requests, bucket_s)
    parts = _cells(values, REQUEST_VIEWS) + _cells(_topic_values(values), TOPIC_VIEWS)
    return pa.concat_tables(parts) if parts else CELLS_SCHEMA.empty_table()


def merge_cells(tables: Iterable[pa.Table]) -> pa.Table:
    """Cells of several batches as one set: counts and sums added, maxima kept, per (dim, k1, k2, metric, bin)."""
    parts = [t for t in tables if t.num_rows]
    return merge(CELL_SPEC, parts).cast(CELLS_SCHEMA) if parts else CELLS_SCHEMA.empty_table()
