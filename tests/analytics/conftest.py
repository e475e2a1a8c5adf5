"""One local SparkSession for the whole analytics test session (JVM start-up is paid once)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession  # a required dependency: ./go installs it, a missing one must fail

from analytics.session import get_spark
from analytics.spark_schema import loaded_schema
from recording import schema as rec



@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
                                     "spark.driver.memory": "1g"}, app_name="kafkatap-tests")
    yield session


def _rows(dataset: str, rows: list[dict[str, Any]]) -> list[tuple]:
    names = [c.name for c in rec.COLUMNS[dataset]]
    return [tuple(r.get(n) for n in names) for r in rows]


@pytest.fixture()
def make_df(spark: SparkSession):
    """make_df(dataset, rows): a DataFrame as `analytics.load` gives the transforms (missing columns null)."""

    def make(dataset: str, rows: list[dict[str, Any]]) -> DataFrame:
        return spark.createDataFrame(_rows(dataset, rows), loaded_schema(dataset, with_partitions=False))

    return make


