"""The session's JVM view answers repeated class and static-method lookups without a Py4J round trip.

Why: PySpark looks up `functions`, `PythonUtils` and the like afresh for every
column it builds, each lookup a round trip (and a failed class search through
every Spark jar). `analytics.jvm_lookups` keeps the answers; these tests pin
that the kept objects work exactly like Py4J's, that a repeat costs no round
trip, and that values which can change (static fields) are never kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from py4j.java_gateway import JavaClass, JVMView
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from analytics.jvm_lookups import remember_jvm_lookups

pytestmark = pytest.mark.spark


@contextmanager
def counted_round_trips(spark: SparkSession) -> Iterator[list[str]]:
    """Record the Py4J commands this process sends while the block runs."""
    client = spark.sparkContext._gateway._gateway_client  # type: ignore[attr-defined]
    sent: list[str] = []
    original = client.send_command

    def send(command: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(command)
        return original(command, *args, **kwargs)

    client.send_command = send
    try:
        yield sent
    finally:
        del client.send_command  # back to the class's method


def test_the_session_view_remembers(spark: SparkSession) -> None:
    view = spark.sparkContext._jvm  # type: ignore[attr-defined]
    assert isinstance(view, JVMView) and type(view) is not JVMView
    assert remember_jvm_lookups(view) is view  # idempotent


def test_a_repeated_lookup_makes_no_round_trip(spark: SparkSession) -> None:
    F.col("warm_up")  # the first lookups of `functions` and `col` may go to the JVM
    with counted_round_trips(spark) as sent:
        column = F.col("api")
    assert len(sent) == 1, sent  # only the call itself, no class or member lookup
    assert str(column) == "Column<'api'>"


def test_results_are_unchanged(spark: SparkSession) -> None:
    df = spark.createDataFrame([(1, "a"), (2, "b"), (3, "a")], "n INT, k STRING")
    rows = df.groupBy("k").agg(F.sum("n").alias("total"), F.lit(7).alias("seven")).orderBy("k").collect()
    assert [tuple(r) for r in rows] == [("a", 4, 7), ("b", 2, 7)]


def test_fields_and_unknown_names_are_not_kept(spark: SparkSession) -> None:
    view = spark.sparkContext._jvm  # type: ignore[attr-defined]
    integer = getattr(view, "java.lang.Integer")
    assert isinstance(integer, JavaClass)
    assert getattr(view, "java.lang.Integer") is integer  # the class is kept
    assert integer.MAX_VALUE == 2**31 - 1
    assert "MAX_VALUE" not in vars(integer)  # a static field's value is read each time
    assert integer.valueOf("12") == 12
    assert "valueOf" in vars(integer)  # a static method is kept
    assert "no.such.Klass" not in vars(view)
    getattr(view, "no.such.Klass")  # Py4J answers "package" for an unknown name: not kept either
    assert "no.such.Klass" not in vars(view)
