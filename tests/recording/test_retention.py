"""Retention (recording/retention.py): whole hours older than a cutoff go, every dataset but topics/ and runs/.

Checked on recordings written through the recorder's own schema (requests with their
rollups, topics), by the functions, by `kafkatap prune`, by a recorder on its writer
thread and in its writer process, and by a real `kafkatap proxy --retain` process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from analytics.synthetic import write_rows
from kafkatap.cli import cli
from recording.layout import HOUR_NS
from recording.retention import DURATION, KEPT, MIN_RETAIN_S, expired, parse_duration, prune
from recording.rollups import coverage_all
from tests.analytics.analytics_rows import T0, req

H = 3600.0


def _record_hours(root: Path, hours: list[int], proxy: str = "p1") -> None:
    """One request row (and so its rollups) in each hour T0 + h, and a topic name learned in the first."""
    for h in hours:
        write_rows(root, "requests", [dict(req(f"c{h}", h, t_s=h * H + 60), proxy_id=proxy)])
    write_rows(root, "topics", [{"proxy_id": proxy, "topic_id": "0" * 32, "topic": "orders",
                                 "first_seen_ns": T0 + hours[0] * HOUR_NS}])


def _hours_of(root: Path, dataset: str, proxy: str = "p1") -> list[str]:
    return sorted(f"{p.parent.parent.name}/{p.parent.name}" for p in (root / dataset / f"proxy={proxy}").rglob("*.parquet"))


def test_durations_read_units_and_refuse_less_than_an_hour():
    assert parse_duration("7d") == 7 * 86400 and parse_duration("36h") == 36 * 3600
    assert parse_duration("90m") == 5400 and parse_duration("2w") == 14 * 86400 and parse_duration("7200") == 7200
    assert parse_duration("1.5h") == 5400
    for bad in ("", "7x", "-1h", "h", "7 days"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)
    assert DURATION.convert("2h", None, None) == 7200
    with pytest.raises(click.BadParameter, match="less than an hour") as short:
        DURATION.convert("30m", None, None)
    assert "bare number" not in str(short.value)
    with pytest.raises(click.BadParameter, match=r"7 is less than an hour \(a bare number is seconds: 7h, 7d\? use a unit\)"):
        DURATION.convert("7", None, None)  # meant 7 days: said as if the operator had asked for seconds
    assert MIN_RETAIN_S == 3600
    for huge in ("99999999999999999999w", "9" * 400 + "w", "100000w"):  # OverflowError tracebacks, or a year 110
        with pytest.raises(click.BadParameter, match="more than a century"):
            DURATION.convert(huge, None, None)


def test_a_pruning_that_cannot_delete_a_path_names_it_and_what_went_before(tmp_path: Path):
    """It said `R: Cannot call rmtree on a symbolic link` (or a file's base name alone), not what it had deleted,
    and left an hour with its rollups gone and its requests kept: every later analysis read every request."""
    root = tmp_path / "rec"
    _record_hours(root, [0, 1, 2])
    hour1 = root / "requests" / "proxy=p1" / "date=2026-11-20" / "hour=10"
    elsewhere = tmp_path / "elsewhere"
    hour1.rename(elsewhere)
    hour1.symlink_to(elsewhere)  # an hour moved aside by hand: prune deletes nothing outside the recording
    res = CliRunner().invoke(cli, ["prune", str(root), "--older-than", "1h"])
    assert res.exit_code == 1, res.output
    assert res.output.startswith(f"Error: {root}: cannot delete {hour1}: ") and "symbolic link" in res.output
    assert "(deleted before it: 1 hour(s), 2026-11-20 09:00 UTC:" in res.output and "run prune again" in res.output
    assert any(elsewhere.iterdir())  # nothing outside the recording went
    # requests/ goes first in each hour: the failure left hour 10 whole, its rollups still standing for its requests
    assert _hours_of(root, "latency_cells") == ["date=2026-11-20/hour=10", "date=2026-11-20/hour=11"]
    order = [d.relative_to(root).parts[0] for i, d in expired(root, T0 + 3 * HOUR_NS) if i == T0 // HOUR_NS + 1]
    assert order[0] == "requests" and sorted(order[1:]) == order[1:]


def test_prune_removes_whole_old_hours_and_keeps_topics_and_coverage(tmp_path: Path):
    root = tmp_path / "rec"
    _record_hours(root, [0, 1, 2, 3, 4])
    _record_hours(root, [0], proxy="other")
    (root / "requests" / "proxy=p1" / "date=not-a-date").mkdir()  # not a partition: never touched
    assert len(_hours_of(root, "requests")) == 5 and len(_hours_of(root, "latency_cells")) == 5

    cutoff = T0 + 3 * HOUR_NS + HOUR_NS // 2  # hours 0-2 ended before it; hour 3 had not
    dry = prune(root, cutoff, "p1", dry_run=True)
    assert len(dry.hours) == 3 and dry.files > 0 and dry.bytes > 0
    assert len(_hours_of(root, "requests")) == 5  # a dry run deletes nothing

    done = prune(root, cutoff, "p1")
    assert (done.hours, done.files, done.bytes, done.directories) == (dry.hours, dry.files, dry.bytes, dry.directories)
    assert done.hours == [T0 // HOUR_NS + h for h in (0, 1, 2)]
    assert _hours_of(root, "requests") == ["date=2026-11-20/hour=12", "date=2026-11-20/hour=13"]
    for ds in ("latency_cells", "request_sums", "topic_sums", "traffic_sums", "slowest_requests"):
        assert _hours_of(root, ds) == _hours_of(root, "requests"), ds  # rollups went with their hours
    assert _hours_of(root, "topics") == ["date=2026-11-20/hour=09"]  # topic names stay
    assert _hours_of(root, "requests", "other") == ["date=2026-11-20/hour=09"]  # another proxy's hours stay
    assert (root / "requests" / "proxy=p1" / "date=not-a-date").is_dir()
    cover = coverage_all(root)
    assert cover is not None and cover.complete  # what is left still reads from its rollups
    assert expired(root, cutoff, "p1") == []

    everyone = prune(root, T0 + 10 * HOUR_NS)  # every proxy's hours
    assert len(everyone.hours) == 3 and not list((root / "requests").rglob("*.parquet"))
    assert not (root / "requests" / "proxy=p1" / "date=2026-11-20").exists()  # an emptied date goes too


def test_prune_command_dry_run_then_delete(tmp_path: Path):
    root = tmp_path / "rec"
    _record_hours(root, [0, 1])  # dated by tests.analytics.analytics_rows.T0: checked against the clock below
    runner = CliRunner()
    age_h = (time.time_ns() - T0) / HOUR_NS
    if age_h < 3:  # the rows' hours must have ended more than --older-than ago
        pytest.fail(f"the test's rows are dated {age_h:.1f} h ago: move tests.analytics.analytics_rows.T0 back")
    out = runner.invoke(cli, ["prune", str(root), "--older-than", "1h", "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "would delete 2 hour(s), 2026-11-20 09:00 to 2026-11-20 10:00 UTC" in out.output
    assert len(_hours_of(root, "requests")) == 2
    out = runner.invoke(cli, ["prune", str(root), "--older-than", "1h"])
    assert out.exit_code == 0 and out.output.startswith("deleted 2 hour(s)"), out.output
    assert _hours_of(root, "requests") == [] and _hours_of(root, "topics")
    again = runner.invoke(cli, ["prune", str(root), "--older-than", "1h"])
    assert again.exit_code == 0 and "no hour old enough" in again.output
    bad = runner.invoke(cli, ["prune", str(root), "--older-than", "20m"])
    assert bad.exit_code == 2 and "less than an hour" in bad.output
    elsewhere = runner.invoke(cli, ["prune", str(tmp_path), "--older-than", "1h"])  # the parent of a recording
    assert elsewhere.exit_code == 1 and "holds none of a recording's datasets" in elsewhere.output


def test_prune_help_names_every_dataset_it_keeps() -> None:
    """It said `every dataset but topics/`, and prune keeps runs/ as well (KEPT): an operator reading it would
    expect the runs/ hours gone. The help is filled from KEPT."""
    assert set(KEPT) == {"topics", "runs"}  # what the README's 'Keeping a window' says prune keeps
    out = CliRunner().invoke(cli, ["prune", "--help"], terminal_width=400)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "every dataset but topics/ and runs/." in text and "topics/ and runs/ are kept" in text
    assert "{kept}" not in text


def test_prune_of_a_proxy_id_covers_its_workers_and_names_the_proxies_when_it_has_none(tmp_path: Path):
    """With --workers N a proxy records as <id>-w1 … <id>-wN: `--proxy-id vm` matched nothing (it said "no hour old
    enough" as if all were well, later: give one worker's id). It now prunes them all, as --retain does."""
    root = tmp_path / "rec"
    _record_hours(root, [0], proxy="vm-w1")
    _record_hours(root, [0], proxy="vm-w2")
    _record_hours(root, [0], proxy="vmx")
    out = CliRunner().invoke(cli, ["prune", str(root), "--older-than", "1h", "--proxy-id", "vm", "--dry-run"])
    assert out.exit_code == 0 and "would delete 1 hour(s)" in out.output, out.output
    out = CliRunner().invoke(cli, ["prune", str(root), "--older-than", "1h", "--proxy-id", "vm"])
    assert out.exit_code == 0 and not _hours_of(root, "requests", "vm-w1") and not _hours_of(root, "requests", "vm-w2")
    assert _hours_of(root, "requests", "vmx")
    _record_hours(root, [0], proxy="vm-w1")
    out = CliRunner().invoke(cli, ["prune", str(root), "--older-than", "1h", "--proxy-id", "other"])
    assert out.exit_code == 1 and "holds no hours of proxy 'other'" in out.output and "it holds vm-w1, vm-w2, vmx" in out.output
    out = CliRunner().invoke(cli, ["prune", str(root), "--older-than", "1h", "--proxy-id", "vm-w1", "--dry-run"])
    assert out.exit_code == 0 and "would delete 1 hour(s)" in out.output, out.output


def test_recorder_thread_prunes_its_own_old_hours(tmp_path: Path, make_recorder):
    root = tmp_path / "rec"
    _record_hours(root, [0, 1, 5])
    _record_hours(root, [0], proxy="other")
    now = T0 + 5 * HOUR_NS + 120 * 10**9  # 09:00 + 5 h 2 min: hours 0 and 1 ended > 2 h ago, hour 5 is current
    rec = make_recorder(root=root, proxy_id="p1", retain_s=2 * H, clock_ns=lambda: now)
    rec.close()  # the final flush runs the first retention pass
    assert _hours_of(root, "requests") == ["date=2026-11-20/hour=14"]
    assert _hours_of(root, "requests", "other") == ["date=2026-11-20/hour=09"]
    assert rec.errors["retention"] == 0


def test_the_first_writer_of_a_launch_prunes_the_workers_it_no_longer_runs(tmp_path: Path, make_recorder):
    """After --workers 3 became 1, the hours of vm-w2 and vm-w3 were never deleted: the first writer (vm, or vm-w1)
    prunes every id of its launch; another worker only its own; another proxy's id is never touched."""
    root = tmp_path / "rec"
    for proxy in ("vm-w1", "vm-w2", "vm-w3", "vmx", "other-w1"):
        _record_hours(root, [0], proxy=proxy)
    now = T0 + 5 * HOUR_NS
    make_recorder(root=root, proxy_id="vm-w2", retain_s=2 * H, clock_ns=lambda: now).close()
    assert [p for p in ("vm-w1", "vm-w2", "vm-w3") if _hours_of(root, "requests", p)] == ["vm-w1", "vm-w3"]
    make_recorder(root=root, proxy_id="vm", retain_s=2 * H, clock_ns=lambda: now).close()  # --workers 1 now
    assert [p for p in ("vm-w1", "vm-w3", "vmx", "other-w1") if _hours_of(root, "requests", p)] == ["vmx", "other-w1"]


def test_writer_process_prunes_with_the_real_clock(tmp_path: Path, make_recorder):
    root = tmp_path / "rec"
    _record_hours(root, [0])  # 2026-11-20: days before any run of this test
    recent = (time.time_ns() - T0) / 1e9  # this hour, in the rows' terms
    write_rows(root, "requests", [dict(req("now", 1, t_s=recent), proxy_id="p1")])
    rec = make_recorder(root=root, proxy_id="p1", retain_s=24 * H, writer="process")
    rec.close()
    hours = _hours_of(root, "requests")
    assert len(hours) == 1 and hours[0] != "date=2026-11-20/hour=09", hours


def test_proxy_retain_needs_a_recording_and_an_hour(tmp_path: Path):
    base = [sys.executable, "-m", "kafkatap.cli", "proxy", "--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:9"]
    out = subprocess.run(base + ["--retain", "2h"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--retain deletes old hours of a recording: it needs --record DIR" in out.stderr
    out = subprocess.run(base + ["--record", str(tmp_path / "r"), "--retain", "45m"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "less than an hour" in out.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_a_running_proxy_with_retain_deletes_its_old_hours(tmp_path: Path, workers: int):
    """`kafkatap proxy --retain` in its own process (writer process, as shipped): old hours go, others stay.

    With --workers 2 each worker records (and prunes) as <id>-w<N>: the option must reach both.
    """
    from harness.kafka import free_port
    from tests.proxy.proxy_procs import wait_listening

    root = tmp_path / "rec"
    ids = ["edge"] if workers == 1 else ["edge-w1", "edge-w2"]
    for proxy in ids:
        _record_hours(root, [0, 1], proxy=proxy)
    _record_hours(root, [0], proxy="someone-else")
    port = free_port()
    env = dict(os.environ, KAFKATAP_LOG_FORMAT="json")
    proc = subprocess.Popen([sys.executable, "-m", "kafkatap.cli", "proxy", "--workers", str(workers), "--listen",
                             f"127.0.0.1:{port}", "--upstream", "127.0.0.1:9", "--record", str(root),
                             "--proxy-id", "edge", "--retain", "1d", "--flush-interval", "0.2"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_listening(port, proc)
        deadline = time.monotonic() + 30
        while any(_hours_of(root, "requests", p) for p in ids) and time.monotonic() < deadline:
            time.sleep(0.1)  # the writer's first flush runs the first pass: no event reaches this process
        assert [_hours_of(root, "requests", p) for p in ids] == [[] for _ in ids]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert all(_hours_of(root, "topics", p) for p in ids) and _hours_of(root, "requests", "someone-else")
    lines = [json.loads(ln) for ln in proc.stderr.read().splitlines() if ln.startswith("{")]
    said = sorted(ln["proxy_id"] for ln in lines if ln["event"].startswith("recording retention: deleted 2 hour(s)"))
    # the first writer prunes its launch's every id (`writer_prunes`): worker 2 may find its hours gone already
    assert said[:1] == ids[:1] and set(said) <= set(ids), [ln["event"] for ln in lines]
    # the start-up log says the window once, whether one process or the workers' parent says it
    window = [ln for ln in lines if ln.get("retain_hours") == 24.0]
    assert len(window) == 1, [ln["event"] for ln in lines]
