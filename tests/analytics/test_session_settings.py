"""The settings a new Spark session starts with (`analytics.session.session_settings`): no Spark needed.

A caller's `--conf spark.driver.extraJavaOptions=…` used to replace the JVM options kafkatap sets there:
the log4j configuration that keeps Spark's own log lines off the terminal, the JIT flags and the class
archive all went, so one `-Dfoo=bar` put Spark's default logging on stderr and slowed the analysis. They are
now appended.
"""

from __future__ import annotations

import subprocess

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
    assert got[DRIVER] == f"{session.DEFAULTS[DRIVER]} {session.driver_jvm(None)} {ARCHIVE}"
    assert "-Dlog4j2.configurationFile=file:" in got[DRIVER]


def test_a_callers_java_options_come_after_kafkataps_own() -> None:
    got = session.session_settings("local[2]", {DRIVER: "-Dfoo=bar", "spark.driver.memory": "6g"}, None)
    assert got[DRIVER] == f"{session.DEFAULTS[DRIVER]} {session.driver_jvm(None)} {ARCHIVE} -Dfoo=bar"
    assert got["spark.driver.memory"] == "6g"  # any other key still replaces kafkatap's value


def test_a_caller_can_still_override_one_of_kafkataps_properties() -> None:
    """The JVM takes the last -Dname=… (and -XX:Name=…) it is given: the caller's, since theirs come last."""
    mine = "-Dlog4j2.configurationFile=file:/etc/my-log4j2.properties -XX:TieredStopAtLevel=4"
    options = session.session_settings("local[2]", {DRIVER: mine}, None)[DRIVER]
    assert options.endswith(mine) and options.index("-Dlog4j2.configurationFile=file:/etc") > options.index(str(session.LOG4J))


def test_a_callers_jit_choice_starts_a_jvm_on_a_small_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """On two cores kafkatap gives C1 one compiler thread; a caller's TieredStopAtLevel=4 brings C2 back, and the JVM
    refused to start with both ("CICompilerCount (1) must be at least 2"). The count is then left to the JVM."""
    monkeypatch.setattr(session, "usable_cores", lambda: 2)
    assert "-XX:CICompilerCount=1" in session.session_settings("local[2]", None, None)[DRIVER]
    for theirs in ("-XX:TieredStopAtLevel=4", "-XX:-TieredCompilation", "-XX:CICompilerCount=3"):
        options = session.session_settings("local[2]", {DRIVER: theirs}, None)[DRIVER]
        assert "-XX:CICompilerCount=1" not in options and options.endswith(theirs)
        jvm = [o for o in options.split() if o.startswith("-XX:") and "SharedArchive" not in o]  # the JIT's and GC's
        started = subprocess.run(["java", *jvm, "-version"], capture_output=True, text=True, timeout=60)
        assert started.returncode == 0, (theirs, started.stderr)


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


SPARK_DEFAULTS = """\
# the cluster's driver options, for every application
spark.master                    spark://spark-master:7077
spark.driver.extraJavaOptions   -Dcluster.zone=eu-1 -XX:+UseG1GC \\
                                -Djava.security.krb5.conf=/etc/krb5.conf
! another comment
spark.executor.memory=8g
spark.eventLog.dir : hdfs:///spark-logs
"""


def test_spark_defaults_are_read_the_way_spark_reads_them(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$SPARK_CONF_DIR/spark-defaults.conf, else $SPARK_HOME/conf/: whitespace, `=` or `:` between key and value,
    `#`/`!` comments, a trailing backslash continues the line; no file, no defaults."""
    (tmp_path / "spark-defaults.conf").write_text(SPARK_DEFAULTS)
    got = session.spark_defaults({"SPARK_CONF_DIR": str(tmp_path), "SPARK_HOME": "/nowhere"})
    assert got == {"spark.master": "spark://spark-master:7077", "spark.executor.memory": "8g",
                   "spark.eventLog.dir": "hdfs:///spark-logs",
                   DRIVER: "-Dcluster.zone=eu-1 -XX:+UseG1GC -Djava.security.krb5.conf=/etc/krb5.conf"}
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -Dfrom=home\n")
    assert session.spark_defaults({"SPARK_HOME": str(tmp_path)}) == {DRIVER: "-Dfrom=home"}
    assert session.spark_defaults({"SPARK_CONF_DIR": str(tmp_path / "empty")}) == {}


def test_the_clusters_default_java_options_come_before_kafkataps(tmp_path) -> None:
    """A value set from Python replaces spark-defaults.conf's (the launcher takes it as --conf), so the operator's
    driver options used to be dropped; they now go first and kafkatap's after them (kafkatap's collector is the one
    kept: the JVM refuses two). A caller's --conf value still replaces the file's, as in Spark."""
    (tmp_path / "spark-defaults.conf").write_text(SPARK_DEFAULTS)
    defaults = session.spark_defaults({"SPARK_CONF_DIR": str(tmp_path)})
    ours = f"{session.DEFAULTS[DRIVER]} {session.driver_jvm(None)} {ARCHIVE}"
    got = session.session_settings("spark://h:7077", None, None, defaults)
    assert got[DRIVER] == f"-Dcluster.zone=eu-1 -Djava.security.krb5.conf=/etc/krb5.conf {ours}"
    assert "spark.executor.memory" not in got  # the file's other keys are Spark's to read, as they were
    conf = session.session_settings("spark://h:7077", {DRIVER: "-Dfoo=bar"}, None, defaults)[DRIVER]
    assert conf == f"{ours} -Dfoo=bar"
    assert session.session_settings("local[2]", None, None, {})[DRIVER] == ours
