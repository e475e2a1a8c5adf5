"""analytics.synthetic.write_table takes a dataset's timestamp columns as the proxy's rows carry them or as a recording stores them.

A table in the dataset's own on-disk schema (timestamp[us, UTC], e.g. read back from a recording) used
to be cast straight to int64 epoch ns: its microseconds were taken for nanoseconds, so every row
landed in January 1970 (partition and values). No Spark here.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analytics.synthetic import write_table
from analytics_rows import conn, req
from recording.timestamps import from_epoch_ns, ingest_schema, timestamp_columns, to_epoch_ns


def _table(dataset: str, rows: list[dict]) -> pa.Table:
    schema = ingest_schema(dataset)
    return pa.Table.from_pylist([{n: r.get(n) for n in schema.names} for r in rows], schema=schema)


def _read_back(paths: list[Path], dataset: str) -> tuple[list[str], pa.Table]:
    """The partition directories written and the rows, timestamps as epoch ns."""
    return sorted(str(p.parent).split(f"/{dataset}/", 1)[1] for p in paths), \
        to_epoch_ns(pa.concat_tables([pq.read_table(p) for p in paths]), dataset)


@pytest.mark.parametrize("dataset, rows", [
    ("requests", [req("c1", 1, t_s=3000), req("c1", 2, t_s=3900)]),  # two hours: 09 and 10
    ("connections", [conn("c1", 0, 40), conn("c2", 3600, 3700)]),
])
def test_timestamp_columns_in_any_form_land_at_the_same_time(tmp_path: Path, dataset: str, rows: list[dict]) -> None:
    ints = _table(dataset, rows)  # int64 epoch ns, as the proxy's rows
    stored = from_epoch_ns(ints, dataset)  # timestamp[us, UTC], as a recording stores them
    assert all(pa.types.is_timestamp(stored.schema.field(n).type) for n in timestamp_columns(dataset))
    zoned = stored  # the same instants in another unit and zone
    for name in timestamp_columns(dataset):
        i = zoned.schema.get_field_index(name)
        zoned = zoned.set_column(i, name, zoned.column(i).cast(pa.timestamp("ns", tz="Asia/Tokyo")))
    expected = _read_back(write_table(tmp_path / "ints", dataset, ints), dataset)
    assert all(d.split("/")[1].startswith("date=2026-") for d in expected[0]), expected[0]
    for name, table in (("stored", stored), ("zoned", zoned)):
        got = _read_back(write_table(tmp_path / name, dataset, table), dataset)
        assert got[0] == expected[0], name
        assert got[1].equals(expected[1]), name
