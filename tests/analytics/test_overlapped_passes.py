"""The passes over the requests run a few at a time on small and mid-sized inputs, with the same results.

Why: below a few million rows each pass (request rollup, notable rows, TCP sides, topic
rollup, traffic, latency cube) costs Spark's fixed per-job overhead and leaves a core idle,
so `run_analysis` overlaps them; past `OVERLAP_MAX_ROWS` on a local master they run one by
one, because there the tasks already fill the cores. Overlapping must change no table and
no finding, and a failing pass must still fail the analysis.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from analytics import job
from analytics.job import OVERLAP_MAX_ROWS, overlapped_passes, pass_runner, run_analysis
from analytics.synthetic import generate

pytestmark = pytest.mark.spark


def test_passes_overlap_unless_the_input_is_big_and_local() -> None:
    assert overlapped_passes("local[2]", 2_444, 3) == 3
    assert overlapped_passes("local[2]", OVERLAP_MAX_ROWS, 3) == 3
    assert overlapped_passes("local[2]", OVERLAP_MAX_ROWS + 1, 3) == 1
    assert overlapped_passes("local[2]", None, 3) == 1  # unknown size (e.g. s3a://): assume big
    assert overlapped_passes("spark://127.0.0.1:7077", None, 3) == 3  # a cluster has the cores
    assert overlapped_passes("local[2]", 10, 0) == 1


def test_one_pass_at_a_time_runs_each_at_once_on_the_callers_thread() -> None:
    ran: list[tuple[str, str]] = []
    with pass_runner(1) as pool:
        first = pool.submit(lambda: ran.append(("a", threading.current_thread().name)) or "A")
        assert ran == [("a", threading.current_thread().name)]  # already done when submit returns
        second = pool.submit(lambda x: 1 // x, 0)
        third = pool.submit(lambda: ran.append(("c", threading.current_thread().name)))
    assert first.result() == "A"
    with pytest.raises(ZeroDivisionError):  # a failing pass fails where its result is asked for, as in a pool
        second.result()
    assert third.done() and [r[0] for r in ran] == ["a", "c"]


def test_one_pass_at_a_time_lets_an_interrupt_through_at_once() -> None:
    """Ctrl-C during a pass stops the analysis there, not after the passes that follow it."""
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with pass_runner(1) as pool:
            pool.submit(interrupted)
            pytest.fail("the next pass ran after an interrupt")


def test_several_at_a_time_use_a_pool_beside_the_callers_thread() -> None:
    gate = threading.Event()
    with pass_runner(3) as pool:
        waiting = [pool.submit(gate.wait, 10) for _ in range(2)]  # both pool threads busy at once
        assert not any(f.done() for f in waiting)
        gate.set()
    assert all(f.result() for f in waiting)


def test_overlapped_passes_change_no_table_and_no_finding(spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generate(tmp_path / "rec", 1500)
    used: list[int] = []
    monkeypatch.setattr(job, "pass_runner", lambda passes: used.append(passes) or pass_runner(passes))
    overlapped = run_analysis([tmp_path / "rec"], tmp_path / "overlapped", spark=spark, progress=False, report=False)
    monkeypatch.setattr(job, "overlapped_passes", lambda master, rows, parallel: 1)
    one_by_one = run_analysis([tmp_path / "rec"], tmp_path / "one", spark=spark, progress=False, report=False)
    assert used == [3, 1]
    assert overlapped.tables.keys() == one_by_one.tables.keys()
    for name in overlapped.tables:
        assert overlapped.tables[name] == one_by_one.tables[name], name
    assert [f.to_json() for f in overlapped.findings] == [f.to_json() for f in one_by_one.findings]
    assert overlapped.findings  # the synthetic recording has findings: the comparison compares something


def test_a_failing_pass_fails_the_analysis(spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generate(tmp_path / "rec", 300, rollups=False)  # the notable rows then come from a pass over the requests

    def broken(full):
        raise RuntimeError("notable rows broke")

    monkeypatch.setattr(job.rollups, "notable_requests", broken)
    with pytest.raises(RuntimeError, match="notable rows broke"):
        run_analysis([tmp_path / "rec"], tmp_path / "out", spark=spark, progress=False, report=False)
