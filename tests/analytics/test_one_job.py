"""analytics.one_job: many small DataFrames collected with one Spark query give what each one's own toArrow gives.

Why: the report's tables are all collected through it, so a type, a row order, an empty
table or the row cap coming back differently would change every report and every
table file without any transform changing.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from analytics.one_job import collect_in_one_job

pytestmark = pytest.mark.spark


def test_each_table_comes_back_as_its_own_query_would_give_it(spark: SparkSession) -> None:
    t = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.timezone.utc)
    wide = spark.createDataFrame(
        [(i, f"client-{i % 7}", t + dt.timedelta(seconds=i), [i, i + 1], Decimal(i) / 4, None if i % 3 else 1.5)
         for i in range(50)],
        "n long, client string, at timestamp, parts array<int>, share decimal(10,2), maybe double")
    frames = {
        "ordered": wide.orderBy(F.col("n").desc()),  # an order the union must keep
        "grouped": wide.groupBy("client").agg(F.count("*").alias("requests"), F.max("at").alias("last"),
                                              F.collect_list("n").alias("ns")).orderBy("client"),
        "empty": wide.where(F.col("n") < 0).select("client", "at"),
        "capped": wide.orderBy("n"),  # more rows than the cap: the first `cap` come back
        "dotted": wide.select(F.col("n").alias("a.b"), F.struct("client", "share").alias("nested")).orderBy("`a.b`"),
    }
    cap = 30
    got = collect_in_one_job(frames, cap)
    assert list(got) == list(frames)
    for name, df in frames.items():
        alone = df.limit(cap).toArrow()
        assert got[name].schema.equals(alone.schema), (name, got[name].schema, alone.schema)
        assert got[name].to_pylist() == alone.to_pylist(), name
    assert got["empty"].num_rows == 0 and got["capped"].num_rows == cap
    assert got["ordered"].column("n").to_pylist()[:3] == [49, 48, 47]


def test_nothing_to_collect_runs_no_query(spark: SparkSession) -> None:
    assert collect_in_one_job({}, 10) == {}
