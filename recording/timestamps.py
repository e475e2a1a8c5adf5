"""Recording timestamps: epoch-ns integers in memory, `timestamp[us, UTC]` on disk (format 3).

Why two representations
-----------------------
* The proxy stamps events with `time.time_ns()` and its rows carry plain int
  epoch ns (`req_first_ns`, …): building a datetime per row on the event loop
  would cost for nothing, and latencies are computed from the exact ns values
  before anything is written.
* On disk the same columns are a real timestamp type, so Spark, DuckDB and
  pandas show them as times without arithmetic. Microseconds, not
  nanoseconds: Spark (3.x and 4.0) refuses Parquet `TIMESTAMP(NANOS)`
  ("Illegal Parquet type"), and DuckDB's `TIMESTAMPTZ_NS` lacks most date
  functions; the durations beside them are whole µs anyway.

The conversion happens in bulk, once per Arrow table (`from_epoch_ns`): in the
writer's flush, in the format 2 → 3 migration and in test/benchmark data
builders. Readers that compute with integer time (replay's rhythm, the
analytics transforms' bucketing) turn the columns back with `to_epoch_ns`
(µs × 1000, exact for what was written).

Column names keep their `_ns` suffix: it names the proxy's clock and the
row keys the proxy, `/metrics` and queries written for format 2 use; the
type says what the values are (documented in docs/architecture.md).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from recording.schema import COLUMNS, TIMESTAMP, arrow_schema

__all__ = ["TIMESTAMP", "timestamp_columns", "ingest_schema", "from_epoch_ns", "to_epoch_ns"]

_NS = pa.timestamp("ns", tz="UTC")


def timestamp_columns(dataset: str) -> tuple[str, ...]:
    """The dataset's columns stored as TIMESTAMP (all of them named `*_ns`; `conn_offset_ns` is a duration, int64)."""
    return tuple(c.name for c in COLUMNS[dataset] if c.type == TIMESTAMP)


def ingest_schema(dataset: str) -> pa.Schema:
    """The dataset's schema as the proxy's row dicts carry it: timestamp columns as int64 epoch ns."""
    schema = arrow_schema(dataset)
    for name in timestamp_columns(dataset):
        i = schema.get_field_index(name)
        schema = schema.set(i, pa.field(name, pa.int64()))
    return schema


def from_epoch_ns(table: pa.Table, dataset: str) -> pa.Table:
    """Every int epoch-ns timestamp column of `table` as TIMESTAMP (truncated to µs); others untouched.

    Columns already of a timestamp type are cast to TIMESTAMP (a no-op when they are).
    """
    for name in timestamp_columns(dataset):
        i = table.schema.get_field_index(name)
        if i < 0:
            continue
        col = table.column(i)
        if pa.types.is_integer(col.type):
            col = col.cast(pa.int64()).cast(_NS)
        if col.type != TIMESTAMP:
            col = col.cast(TIMESTAMP, safe=False)  # ns → µs drops the sub-µs digits (safe=True would refuse)
        table = table.set_column(i, name, col)
    return table


def to_epoch_ns(table: pa.Table, dataset: str) -> pa.Table:
    """Every TIMESTAMP column of `table` back to int64 epoch ns (for integer time arithmetic)."""
    for name in timestamp_columns(dataset):
        i = table.schema.get_field_index(name)
        if i < 0 or not pa.types.is_timestamp(table.column(i).type):
            continue
        us = table.column(i).cast(TIMESTAMP).cast(pa.int64())
        table = table.set_column(i, name, pc.multiply(us, 1000))
    return table
