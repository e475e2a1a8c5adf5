"""The commands that maintain a recording in place: `kafkatap rollups DIR` and `kafkatap prune DIR`.

`rollups`: recordings made before rollups were written, with compaction off, or left by a
crash between a requests file and its rollups are analyzed from every request (correct, only
slower). This fills them in and merges each hour's, as a proxy does when it leaves an hour
(recording.rollups), so `kafkatap analyze` sums them instead.

`prune`: what `kafkatap proxy --retain` does once a minute, once, for any recording and every
proxy in it (recording.retention).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from recording.layout import safe_segment
from recording.retention import (DURATION, KEPT_NAMES, MIN_RETAIN_S, PRUNED, describe, launch_ids, proxies_in,
                                 prune as prune_hours)

__all__ = ["rollups", "prune"]

_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
F = TypeVar("F", bound=Callable[..., None])


@click.command("rollups", context_settings=_SETTINGS)
@click.argument("recording", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--no-merge", is_flag=True, help="Write each requests file's rollups but do not merge each hour's into one file.")
@click.option("--check", is_flag=True,
              help="Only say how many requests files lack rollups; write nothing (exit 1 if any that this command "
                   "would write do: the files of an older format and of the last two hours do not count).")
@click.option("--include-recent", is_flag=True,
              help="Roll up the last two hours too (the current one and the one before), which are left alone by "
                   "default: a proxy may still be writing them. For a recording no proxy writes to any more.")
def rollups(recording: Path, no_merge: bool, check: bool, include_recent: bool) -> None:
    """Write the rollups RECORDING lacks and merge each hour's, so `kafkatap analyze` sums them.

    \b
    A proxy writes them itself beside every final requests file, and merges an hour's when it
    leaves the hour. Run this on recordings made before that, recorded with compaction off
    (--compact-interval 0), or left by a crash. The last two hours are left alone unless
    --include-recent: beside a running proxy, rolling up the hour it is still writing would count
    rows twice. Files of an older recording format are skipped: the analysis reads those requests. A recording
    with connections but no request (every connection TLS passed through) has nothing to roll up:
    it is said, with the connections' count, and the exit status is 0.

    \b
    Example:
      kafkatap rollups rec/            # then: kafkatap analyze rec/ --out report/
    """
    from recording.migrations import RecordingFormatError

    try:
        _rollups(recording, no_merge, check, None if include_recent else _settled_before())
    except RecordingFormatError as exc:  # a file cut short by a crash, or not kafkatap's: said in one line, as analyze does
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # a rollup that could not be written (a full disk, a read-only directory)
        raise click.ClickException(f"cannot write rollups in {recording}: {exc}; what was written before it stays "
                                   "(run `kafkatap rollups` again once it can write)") from None


def _settled_before() -> int:
    """The end of the hours `rollups` may touch by default: those `prune` may, all but the current hour and the
    one before it, which a running proxy may still be writing (MIN_RETAIN_S)."""
    return time.time_ns() - int(MIN_RETAIN_S * 1e9)


def _rollups(recording: Path, no_merge: bool, check: bool, settled_before_ns: int | None) -> None:
    from recording.rollups import coverage_all, missing_rollups, write_missing  # pyarrow: only for this command

    cover = coverage_all(recording)
    if cover is None:
        raise click.ClickException(f"{recording}: cannot list it")
    requests = len(cover.requests.relative)
    if requests == 0:
        seen = _connections_seen(recording)
        if seen is None:
            raise click.ClickException(f"{recording} holds no requests files (record one with `kafkatap proxy … --record DIR`)")
        # Connections but no request, as when every connection was TLS passed through: a recording with nothing to sum.
        conns, opaque, tls = seen
        click.echo(f"{recording}: no requests files, so no rollups to write: {conns:,} connection(s) recorded, "
                   f"{opaque:,} of them opaque ({tls:,} TLS passed through), and no Kafka request")
        return
    missing = missing_rollups(cover, settled_before_ns)
    older, recent, lacking = len(missing.older), len(missing.recent), len(missing.to_write)
    apart = ([f"{older:,} of an older format (the analysis reads their requests)"] if older else []) + (
        [f"{recent:,} in the last two hours (a proxy may still be writing them: --include-recent)"] if recent else [])
    click.echo(f"{recording}: {requests:,} requests files, {lacking:,} without all their rollups"
               + (f"; left alone: {', '.join(apart)}" if apart else ""))
    if check:
        raise SystemExit(1 if lacking else 0)
    started = time.monotonic()
    last = [started]

    def progress(done: int, todo: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 5 or done == todo:
            last[0] = now
            click.echo(f"  {done:,}/{todo:,} files, {now - started:.0f} s")

    result = write_missing(recording, merge=not no_merge, progress=progress, settled_before_ns=settled_before_ns,
                           cover=cover)
    click.echo(f"wrote rollups for {result.written:,} requests files"
               + (f", skipped {result.skipped:,} of an older format" if result.skipped else "")
               + ("" if no_merge else f"; merged the rollups of {result.merged:,} partition directories")
               + f" in {time.monotonic() - started:.1f} s")


def _connections_seen(recording: Path) -> tuple[int, int, int] | None:
    """(connections, opaque ones, TLS ones) in `recording`'s connections/, each counted once; None if it has none."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from recording.migrations import RecordingFormatError
    from recording.reader import live_files, unreadable_file

    listing = live_files(recording, "connections")
    if listing is None or not listing.paths:
        return None
    seen: set[tuple[str, str]] = set()
    opaque: set[tuple[str, str]] = set()
    tls: set[tuple[str, str]] = set()
    for path in listing.paths:  # a connection's snapshots and its final row: any of them may say it went opaque
        try:
            t = pq.read_table(path, columns=["proxy_id", "conn_id", "tls", "opaque"], filesystem=listing.filesystem)
        except (pa.ArrowInvalid, KeyError) as exc:  # no footer (a crash mid-write), not Parquet, not kafkatap's columns
            raise RecordingFormatError(unreadable_file(path, str(exc))) from None
        ids = list(zip(t.column("proxy_id").to_pylist(), t.column("conn_id").to_pylist()))
        seen.update(ids)
        for flags, into in ((t.column("opaque"), opaque), (t.column("tls"), tls)):
            into.update(i for i, flag in zip(ids, pc.fill_null(flags, False).to_pylist()) if flag)
    return len(seen), len(opaque), len(tls)


def _kept_named(command: F) -> F:
    """Fills `{kept}` in the command's help with the datasets retention keeps (recording.retention.KEPT).

    The help named topics/ alone after runs/ had joined it: read from KEPT, it cannot drift again.
    """
    command.__doc__ = (command.__doc__ or "").replace("{kept}", KEPT_NAMES)
    return command


@click.command("prune", context_settings=_SETTINGS)
@click.argument("recording", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--older-than", "older_than", type=DURATION, required=True, metavar="DURATION",
              help="Delete the hours that ended longer ago than this: 36h, 7d, 2w … (at least 1h).")
@click.option("--proxy-id", "proxy_id", default=None,
              help="Only the hours of this --proxy-id and of its workers (<id>-w<N>, as --retain prunes them), or "
                   "of one worker's id. Default: every proxy's.")
@click.option("--dry-run", is_flag=True, help="Only say what would be deleted.")
@_kept_named
def prune(recording: Path, older_than: float, proxy_id: str | None, dry_run: bool) -> None:
    """Delete the hours of RECORDING older than --older-than, every dataset but {kept}.

    Hours go whole: an analysis of what is left sees a recording that starts later, each
    requests file still with its rollups. {kept} are kept (a few KiB however long a proxy
    runs: the topic names learned, each proxy run's start and stop, which later hours are
    read with). A proxy started with --retain does this itself once a minute; run this for
    recordings made without it. Safe beside a running proxy: the last two hours are never
    old enough. An analysis running over RECORDING meanwhile may fail on a deleted file.

    \b
    Example:
      kafkatap prune rec/ --older-than 7d --dry-run
    """
    if not any((recording / ds).is_dir() for ds in PRUNED):
        raise click.ClickException(f"{recording} holds none of a recording's datasets (requests/, connections/ …): "
                                   "give the directory a proxy was started with as --record DIR")
    ids: list[str] | None = None
    if proxy_id is not None:  # the proxy's own id and its workers' (<id>-w1 … <id>-wN), as --retain prunes them
        ids = launch_ids(recording, safe_segment(proxy_id))
        if not ids:
            raise click.ClickException(f"{recording} holds no hours of proxy {proxy_id!r} (nor of its workers "
                                       f"{proxy_id}-w1 …); it holds {', '.join(proxies_in(recording)) or 'none'}")
    cutoff_ns = time.time_ns() - int(older_than * 1e9)
    try:
        result = prune_hours(recording, cutoff_ns, ids, dry_run=dry_run)
    except OSError as exc:
        raise click.ClickException(f"{recording}: {exc}") from None
    click.echo(("would delete " if dry_run else "deleted ") + describe(result) if result.hours
               else f"{recording}: {describe(result)} (nothing ended before "
                    f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(cutoff_ns / 1e9))} UTC)")
