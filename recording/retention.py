"""Retention: the hours of a recording older than a cutoff, deleted whole.

Why: a proxy left in a production path records for weeks. At 20,000
requests/s that is ~72 M request rows an hour, a few GB a day, and a disk that
fills stops the recording (the writer refuses to write below its free-space
floor). `kafkatap proxy --retain 7d` keeps a rolling window instead, and
`kafkatap prune DIR --older-than 7d` does the same once, for any recording.

Why whole hours: every dataset is partitioned `date=…/hour=…` by the rows' own
time (`recording.layout`), so an hour directory holds exactly that hour's rows
and, beside them, that hour's rollups. Deleting the directory of every dataset
for one hour keeps what remains consistent: each requests file left still has
its rollups, and an analysis sees a recording that starts later. An hour goes
only once all of it is older than the cutoff.

`topics/` and `runs/` are never pruned (KEPT): each row of `topics/` is a topic name learned once
(the first time the proxy saw the topic's id), which later requests of any hour are named by, and each
row of `runs/` a proxy run's start or clean stop, which an analysis of later hours still reads (the proxy
runs, and whether a run's open connections ended with it); both stay a few KiB however long the proxy runs.

This module only lists and deletes; the recorder decides when
(`ParquetRecorder`, once a minute on its writer), the CLI says what it did.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click

from recording.datasets import DATASETS
from recording.layout import HOUR_NS, hour_of_dirs, launching_proxy_id, proxy_dir, worker_proxy_id

__all__ = ["KEPT", "KEPT_NAMES", "PRUNED", "MIN_RETAIN_S", "MAX_RETAIN_S", "Pruned", "PruneError", "hour_dirs",
           "expired", "prune", "writer_prunes", "launch_ids", "parse_duration", "DURATION", "describe"]

KEPT = ("topics", "runs")  # datasets retention never touches (see the module docstring)
KEPT_NAMES = " and ".join(f"{name}/" for name in KEPT)  # as the help texts name them ("topics/ and runs/")
PRUNED = tuple(d for d in DATASETS if d not in KEPT)
MIN_RETAIN_S = 3600.0  # the current and the previous hour are always kept: late rows and merges still go there
MAX_RETAIN_S = 100 * 366 * 86400.0  # a century: further back than any recording (and than the clock's range)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass
class Pruned:
    """What a pruning removed (or, dry, would remove)."""

    hours: list[int] = field(default_factory=list)  # hour indexes (hours since the epoch, UTC), each once
    directories: int = 0  # hour directories over all datasets and proxies
    files: int = 0
    bytes: int = 0


def _children(directory: Path) -> list[Path]:
    """The entries of `directory`, sorted; none when it is gone or is not a directory (a concurrent prune)."""
    try:
        return sorted(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def proxies_in(root: Path | str) -> list[str]:
    """The proxy ids a recording holds hours of (its `proxy=` directories, in every pruned dataset)."""
    root = Path(root)
    return sorted({p.name.removeprefix("proxy=") for dataset in PRUNED for p in _children(root / dataset)
                   if p.name.startswith("proxy=")})


def writer_prunes(root: Path | str, proxy_id: str) -> list[str]:
    """The proxy ids whose old hours the writer recording as `proxy_id` deletes (`--retain`).

    Its own; and, for the first writer of a launch (the id a one-process proxy records under, or worker 1's),
    every id of that launch the recording holds: after `--workers 4` became 2 (or 1, or the cores changed the
    default), the hours of the workers no longer run were never deleted, and the rolling window grew for ever.
    """
    head = launching_proxy_id(proxy_id)
    if head is not None and proxy_id != worker_proxy_id(head, 1):
        return [proxy_id]
    return sorted({proxy_id, *launch_ids(root, head or proxy_id)})


def launch_ids(root: Path | str, proxy_id: str) -> list[str]:
    """The ids of `proxy_id`'s launch the recording holds: its own, and its workers' (`<id>-w<N>`)."""
    return [p for p in proxies_in(root) if p == proxy_id or launching_proxy_id(p) == proxy_id]


def hour_dirs(root: Path | str, proxy_id: str | list[str] | None = None) -> Iterator[tuple[int, Path]]:
    """(hour index, directory) of every hour partition of the pruned datasets: one proxy's (or those of a list of
    proxy ids), or every proxy's."""
    root = Path(root)
    ids = [proxy_id] if isinstance(proxy_id, str) else proxy_id
    for dataset in PRUNED:
        base = root / dataset
        proxies = ([proxy_dir(root, dataset, p) for p in ids] if ids is not None
                   else [p for p in _children(base) if p.name.startswith("proxy=")])
        for proxy_part in proxies:
            for date_dir in _children(proxy_part):
                for hour_dir in _children(date_dir):
                    index = hour_of_dirs(date_dir.name, hour_dir.name)
                    if index is not None and hour_dir.is_dir():
                        yield index, hour_dir


def expired(root: Path | str, cutoff_ns: int, proxy_id: str | list[str] | None = None) -> list[tuple[int, Path]]:
    """The hour directories whose whole hour ended at or before `cutoff_ns` (epoch ns), oldest first.

    Within an hour, requests/ comes first: a pruning stopped part way (a file it may not delete) then
    leaves rollups without their requests file, which every reader ignores, never requests files
    without their rollups, which sent every later analysis back to reading every request.
    """
    return sorted(((i, d) for i, d in hour_dirs(root, proxy_id) if (i + 1) * HOUR_NS <= cutoff_ns),
                  key=lambda item: (item[0], Path(item[1]).relative_to(root).parts[0] != "requests", str(item[1])))


class PruneError(OSError):
    """A pruning stopped at a path it could not delete: the path, the reason, and what was deleted before it."""


def _rmtree(directory: Path) -> None:
    """shutil.rmtree, whose errors name the file that could not go by its full path (rmtree's name only its base)."""

    def named(_func: object, path: str, exc: BaseException) -> None:
        if isinstance(exc, FileNotFoundError):  # gone meanwhile (another pruning): nothing to do
            return
        why = getattr(exc, "strerror", None) or str(exc)
        raise OSError(getattr(exc, "errno", None), f"cannot delete {path}: {why}") from None

    if sys.version_info >= (3, 12):
        shutil.rmtree(directory, onexc=named)
    else:
        shutil.rmtree(directory, onerror=lambda func, path, info: named(func, path, info[1]))


def _size(directory: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _dirs, names in os.walk(directory):
        for name in names:
            try:
                size += os.stat(os.path.join(dirpath, name)).st_size
                files += 1
            except FileNotFoundError:
                pass
    return files, size


def prune(root: Path | str, cutoff_ns: int, proxy_id: str | list[str] | None = None, *,
          dry_run: bool = False) -> Pruned:
    """Delete (or, dry, only count) every hour directory of the pruned datasets that `expired` names.

    A date directory left empty goes too. Errors other than a directory already gone are
    raised (OSError): the caller counts and logs them, and the next pruning tries again.
    """
    out = Pruned()
    hours: set[int] = set()
    for index, directory in expired(root, cutoff_ns, proxy_id):
        files, size = _size(directory)
        if not dry_run:
            if not directory.exists() and not directory.is_symlink():
                continue  # gone meanwhile
            try:
                _rmtree(directory)
            except OSError as exc:
                out.hours = sorted(hours)
                done = f"deleted before it: {describe(out)}" if out.hours else "nothing deleted before it"
                raise PruneError(f"{exc.strerror or exc} ({done}); run prune again once it can be deleted") from None
            try:
                directory.parent.rmdir()  # the date, once its last hour is gone
            except OSError:
                pass
        hours.add(index)
        out.directories += 1
        out.files += files
        out.bytes += size
    out.hours = sorted(hours)
    return out


def describe(result: Pruned) -> str:
    """One line for logs and the CLI: how much, and which hours (UTC)."""
    if not result.hours:
        return "no hour old enough"

    def stamp(index: int) -> str:
        return time.strftime("%Y-%m-%d %H:00", time.gmtime(index * 3600))

    span = stamp(result.hours[0]) if len(result.hours) == 1 else f"{stamp(result.hours[0])} to {stamp(result.hours[-1])}"
    return (f"{len(result.hours)} hour(s), {span} UTC: {result.files:,} files, {result.bytes / 2**20:,.1f} MiB "
            f"in {result.directories:,} directories")


def parse_duration(text: str) -> float:
    """Seconds of a duration written as a number and a unit: 90m, 36h, 7d, 2w (a bare number is seconds)."""
    m = _DURATION.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a duration: use a number and a unit, e.g. 12h, 7d or 2w (s, m, h, d, w)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


class _Duration(click.ParamType):
    """A click type for retention windows: at least MIN_RETAIN_S, in any unit parse_duration reads."""

    name = "DURATION"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(str(value))
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if seconds < MIN_RETAIN_S:
            bare = isinstance(value, str) and value.strip().replace(".", "", 1).isdigit()
            self.fail(f"{value} is less than an hour" + (f" (a bare number is seconds: {value.strip()}h, "  # type: ignore[union-attr]
                                                          f"{value.strip()}d? use a unit)" if bare else "")
                      + ": recordings are kept and deleted by the hour, and the last two hours are still being "
                      "written", param, ctx)
        if not seconds <= MAX_RETAIN_S:  # a traceback from the clock's range (OverflowError) before
            self.fail(f"{value} is more than a century: no recording goes back that far", param, ctx)
        return seconds


DURATION = _Duration()
