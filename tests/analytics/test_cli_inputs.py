"""`kafkatap analyze`'s refusals before Spark starts, and what it does when Spark cannot read a file.

Each refusal here used to cost a JVM start and end in a Java trace, or worse, in
a report with wrong numbers (a DIR given twice counted every request twice).
"""

from __future__ import annotations

import json
import os
import shutil
import socket

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from analytics import job
from analytics.cli import analyze, read_failure
from analytics.synthetic import write_rows
from analytics_rows import S, T0, conn, req

FILE_NOT_EXIST = ("An error occurred while calling o65.count.\n: org.apache.spark.SparkException: [FAILED_READ_FILE.FILE_NOT_EXIST] "
                  "Encountered error while reading file file:///r/requests/proxy=p/date=2026-11-20/hour=10/part-a.parquet. "
                  "File does not exist. It is possible the underlying files have been updated.")


def _recording(root, start_s: float = 10) -> None:
    write_rows(root, "requests", [req("c1", 1, t_s=start_s), req("c1", 2, t_s=start_s + 40)])
    write_rows(root, "connections", [conn("c1", 0, start_s + 60)])


def _invoke(*args: str):
    return CliRunner().invoke(analyze, [*args, "--quiet"])


@pytest.fixture
def fake_job(monkeypatch):
    """run_analysis replaced: records every call's arguments; `fail` holds exceptions to raise first."""
    calls: list[dict] = []
    fail: list[BaseException] = []

    def run(dirs, out, **kw):
        calls.append({"dirs": dirs, **kw})
        if fail:
            raise fail.pop(0)
        return "result"

    monkeypatch.setattr(job, "run_analysis", run)
    monkeypatch.setattr(job, "summary", lambda result: f"summary of {result}")
    return calls, fail


def test_a_directory_given_twice_is_refused(tmp_path, fake_job) -> None:
    _recording(tmp_path / "rec")
    res = _invoke(str(tmp_path / "rec"), f"{tmp_path}/rec/", "--out", str(tmp_path / "out"))
    assert res.exit_code == 2 and "is given twice" in res.output and not fake_job[0]
    res = _invoke("--compare", str(tmp_path / "rec"), str(tmp_path / "rec"), "--out", str(tmp_path / "out"))
    assert res.exit_code == 2 and "A and B are the same recording" in res.output


@pytest.mark.parametrize("args, says", [
    (["--bucket", "0"], "--bucket"),
    (["--bucket", "-5"], "--bucket"),
    (["--master", "local[0]"], "is not a Spark master"),
    (["--since", "1e30"], "past the year 9999"),
    (["--since", "2026-11-20T10:00", "--until", "2026-11-20T09:00"], "the window ends before it starts"),
])
def test_values_that_cannot_work_are_refused_before_spark(tmp_path, fake_job, args, says) -> None:
    _recording(tmp_path / "rec")
    res = _invoke(str(tmp_path / "rec"), "--out", str(tmp_path / "out"), *args)
    assert res.exit_code == 2 and says in res.output, res.output
    assert not fake_job[0] and not (tmp_path / "out").exists()


def test_an_unreachable_standalone_master_is_said_in_a_line(tmp_path, fake_job) -> None:
    _recording(tmp_path / "rec")
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        res = _invoke(str(tmp_path / "rec"), "--out", str(tmp_path / "out"), "--master", f"spark://127.0.0.1:{port}")
    assert res.exit_code == 2 and f"cannot reach the Spark master at spark://127.0.0.1:{port}" in res.output
    assert not fake_job[0]


def test_a_file_cut_short_is_named_before_spark(tmp_path, fake_job) -> None:
    _recording(tmp_path / "rec")
    (path,) = (tmp_path / "rec" / "requests").rglob("*.parquet")
    os.truncate(path, path.stat().st_size - 100)
    res = _invoke(str(tmp_path / "rec"), "--out", str(tmp_path / "out"))
    assert res.exit_code == 2 and f"cannot read {path}" in res.output and "--ignore-rollups" in res.output
    assert not fake_job[0]


def test_a_file_compacted_away_while_read_is_read_again(tmp_path, fake_job) -> None:
    calls, fail = fake_job
    _recording(tmp_path / "rec")
    fail.append(Exception(FILE_NOT_EXIST))
    res = CliRunner().invoke(analyze, [str(tmp_path / "rec"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0 and "summary of result" in res.stdout, res.output
    assert len(calls) == 2 and "went away while it was read" in res.stderr and "attempt 2 of 3" in res.stderr
    fail.extend(Exception(FILE_NOT_EXIST) for _ in range(3))
    res = _invoke(str(tmp_path / "rec"), "--out", str(tmp_path / "out"))
    assert res.exit_code == 1 and "went away while it was being read, 3 times" in res.output


def test_a_file_the_driver_reads_but_the_executors_cannot_is_said_so_and_not_retried(tmp_path, fake_job) -> None:
    """A cluster's executors without the recording at that path (the driver's local disk) or without permission:
    it was "went away … a running proxy compacted it", retried three times, with "analyze a copy" as advice."""
    calls, fail = fake_job
    _recording(tmp_path / "rec")
    (there,) = (tmp_path / "rec" / "requests").rglob("*.parquet")
    fail.append(Exception(FILE_NOT_EXIST.replace("/r/requests/proxy=p/date=2026-11-20/hour=10/part-a.parquet",
                                                 str(there))))
    res = _invoke(str(tmp_path / "rec"), "--out", str(tmp_path / "out"))
    assert res.exit_code == 1 and len(calls) == 1, res.output
    assert f"the Spark executors cannot read {there}, which this machine (the driver) reads" in res.output


class _JavaError(Exception):
    """What py4j raises for a Java exception: the exception object is in `java_exception`."""

    def __init__(self, text: str) -> None:
        super().__init__("An error occurred while calling o42.load.")
        self.java_exception = type("J", (), {"toString": lambda _self: text})()


@pytest.mark.parametrize("java, says", [
    ("org.apache.spark.SparkIllegalArgumentException: [INVALID_DRIVER_MEMORY] System memory 447741952 must be at "
     "least 471859200.\n\tat org.apache.spark...", "--conf spark.driver.memory=1g"),
    ("java.lang.RuntimeException: java.lang.ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem "
     "not found", "hadoop-aws"),
])
def test_a_java_set_up_error_is_one_line_with_what_to_do(tmp_path, fake_job, java, says) -> None:
    """A driver with too little memory, an s3a:// path without its connector: 80-300 lines of trace."""
    _recording(tmp_path / "rec")
    fake_job[1].append(_JavaError(java.replace("\\n", "\n")))
    res = _invoke(str(tmp_path / "rec"), "--out", str(tmp_path / "out"))
    assert res.exit_code == 1 and res.output.strip().startswith("Error: Spark failed: ") and says in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_the_environments_master_is_checked_as_the_option_is(tmp_path, fake_job, monkeypatch) -> None:
    """KAFKATAP_SPARK_MASTER skipped the check --master gets: a minute of retries and 89 lines of trace."""
    _recording(tmp_path / "rec")
    monkeypatch.setenv("KAFKATAP_SPARK_MASTER", "spark-master:7077")
    res = _invoke(str(tmp_path / "rec"), "--out", str(tmp_path / "out"))
    assert res.exit_code == 2 and "KAFKATAP_SPARK_MASTER" in res.output and "is not a Spark master" in res.output
    assert not fake_job[0]


def test_other_failures_are_not_retried(tmp_path, fake_job) -> None:
    calls, fail = fake_job
    _recording(tmp_path / "rec")
    fail.append(RuntimeError("something else"))
    res = _invoke(str(tmp_path / "rec"), "--out", str(tmp_path / "out"))
    assert isinstance(res.exception, RuntimeError) and len(calls) == 1


def test_relative_compare_windows_count_from_each_side(tmp_path, fake_job) -> None:
    """A recording and its replay made a day later: `+10 … +50` is the same minute of each, not the earlier's."""
    _recording(tmp_path / "a", start_s=10)
    _recording(tmp_path / "b", start_s=86_400 + 10)
    calls, _ = fake_job
    res = _invoke("--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out"),
                  "--since", "+0", "--until", "+40")
    assert res.exit_code == 0, res.output
    kw = calls[0]
    sides = job.side_filters(job.L.Filters(), kw["since"], kw["until"], kw["compare"])
    assert (sides[0].since_ns, sides[0].until_ns) == (T0 + 10 * S, T0 + 50 * S)
    assert (sides[1].since_ns, sides[1].until_ns) == (T0 + 86_410 * S, T0 + 86_450 * S)
    absolute = job.side_filters(job.L.Filters(), "2026-11-20T09:00", None, kw["compare"])
    assert absolute[0] == absolute[1]


def test_spark_read_failures_are_told_apart(spark, tmp_path) -> None:
    """The messages of this Spark: a file deleted after the listing, and one that is not Parquet."""
    _recording(tmp_path / "rec")
    (path,) = (tmp_path / "rec" / "requests").rglob("*.parquet")
    shutil.copy(path, tmp_path / "copy.parquet")
    df = spark.read.parquet(str(path))
    path.unlink()
    with pytest.raises(Exception) as gone:
        df.count()
    assert read_failure(gone.value) == (str(path), True)
    schema = spark.read.parquet(str(tmp_path / "copy.parquet")).schema
    os.truncate(tmp_path / "copy.parquet", pq.read_metadata(tmp_path / "copy.parquet").serialized_size)
    with pytest.raises(Exception) as cut:
        spark.read.schema(schema).parquet(str(tmp_path / "copy.parquet")).count()
    assert read_failure(cut.value) == (str(tmp_path / "copy.parquet"), False)
    assert read_failure(RuntimeError("no file here")) is None


@pytest.mark.parametrize("inner", ["", "report", "connections/pages"])
def test_an_out_inside_a_recording_is_refused_in_one_line(tmp_path, fake_job, inner) -> None:
    """Its connections/*.html pages would land in the recording's own connections/ dataset."""
    _recording(tmp_path / "rec")
    out = tmp_path / "rec" / inner if inner else tmp_path / "rec"
    res = _invoke(str(tmp_path / "rec"), "--out", str(out))
    assert res.exit_code == 2 and not fake_job[0], res.output
    assert res.output.strip().splitlines() == [f"Error: --out {out} is inside the recording {tmp_path / 'rec'}: the report's "
                                               "connections/ pages would land in the recording's own connections/ dataset; give "
                                               "an --out outside it"]
    _recording(tmp_path / "b")
    res = _invoke("--compare", str(tmp_path / "rec"), str(tmp_path / "b"), "--out", str(tmp_path / "b" / "cmp"))
    assert res.exit_code == 2 and f"is inside the recording {tmp_path / 'b'}" in res.output
    res = _invoke(str(tmp_path / "rec"), "--out", str(tmp_path / "rec-out"))  # a sibling whose name starts alike is outside
    assert res.exit_code == 0 and len(fake_job[0]) == 1, res.output


def test_filters_that_match_nothing_say_so_with_what_there_is(spark, tmp_path) -> None:
    write_rows(tmp_path / "rec", "requests", [req("c1", 1, t_s=10, topics=["orders"]), req("c1", 2, t_s=50, topics=["orders"]),
                                              req("c2", 1, t_s=20, topics=["payments"], client="billing", broker="10.0.0.2:9092")])
    write_rows(tmp_path / "rec", "connections", [conn("c1", 0, 60), conn("c2", 0, 60, client="billing", broker="10.0.0.2:9092")])
    res = CliRunner().invoke(analyze, [str(tmp_path / "rec"), "--out", str(tmp_path / "out"), "--quiet",
                                       "--topic", "ordres", "--client", "app-9"])
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("nothing matched the filters")]
    assert "(client in app-9; topic in ordres)" in line
    assert "3 requests run from 2026-11-20 09:00:10 UTC to 2026-11-20 09:00:50 UTC" in line
    assert "commonest topics: orders (2), payments (1)" in line and "commonest clients: app-1 (2), billing (1)" in line
    assert "brokers" not in line  # no --broker given: no hint for it
    doc = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert doc["nothing_matched"] == line
    res = CliRunner().invoke(analyze, [str(tmp_path / "rec"), "--out", str(tmp_path / "out"), "--quiet", "--topic", "orders"])
    assert res.exit_code == 0 and "nothing matched" not in res.output, res.output


@pytest.mark.parametrize("value, says", [
    ("-5", "-5.0 is not in the range 0<=x<=86400.0."),  # ran, and a finding then advised raising it below zero
    ("inf", "inf is not in the range 0<=x<=86400.0."),  # OverflowError after Spark's start
    ("nan", "nan is not a finite number"),  # passes a range check; "cannot convert float NaN to integer" after Spark's start
])
def test_a_tolerance_that_is_no_time_difference_is_refused(tmp_path, fake_job, value: str, says: str) -> None:
    _recording(tmp_path / "a")
    _recording(tmp_path / "b")
    res = _invoke("--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out"),
                  "--match", "wire", "--tolerance", value)
    assert res.exit_code == 2 and not fake_job[0], res.output
    assert f"Error: Invalid value for '--tolerance': {says}" in res.output


def test_a_zero_tolerance_is_taken(tmp_path, fake_job) -> None:
    _recording(tmp_path / "a")
    _recording(tmp_path / "b")
    res = _invoke("--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out"), "--tolerance", "0")
    assert res.exit_code == 0 and fake_job[0][0]["tolerance_s"] == 0, res.output


@pytest.mark.parametrize("args, named", [
    (["--match", "wire"], "--match only applies"),
    (["--tolerance", "10"], "--tolerance only applies"),  # the default's value, given: refused all the same
    (["--tolerance", "3", "--match", "sequence"], "--match and --tolerance only apply"),
])
def test_compare_options_without_compare_are_refused(tmp_path, fake_job, args, named) -> None:
    """Without --compare they were silently ignored; only options the user gave are refused, not their defaults."""
    _recording(tmp_path / "rec")
    res = _invoke(str(tmp_path / "rec"), "--out", str(tmp_path / "out"), *args)
    assert res.exit_code == 2 and not fake_job[0] and not (tmp_path / "out").exists(), res.output
    assert res.output.strip().splitlines() == [f"Error: {named} with --compare A B ("
                                               + ("it says" if "and" not in named else "they say")
                                               + " how its two recordings' requests are paired)"]
    res = _invoke(str(tmp_path / "rec"), "--out", str(tmp_path / "out"))
    assert res.exit_code == 0 and fake_job[0][0]["tolerance_s"] == 10.0, res.output


def _long_name(tmp_path) -> str:
    return str(tmp_path / "new" / ("x" * 300))  # `new` is made, then its child's name is too long (ENAMETOOLONG)


@pytest.mark.parametrize("where, reason", [
    (lambda tmp_path: str(tmp_path / "afile" / "sub"), "{tmp_path}/afile: Not a directory"),
    (lambda tmp_path: str(tmp_path / "afile" / "sub" / "deeper"), "{tmp_path}/afile: Not a directory"),
    (lambda tmp_path: "/proc/kafkatap-test-out", "No such file or directory"),
    (_long_name, "File name too long"),
], ids=["under-a-file", "deeper-under-a-file", "in-proc", "name-too-long"])
def test_an_out_that_cannot_be_made_is_said_in_one_line_before_spark(tmp_path, fake_job, where, reason) -> None:
    """It was a Python traceback (FileNotFoundError, NotADirectoryError …), exit 1, after the JVM had started;
    now one line naming OUT and the OS's reason, exit 2, with nothing left of the directories made on the way."""
    _recording(tmp_path / "rec")
    (tmp_path / "afile").write_text("a file, not a directory")
    out = where(tmp_path)
    res = _invoke(str(tmp_path / "rec"), "--out", out)
    assert res.exit_code == 2 and not fake_job[0], res.output
    assert res.output.strip().splitlines() == [f"Error: --out {out} cannot be created ({reason.format(tmp_path=tmp_path)})"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "rec"]  # `new` went again
    assert (tmp_path / "afile").read_text() == "a file, not a directory"


def test_an_out_that_exists_but_takes_no_files_is_said_before_spark(tmp_path, fake_job) -> None:
    """/sys/kernel exists and refuses new files even to root: that was found at the report's first write, after
    the JVM had started and the passes had run; now before, in one line."""
    _recording(tmp_path / "rec")
    res = _invoke(str(tmp_path / "rec"), "--out", "/sys/kernel")
    assert res.exit_code == 2 and not fake_job[0], res.output
    assert res.output.strip().splitlines() == ["Error: --out /sys/kernel cannot be written (Permission denied)"]
