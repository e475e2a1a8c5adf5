"""Two kafkatap commands writing into one OUT at once: the second refuses, naming the first (analytics.outdir.claim).

Before, a second `analyze --out O` (or `scenario run --out O`) started while the first ran cleared the first
one's report files, and both then wrote into the same tables/: a report mixing two runs, or one that
vanished under the first run's feet.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from analytics import job, outdir
from analytics.cli import analyze
from analytics.synthetic import write_rows
from analytics_rows import conn, req
from kafkatap.cli import cli as kafkatap_cli


@contextmanager
def held_by_another_process(out: Path) -> Iterator[int]:
    """A second process claims OUT and holds it until the block ends (its stdin closed); yields its pid."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from analytics.outdir import claim; "
                               f"claim({str(out)!r}); print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"  # the claim is taken: no race
        yield holder.pid
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)


@pytest.fixture
def analysis(tmp_path, monkeypatch) -> tuple[list[str], Path, Path]:
    """run_analysis replaced (its OUT arguments collected), a one-request recording, and an OUT path beside it."""
    calls: list[str] = []
    monkeypatch.setattr(job, "run_analysis", lambda dirs, out, **kw: calls.append(out) or "result")
    monkeypatch.setattr(job, "summary", lambda result: f"summary of {result}")
    rec, out = tmp_path / "rec", tmp_path / "out"
    write_rows(rec, "requests", [req("c1", 1, t_s=10)])
    write_rows(rec, "connections", [conn("c1", 0, 60)])
    return calls, rec, out


def test_a_second_analysis_into_a_busy_out_is_refused_and_touches_nothing(analysis) -> None:
    calls, rec, out = analysis
    out.mkdir()
    (out / "report.html").write_text("the first run's report")
    with held_by_another_process(out) as pid:
        res = CliRunner().invoke(analyze, [str(rec), "--out", str(out), "--quiet"])
        assert res.exit_code == 2 and not calls, res.output
        assert f"is being written by another kafkatap command (pid {pid}: " in res.output
        assert "from analytics.outdir import claim" in res.output and "give another --out" in res.output
        assert (out / "report.html").read_text() == "the first run's report"  # not cleared, by the refusal or after
    res = CliRunner().invoke(analyze, [str(rec), "--out", str(out), "--quiet"])  # the first one ended: free again
    assert res.exit_code == 0 and calls == [str(out)], res.output
    assert not outdir._claimed  # released when the command ended: this process holds no OUT it once wrote


def test_a_second_scenario_run_into_a_busy_out_is_refused_before_it_starts_anything(tmp_path) -> None:
    out = tmp_path / "scn"
    out.mkdir()
    with held_by_another_process(out) as pid:
        res = CliRunner().invoke(kafkatap_cli, ["scenario", "run", "batch-too-large", "--out", str(out)])
    assert res.exit_code == 1 and f"(pid {pid}: " in res.output and "give another --out" in res.output, res.output
    assert not any(out.iterdir())  # no recordings/, broker/ or clients/: refused before a broker started
    assert not outdir._claimed


def test_the_lock_is_the_kernels_and_leaves_no_file(tmp_path) -> None:
    """flock on the directory: nothing is written into OUT, and a holder that dies (even SIGKILLed) frees it."""
    out = tmp_path / "o"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from analytics.outdir import claim; "
                               f"claim({str(out)!r}); print('held', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    try:
        outdir.claim(out)
        raise AssertionError("claimed an OUT another process holds")
    except outdir.OutBusy as exc:
        assert f"(pid {holder.pid}: " in str(exc)
    holder.kill()
    holder.wait(10)
    outdir.claim(out)  # the dead holder's lock went with it
    outdir.claim(out)  # this process's own claim again: nothing
    outdir.release(out)
    assert not any(out.iterdir()) and not outdir._claimed


def test_a_directory_that_cannot_be_locked_is_written_unguarded(analysis, tmp_path, monkeypatch) -> None:
    """On NFS without local locks flock needs a file open for writing (a directory opens read-only: EBADF), and a
    write-only drop directory (mode 733) cannot be opened at all: analyze, scenario run and demo failed there with
    a traceback. The lock only guards against a second writer; they run unguarded, as before it."""
    import errno

    from recording import dir_lock

    calls, rec, out = analysis

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(dir_lock.fcntl, "flock", no_locks)
    assert dir_lock.lock_dir(tmp_path) is None
    res = CliRunner().invoke(analyze, [str(rec), "--out", str(out), "--quiet"])
    assert res.exit_code == 0 and calls == [str(out)], res.output
    assert not outdir._claimed


def test_a_scenarios_report_held_by_another_command_says_how_to_analyze_later(tmp_path) -> None:
    """demo ended in a traceback after its whole run, and scenario run told the user to give another --out, which
    does not help: the conflict is on the run's own report/ folder."""
    from scenarios.catalog import get
    from scenarios.runner import ScenarioFailed, _analyze

    report, rec = tmp_path / "report", tmp_path / "recordings" / "kafkatap"
    report.mkdir()
    result = type("Result", (), {"out": tmp_path, "timings": {}})()
    with held_by_another_process(report) as pid, pytest.raises(ScenarioFailed) as failed:
        _analyze(get("batch-too-large"), result, {"kafkatap": rec}, lambda message: None)
    said = str(failed.value)
    assert f"(pid {pid}: " in said and f"`kafkatap analyze {rec} --out DIR`" in said and "give another --out" not in said
