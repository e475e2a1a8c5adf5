"""`kafkatap rollups DIR`: backfills an older recording's rollups and merges each hour's; `--check` writes nothing."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from analytics.synthetic import generate, write_rows
from kafkatap.cli import cli
from recording.rollups import coverage_all
from tests.analytics.analytics_rows import req


def test_backfill_writes_merges_and_checks(tmp_path: Path) -> None:
    root = tmp_path / "rec"
    generate(root, 3000, rollups=False)  # a recording as an older proxy left it
    for i in range(2):  # two more requests files in an hour that already has one: that hour merges
        write_rows(root, "requests", [req(f"late-{i}", 1, t_s=600 + i)])
    for ds in ("latency_cells", "request_sums"):  # write_rows gave the late files theirs; the backfill must not mind
        assert any((root / ds).rglob("*.parquet"))
    before = coverage_all(root)
    assert before is not None and not before.complete
    runner = CliRunner()
    checked = runner.invoke(cli, ["rollups", str(root), "--check"])
    assert checked.exit_code == 1 and "without all their rollups" in checked.output
    assert coverage_all(root).uncovered == before.uncovered  # --check wrote nothing
    done = runner.invoke(cli, ["rollups", str(root)])
    assert done.exit_code == 0, done.output
    assert f"wrote rollups for {len(before.uncovered)} requests files" in done.output
    assert "merged the rollups of 1 partition directories" in done.output
    after = coverage_all(root)
    assert after is not None and after.complete
    hours = {p.parent for p in (root / "requests").rglob("*.parquet")}
    assert len(list((root / "latency_cells").rglob("*.parquet"))) == len(hours)  # one merged file per hour
    assert runner.invoke(cli, ["rollups", str(root), "--check"]).exit_code == 0


def test_a_directory_without_requests_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["rollups", str(tmp_path)])
    assert result.exit_code != 0 and "holds no requests files" in result.output
