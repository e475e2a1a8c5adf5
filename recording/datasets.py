"""The recording's names without its types: formats, datasets, and the columns a proxy's rows carry.

Why apart from `recording.schema`: the proxy process builds rows and ships them to its writer
process, which does everything Arrow and Parquet. The proxy needs the column names, not the
Arrow types, and importing pyarrow costs each proxy process ~75 MB of resident memory (one per
worker) for nothing. So the names live here, pyarrow-free; `recording.schema` defines the
types and re-exports these constants, and the column names are generated from it into
`recording/column_names.py` (`python -m recording.schema --names`; a test fails when it is stale).
"""

from __future__ import annotations

from recording.column_names import COLUMN_NAMES, TCP_FIELD_NAMES

__all__ = ["FORMAT_VERSION", "FORMAT_KEY", "ROLLUP_VERSION", "ROLLUP_KEY", "FIRST_ROLLUP_VERSION", "RECORDED",
           "DERIVED_DATASETS", "DATASETS", "PARTITION_COLUMNS", "DERIVED_COLUMNS", "COLUMN_NAMES", "TCP_FIELD_NAMES",
           "row_names"]

FORMAT_VERSION = 3  # 3: the *_ns timestamp columns are timestamp[us, UTC] instead of int64 epoch ns (issue 18); 2: requests.topic_ids and the topics/ dataset (issue 14, topics.cluster_id: issue 19); acks int16, error_count int32 (issue 19)
FORMAT_KEY = b"kafkatap.format_version"
# What derived data means, versioned apart from the format (recording.rollups): a rollup is what a kafkatap computed
# from the requests under its rules (what a long poll is …), so rollups of older rules are stale and recomputed
# from the requests, which stay readable as they are. A derived file without the key is FIRST_ROLLUP_VERSION.
ROLLUP_VERSION = 3  # 3: a throttle a `throttle=` fault injected is no broker quota's (request_sums); 2: a ShareFetch that only waited is a long poll ("ShareFetch (long poll)"), as a Fetch is
ROLLUP_KEY = b"kafkatap.rollup_version"
FIRST_ROLLUP_VERSION = 1
RECORDED = ("requests", "connections", "tcp", "frames", "topics", "runs")  # what the proxy observes, row by row (runs: its own starts, stops and launches)
DERIVED_DATASETS = ("latency_cells", "request_sums", "topic_sums", "traffic_sums", "notable_requests", "slowest_requests")  # computed from recorded files (recording.rollups): deleting them loses nothing
DATASETS = RECORDED + DERIVED_DATASETS
PARTITION_COLUMNS = ("proxy", "date", "hour")

# per dataset: the columns the writer computes from the others (`recording.derived`), so rows need not carry them
DERIVED_COLUMNS: dict[str, tuple[str, ...]] = {
    "requests": ("latency_us", "broker_latency_us", "proxy_req_delay_us", "proxy_resp_delay_us", "answered",
                 "error_count"),
}


def row_names(dataset: str) -> tuple[str, ...]:
    """The columns a row of `dataset` carries to the writer process, in schema order: all but the derived ones."""
    derived = DERIVED_COLUMNS.get(dataset, ())
    return tuple(n for n in COLUMN_NAMES[dataset] if n not in derived)
