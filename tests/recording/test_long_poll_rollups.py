"""The writer's rollups (pyarrow) count a ShareFetch that only waited as a long poll, as they count a Fetch.

A share consumer's ShareFetch waits up to max_wait for records like a consumer's Fetch; counted as
real latency it makes the broker look slow. Spark's side and the two engines' agreement:
tests/analytics/test_rollups.py and tests/analytics/test_transforms.py.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa

from recording.latency_cells import latency_cells
from recording.request_sums import request_sums, slowest_rows
from recording.request_terms import long_poll
from recording.timestamps import from_epoch_ns, ingest_schema
from tests.analytics.analytics_rows import req

WAIT = {"max_wait_ms": 500, "topics": ["t"]}
ROWS = [
    req("c1", 1, "Fetch", lat_us=500_300, broker_latency_us=500_100, record_bytes=0, **WAIT),  # a long poll
    req("s1", 2, "ShareFetch", t_s=1, lat_us=500_400, broker_latency_us=500_200, record_bytes=0, client="sh", **WAIT),  # one too
    req("s1", 3, "ShareFetch", t_s=2, lat_us=450_000, broker_latency_us=449_000, record_bytes=700, client="sh", **WAIT),  # read late
    req("s1", 4, "ShareFetch", t_s=3, lat_us=3000, broker_latency_us=2900, record_bytes=0, client="sh", **WAIT),  # empty at once
]


def _requests() -> pa.Table:
    return from_epoch_ns(pa.Table.from_pylist(ROWS, schema=ingest_schema("requests")), "requests")  # as on disk


def _counts(cells: pa.Table, dim: str, metric: str) -> Counter:
    """Values per first key of one latency view (its cells' counts summed over the bins)."""
    out: Counter = Counter()
    for c in cells.to_pylist():
        if c["dim"] == dim and c["metric"] == metric:
            out[c["k1"]] += c["n"]
    return out


def test_share_fetch_long_polls_are_labelled_and_kept_out_of_real_latency() -> None:
    t = _requests()
    assert long_poll(t).to_pylist() == [True, True, False, False]
    cells = latency_cells(t)
    assert _counts(cells, "api", "broker_latency") == {"Fetch (long poll)": 1, "ShareFetch (long poll)": 1, "ShareFetch": 2}
    assert _counts(cells, "client", "latency") == {"sh": 2}  # real latency: the long polls left out
    assert _counts(cells, "long_poll_wait", "broker_latency") == {"app-1": 1, "sh": 1}
    sums = {r["api_name"]: r["long_polls"] for r in request_sums(t).to_pylist()}
    assert sums == {"Fetch": 1, "ShareFetch": 1}
    assert sorted(slowest_rows(t)["correlation_id"].to_pylist()) == [3, 4]
