"""What the rollups and the analysis mean by a long poll, a client host, a bucket: one definition for both engines.

The writer's rollups (`recording.latency_cells`, `recording.request_sums`) compute in
pyarrow what the analysis computes in Spark (`analytics.transforms.common`), and the
two must agree to the row. The terms and constants live here, beside their pyarrow
form; the Spark side imports the constants (recording never imports pyspark).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["LONG_POLL_SUFFIX", "LONG_POLL_LABELS", "LONG_POLL_FRACTION", "FETCH_APIS", "UNSCALED_WINDOW", "ROLLUP_BUCKET_S",
           "HOST_RE", "host", "client_id", "is_fetch", "long_poll", "api_label", "bucket_start", "when"]

FETCH_APIS = ("Fetch", "ShareFetch")  # reading records: a share consumer reads a topic as much as a consumer does
LONG_POLL_FRACTION = 0.8  # broker latency >= 80 % of max_wait with no data = the broker just waited
# A long poll is labelled with its API's name and this ("Fetch (long poll)", "ShareFetch (long poll)"): its latency is
# waiting, never mixed with real reads, nor a share consumer's waits with a consumer's (the views key by label).
LONG_POLL_SUFFIX = " (long poll)"
LONG_POLL_LABELS = tuple(api + LONG_POLL_SUFFIX for api in FETCH_APIS)  # every label a long poll can have
UNSCALED_WINDOW = 65535  # bytes: the largest TCP window without the window-scale option
ROLLUP_BUCKET_S = 60  # the time-keyed rollups' bucket: every chart bucket an analysis picks from 60 s up is a multiple
HOST_RE = r"^(?P<host>\[[^\]]*\]|[^:]*)"  # host part of host:port, [IPv6] kept whole


def host(addr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The host of each host:port (Spark's `regexp_extract` of HOST_RE, group 1)."""
    return pc.struct_field(pc.extract_regex(addr, HOST_RE), [0])


def client_id(t: pa.Table) -> pa.Array:
    """client_id as the analysis names it: "(none)" for a request without one (analytics' prepare_requests)."""
    return pc.fill_null(t["client_id"], "(none)")


def is_fetch(api: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Whether each API reads records (FETCH_APIS); null for a null name, as Spark's `isin` gives."""
    return when(pc.is_valid(api), pc.is_in(api, value_set=pa.array(FETCH_APIS)))


def long_poll(t: pa.Table) -> pa.Array:
    """A Fetch or ShareFetch whose broker latency is ~max_wait and that returned no data (Kleene logic: null where
    Spark's is null)."""
    max_wait = t["max_wait_ms"]
    return pc.and_kleene(pc.and_kleene(pc.and_kleene(is_fetch(t["api_name"]), pc.is_valid(max_wait)),
                                       pc.and_kleene(pc.greater(max_wait, 0), pc.equal(pc.fill_null(t["record_bytes"], 0), 0))),
                         pc.greater_equal(t["broker_latency_us"].cast(pa.float64()),
                                          pc.multiply(max_wait.cast(pa.float64()), 1000 * LONG_POLL_FRACTION)))


def api_label(api: pa.Array | pa.ChunkedArray, waited: pa.Array) -> pa.Array:
    """`api` where `waited` (a `long_poll`) is not true, else `api` + LONG_POLL_SUFFIX (Spark's `api_label`)."""
    return pc.if_else(pc.fill_null(waited, False), pc.binary_join_element_wise(api, LONG_POLL_SUFFIX, ""), api)


def bucket_start(t: pa.Table, bucket_s: int = ROLLUP_BUCKET_S) -> pa.Array:
    """Start (epoch s) of each request's `bucket_s` bucket, from `req_first_ns` (timestamp[us]); integer floor."""
    return pc.multiply(pc.divide(t["req_first_ns"].cast(pa.int64()), bucket_s * 1_000_000), bucket_s)


def when(cond: pa.Array, value: pa.Array) -> pa.Array:
    """`value` where `cond` is true, null where it is false or null (Spark's `when` without `otherwise`)."""
    return pc.if_else(pc.fill_null(cond, False), value, pa.nulls(len(value), value.type))
