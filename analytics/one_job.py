"""Collect many small DataFrames with one Spark job instead of one job each.

Why: the report's tables are small aggregations of small pinned inputs, so each one's
cost is Spark's fixed cost per query (planning, scheduling, the Arrow hand-over to
Python), not its data: ~0.3 s a table on two cores, ~10 s for the ~35 tables of a
small recording. Here every table becomes one branch of a single union: branch i holds
a row tag `_table` = i and the table's row as one struct column `_i` (every other
branch's `_i` is null), so one collect brings all of them back; the split after it
is pyarrow's. Union keeps its children's partitions in order and each branch is a
limited (single-partition) plan, so an ordered table's rows keep their order.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

TAG = "_table"


def tagged(index: int, df: DataFrame, cap: int) -> DataFrame:
    """Branch `index` of the union: at most `cap` rows of `df`, each as one struct column named `_<index>`."""
    return df.limit(cap).select(F.lit(index).alias(TAG),
                                F.struct(*[F.col(f"`{c}`") for c in df.columns]).alias(f"_{index}"))


def union_of(frames: Mapping[str, DataFrame], cap: int) -> DataFrame:
    """The one DataFrame that holds every frame's first `cap` rows (see the module's docstring)."""
    branches = [tagged(i, df, cap) for i, df in enumerate(frames.values())]
    union = branches[0]
    for b in branches[1:]:
        union = union.unionByName(b, allowMissingColumns=True)
    return union.select(TAG, *[f"_{i}" for i in range(len(branches))])


def split(got: pa.Table, schemas: Mapping[str, pa.Schema]) -> dict[str, pa.Table]:
    """The union's result cut back into one table per frame, each cast to `schemas[name]`, in that order."""
    tags = got.column(TAG)
    out = {}
    for i, (name, schema) in enumerate(schemas.items()):
        rows = got.column(f"_{i}").filter(pc.equal(tags, i))
        struct = rows.combine_chunks() if rows.num_chunks else pa.array([], rows.type)
        out[name] = pa.Table.from_arrays(struct.flatten(), names=schema.names).cast(schema)
    return out


def arrow_schema(df: DataFrame) -> pa.Schema:
    """The schema `df.toArrow()` gives its table (pyspark's own mapping, the session's large-types choice)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(df.schema, error_on_duplicated_field_names_in_struct=True,
                           prefers_large_types=df.sparkSession._jconf.arrowUseLargeVarTypes())


def collect_in_one_job(frames: Mapping[str, DataFrame], cap: int) -> dict[str, pa.Table]:
    """Every frame's first `cap` rows as an Arrow table, with one Spark query for all of them.

    The union's rows come back as pyspark's `toArrow` receives them, before its cast to the
    declared schema: that cast would refuse the union's struct columns, whose fields Spark
    declares non-null (as in their own table) while the other branches' rows hold nulls there.
    Each table is cast to its own declared schema after the split instead, as `toArrow` would.
    """
    if not frames:
        return {}
    union = union_of(frames, cap)
    batches = union._collect_as_arrow(empty_list_if_zero_records=False)  # what DataFrame.toArrow casts
    return split(pa.Table.from_batches(batches), {name: arrow_schema(df) for name, df in frames.items()})
