"""The settings a new Spark session starts with (`analytics.session.session_settings`): no JVM needed.

A caller's `--conf spark.driver.extraJavaOptions=…` used to replace the JVM options kafkatap sets there:
the log4j configuration that keeps Spark's own log lines off the terminal, the JIT flags and the class
archive all went, so one `-Dfoo=bar` put Spark's default logging on stderr and slowed the analysis. They are
now appended.
"""

from __future__ import annotations

import pytest

from analytics import session

DRIVER = "spark.driver.extraJavaOptions"
ARCHIVE = "-XX:SharedArchiveFile=/cache/spark.jsa -Xlog:cds=off"


@pytest.fixture(autouse=True)
def archive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A class archive, whatever this machine's cache holds: the tests say where its options go."""
    monkeypatch.setattr(session, "java_options", lambda: ARCHIVE)


def test_kafkataps_own_options_without_a_callers() -> None:
    got = session.session_settings("local[2]", None, None)
    assert got[DRIVER] == f"{session.DEFAULTS[DRIVER]} {session.DRIVER_JVM} {ARCHIVE}"
    assert "-Dlog4j2.configurationFile=file:" in got[DRIVER]


def test_a_callers_java_options_come_after_kafkataps_own() -> None:
    got = session.session_settings("local[2]", {DRIVER: "-Dfoo=bar", "spark.driver.memory": "6g"}, None)
    assert got[DRIVER] == f"{session.DEFAULTS[DRIVER]} {session.DRIVER_JVM} {ARCHIVE} -Dfoo=bar"
    assert got["spark.driver.memory"] == "6g"  # any other key still replaces kafkatap's value


def test_a_caller_can_still_override_one_of_kafkataps_properties() -> None:
    """The JVM takes the last -Dname=… (and -XX:Name=…) it is given: the caller's, since theirs come last."""
    mine = "-Dlog4j2.configurationFile=file:/etc/my-log4j2.properties -XX:TieredStopAtLevel=4"
    options = session.session_settings("local[2]", {DRIVER: mine}, None)[DRIVER]
    assert options.endswith(mine) and options.index("-Dlog4j2.configurationFile=file:/etc") > options.index(str(session.LOG4J))


def test_a_callers_collector_replaces_kafkataps() -> None:
    """The JVM refuses two collectors ("Multiple garbage collectors selected"), so the caller's alone is given."""
    options = session.session_settings("local[2]", {DRIVER: "-XX:+UseG1GC"}, None)[DRIVER]
    assert "-XX:+UseParallelGC" not in options and options.endswith("-XX:+UseG1GC")
    assert "-XX:TieredStopAtLevel=1" in options  # the rest of kafkatap's flags stay
    big = session.session_settings("local[2]", {DRIVER: "-XX:+UseZGC"}, session.C1_ONLY_MAX_ROWS + 1)[DRIVER]
    assert "-XX:+UseParallelGC" not in big and big.endswith("-XX:+UseZGC")


def test_a_callers_archive_replaces_kafkataps() -> None:
    options = session.session_settings("local[2]", {DRIVER: "-XX:SharedArchiveFile=/mine.jsa"}, None)[DRIVER]
    assert ARCHIVE not in options and options.endswith("-XX:SharedArchiveFile=/mine.jsa")


def test_executor_options_are_the_callers_alone() -> None:
    """kafkatap sets no executor JVM options (a cluster's executors keep their own): the caller's pass as given."""
    assert "spark.executor.extraJavaOptions" not in session.session_settings("local[2]", None, None)
    got = session.session_settings("spark://h:7077", {"spark.executor.extraJavaOptions": "-Dx=1"}, None)
    assert got["spark.executor.extraJavaOptions"] == "-Dx=1"
    assert "spark.driver.host" not in got  # a cluster's None-valued defaults are still left to Spark
