"""Spark schemas derived from the one recording schema in `recording/schema.py`.

The recorder writes with pyarrow; analytics reads with Spark. Deriving one from
the other (instead of typing a second schema) means a column added to the
recording shows up here without anyone remembering to copy it.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from recording import schema as rec
from recording.timestamps import timestamp_columns

_SIMPLE: dict[pa.DataType, T.DataType] = {
    pa.string(): T.StringType(),
    pa.large_string(): T.StringType(),
    pa.bool_(): T.BooleanType(),
    pa.int8(): T.ByteType(),
    pa.int16(): T.ShortType(),
    pa.int32(): T.IntegerType(),
    pa.int64(): T.LongType(),
    pa.float32(): T.FloatType(),
    pa.float64(): T.DoubleType(),
    pa.binary(): T.BinaryType(),
    pa.large_binary(): T.BinaryType(),
}


def spark_type(t: pa.DataType) -> T.DataType:
    """Map one pyarrow type to the Spark type Spark's Parquet reader produces for it."""
    if t in _SIMPLE:
        return _SIMPLE[t]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return T.ArrayType(spark_type(t.value_type), True)
    if pa.types.is_struct(t):
        return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in t])
    if pa.types.is_timestamp(t):
        return T.TimestampType()
    raise TypeError(f"no Spark mapping for recording type {t}")


def spark_schema(dataset: str, with_partitions: bool = True) -> T.StructType:
    """The Spark read schema of one dataset; Hive partition columns appended as strings.

    Partition values are kept as strings (``date=2026-11-21``, ``hour=07``) so
    Spark does not guess types that differ between recordings.
    """
    fields = [T.StructField(c.name, spark_type(c.type), True) for c in rec.COLUMNS[dataset]]
    if with_partitions:
        names = {f.name for f in fields}
        fields += [T.StructField(p, T.StringType(), True) for p in rec.PARTITION_COLUMNS if p not in names]
    return T.StructType(fields)


def conform(df: DataFrame, dataset: str) -> DataFrame:
    """`df` in exactly the dataset's current Spark schema: absent columns as nulls, the others cast.

    The Spark twin of the Arrow reader's conform step (`recording.reader`):
    after a migration, columns a newer format added simply do not exist yet.
    """
    have = set(df.columns)
    return df.select([
        (F.col(f.name).cast(f.dataType) if f.name in have else F.lit(None).cast(f.dataType)).alias(f.name)
        for f in spark_schema(dataset)
    ])


def loaded_schema(dataset: str, with_partitions: bool = True) -> T.StructType:
    """The schema `analytics.load` hands the transforms: `spark_schema` with timestamps as epoch-ns longs."""
    ts = set(timestamp_columns(dataset))
    return T.StructType([T.StructField(f.name, T.LongType(), True) if f.name in ts else f
                         for f in spark_schema(dataset, with_partitions)])


def timestamps_as_epoch_ns(df: DataFrame, dataset: str) -> DataFrame:
    """The dataset's timestamp columns as epoch-ns longs, the unit the transforms compute in.

    The files hold real timestamps (format 3) for people querying them; the
    transforms bucket, subtract and compare with exact integer arithmetic
    (and the `--since/--until` window is epoch ns), so the loader converts
    once, right after reading.
    """
    cols = [c for c in timestamp_columns(dataset) if c in df.columns]
    if not cols:
        return df
    return df.withColumns({c: (F.unix_micros(F.col(c)) * F.lit(1000)).cast("long") for c in cols})
