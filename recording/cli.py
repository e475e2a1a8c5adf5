"""`kafkatap rollups DIR`: give an existing recording the rollups a proxy now writes beside its requests files.

Why a command: recordings made before rollups were written, with compaction off, or left by a
crash between a requests file and its rollups are analyzed from every request (correct, only
slower). This fills them in and merges each hour's, as a proxy does when it leaves an hour
(recording.rollups), so `kafkatap analyze` sums them instead.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from recording.rollups import coverage_all, write_missing

__all__ = ["rollups"]


@click.command("rollups", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("recording", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--no-merge", is_flag=True, help="Write each requests file's rollups but do not merge each hour's into one file.")
@click.option("--check", is_flag=True, help="Only say how many requests files lack rollups; write nothing (exit 1 if any do).")
def rollups(recording: Path, no_merge: bool, check: bool) -> None:
    """Write the rollups RECORDING lacks and merge each hour's, so `kafkatap analyze` sums them.

    \b
    A proxy writes them itself beside every final requests file, and merges an hour's when it
    leaves the hour. Run this on recordings made before that, recorded with compaction off
    (--compact-interval 0), or left by a crash. Run it when no proxy is writing to RECORDING.
    Files of an older recording format are skipped: the analysis reads those requests.

    \b
    Example:
      kafkatap rollups rec/            # then: kafkatap analyze rec/ --out report/
    """
    cover = coverage_all(recording)
    if cover is None:
        raise click.ClickException(f"{recording}: cannot list it")
    requests = len(cover.requests.relative)
    if requests == 0:
        raise click.ClickException(f"{recording} holds no requests files (record one with `kafkatap proxy … --record DIR`)")
    lacking = len(cover.uncovered)
    click.echo(f"{recording}: {requests:,} requests files, {lacking:,} without all their rollups")
    if check:
        raise SystemExit(1 if lacking else 0)
    started = time.monotonic()
    last = [started]

    def progress(done: int, todo: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 5 or done == todo:
            last[0] = now
            click.echo(f"  {done:,}/{todo:,} files, {now - started:.0f} s")

    result = write_missing(recording, merge=not no_merge, progress=progress)
    click.echo(f"wrote rollups for {result.written:,} requests files"
               + (f", skipped {result.skipped:,} of an older format" if result.skipped else "")
               + ("" if no_merge else f"; merged the rollups of {result.merged:,} partition directories")
               + f" in {time.monotonic() - started:.1f} s")
