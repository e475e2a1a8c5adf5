"""Request columns the writer process computes itself instead of receiving them from the proxy.

Why: with `writer="process"` every request row crosses to the writer process as the tuple of its values,
taken and pickled on the proxy's event loop: that is most of what recording costs the proxy per request
(issue 16, bench/RESULTS.md). Six of those values are pure functions of other values of the same row
(the four latencies from its clocks, `answered` from the response's first byte, `error_count` from
`errors`), so they are left out of the tuple and computed here, a column at a time, with the same
rules as `proxy.rows.request_row`: floor division of nanoseconds by 1,000, and null when a clock is
missing. `tests/recording/test_writer_process.py` checks the result against rows the proxy's own
code built, including missing clocks and clocks out of order.

No I/O: Arrow arrays in, Arrow arrays out.
"""

from __future__ import annotations

from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from recording.datasets import DERIVED_COLUMNS  # which columns: named there, pyarrow-free, for the proxy's rows

__all__ = ["DERIVED_COLUMNS", "derive"]


def _floor_us(later: pa.Array, earlier: pa.Array) -> pa.Array:
    """(later - earlier) // 1000 as Python floors it (Arrow's integer division truncates toward zero)."""
    d = pc.subtract(later, earlier)
    q = pc.divide(d, 1000)
    below = pc.less(pc.subtract(d, pc.multiply(q, 1000)), 0)  # a negative remainder: one lower
    return pc.subtract(q, pc.cast(below, pa.int64()))


def derive(dataset: str, columns: Mapping[str, pa.Array], types: Mapping[str, pa.DataType]) -> dict[str, pa.Array]:
    """The derived columns of `dataset` from its other columns (`types`: each derived column's type)."""
    if dataset != "requests":
        return {}
    c = columns
    out = {
        "latency_us": _floor_us(c["resp_sent_ns"], c["req_first_ns"]),
        "broker_latency_us": _floor_us(c["resp_first_ns"], c["req_sent_ns"]),
        "proxy_req_delay_us": _floor_us(c["req_sent_ns"], c["req_last_ns"]),
        "proxy_resp_delay_us": _floor_us(c["resp_sent_ns"], c["resp_last_ns"]),
        "answered": pc.is_valid(c["resp_first_ns"]),
        "error_count": pc.list_value_length(c["errors"]),
    }
    return {name: arr.cast(types[name]) for name, arr in out.items()}
